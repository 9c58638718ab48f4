//! `sluicegate check` against a served instance, over HTTP and over gRPC: the decision it
//! prints and the exit status that says it (0 allowed, 1 over the limit, 2 no decision).

use crate::server;

use server::Server;
use sluicegate_test_support::{self as support, certificates::Authority};

use std::process::{Command, Output};

fn check(target: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["check", "--target", target])
        .args(args)
        .output()
        .unwrap()
}

/// The printed answer, as JSON, and the exit status.
fn answer(out: &Output) -> (serde_json::Value, Option<i32>) {
    let printed = String::from_utf8_lossy(&out.stdout);
    let value = serde_json::from_str(&printed).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {printed}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (value, out.status.code())
}

/// The example rules allow 5 per 10 s per user: a cost of 4 over HTTP, then 1 over gRPC
/// fill it; the next is over the limit on either protocol.
#[test]
fn check_prints_decisions_over_http_and_grpc() {
    let server = Server::start(&[]);
    let target = server.address.as_str();
    let user = ["--domain", "example", "--descriptor", "user=dana"];

    let (http, status) = answer(&check(target, &[&user[..], &["--hits", "4"]].concat()));
    assert_eq!(status, Some(0), "{http}");
    assert_eq!(http["decision"]["remaining"], 1, "{http}");
    assert_eq!(http["descriptors"][0]["rule"], "example.user", "{http}");

    let (grpc, status) = answer(&check(target, &[&["--grpc"], &user[..]].concat()));
    assert_eq!(status, Some(0), "{grpc}");
    assert_eq!(grpc["overallCode"], "OK", "{grpc}");
    assert_eq!(grpc["statuses"][0]["currentLimit"]["requestsPerUnit"], 5);

    let (grpc, status) = answer(&check(target, &[&["--grpc"], &user[..]].concat()));
    assert_eq!(
        (grpc["overallCode"].as_str(), status),
        (Some("OVER_LIMIT"), Some(1))
    );
    let (http, status) = answer(&check(target, &user));
    assert_eq!((http["allowed"].as_bool(), status), (Some(false), Some(1)));

    // Two descriptors, one of two entries: a nested rule and the per-user one together.
    let (both, status) = answer(&check(
        target,
        &[
            "--domain",
            "example",
            "--descriptor",
            "user=erin",
            "--descriptor",
            "api=search,user=erin",
        ],
    ));
    assert_eq!(status, Some(0), "{both}");
    assert_eq!(
        both["descriptors"].as_array().map(Vec::len),
        Some(2),
        "{both}"
    );
}

/// No decision is never printed as one: exit status 2 and the reason, on either protocol —
/// for a store that failed (a real redis-server, shut down), and a port nothing serves.
#[test]
fn check_without_a_decision_says_why() {
    let redis = support::RedisServer::start(&[]);
    let server = Server::start(&["--store", &redis.url(), "--store-timeout", "100ms"]);
    let user = ["--domain", "example", "--descriptor", "user=gina"];
    let (_, status) = answer(&check(&server.address, &user));
    assert_eq!(status, Some(0), "decided while Redis runs");
    redis.shutdown();
    // A port nothing listens on.
    let nowhere = format!("127.0.0.1:{}", support::free_port());
    // How each protocol says the store failed: HTTP's 503, gRPC's UNAVAILABLE.
    for (protocol, store_failed) in [(&[][..], "503"), (&["--grpc"][..], "Unavailable")] {
        let args = [protocol, &user].concat();
        for (target, reason) in [
            (&server.address, store_failed),
            (&nowhere, "Connection refused"),
        ] {
            let out = check(target, &args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{protocol:?} {target}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{protocol:?} {target}");
            assert!(stderr.contains(reason), "{protocol:?} {target}: {stderr}");
        }
    }
    let out = check(
        &server.address,
        &["--domain", "example", "--descriptor", "user"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"user\" is not key=value"));
}

/// With `--tls-ca`, over TLS on both protocols, trusting the service's authority; without
/// it a TLS service gives no decision.
#[test]
fn check_over_tls() {
    let dir = std::env::temp_dir().join(format!("sluicegate-check-tls-{}", std::process::id()));
    let authority = Authority::new(&dir, "ca");
    let pair = authority.issue("server");
    let server = Server::start(&[
        "--tls-cert",
        pair.cert.to_str().unwrap(),
        "--tls-key",
        pair.key.to_str().unwrap(),
    ]);
    let ca = authority.cert();
    let user = ["--domain", "example", "--descriptor", "user=frank"];
    let tls = ["--tls-ca", ca.to_str().unwrap()];
    let (http, status) = answer(&check(&server.address, &[&user[..], &tls].concat()));
    assert_eq!(
        (http["allowed"].as_bool(), status),
        (Some(true), Some(0)),
        "{http}"
    );
    let (grpc, status) = answer(&check(
        &server.address,
        &[&user[..], &tls, &["--grpc"]].concat(),
    ));
    assert_eq!(
        (grpc["overallCode"].as_str(), status),
        (Some("OK"), Some(0)),
        "{grpc}"
    );

    for protocol in [&[][..], &["--grpc"][..]] {
        let out = check(&server.address, &[&user[..], protocol].concat());
        assert_eq!(out.status.code(), Some(2), "{protocol:?} without TLS");
        assert!(out.stdout.is_empty());
    }
}
