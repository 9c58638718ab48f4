//! `sluicegate serve`: the service's flags, and the process around [`crate::serve`] —
//! logging, the runtime, the listeners, and stopping on SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use std::str::FromStr as _;

use sluicegate::{
    Algorithm, BreakerConfig, LimiterConfig, MemoryBudget, MemoryStore, MemoryStoreConfig, OnFull,
    StoreOptions,
};

mod memory;
mod xds;

use self::memory::{default_max_memory, human_bytes, parse_bytes_arg};
use self::xds::XdsArgs;
use super::args::{DurationArg, PrecheckArgs, StoreArgs, parse_duration_arg, read_token_file};
use super::logging::LogArgs;
use super::runtime::runtime_without_lifo_slot;
use super::stats::StatsArgs;
use crate::compat::Compat;
use crate::config::{DEFAULT_MAX_BYTES, DEFAULT_MAX_NODES};
use crate::metrics::DEFAULT_NEAR_LIMIT_RATIO;
use crate::server::{
    self, ConnectionOptions, Listeners, OtlpOptions, OtlpProtocol, ServeOptions, TlsOptions,
};
use crate::service::{DEFAULT_MAX_ENTRY_BYTES, EnvoyHeaderNames, ResponseHeaders, ServiceOptions};

#[derive(Args)]
/// The flags of `sluicegate serve`.
pub struct ServeArgs {
    /// Descriptor configuration (YAML). Without it, the example rules of
    /// examples/sluicegate.yaml are served.
    #[arg(long, env = "SLUICEGATE_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    xds: XdsArgs,
    /// Address to listen on.
    #[arg(long, env = "SLUICEGATE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    log: LogArgs,
    /// When the store fails: error (answer 503), allow, deny, or local (an in-memory
    /// limiter allowing L / --instances). Rules may set their own (on_store_error).
    #[arg(long, env = "SLUICEGATE_ON_STORE_ERROR", default_value = "error")]
    on_store_error: sluicegate::FailurePolicy,
    /// How many instances share the store (for the local fallback).
    #[arg(long, env = "SLUICEGATE_INSTANCES", default_value_t = 1)]
    instances: u32,
    /// When Redis has lost a key's state (a restart without persistence, a failover that
    /// lost writes, a flush): conservative writes back the count this instance last saw
    /// for the key before Redis may admit it again; admit starts from what Redis holds.
    #[arg(
        long,
        env = "SLUICEGATE_ON_STORE_RESET",
        default_value = "conservative"
    )]
    on_store_reset: sluicegate::OnStoreReset,
    /// The share of store calls (0 to 1, above 0) that, failing within --breaker-window,
    /// open the circuit breaker.
    #[arg(long, env = "SLUICEGATE_BREAKER_FAILURE_RATE", default_value_t = 0.5, value_parser = parse_failure_rate)]
    breaker_failure_rate: f64,
    /// How far back the circuit breaker counts store calls.
    #[arg(long, env = "SLUICEGATE_BREAKER_WINDOW", default_value = "1s", value_parser = parse_duration_arg)]
    breaker_window: DurationArg,
    /// Fewer store calls than this within --breaker-window never open the circuit breaker
    /// (0: it never opens).
    #[arg(long, env = "SLUICEGATE_BREAKER_MIN_CALLS", default_value_t = 20)]
    breaker_min_calls: u32,
    /// How long an open breaker waits before probing the store again.
    #[arg(long, env = "SLUICEGATE_BREAKER_COOL_DOWN", default_value = "1s", value_parser = parse_duration_arg)]
    breaker_cool_down: DurationArg,
    /// Do not answer repeated refusals locally (the negative cache is on for Redis).
    #[arg(long, env = "SLUICEGATE_NO_NEGATIVE_CACHE")]
    no_negative_cache: bool,
    #[command(flatten)]
    precheck: PrecheckArgs,
    /// The algorithm of rules that name none [default: sliding-log; fixed-window with
    /// --compat envoy].
    #[arg(long, env = "SLUICEGATE_DEFAULT_ALGORITHM")]
    default_algorithm: Option<Algorithm>,
    /// Whose semantics to keep: none (sluicegate's: refusals cost nothing, a request is
    /// all-or-nothing) or envoy (envoyproxy/ratelimit's: fixed windows, refused hits
    /// counted, each descriptor counted on its own; its environment variables read too).
    #[arg(long, env = "SLUICEGATE_COMPAT", default_value = "none")]
    compat: Compat,
    /// With --compat envoy on Redis: a fixed window's counter, envoy's own key, lives its
    /// window plus a jitter below this (whole seconds; envoy's
    /// EXPIRATION_JITTER_MAX_SECONDS), so that one window's counters do not all expire at
    /// once. The default is the library's (a test holds them equal).
    #[arg(long, env = "SLUICEGATE_EXPIRATION_JITTER_MAX", default_value = "300s", value_parser = parse_duration_arg)]
    expiration_jitter_max: DurationArg,
    /// With --compat envoy: when a descriptor of a request goes over its limit, the
    /// others do not count the request (envoy's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
    #[arg(long, env = "SLUICEGATE_STOP_INCREMENT_WHEN_OVER_LIMIT")]
    stop_increment_when_over_limit: bool,
    /// Also serve gRPC alone on this address (it is always served on --listen too).
    #[arg(long, env = "SLUICEGATE_GRPC_LISTEN")]
    grpc_listen: Option<SocketAddr>,
    /// Also serve the probes, /metrics, /v1/rules, and to anyone who reaches it the live
    /// page, /v1/top, /v1/overview and /v1/explain, alone on this address (nothing that
    /// decides or resets).
    #[arg(long, env = "SLUICEGATE_DEBUG_LISTEN")]
    debug_listen: Option<SocketAddr>,
    /// Also serve /metrics alone on this address (for a scraper that expects its own
    /// port, as envoyproxy/ratelimit's PROMETHEUS_ADDR).
    #[arg(long, env = "SLUICEGATE_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// The headers Envoy answers (gRPC, /json) ask Envoy to add to the client's response:
    /// none, envoy (envoyproxy/ratelimit's limit, remaining and reset, named by
    /// --limit-header, --remaining-header, --reset-header), or ietf (RateLimit,
    /// RateLimit-Policy, Retry-After).
    #[arg(long, env = "SLUICEGATE_RESPONSE_HEADERS", default_value = "none")]
    response_headers: ResponseHeaders,
    /// The name of --response-headers envoy's limit header.
    #[arg(long, env = "SLUICEGATE_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = parse_header_name)]
    limit_header: String,
    /// The name of --response-headers envoy's remaining header.
    #[arg(long, env = "SLUICEGATE_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = parse_header_name)]
    remaining_header: String,
    /// The name of --response-headers envoy's reset header.
    #[arg(long, env = "SLUICEGATE_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = parse_header_name)]
    reset_header: String,
    /// Refuse nothing: every limit is counted and reported, and an Envoy answer over the
    /// limit is OK all the same (envoyproxy/ratelimit's SHADOW_MODE).
    #[arg(long, env = "SLUICEGATE_SHADOW_MODE")]
    shadow_mode: bool,
    /// The share of a limit (above 0, at most 1) past which hits count as near_limit in
    /// the metrics (envoyproxy/ratelimit's NEAR_LIMIT_RATIO).
    #[arg(long, env = "SLUICEGATE_NEAR_LIMIT_RATIO", default_value_t = DEFAULT_NEAR_LIMIT_RATIO, value_parser = parse_near_limit_ratio)]
    near_limit_ratio: f32,
    /// The longest descriptor key or value accepted, in bytes (longer: 400).
    #[arg(long, env = "SLUICEGATE_MAX_ENTRY_BYTES", default_value_t = DEFAULT_MAX_ENTRY_BYTES)]
    max_entry_bytes: usize,
    /// Enables POST /v1/reset for requests bearing this token.
    #[arg(long, env = "SLUICEGATE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Not ready (/readyz answers 503) while Redis may evict keys: a maxmemory-policy
    /// other than noeviction on any server, or one that cannot be read.
    #[arg(long, env = "SLUICEGATE_REQUIRE_NOEVICTION")]
    require_noeviction: bool,
    /// Do not serve the live page (GET /ui); /v1/overview stays.
    #[arg(long, env = "SLUICEGATE_NO_UI")]
    no_ui: bool,
    /// A file holding the bearer token that GET /v1/top, /v1/overview, /ui and POST
    /// /v1/explain need on --listen (they show request values). Without it they answer
    /// loopback peers only there; --debug-listen serves them to anyone either way.
    #[arg(long, env = "SLUICEGATE_READ_TOKEN_FILE", value_name = "PATH")]
    read_token_file: Option<PathBuf>,
    /// Send a trace span per check to this OTLP collector (http://host:4317 for gRPC,
    /// http://host:4318 for HTTP); no traces without it.
    #[arg(long, env = "SLUICEGATE_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// How spans reach --otlp-endpoint: grpc (OTLP/gRPC) or http (OTLP/HTTP, protobuf,
    /// POSTed to /v1/traces).
    #[arg(
        long,
        env = "SLUICEGATE_OTLP_PROTOCOL",
        default_value = "grpc",
        requires = "otlp_endpoint"
    )]
    otlp_protocol: OtlpProtocol,
    /// The traces' service.name.
    #[arg(
        long,
        env = "SLUICEGATE_OTLP_SERVICE_NAME",
        default_value = "sluicegate",
        requires = "otlp_endpoint"
    )]
    otlp_service_name: String,
    /// The traces' service.namespace.
    #[arg(
        long,
        env = "SLUICEGATE_OTLP_SERVICE_NAMESPACE",
        requires = "otlp_endpoint"
    )]
    otlp_service_namespace: Option<String>,
    /// The traces' service.instance.id [default: a random one].
    #[arg(
        long,
        env = "SLUICEGATE_OTLP_SERVICE_INSTANCE_ID",
        requires = "otlp_endpoint"
    )]
    otlp_service_instance_id: Option<String>,
    /// The share (0 to 1) of traces begun here that are sampled; a check whose caller's
    /// trace context says sampled, or not, follows it.
    #[arg(
        long,
        env = "SLUICEGATE_OTLP_SAMPLING_RATIO",
        default_value_t = 1.0,
        requires = "otlp_endpoint"
    )]
    otlp_sampling_ratio: f64,
    /// How often to look for edits of the --config files and the TLS certificate and
    /// key (SIGHUP reloads the configuration at once).
    #[arg(long, env = "SLUICEGATE_RELOAD_INTERVAL", default_value = "1s", value_parser = parse_duration_arg)]
    reload_interval: DurationArg,
    /// The most YAML nodes (mappings, sequences, scalars) one configuration file may
    /// hold; the default reads about 22,700 descriptors of one rule each.
    #[arg(long, env = "SLUICEGATE_MAX_CONFIG_NODES", default_value_t = DEFAULT_MAX_NODES)]
    max_config_nodes: usize,
    /// In a --config directory, skip files and directories whose name starts with a dot
    /// (editor swap files, the `..data` copies of a Kubernetes ConfigMap); false reads
    /// them, as envoyproxy/ratelimit does by default.
    #[arg(long, env = "SLUICEGATE_CONFIG_IGNORE_DOTFILES", default_value_t = true, action = clap::ArgAction::Set)]
    config_ignore_dotfiles: bool,
    /// Files of a --config directory that declare the same domain add their descriptors
    /// to it (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); without it, an error.
    #[arg(long, env = "SLUICEGATE_MERGE_DOMAIN_CONFIG")]
    merge_domain_config: bool,
    /// The in-memory store's hard cap on live (rule, key) entries: at the cap a new key is
    /// decided by --on-full.
    #[arg(long, env = "SLUICEGATE_MAX_KEYS", default_value_t = MemoryStoreConfig::default().max_keys)]
    max_keys: usize,
    /// The memory budget in bytes (`512MiB`, `2GB`): the in-memory store, the negative
    /// cache and the local fallback count what they hold against it [default: a quarter
    /// of the cgroup's memory limit, else of the machine's memory].
    #[arg(long, env = "SLUICEGATE_MAX_MEMORY", value_parser = parse_bytes_arg)]
    max_memory: Option<u64>,
    /// What a new key gets when the budget, --max-keys or its rule's share is reached:
    /// refuse (429, OVER_LIMIT), allow (uncounted), or evict-idle (evict idle keys that
    /// still have room under their limit, the flooding rule's first; refuse if none).
    #[arg(long, env = "SLUICEGATE_ON_FULL", default_value = "evict-idle", value_parser = OnFull::from_str)]
    on_full: OnFull,
    /// The share of the memory budget and of --max-keys one rule may hold (above 0, at
    /// most 1): a flood of new keys under one rule leaves the rest to the others.
    #[arg(long, env = "SLUICEGATE_MAX_RULE_SHARE", default_value_t = MemoryBudget::DEFAULT_RULE_SHARE, value_parser = parse_rule_share)]
    max_rule_share: f64,
    /// Connections open at once over every listener; beyond it new ones are closed at
    /// once (lowered to what the descriptor limit allows).
    #[arg(long, env = "SLUICEGATE_MAX_CONNECTIONS", default_value_t = 10_000)]
    max_connections: usize,
    /// Of --max-connections, the most one client address (IPv6: one /64) may hold open;
    /// beyond it its new ones are closed at once. Default: a quarter of --max-connections
    /// (as lowered by the descriptor limit); 0: no share, the whole cap.
    #[arg(long, env = "SLUICEGATE_MAX_CONNECTIONS_PER_ADDRESS")]
    max_connections_per_address: Option<usize>,
    /// The most bytes a configuration may hold: a --config file, every file of a --config
    /// directory together, or one xDS push's resources; a larger one is refused (at start,
    /// the start fails; on reload, the rules in force stay).
    #[arg(long, env = "SLUICEGATE_MAX_CONFIG_BYTES", default_value_t = DEFAULT_MAX_BYTES)]
    max_config_bytes: usize,
    /// A request's headers (and a TLS handshake) must arrive within it (0s: no limit).
    #[arg(long, env = "SLUICEGATE_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration_arg)]
    header_timeout: DurationArg,
    /// A connection with no request in flight is closed after it (0s: never).
    #[arg(long, env = "SLUICEGATE_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration_arg)]
    idle_timeout: DurationArg,
    /// A request body not received within it is answered 408 (0s: no limit).
    #[arg(long, env = "SLUICEGATE_BODY_TIMEOUT", default_value = "10s", value_parser = parse_duration_arg)]
    body_timeout: DurationArg,
    /// HTTP/2 keep-alive pings this often (0s: none).
    #[arg(long, env = "SLUICEGATE_HTTP2_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = parse_duration_arg)]
    http2_keepalive_interval: DurationArg,
    /// An HTTP/2 connection whose ping is not answered within it is closed.
    #[arg(long, env = "SLUICEGATE_HTTP2_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = parse_duration_arg)]
    http2_keepalive_timeout: DurationArg,
    /// On SIGTERM or SIGINT, requests in flight may finish for this long; then the
    /// process exits 0 anyway. A second signal exits at once.
    #[arg(long, env = "SLUICEGATE_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration_arg)]
    shutdown_timeout: DurationArg,
    /// TLS on every listener: the certificate chain (PEM), reloaded when it changes.
    #[arg(long, env = "SLUICEGATE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM), reloaded with it.
    #[arg(long, env = "SLUICEGATE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// mTLS: clients must present a certificate this authority (PEM) signed.
    #[arg(long, env = "SLUICEGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// TLS on the --grpc-listen port alone (instead of --tls-cert there): the certificate
    /// chain (PEM), reloaded when it changes. The --listen port then answers no gRPC
    /// call (PERMISSION_DENIED), so gRPC is never served past this TLS.
    #[arg(long, env = "SLUICEGATE_GRPC_TLS_CERT", requires_all = ["grpc_tls_key", "grpc_listen"])]
    grpc_tls_cert: Option<PathBuf>,
    /// The --grpc-tls-cert certificate's private key (PEM), reloaded with it.
    #[arg(long, env = "SLUICEGATE_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    grpc_tls_key: Option<PathBuf>,
    /// mTLS on the --grpc-listen port: clients must present a certificate this authority
    /// (PEM) signed.
    #[arg(
        long,
        env = "SLUICEGATE_GRPC_TLS_CLIENT_CA",
        requires = "grpc_tls_cert"
    )]
    grpc_tls_client_ca: Option<PathBuf>,
    /// With --grpc-tls-client-ca: the client's certificate must also carry this DNS name
    /// or IP address among its subject alternative names.
    #[arg(
        long,
        env = "SLUICEGATE_GRPC_TLS_CLIENT_SAN",
        requires = "grpc_tls_client_ca"
    )]
    grpc_tls_client_san: Option<String>,
    /// A --grpc-listen connection this old (give or take 10%) is told to go away (HTTP/2
    /// GOAWAY), so that clients spread over new instances [default and 0s: never].
    #[arg(long, env = "SLUICEGATE_GRPC_MAX_CONNECTION_AGE", value_parser = parse_duration_arg, requires = "grpc_listen")]
    grpc_max_connection_age: Option<DurationArg>,
    /// Then, calls still in flight this long after are cut [default and 0s: they finish].
    #[arg(long, env = "SLUICEGATE_GRPC_MAX_CONNECTION_AGE_GRACE", value_parser = parse_duration_arg, requires = "grpc_max_connection_age")]
    grpc_max_connection_age_grace: Option<DurationArg>,
    #[command(flatten)]
    stats: StatsArgs,
}

