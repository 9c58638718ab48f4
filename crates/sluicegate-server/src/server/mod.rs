//! The running service: the store opened, the configuration loaded and kept fresh, HTTP
//! and gRPC served on the listeners given until told to stop. [`serve`] is what
//! `sluicegate serve` runs, and what tests run in-process on a port of their own.

mod accept;
mod connection;
mod reload;
mod slots;
mod tls;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sluicegate::{
    Algorithm, AnyStore, Durability, Limiter, LimiterConfig, MemoryStore, StoreOptions,
};
use tokio::net::TcpListener;

pub use self::connection::ConnectionOptions;
use self::connection::Connections;
use self::slots::Slots;
use self::tls::Tls;
pub use self::tls::TlsOptions;
pub(crate) use self::tls::trusted_roots;
use crate::config::{self, Config, LoadOptions};
use crate::http;
use crate::service::{Service, ServiceOptions};
use crate::telemetry::Telemetry;
pub use crate::telemetry::{OtlpOptions, OtlpProtocol};
use crate::xds::{self, XdsOptions};

/// The example configuration served when no configuration path is given.
const EXAMPLE_CONFIG: &str = include_str!("example.yaml");

/// The name the example configuration goes by in logs and errors: the repository's
/// examples/sluicegate.yaml is a link to it.
const EXAMPLE_CONFIG_NAME: &str = "examples/sluicegate.yaml";

/// How often keys that owe the store units and see no check are written back.
const WRITE_BACK_INTERVAL: Duration = Duration::from_secs(1);
/// Keys written back per tick, at most, one round trip each: the store takes them a
/// thousand a second beside the checks it serves, not all at once after an outage with a
/// million clients. A key that is checked writes its own back first anyway, and a debt
/// whose window is over is dropped, not written.
const WRITE_BACK_KEYS: usize = 1_000;

/// What the service is made of.
pub struct ServeOptions {
    /// A YAML file, or a directory of them; `None` serves the example rules, unless
    /// `xds` is given.
    pub config: Option<PathBuf>,
    /// The configuration comes from this xDS management server instead of files.
    pub xds: Option<XdsOptions>,
    /// The algorithm of rules that name none.
    pub default_algorithm: Algorithm,
    /// The most YAML nodes one configuration file may hold (`--max-config-nodes`).
    pub max_config_nodes: usize,
    /// The most bytes of a configuration, its files together or one xDS push
    /// (`--max-config-bytes`).
    pub max_config_bytes: usize,
    /// In a configuration directory, skip names that start with a dot
    /// (`--config-ignore-dotfiles`).
    pub config_ignore_dotfiles: bool,
    /// Files that declare one domain merge into it (`--merge-domain-config`).
    pub merge_domain_config: bool,
    /// Where state lives.
    pub store: StoreOptions,
    /// Timeouts, failure policy, breaker and negative cache.
    pub limiter: LimiterConfig,
    /// How the front ends answer.
    pub service: ServiceOptions,
    /// How often the configuration files (and the TLS certificate) are checked for edits.
    pub reload_interval: Duration,
    /// Limits and timeouts of every listener.
    pub connections: ConnectionOptions,
    /// The gRPC-only listener's connections are told to go away this old
    /// ([`ConnectionOptions::max_age`]).
    pub grpc_max_connection_age: Option<Duration>,
    /// And cut this long after ([`ConnectionOptions::max_age_grace`]).
    pub grpc_max_connection_age_grace: Option<Duration>,
    /// TLS on every listener; plain TCP without it.
    pub tls: Option<TlsOptions>,
    /// TLS on the gRPC-only listener alone, instead of `tls` there; with it, the other
    /// listeners answer no gRPC call (see [`crate::http::app`]).
    pub grpc_tls: Option<TlsOptions>,
    /// The OTLP collector the check spans go to, and how; none without it.
    pub otlp: Option<OtlpOptions>,
    /// The statsd server envoy's statistics go to; none without it.
    pub statsd: Option<crate::metrics::StatsdOptions>,
}

/// Where the service listens.
pub struct Listeners {
    /// HTTP and gRPC on one port.
    pub main: TcpListener,
    /// gRPC alone, on a port of its own too.
    pub grpc_only: Option<TcpListener>,
    /// The probes, metrics and rules alone (envoyproxy/ratelimit's debug port).
    pub debug: Option<TcpListener>,
    /// `/metrics` alone (envoyproxy/ratelimit's Prometheus address).
    pub metrics: Option<TcpListener>,
}

/// The service made and its configuration loaded, not yet listening: what can fail at
/// start has failed by now.
pub struct Prepared {
    service: Arc<Service>,
    /// Where the check spans go (`--otlp-endpoint`).
    telemetry: Telemetry,
    /// Where the configuration came from, for the log.
    config_name: PathBuf,
    store_url: String,
    connections: ConnectionOptions,
    grpc_max_connection_age: Option<Duration>,
    grpc_max_connection_age_grace: Option<Duration>,
    tls: Option<Arc<Tls>>,
    grpc_tls: Option<Arc<Tls>>,
    reload_interval: Duration,
}

