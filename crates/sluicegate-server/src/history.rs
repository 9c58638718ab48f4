//! The last minutes of every rule's counters, for the live page: a sample of each rule's
//! totals every [`SAMPLE_PERIOD`], the last [`SAMPLES`] kept, so the page can draw
//! decisions, refusals, near-limit and shadow hits per second without a time-series
//! database. Bounded: samples × rules × (five counters and the rule's path), the paths
//! being the configuration's (no request value is kept): 120 × rules × (48 bytes + the
//! path's length).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;

use crate::metrics::RuleTotals;

/// How often the counters are sampled.
pub(crate) const SAMPLE_PERIOD: Duration = Duration::from_secs(5);

/// How many samples are kept: ten minutes at one per five seconds.
pub(crate) const SAMPLES: usize = 120;

/// One sample: when it was taken, and each rule's totals then.
#[derive(Debug)]
struct Sample {
    at_us: u64,
    totals: HashMap<String, RuleTotals>,
}

/// A rule's rates between consecutive samples, oldest first: per second, one entry per
/// interval, ending at `at_us`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Series {
    pub(crate) at_us: Vec<u64>,
    pub(crate) decisions: Vec<f64>,
    pub(crate) over_limit: Vec<f64>,
    pub(crate) near_limit: Vec<f64>,
    pub(crate) shadow_mode: Vec<f64>,
}

/// The samples kept.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    /// Records the rules' `totals` as they stand at `at_us`.
    pub(crate) fn record(&self, at_us: u64, totals: HashMap<String, RuleTotals>) {
        let mut samples = self.samples.lock();
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back(Sample { at_us, totals });
    }

    /// The rates of the rule at `path` over the samples kept. A rule missing from a
    /// sample (added by a reload) has no rate for the intervals around it; a counter that
    /// went down (the rule was removed and added again) starts over from its new value.
    pub(crate) fn series(&self, path: &str) -> Series {
        let samples = self.samples.lock();
        let mut series = Series::default();
        for (earlier, later) in samples.iter().zip(samples.iter().skip(1)) {
            let (Some(a), Some(b)) = (earlier.totals.get(path), later.totals.get(path)) else {
                continue;
            };
            let seconds = later.at_us.saturating_sub(earlier.at_us) as f64 / 1e6;
            if seconds <= 0.0 {
                continue;
            }
            let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / seconds;
            series.at_us.push(later.at_us);
            series.decisions.push(rate(a.total, b.total));
            series.over_limit.push(rate(a.over_limit, b.over_limit));
            series.near_limit.push(rate(a.near_limit, b.near_limit));
            series.shadow_mode.push(rate(a.shadow_mode, b.shadow_mode));
        }
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(path: &str, total: u64, over: u64) -> HashMap<String, RuleTotals> {
        HashMap::from([(
            path.to_owned(),
            RuleTotals {
                total,
                over_limit: over,
                within_limit: total - over,
                ..RuleTotals::default()
            },
        )])
    }

    #[test]
    fn rates_are_per_second_between_samples_and_only_the_last_are_kept() {
        let history = History::default();
        history.record(0, totals("a", 0, 0));
        history.record(5_000_000, totals("a", 50, 10));
        history.record(10_000_000, totals("b", 1, 0));
        history.record(15_000_000, totals("b", 2, 0));
        let a = history.series("a");
        assert_eq!(a.at_us, [5_000_000]);
        assert_eq!(a.decisions, [10.0]);
        assert_eq!(a.over_limit, [2.0]);
        assert_eq!(history.series("b").decisions, [0.2]);
        for i in 0..SAMPLES as u64 {
            history.record(20_000_000 + i, totals("a", i, 0));
        }
        // Only "a"'s own samples are left: SAMPLES of them, SAMPLES - 1 intervals.
        assert_eq!(history.series("a").at_us.len(), SAMPLES - 1);
        assert!(history.series("b").at_us.is_empty());
    }
}
