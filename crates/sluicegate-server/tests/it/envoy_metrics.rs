//! envoyproxy/ratelimit's counters, scraped from `GET /metrics` after real gRPC calls:
//! its names and labels (src/stats/prom/default_mapper.yaml) and its counting rules
//! (src/limiter/base_limiter.go), beside sluicegate's own.

use crate::server;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use server::Server;

const CONFIG: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 3}
";

fn serve(name: &str, flags: &[&str]) -> Server {
    let dir = std::env::temp_dir().join(format!("sluicegate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("config.yaml");
    std::fs::write(&file, CONFIG).unwrap();
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend_from_slice(flags);
    Server::start(&args)
}

/// `times` calls, each of one descriptor of `entries` adding `hits`.
async fn hit(server: &Server, entries: &[(&str, &str)], hits: u32, times: usize) {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .unwrap();
    for _ in 0..times {
        let request = server::rls_request("d", entries, hits);
        client.should_rate_limit(request).await.unwrap();
    }
}

/// The five counters of one limit, as scraped: total, over, near, within, shadow.
fn scraped(text: &str, labels: &str) -> [u64; 5] {
    [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
    ]
    .map(|name| {
        let series = format!("ratelimit_service_rate_limit_{name}{{{labels}}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .unwrap_or_else(|| panic!("{series} not in\n{text}"))
            .parse()
            .unwrap()
    })
}

fn metrics(server: &Server) -> String {
    tokio::task::block_in_place(|| server.request("GET", "/metrics", "")).1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_counters_under_envoys_names() {
    let server = serve("envoy-metrics", &[]);
    // 9 of 10: the 9th is past the near threshold of 8.
    hit(&server, &[("user", "u")], 1, 9).await;
    let text = metrics(&server);
    assert_eq!(scraped(&text, r#"domain="d",key1="user""#), [9, 0, 1, 9, 0]);
    // 2 more hits with one left: refused, one over and one near (9 to 10).
    hit(&server, &[("user", "u")], 2, 1).await;
    let text = metrics(&server);
    assert_eq!(
        scraped(&text, r#"domain="d",key1="user""#),
        [11, 1, 2, 9, 0]
    );
    // A nested limit: domain, key1, key2.
    hit(&server, &[("a", "x"), ("b", "y")], 1, 1).await;
    // Shadow mode: over, and shadow too, though let through.
    hit(&server, &[("trial", "t")], 1, 2).await;
    // detailed_metric: the request's values in the labels.
    hit(&server, &[("client", "c7")], 1, 1).await;
    let text = metrics(&server);
    assert_eq!(
        scraped(&text, r#"domain="d",key1="a_x",key2="b""#),
        [1, 0, 0, 1, 0]
    );
    assert_eq!(
        scraped(&text, r#"domain="d",key1="trial""#),
        [2, 1, 1, 1, 1]
    );
    assert_eq!(
        scraped(&text, r#"domain="d",key1="client_c7""#),
        [1, 0, 0, 1, 0]
    );
    assert!(text.contains("# TYPE ratelimit_service_rate_limit_total_hits counter\n"));
    // The service's own, as envoy's mapping names them: 14 calls so far, one load.
    assert!(
        text.contains("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 14\n"),
        "{text}"
    );
    assert!(
        text.contains("ratelimit_service_config_load_success 1\n"),
        "{text}"
    );
    assert!(
        text.contains("ratelimit_service_config_load_error 0\n"),
        "{text}"
    );
    // sluicegate's own, beside them.
    assert!(
        text.contains(r#"sluicegate_rule_hits_total{rule="d.user",result="over_limit"} 1"#),
        "{text}"
    );
}

/// NEAR_LIMIT_RATIO's flag moves the near threshold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_near_limit_ratio_is_the_operators() {
    let server = serve("near-ratio", &["--near-limit-ratio", "0.5"]);
    hit(&server, &[("user", "u")], 1, 7).await;
    // Past 5 of 10: the 6th and 7th.
    let text = metrics(&server);
    assert_eq!(scraped(&text, r#"domain="d",key1="user""#), [7, 0, 2, 7, 0]);
}

/// Every line of `text` that starts with `prefix`.
fn lines_starting<'t>(text: &'t str, prefix: &str) -> Vec<&'t str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

/// 192,000 distinct values of a detailed_metric rule: 1,000 (the default cap) get a
/// series of their own, the rest are counted in the rule's own series and in the overflow
/// counter, and `/metrics` stays under 1 MB (about 730 KB here; 321 MB without the cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_metric_series_are_capped_per_rule() {
    // envoy's counting takes a request of any number of descriptors: 1,000 values a call.
    let server = serve("envoy-metrics-cap", &["--compat", "envoy"]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .unwrap();
    const CALLS: usize = 192;
    const PER_CALL: usize = 1_000;
    for call in 0..CALLS {
        let descriptors = (0..PER_CALL)
            .map(|i| RateLimitDescriptor {
                entries: vec![Entry {
                    key: "client".to_owned(),
                    value: format!("c{}", call * PER_CALL + i),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect();
        let request = RateLimitRequest {
            domain: "d".to_owned(),
            descriptors,
            hits_addend: 1,
        };
        client.should_rate_limit(request).await.unwrap();
    }
    let text = metrics(&server);
    assert!(
        text.len() < 1_000_000,
        "/metrics is {} bytes with 192,000 values",
        text.len()
    );
    // 1,000 values of their own, five counters each, in envoy's names and in sluicegate's.
    let own = lines_starting(
        &text,
        r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="client_"#,
    );
    assert_eq!(own.len(), 1_000);
    assert!(own.iter().all(|l| l.ends_with("} 1")), "{own:?}");
    let ours = lines_starting(&text, r#"sluicegate_rule_hits_total{rule="d.client_"#);
    assert_eq!(ours.len(), 5 * 1_000);
    // The other 191,000 in the rule's own series, and counted as overflow.
    let overflow = (CALLS * PER_CALL - 1_000) as u64;
    assert_eq!(
        scraped(&text, r#"domain="d",key1="client""#),
        [overflow, 0, 0, overflow, 0]
    );
    assert!(
        text.contains(&format!(
            "sluicegate_detailed_metric_overflow_total{{rule=\"d.client\"}} {overflow}\n"
        )),
        "{}",
        lines_starting(&text, "sluicegate_detailed").join("\n")
    );
}
