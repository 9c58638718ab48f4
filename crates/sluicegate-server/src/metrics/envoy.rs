//! envoyproxy/ratelimit's statistics, under its statsd names (src/stats/manager_impl.go,
//! src/metrics/metrics.go): each limit's `total_hits`, `over_limit`, `near_limit`,
//! `within_limit` and `shadow_mode`, counted by its rules (src/limiter/base_limiter.go), and
//! the service's own — gRPC calls, their errors and response times, configuration loads.
//! The one list of them: the statsd sink sends it, the Prometheus mapping names it in
//! `/metrics`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use sluicegate::Decision;
use tokio::sync::mpsc;

/// The counters, in the order they are written.
const COUNTERS: [(&str, &str); 5] = [
    ("total_hits", "Hits of a limit"),
    ("over_limit", "Hits over a limit"),
    (
        "near_limit",
        "Hits past NEAR_LIMIT_RATIO of a limit, within or over it",
    ),
    ("within_limit", "Hits within a limit"),
    (
        "shadow_mode",
        "Hits over a limit in shadow mode, let through",
    ),
];

/// One limit's counters, by [`COUNTERS`]' order.
#[derive(Debug, Default)]
pub(crate) struct EnvoyCounters([AtomicU64; 5]);

impl EnvoyCounters {
    fn add(&self, which: usize, hits: u64) {
        if hits > 0 {
            self.0[which].fetch_add(hits, Ordering::Relaxed);
        }
    }

    /// Counts `hits` hits decided by `decision` as envoyproxy/ratelimit counts them
    /// (base_limiter.go:122-240): every hit is a total hit; over the limit, the hits past
    /// it are over and those between the near threshold and the limit near; within it,
    /// all are within and those past the near threshold near too; in shadow mode the hits
    /// over are also shadow hits. The limit is the decision's, and the units used before
    /// and after are read from what remains.
    pub(crate) fn count(&self, decision: &Decision, hits: u64, shadow: bool, near_ratio: f32) {
        let limit = decision.limit;
        // envoy's floor(float32(limit) * float32(ratio)), in its float32 arithmetic.
        let near = (limit as f32 * near_ratio).floor() as u64;
        self.add(0, hits);
        if decision.allowed {
            let after = limit.saturating_sub(decision.remaining);
            let before = after.saturating_sub(hits);
            self.add(3, hits);
            if after > near {
                self.add(2, after - before.max(near));
            }
        } else {
            // Nothing was taken: what remains is what remained before.
            let before = limit.saturating_sub(decision.remaining);
            let after = before + hits;
            // Its own hits may stop short of the limit: a descriptor listed twice is
            // refused for their sum (`--stop-increment-when-over-limit`).
            let over = if before >= limit {
                hits
            } else {
                after.saturating_sub(limit)
            };
            self.add(1, over);
            if before < limit {
                self.add(2, limit - before.max(near));
            }
            if shadow {
                self.add(4, over);
            }
        }
    }
}

/// Every limit's counters, by its stat key (sanitized), sorted as they are written.
type ByKey = BTreeMap<String, Arc<EnvoyCounters>>;

/// The statsd name of `ShouldRateLimit`'s response time (envoy's timer, in whole
/// milliseconds: src/metrics/metrics.go).
pub(crate) const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

/// What kind of statistic a name is, as statsd and a mapping's `match_metric_type` tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatKind {
    /// Counted up; sent as the change since the last flush.
    Counter,
    /// A timer's samples.
    Observer,
}

