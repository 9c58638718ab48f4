//! envoyproxy/ratelimit's environment, read under `serve --compat envoy`: every variable
//! envoy reads is in the table of [`variables`], and is either made into the `serve` flag
//! it means (its default too, where envoy has one), accepted as changing nothing here (the
//! table says why), or refused at start when its value asks for what is not done here. A
//! value envoy's own parser would refuse (a port that is no number, `1x` for a duration)
//! is refused naming the variable. A flag given on the command line or as its
//! `SLUICEGATE_…` twin wins over envoy's variables.

use std::ffi::OsString;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory as _};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use sluicegate::internals::format_duration;

use self::go::{parse_bool, parse_duration, parse_float, parse_int, parse_map};
use self::variables::{EnvoyVariable, Here, Kind, LOOKALIKES, VARIABLES};
use crate::compat::Compat;

mod go;
mod variables;

/// The command line with envoy's environment made into flags, and what to warn about.
pub(crate) struct EnvoyArgs {
    /// The command line, flags appended.
    pub(crate) argv: Vec<OsString>,
    /// Variables set that change nothing, each with why.
    pub(crate) warnings: Vec<String>,
}

/// The environment as envoy reads it: a variable set (even empty) is its value; unset, its
/// default.
struct Environment<'e> {
    lookup: &'e dyn Fn(&str) -> Option<String>,
}

impl Environment<'_> {
    fn get(&self, name: &str) -> String {
        (self.lookup)(name)
            .or_else(|| row(name).map(|v| v.default.to_owned()))
            .unwrap_or_default()
    }

    /// A variable set explicitly, not merely defaulted.
    fn set(&self, name: &str) -> Option<String> {
        (self.lookup)(name)
    }

    /// A boolean, as Go's strconv.ParseBool reads it.
    fn flag(&self, name: &str) -> anyhow::Result<bool> {
        let text = self.get(name);
        parse_bool(&text).with_context(|| format!("{name}={text:?}: not a boolean (true or false)"))
    }

    /// A whole number, as Go's strconv.ParseInt reads it.
    fn int(&self, name: &str) -> anyhow::Result<i64> {
        let text = self.get(name);
        parse_int(&text).with_context(|| format!("{name}={text:?}: not a whole number"))
    }

    /// A duration, as Go's time.ParseDuration reads it.
    fn duration(&self, name: &str) -> anyhow::Result<Duration> {
        let text = self.get(name);
        parse_duration(&text).with_context(|| {
            format!("{name}={text:?}: not a duration (Go's form: 500ms, 10s, 1m30s, 24h)")
        })
    }

    /// `HOST:PORT` from two variables; an IPv6 host in brackets.
    fn address(&self, host: &str, port: &str) -> anyhow::Result<String> {
        let port_text = self.get(port);
        let number = parse_int(&port_text)
            .and_then(|n| u16::try_from(n).ok())
            .with_context(|| format!("{port}={port_text:?}: not a port"))?;
        let host = self.get(host);
        Ok(if host.contains(':') {
            format!("[{host}]:{number}")
        } else {
            format!("{host}:{number}")
        })
    }

    /// A path from a variable, refused now, naming the variable, when it cannot be read.
    fn readable_file(&self, name: &str) -> anyhow::Result<String> {
        let path = self.get(name);
        std::fs::File::open(&path).with_context(|| format!("{name}={path:?}: cannot read it"))?;
        Ok(path)
    }

    /// The configuration comes over xDS (CONFIG_TYPE=GRPC_XDS_SOTW), not from files.
    fn xds(&self) -> bool {
        self.get("CONFIG_TYPE") == "GRPC_XDS_SOTW"
    }

    /// The sink envoy's statistics go to is statsd (plain or DogStatsD), as envoy picks it:
    /// DISABLE_STATS, then USE_DOG_STATSD, then USE_STATSD. Beside USE_PROMETHEUS envoy
    /// refuses to start unless USE_STATSD is false, and USE_STATSD is true by default:
    /// here Prometheus is served either way, and statsd is sent too when USE_STATSD=true
    /// is set rather than defaulted, so that nothing set is left undone.
    fn statsd(&self) -> anyhow::Result<bool> {
        let asked = self.flag("USE_STATSD")?
            && (!self.flag("USE_PROMETHEUS")? || self.set("USE_STATSD").is_some());
        Ok(!self.flag("DISABLE_STATS")? && (self.flag("USE_DOG_STATSD")? || asked))
    }
}

