//! `POST /v1/explain` through `sluicegate explain` against a served instance, on memory, a
//! real redis-server and a real Redis Cluster: it predicts what the next check decides, for
//! every algorithm, and changes nothing (a key that was explained decides as one that never
//! was); exit status as check's (0 would be admitted, 1 would be refused, 2 no answer).

use crate::server;

use std::process::{Command, Output};

use server::Server;
use sluicegate_test_support::{self as support, certificates::Authority};

/// One rule per algorithm, slow to refill (a unit per 20 s at most) so that the real
/// clock moving between two calls changes no answer.
const RULES: &str = "domain: ex
descriptors:
  - key: log
    rate_limit: {algorithm: sliding-log, window: 100s, requests_per_unit: 5}
  - key: counter
    rate_limit: {algorithm: sliding-counter, window: 100s, requests_per_unit: 5, buckets: 4}
  - key: fixed
    rate_limit: {algorithm: fixed-window, unit: day, requests_per_unit: 5}
  - key: token
    rate_limit: {algorithm: token-bucket, window: 100s, requests_per_unit: 5, burst: 5}
  - key: leaky
    rate_limit: {algorithm: leaky-bucket, window: 100s, requests_per_unit: 5, queue: 4}
  - key: free
    rate_limit: {unlimited: true}
";

const ALGORITHMS: [&str; 5] = ["log", "counter", "fixed", "token", "leaky"];

fn sluicegate(command: &str, target: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args([command, "--target", target, "--domain", "ex"])
        .args(args)
        .output()
        .unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    let printed = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&printed).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {printed}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn serve_rules(store: &[&str], run: &str) -> (Server, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!(
        "sluicegate-explain-{}-{run}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, RULES).unwrap();
    let config = path.to_str().unwrap().to_owned();
    let server = Server::start(&[&["--config", config.as_str()], store].concat());
    (server, path)
}

/// For each algorithm: explain a cost of 2, then check it, until it is refused; explain's
/// exit status and numbers always say what the check then does. Keys are prefixed by
/// `run` so that runs sharing a Redis do not meet.
fn explains_then_checks(store: &[&str], run: &str) {
    let (server, path) = serve_rules(store, run);
    let target = server.address.as_str();
    for key in ALGORITHMS {
        let explained = format!("{key}={run}-explained");
        let never = format!("{key}={run}-never");
        let mut refused = false;
        for step in 0..5 {
            let args = ["--descriptor", explained.as_str(), "--hits", "2"];
            let explain = sluicegate("explain", target, &args);
            let said = json(&explain);
            assert_eq!(said["descriptors"][0]["match"], "rule", "{said}");
            assert_eq!(
                said["descriptors"][0]["rule"],
                format!("ex.{key}"),
                "{said}"
            );
            let check = sluicegate("check", target, &args);
            let decided = json(&check);
            assert_eq!(
                explain.status.code(),
                check.status.code(),
                "{key} step {step}: explained {said}, decided {decided}"
            );
            let state = &said["descriptors"][0]["state"];
            // Times are whole microseconds on the wire, as every other answer gives them.
            let numbers = &said["descriptors"][0]["numbers"];
            assert!(
                numbers["window_us"].as_u64().is_some_and(|w| w > 0),
                "{said}"
            );
            assert!(state["reset_after_us"].is_u64(), "{said}");
            if key == "counter" {
                assert_eq!(state["estimate"]["rounded_up"], state["in_use"], "{said}");
            }
            let remaining = &decided["descriptors"][0]["decision"]["remaining"];
            if check.status.code() == Some(0) {
                assert_eq!(
                    state["available"].as_u64().unwrap() - 2,
                    remaining.as_u64().unwrap(),
                    "{said} {decided}"
                );
            } else {
                assert_eq!(said["refused_by"], serde_json::json!([format!("ex.{key}")]));
                refused = true;
            }
            // The same key never explained: the same decision.
            let twin = json(&sluicegate(
                "check",
                target,
                &["--descriptor", never.as_str(), "--hits", "2"],
            ));
            assert_eq!(decided["allowed"], twin["allowed"], "{key} step {step}");
            assert_eq!(
                decided["decision"]["remaining"], twin["decision"]["remaining"],
                "{key} step {step}"
            );
        }
        assert!(refused, "{key}: 5 checks of 2 never reached the limit");
    }
    // No rule, an unlimited one, a cost that never fits; all in words with --text.
    let out = sluicegate(
        "explain",
        target,
        &[
            "--descriptor",
            "nobody=x",
            "--descriptor",
            "free=x",
            "--text",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("a cost of 1 would be admitted\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "nobody=x: no rule matched: entries[0]: the domain has no rule for key \"nobody\""
        ),
        "{text}"
    );
    assert!(text.contains("free=x: the rule is unlimited"), "{text}");
    let never = format!("log={run}-big");
    let out = sluicegate(
        "explain",
        target,
        &["--descriptor", &never, "--hits", "6", "--text"],
    );
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("0 of 5 in use, 5 available; a unit is free now"),
        "{text}"
    );
    assert!(text.contains("6 would not fit [refuses]"), "{text}");
    // No explanation: exit 2 and why.
    let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args([
            "explain",
            "--target",
            target,
            "--domain",
            "nowhere",
            "--descriptor",
            "a=b",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown domain \"nowhere\""));
    drop(server);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn explain_predicts_checks_in_memory() {
    explains_then_checks(&[], "memory");
}

#[test]
fn explain_predicts_checks_on_redis() {
    let redis = support::standalone();
    explains_then_checks(&["--store", &redis.url()], "redis");
}

#[test]
fn explain_predicts_checks_on_a_redis_cluster() {
    let cluster = support::cluster();
    explains_then_checks(
        &["--store", &cluster.url(), "--store-timeout", "2s"],
        "cluster",
    );
}

/// Envoy's counting (each descriptor on its own, a fixed window's refusals charged):
/// explain still says what the next check does.
#[test]
fn explain_predicts_checks_under_envoy_counting() {
    explains_then_checks(&["--compat", "envoy"], "envoy");
}

/// Over TLS with --tls-ca, as check; without it a TLS service gives no explanation.
#[test]
fn explain_over_tls() {
    let dir = std::env::temp_dir().join(format!("sluicegate-explain-tls-{}", std::process::id()));
    let authority = Authority::new(&dir, "ca");
    let pair = authority.issue("server");
    let server = Server::start(&[
        "--tls-cert",
        pair.cert.to_str().unwrap(),
        "--tls-key",
        pair.key.to_str().unwrap(),
    ]);
    let ca = authority.cert();
    let explain = |tls: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args([
                "explain",
                "--target",
                &server.address,
                "--domain",
                "example",
            ])
            .args(["--descriptor", "user=tls"])
            .args(tls)
            .output()
            .unwrap()
    };
    let out = explain(&["--tls-ca", ca.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&out)["descriptors"][0]["rule"], "example.user");
    let out = explain(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}
