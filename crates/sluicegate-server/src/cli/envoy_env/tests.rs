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
    let out = with_envoy_env(argv, &|name| vars.get(name).cloned())?.argv;
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
        "--grpc-max-connection-age=1d",
        "--grpc-max-connection-age-grace=1h",
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
    // USE_STATSD's default beside it is not a wish for statsd (envoy would not start on
    // it); set, it is honoured beside Prometheus.
    assert!(!on.iter().any(|f| f.starts_with("--statsd")), "{on:?}");
    let both = [("USE_PROMETHEUS", "true"), ("USE_STATSD", "true")];
    let both = appended(&["--compat", "envoy"], &both).unwrap();
    assert!(
        both.iter().any(|f| f == "--statsd=localhost:8125"),
        "{both:?}"
    );
    assert!(
        both.iter().any(|f| f == "--metrics-listen=0.0.0.0:9090"),
        "{both:?}"
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
            ("REDIS_TLS_CLIENT_CERT", "/certs/redis-client.crt"),
            ("REDIS_TLS_CLIENT_KEY", "/certs/redis-client.key"),
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
        "--store-tls-cert=/certs/redis-client.crt",
        "--store-tls-key=/certs/redis-client.key",
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
    let flags = appended(
        &["--compat", "envoy", "--config-xds", "127.0.0.1:18000"],
        &[],
    )
    .unwrap();
    assert!(
        !flags.iter().any(|f| f.starts_with("--config=")),
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
        (vec![("PORT", "http")], "PORT=\"http\": not a whole number"),
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

/// Every row with a flag maps onto a flag of this build; a flag another part of the
/// service has yet to add refuses a variable that asks for it rather than ignoring it.
#[test]
fn every_variable_maps_or_is_refused() {
    let serve = super::super::Cli::command();
    let serve = serve.find_subcommand("serve").unwrap();
    for variable in VARIABLES {
        let Some(flag) = variable.flag() else {
            continue;
        };
        let known = serve
            .get_arguments()
            .any(|a| a.get_long() == flag.strip_prefix("--"));
        // USE_STATSD=false asks for no statsd: nothing of a missing --statsd.
        if known || variable.name == "USE_STATSD" {
            continue;
        }
        let asking = match variable.kind {
            Kind::Bool if variable.default == "false" => "true",
            Kind::Bool => "false",
            Kind::Duration => "17s",
            Kind::Map => "k:v",
            _ => "1",
        };
        // The variables of a flag envoy reads only beside another: that one set too.
        let mut vars = vec![(variable.name, asking)];
        match flag {
            f if f.starts_with("--config-xds") || f == "--start-without-config" => {
                vars.push(("CONFIG_TYPE", "GRPC_XDS_SOTW"));
            }
            f if f.starts_with("--statsd") => vars.push(("USE_STATSD", "true")),
            f if f.starts_with("--prometheus-") => vars.push(("USE_PROMETHEUS", "true")),
            _ => {}
        }
        if variable.name == "CONFIG_TYPE" {
            vars = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
        }
        let result = appended(&["--compat", "envoy"], &vars);
        let error = format!("{:#}", result.expect_err(variable.name));
        assert!(error.contains("not supported by this build yet"), "{error}");
    }
}

/// The table holds every variable envoyproxy/ratelimit@f2fb157 src/settings/settings.go
/// reads (its `envconfig` tags, in the copy vendored as a fixture), with envoy's default
/// and Go type, and nothing else.
#[test]
fn the_table_is_envoys_list_of_variables() {
    let settings = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/envoy/settings/settings.go"
    ));
    let mut envoys = Vec::new();
    for line in settings.lines() {
        let Some((field, tags)) = line.split_once('`') else {
            continue;
        };
        let Some(name) = tag(tags, "envconfig") else {
            continue;
        };
        let go_type = field.split_whitespace().nth(1).expect("a field's type");
        let kind = match go_type {
            "string" => Kind::Text,
            "int" | "int64" => Kind::Int,
            "bool" => Kind::Bool,
            "time.Duration" => Kind::Duration,
            "float32" | "float64" => Kind::Float,
            "map[string]string" => Kind::Map,
            "[]string" => Kind::List,
            other => panic!("{name}: Go type {other} not known here"),
        };
        envoys.push((name, tag(tags, "default").unwrap_or(""), kind));
    }
    assert!(envoys.len() > 100, "{} variables read", envoys.len());
    let ours: Vec<_> = VARIABLES
        .iter()
        .map(|v| (v.name, v.default, v.kind))
        .collect();
    for variable in &envoys {
        assert!(
            ours.contains(variable),
            "envoy's {variable:?} is not in the table as such"
        );
    }
    for variable in &ours {
        assert!(
            envoys.contains(variable),
            "{variable:?} is not one of envoy's variables"
        );
    }
}

