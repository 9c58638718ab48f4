//! The descriptor `limit` override: numbers Envoy sends with a descriptor (from dynamic
//! metadata) in place of the configured ones, as envoyproxy/ratelimit reads them
//! (envoyproxy/ratelimit@f2fb157 src/config/config_impl.go:459-475).
//!
//! An override needs a known domain but no matching rule. It is never in shadow mode,
//! replaces nothing and is replaced by nothing (envoy gives it no name). When a configured
//! rule matches the descriptor, the override is that rule with the override's numbers:
//! the same name in the same domain (and the same algorithm and failure policy), so that
//! it shares the rule's counter once a rule's identity no longer depends on its numbers.
//! When none matches, it is a fixed window (envoy's only algorithm) named as envoy names
//! it, `domain.key_value.key_value` (config_impl.go:679-691).
//!
//! Nothing is kept per override: its rule is built for the request, its state lives in
//! the store under the store's own bounds, and the hits of overrides that match no rule
//! are counted under one metric label per domain, `<domain>.limit_override`, so that the
//! values of requests (which name such an override) never become metric series.

use std::time::Duration;

use sluicegate::{Algorithm, Rule, RuleSpec};

use crate::config::{ConfiguredLimit, Entry, place, with_envoy_counter};

/// A descriptor's `limit`: requests per unit, and the unit as a window in µs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LimitOverride {
    pub(crate) requests_per_unit: u64,
    pub(crate) window: u64,
}

impl LimitOverride {
    /// From Envoy's `RateLimitOverride`: `unit` is an `envoy.type.v3.RateLimitUnit`
    /// number, read as envoy reads it (as the response's unit of the same number:
    /// config_impl.go:461; its length, envoyproxy/ratelimit@f2fb157
    /// src/utils/utilities.go:20-36).
    pub(crate) fn new(requests_per_unit: u32, unit: i32) -> Result<Self, String> {
        const SECOND: u64 = 1_000_000;
        const DAY: u64 = 86_400 * SECOND;
        let window = match unit {
            1 => SECOND,
            2 => 60 * SECOND,
            3 => 3_600 * SECOND,
            4 => DAY,
            5 => 30 * DAY,
            6 => 365 * DAY,
            7 => 7 * DAY,
            other => {
                return Err(format!(
                    "limit.unit: {other} is no unit; expected SECOND (1), MINUTE (2), \
                     HOUR (3), DAY (4), MONTH (5), YEAR (6) or WEEK (7)"
                ));
            }
        };
        Ok(LimitOverride {
            requests_per_unit: u64::from(requests_per_unit),
            window,
        })
    }

    /// The limit this override makes of a descriptor `entries` of `domain` that matched
    /// `configured` (if anything); with `envoy_counters`, counted in envoy's own Redis key
    /// as envoy counts an override: in the descriptor's key, whatever its numbers
    /// (envoyproxy/ratelimit@f2fb157 src/limiter/cache_key.go:49-87).
    pub(crate) fn apply(
        self,
        domain: &str,
        entries: &[Entry],
        configured: Option<&ConfiguredLimit>,
        envoy_counters: bool,
    ) -> Result<ConfiguredLimit, String> {
        let usage = configured.is_some_and(|l| l.usage);
        let configured_rule = configured.and_then(|l| l.rule.as_ref());
        let (name, path, base) = match (configured, configured_rule) {
            (Some(limit), Some(rule)) => (rule.name().to_owned(), limit.path.clone(), Some(rule)),
            _ => {
                let name = envoy_name(domain, entries);
                (name, format!("{domain}.limit_override"), None)
            }
        };
        let rule = if self.requests_per_unit == 0 {
            // As a configured `requests_per_unit: 0`: every request over the limit.
            None
        } else {
            let spec = match base {
                Some(rule) => RuleSpec {
                    limit: self.requests_per_unit,
                    window: Duration::from_micros(self.window),
                    ..rule.spec()
                },
                None => RuleSpec::new(
                    Algorithm::FixedWindow,
                    self.requests_per_unit,
                    Duration::from_micros(self.window),
                ),
            };
            // In the configured rule's place, so that the override counts with it.
            let rule = Rule::new(&name, &spec)
                .map_err(|e| format!("limit: {e}"))?
                .in_scope(&place(domain, &path));
            let rule = match base.and_then(Rule::failure_policy) {
                Some(policy) => rule.with_failure_policy(policy),
                None => rule,
            };
            Some(with_envoy_counter(rule, envoy_counters, usage))
        };
        Ok(ConfiguredLimit {
            block_window: rule.is_none().then_some(self.window),
            shared_values: Vec::new(),
            rule,
            path,
            name: None,
            replaces: Vec::new(),
            shadow_mode: false,
            detailed_metric: false,
            usage,
        })
    }
}

/// envoyproxy/ratelimit's name of a descriptor: `domain.key_value.key`, a value left out
/// when empty.
fn envoy_name(domain: &str, entries: &[Entry]) -> String {
    let mut name = domain.to_owned();
    for entry in entries {
        name.push('.');
        name.push_str(&entry.key);
        if !entry.value.is_empty() {
            name.push('_');
            name.push_str(&entry.value);
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_as_envoy_names_it() {
        let e = |k: &str, v: &str| Entry {
            key: k.into(),
            value: v.into(),
        };
        // envoyproxy/ratelimit@f2fb157 test/config/config_test.go:267-275.
        assert_eq!(
            envoy_name(
                "test-domain",
                &[e("key1", "value1"), e("subkey1", "something")]
            ),
            "test-domain.key1_value1.subkey1_something"
        );
        assert_eq!(envoy_name("d", &[e("k", "")]), "d.k");
    }
}