/// Every name the service's statistics can have, with `{key}` for a limit's stat key (a
/// domain and one or more descriptor parts): what a mapping may ask for.
pub(crate) const EXPORTED: [(&str, StatKind); 11] = [
    (
        "ratelimit.service.rate_limit.{key}.total_hits",
        StatKind::Counter,
    ),
    (
        "ratelimit.service.rate_limit.{key}.over_limit",
        StatKind::Counter,
    ),
    (
        "ratelimit.service.rate_limit.{key}.near_limit",
        StatKind::Counter,
    ),
    (
        "ratelimit.service.rate_limit.{key}.within_limit",
        StatKind::Counter,
    ),
    (
        "ratelimit.service.rate_limit.{key}.shadow_mode",
        StatKind::Counter,
    ),
    ("ratelimit.service.config_load_success", StatKind::Counter),
    ("ratelimit.service.config_load_error", StatKind::Counter),
    (
        "ratelimit.service.call.should_rate_limit.redis_error",
        StatKind::Counter,
    ),
    (
        "ratelimit.service.call.should_rate_limit.service_error",
        StatKind::Counter,
    ),
    (
        "ratelimit_server.ShouldRateLimit.total_requests",
        StatKind::Counter,
    ),
    (RESPONSE_TIME, StatKind::Observer),
];

/// One counter as it stands, under its statsd name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CounterStat {
    pub(crate) name: String,
    pub(crate) help: &'static str,
    pub(crate) value: u64,
}

/// Why a `ShouldRateLimit` call failed, as envoy counts it
/// (`ratelimit.service.call.should_rate_limit.*`, src/service/ratelimit.go).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The store failed (envoy's `redis_error`).
    Store,
    /// The request or the configuration in force did not allow an answer
    /// (`service_error`).
    Service,
}

/// Every limit's counters, and the service's own that envoy also counts.
#[derive(Debug)]
pub(crate) struct EnvoyMetrics {
    limits: RwLock<ByKey>,
    /// `ShouldRateLimit` calls over gRPC.
    grpc_calls: AtomicU64,
    store_errors: AtomicU64,
    service_errors: AtomicU64,
    response_times: ResponseTimes,
}

/// What the service counts elsewhere that envoy also counts.
pub(crate) struct ServiceCounts {
    pub(crate) config_loads: u64,
    pub(crate) config_errors: u64,
}

impl EnvoyMetrics {
    /// The counters, with response times counted at each of `thresholds_ms` (what the
    /// Prometheus mapping's buckets come to in whole milliseconds).
    pub(crate) fn new(thresholds_ms: Vec<u64>) -> Self {
        EnvoyMetrics {
            limits: RwLock::default(),
            grpc_calls: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            service_errors: AtomicU64::new(0),
            response_times: ResponseTimes::new(thresholds_ms),
        }
    }

    /// The counters of the limit whose stat key (envoy's: `domain.key_value.key…`) is
    /// `key`: created on first use, shared afterwards.
    pub(crate) fn counters(&self, key: &str) -> Arc<EnvoyCounters> {
        let key = sanitize(key);
        if let Some(counters) = self.read().get(&key) {
            return Arc::clone(counters);
        }
        let mut limits = self.limits.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(limits.entry(key).or_default())
    }

