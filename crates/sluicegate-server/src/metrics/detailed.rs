//! The series of `detailed_metric` rules, one per request value, bounded: a client chooses
//! the values, so it would otherwise choose how many series the service holds and writes.
//!
//! Each rule holds at most `max_per_rule` values' series, of stat keys no longer than
//! [`MAX_DETAILED_KEY_BYTES`]. A value past the cap, or with a longer key, is counted in
//! the rule's own series — the stat key envoyproxy/ratelimit gives the rule without
//! `detailed_metric` (its configuration path, `domain.key`), so every mapping and statsd
//! consumer already reads it and no request value can name it — and in the rule's
//! overflow counter. A value's series not counted in for its rule's window, and at least
//! [`MIN_IDLE_US`], is dropped: its counters are forgotten and its slot is free again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::RuleMetrics;

/// The most `detailed_metric` series a rule holds unless `--max-detailed-series` says:
/// enough for every user of a small tenant or every route of an API to keep a series of
/// its own, while a rule at the cap writes about 1 MB of `/metrics` with short values.
pub(crate) const DEFAULT_MAX_DETAILED_SERIES: usize = 1_000;

/// The longest stat key (domain and entries) given a series of its own, in bytes: a
/// Prometheus label of kilobytes is no use on a dashboard, and each series holds its key
/// about a dozen times over (labels, statsd names, the exposition).
pub(crate) const MAX_DETAILED_KEY_BYTES: usize = 256;

/// The least time a series stays after it was last counted in, in µs, however short its
/// rule's window: longer than a scrape interval or a statsd flush, so its last counts are
/// read before it goes.
pub(crate) const MIN_IDLE_US: u64 = 5 * 60 * 1_000_000;

/// One value's series.
#[derive(Debug)]
struct Held {
    metrics: RuleMetrics,
    /// When it was last counted in, µs on the service's clock.
    last_used_us: AtomicU64,
    /// Dropped once idle this long.
    idle_us: u64,
}

/// One rule's series.
#[derive(Debug)]
struct RuleSeries {
    /// The rule's own series: where what overflows is counted.
    own: RuleMetrics,
    values: HashMap<Box<str>, Held>,
}

/// Where a value of a rule is counted.
pub(crate) enum Slot {
    /// In a series of its own.
    Own(RuleMetrics),
    /// In the rule's series, the value being past the cap or too long.
    Overflow(RuleMetrics),
}

/// Every `detailed_metric` rule's series, by rule path.
#[derive(Debug)]
pub(crate) struct DetailedSeries {
    max_per_rule: usize,
    rules: RwLock<HashMap<Box<str>, RuleSeries>>,
}

impl DetailedSeries {
    pub(crate) fn new(max_per_rule: usize) -> Self {
        DetailedSeries {
            max_per_rule,
            rules: RwLock::default(),
        }
    }

    /// Where the value of stat key `key` of the rule at `path`, whose window is `window_us`,
    /// is counted at `now_us`; `make` makes a series' counters from its stat key.
    pub(crate) fn slot(
        &self,
        path: &str,
        key: &str,
        window_us: u64,
        now_us: u64,
        make: impl Fn(&str) -> RuleMetrics,
    ) -> Slot {
        let fits = key.len() <= MAX_DETAILED_KEY_BYTES;
        {
            let rules = self.rules.read();
            if let Some(rule) = rules.get(path) {
                if let Some(held) = rule.values.get(key) {
                    held.last_used_us.fetch_max(now_us, Ordering::Relaxed);
                    return Slot::Own(held.metrics.clone());
                }
                if !fits || rule.values.len() >= self.max_per_rule {
                    return Slot::Overflow(rule.own.clone());
                }
            }
        }
        let mut rules = self.rules.write();
        let rule = rules.entry(path.into()).or_insert_with(|| RuleSeries {
            own: make(path),
            values: HashMap::new(),
        });
        if let Some(held) = rule.values.get(key) {
            held.last_used_us.fetch_max(now_us, Ordering::Relaxed);
            return Slot::Own(held.metrics.clone());
        }
        if !fits || rule.values.len() >= self.max_per_rule {
            return Slot::Overflow(rule.own.clone());
        }
        let metrics = make(key);
        rule.values.insert(
            key.into(),
            Held {
                metrics: metrics.clone(),
                last_used_us: AtomicU64::new(now_us),
                idle_us: window_us.max(MIN_IDLE_US),
            },
        );
        Slot::Own(metrics)
    }

    /// Drops the series idle at `now_us` (and the rules left with none), and hands each
    /// dropped series' stat key to `forget`, once its counters are no longer held here.
    pub(crate) fn expire(&self, now_us: u64, mut forget: impl FnMut(&str)) {
        let mut dropped = Vec::new();
        {
            let mut rules = self.rules.write();
            for rule in rules.values_mut() {
                let idle: Vec<Box<str>> = rule
                    .values
                    .iter()
                    .filter(|(_, held)| {
                        now_us.saturating_sub(held.last_used_us.load(Ordering::Relaxed))
                            >= held.idle_us
                    })
                    .map(|(key, _)| key.clone())
                    .collect();
                for key in &idle {
                    rule.values.remove(key);
                }
                dropped.extend(idle);
            }
            rules.retain(|_, rule| !rule.values.is_empty());
        }
        for key in &dropped {
            forget(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use sluicegate::{
        AnyStore, Clock, Limiter, LimiterConfig, ManualClock, MemoryStore, MemoryStoreConfig,
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
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
        let clock = ManualClock::new(1_000_000_000);
        let (service, address) = serve(&clock, 2).await;
        check(&address, "client", &["a", "b", "c", "a"]).await;
        let long = "x".repeat(MAX_DETAILED_KEY_BYTES);
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
        clock.advance(240_000_000);
        check(&address, "client", &["a"]).await;
        clock.advance(60_000_000);
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
        clock.advance(3_600_000_000);
        service.expire_detailed_series();
        let text = call(&address, "GET", "/metrics", "").await;
        assert!(!text.contains("client_"), "{text}");
        assert_eq!(value(&text, &hits("d.client")), Some(2));
    }
}
