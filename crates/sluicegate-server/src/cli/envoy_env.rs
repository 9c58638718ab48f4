//! envoyproxy/ratelimit's environment, read under `serve --compat envoy`: each of its
//! variables, or its default where it has one, becomes the `serve` flag it means, so a
//! deployment keeps its environment when it swaps the image. A flag given on the command
//! line or as its `SLUICEGATE_…` twin wins over envoy's variables; variables envoy has and
//! this table does not are ignored, as envoy ignores unknown ones.

use std::ffi::OsString;

use anyhow::{Context as _, bail};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory as _};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use self::variables::{EnvoyVariable, VARIABLES};
use crate::compat::Compat;

mod variables;

/// The environment as envoy reads it: a variable set (even empty) is its value; unset, its
/// default.
struct Environment<'e> {
    lookup: &'e dyn Fn(&str) -> Option<String>,
}

impl Environment<'_> {
    fn get(&self, name: &str) -> String {
        (self.lookup)(name)
            .or_else(|| {
                VARIABLES
                    .iter()
                    .find(|v| v.name == name)
                    .and_then(|v| v.default)
                    .map(str::to_owned)
            })
            .unwrap_or_default()
    }

    /// A variable set explicitly, not merely defaulted.
    fn set(&self, name: &str) -> Option<String> {
        (self.lookup)(name)
    }

    /// A boolean as Go's strconv.ParseBool reads it.
    fn flag(&self, name: &str) -> anyhow::Result<bool> {
        match self.get(name).as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
            other => bail!("{name}={other:?}: not a boolean (true or false)"),
        }
    }

    /// `HOST:PORT` from two variables; an IPv6 host in brackets.
    fn address(&self, host: &str, port: &str) -> anyhow::Result<String> {
        let port_text = self.get(port);
        let number: u16 = port_text
            .parse()
            .with_context(|| format!("{port}={port_text:?}: not a port"))?;
        let host = self.get(host);
        Ok(if host.contains(':') {
            format!("[{host}]:{number}")
        } else {
            format!("{host}:{number}")
        })
    }
}

/// What `flag` is set to from envoy's variables: `None` for nothing, `Some(None)` for a
/// flag without a value, `Some(Some(value))` otherwise.
fn flag_from(flag: &str, env: &Environment<'_>) -> anyhow::Result<Option<Option<String>>> {
    let value = |v: String| Ok(Some(Some(v)));
    let switch = |on: bool| Ok(on.then_some(None));
    match flag {
        "--listen" => value(env.address("HOST", "PORT")?),
        "--grpc-listen" => value(env.address("GRPC_HOST", "GRPC_PORT")?),
        "--debug-listen" => value(env.address("DEBUG_HOST", "DEBUG_PORT")?),
        "--config" => {
            let mut path = std::path::PathBuf::from(env.get("RUNTIME_ROOT"));
            path.push(env.get("RUNTIME_SUBDIRECTORY"));
            path.push(env.get("RUNTIME_APPDIRECTORY"));
            value(path.display().to_string())
        }
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
        // A flag with a value (sluicegate's default is true), so envoy's false is given too.
        "--config-ignore-dotfiles" => value(env.flag("RUNTIME_IGNOREDOTFILES")?.to_string()),
        "--response-headers" => Ok(env
            .flag("LIMIT_RESPONSE_HEADERS_ENABLED")?
            .then(|| Some("envoy".to_owned()))),
        "--no-negative-cache" => {
            let bytes = env.get("LOCAL_CACHE_SIZE_IN_BYTES");
            let bytes: u64 = bytes
                .parse()
                .with_context(|| format!("LOCAL_CACHE_SIZE_IN_BYTES={bytes:?}: not a size"))?;
            switch(bytes == 0)
        }
        _ => {
            let variable = VARIABLES
                .iter()
                .find(|v| v.flag == Some(flag))
                .expect("every flag of the table has a variable");
            match variable.default {
                Some("false") => switch(env.flag(variable.name)?),
                Some(_) => value(env.get(variable.name)),
                None => Ok(env.set(variable.name).map(Some)),
            }
        }
    }
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
) -> anyhow::Result<Vec<OsString>> {
    let command = super::Cli::command();
    let Ok(matches) = command.clone().try_get_matches_from(&argv) else {
        return Ok(argv);
    };
    let Some(("serve", serve)) = matches.subcommand() else {
        return Ok(argv);
    };
    if serve.get_one::<Compat>("compat") != Some(&Compat::Envoy) {
        return Ok(argv);
    }
    let serve_command = command
        .find_subcommand("serve")
        .expect("serve is a command");
    let env = Environment { lookup };
    let mut argv = argv;
    let mut done: Vec<&str> = Vec::new();
    for flag in VARIABLES.iter().filter_map(|v| v.flag) {
        if done.contains(&flag) {
            continue;
        }
        done.push(flag);
        let names: Vec<&str> = VARIABLES
            .iter()
            .filter(|v| v.flag == Some(flag))
            .map(|v| v.name)
            .collect();
        let Some(arg) = serve_command
            .get_arguments()
            .find(|a| a.get_long() == flag.strip_prefix("--"))
        else {
            // A flag this build does not have: fine while envoy's variables ask nothing
            // of it.
            if let Some(variable) = asked_of_unknown(flag, &env)? {
                bail!(
                    "{}: not supported by this build yet (it has no {flag}, for \"{}\")",
                    names.join(", "),
                    variable.meaning
                );
            }
            continue;
        };
        // Given, or ruled out by a flag given (envoy's header names beside the
        // deprecated --legacy-headers).
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
    Ok(argv)
}

/// The variable of a flag this build lacks, when it asks for something other than envoy's
/// default.
fn asked_of_unknown(
    flag: &str,
    env: &Environment<'_>,
) -> anyhow::Result<Option<&'static EnvoyVariable>> {
    let variable = VARIABLES
        .iter()
        .find(|v| v.flag == Some(flag))
        .expect("every flag of the table has a variable");
    let asked = match variable.default {
        Some("false") => env.flag(variable.name)?,
        Some(default) => env.get(variable.name) != default,
        None => env.set(variable.name).is_some(),
    };
    Ok(asked.then_some(variable))
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
