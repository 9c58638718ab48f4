//! The mapping itself: each of envoyproxy/ratelimit's variables, its default there and
//! the `serve` flag it sets.

/// One of envoy's variables: its name, its default in envoyproxy/ratelimit
/// (src/settings/settings.go), the `serve` flag it sets (`None`: accepted, nothing to
/// set), and what it does here.
pub(super) struct EnvoyVariable {
    pub(super) name: &'static str,
    pub(super) default: Option<&'static str>,
    pub(super) flag: Option<&'static str>,
    pub(super) meaning: &'static str,
}

const fn variable(
    name: &'static str,
    default: Option<&'static str>,
    flag: Option<&'static str>,
    meaning: &'static str,
) -> EnvoyVariable {
    EnvoyVariable {
        name,
        default,
        flag,
        meaning,
    }
}

/// The mapping, in the README's order (README.md, "Envoy drop-in: environment, probes,
/// headers, metrics", has the same table; a test holds them equal).
pub(super) const VARIABLES: &[EnvoyVariable] = &[
    variable(
        "HOST",
        Some("0.0.0.0"),
        Some("--listen"),
        "HTTP (and gRPC) address",
    ),
    variable(
        "PORT",
        Some("8080"),
        Some("--listen"),
        "HTTP (and gRPC) port",
    ),
    variable(
        "GRPC_HOST",
        Some("0.0.0.0"),
        Some("--grpc-listen"),
        "gRPC address",
    ),
    variable(
        "GRPC_PORT",
        Some("8081"),
        Some("--grpc-listen"),
        "gRPC port",
    ),
    variable(
        "DEBUG_HOST",
        Some("0.0.0.0"),
        Some("--debug-listen"),
        "probes and metrics address",
    ),
    variable(
        "DEBUG_PORT",
        Some("6070"),
        Some("--debug-listen"),
        "probes and metrics port",
    ),
    variable(
        "USE_PROMETHEUS",
        Some("false"),
        Some("--metrics-listen"),
        "true: /metrics on PROMETHEUS_ADDR too",
    ),
    variable(
        "PROMETHEUS_ADDR",
        Some(":9090"),
        Some("--metrics-listen"),
        "(see USE_PROMETHEUS)",
    ),
    variable(
        "PROMETHEUS_PATH",
        Some("/metrics"),
        Some("--metrics-listen"),
        "/metrics only",
    ),
    variable(
        "RUNTIME_ROOT",
        Some("/srv/runtime_data/current"),
        Some("--config"),
        "config directory: ROOT/SUBDIRECTORY/APPDIRECTORY",
    ),
    variable(
        "RUNTIME_SUBDIRECTORY",
        Some(""),
        Some("--config"),
        "(see RUNTIME_ROOT)",
    ),
    variable(
        "RUNTIME_APPDIRECTORY",
        Some("config"),
        Some("--config"),
        "(see RUNTIME_ROOT)",
    ),
    variable(
        "RUNTIME_WATCH_ROOT",
        Some("true"),
        None,
        "accepted: edits are seen by content either way",
    ),
    variable(
        "RUNTIME_IGNOREDOTFILES",
        Some("false"),
        Some("--config-ignore-dotfiles"),
        "true: skip dot files",
    ),
    variable(
        "MERGE_DOMAIN_CONFIG",
        Some("false"),
        Some("--merge-domain-config"),
        "true: files of one domain merge",
    ),
    variable("BACKEND_TYPE", Some("redis"), Some("--store"), "redis only"),
    variable(
        "REDIS_SOCKET_TYPE",
        Some("unix"),
        Some("--store"),
        "tcp or unix",
    ),
    variable(
        "REDIS_TYPE",
        Some("SINGLE"),
        Some("--store"),
        "single, cluster or sentinel",
    ),
    variable(
        "REDIS_URL",
        Some("/var/run/nutcracker/ratelimit.sock"),
        Some("--store"),
        "host:port, a socket path, host:port,… for a cluster, master-name,host:port,… for sentinel",
    ),
    variable(
        "REDIS_AUTH",
        Some(""),
        Some("--store"),
        "password, or user:password",
    ),
    variable(
        "REDIS_SENTINEL_AUTH",
        None,
        Some("--store"),
        "the sentinels' own password",
    ),
    variable(
        "REDIS_TLS",
        Some("false"),
        Some("--store"),
        "true: rediss://",
    ),
    variable(
        "REDIS_TLS_CACERT",
        None,
        Some("--store-tls-ca"),
        "the authority Redis' certificate is signed by",
    ),
    variable(
        "REDIS_TIMEOUT",
        None,
        Some("--store-timeout"),
        "per-call timeout, when set",
    ),
    variable(
        "REDIS_POOL_SIZE",
        Some("10"),
        None,
        "accepted: one multiplexed connection per server",
    ),
    variable(
        "CACHE_KEY_PREFIX",
        None,
        Some("--prefix"),
        "Redis key prefix, when set",
    ),
    variable(
        "LOCAL_CACHE_SIZE_IN_BYTES",
        Some("0"),
        Some("--no-negative-cache"),
        "0: no negative cache; more: on",
    ),
    variable(
        "NEAR_LIMIT_RATIO",
        Some("0.8"),
        Some("--near-limit-ratio"),
        "the near_limit counters' threshold",
    ),
    variable(
        "SHADOW_MODE",
        Some("false"),
        Some("--shadow-mode"),
        "true: nothing refused",
    ),
    variable(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        Some("false"),
        Some("--response-headers"),
        "true: envoy",
    ),
    variable(
        "LIMIT_LIMIT_HEADER",
        Some("RateLimit-Limit"),
        Some("--limit-header"),
        "header name",
    ),
    variable(
        "LIMIT_REMAINING_HEADER",
        Some("RateLimit-Remaining"),
        Some("--remaining-header"),
        "header name",
    ),
    variable(
        "LIMIT_RESET_HEADER",
        Some("RateLimit-Reset"),
        Some("--reset-header"),
        "header name",
    ),
    variable(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        Some("false"),
        Some("--stop-increment-when-over-limit"),
        "true: refused hits are not counted",
    ),
    variable(
        "LOG_LEVEL",
        Some("WARN"),
        Some("--log-level"),
        "logrus' levels, any case",
    ),
    variable(
        "LOG_FORMAT",
        Some("text"),
        Some("--log-format"),
        "text or json",
    ),
];
