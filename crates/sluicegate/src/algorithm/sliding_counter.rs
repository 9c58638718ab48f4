//! Sliding-window counter (Cloudflare's estimate when N = 1): N buckets of width
//! `w = W / N`, the one that is sliding out weighted by how much of it is still inside the
//! window. Everything is in integers, scaled by `w`, so every store agrees exactly:
//! `E·w = w·(n_{b−N+1} + … + n_b) + n_{b−N}·(w − r)`.

use std::collections::VecDeque;

use super::retry::RetryNeed;
use crate::decision::{Decision, RetryAfter};
use crate::rule::{EXACT_LIMIT, Rule};

/// Buckets holding units, oldest first, as (bucket index, units).
#[derive(Clone, Debug, Default)]
pub(crate) struct SlidingCounterState {
    buckets: VecDeque<(u64, u64)>,
}

/// The estimate at `now`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CounterPlan {
    /// b = floor(t / w).
    bucket: u64,
    /// E·w, the estimate scaled by the bucket width.
    estimate_w: u64,
}

fn width(rule: &Rule) -> u64 {
    rule.window_micros() / rule.buckets()
}

impl SlidingCounterState {
    /// The bytes of the buckets' buffer.
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.buckets.capacity() * size_of::<(u64, u64)>()
    }

    /// Estimates at `now`, reading only: buckets older than `b − N` weigh nothing and are
    /// dropped when the next admission writes.
    pub(crate) fn plan(&self, rule: &Rule, now: u64) -> CounterPlan {
        let n = rule.buckets();
        let w = width(rule);
        let bucket = now / w;
        let offset = now - bucket * w;
        let (full, sliding) = self
            .buckets
            .iter()
            .fold((0, 0), |(full, sliding), &(j, units)| {
                if j + n == bucket {
                    (full, units)
                } else if j + n > bucket {
                    (full + units, sliding)
                } else {
                    (full, sliding)
                }
            });
        CounterPlan {
            bucket,
            estimate_w: w * full + sliding * (w - offset),
        }
    }

    /// `E·w + c·w ≤ L·w`, written as `E·w ≤ (L − c)·w` so that nothing exceeds `L·w`.
    pub(crate) fn fits(plan: CounterPlan, rule: &Rule, units: u64) -> bool {
        plan.estimate_w <= (rule.limit() - units) * width(rule)
    }

    /// The answer to a check of `units` that is allowed at `now`.
    pub(crate) fn allowed(rule: &Rule, plan: CounterPlan, now: u64, units: u64) -> Decision {
        let w = width(rule);
        let estimate_w = plan.estimate_w + units * w;
        Decision {
            allowed: true,
            limit: rule.limit(),
            remaining: (rule.limit() * w - estimate_w) / w,
            retry_after: RetryAfter::micros(0),
            reset_after: (plan.bucket + rule.buckets() + 1) * w - now,
            delay: 0,
        }
    }

    /// Records `cost` units in the current bucket, dropping the buckets that no longer weigh.
    pub(crate) fn record(&mut self, rule: &Rule, plan: CounterPlan, cost: u64) {
        self.drop_weightless(rule, plan.bucket);
        match self.buckets.back_mut() {
            Some((j, count)) if *j == plan.bucket => *count += cost,
            _ => self.buckets.push_back((plan.bucket, cost)),
        }
    }

    /// The most units a report may add at `now`: the units held, scaled by `w`, stay below
    /// 2^53, where every store computes the estimate exactly.
    pub(crate) fn report_room(&self, rule: &Rule, plan: CounterPlan) -> u64 {
        let n = rule.buckets();
        let held: u64 = self
            .buckets
            .iter()
            .filter(|&&(j, _)| j + n >= plan.bucket)
            .map(|&(_, units)| units)
            .sum();
        ((EXACT_LIMIT - 1) / width(rule)).saturating_sub(held)
    }

    /// Gives back up to `units` from the buckets that still weigh: the newest first for a
    /// refund (`from` = `None`), or from the bucket of instant `from` (a reservation's) if
    /// it still weighs. Whether there were any to give back (else nothing is dropped).
    pub(crate) fn refund(
        &mut self,
        rule: &Rule,
        plan: CounterPlan,
        from: Option<u64>,
        units: u64,
    ) -> bool {
        let weighs = |j: u64| j + rule.buckets() >= plan.bucket;
        let from_bucket = from.map(|at| at / width(rule));
        let holds = self
            .buckets
            .iter()
            .any(|&(j, n)| n > 0 && weighs(j) && from_bucket.is_none_or(|b| b == j));
        if !holds {
            return false;
        }
        self.drop_weightless(rule, plan.bucket);
        let mut left = units;
        for i in (0..self.buckets.len()).rev() {
            let (j, held) = &mut self.buckets[i];
            if left == 0 || from_bucket.is_some_and(|b| b > *j) {
                break;
            }
            if from_bucket.is_some_and(|b| b != *j) {
                continue;
            }
            let taken = (*held).min(left);
            *held -= taken;
            left -= taken;
            if *held == 0 {
                self.buckets.remove(i);
            }
        }
        true
    }

    /// Drops the buckets older than `b − N`, which weigh nothing in bucket `b`.
    fn drop_weightless(&mut self, rule: &Rule, bucket: u64) {
        let n = rule.buckets();
        while self.buckets.front().is_some_and(|&(j, _)| j + n < bucket) {
            self.buckets.pop_front();
        }
    }

    pub(crate) fn refuse(
        &self,
        rule: &Rule,
        plan: CounterPlan,
        now: u64,
        retry: RetryNeed,
    ) -> Decision {
        let w = width(rule);
        Decision {
            allowed: false,
            limit: rule.limit(),
            remaining: (rule.limit() * w).saturating_sub(plan.estimate_w) / w,
            retry_after: match retry {
                RetryNeed::Never => RetryAfter::Never,
                RetryNeed::None => RetryAfter::micros(0),
                RetryNeed::Units(units) => RetryAfter::micros(self.retry_after(rule, now, units)),
            },
            reset_after: self.expires_at(rule).saturating_sub(now),
            delay: 0,
        }
    }

    /// The least `d ≥ 0` at which a check of `units` would fit, with no other traffic.
    ///
    /// E is piecewise linear in time: constant in a bucket whose sliding bucket `b − N` is
    /// empty, falling by `n_{b−N}` per µs otherwise, and it steps only where a bucket with
    /// units becomes the sliding one (`j + N`) or leaves (`j + N + 1`). So only those
    /// buckets, and the current one, need looking at: O(buckets held).
    fn retry_after(&self, rule: &Rule, now: u64, units: u64) -> u64 {
        let n = rule.buckets();
        let w = width(rule);
        let target = (rule.limit() - units) * w;
        let mut piece = now / w;
        // `first_full`: index of the oldest held bucket that still weighs fully in `piece`.
        let mut first_full = 0;
        let mut full: u64 = self.buckets.iter().map(|b| b.1).sum();
        loop {
            while first_full < self.buckets.len() && self.buckets[first_full].0 + n <= piece {
                full -= self.buckets[first_full].1;
                first_full += 1;
            }
            let sliding = first_full
                .checked_sub(1)
                .map(|i| self.buckets[i])
                .filter(|&(j, _)| j + n == piece)
                .map_or(0, |(_, units)| units);
            let start = piece * w;
            let offset = now.saturating_sub(start);
            if w * full <= target {
                if sliding == 0 {
                    return start + offset - now;
                }
                // Needs sliding·(w − r) ≤ target − w·full, so r ≥ w − ⌊(target − w·full)/sliding⌋.
                let slack = (target - w * full) / sliding;
                let needed = offset.max(w.saturating_sub(slack));
                if needed < w {
                    return start + needed - now;
                }
            }
            piece = if sliding > 0 {
                piece + 1
            } else {
                self.buckets
                    .get(first_full)
                    .map_or(piece + 1, |&(j, _)| j + n)
            };
        }
    }

    /// When the newest bucket with units stops weighing: `(j + N + 1)·w`.
    pub(crate) fn expires_at(&self, rule: &Rule) -> u64 {
        self.buckets
            .back()
            .map_or(0, |&(j, _)| (j + rule.buckets() + 1) * width(rule))
    }
}
