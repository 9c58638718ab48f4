//! Prometheus metrics, written in the text exposition format at `GET /metrics`.
//!
//! A registry of its own per service rather than the `metrics` facade's process-global
//! recorder: every server (and every test's server) counts only its own traffic, and the
//! whole exporter is the few lines below.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluicegate::{AnyStore, BreakerState, DecidedBy, Decision, Limiter};

/// Upper bounds (seconds) of the store latency histogram's buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// A decision counts as near the limit when at most this share of the limit remains
/// (envoyproxy/ratelimit's near_limit, at its default 80 % threshold).
const NEAR_LIMIT_SHARE: f64 = 0.2;

#[derive(Default)]
struct RuleCounters {
    total: u64,
    over_limit: u64,
    near_limit: u64,
    within_limit: u64,
    /// Over the limit, but in shadow mode: let through.
    shadow_mode: u64,
}

/// Everything the service counts.
#[derive(Default)]
pub(crate) struct Metrics {
    rules: Mutex<BTreeMap<String, RuleCounters>>,
    decided_by: Mutex<BTreeMap<&'static str, u64>>,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
    pub(crate) config_loads: AtomicU64,
    pub(crate) config_errors: AtomicU64,
}

impl Metrics {
    /// Counts one rule's decision.
    pub(crate) fn rule(&self, path: &str, decision: &Decision, shadow: bool) {
        let mut rules = self
            .rules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let counters = match rules.get_mut(path) {
            Some(c) => c,
            None => rules.entry(path.to_owned()).or_default(),
        };
        counters.total += 1;
        if !decision.allowed && shadow {
            counters.shadow_mode += 1;
        } else if !decision.allowed {
            counters.over_limit += 1;
        } else if decision.remaining as f64 <= decision.limit as f64 * NEAR_LIMIT_SHARE {
            counters.near_limit += 1;
        } else {
            counters.within_limit += 1;
        }
    }

    /// Counts who decided a check, and how long the limiter took.
    pub(crate) fn check(&self, decided_by: DecidedBy, took: Duration) {
        *self
            .decided_by
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(decided_by.name())
            .or_default() += 1;
        let seconds = took.as_secs_f64();
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.latency_sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// The text exposition, with the limiter's own counters read now.
    pub(crate) fn render(&self, limiter: &Limiter<AnyStore>) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            "sluicegate_rule_hits_total",
            "counter",
            "Decisions per rule, by result.",
        );
        let rules = self
            .rules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (path, c) in rules.iter() {
            let rule = escape(path);
            for (result, n) in [
                ("total", c.total),
                ("over_limit", c.over_limit),
                ("near_limit", c.near_limit),
                ("within_limit", c.within_limit),
                ("shadow_mode", c.shadow_mode),
            ] {
                let _ = writeln!(
                    out,
                    "sluicegate_rule_hits_total{{rule=\"{rule}\",result=\"{result}\"}} {n}"
                );
            }
        }
        drop(rules);
        let _ = writeln!(
            out,
            "# HELP sluicegate_decisions_total Checks, by who decided them.\n# TYPE sluicegate_decisions_total counter"
        );
        let decided = self
            .decided_by
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (by, n) in decided.iter() {
            let _ = writeln!(out, "sluicegate_decisions_total{{decided_by=\"{by}\"}} {n}");
        }
        drop(decided);
        let stats = limiter.stats();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let breaker = match limiter.breaker_state() {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        };
        let mut single_values = vec![
            (
                "sluicegate_store_errors_total",
                "counter",
                "Checks the store failed (errors, timeouts, open breaker).",
                load(&stats.store_errors),
            ),
            (
                "sluicegate_negative_cache_hits_total",
                "counter",
                "Refusals answered by the negative cache.",
                load(&stats.negative_cache_hits),
            ),
            (
                "sluicegate_fallback_decisions_total",
                "counter",
                "Checks decided by a store-failure policy.",
                load(&stats.fallback_decisions),
            ),
            (
                "sluicegate_breaker_state",
                "gauge",
                "Circuit breaker: 0 closed, 1 open, 2 half-open.",
                breaker,
            ),
            (
                "sluicegate_config_loads_total",
                "counter",
                "Configurations loaded.",
                load(&self.config_loads),
            ),
            (
                "sluicegate_config_errors_total",
                "counter",
                "Configurations rejected.",
                load(&self.config_errors),
            ),
        ];
        if let AnyStore::Redis(redis) = limiter.store() {
            let sent = redis.script_calls();
            single_values.extend([
                (
                    "sluicegate_redis_script_calls_total",
                    "counter",
                    "Check-script calls sent to Redis.",
                    sent.calls,
                ),
                (
                    "sluicegate_redis_script_checks_total",
                    "counter",
                    "Checks those calls carried: under load several share a call.",
                    sent.checks,
                ),
            ]);
        }
        for (name, kind, help, value) in single_values {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP sluicegate_check_duration_seconds Time to decide a check (store call included).\n# TYPE sluicegate_check_duration_seconds histogram"
        );
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            let _ = writeln!(
                out,
                "sluicegate_check_duration_seconds_bucket{{le=\"{bound}\"}} {}",
                load(bucket)
            );
        }
        let count = load(&self.latency_count);
        let _ = writeln!(
            out,
            "sluicegate_check_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "sluicegate_check_duration_seconds_sum {}",
            load(&self.latency_sum_micros) as f64 / 1e6
        );
        let _ = writeln!(out, "sluicegate_check_duration_seconds_count {count}");
        out
    }
}

/// A label value: backslash, double quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluicegate::RetryAfter;

    fn decision(allowed: bool, remaining: u64) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            retry_after: RetryAfter::Micros(0),
            reset_after: 0,
            delay: 0,
        }
    }

    #[test]
    fn renders_counters_histogram_and_escapes_labels() {
        let metrics = Metrics::default();
        metrics.rule("d.user", &decision(true, 9), false);
        metrics.rule("d.user", &decision(true, 1), false);
        metrics.rule("d.user", &decision(false, 0), false);
        metrics.rule("d.user", &decision(false, 0), true);
        metrics.rule("d.\"odd\"", &decision(true, 5), false);
        metrics.check(DecidedBy::Store, Duration::from_micros(300));
        let limiter = Limiter::new(AnyStore::Memory(Default::default()));
        let text = metrics.render(&limiter);
        for line in [
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"total\"} 4",
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"shadow_mode\"} 1",
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"over_limit\"} 1",
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"near_limit\"} 1",
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"within_limit\"} 1",
            "sluicegate_rule_hits_total{rule=\"d.\\\"odd\\\"\",result=\"total\"} 1",
            "sluicegate_decisions_total{decided_by=\"store\"} 1",
            "sluicegate_check_duration_seconds_bucket{le=\"0.00025\"} 0",
            "sluicegate_check_duration_seconds_bucket{le=\"0.0005\"} 1",
            "sluicegate_check_duration_seconds_count 1",
            "sluicegate_breaker_state 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // Script calls are a Redis store's.
        assert!(!text.contains("sluicegate_redis_script"), "{text}");
    }
}