    /// Forgets the counters of stat key `key` unless something still counts in them (two
    /// keys may sanitize alike, and a configured rule's path may be a detailed key too).
    pub(crate) fn forget(&self, key: &str) {
        let key = sanitize(key);
        let mut limits = self.limits.write().unwrap_or_else(|e| e.into_inner());
        if limits.get(&key).is_some_and(|c| Arc::strong_count(c) == 1) {
            limits.remove(&key);
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ByKey> {
        self.limits.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a `ShouldRateLimit` call over gRPC whose request decoded (`/json` calls are
    /// not among them, as in envoy).
    pub(crate) fn grpc_call(&self) {
        self.grpc_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a `ShouldRateLimit` call answered after `took`, failed with `error` if it
    /// failed.
    pub(crate) fn grpc_answered(&self, took: Duration, error: Option<CallError>) {
        match error {
            Some(CallError::Store) => self.store_errors.fetch_add(1, Ordering::Relaxed),
            Some(CallError::Service) => self.service_errors.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
        // Whole milliseconds, as envoy's interceptor takes them.
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        self.response_times.observe(ms);
    }

    /// The response times counted so far.
    pub(crate) fn response_times(&self) -> &ResponseTimes {
        &self.response_times
    }

    /// Every counter as it stands, under envoy's statsd names: the service's own, then
    /// each limit's, by its key.
    pub(crate) fn counter_stats(&self, service: &ServiceCounts) -> Vec<CounterStat> {
        let stat = |name: &str, help, value| CounterStat {
            name: name.to_owned(),
            help,
            value,
        };
        let mut stats = vec![
            stat(
                "ratelimit_server.ShouldRateLimit.total_requests",
                "ShouldRateLimit calls over gRPC",
                self.grpc_calls.load(Ordering::Relaxed),
            ),
            stat(
                "ratelimit.service.config_load_success",
                "Configurations loaded",
                service.config_loads,
            ),
            stat(
                "ratelimit.service.config_load_error",
                "Configurations rejected",
                service.config_errors,
            ),
            stat(
                "ratelimit.service.call.should_rate_limit.redis_error",
                "ShouldRateLimit calls the store failed",
                self.store_errors.load(Ordering::Relaxed),
            ),
            stat(
                "ratelimit.service.call.should_rate_limit.service_error",
                "ShouldRateLimit calls answered with an error other than the store's",
                self.service_errors.load(Ordering::Relaxed),
            ),
        ];
        for (key, counters) in self.read().iter() {
            for (i, (name, help)) in COUNTERS.iter().enumerate() {
                stats.push(CounterStat {
                    name: format!("ratelimit.service.rate_limit.{key}.{name}"),
                    help,
                    value: counters.0[i].load(Ordering::Relaxed),
                });
            }
        }
        stats
    }
}

/// `ShouldRateLimit`'s response times in whole milliseconds, counted at fixed thresholds
/// (the histogram's buckets, known at start), and handed to the statsd sink when one
/// listens.
#[derive(Debug)]
pub(crate) struct ResponseTimes {
    /// Sorted, without repeats.
    thresholds: Vec<u64>,
    /// `counts[i]`: the times above `thresholds[i - 1]` and at most `thresholds[i]`; the
    /// last, those above every threshold.
    counts: Vec<AtomicU64>,
    sum_ms: AtomicU64,
    /// The statsd sink's queue, bounded: a full queue drops the sample rather than wait.
    statsd: OnceLock<mpsc::Sender<u64>>,
}

impl ResponseTimes {
    fn new(mut thresholds: Vec<u64>) -> Self {
        thresholds.sort_unstable();
        thresholds.dedup();
        let counts = (0..=thresholds.len()).map(|_| AtomicU64::new(0)).collect();
        ResponseTimes {
            thresholds,
            counts,
            sum_ms: AtomicU64::new(0),
            statsd: OnceLock::new(),
        }
    }

    fn observe(&self, ms: u64) {
        let slot = self.thresholds.partition_point(|&t| t < ms);
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_ms.fetch_add(ms, Ordering::Relaxed);
        if let Some(queue) = self.statsd.get() {
            let _ = queue.try_send(ms);
        }
    }

    /// Hands every time from now on to a statsd sink, through a queue of `capacity`;
    /// `None` if one already has them.
    pub(crate) fn send_to_statsd(&self, capacity: usize) -> Option<mpsc::Receiver<u64>> {
        let (queue, times) = mpsc::channel(capacity);
        self.statsd.set(queue).ok().map(|()| times)
    }

    /// How many times were counted.
    pub(crate) fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Their sum, in milliseconds.
    pub(crate) fn sum_ms(&self) -> u64 {
        self.sum_ms.load(Ordering::Relaxed)
    }

    /// How many times were at most `threshold` ms, one of the thresholds counted at.
    pub(crate) fn at_most(&self, threshold: u64) -> u64 {
        let slots = self.thresholds.partition_point(|&t| t <= threshold);
        self.counts[..slots]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// envoyproxy/ratelimit's SanitizeStatName (src/utils/utilities.go:63-69).
fn sanitize(key: &str) -> String {
    let replaced = key.replace([':', '|'], "_");
    let bytes = replaced.as_bytes();
    let mut out = String::with_capacity(replaced.len());
    let mut i = 0;
    while i < bytes.len() {
        match ipv4_at(&bytes[i..]) {
            Some(len) => {
                out.push_str(&replaced[i..i + len].replace('.', "_"));
                i += len;
            }
            None => {
                let next = replaced[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&replaced[i..i + next]);
                i += next;
            }
        }
    }
    out
}

/// The length of `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` at the start of `text`, the regex
/// envoy uses (greedy, as Go's leftmost-first match takes it).
fn ipv4_at(text: &[u8]) -> Option<usize> {
    let mut at = 0;
    for group in 0..4 {
        if group > 0 {
            if text.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
        let digits = text[at..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        at += digits;
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluicegate::RetryAfter;

    fn decision(allowed: bool, limit: u64, remaining: u64) -> Decision {
        Decision::new(
            allowed,
            limit,
            remaining,
            RetryAfter::After(Duration::ZERO),
            Duration::ZERO,
            Duration::ZERO,
        )
    }

    fn counts(counters: &EnvoyCounters) -> [u64; 5] {
        std::array::from_fn(|i| counters.0[i].load(Ordering::Relaxed))
    }

    /// base_limiter_test.go's cases: limit 10, near threshold 8.
    #[test]
    fn hits_are_counted_as_envoy_counts_them() {
        let c = EnvoyCounters::default();
        // 0 → 5 of 10: within.
        c.count(&decision(true, 10, 5), 5, false, 0.8);
        assert_eq!(counts(&c), [5, 0, 0, 5, 0]);
        // 5 → 9: within, one past the near threshold of 8.
        c.count(&decision(true, 10, 1), 4, false, 0.8);
        assert_eq!(counts(&c), [9, 0, 1, 9, 0]);
        // 9 → 12: refused; 2 over, 1 near (9 to 10).
        c.count(&decision(false, 10, 1), 3, false, 0.8);
        assert_eq!(counts(&c), [12, 2, 2, 9, 0]);
        // Already at the limit: every hit over; in shadow mode, shadow hits too.
        c.count(&decision(false, 10, 0), 2, true, 0.8);
        assert_eq!(counts(&c), [14, 4, 2, 9, 2]);
        // A block (limit 0): every hit over.
        let block = EnvoyCounters::default();
        block.count(&decision(false, 0, 0), 3, false, 0.8);
        assert_eq!(counts(&block), [3, 3, 0, 0, 0]);
    }

    /// One of two descriptors on the same key, 3 hits each against a limit of 5: refused for
    /// the sum, nothing over by its own hits (the count after them is short of the limit: no
    /// overflow in working out what is over).
    #[test]
    fn a_refusal_short_of_the_limit_counts_nothing_over() {
        let c = EnvoyCounters::default();
        c.count(&decision(false, 5, 5), 3, false, 0.8);
        assert_eq!(counts(&c), [3, 0, 1, 0, 0]);
    }

    /// A look of 0 hits counts none, below, at and past the limit, as envoy adds its 0
    /// (envoyproxy/ratelimit@f2fb157 test/redis/fixed_cache_impl_test.go:139-142).
    #[test]
    fn a_look_of_no_hits_counts_nothing() {
        let c = EnvoyCounters::default();
        for d in [
            decision(true, 10, 1),
            decision(true, 10, 0),
            decision(false, 10, 0),
        ] {
            c.count(&d, 0, true, 0.8);
        }
        assert_eq!(counts(&c), [0; 5]);
    }

    #[test]
    fn stat_keys_are_sanitized_as_envoys() {
        let metrics = EnvoyMetrics::new(vec![]);
        metrics.counters("d.remote_address_10.0.0.1:80|x");
        let stats = metrics.counter_stats(&ServiceCounts {
            config_loads: 1,
            config_errors: 0,
        });
        assert!(
            stats.iter().any(|s| s.name
                == "ratelimit.service.rate_limit.d.remote_address_10_0_0_1_80_x.total_hits")
        );
    }

    #[test]
    fn response_times_count_at_their_thresholds() {
        let metrics = EnvoyMetrics::new(vec![5, 1, 5]);
        for ms in [0, 1, 2, 7] {
            metrics.grpc_answered(Duration::from_millis(ms), None);
        }
        let times = metrics.response_times();
        assert_eq!((times.at_most(1), times.at_most(5)), (2, 3));
        assert_eq!((times.count(), times.sum_ms()), (4, 10));
    }
}
