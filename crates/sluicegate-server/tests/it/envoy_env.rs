//! `sluicegate serve` under envoyproxy/ratelimit's environment alone: the real binary,
//! started with none of sluicegate's flags or variables — only `SLUICEGATE_COMPAT=envoy`
//! and envoy's own — listens where envoy would, reads the configuration where envoy
//! would, keeps its state in the Redis envoy's variables name, and answers as envoy's
//! variables ask (Python's grpcio on the gRPC port, curl on the HTTP and debug ports).
//!
//! Its rules that count to a refusal are per day: envoy's fixed window would split a test
//! run crossing a minute's edge, and a day's edge falls inside a test but once a day.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluicegate_test_support::certificates::Authority;
use sluicegate_test_support::{RedisServer, cmd, free_port};

use crate::python;

use python::run_python;

/// `curl -s http://ADDRESS/PATH`: the status and the body; status 0 when nothing answers.
fn curl(address: &str, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "-w", "\n%{http_code}"])
        .arg(format!("http://{address}{path}"))
        .output()
        .expect("curl (scripts/test installs it)");
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.parse().unwrap_or(0), body.to_owned())
}

/// One ShouldRateLimit from Python's grpcio: the overall code, then the headers to add.
fn rls(address: &str, domain: &str, key: &str, value: &str) -> String {
    run_python("rls_check.py", &[address, domain, key, value])
}

/// The binary, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary, `sluicegate serve` with nothing but `vars` in its environment, and its
/// standard error line by line.
fn start(vars: &[(&str, &str)]) -> (Running, std::sync::mpsc::Receiver<String>) {
    let mut serve = Command::new(env!("CARGO_BIN_EXE_sluicegate"));
    serve.arg("serve");
    spawn(serve, vars)
}