/// A listener's TLS, when its certificate and key are given (clap requires them together).
fn tls_options(
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    client_ca: &Option<PathBuf>,
    client_san: &Option<String>,
) -> Option<TlsOptions> {
    Some(TlsOptions {
        cert: cert.clone()?,
        key: key.clone()?,
        client_ca: client_ca.clone(),
        client_san: client_san.clone(),
    })
}

impl ServeArgs {
    /// The service these flags describe.
    pub fn options(&self) -> anyhow::Result<ServeOptions> {
        let remote = !self.store.is_memory();
        anyhow::ensure!(
            !self.breaker_window.duration().is_zero(),
            "--breaker-window must be longer than zero"
        );
        let (response_headers, envoy_header_names) = self.response_headers();
        let (envoy_stats, statsd) = self.stats.options()?;
        let memory = self.memory_budget()?;
        Ok(ServeOptions {
            config: self.config.clone(),
            xds: self.xds.options(),
            default_algorithm: self.compat.default_algorithm(self.default_algorithm),
            max_config_nodes: self.max_config_nodes,
            max_config_bytes: self.max_config_bytes,
            config_ignore_dotfiles: self.config_ignore_dotfiles,
            merge_domain_config: self.merge_domain_config,
            store: StoreOptions {
                memory: MemoryStoreConfig {
                    max_keys: self.max_keys,
                    budget: memory.part(MemoryStore::BUDGET_PART),
                    on_full: self.on_full,
                    ..MemoryStoreConfig::default()
                },
                expiration_jitter_max: self.expiration_jitter_max()?,
                ..self.store.options(self.compat.default_prefix())?
            },
            limiter: LimiterConfig {
                on_store_error: self.on_store_error,
                instances: self.instances.max(1),
                on_store_reset: self.on_store_reset,
                breaker: BreakerConfig {
                    failure_rate: self.breaker_failure_rate,
                    window: self.breaker_window.duration(),
                    min_calls: self.breaker_min_calls,
                    cool_down: self.breaker_cool_down.duration(),
                },
                negative_cache_entries: if remote && !self.no_negative_cache {
                    100_000
                } else {
                    0
                },
                local_precheck: self.precheck.local_precheck,
                memory,
                ..LimiterConfig::default()
            },
            service: ServiceOptions {
                shadow_mode: self.shadow_mode,
                near_limit_ratio: self.near_limit_ratio,
                max_entry_bytes: self.max_entry_bytes,
                response_headers,
                envoy_header_names,
                admin_token: self.admin_token.as_deref().map(Arc::from),
                read_token: self
                    .read_token_file
                    .as_deref()
                    .map(|path| read_token_file(path, "--read-token-file"))
                    .transpose()?,
                require_noeviction: self.require_noeviction,
                ui: !self.no_ui,
                refusal_log_share: self.log.log_refusals,
                compat: self.compat,
                counting: self
                    .compat
                    .counting(self.stop_increment_when_over_limit)
                    .map_err(anyhow::Error::msg)?,
                envoy_stats,
                healthy_with_config: self.xds.healthy_with_config,
            },
            reload_interval: self.reload_interval.duration(),
            connections: ConnectionOptions {
                max_connections: self.max_connections.max(1),
                max_connections_per_address: self
                    .max_connections_per_address
                    .map(|share| if share == 0 { usize::MAX } else { share }),
                header_timeout: unless_zero(&self.header_timeout),
                idle_timeout: unless_zero(&self.idle_timeout),
                body_timeout: unless_zero(&self.body_timeout),
                http2_keepalive_interval: unless_zero(&self.http2_keepalive_interval),
                http2_keepalive_timeout: self.http2_keepalive_timeout.duration(),
                shutdown_timeout: self.shutdown_timeout.duration(),
                max_age: None,
                max_age_grace: None,
            },
            // 0s is never, as grpc-go reads a zero age or grace.
            grpc_max_connection_age: self.grpc_max_connection_age.as_ref().and_then(unless_zero),
            grpc_max_connection_age_grace: self
                .grpc_max_connection_age_grace
                .as_ref()
                .and_then(unless_zero),
            tls: tls_options(&self.tls_cert, &self.tls_key, &self.tls_client_ca, &None),
            grpc_tls: tls_options(
                &self.grpc_tls_cert,
                &self.grpc_tls_key,
                &self.grpc_tls_client_ca,
                &self.grpc_tls_client_san,
            ),
            statsd,
            otlp: self.otlp_endpoint.clone().map(|endpoint| OtlpOptions {
                endpoint,
                protocol: self.otlp_protocol,
                service_name: self.otlp_service_name.clone(),
                service_namespace: self.otlp_service_namespace.clone(),
                service_instance_id: self.otlp_service_instance_id.clone(),
                sampling_ratio: self.otlp_sampling_ratio,
            }),
        })
    }