/// The row of the table named `name`.
fn row(name: &str) -> Option<&'static EnvoyVariable> {
    VARIABLES.iter().find(|v| v.name == name)
}

/// Whether the variable is at envoy's default, as its kind compares (`24h` is `1440m`).
fn is_default(variable: &EnvoyVariable, env: &Environment<'_>) -> bool {
    let value = env.get(variable.name);
    let default = variable.default;
    match variable.kind {
        Kind::Bool => parse_bool(&value) == parse_bool(default),
        Kind::Int => parse_int(&value) == Some(parse_int(default).unwrap_or(0)),
        Kind::Duration => parse_duration(&value) == parse_duration(default),
        Kind::Float => parse_float(&value) == parse_float(default),
        Kind::Text | Kind::Map | Kind::List => value.eq_ignore_ascii_case(default),
    }
}

/// Every variable set parses as envoy would parse it, and none asks for what is refused.
fn check_values(env: &Environment<'_>) -> anyhow::Result<()> {
    for variable in VARIABLES {
        let Some(text) = env.set(variable.name) else {
            continue;
        };
        let name = variable.name;
        match variable.kind {
            Kind::Text | Kind::List => {}
            Kind::Bool => drop(env.flag(name)?),
            Kind::Int => drop(env.int(name)?),
            Kind::Duration => drop(env.duration(name)?),
            Kind::Float => {
                parse_float(&text).with_context(|| format!("{name}={text:?}: not a number"))?;
            }
            Kind::Map => {
                if let Err(item) = parse_map(&text) {
                    bail!("{name}={text:?}: {item:?} is no key:value item (k1:v1,k2:v2)");
                }
            }
        }
        if variable.here == Here::Refused && !is_default(variable, env) {
            bail!(
                "{name}={text:?} is refused: {} (only envoy's default, {:?}, is accepted)",
                variable.meaning,
                variable.default
            );
        }
    }
    Ok(())
}

/// What to warn about: variables set that change nothing here, and variables envoy does
/// not read that a deployment set believing it does.
fn warnings(env: &Environment<'_>) -> anyhow::Result<Vec<String>> {
    let mut warnings = Vec::new();
    for variable in VARIABLES {
        if variable.here == Here::Ignored
            && env.set(variable.name).is_some()
            && !is_default(variable, env)
        {
            warnings.push(format!(
                "{}={:?} changes nothing here: {}",
                variable.name,
                env.get(variable.name),
                variable.meaning
            ));
        }
    }
    for (name, instead) in LOOKALIKES {
        if env.set(name).is_some() {
            warnings.push(format!(
                "{name} is not read, as envoyproxy/ratelimit does not read it: {instead} is the \
                 variable that does that job"
            ));
        }
    }
    if !env.flag("GRPC_SERVER_USE_TLS")? {
        for name in [
            "GRPC_SERVER_TLS_CERT",
            "GRPC_SERVER_TLS_KEY",
            "GRPC_CLIENT_TLS_CACERT",
        ] {
            if !env.get(name).is_empty() {
                warnings.push(format!(
                    "{name} is not read without GRPC_SERVER_USE_TLS=true, as in envoy: the \
                     gRPC port is plaintext"
                ));
            }
        }
    }
    Ok(warnings)
}

/// Whether envoy reads the variables of `flag` at all, given the others: the xDS client's
/// only with CONFIG_TYPE=GRPC_XDS_SOTW, statsd's only with statsd as the sink, the
/// tracer's only with TRACING_ENABLED, the gRPC port's TLS only with GRPC_SERVER_USE_TLS.
fn read_by_envoy(flag: &str, env: &Environment<'_>) -> anyhow::Result<bool> {
    Ok(
        if flag.starts_with("--config-xds") || flag == "--start-without-config" {
            env.xds()
        } else if flag.starts_with("--statsd") {
            env.statsd()?
        } else if flag.starts_with("--prometheus-") {
            env.flag("USE_PROMETHEUS")? && !env.flag("DISABLE_STATS")?
        } else if flag.starts_with("--otlp-") {
            env.flag("TRACING_ENABLED")?
        } else if flag.starts_with("--grpc-tls-") {
            env.flag("GRPC_SERVER_USE_TLS")?
        } else {
            true
        },
    )
}