/// `command` with nothing but `vars` in its environment, and its standard error line by
/// line.
fn spawn(
    mut command: Command,
    vars: &[(&str, &str)],
) -> (Running, std::sync::mpsc::Receiver<String>) {
    let mut child = command
        .env_clear()
        .envs(vars.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = BufReader::new(child.stderr.take().unwrap());
    let running = Running(child);
    let (lines, read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in log.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    (running, read)
}

/// Waits until envoy's HTTP port answers /healthcheck 200, over plain HTTP.
fn wait_for_healthcheck(http: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while curl(http, "/healthcheck").0 != 200 {
        assert!(Instant::now() < deadline, "never answered on envoy's PORT");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_binary_runs_on_envoys_environment_alone() {
    let redis = RedisServer::start(&[]);
    let root = std::env::temp_dir().join(format!("sluicegate-envoy-env-{}", std::process::id()));
    let config_dir = root.join("ratelimit").join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(
        config_dir.join("rl.yaml"),
        "domain: envoy-env\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
    )
    .unwrap();
    let (http, grpc, debug, prometheus) = (free_port(), free_port(), free_port(), free_port());
    let (running, read) = start(&[
        ("SLUICEGATE_COMPAT", "envoy"),
        ("HOST", "127.0.0.1"),
        ("PORT", &http.to_string()),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", &grpc.to_string()),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", &debug.to_string()),
        ("RUNTIME_ROOT", root.to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &format!("127.0.0.1:{}", redis.port)),
        ("REDIS_POOL_SIZE", "4"),
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", &format!("127.0.0.1:{prometheus}")),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LOG_LEVEL", "info"),
        ("LOG_FORMAT", "json"),
    ]);
    let http = format!("127.0.0.1:{http}");
    wait_for_healthcheck(&http);
    assert_eq!(curl(&http, "/healthcheck").1, "OK");
    let debug = format!("127.0.0.1:{debug}");
    assert_eq!(curl(&debug, "/healthcheck"), (200, "OK".to_owned()));
    assert!(
        curl(&debug, "/metrics")
            .1
            .contains("sluicegate_config_loads_total 1")
    );
    // The configuration of RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, on GRPC_PORT.
    let grpc = format!("127.0.0.1:{grpc}");
    let answers: Vec<String> = (0..3)
        .map(|_| rls(&grpc, "envoy-env", "user", "u"))
        .collect();
    assert!(answers[0].starts_with("1\n"), "{answers:?}");
    assert!(answers[2].starts_with("2\n"), "{answers:?}");
    assert!(answers[0].contains("RateLimit-Limit: 2\n"), "{answers:?}");
    assert!(
        answers[0].contains("RateLimit-Remaining: 1\n"),
        "{answers:?}"
    );
    // envoy's counters where USE_PROMETHEUS puts them.
    let (status, scraped) = curl(&format!("127.0.0.1:{prometheus}"), "/metrics");
    assert_eq!(status, 200);
    assert!(
        scraped.contains(
            "ratelimit_service_rate_limit_total_hits{domain=\"envoy-env\",key1=\"user\"} 3"
        ),
        "{scraped}"
    );
    // Its state is in the Redis of REDIS_URL.
    let keys: u64 = redis.query(&cmd("DBSIZE")).unwrap();
    assert!(keys > 0, "nothing in Redis");
    // LOG_FORMAT=json at LOG_LEVEL=info: the start is one JSON object.
    let started = read
        .iter()
        .map(|line| serde_json::from_str::<serde_json::Value>(&line).expect("a JSON line"))
        .find(|event| event["fields"]["message"] == "sluicegate listening")
        .expect("the start is logged");
    assert_eq!(started["level"], "INFO", "{started}");
    drop(running);
}

/// One ShouldRateLimit from Python's grpcio to `address`, over TLS trusting the authority
/// `ca` when given, in plaintext otherwise.
fn rls_tls(address: &str, ca: Option<&Path>) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/python/rls_check.py");
    let mut python = Command::new("python3");
    python.args([script, address, "envoy-tls", "user", "u"]);
    if let Some(ca) = ca {
        python.env("RLS_CHECK_CA", ca);
    }
    let out = python.output().expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Envoy Gateway's TLS environment (envoyproxy/gateway@d32f282
/// internal/infrastructure/kubernetes/ratelimit/resource.go:51-61): GRPC_SERVER_USE_TLS
/// with the certificate and key puts TLS on GRPC_PORT; PORT stays plain HTTP for the
/// probes and answers no gRPC; GRPC_SERVER_TLS_CA_CERT, which envoy does not read, is
/// warned about.
#[test]
fn envoy_gateways_tls_environment_puts_tls_on_the_grpc_port() {
    let root = std::env::temp_dir().join(format!("sluicegate-envoy-tls-{}", std::process::id()));
    let config_dir = root.join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(
        config_dir.join("rl.yaml"),
        "domain: envoy-tls\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .unwrap();
    let authority = Authority::new(&root.join("certs"), "ca");
    let pair = authority.issue("ratelimit");
    let (http, grpc, debug) = (free_port(), free_port(), free_port());
    let text = |path: &Path| path.to_str().unwrap().to_owned();
    let (cert, key, ca) = (text(&pair.cert), text(&pair.key), text(&authority.cert()));
    let (_running, read) = start(&[
        ("SLUICEGATE_COMPAT", "envoy"),
        ("SLUICEGATE_STORE", "memory"),
        ("HOST", "127.0.0.1"),
        ("PORT", &http.to_string()),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", &grpc.to_string()),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", &debug.to_string()),
        ("RUNTIME_ROOT", root.to_str().unwrap()),
        ("USE_STATSD", "false"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert),
        ("GRPC_SERVER_TLS_KEY", &key),
        ("GRPC_SERVER_TLS_CA_CERT", &ca),
    ]);
    let http = format!("127.0.0.1:{http}");
    wait_for_healthcheck(&http);
    let grpc = format!("127.0.0.1:{grpc}");
    let answer = rls_tls(&grpc, Some(&authority.cert()));
    assert!(answer.starts_with("1\n"), "{answer}");
    let plaintext = rls_tls(&grpc, None);
    assert!(plaintext.starts_with("UNAVAILABLE\n"), "{plaintext}");
    let refused = rls_tls(&http, None);
    assert!(refused.starts_with("PERMISSION_DENIED\n"), "{refused}");
    // Logged before the start; the bound is for a loaded machine, not a pace.
    let warned = loop {
        match read.recv_timeout(Duration::from_secs(10)) {
            Ok(line) if line.contains("GRPC_SERVER_TLS_CA_CERT is not read") => break line,
            Ok(_) => {}
            Err(e) => panic!("GRPC_SERVER_TLS_CA_CERT is not warned about: {e}"),
        }
    };
    assert!(warned.contains("GRPC_CLIENT_TLS_CACERT"), "{warned}");
}

/// A variable asking for what sluicegate does not do stops the binary's start, naming it:
/// not a service that runs without what was asked.
#[test]
fn a_refused_variable_stops_the_start_naming_it() {
    for (name, value) in [("REDIS_PERSECOND", "true"), ("GRPC_SERVER_USE_TLS", "true")] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .arg("serve")
            .env_clear()
            .envs([("SLUICEGATE_COMPAT", "envoy"), (name, value)])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{name}={value} started");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains(name), "{name}: {said}");
    }
}

/// Envoy Gateway's rate-limit Deployment runs the command `/bin/ratelimit` with no
/// arguments (envoyproxy/gateway@d32f282
/// internal/infrastructure/kubernetes/ratelimit/testdata/deployments/default.yaml:38-39)
/// and lets its users swap only the image: the binary under that name is
/// `serve --compat envoy`, its settings all from envoy's environment.
#[test]
fn invoked_as_ratelimit_it_serves_envoys_environment() {
    let redis = RedisServer::start(&[]);
    let root = std::env::temp_dir().join(format!("sluicegate-as-ratelimit-{}", std::process::id()));
    let config_dir = root.join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(
        config_dir.join("rl.yaml"),
        "domain: as-ratelimit\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
    )
    .unwrap();
    let binary = root.join("ratelimit");
    let _ = std::fs::remove_file(&binary);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluicegate"), &binary).unwrap();
    let (http, grpc, debug) = (free_port(), free_port(), free_port());
    let (_running, _log) = spawn(
        Command::new(&binary),
        &[
            ("HOST", "127.0.0.1"),
            ("PORT", &http.to_string()),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", &grpc.to_string()),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", &debug.to_string()),
            ("RUNTIME_ROOT", root.to_str().unwrap()),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &format!("127.0.0.1:{}", redis.port)),
            ("USE_STATSD", "false"),
        ],
    );
    wait_for_healthcheck(&format!("127.0.0.1:{http}"));
    // RUNTIME_ROOT/config's rule, envoy's fixed window, on GRPC_PORT.
    let grpc = format!("127.0.0.1:{grpc}");
    assert!(rls(&grpc, "as-ratelimit", "user", "u").starts_with("1\n"));
    assert!(rls(&grpc, "as-ratelimit", "user", "u").starts_with("2\n"));
}