    /// --response-headers and the envoy headers' names.
    fn response_headers(&self) -> (ResponseHeaders, EnvoyHeaderNames) {
        let names = EnvoyHeaderNames {
            limit: self.limit_header.clone(),
            remaining: self.remaining_header.clone(),
            reset: self.reset_header.clone(),
        };
        (self.response_headers, names)
    }

    /// --expiration-jitter-max, which Redis' EXPIRE can honour in whole seconds only.
    fn expiration_jitter_max(&self) -> anyhow::Result<std::time::Duration> {
        let jitter = &self.expiration_jitter_max;
        anyhow::ensure!(
            jitter.micros().is_multiple_of(1_000_000),
            "--expiration-jitter-max {}: must be whole seconds (Redis EXPIRE takes seconds)",
            jitter.as_written()
        );
        Ok(jitter.duration())
    }

    /// Binds the addresses these flags name.
    pub async fn listeners(&self) -> anyhow::Result<Listeners> {
        let bind = |address: SocketAddr| async move {
            tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address}"))
        };
        let bind_if = |address: Option<SocketAddr>| async move {
            match address {
                Some(address) => bind(address).await.map(Some),
                None => Ok(None),
            }
        };
        Ok(Listeners {
            main: bind(self.listen).await?,
            grpc_only: bind_if(self.grpc_listen).await?,
            debug: bind_if(self.debug_listen).await?,
            metrics: bind_if(self.metrics_listen).await?,
        })
    }
}