/// What `flag` is set to from envoy's variables: `None` for nothing, `Some(None)` for a
/// flag without a value, `Some(Some(value))` otherwise.
fn flag_from(flag: &str, env: &Environment<'_>) -> anyhow::Result<Option<Option<String>>> {
    let value = |v: String| Ok(Some(Some(v)));
    let switch = |on: bool| Ok(on.then_some(None));
    if !read_by_envoy(flag, env)? {
        return Ok(None);
    }
    match flag {
        "--listen" => value(env.address("HOST", "PORT")?),
        "--grpc-listen" => value(env.address("GRPC_HOST", "GRPC_PORT")?),
        "--debug-listen" => value(env.address("DEBUG_HOST", "DEBUG_PORT")?),
        "--config" => match env.get("CONFIG_TYPE").as_str() {
            "FILE" => {
                let mut path = std::path::PathBuf::from(env.get("RUNTIME_ROOT"));
                path.push(env.get("RUNTIME_SUBDIRECTORY"));
                path.push(env.get("RUNTIME_APPDIRECTORY"));
                value(path.display().to_string())
            }
            "GRPC_XDS_SOTW" => Ok(None),
            other => bail!("CONFIG_TYPE={other:?}: expected FILE or GRPC_XDS_SOTW"),
        },
        "--config-xds" => value(env.get("CONFIG_GRPC_XDS_SERVER_URL")),
        "--store" => value(store_url(env)?),
        "--metrics-listen" => {
            if !env.flag("USE_PROMETHEUS")? {
                return Ok(None);
            }
            let path = env.get("PROMETHEUS_PATH");
            if path != "/metrics" {
                bail!("PROMETHEUS_PATH={path:?}: metrics are served at /metrics only");
            }
            // Go's ":9090" is every interface.
            let address = env.get("PROMETHEUS_ADDR");
            match address.strip_prefix(':') {
                Some(port) => value(format!("0.0.0.0:{port}")),
                None => value(address),
            }
        }
        "--statsd" => value(env.address("STATSD_HOST", "STATSD_PORT")?),
        // A flag with a value (sluicegate's default is true), so envoy's false is given too.
        "--config-ignore-dotfiles" => value(env.flag("RUNTIME_IGNOREDOTFILES")?.to_string()),
        "--response-headers" => Ok(env
            .flag("LIMIT_RESPONSE_HEADERS_ENABLED")?
            .then(|| Some("envoy".to_owned()))),
        "--no-negative-cache" => {
            let bytes = env.int("LOCAL_CACHE_SIZE_IN_BYTES")?;
            switch(bytes == 0)
        }
        "--expiration-jitter-max" => {
            let seconds = env.int("EXPIRATION_JITTER_MAX_SECONDS")?;
            let seconds = u64::try_from(seconds).with_context(|| {
                format!("EXPIRATION_JITTER_MAX_SECONDS={seconds}: not a number of seconds")
            })?;
            value(format!("{seconds}s"))
        }
        "--grpc-tls-cert" | "--grpc-tls-key" => {
            for name in ["GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"] {
                if env.get(name).is_empty() {
                    bail!(
                        "GRPC_SERVER_USE_TLS=true needs {name}: the gRPC port's TLS has no certificate and key"
                    );
                }
            }
            let name = if flag == "--grpc-tls-cert" {
                "GRPC_SERVER_TLS_CERT"
            } else {
                "GRPC_SERVER_TLS_KEY"
            };
            value(env.readable_file(name)?)
        }
        "--grpc-tls-client-ca" => {
            if env.get("GRPC_CLIENT_TLS_CACERT").is_empty() {
                return Ok(None);
            }
            value(env.readable_file("GRPC_CLIENT_TLS_CACERT")?)
        }
        "--grpc-tls-client-san" => {
            let san = env.get("GRPC_CLIENT_TLS_SAN");
            if san.is_empty() {
                return Ok(None);
            }
            if env.get("GRPC_CLIENT_TLS_CACERT").is_empty() {
                bail!(
                    "GRPC_CLIENT_TLS_SAN={san:?} needs GRPC_CLIENT_TLS_CACERT: only a client \
                     certificate of that authority is checked for the name"
                );
            }
            value(san)
        }
        "--otlp-endpoint" => value(otlp_endpoint(env)?),
        "--otlp-protocol" => match env.get("TRACING_EXPORTER_PROTOCOL").as_str() {
            "http" | "" => value("http".to_owned()),
            "grpc" => value("grpc".to_owned()),
            other => bail!("TRACING_EXPORTER_PROTOCOL={other:?}: expected http or grpc"),
        },
        _ => {
            let variable = VARIABLES
                .iter()
                .find(|v| v.flag() == Some(flag))
                .expect("every flag of the table has a variable");
            if matches!(variable.here, Here::FlagWhenSet(_)) && env.set(variable.name).is_none() {
                return Ok(None);
            }
            let text = env.get(variable.name);
            match variable.kind {
                Kind::Bool if variable.default == "false" => switch(env.flag(variable.name)?),
                Kind::Bool => value(env.flag(variable.name)?.to_string()),
                Kind::Duration => {
                    let micros = env.duration(variable.name)?.as_micros();
                    value(format_duration(u64::try_from(micros).unwrap_or(u64::MAX)))
                }
                Kind::Int if text.is_empty() => Ok(None),
                Kind::Int => value(env.int(variable.name)?.to_string()),
                // An empty value, where envoy's default is empty too, asks for nothing.
                _ if text.is_empty() && matches!(variable.here, Here::Flag(_)) => Ok(None),
                _ => value(text),
            }
        }
    }
}

