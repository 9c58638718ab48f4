//! `sluicegate serve`: the service's flags, starting it, reloading its configuration, stopping on a signal.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use sluicegate::duration::parse_duration;
use sluicegate::{Algorithm, AnyStore, Limiter, MemoryStore};

use super::args::StoreArgs;
use super::runtime::runtime;
use crate::config::{self, Config};
use crate::{decide, grpc, http, metrics};

/// The example configuration `serve` uses when no `--config` is given (examples/).
const EXAMPLE_CONFIG: &str = include_str!("../../../../examples/sluicegate.yaml");

#[derive(Args)]
pub(super) struct ServeArgs {
    /// Descriptor configuration (YAML). Without it, the example rules of
    /// examples/sluicegate.yaml are served.
    #[arg(long, env = "SLUICEGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "SLUICEGATE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    store: StoreArgs,
    /// When the store fails: error (answer 503), allow, deny, or local (an in-memory
    /// limiter allowing L / --instances). Rules may set their own (on_store_error).
    #[arg(long, env = "SLUICEGATE_ON_STORE_ERROR", default_value = "error")]
    on_store_error: sluicegate::FailurePolicy,
    /// How many instances share the store (for the local fallback).
    #[arg(long, env = "SLUICEGATE_INSTANCES", default_value_t = 1)]
    instances: u32,
    /// Consecutive store failures that open the circuit breaker (0: never).
    #[arg(long, env = "SLUICEGATE_BREAKER_FAILURES", default_value_t = 5)]
    breaker_failures: u32,
    /// How long an open breaker waits before probing the store again.
    #[arg(long, env = "SLUICEGATE_BREAKER_COOL_DOWN", default_value = "1s")]
    breaker_cool_down: String,
    /// Do not answer repeated refusals locally (the negative cache is on for Redis).
    #[arg(long, env = "SLUICEGATE_NO_NEGATIVE_CACHE")]
    no_negative_cache: bool,
    /// The algorithm of rules that name none: sliding-log (exact), or fixed-window to
    /// decide exactly as envoyproxy/ratelimit does.
    #[arg(
        long,
        env = "SLUICEGATE_DEFAULT_ALGORITHM",
        default_value = "sliding-log"
    )]
    default_algorithm: Algorithm,
    /// Also serve gRPC alone on this address (it is always served on --listen too).
    #[arg(long, env = "SLUICEGATE_GRPC_LISTEN")]
    grpc_listen: Option<SocketAddr>,
    /// Add the legacy X-RateLimit-Limit, -Remaining and -Reset to gRPC answers.
    #[arg(long, env = "SLUICEGATE_LEGACY_HEADERS")]
    legacy_headers: bool,
    /// The longest descriptor key or value accepted, in bytes (longer: 400).
    #[arg(long, env = "SLUICEGATE_MAX_ENTRY_BYTES", default_value_t = decide::DEFAULT_MAX_ENTRY_BYTES)]
    max_entry_bytes: usize,
    /// Enables POST /v1/reset for requests bearing this token.
    #[arg(long, env = "SLUICEGATE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// How often to look for edits of the --config files (SIGHUP reloads at once).
    #[arg(long, env = "SLUICEGATE_RELOAD_INTERVAL", default_value = "1s")]
    reload_interval: String,
}

impl ServeArgs {
    fn limiter_config(&self) -> Result<sluicegate::LimiterConfig, String> {
        let cool_down = parse_duration(&self.breaker_cool_down)
            .map_err(|e| format!("--breaker-cool-down: {e}"))?;
        let remote = self.store.store != "memory";
        Ok(sluicegate::LimiterConfig {
            on_store_error: self.on_store_error,
            instances: self.instances.max(1),
            breaker_failures: self.breaker_failures,
            breaker_cool_down: Duration::from_micros(cool_down),
            negative_cache_entries: if remote && !self.no_negative_cache {
                100_000
            } else {
                0
            },
        })
    }
}

fn load_config(path: Option<&Path>, default: Algorithm) -> Result<Config, String> {
    match path {
        Some(path) => Config::load(path, default),
        None => Config::parse(
            Path::new("examples/sluicegate.yaml"),
            EXAMPLE_CONFIG,
            default,
        ),
    }
    .map_err(|e| e.to_string())
}

