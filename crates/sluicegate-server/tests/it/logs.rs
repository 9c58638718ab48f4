//! The binary's logs: `--log-format json` writes one JSON object per line, refusals get a
//! line each at the share `--log-refusals` asks, and a reload names what it changed.

use sluicegate_test_support as support;

use crate::server;

use serde_json::Value;
use server::Server;

fn config(requests: u32, extra: &str) -> String {
    format!(
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {{window: 1h, requests_per_unit: {requests}}}\n{extra}"
    )
}

fn check(server: &Server, user: &str) -> bool {
    let body = format!(
        r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    );
    let (status, answer) = server.request("POST", "/v1/check", &body);
    assert_eq!(status, 200, "{answer}");
    answer.contains(r#""allowed":true"#)
}

#[test]
fn json_lines_sampled_refusals_and_what_a_reload_changed_on_memory() {
    json_lines_sampled_refusals_and_what_a_reload_changed("memory", "memory");
}

#[test]
fn json_lines_sampled_refusals_and_what_a_reload_changed_on_redis() {
    let redis = support::RedisServer::start(&[]);
    json_lines_sampled_refusals_and_what_a_reload_changed("redis", &redis.url());
}

fn json_lines_sampled_refusals_and_what_a_reload_changed(tag: &str, store: &str) {
    let dir = std::env::temp_dir().join(format!("sluicegate-logs-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shop.yaml");
    let plan = "  - key: plan\n    rate_limit: {unit: second, requests_per_unit: 9}\n";
    std::fs::write(&path, config(2, plan)).unwrap();
    let server = Server::binary(&[
        "--store",
        store,
        "--config",
        path.to_str().unwrap(),
        "--log-format",
        "json",
        "--log-refusals",
        "0.25",
        "--reload-interval",
        "50ms",
    ]);
    // Two admitted, then twelve refused: a quarter of them, exactly three, are logged.
    let admitted = (0..14).filter(|_| check(&server, "ann")).count();
    assert_eq!(admitted, 2);
    let refusals = || -> Vec<Value> {
        server
            .logs()
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .filter(|v| v["target"] == "sluicegate::refusal")
            .collect()
    };
    server.wait_for_log(|_| refusals().len() >= 3);
    let logged = refusals();
    assert_eq!(logged.len(), 3, "{logged:#?}");
    let fields = &logged[0]["fields"];
    assert_eq!(fields["domain"], "shop");
    assert_eq!(fields["rule"], "shop.user");
    assert_eq!(fields["descriptor"], "user=ann");
    assert_eq!(fields["limit"], 2);
    assert!(fields["retry_after_us"].as_i64().unwrap() > 0);
    assert_eq!(logged[0]["level"], "INFO");

    // An edit of user's numbers, plan gone, team added: the reload's line says so.
    let team = "  - key: team\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    std::fs::write(&path, config(3, team)).unwrap();
    let line = server.wait_for_log(|l| l.contains("configuration reloaded"));
    let reload: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reload["fields"]["added"], "shop.team");
    assert_eq!(reload["fields"]["removed"], "shop.plan");
    assert_eq!(reload["fields"]["edited"], "shop.user");
    assert_eq!(reload["fields"]["version"], 2);
    assert!(server.stop().success());
}

#[test]
fn a_bad_log_flag_is_named() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["serve", "--log-refusals", "2"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--log-refusals"), "{stderr}");
    assert!(stderr.contains("share from 0 to 1"), "{stderr}");
}

/// A refusal of a 60 KB value logs a line of a few hundred bytes: the descriptor as its
/// first bytes and a digest of the whole, as `/v1/top` shows it.
#[test]
fn a_long_value_logs_as_its_first_bytes_and_a_digest() {
    let dir = std::env::temp_dir().join(format!("sluicegate-logs-long-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shop.yaml");
    std::fs::write(&path, config(1, "")).unwrap();
    let server = Server::binary(&[
        "--config",
        path.to_str().unwrap(),
        "--log-format",
        "json",
        "--log-refusals",
        "1",
    ]);
    let user = "u".repeat(60_000);
    assert!(check(&server, &user));
    assert!(!check(&server, &user));
    let line = server.wait_for_log(|l| l.contains("sluicegate::refusal"));
    assert!(line.len() < 1_000, "a line of {} bytes", line.len());
    let logged: Value = serde_json::from_str(&line).unwrap();
    let descriptor = logged["fields"]["descriptor"].as_str().unwrap();
    assert!(descriptor.starts_with("user=uuu"), "{descriptor}");
    assert!(
        descriptor.contains("…[60005 bytes, sha256:"),
        "{descriptor}"
    );
    assert!(server.stop().success());
}
