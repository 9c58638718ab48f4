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
//! Each series counts [`SERIES_BYTES`] against the service's memory budget: with the
//! budget spent, a new value overflows as past the cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use sluicegate::BudgetPart;

use super::RuleMetrics;

/// The most `detailed_metric` series a rule holds unless `--max-detailed-series` says:
/// enough for every user of a small tenant or every route of an API to keep a series of
/// its own, while a rule at the cap writes about 0.7 MB of `/metrics` with short values.
pub(crate) const DEFAULT_MAX_DETAILED_SERIES: usize = 1_000;

/// The longest stat key (domain and entries) given a series of its own, in bytes: a
/// Prometheus label of kilobytes is no use on a dashboard, and each series holds its key
/// about a dozen times over (labels, statsd names, the exposition).
pub(crate) const MAX_DETAILED_KEY_BYTES: usize = 256;

/// The least time a series stays after it was last counted in, in µs, however short its
/// rule's window: longer than a scrape interval or a statsd flush, so its last counts are
/// read before it goes.
pub(crate) const MIN_IDLE_US: u64 = 5 * 60 * 1_000_000;

/// What one value's series holds at most, counted against the memory budget: its counters
/// in the family's map, its labels, its envoy stat names and the statsd sink's copies, with
/// a key of [`MAX_DETAILED_KEY_BYTES`] (measured: 192,000 values at the cap of 1,000 per
/// rule hold about 4 MB).
pub(crate) const SERIES_BYTES: usize = 4 * 1024;

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
    /// Where each series' [`SERIES_BYTES`] are counted.
    memory: BudgetPart,
}

impl DetailedSeries {
    pub(crate) fn new(max_per_rule: usize, memory: BudgetPart) -> Self {
        DetailedSeries {
            max_per_rule,
            rules: RwLock::default(),
            memory,
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
        if !fits || rule.values.len() >= self.max_per_rule || !self.memory.try_take(SERIES_BYTES) {
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
        self.memory.give_back(dropped.len() * SERIES_BYTES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use sluicegate::MemoryBudget;

    /// With the memory budget spent, a new value overflows as past the cap; a dropped
    /// series gives its bytes back.
    #[test]
    fn series_count_against_the_memory_budget() {
        let metrics = Metrics::default();
        let budget = MemoryBudget::new(3 * SERIES_BYTES, 1.0).unwrap();
        let series = DetailedSeries::new(100, budget.part("metric_series"));
        let slot = |value: &str, now| {
            let key = format!("d.user_{value}");
            series.slot("d.user", &key, 0, now, |k| metrics.rule_metrics(k))
        };
        for value in ["a", "b", "c"] {
            assert!(matches!(slot(value, 0), Slot::Own(_)), "{value}");
        }
        assert_eq!(budget.used(), 3 * SERIES_BYTES);
        assert!(matches!(slot("d", 0), Slot::Overflow(_)), "no room left");
        assert!(matches!(slot("a", MIN_IDLE_US / 2), Slot::Own(_)), "held");
        let mut forgotten = Vec::new();
        series.expire(MIN_IDLE_US, |key| forgotten.push(key.to_owned()));
        forgotten.sort();
        assert_eq!(forgotten, ["d.user_b", "d.user_c"]);
        assert_eq!(budget.used(), SERIES_BYTES);
        assert!(matches!(slot("d", MIN_IDLE_US), Slot::Own(_)), "room again");
    }
}
