//! The probes as monitoring calls them: envoyproxy/ratelimit's `GET /healthcheck` with
//! curl, `grpc.health.v1.Health` with Python's grpcio, on every listener; and a path no
//! route has is 404, so a mistyped probe fails.

use crate::server;

use std::process::Command;
use std::time::{Duration, Instant};

use server::Server;
use sluicegate_test_support::RedisServer;

/// `curl -s -w '\n%{http_code}' http://ADDRESS/PATH`: the status and the body.
fn curl(address: &str, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "-w", "\n%{http_code}"])
        .arg(format!("http://{address}{path}"))
        .output()
        .expect("curl (scripts/test installs it)");
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), body.to_owned())
}

/// grpcio's health Check of `service` at `address`: the status's name, or the failed
/// call's code and message.
fn grpc_health(address: &str, service: &str) -> String {
    grpc_health_call(address, &[service])
}

/// health_check.py with `args` after the address.
fn grpc_health_call(address: &str, args: &[&str]) -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/python/health_check.py"
    );
    let out = Command::new("python3")
        .args([script, address])
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python health check failed (scripts/test installs grpcio-health-checking): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Polls `probe` every 50 ms for up to 10 s (the store is asked on the probes' own
/// time) until it gives `want`.
fn eventually<T: PartialEq + std::fmt::Debug>(want: T, probe: impl Fn() -> T) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = probe();
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "still {got:?}, never {want:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn healthcheck_answers_ok_and_unknown_paths_404_on_every_listener() {
    let server = Server::start(&[
        "--grpc-listen",
        "127.0.0.1:0",
        "--debug-listen",
        "127.0.0.1:0",
    ]);
    let debug = server.debug_address.clone().unwrap();
    let grpc = server.grpc_address.clone().unwrap();
    for address in [&server.address, &debug] {
        assert_eq!(curl(address, "/healthcheck"), (200, "OK".to_owned()));
        for path in ["/healthcheck/", "/healtcheck", "/", "/v1/checks"] {
            let (status, body) = curl(address, path);
            assert_eq!(status, 404, "{address}{path}: {body}");
            assert!(body.contains("no such path"), "{address}{path}: {body}");
        }
    }
    // The gRPC-only port is no HTTP API either.
    assert_eq!(curl(&grpc, "/healthcheck").0, 404);
    // The debug port decides nothing.
    assert_eq!(curl(&debug, "/v1/check").0, 404);
    assert!(
        curl(&debug, "/metrics")
            .1
            .contains("sluicegate_config_loads_total")
    );
}

#[test]
fn grpc_health_serves_ratelimit_and_the_server_on_both_grpc_ports() {
    let server = Server::start(&["--grpc-listen", "127.0.0.1:0"]);
    let grpc = server.grpc_address.clone().unwrap();
    for address in [&server.address, &grpc] {
        assert_eq!(grpc_health(address, "ratelimit"), "SERVING");
        assert_eq!(grpc_health(address, ""), "SERVING");
        assert!(
            grpc_health(address, "nosuch").starts_with("NOT_FOUND"),
            "{address}"
        );
        // A Watch opens with the status as it is.
        assert_eq!(
            grpc_health_call(address, &["ratelimit", "--watch"]),
            "SERVING"
        );
    }
}

/// envoyproxy/ratelimit's health fails while Redis is down (src/server/health.go); so do
/// both probes here, and both recover with it.
#[test]
fn probes_fail_while_redis_is_down_and_recover() {
    let redis = RedisServer::start(&[]);
    let server = Server::start(&["--store", &redis.url(), "--store-timeout", "200ms"]);
    assert_eq!(
        curl(&server.address, "/healthcheck"),
        (200, "OK".to_owned())
    );
    assert_eq!(grpc_health(&server.address, "ratelimit"), "SERVING");
    redis.shutdown();
    eventually(500, || curl(&server.address, "/healthcheck").0);
    eventually("NOT_SERVING".to_owned(), || {
        grpc_health(&server.address, "ratelimit")
    });
    assert_eq!(grpc_health(&server.address, ""), "NOT_SERVING");
    let _back = redis.restart(&[]);
    eventually(200, || curl(&server.address, "/healthcheck").0);
    eventually("SERVING".to_owned(), || grpc_health(&server.address, ""));
}
