//! envoyproxy/ratelimit's per-limit counters — `total_hits`, `over_limit`, `near_limit`,
//! `within_limit`, `shadow_mode` — counted by its rules (src/limiter/base_limiter.go) and
//! written under the names and labels its Prometheus mapping gives them
//! (src/stats/prom/default_mapper.yaml): `ratelimit_service_rate_limit_total_hits{domain,
//! key1[, key2]}`, no `_total` suffix, so its dashboards keep working.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use sluicegate::Decision;

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

/// A limit's labels: `domain`, `key1`, maybe `key2`, with their values.
type Labels = Vec<(&'static str, String)>;

/// Every limit's counters, by its labels, sorted as they are written.
type ByLabels = BTreeMap<Labels, Arc<EnvoyCounters>>;

/// Every limit's counters, and the service's own that envoy's mapping names.
#[derive(Debug, Default)]
pub(crate) struct EnvoyMetrics {
    limits: RwLock<ByLabels>,
    /// `ShouldRateLimit` calls over gRPC.
    grpc_calls: AtomicU64,
}

/// What the service counts elsewhere that envoy's mapping also names.
pub(crate) struct ServiceCounts {
    pub(crate) config_loads: u64,
    pub(crate) config_errors: u64,
}

impl EnvoyMetrics {
    /// The counters of the limit whose stat key (envoy's: `domain.key_value.key…`) is
    /// `key`: created on first use, shared afterwards.
    pub(crate) fn counters(&self, key: &str) -> Arc<EnvoyCounters> {
        let labels = labels(key);
        if let Some(counters) = self.read().get(&labels) {
            return Arc::clone(counters);
        }
        let mut limits = self.limits.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(limits.entry(labels).or_default())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ByLabels> {
        self.limits.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a `ShouldRateLimit` call over gRPC whose request decoded, answered or failed
    /// (`/json` calls are not among them, as in envoy).
    pub(crate) fn grpc_call(&self) {
        self.grpc_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters in Prometheus' text format: the per-limit ones, then
    /// `ratelimit_service_total_requests` and the configuration loads.
    pub(crate) fn render(&self, service: &ServiceCounts, out: &mut String) {
        let mut counter = |name: &str, help: &str, labels: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}.\n# TYPE {name} counter\n{name}{labels} {value}"
            );
        };
        counter(
            "ratelimit_service_total_requests",
            "ShouldRateLimit calls over gRPC",
            "{grpc_method=\"ShouldRateLimit\"}",
            self.grpc_calls.load(Ordering::Relaxed),
        );
        counter(
            "ratelimit_service_config_load_success",
            "Configurations loaded",
            "",
            service.config_loads,
        );
        counter(
            "ratelimit_service_config_load_error",
            "Configurations rejected",
            "",
            service.config_errors,
        );
        let limits = self.read();
        for (i, (name, help)) in COUNTERS.iter().enumerate() {
            let name = format!("ratelimit_service_rate_limit_{name}");
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
            for (labels, counters) in limits.iter() {
                let labels: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                let value = counters.0[i].load(Ordering::Relaxed);
                let _ = writeln!(out, "{name}{{{}}} {value}", labels.join(","));
            }
        }
    }
}

/// The labels envoy's mapping gives a stat key: the statsd name is sanitized as envoy
/// sanitizes it (`:` and `|` to `_`, the dots of IPv4 addresses to `_`), then its first
/// part is the domain, the second key1, the third (when there is one) key2; deeper parts
/// are dropped, as the mapping drops them.
fn labels(key: &str) -> Labels {
    let sanitized = sanitize(key);
    let mut parts = sanitized.split('.');
    let mut labels = vec![("domain", parts.next().unwrap_or_default().to_owned())];
    for name in ["key1", "key2"] {
        if let Some(part) = parts.next() {
            labels.push((name, part.to_owned()));
        }
    }
    labels
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

/// A label value as the text format writes it.
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

    fn decision(allowed: bool, limit: u64, remaining: u64) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            retry_after: RetryAfter::Micros(0),
            reset_after: 0,
            delay: 0,
        }
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
    /// the sum, nothing over by its own hits (it used to overflow).
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
    fn labels_follow_envoys_mapping() {
        let l = |key| labels(key);
        assert_eq!(
            l("d.key_v"),
            [("domain", "d".into()), ("key1", "key_v".into())]
        );
        assert_eq!(
            l("d.a.b_c.e"),
            [
                ("domain", "d".into()),
                ("key1", "a".into()),
                ("key2", "b_c".into())
            ]
        );
        // An address in a value is one part; ':' and '|' are no separators.
        assert_eq!(
            l("d.remote_address_10.0.0.1:80|x"),
            [
                ("domain", "d".into()),
                ("key1", "remote_address_10_0_0_1_80_x".into())
            ]
        );
    }

    #[test]
    fn renders_envoys_names_without_a_suffix() {
        let metrics = EnvoyMetrics::default();
        metrics
            .counters("d.user")
            .count(&decision(true, 10, 9), 1, false, 0.8);
        let mut out = String::new();
        let service = ServiceCounts {
            config_loads: 2,
            config_errors: 1,
        };
        metrics.grpc_call();
        metrics.render(&service, &mut out);
        assert!(
            out.contains("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 1\n")
        );
        assert!(
            out.contains("ratelimit_service_config_load_success 2\n"),
            "{out}"
        );
        assert!(
            out.contains("ratelimit_service_config_load_error 1\n"),
            "{out}"
        );
        assert!(out.contains("# TYPE ratelimit_service_rate_limit_total_hits counter\n"));
        assert!(
            out.contains("ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"user\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "ratelimit_service_rate_limit_within_limit{domain=\"d\",key1=\"user\"} 1\n"
            )
        );
    }
}