/// clap's value parser for the header-name flags: a name Envoy can add.
fn parse_header_name(text: &str) -> Result<String, String> {
    axum::http::HeaderName::from_bytes(text.as_bytes())
        .map(|_| text.to_owned())
        .map_err(|_| format!("{text:?} is not an HTTP header name"))
}

/// clap's value parser for --near-limit-ratio: a share in (0, 1].
fn parse_near_limit_ratio(text: &str) -> Result<f32, String> {
    parse_share(text, "a limit", "0.8")
}

/// clap's value parser for --breaker-failure-rate: a share in (0, 1].
fn parse_failure_rate(text: &str) -> Result<f64, String> {
    parse_share(text, "calls", "0.5")
}

fn parse_rule_share(text: &str) -> Result<f64, String> {
    parse_share(text, "the memory budget", "0.5")
}

impl ServeArgs {
    /// The memory budget --max-memory and --max-rule-share describe; a budget that cannot
    /// be honoured stops the start, naming the flag.
    fn memory_budget(&self) -> anyhow::Result<MemoryBudget> {
        let (bytes, _) = self.max_memory()?;
        MemoryBudget::new(
            usize::try_from(bytes).unwrap_or(usize::MAX),
            self.max_rule_share,
        )
        .map_err(|e| anyhow::anyhow!("--max-memory / --max-rule-share: {e}"))
    }

