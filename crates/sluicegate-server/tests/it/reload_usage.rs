//! A reload that changes a rule's numbers keeps each key's usage (docs/SPEC.md, "Changing a
//! rule's numbers"): through the service's HTTP API, on memory and on a real redis-server.

use crate::server;

use server::Server;
use sluicegate_test_support as support;

/// Domain `d`: a sliding-log rule per user and a token bucket per client, `limit` an hour.
fn config(limit: u32) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{window: 1h, requests_per_unit: \
         {limit}}}\n  - key: client\n    rate_limit: {{algorithm: token-bucket, window: 1h, \
         requests_per_unit: {limit}}}\n"
    )
}

/// Envoy's JSON check of one descriptor: its code and `limitRemaining`.
fn check(server: &Server, key: &str) -> (String, u64) {
    let body = format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"{key}","value":"v"}}]}}]}}"#
    );
    let (status, answer) = server.request("POST", "/json", &body);
    assert!(matches!(status, 200 | 429), "{status}: {answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let status = &answer["statuses"][0];
    (
        status["code"].as_str().unwrap().to_owned(),
        status["limitRemaining"].as_u64().unwrap_or(0),
    )
}

/// Two requests under a limit of 2, then the limit raised to 3: one more passes, with
/// nothing left — the two taken before the reload still count.
fn usage_survives_a_reload(extra: &[&str], tag: &str) {
    let file = std::env::temp_dir().join(format!(
        "sluicegate-reload-usage-{tag}-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&file, config(2)).unwrap();
    let mut args = vec![
        "--config",
        file.to_str().unwrap(),
        "--reload-interval",
        "20ms",
    ];
    args.extend_from_slice(extra);
    let server = Server::start(&args);
    for key in ["user", "client"] {
        assert_eq!(check(&server, key), ("OK".to_owned(), 1), "{key}");
        assert_eq!(check(&server, key), ("OK".to_owned(), 0), "{key}");
        assert_eq!(check(&server, key).0, "OVER_LIMIT", "{key}");
    }
    std::fs::write(&file, config(3)).unwrap();
    server.wait_for_metric("sluicegate_config_loads_total", 2);
    for key in ["user", "client"] {
        assert_eq!(check(&server, key), ("OK".to_owned(), 0), "{key}");
        assert_eq!(check(&server, key).0, "OVER_LIMIT", "{key}");
    }
    assert!(server.stop().success());
}

#[test]
fn a_reload_that_raises_a_limit_keeps_usage_in_memory() {
    usage_survives_a_reload(&[], "memory");
}

#[test]
fn a_reload_that_raises_a_limit_keeps_usage_on_redis() {
    let redis = support::RedisServer::start(&[]);
    let url = redis.url();
    usage_survives_a_reload(&["--store", &url], "redis");
}
