//! Domains never share state: two domains' rules of one name count apart, on memory and
//! on a real redis-server, through the service's HTTP API.

use sluicegate_test_support as support;

use crate::server;

use serde_json::Value;
use server::Server;

/// Two domains, each with a `per_user` rule of the same numbers; team_b's `vip` replaces
/// its `per_user` by that name.
fn config_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-domains-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let per_user =
        "  - key: user\n    rate_limit: {name: per_user, window: 1h, requests_per_unit: 2}\n";
    std::fs::write(
        dir.join("team_a.yaml"),
        format!("domain: team_a\ndescriptors:\n{per_user}"),
    )
    .unwrap();
    std::fs::write(
        dir.join("team_b.yaml"),
        format!(
            "domain: team_b\ndescriptors:\n{per_user}  - key: vip\n    rate_limit:\n      \
             {{name: vip, window: 1h, requests_per_unit: 5, replaces: [{{name: per_user}}]}}\n"
        ),
    )
    .unwrap();
    dir
}

/// Envoy's JSON check of `domain` for these descriptors (key, value), one entry each:
/// each descriptor's (code, current limit's name).
fn check(server: &Server, domain: &str, descriptors: &[(&str, &str)]) -> Vec<(String, String)> {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|(key, value)| serde_json::json!({"entries": [{"key": key, "value": value}]}))
        .collect();
    let body = serde_json::json!({"domain": domain, "descriptors": descriptors}).to_string();
    let (status, answer) = server.request("POST", "/json", &body);
    let answer: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert!(matches!(status, 200 | 429), "{status}: {answer}");
    answer["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let name = s["currentLimit"]["name"].as_str().unwrap_or_default();
            (s["code"].as_str().unwrap().to_owned(), name.to_owned())
        })
        .collect()
}

fn one(code: &str, name: &str) -> Vec<(String, String)> {
    vec![(code.to_owned(), name.to_owned())]
}

fn domains_count_apart(server: &Server) {
    for _ in 0..2 {
        assert_eq!(
            check(server, "team_a", &[("user", "alice")]),
            one("OK", "per_user")
        );
    }
    assert_eq!(
        check(server, "team_a", &[("user", "alice")]),
        one("OVER_LIMIT", "per_user")
    );
    // team_a's alice used up team_a's limit; team_b's alice has all of hers.
    for _ in 0..2 {
        assert_eq!(
            check(server, "team_b", &[("user", "alice")]),
            one("OK", "per_user")
        );
    }
    assert_eq!(
        check(server, "team_b", &[("user", "alice")]),
        one("OVER_LIMIT", "per_user")
    );
    // `replaces` still finds per_user by its configured name: with vip, only vip counts.
    for _ in 0..3 {
        let both = check(server, "team_b", &[("user", "bob"), ("vip", "bob")]);
        assert_eq!(both[1], ("OK".to_owned(), "vip".to_owned()), "{both:?}");
        assert_eq!(both[0].0, "OK", "{both:?}");
    }
}

#[test]
fn domains_with_rules_of_one_name_count_apart_in_memory() {
    let dir = config_dir("memory");
    let server = Server::start(&["--config", dir.to_str().unwrap()]);
    domains_count_apart(&server);
    assert!(server.stop().success());
}

#[test]
fn domains_with_rules_of_one_name_count_apart_on_redis() {
    let dir = config_dir("redis");
    let redis = support::RedisServer::start(&[]);
    let prefix = format!("domains-{}:", std::process::id());
    let server = Server::start(&[
        "--config",
        dir.to_str().unwrap(),
        "--store",
        &redis.url(),
        "--prefix",
        &prefix,
    ]);
    domains_count_apart(&server);
    assert!(server.stop().success());
}