/// Loads the configuration, opens the store, and starts what runs beside the requests:
/// the reload watch (SIGHUP is listened for from here on), the memory store's sweeper and
/// the live page's sampler.
pub async fn prepare(options: ServeOptions) -> anyhow::Result<Prepared> {
    let tls = options
        .tls
        .clone()
        .map(Tls::load)
        .transpose()?
        .map(Arc::new);
    let grpc_tls = options
        .grpc_tls
        .clone()
        .map(Tls::load)
        .transpose()
        .context("the gRPC listener's TLS")?
        .map(Arc::new);
    // A zero interval would spin the watch.
    let reload_interval = options.reload_interval.max(Duration::from_millis(1));
    let load = LoadOptions {
        default_algorithm: options.default_algorithm,
        max_nodes: options.max_config_nodes,
        max_bytes: options.max_config_bytes,
        ignore_dotfiles: options.config_ignore_dotfiles,
        merge_domains: options.merge_domain_config,
        envoy_counters: options.service.compat.envoy_counters(),
        max_entry_bytes: options.service.max_entry_bytes,
    };
    // The files as they were before loading, so an edit made meanwhile is reloaded too.
    let loaded_files = options
        .config
        .as_deref()
        .map(|path| config::fingerprint(path, load.ignore_dotfiles, load.max_bytes));
    // Over xDS, nothing is in force until the first push.
    let config = match &options.xds {
        Some(_) => None,
        None => Some(load_config(options.config.as_deref(), load)?),
    };
    let store = match AnyStore::open(options.store.clone()).await {
        // A store that cannot honour it names the flag that asked.
        Err(e) if options.store.durability == Durability::Replicated => {
            return Err(anyhow::Error::new(e)
                .context("cannot open the store with --store-durability replicated"));
        }
        store => store?,
    };
    let limiter = Arc::new(Limiter::with_config(store, options.limiter.clone()));
    if limiter.store().memory().is_some() {
        let sweeper = Arc::clone(&limiter);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                sweeper.store().memory().map(MemoryStore::sweep);
            }
        });
    }
    // Keys that owe the store units (the local fallback's admissions, counts a store
    // lost) and see no check are written back here, a bounded share each tick.
    let writer = Arc::clone(&limiter);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(WRITE_BACK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            writer.write_back(WRITE_BACK_KEYS).await;
        }
    });
    let telemetry = options
        .otlp
        .as_ref()
        .map(Telemetry::otlp)
        .transpose()?
        .unwrap_or_default();
    let service = Arc::new(match config {
        Some(config) => Service::new(config, limiter, options.service.clone()),
        None => Service::awaiting_configuration(limiter, options.service.clone()),
    });
    if options.xds.is_none() {
        service.metrics().config_loaded();
    }
    if let Some(statsd) = &options.statsd {
        flush_statsd(statsd, Arc::clone(&service))?;
    }
    let sampled = Arc::clone(&service);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(crate::history::SAMPLE_PERIOD);
        loop {
            tick.tick().await;
            sampled.sample_history();
            sampled.expire_detailed_series();
        }
    });
    if let Some(path) = options.config.clone() {
        // Listen for SIGHUP now, before the server says it is up: a SIGHUP that came
        // before the handler would end the process.
        let hangup = reload::Hangup::listen();
        tokio::spawn(reload::reload_on_change(
            reload::Watch {
                path,
                seen: loaded_files.unwrap_or_default(),
                load,
                interval: reload_interval,
            },
            Arc::clone(&service),
            hangup,
        ));
    }
    let config_name = match (&options.xds, options.config) {
        (Some(xds), _) => PathBuf::from(format!("xDS {}", xds.server)),
        (None, Some(path)) => path,
        (None, None) => PathBuf::from(EXAMPLE_CONFIG_NAME),
    };
    if let Some(xds) = options.xds {
        let wait = !xds.start_without_config;
        let mut loaded = xds::start(xds, load, Arc::clone(&service))?;
        // envoyproxy/ratelimit waits for its provider's first configuration event unless
        // FORCE_START_WITHOUT_INITIAL_CONFIG; here a refused first push is not one: the
        // wait lasts until a push is in force.
        if wait {
            tracing::info!("xDS: waiting for the first configuration before serving");
            loaded
                .wait_for(|loaded| *loaded)
                .await
                .context("the xDS client stopped")?;
        }
    }
    Ok(Prepared {
        service,
        telemetry,
        config_name,
        store_url: options.store.url,
        connections: options.connections,
        grpc_max_connection_age: options.grpc_max_connection_age,
        grpc_max_connection_age_grace: options.grpc_max_connection_age_grace,
        tls,
        grpc_tls,
        reload_interval,
    })
}

