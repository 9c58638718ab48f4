use std::collections::HashMap;

use clap::Parser as _;

use super::*;

/// `sluicegate serve ARGS` under the environment `vars`: the flags appended.
fn appended(args: &[&str], vars: &[(&str, &str)]) -> anyhow::Result<Vec<String>> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let argv: Vec<OsString> = ["sluicegate", "serve"]
        .iter()
        .chain(args)
        .map(OsString::from)
        .collect();
    let given = argv.len();
    let out = with_envoy_env(argv, &|name| vars.get(name).cloned())?;
    // Whatever is appended parses.
    super::super::Cli::try_parse_from(&out).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(out[given..]
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect())
}

fn store(vars: &[(&str, &str)]) -> anyhow::Result<String> {
    let flags = appended(&["--compat", "envoy"], vars)?;
    Ok(flags
        .iter()
        .find_map(|f| f.strip_prefix("--store="))
        .expect("a store")
        .to_owned())
}

#[test]
fn without_compat_envoy_nothing_is_read() {
    assert_eq!(
        appended(&[], &[("PORT", "9")]).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn envoys_defaults_apply() {
    let flags = appended(&["--compat", "envoy"], &[]).unwrap();
    for flag in [
        "--listen=0.0.0.0:8080",
        "--grpc-listen=0.0.0.0:8081",
        "--debug-listen=0.0.0.0:6070",
        "--config=/srv/runtime_data/current/config",
        "--store=redis+unix:///var/run/nutcracker/ratelimit.sock",
        "--no-negative-cache",
        "--log-level=WARN",
        "--log-format=text",
        "--limit-header=RateLimit-Limit",
    ] {
        assert!(flags.iter().any(|f| f == flag), "{flag} not in {flags:?}");
    }
    assert!(!flags.iter().any(|f| f.starts_with("--response-headers")));
    assert!(!flags.iter().any(|f| f.starts_with("--shadow-mode")));
    assert!(!flags.iter().any(|f| f.starts_with("--metrics-listen")));
}

#[test]
fn use_prometheus_serves_metrics_on_its_address() {
    let on = appended(&["--compat", "envoy"], &[("USE_PROMETHEUS", "true")]).unwrap();
    assert!(
        on.iter().any(|f| f == "--metrics-listen=0.0.0.0:9090"),
        "{on:?}"
    );
    let path = [("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "/stats")];
    let error = format!("{:#}", appended(&["--compat", "envoy"], &path).unwrap_err());
    assert!(error.contains("PROMETHEUS_PATH=\"/stats\""), "{error}");
}

#[test]
fn envoys_variables_are_read() {
    let flags = appended(
        &["--compat", "envoy"],
        &[
            ("HOST", "127.0.0.1"),
            ("PORT", "18080"),
            ("GRPC_HOST", "::1"),
            ("DEBUG_PORT", "16070"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
            ("SHADOW_MODE", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "1"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
            ("LOG_LEVEL", "debug"),
            ("LOG_FORMAT", "json"),
            ("CACHE_KEY_PREFIX", "rl_"),
            ("REDIS_TIMEOUT", "2s"),
        ],
    )
    .unwrap();
    for flag in [
        "--listen=127.0.0.1:18080",
        "--grpc-listen=[::1]:8081",
        "--debug-listen=0.0.0.0:16070",
        "--config=/data/ratelimit/config",
        "--shadow-mode",
        "--response-headers=envoy",
        "--reset-header=X-Reset",
        "--log-level=debug",
        "--log-format=json",
        "--prefix=rl_",
        "--store-timeout=2s",
    ] {
        assert!(flags.iter().any(|f| f == flag), "{flag} not in {flags:?}");
    }
    assert!(
        !flags.iter().any(|f| f == "--no-negative-cache"),
        "{flags:?}"
    );
}

#[test]
fn explicit_flags_win() {
    let flags = appended(
        &[
            "--compat",
            "envoy",
            "--listen",
            "127.0.0.1:1",
            "--store=memory",
        ],
        &[("PORT", "18080"), ("REDIS_URL", "10.0.0.1:6379")],
    )
    .unwrap();
    assert!(
        !flags.iter().any(|f| f.starts_with("--listen")),
        "{flags:?}"
    );
    assert!(!flags.iter().any(|f| f.starts_with("--store")), "{flags:?}");
    assert!(flags.iter().any(|f| f == "--grpc-listen=0.0.0.0:8081"));
}

#[test]
fn a_flag_given_rules_out_the_variables_it_conflicts_with() {
    let flags = appended(&["--compat", "envoy", "--legacy-headers"], &[]).unwrap();
    assert!(
        !flags.iter().any(|f| f.starts_with("--limit-header")),
        "{flags:?}"
    );
}

#[test]
fn redis_variables_make_the_store_url() {
    let sentinel = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ("REDIS_AUTH", "pw"),
        ("REDIS_SENTINEL_AUTH", "sp"),
    ];
    assert_eq!(
        store(&sentinel).unwrap(),
        "redis+sentinel://:pw@s1:26379,s2:26379/mymaster?sentinel_password=sp"
    );
    let tcp = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.local:6379"),
    ];
    assert_eq!(store(&tcp).unwrap(), "redis://redis.local:6379");
    let secret = [
        tcp[0],
        tcp[1],
        ("REDIS_AUTH", "p@ss:word"),
        ("REDIS_TLS", "true"),
    ];
    // user:password as envoy splits it, each percent-encoded.
    assert_eq!(
        store(&secret).unwrap(),
        "rediss://p%40ss:word@redis.local:6379"
    );
    let password = [tcp[0], tcp[1], ("REDIS_AUTH", "s3cret")];
    assert_eq!(
        store(&password).unwrap(),
        "redis://:s3cret@redis.local:6379"
    );
    let cluster = [
        ("REDIS_TYPE", "cluster"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "a:7000,b:7001"),
    ];
    assert_eq!(store(&cluster).unwrap(), "redis-cluster://a:7000,b:7001");
    let unix = [("REDIS_URL", "/run/redis.sock"), ("REDIS_AUTH", "pw")];
    assert_eq!(
        store(&unix).unwrap(),
        "redis+unix:///run/redis.sock?pass=pw"
    );
}

#[test]
fn variables_envoy_would_refuse_are_refused_naming_them() {
    for (vars, says) in [
        (vec![("PORT", "http")], "PORT=\"http\": not a port"),
        (
            vec![("SHADOW_MODE", "yes")],
            "SHADOW_MODE=\"yes\": not a boolean",
        ),
        (
            vec![("REDIS_TYPE", "sentinel"), ("REDIS_URL", "a:26379")],
            "REDIS_TYPE=sentinel needs master-name,host:port",
        ),
        (vec![("REDIS_TYPE", "ring")], "REDIS_TYPE=\"ring\""),
        (
            vec![("REDIS_SOCKET_TYPE", "udp")],
            "REDIS_SOCKET_TYPE=\"udp\"",
        ),
        (
            vec![("BACKEND_TYPE", "memcache")],
            "BACKEND_TYPE=\"memcache\"",
        ),
        (vec![("LOG_LEVEL", "loud")], "no log level"),
    ] {
        let error = format!("{:#}", appended(&["--compat", "envoy"], &vars).unwrap_err());
        assert!(error.contains(says), "{vars:?}: {error}");
    }
}

/// Every row maps onto a flag of this build; a flag another part of the service has yet
/// to add refuses a variable that asks for it rather than ignoring it.
#[test]
fn every_variable_maps_or_is_refused() {
    let serve = super::super::Cli::command();
    let serve = serve.find_subcommand("serve").unwrap();
    for variable in VARIABLES {
        let Some(flag) = variable.flag else { continue };
        let known = serve
            .get_arguments()
            .any(|a| a.get_long() == flag.strip_prefix("--"));
        let asking = match variable.default {
            Some("false") => "true",
            _ => "1",
        };
        let result = appended(&["--compat", "envoy"], &[(variable.name, asking)]);
        if !known {
            let error = format!("{:#}", result.unwrap_err());
            assert!(error.contains("not supported by this build yet"), "{error}");
        }
    }
}

/// README.md's table is this one.
#[test]
fn the_readme_has_the_table() {
    let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"));
    for v in VARIABLES {
        let row = format!(
            "| `{}` | {} | {} | {} |",
            v.name,
            v.default.map_or("—".to_owned(), |d| format!("`{d}`")),
            v.flag.map_or("—".to_owned(), |f| format!("`{f}`")),
            v.meaning
        );
        assert!(readme.contains(&row), "README.md lacks the row\n{row}");
    }
}

#[test]
fn envoys_config_directory_flags_are_set_as_envoy_reads_them() {
    // Unset, envoy reads dot files and keeps domains apart; sluicegate's own default skips
    // dot files, so envoy's false is given explicitly.
    let flags = appended(&["--compat", "envoy"], &[]).unwrap();
    assert!(
        flags.iter().any(|f| f == "--config-ignore-dotfiles=false"),
        "{flags:?}"
    );
    assert!(
        !flags.iter().any(|f| f == "--merge-domain-config"),
        "{flags:?}"
    );
    assert!(
        !flags
            .iter()
            .any(|f| f == "--stop-increment-when-over-limit"),
        "{flags:?}"
    );
    let flags = appended(
        &["--compat", "envoy"],
        &[
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("MERGE_DOMAIN_CONFIG", "true"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ],
    )
    .unwrap();
    for flag in [
        "--config-ignore-dotfiles=true",
        "--merge-domain-config",
        "--stop-increment-when-over-limit",
    ] {
        assert!(flags.iter().any(|f| f == flag), "{flag} not in {flags:?}");
    }
}