    /// The budget's size in bytes, and where it came from.
    fn max_memory(&self) -> anyhow::Result<(u64, String)> {
        match self.max_memory {
            Some(bytes) => Ok((bytes, "--max-memory".to_owned())),
            None => default_max_memory().context(
                "--max-memory has no default here: neither the cgroup's memory limit nor \
                 /proc/meminfo could be read; set it (such as --max-memory 512MiB)",
            ),
        }
    }

    /// Logs the memory budget in force, with where its size came from.
    fn log_memory_budget(&self) {
        if let Ok((bytes, source)) = self.max_memory() {
            tracing::info!(
                "memory budget: {} ({source}); a rule may hold {} of it; when full: {}",
                human_bytes(bytes),
                self.max_rule_share,
                self.on_full.name()
            );
        }
    }
}

/// A share of `what` in (0, 1], in the float type the flag keeps.
fn parse_share<T>(text: &str, what: &str, example: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + From<u8>,
{
    match text.parse::<T>() {
        Ok(share) if share > T::from(0) && share <= T::from(1) => Ok(share),
        _ => Err(format!(
            "{text:?} is not a share of {what} above 0 and at most 1, such as {example}"
        )),
    }
}

/// A timeout flag, where 0 means none.
fn unless_zero(flag: &DurationArg) -> Option<Duration> {
    Some(flag.duration()).filter(|d| !d.is_zero())
}

/// How long the runtime may take to stop once the service has returned: a task blocked
/// in a system call must not hold the exit.
const RUNTIME_STOP: Duration = Duration::from_secs(1);

/// Runs the service in this process until SIGTERM or SIGINT, having logged the warnings
/// `--compat envoy` has about envoy's environment.
pub(super) fn serve(args: ServeArgs, envoy_warnings: &[String]) -> anyhow::Result<()> {
    args.log.init();
    for warning in envoy_warnings {
        tracing::warn!("--compat envoy: {warning}");
    }
    refuse_removed_variables(std::env::vars_os())?;
    let options = args.options()?;
    let runtime = runtime_without_lifo_slot()?;
    let served = runtime.block_on(async {
        // Listened for before anything else: a signal during the start is not lost, and
        // stops a start that waits (for a first xDS push, for a store).
        let mut signals = Signals::listen()?;
        let prepared = tokio::select! {
            prepared = server::prepare(options) => prepared?,
            _ = signals.next() => {
                tracing::info!("stopped before serving");
                return Ok(());
            }
        };
        args.log_memory_budget();
        let listeners = args.listeners().await?;
        prepared.serve(listeners, signals.shutdown()).await
    });
    runtime.shutdown_timeout(RUNTIME_STOP);
    served
}

/// The environment variables of flags `serve` no longer has, with what to set instead. clap
/// ignores a variable it has no flag for, so a deployment that still sets one would start
/// without the behaviour it asks for.
const REMOVED_VARIABLES: [(&str, &str); 2] = [
    (
        "SLUICEGATE_BREAKER_FAILURES",
        "SLUICEGATE_BREAKER_MIN_CALLS and SLUICEGATE_BREAKER_FAILURE_RATE",
    ),
    (
        "SLUICEGATE_LEGACY_HEADERS",
        "SLUICEGATE_RESPONSE_HEADERS=envoy",
    ),
];

/// Stops the start when `vars` sets a removed flag's variable, naming it and its successor.
fn refuse_removed_variables(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> anyhow::Result<()> {
    for (name, _) in vars {
        if let Some((_, instead)) = REMOVED_VARIABLES
            .iter()
            .find(|(removed, _)| name == *removed)
        {
            anyhow::bail!(
                "{} is set, but its flag was removed: set {instead} instead",
                name.to_string_lossy()
            );
        }
    }
    Ok(())
}

/// SIGTERM and SIGINT.
struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
                interrupt: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next signal; its exit status were the process killed by it.
    async fn next(&mut self) -> i32 {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.terminate.recv() => 128 + 15,
                _ = self.interrupt.recv() => 128 + 2,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            128 + 2
        }
    }

    /// Resolves at the first signal: stop accepting, let requests in flight finish. A
    /// second signal ends the process at once, with the status of a process it killed.
    async fn shutdown(mut self) {
        self.next().await;
        tracing::info!(
            "shutting down: draining requests in flight (a second signal stops at once)"
        );
        tokio::spawn(async move {
            let status = self.next().await;
            tracing::warn!("second signal: stopping at once");
            std::process::exit(status);
        });
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    /// The breaker these flags configure, or the error they get.
    fn breaker(flags: &[&str]) -> Result<BreakerConfig, String> {
        let args = Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()))
            .map_err(|e| e.to_string())?;
        args.args
            .options()
            .map(|o| o.limiter.breaker)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_removed_flags_variable_stops_the_start_and_names_its_successor() {
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect::<Vec<_>>()
        };
        let refused = refuse_removed_variables(env(&[
            ("PATH", "/bin"),
            ("SLUICEGATE_LEGACY_HEADERS", "true"),
        ]))
        .unwrap_err()
        .to_string();
        assert_eq!(
            refused,
            "SLUICEGATE_LEGACY_HEADERS is set, but its flag was removed: \
             set SLUICEGATE_RESPONSE_HEADERS=envoy instead"
        );
        let refused = refuse_removed_variables(env(&[("SLUICEGATE_BREAKER_FAILURES", "5")]))
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with("SLUICEGATE_BREAKER_FAILURES is set"),
            "{refused}"
        );
        assert!(refuse_removed_variables(env(&[("SLUICEGATE_BREAKER_MIN_CALLS", "5")])).is_ok());
    }

    #[test]
    fn the_breaker_flags_and_their_defaults() {
        let defaults = breaker(&[]).unwrap();
        assert_eq!(defaults, BreakerConfig::default());
        let set = breaker(&[
            "--breaker-failure-rate",
            "0.25",
            "--breaker-window",
            "10s",
            "--breaker-min-calls",
            "100",
            "--breaker-cool-down",
            "500ms",
        ])
        .unwrap();
        assert_eq!(
            set,
            BreakerConfig {
                failure_rate: 0.25,
                window: std::time::Duration::from_secs(10),
                min_calls: 100,
                cool_down: std::time::Duration::from_millis(500),
            }
        );
    }

    #[test]
    fn the_default_store_timeout_is_the_librarys() {
        let args = Serve::try_parse_from(["serve", "--store", "redis://127.0.0.1:6379"]).unwrap();
        let options = args.args.options().unwrap();
        assert_eq!(
            options.store.timeout,
            sluicegate::StoreOptions::new("redis://127.0.0.1:6379").timeout
        );
    }

    #[test]
    fn store_durability_is_async_unless_asked_and_replicated_needs_redis() {
        let durability = |flags: &[&str]| {
            let all = std::iter::once("serve").chain(flags.iter().copied());
            Serve::try_parse_from(all)
                .map_err(|e| e.to_string())?
                .args
                .options()
                .map(|o| o.store.durability)
                .map_err(|e| e.to_string())
        };
        let redis = ["--store", "redis://127.0.0.1:6379"];
        assert_eq!(durability(&redis), Ok(sluicegate::Durability::Async));
        let replicated = [&redis[..], &["--store-durability", "replicated"]].concat();
        assert_eq!(
            durability(&replicated),
            Ok(sluicegate::Durability::Replicated)
        );
        let unknown = durability(&["--store-durability", "sync"]).unwrap_err();
        assert!(unknown.contains("async or replicated"), "{unknown}");
        let memory = durability(&["--store-durability", "replicated"]).unwrap_err();
        assert!(
            memory.contains("--store-durability replicated needs a Redis store"),
            "{memory}"
        );
    }

    #[test]
    fn envoy_compatibility_keeps_envoys_prefix_and_the_librarys_jitter() {
        let url = "redis://127.0.0.1:6379";
        let options = |args: &[&str]| {
            let all = ["serve", "--store", url]
                .into_iter()
                .chain(args.iter().copied());
            Serve::try_parse_from(all)
                .unwrap()
                .args
                .options()
                .unwrap()
                .store
        };
        let envoy = options(&["--compat", "envoy"]);
        assert_eq!(envoy.prefix, "");
        assert_eq!(
            envoy.expiration_jitter_max,
            sluicegate::StoreOptions::new(url).expiration_jitter_max
        );
        assert_eq!(options(&[]).prefix, "sluicegate:");
        let given = options(&["--compat", "envoy", "--prefix", "rl_"]);
        assert_eq!(given.prefix, "rl_");
        let jitter = options(&["--expiration-jitter-max", "0s"]).expiration_jitter_max;
        assert!(jitter.is_zero());
    }

    #[test]
    fn a_failure_rate_outside_zero_to_one_or_an_empty_window_is_refused() {
        for rate in ["0", "1.5", "-0.1", "half", "NaN"] {
            let error = breaker(&[&format!("--breaker-failure-rate={rate}")]).unwrap_err();
            assert!(error.contains("--breaker-failure-rate"), "{rate}: {error}");
        }
        let error = breaker(&["--breaker-window", "0s"]).unwrap_err();
        assert!(error.contains("--breaker-window"), "{error}");
    }

    /// The local pre-check these flags turn on, or the error they get.
    fn precheck(flags: &[&str]) -> Result<Option<f64>, String> {
        let args = Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()))
            .map_err(|e| e.to_string())?;
        Ok(args.args.options().unwrap().limiter.local_precheck)
    }

    #[test]
    fn the_local_precheck_is_off_by_default_and_1_2_when_named_alone() {
        assert_eq!(precheck(&[]), Ok(None));
        assert_eq!(precheck(&["--local-precheck"]), Ok(Some(1.2)));
        assert_eq!(precheck(&["--local-precheck", "1.5"]), Ok(Some(1.5)));
        assert_eq!(precheck(&["--local-precheck=2"]), Ok(Some(2.0)));
        for factor in ["0.5", "0", "-1", "NaN", "inf", "lots"] {
            let error = precheck(&[&format!("--local-precheck={factor}")]).unwrap_err();
            assert!(error.contains("--local-precheck"), "{factor}: {error}");
        }
    }
}
