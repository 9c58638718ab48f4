//! Runs of `sluicegate bench` and `sluicegate load` that meet failures: they end on time,
//! count the failed checks by kind apart from the decisions, and exit non-zero.

use crate::server;

use std::io::Read as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use server::Server;
use sluicegate_test_support::RedisServer;

/// How long the bench runs.
const RUN: Duration = Duration::from_secs(3);

/// Waits for `child` at most `limit`; kills it and fails the test past that.
fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for bench") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("bench still running {limit:?} after it started");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The redis-server process is stopped (SIGSTOP) for 100 ms, 0.8 s into a 3 s run with
/// 256 checks in flight on two tokio workers, with a store timeout below the stall (the
/// default, 250 ms, would ride it out) so that the checks in flight fail.
#[test]
fn a_redis_stall_ends_on_time_and_is_reported_by_kind() {
    let redis = RedisServer::start(&[]);
    let started = Instant::now();
    let mut bench = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["bench", "--store", &redis.url()])
        .args(["--algorithm", "fixed-window", "--limit", "1000000000"])
        .args(["--window", "1h", "--keys", "1000", "--concurrency", "256"])
        .args(["--duration", "3s", "--store-timeout", "50ms", "--json"])
        .env("TOKIO_WORKER_THREADS", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluicegate bench");
    std::thread::sleep(Duration::from_millis(800));
    redis.freeze(Duration::from_millis(100));
    let status = wait_bounded(&mut bench, Duration::from_secs(30));
    let took = started.elapsed();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    bench
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    bench
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let report: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: stdout {stdout:?}, stderr {stderr:?}"));
    eprintln!("{took:?} {status}: {report}\n{stderr}");

    // A run with errors failed, and says how.
    assert!(!status.success(), "{report}");
    assert!(stderr.contains("failed"), "{stderr}");
    // The checks in flight when Redis stopped timed out; nothing else went wrong.
    let errors = report["errors"].as_object().expect("errors by kind");
    assert!(errors["timeout"].as_u64().unwrap() > 0, "{report}");
    let known = ["timeout", "breaker_open"];
    assert!(
        errors.keys().all(|k| known.contains(&k.as_str())),
        "{report}"
    );
    // On time: the stall cost its 100 ms, not seconds of starved timers (startup and a
    // loaded machine get the rest of the margin).
    assert!(
        report["seconds"].as_f64().unwrap() < RUN.as_secs_f64() + 0.5,
        "{report}"
    );
    assert!(took < RUN + Duration::from_secs(3), "{took:?}");
    // Decisions are the checks the store answered, no failure among them: as many as the
    // limiter's store decisions, and none waited longer than a store timeout allows.
    assert_eq!(report["decisions"], report["store_calls"], "{report}");
    assert!(report["decisions"].as_u64().unwrap() > 1000, "{report}");
    assert!(report["max_us"].as_u64().unwrap() < 500_000, "{report}");
}

/// A service whose Redis is gone answers 503 / UNAVAILABLE: `load` counts those by status
/// or code, reports no decisions, and exits non-zero.
#[test]
fn load_reports_the_services_failures_by_status_and_code() {
    let redis = RedisServer::start(&[]);
    let server = Server::start(&["--store", &redis.url()]);
    redis.shutdown();
    for (protocol, kind) in [("http", "http_503"), ("grpc", "grpc_Unavailable")] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args(["load", "--target", &server.address, "--protocol", protocol])
            .args([
                "--values",
                "10",
                "--concurrency",
                "4",
                "--duration",
                "500ms",
            ])
            .arg("--json")
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{protocol}: {report}");
        assert!(stderr.contains(kind), "{protocol}: {stderr}");
        let errors = report["errors"].as_object().expect("errors by kind");
        assert_eq!(errors.keys().collect::<Vec<_>>(), [kind], "{report}");
        assert!(errors[kind].as_u64().unwrap() > 0, "{report}");
        assert_eq!(report["decisions"], 0, "{protocol}: {report}");
    }
}
