//! `sluicegate load` against a service through a TCP proxy that counts the connections it
//! accepts: `--requests` bounds the run, `--requests-per-connection` churns connections.

use crate::server;

use std::process::Command;

use server::Server;
use sluicegate_test_support::FaultProxy;

/// Tasks of each run.
const TASKS: u64 = 4;
/// Requests of each run, in all.
const REQUESTS: u64 = 400;
/// Requests per connection when churning.
const PER_CONNECTION: u64 = 10;

/// Runs `load` over `protocol` through a new proxy to `server`, with `extra` flags; the
/// report, and the connections the proxy accepted.
fn load_through_proxy(
    server: &Server,
    protocol: &str,
    extra: &[&str],
) -> (serde_json::Value, usize) {
    let port: u16 = server.address.rsplit(':').next().unwrap().parse().unwrap();
    let proxy = FaultProxy::start(port);
    let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["load", "--target", &format!("127.0.0.1:{}", proxy.port)])
        .args(["--protocol", protocol, "--values", "50"])
        .args(["--concurrency", &TASKS.to_string()])
        .args(["--requests", &REQUESTS.to_string(), "--json"])
        .args(extra)
        .output()
        .expect("run sluicegate load");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{protocol} {extra:?}: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: stdout {:?}, stderr {stderr}", out.stdout));
    (report, proxy.accepted())
}

/// Each task opens a new connection after every 10 requests: 400 requests from 4 tasks
/// take 40 connections (up to one more per task when the tasks' shares are not multiples
/// of 10), where without the flag the tasks keep theirs for the whole run.
#[test]
fn requests_per_connection_opens_new_connections_and_requests_bounds_the_run() {
    let server = Server::start(&[]);
    let per_connection = PER_CONNECTION.to_string();
    let churned = REQUESTS / PER_CONNECTION;
    for protocol in ["http", "grpc"] {
        let (report, accepted) = load_through_proxy(
            &server,
            protocol,
            &["--requests-per-connection", &per_connection],
        );
        eprintln!("{protocol}, churning: {accepted} connections, {report}");
        assert_eq!(report["decisions"], REQUESTS, "{protocol}: {report}");
        assert_eq!(
            report["errors"],
            serde_json::json!({}),
            "{protocol}: {report}"
        );
        let accepted = accepted as u64;
        assert!(
            (churned..=churned + TASKS).contains(&accepted),
            "{protocol}: {accepted} connections for {REQUESTS} requests, {PER_CONNECTION} per connection"
        );

        let (report, accepted) = load_through_proxy(&server, protocol, &[]);
        eprintln!("{protocol}, kept: {accepted} connections, {report}");
        assert_eq!(report["decisions"], REQUESTS, "{protocol}: {report}");
        assert!(
            (1..=TASKS as usize).contains(&accepted),
            "{protocol}: {accepted} connections without churn"
        );
    }
}

/// The default workload measures admissions, not refusals: 12,000 requests, more than twice
/// what the example rules' per-user limit would let 1,000 values through, are nearly all
/// allowed; the header says what was asked.
#[test]
fn the_default_workload_is_mostly_admitted() {
    let server = Server::start(&[]);
    let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["load", "--target", &server.address, "--requests", "12000"])
        .args(["--concurrency", &TASKS.to_string(), "--json"])
        .output()
        .expect("run sluicegate load");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (decisions, allowed) = (report["decisions"].as_u64(), report["allowed"].as_u64());
    assert_eq!(decisions, Some(12_000), "{report}");
    assert!(allowed.unwrap() >= 11_400, "{report}");
    assert_eq!(
        report["workload"], "http example remote_address=load-0…load-199999",
        "{report}"
    );
}
