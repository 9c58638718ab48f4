//! Exact sliding-window log: the timestamps of admitted units, kept
//! for one window. The window at `t` is `(t − W, t]`.

use std::collections::VecDeque;

use super::retry::RetryNeed;
use crate::decision::{Decision, RetryAfter};
use crate::rule::Rule;

/// Admitted units, oldest first, with equal timestamps merged into one run: a check of
/// cost c adds one run, so memory is bounded by the number of checks still live (≤ L).
#[derive(Clone, Debug, Default)]
pub(crate) struct SlidingLogState {
    runs: VecDeque<Run>,
    /// Units across every run.
    live: u64,
}

#[derive(Clone, Copy, Debug)]
struct Run {
    at: u64,
    units: u64,
}

/// What a check at one instant found: `n` live units, after the expired runs at the front.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogPlan {
    live: u64,
    expired_runs: usize,
}

impl SlidingLogState {
    /// The bytes of the runs' buffer.
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.runs.capacity() * size_of::<Run>()
    }

    /// Counts the live units (an entry `s` with `s ≤ t − W` has expired). Reads only: the
    /// expired runs are dropped when the next admission writes, so a refused check changes
    /// nothing, even for a later check that carries an earlier time.
    pub(crate) fn plan(&self, rule: &Rule, now: u64) -> LogPlan {
        let window = rule.window_micros();
        // Usually nothing has expired since the last admission dropped what had: one look at
        // the oldest run settles it without a binary search across the buffer.
        let expired_runs = match self.runs.front() {
            Some(oldest) if oldest.at + window <= now => {
                self.runs.partition_point(|run| run.at + window <= now)
            }
            _ => 0,
        };
        let expired: u64 = self.runs.range(..expired_runs).map(|run| run.units).sum();
        LogPlan {
            live: self.live - expired,
            expired_runs,
        }
    }

    pub(crate) fn fits(plan: LogPlan, rule: &Rule, units: u64) -> bool {
        plan.live + units <= rule.limit()
    }

    /// The answer to a check of `units` that is allowed at `now`.
    pub(crate) fn allowed(rule: &Rule, plan: LogPlan, units: u64) -> Decision {
        Decision {
            allowed: true,
            limit: rule.limit(),
            remaining: rule.limit() - plan.live - units,
            retry_after: RetryAfter::micros(0),
            reset_after: rule.window_micros(),
            delay: 0,
        }
    }

    /// Records `cost` units at `now`, dropping the expired runs, and keeps only the newest L
    /// live units: a report can go past the limit, and no decision can tell the older ones
    /// from absent ones (docs/SPEC.md, "Usage", debt).
    pub(crate) fn record(&mut self, rule: &Rule, plan: LogPlan, now: u64, cost: u64) {
        self.drop_expired(plan);
        match self.runs.back_mut() {
            Some(run) if run.at == now => run.units += cost,
            _ => self.runs.push_back(Run {
                at: now,
                units: cost,
            }),
        }
        self.live += cost;
        while let Some(excess) = self.live.checked_sub(rule.limit()).filter(|&e| e > 0) {
            let oldest = self.runs.front_mut().expect("live units are held in runs");
            if oldest.units > excess {
                oldest.units -= excess;
                self.live -= excess;
            } else {
                self.live -= oldest.units;
                self.runs.pop_front();
            }
        }
    }

    /// Gives back up to `units` of the live units, newest first, after dropping the
    /// expired; whether there was any to give back (else nothing is dropped either).
    pub(crate) fn refund(&mut self, plan: LogPlan, units: u64) -> bool {
        if plan.live == 0 {
            return false;
        }
        self.drop_expired(plan);
        let mut left = units;
        while left > 0
            && let Some(newest) = self.runs.back_mut()
        {
            let taken = newest.units.min(left);
            newest.units -= taken;
            self.live -= taken;
            left -= taken;
            if newest.units == 0 {
                self.runs.pop_back();
            }
        }
        true
    }

    /// Gives back `units` of the entries at `at` of a reservation of `reserved` units, if
    /// `at` is still live and at least `reserved` entries at `at` still are, after dropping
    /// the expired; whether it gave any back. Fewer means a trim into debt or a refund took
    /// some, and whose they were can no longer be told: giving back then could hand out
    /// another admission's units (docs/SPEC.md, "Settle").
    pub(crate) fn give_back(
        &mut self,
        rule: &Rule,
        plan: LogPlan,
        now: u64,
        at: u64,
        units: u64,
        reserved: u64,
    ) -> bool {
        let Some(held) = self
            .run_at(at)
            .filter(|&i| self.runs[i].units >= reserved && at + rule.window_micros() > now)
        else {
            return false;
        };
        self.drop_expired(plan);
        // A live run is not among the expired ones dropped in front of it.
        let run = &mut self.runs[held - plan.expired_runs];
        let taken = run.units.min(units);
        run.units -= taken;
        self.live -= taken;
        if run.units == 0 {
            self.runs.remove(held - plan.expired_runs);
        }
        true
    }

    /// The index of the run at `at`, if one is held (runs are in time order, one per time).
    fn run_at(&self, at: u64) -> Option<usize> {
        let i = self.runs.partition_point(|run| run.at < at);
        self.runs.get(i).filter(|run| run.at == at).map(|_| i)
    }

    /// The time of the newest entry held, if any.
    pub(crate) fn newest(&self) -> Option<u64> {
        self.runs.back().map(|run| run.at)
    }

    fn drop_expired(&mut self, plan: LogPlan) {
        for run in self.runs.drain(..plan.expired_runs) {
            self.live -= run.units;
        }
    }

    /// Answers without recording; `retry_after` is `e_k + W − t` with `k = n + c − L`.
    pub(crate) fn refuse(
        &self,
        rule: &Rule,
        plan: LogPlan,
        now: u64,
        retry: RetryNeed,
    ) -> Decision {
        let window = rule.window_micros();
        let retry_after = match retry {
            RetryNeed::Never => RetryAfter::Never,
            RetryNeed::None => RetryAfter::micros(0),
            RetryNeed::Units(units) => {
                let k = plan.live + units - rule.limit();
                let mut seen = 0;
                let kth = self
                    .runs
                    .range(plan.expired_runs..)
                    .find(|run| {
                        seen += run.units;
                        seen >= k
                    })
                    .map_or(now, |run| run.at);
                RetryAfter::micros(kth + window - now)
            }
        };
        Decision {
            allowed: false,
            limit: rule.limit(),
            remaining: rule.limit().saturating_sub(plan.live),
            retry_after,
            reset_after: self
                .runs
                .back()
                .filter(|_| plan.live > 0)
                .map_or(0, |run| run.at + window - now),
            delay: 0,
        }
    }

    /// When every live entry has expired.
    pub(crate) fn expires_at(&self, rule: &Rule) -> u64 {
        self.runs
            .back()
            .map_or(0, |run| run.at + rule.window_micros())
    }
}