/// The value of the struct tag `key:"value"` in a Go field's tags.
fn tag<'t>(tags: &'t str, key: &str) -> Option<&'t str> {
    let start = tags.find(&format!("{key}:\""))? + key.len() + 2;
    let length = tags[start..].find('"')?;
    Some(&tags[start..start + length])
}

/// docs/envoy.md's table is this one.
#[test]
fn the_docs_have_the_table() {
    let page = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/envoy.md"));
    for v in VARIABLES {
        let row = docs_row(v);
        assert!(page.contains(&row), "docs/envoy.md lacks the row\n{row}");
    }
}

/// docs/envoy.md's row of a variable.
fn docs_row(v: &EnvoyVariable) -> String {
    let here = match v.here {
        Here::Flag(flag) | Here::FlagWhenSet(flag) => format!("`{flag}`"),
        Here::Ignored => "ignored".to_owned(),
        Here::Refused => "refused".to_owned(),
    };
    let default = if v.default.is_empty() {
        "—".to_owned()
    } else {
        format!("`{}`", v.default)
    };
    format!("| `{}` | {default} | {here} | {} |", v.name, v.meaning)
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

/// The warnings of `serve --compat envoy` under `vars`.
fn warned(vars: &[(&str, &str)]) -> Vec<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let argv = ["sluicegate", "serve", "--compat", "envoy"]
        .iter()
        .map(OsString::from)
        .collect();
    with_envoy_env(argv, &|name| vars.get(name).cloned())
        .unwrap()
        .warnings
}

fn refusal(vars: &[(&str, &str)]) -> String {
    format!("{:#}", appended(&["--compat", "envoy"], vars).unwrap_err())
}

#[test]
fn values_asking_for_what_is_not_done_here_are_refused_naming_them() {
    for (vars, says) in [
        (
            vec![("REDIS_PERSECOND", "true")],
            "REDIS_PERSECOND=\"true\" is refused: a second Redis",
        ),
        (vec![("QUOTA_MODE", "1")], "QUOTA_MODE=\"1\""),
        (
            vec![("RESPONSE_DYNAMIC_METADATA", "true")],
            "RESPONSE_DYNAMIC_METADATA",
        ),
        (
            vec![("GRPC_UDS", "/tmp/rl.sock")],
            "GRPC_UDS=\"/tmp/rl.sock\"",
        ),
        (
            vec![("REDIS_POOL_ON_EMPTY_BEHAVIOR", "CREATE")],
            "REDIS_POOL_ON_EMPTY_BEHAVIOR=\"CREATE\"",
        ),
        (
            vec![("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true")],
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=\"true\" is refused: skipping",
        ),
        (
            vec![("USE_DOG_STATSD_MOGRIFIERS", "a")],
            "USE_DOG_STATSD_MOGRIFIERS",
        ),
        (
            vec![("CONFIG_TYPE", "K8S")],
            "CONFIG_TYPE=\"K8S\": expected FILE or GRPC_XDS_SOTW",
        ),
        (
            vec![
                ("TRACING_ENABLED", "true"),
                ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
            ],
            "TRACING_EXPORTER_PROTOCOL=\"zipkin\"",
        ),
    ] {
        let error = refusal(&vars);
        assert!(error.contains(says), "{vars:?}: {error}");
    }
    // Envoy's default, in any case envoy accepts, is no request.
    assert!(
        appended(
            &["--compat", "envoy"],
            &[("REDIS_POOL_ON_EMPTY_BEHAVIOR", "wait")]
        )
        .is_ok()
    );
}