pub(super) fn serve(args: ServeArgs) -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // The files as they were before loading, so an edit made meanwhile is reloaded too.
    let loaded_files = args.config.as_deref().map(config::fingerprint);
    let config = load_config(args.config.as_deref(), args.default_algorithm)?;
    runtime().map_err(|e| format!("{e:#}"))?.block_on(async {
        let options = args.store.options("sluicegate:").map_err(|e| format!("{e:#}"))?;
        let store = AnyStore::open(options)
            .await
            .map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
        let limiter = Arc::new(Limiter::with_config(store, args.limiter_config()?));
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
        let metrics = Arc::new(metrics::Metrics::default());
        metrics
            .config_loads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let live = Arc::new(config::LiveConfig::new(config));
        if let Some(path) = args.config.clone() {
            let interval = parse_duration(&args.reload_interval)
                .map_err(|e| format!("--reload-interval: {e}"))?;
            let interval = Duration::from_micros(interval.max(1_000));
            // Listen for SIGHUP now, before the server says it is up: a SIGHUP that came
            // before the handler would end the process.
            #[cfg(unix)]
            let hangup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            #[cfg(not(unix))]
            let hangup = None;
            tokio::spawn(reload_on_change(
                path,
                loaded_files.unwrap_or_default(),
                args.default_algorithm,
                Arc::clone(&live),
                Arc::clone(&metrics),
                interval,
                hangup,
            ));
        }
        let state = http::AppState {
            config: live,
            limiter,
            metrics,
            admin_token: args.admin_token.as_deref().map(Arc::from),
            legacy_headers: args.legacy_headers,
            max_entry_bytes: args.max_entry_bytes,
        };
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(
            address = %local,
            config = %args.config.as_deref().unwrap_or(Path::new("examples/sluicegate.yaml")).display(),
            store = %args.store.store,
            "sluicegate listening"
        );
        // One signal stops every listener.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop.send(true);
        });
        let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let grpc_only = match args.grpc_listen {
            Some(address) => {
                let listener = tokio::net::TcpListener::bind(address)
                    .await
                    .map_err(|e| format!("cannot listen on {address}: {e}"))?;
                let local = listener.local_addr().map_err(|e| e.to_string())?;
                tracing::info!(grpc_address = %local, "gRPC also on its own port");
                let router = grpc::router(state.clone());
                Some(tokio::spawn(
                    axum::serve(listener, router)
                        .with_graceful_shutdown(until_stopped(stopped.clone()))
                        .into_future(),
                ))
            }
            None => None,
        };
        axum::serve(listener, http::app(state))
            .with_graceful_shutdown(until_stopped(stopped))
            .await
            .map_err(|e| format!("server failed: {e}"))?;
        if let Some(grpc) = grpc_only {
            grpc.await
                .map_err(|e| format!("gRPC server failed: {e}"))?
                .map_err(|e| format!("gRPC server failed: {e}"))?;
        }
        Ok(())
    })
}

#[cfg(unix)]
type Hangup = tokio::signal::unix::Signal;
/// No SIGHUP off Unix.
#[cfg(not(unix))]
type Hangup = NoSignal;

#[cfg(not(unix))]
struct NoSignal;

#[cfg(not(unix))]
impl NoSignal {
    async fn recv(&mut self) -> Option<()> {
        std::future::pending().await
    }
}

/// Reloads the configuration when its files change or on SIGHUP. A configuration that
/// does not load keeps the previous one serving; the error is logged and counted.
async fn reload_on_change(
    path: PathBuf,
    mut seen: Vec<config::FileStamp>,
    default: Algorithm,
    live: Arc<config::LiveConfig>,
    metrics: Arc<metrics::Metrics>,
    interval: Duration,
    mut hangup: Option<Hangup>,
) {
    use std::sync::atomic::Ordering;
    let mut tick = tokio::time::interval(interval);
    loop {
        let signalled = async {
            match hangup.as_mut() {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        };
        let forced = tokio::select! {
            _ = tick.tick() => false,
            _ = signalled => true,
        };
        let now = config::fingerprint(&path);
        if !forced && now == seen {
            continue;
        }
        seen = now;
        match Config::load(&path, default) {
            Ok(config) => {
                live.replace(config);
                metrics.config_loads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(config = %path.display(), "configuration reloaded");
            }
            Err(e) => {
                metrics.config_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "configuration rejected; the previous one keeps serving");
            }
        }
    }
}

/// Resolves on SIGINT or SIGTERM: stop accepting, let requests in flight finish.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
