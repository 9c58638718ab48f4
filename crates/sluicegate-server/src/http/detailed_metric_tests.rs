//! `detailed_metric` series through the HTTP API on a real socket, on a manual clock: the
//! cap per rule, the overflow into the rule's own series, and idle series dropped.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluicegate::{
    AnyStore, Clock, Limiter, LimiterConfig, ManualClock, MemoryStore, MemoryStoreConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::{Config, DEFAULT_ALGORITHM, LoadOptions};
use crate::metrics::EnvoyStatsOptions;
use crate::service::{Service, ServiceOptions};

/// A detailed_metric rule of a one-minute window, and a plain one.
const RULES: &str = "domain: d
descriptors:
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
";

/// The service on a manual clock, its HTTP API served on a loopback port of its own.
async fn serve(clock: &ManualClock, max_series: usize) -> (Arc<Service>, String) {
    let config = Config::parse(
        Path::new("rules.yaml"),
        RULES,
        LoadOptions::new(DEFAULT_ALGORITHM),
    )
    .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let store = MemoryStore::new(MemoryStoreConfig::default(), Arc::clone(&clock));
    let limiter = Limiter::with_clock(AnyStore::Memory(store), LimiterConfig::default(), clock);
    let options = ServiceOptions {
        envoy_stats: EnvoyStatsOptions {
            max_detailed_series: max_series,
            ..EnvoyStatsOptions::default()
        },
        ..ServiceOptions::default()
    };
    let service = Arc::new(Service::new(config, Arc::new(limiter), options));
    let app = crate::http::app(
        Arc::clone(&service),
        crate::telemetry::Telemetry::default(),
        false,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (service, address)
}

/// One HTTP/1.1 request on a connection of its own: the body of the answer.
async fn call(address: &str, method: &str, path: &str, body: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// A check of one descriptor per value of `key`.
async fn check(address: &str, key: &str, values: &[&str]) {
    let descriptors: Vec<_> = values
        .iter()
        .map(|v| serde_json::json!({"entries": [{"key": key, "value": v}]}))
        .collect();
    let body = serde_json::json!({"domain": "d", "descriptors": descriptors});
    call(address, "POST", "/v1/check", &body.to_string()).await;
}

/// The value of the series `name` in the exposition `text`, if it is there.
fn value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn values_past_the_cap_overflow_and_idle_series_are_dropped() {
    let clock = ManualClock::new(Duration::from_secs(1000));
    let (service, address) = serve(&clock, 2).await;
    check(&address, "client", &["a", "b", "c", "a"]).await;
    // Longer than the 256 bytes a value's stat key may have.
    let long = "x".repeat(300);
    check(&address, "client", &[&long]).await;
    check(&address, "user", &["u"]).await;
    let text = call(&address, "GET", "/metrics", "").await;
    let hits =
        |rule: &str| format!("sluicegate_rule_hits_total{{rule=\"{rule}\",result=\"total\"}}");
    assert_eq!(value(&text, &hits("d.client_a")), Some(2));
    assert_eq!(value(&text, &hits("d.client_b")), Some(1));
    // c came past the cap of two, the long value past the longest key: the rule's own.
    assert_eq!(value(&text, &hits("d.client_c")), None);
    assert_eq!(value(&text, &hits("d.client")), Some(2));
    assert_eq!(
        value(
            &text,
            "sluicegate_detailed_metric_overflow_total{rule=\"d.client\"}"
        ),
        Some(2)
    );
    assert_eq!(
        value(
            &text,
            "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"client_a\"}"
        ),
        Some(2)
    );
    // a is counted in again four minutes on; b is not. Five minutes after b's last
    // count (longer than the rule's minute), b goes, and its slot takes c.
    clock.advance(Duration::from_secs(240));
    check(&address, "client", &["a"]).await;
    clock.advance(Duration::from_secs(60));
    service.expire_detailed_series();
    let text = call(&address, "GET", "/metrics", "").await;
    assert_eq!(value(&text, &hits("d.client_a")), Some(3));
    assert_eq!(value(&text, &hits("d.client_b")), None);
    assert!(!text.contains("client_b"), "{text}");
    // The plain rule and the rule's own series stay.
    assert_eq!(value(&text, &hits("d.user")), Some(1));
    assert_eq!(value(&text, &hits("d.client")), Some(2));
    check(&address, "client", &["c"]).await;
    let text = call(&address, "GET", "/metrics", "").await;
    assert_eq!(value(&text, &hits("d.client_c")), Some(1));
    // Long after, every value's series is gone.
    clock.advance(Duration::from_secs(3600));
    service.expire_detailed_series();
    let text = call(&address, "GET", "/metrics", "").await;
    assert!(!text.contains("client_"), "{text}");
    assert_eq!(value(&text, &hits("d.client")), Some(2));
}