#[test]
fn values_envoys_parser_refuses_are_refused_naming_them() {
    for (vars, says) in [
        (
            vec![("GRPC_MAX_CONNECTION_AGE", "1x")],
            "GRPC_MAX_CONNECTION_AGE=\"1x\": not a duration",
        ),
        (
            vec![("REDIS_PIPELINE_WINDOW", "150")],
            "REDIS_PIPELINE_WINDOW=\"150\": not a duration",
        ),
        (
            vec![("EXTRA_TAGS", "a:1,b")],
            "EXTRA_TAGS=\"a:1,b\": \"b\" is no key:value item",
        ),
        (
            vec![("REDIS_POOL_SIZE", "ten")],
            "REDIS_POOL_SIZE=\"ten\": not a whole number",
        ),
        (
            vec![("TRACING_SAMPLING_RATE", "half")],
            "TRACING_SAMPLING_RATE=\"half\": not a number",
        ),
        (
            vec![("MEMCACHE_TLS", "yes")],
            "MEMCACHE_TLS=\"yes\": not a boolean",
        ),
    ] {
        let error = refusal(&vars);
        assert!(error.contains(says), "{vars:?}: {error}");
    }
}

#[test]
fn go_durations_become_flags() {
    let flags = appended(&["--compat", "envoy"], &[("REDIS_TIMEOUT", "1m30s")]).unwrap();
    assert!(
        flags.iter().any(|f| f == "--store-timeout=90s"),
        "{flags:?}"
    );
}