/// Serves until `shutdown` resolves, then stops accepting, lets the requests in flight
/// finish (for up to the shutdown timeout), and returns: [`prepare`], then [`Prepared::serve`].
pub async fn serve(
    options: ServeOptions,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    prepare(options).await?.serve(listeners, shutdown).await
}

impl Prepared {
    /// Serves HTTP and gRPC on `listeners` until `shutdown` resolves, then stops
    /// accepting, lets the requests in flight finish for up to the shutdown timeout, cuts
    /// what is left, and returns.
    pub async fn serve(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let service = self.service;
        let telemetry = self.telemetry;
        let address = listeners.main.local_addr()?;
        tracing::info!(
            address = %address,
            tls = self.tls.is_some(),
            config = %self.config_name.display(),
            store = %self.store_url,
            "sluicegate listening"
        );
        let mut options = self.connections;
        if let Some(room) = accept::descriptor_budget()
            && room < options.max_connections
        {
            tracing::warn!(
                max_connections = room,
                asked = options.max_connections,
                "the descriptor limit leaves room for fewer connections than --max-connections"
            );
            options.max_connections = room;
        }
        // One budget of connections over every listener: descriptors are the process's.
        let slots = Slots::new(options.max_connections, options.max_connections_per_address);
        for tls in self.tls.iter().chain(&self.grpc_tls) {
            tokio::spawn(Arc::clone(tls).reload_on_change(self.reload_interval));
        }
        // gRPC over its own TLS: plaintext gRPC elsewhere would bypass it.
        let grpc_elsewhere = self.grpc_tls.is_none();
        // The gRPC listener's own: its TLS, and a maximum age.
        let grpc_tls = self.grpc_tls.or_else(|| self.tls.clone());
        let grpc_listener_tls = grpc_tls.is_some();
        let grpc_connections = Arc::new(Connections::new(
            ConnectionOptions {
                max_age: self.grpc_max_connection_age,
                max_age_grace: self.grpc_max_connection_age_grace,
                ..options.clone()
            },
            Arc::clone(&service),
            grpc_tls,
        ));
        let connections = Arc::new(Connections::new(options, Arc::clone(&service), self.tls));
        // One signal stops every listener.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop.send(true);
        });
        let mut others = Vec::new();
        if let Some(listener) = listeners.grpc_only {
            tracing::info!(
                grpc_address = %listener.local_addr()?,
                tls = grpc_listener_tls,
                "gRPC also on its own port"
            );
            let app = http::grpc_only(Arc::clone(&service), telemetry.clone());
            others.push(("gRPC", listener, app, grpc_connections));
        }
        if let Some(listener) = listeners.debug {
            tracing::info!(debug_address = %listener.local_addr()?, "probes and metrics on their own port");
            let app = http::debug(Arc::clone(&service));
            others.push(("debug", listener, app, Arc::clone(&connections)));
        }
        if let Some(listener) = listeners.metrics {
            tracing::info!(metrics_address = %listener.local_addr()?, "/metrics on its own port");
            let app = http::metrics_only(Arc::clone(&service));
            others.push(("metrics", listener, app, Arc::clone(&connections)));
        }
        let others: Vec<_> = others
            .into_iter()
            .map(|(name, listener, app, connections)| {
                let served = tokio::spawn(accept::serve(
                    listener,
                    app,
                    connections,
                    Arc::clone(&slots),
                    stopping.clone(),
                ));
                (name, served)
            })
            .collect();
        accept::serve(
            listeners.main,
            http::app(service, telemetry.clone(), grpc_elsewhere),
            connections,
            slots,
            stopping,
        )
        .await;
        for (name, served) in others {
            served
                .await
                .with_context(|| format!("{name} listener failed"))?;
        }
        telemetry.shutdown().await;
        Ok(())
    }
}

/// Sends envoy's statistics to `statsd` every flush interval, from a task of its own.
fn flush_statsd(
    statsd: &crate::metrics::StatsdOptions,
    service: Arc<Service>,
) -> anyhow::Result<()> {
    let mut sink = service.metrics().statsd_sink(statsd)?;
    let mut tick = tokio::time::interval(statsd.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::spawn(async move {
        // The first tick is at once: nothing to send yet.
        tick.tick().await;
        loop {
            tick.tick().await;
            service.metrics().flush_statsd(&mut sink);
        }
    });
    Ok(())
}

/// The configuration at `path`, or the example rules without one.
fn load_config(path: Option<&Path>, options: LoadOptions) -> anyhow::Result<Config> {
    Ok(match path {
        Some(path) => Config::load(path, options)?,
        None => Config::parse(Path::new(EXAMPLE_CONFIG_NAME), EXAMPLE_CONFIG, options)?,
    })
}