/// Where envoy's OTLP exporter sends spans: the OpenTelemetry SDK's own variables
/// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then OTEL_EXPORTER_OTLP_ENDPOINT), else the Go
/// SDK's default for the protocol (TLS to localhost).
fn otlp_endpoint(env: &Environment<'_>) -> anyhow::Result<String> {
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ] {
        if let Some(endpoint) = env.set(name).filter(|e| !e.is_empty()) {
            return Ok(endpoint);
        }
    }
    Ok(match env.get("TRACING_EXPORTER_PROTOCOL").as_str() {
        "grpc" => "https://localhost:4317".to_owned(),
        _ => "https://localhost:4318".to_owned(),
    })
}

/// The store REDIS_* describe, as a `--store` URL.
fn store_url(env: &Environment<'_>) -> anyhow::Result<String> {
    let backend = env.get("BACKEND_TYPE");
    if !backend.eq_ignore_ascii_case("redis") {
        bail!("BACKEND_TYPE={backend:?}: only redis is supported");
    }
    let tls = env.flag("REDIS_TLS")?;
    let url = env.get("REDIS_URL");
    // envoy: "password", or "user:password" (src/redis/driver_impl.go:130-141).
    let auth = env.get("REDIS_AUTH");
    let (user, password) = match auth.split_once(':') {
        Some((user, password)) => (user, password),
        None => ("", auth.as_str()),
    };
    let encode = |text: &str| utf8_percent_encode(text, NON_ALPHANUMERIC).to_string();
    let credentials = if auth.is_empty() {
        String::new()
    } else {
        format!("{}:{}@", encode(user), encode(password))
    };
    let socket = env.get("REDIS_SOCKET_TYPE");
    match env.get("REDIS_TYPE").to_ascii_lowercase().as_str() {
        "single" => match socket.to_ascii_lowercase().as_str() {
            "tcp" => {
                let scheme = if tls { "rediss" } else { "redis" };
                Ok(format!("{scheme}://{credentials}{url}"))
            }
            "unix" => {
                let mut query = Vec::new();
                if !user.is_empty() {
                    query.push(format!("user={}", encode(user)));
                }
                if !password.is_empty() {
                    query.push(format!("pass={}", encode(password)));
                }
                let query = if query.is_empty() {
                    String::new()
                } else {
                    format!("?{}", query.join("&"))
                };
                Ok(format!("redis+unix://{url}{query}"))
            }
            other => bail!("REDIS_SOCKET_TYPE={other:?}: expected tcp or unix"),
        },
        "cluster" => {
            let scheme = if tls {
                "rediss-cluster"
            } else {
                "redis-cluster"
            };
            Ok(format!("{scheme}://{credentials}{url}"))
        }
        // envoy: "master-name,host:port,host:port" (src/redis/driver_impl.go).
        "sentinel" => {
            let Some((master, sentinels)) = url.split_once(',') else {
                bail!("REDIS_URL={url:?}: REDIS_TYPE=sentinel needs master-name,host:port,…");
            };
            let scheme = if tls {
                "rediss+sentinel"
            } else {
                "redis+sentinel"
            };
            let sentinel_auth = env.set("REDIS_SENTINEL_AUTH").unwrap_or_default();
            let query = if sentinel_auth.is_empty() {
                String::new()
            } else {
                format!("?sentinel_password={}", encode(&sentinel_auth))
            };
            Ok(format!(
                "{scheme}://{credentials}{sentinels}/{}{query}",
                encode(master)
            ))
        }
        other => bail!("REDIS_TYPE={other:?}: expected single, cluster or sentinel"),
    }
}