#[test]
fn lookalikes_and_ignored_values_are_warned_about() {
    let warnings = warned(&[
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ("REDIS_POOL_SIZE", "20"),
        ("RUNTIME_WATCH_ROOT", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ]);
    let all = warnings.join("\n");
    assert!(
        all.contains("GRPC_SERVER_TLS_CA_CERT is not read")
            && all.contains("GRPC_CLIENT_TLS_CACERT"),
        "{all}"
    );
    assert!(
        all.contains("REDIS_POOL_SIZE=\"20\" changes nothing here"),
        "{all}"
    );
    assert!(
        !all.contains("RUNTIME_WATCH_ROOT"),
        "envoy's default is no news: {all}"
    );
    assert!(
        all.contains("GRPC_SERVER_TLS_CERT is not read without GRPC_SERVER_USE_TLS=true"),
        "{all}"
    );
    assert_eq!(warnings.len(), 3, "{all}");
}

#[test]
fn the_grpc_ports_tls_is_read_from_envoys_variables() {
    let dir = std::env::temp_dir().join(format!("sluicegate-envoy-env-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str| {
        let path = dir.join(name);
        std::fs::write(&path, "pem").unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (cert, key, ca) = (file("tls.crt"), file("tls.key"), file("ca.crt"));
    let tls = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
        ("GRPC_CLIENT_TLS_CACERT", ca.as_str()),
        ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
    ];
    let flags = appended(&["--compat", "envoy"], &tls).unwrap();
    for flag in [
        format!("--grpc-tls-cert={cert}"),
        format!("--grpc-tls-key={key}"),
        format!("--grpc-tls-client-ca={ca}"),
        "--grpc-tls-client-san=envoy.example".to_owned(),
    ] {
        assert!(flags.contains(&flag), "{flag} not in {flags:?}");
    }
    // Without GRPC_SERVER_USE_TLS, envoy reads none of them.
    let plain = appended(&["--compat", "envoy"], &tls[1..]).unwrap();
    assert!(
        !plain.iter().any(|f| f.starts_with("--grpc-tls")),
        "{plain:?}"
    );

    let error = refusal(&tls[..1]);
    assert!(
        error.contains("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT"),
        "{error}"
    );
    let missing = [tls[0], ("GRPC_SERVER_TLS_CERT", "/absent/tls.crt"), tls[2]];
    let error = refusal(&missing);
    assert!(
        error.contains("GRPC_SERVER_TLS_CERT=\"/absent/tls.crt\": cannot read it"),
        "{error}"
    );
    let san_alone = [tls[0], tls[1], tls[2], tls[4]];
    let error = refusal(&san_alone);
    assert!(
        error.contains("GRPC_CLIENT_TLS_SAN=\"envoy.example\" needs GRPC_CLIENT_TLS_CACERT"),
        "{error}"
    );
}

#[test]
fn tracing_is_read_from_envoys_variables_and_the_sdks() {
    let flags = appended(
        &["--compat", "envoy"],
        &[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("TRACING_SERVICE_NAMESPACE", "gateway"),
            ("TRACING_SAMPLING_RATE", "0.6"),
        ],
    )
    .unwrap();
    for flag in [
        "--otlp-endpoint=http://collector:4318",
        "--otlp-protocol=http",
        "--otlp-service-name=RateLimit",
        "--otlp-service-namespace=gateway",
        "--otlp-sampling-ratio=0.6",
    ] {
        assert!(flags.iter().any(|f| f == flag), "{flag} not in {flags:?}");
    }
    assert!(
        !flags
            .iter()
            .any(|f| f.starts_with("--otlp-service-instance-id")),
        "{flags:?}"
    );
    // Off, none of it is read.
    let off = appended(&["--compat", "envoy"], &[("TRACING_SERVICE_NAME", "rl")]).unwrap();
    assert!(!off.iter().any(|f| f.starts_with("--otlp")), "{off:?}");
    // Without an endpoint, envoy's exporter's own default (TLS to localhost).
    let grpc = appended(
        &["--compat", "envoy"],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ],
    )
    .unwrap();
    assert!(
        grpc.iter()
            .any(|f| f == "--otlp-endpoint=https://localhost:4317"),
        "{grpc:?}"
    );
}

#[test]
fn the_xds_clients_variables_are_read_only_with_config_type_grpc_xds_sotw() {
    // With files, envoy reads none of them, whatever this build has.
    let flags = appended(
        &["--compat", "envoy"],
        &[
            ("CONFIG_GRPC_XDS_NODE_ID", "gw"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
        ],
    )
    .unwrap();
    assert!(
        !flags.iter().any(|f| f.starts_with("--config-xds")),
        "{flags:?}"
    );
    assert!(
        flags.iter().any(|f| f.starts_with("--config=")),
        "{flags:?}"
    );
}

/// The environment Envoy Gateway gives its rate-limit container in one of its
/// Deployments (`tests/fixtures/envoy-gateway/deployments/`, envoyproxy/gateway@d32f282
/// internal/infrastructure/kubernetes/ratelimit/testdata/deployments/), each variable a
/// Secret or the Pod fills in standing for the value it would be, and the paths of the
/// mounted certificates moved under `root`.
fn envoy_gateway_environment(
    deployment: &std::path::Path,
    root: &std::path::Path,
) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deployment).unwrap();
    let deployment: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let container = containers
        .iter()
        .find(|c| c["name"] == "envoy-ratelimit")
        .expect("the rate-limit container");
    assert_eq!(container["command"], serde_json::json!(["/bin/ratelimit"]));
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|variable| {
            let name = variable["name"].as_str().unwrap().to_owned();
            let value = match (&variable["value"], &variable["valueFrom"]) {
                (serde_json::Value::String(value), _) => value.clone(),
                (_, from) if from["secretKeyRef"]["key"] == "REDIS_ENDPOINT" => {
                    "redis.example:6379".to_owned()
                }
                (_, from) if from["fieldRef"]["fieldPath"] == "metadata.name" => {
                    "envoy-ratelimit-5d8f7".to_owned()
                }
                other => panic!("{name}: {other:?}"),
            };
            let value = match value.strip_prefix('/') {
                Some(path) if path.starts_with("certs/") || path.starts_with("redis-certs/") => {
                    root.join(path).display().to_string()
                }
                _ => value,
            };
            (name, value)
        })
        .collect()
}

