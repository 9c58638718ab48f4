//! A full store is not an outage: with the example rules, one client floods the one-hour
//! rule `[api=x, user=<new>]` until the memory budget is spent; new users of that rule are
//! then answered by the --on-full policy, and other rules' users still get in — over HTTP
//! (429 or 200) and gRPC (OVER_LIMIT or OK), never 503 or UNAVAILABLE.

use crate::server;

use server::Server;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

fn body(pairs: &[(&str, &str)]) -> String {
    let entries: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!(r#"{{"key":"{k}","value":"{v}"}}"#))
        .collect();
    format!(
        r#"{{"domain":"example","descriptors":[{{"entries":[{}]}}]}}"#,
        entries.join(",")
    )
}

/// Floods the one-hour rule with new users until the store is full; the statuses seen.
fn flood(server: &Server) -> Vec<u16> {
    (0..3_000)
        .map(|i| {
            let user = format!("attacker-{i}");
            server
                .request("POST", "/json", &body(&[("api", "x"), ("user", &user)]))
                .0
        })
        .collect()
}

/// What a new user of the flooded rule and a new user of another rule get, over HTTP and
/// gRPC: (HTTP status, gRPC code) each.
fn newcomers(server: &Server, round: usize) -> [(u16, i32); 2] {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut client = runtime
        .block_on(RateLimitServiceClient::connect(format!(
            "http://{}",
            server.address
        )))
        .expect("connect over gRPC");
    let mut answers = [(0, 0); 2];
    let flooded = format!("newcomer-{round}");
    let other = format!("someone-{round}");
    let cases: [&[(&str, &str)]; 2] = [&[("api", "x"), ("user", &flooded)], &[("user", &other)]];
    for (answer, pairs) in answers.iter_mut().zip(cases) {
        let (status, _) = server.request("POST", "/json", &body(pairs));
        // A second user for gRPC: the first is now held.
        let grpc_pairs: Vec<(&str, String)> = pairs
            .iter()
            .map(|(k, v)| (*k, format!("{v}-grpc")))
            .collect();
        let grpc_pairs: Vec<(&str, &str)> =
            grpc_pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let response = runtime
            .block_on(client.should_rate_limit(server::rls_request("example", &grpc_pairs, 0)))
            .expect("answered, not UNAVAILABLE")
            .into_inner();
        *answer = (status, response.overall_code);
    }
    answers
}

#[test]
fn refuse_answers_429_and_over_limit_and_other_rules_get_in() {
    let server = Server::start(&["--max-memory", "256KiB", "--on-full", "refuse"]);
    let statuses = flood(&server);
    assert!(!statuses.contains(&503), "{statuses:?}");
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert!(
        refused > 1_000,
        "the flood filled the rule's share: {refused} refused"
    );
    for round in 0..20 {
        let [flooded, other] = newcomers(&server, round);
        assert_eq!(flooded, (429, i32::from(Code::OverLimit)), "round {round}");
        assert_eq!(other, (200, i32::from(Code::Ok)), "round {round}");
    }
    // Full decisions are counted per rule and policy, and the store stayed in its budget.
    let metrics = server.request("GET", "/metrics", "").1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluicegate_full_decisions_total{")
                && l.contains("policy=\"refuse\"")),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluicegate_memory_budget_bytes 262144"),
        "{metrics}"
    );
    let store_bytes: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluicegate_memory_bytes{part=\"store\"} "))
        .expect("the store's bytes")
        .parse()
        .unwrap();
    assert!(store_bytes <= 262_144, "{store_bytes}");
    assert!(server.stop().success());
}

#[test]
fn evict_idle_by_default_lets_new_users_of_every_rule_in() {
    let server = Server::start(&["--max-memory", "256KiB"]);
    let statuses = flood(&server);
    assert!(
        statuses.iter().all(|&s| s == 200),
        "the attacker's own idle keys made room: {:?}",
        statuses.iter().filter(|&&s| s != 200).count()
    );
    for round in 0..20 {
        let [flooded, other] = newcomers(&server, round);
        assert_eq!(flooded, (200, i32::from(Code::Ok)), "round {round}");
        assert_eq!(other, (200, i32::from(Code::Ok)), "round {round}");
    }
    let metrics = server.request("GET", "/metrics", "").1;
    let evicted: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("sluicegate_evictions_total{rule="))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(evicted > 1_000, "{metrics}");
    assert!(server.stop().success());
}

/// A budget that holds nothing, or a share outside (0, 1], stops the start naming the flag.
#[test]
fn a_budget_that_cannot_be_honoured_stops_the_start() {
    for (args, flag) in [
        (&["--max-memory", "0"][..], "--max-memory"),
        (&["--max-memory", "lots"][..], "--max-memory"),
        (&["--max-rule-share", "0"][..], "--max-rule-share"),
        (&["--on-full", "panic"][..], "--on-full"),
    ] {
        let error = Server::try_start(args).err().expect("refused");
        assert!(error.contains(flag), "{args:?}: {error}");
    }
}

/// The bytes of the store in `/metrics`.
fn store_bytes(server: &Server) -> u64 {
    server
        .request("GET", "/metrics", "")
        .1
        .lines()
        .find_map(|l| l.strip_prefix("sluicegate_memory_bytes{part=\"store\"} "))
        .expect("the store's bytes")
        .parse()
        .unwrap()
}

/// Descriptor values of 60 KB (what Envoy forwards from a header) are stored as digests of
/// a fixed size: a flood of new ones holds a few hundred bytes per key, not 60 KB, and
/// every check is decided.
#[test]
fn long_values_are_held_as_digests_within_the_budget() {
    const BUDGET: u64 = 2 << 20;
    let server = Server::start(&["--max-memory", "2MiB"]);
    let value = "v".repeat(60_000);
    for i in 0..200 {
        let user = format!("{i}-{value}");
        let (status, answer) = server.request("POST", "/json", &body(&[("user", &user)]));
        assert_eq!(status, 200, "{answer}");
    }
    let bytes = store_bytes(&server);
    assert!(bytes <= BUDGET);
    assert!(
        bytes < 200 * 512,
        "200 keys of 60 KB values hold {bytes} bytes"
    );
    // A short key of another rule still gets in.
    let (status, _) = server.request("POST", "/json", &body(&[("api", "x"), ("user", "bob")]));
    assert_eq!(status, 200);
    assert!(server.stop().success());
}