/// `argv` with the `serve` flags envoy's environment (`lookup`) sets appended, when it
/// asks for `serve --compat envoy` and leaves them unset; unchanged otherwise (and when
/// it does not parse: the parse that follows says why).
pub(crate) fn with_envoy_env(
    argv: Vec<OsString>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<EnvoyArgs> {
    let unchanged = |argv| {
        Ok(EnvoyArgs {
            argv,
            warnings: Vec::new(),
        })
    };
    let command = super::Cli::command();
    let Ok(matches) = command.clone().try_get_matches_from(&argv) else {
        return unchanged(argv);
    };
    let Some(("serve", serve)) = matches.subcommand() else {
        return unchanged(argv);
    };
    if serve.get_one::<Compat>("compat") != Some(&Compat::Envoy) {
        return unchanged(argv);
    }
    let serve_command = command
        .find_subcommand("serve")
        .expect("serve is a command");
    let env = Environment { lookup };
    check_values(&env).context("--compat envoy")?;
    let warnings = warnings(&env)?;
    let mut argv = argv;
    let mut done: Vec<&str> = Vec::new();
    for flag in VARIABLES.iter().filter_map(EnvoyVariable::flag) {
        if done.contains(&flag) {
            continue;
        }
        done.push(flag);
        let Some(arg) = serve_command
            .get_arguments()
            .find(|a| a.get_long() == flag.strip_prefix("--"))
        else {
            // A flag this build does not have: fine while envoy's variables ask nothing
            // of it.
            if let Some(variable) = asked_of_unknown(flag, &env)? {
                bail!(
                    "{}={:?}: not supported by this build yet (it has no {flag}, for \"{}\")",
                    variable.name,
                    env.get(variable.name),
                    variable.meaning
                );
            }
            continue;
        };
        // Given, or ruled out by a flag given (envoy's file configuration beside
        // --config-xds).
        let ruled_out = serve_command
            .get_arguments()
            .filter(|other| given(serve, other.get_id().as_str()))
            .any(|other| {
                serve_command
                    .get_arg_conflicts_with(other)
                    .iter()
                    .any(|c| c.get_id() == arg.get_id())
            });
        if ruled_out || given(serve, arg.get_id().as_str()) {
            continue;
        }
        let set = flag_from(flag, &env).with_context(|| format!("--compat envoy: {flag}"))?;
        match set {
            None => {}
            Some(None) => argv.push(flag.into()),
            Some(Some(value)) => argv.push(format!("{flag}={value}").into()),
        }
    }
    Ok(EnvoyArgs { argv, warnings })
}

/// The variable of a flag this build lacks, when it asks for something other than envoy's
/// default (and envoy would read it at all).
fn asked_of_unknown(
    flag: &str,
    env: &Environment<'_>,
) -> anyhow::Result<Option<&'static EnvoyVariable>> {
    if !read_by_envoy(flag, env)? {
        return Ok(None);
    }
    Ok(VARIABLES
        .iter()
        .filter(|v| v.flag() == Some(flag))
        .find(|v| !is_default(v, env)))
}

/// The flag was given on the command line or as its `SLUICEGATE_…` variable.
fn given(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

#[cfg(test)]
mod tests;