/// Every rate-limit Deployment of Envoy Gateway's tests starts `serve --compat envoy` with
/// the rules over xDS under mTLS, TLS on the gRPC port, and the store, metrics and traces
/// it names — or, where it asks for what envoy could not do either (a Sentinel URL without
/// a master name), is refused naming the variable.
#[test]
fn envoy_gateways_deployments_map_to_what_they_ask() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoy-gateway/deployments");
    let mut deployments: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "statsd_conf.yaml")
        .collect();
    deployments.sort();
    assert_eq!(deployments.len(), 19, "{}", dir.display());
    // The Secrets' files: the mapping reads that they are there; the start parses them.
    let root = std::env::temp_dir().join(format!("sluicegate-eg-mounts-{}", std::process::id()));
    for file in [
        "certs/tls.crt",
        "certs/tls.key",
        "certs/ca.crt",
        "redis-certs/tls.crt",
        "redis-certs/tls.key",
    ] {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
    }
    let mounted = |file: &str| root.join(file).display().to_string();
    for deployment in &deployments {
        let name = deployment.file_name().unwrap().to_string_lossy();
        let env = envoy_gateway_environment(deployment, &root);
        let vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let value = |key: &str| env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        if value("REDIS_TYPE") == Some("sentinel") {
            let refused = refusal(&vars);
            assert!(refused.contains("REDIS_URL"), "{name}: {refused}");
            continue;
        }
        let flags =
            appended(&["--compat", "envoy"], &vars).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let has = |flag: &str| flags.iter().any(|f| f == flag);
        for flag in [
            "--config-xds=envoy-gateway:18001".to_owned(),
            "--config-xds-node-id=envoy-ratelimit".to_owned(),
            "--config-xds-tls".to_owned(),
            format!("--config-xds-client-cert={}", mounted("certs/tls.crt")),
            format!("--config-xds-client-key={}", mounted("certs/tls.key")),
            format!("--config-xds-ca={}", mounted("certs/ca.crt")),
            "--start-without-config".to_owned(),
            format!("--grpc-tls-cert={}", mounted("certs/tls.crt")),
            format!("--grpc-tls-key={}", mounted("certs/tls.key")),
        ] {
            assert!(has(&flag), "{name}: {flag} not in {flags:?}");
        }
        assert!(
            !flags.iter().any(|f| f.starts_with("--config=")),
            "{name}: {flags:?}"
        );
        let store = flags
            .iter()
            .find_map(|f| f.strip_prefix("--store="))
            .unwrap_or_else(|| panic!("{name}: no store in {flags:?}"));
        let redis = value("REDIS_URL").unwrap();
        assert!(store.ends_with(redis), "{name}: {store}");
        if value("REDIS_TLS") == Some("true") {
            assert!(store.starts_with("rediss://"), "{name}: {store}");
            let client = [
                format!("--store-tls-cert={}", mounted("redis-certs/tls.crt")),
                format!("--store-tls-key={}", mounted("redis-certs/tls.key")),
            ];
            assert!(client.iter().all(|f| has(f)), "{name}: {flags:?}");
        }
        if let Some(mapper) = value("PROMETHEUS_MAPPER_YAML") {
            assert!(
                has(&format!("--prometheus-mapper={mapper}")),
                "{name}: {flags:?}"
            );
        }
        if value("USE_PROMETHEUS") == Some("true") {
            assert!(has("--metrics-listen=0.0.0.0:19001"), "{name}: {flags:?}");
        }
        if value("USE_STATSD") == Some("true") {
            assert!(has("--statsd=localhost:8125"), "{name}: {flags:?}");
        }
        if let Some(endpoint) = value("OTEL_EXPORTER_OTLP_ENDPOINT") {
            assert!(
                has(&format!("--otlp-endpoint={endpoint}")),
                "{name}: {flags:?}"
            );
        }
        // envoy reads GRPC_CLIENT_TLS_CACERT for mTLS, not the variable Envoy Gateway sets.
        assert!(!flags.iter().any(|f| f.starts_with("--grpc-tls-client-ca")));
        let warnings = warned(&vars);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("GRPC_SERVER_TLS_CA_CERT")
                    && w.contains("GRPC_CLIENT_TLS_CACERT")),
            "{name}: {warnings:?}"
        );
    }
}
