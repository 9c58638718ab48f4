//! Fixed windows aligned to the epoch: window `k = floor(t / W)` counts the
//! units admitted in it.

use super::retry::RetryNeed;
use crate::decision::{Decision, RetryAfter};
use crate::rule::{EXACT_LIMIT, Rule};

#[derive(Clone, Debug, Default)]
pub(crate) struct FixedWindowState {
    window_index: u64,
    count: u64,
}

/// The window at `now` and the units already admitted in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FixedPlan {
    window_index: u64,
    count: u64,
}

impl FixedWindowState {
    /// The window and its count, as [`FixedWindowState::from_words`] takes them back.
    pub(crate) fn words(&self) -> [u64; 2] {
        [self.window_index, self.count]
    }

    pub(crate) fn from_words([window_index, count]: [u64; 2]) -> Self {
        FixedWindowState {
            window_index,
            count,
        }
    }

    #[inline] // on the memory store's refusal without a lock (RuleState::from_words)
    pub(crate) fn plan(&self, rule: &Rule, now: u64) -> FixedPlan {
        let window_index = now / rule.window_micros();
        let count = if window_index == self.window_index {
            self.count
        } else {
            0
        };
        FixedPlan {
            window_index,
            count,
        }
    }

    #[inline] // on the memory store's refusal without a lock (RuleState::from_words)
    pub(crate) fn fits(plan: FixedPlan, rule: &Rule, units: u64) -> bool {
        plan.count + units <= rule.limit()
    }

    /// The answer to a check of `units` that is allowed at `now`.
    pub(crate) fn allowed(rule: &Rule, plan: FixedPlan, now: u64, units: u64) -> Decision {
        Decision {
            allowed: true,
            limit: rule.limit(),
            remaining: rule.limit() - plan.count - units,
            retry_after: RetryAfter::micros(0),
            reset_after: window_end(rule, plan) - now,
            delay: 0,
        }
    }

    /// Gives back up to `units` of the current window's count, when `from_window` (a
    /// reservation's; any for a refund) is the current one; whether there were any to give
    /// back. An earlier window's count has expired and has nothing to give back.
    pub(crate) fn refund(&mut self, plan: FixedPlan, from_window: Option<u64>, units: u64) -> bool {
        let current = plan.window_index == self.window_index && self.count > 0;
        if !current || from_window.is_some_and(|k| k != plan.window_index) {
            return false;
        }
        self.count = self.count.saturating_sub(units);
        true
    }

    /// Records `cost` units, whatever the limit says (an admission, a charged refusal, a
    /// report), and returns the plan after it. The count stays below 2^53, where every store
    /// counts exactly; a count at or above the limit refuses every check, however far above.
    pub(crate) fn record(&mut self, plan: FixedPlan, cost: u64) -> FixedPlan {
        self.window_index = plan.window_index;
        self.count = (plan.count + cost).min(EXACT_LIMIT - 1);
        FixedPlan {
            window_index: self.window_index,
            count: self.count,
        }
    }

    #[inline] // on the memory store's refusal without a lock (RuleState::from_words)
    pub(crate) fn refuse(rule: &Rule, plan: FixedPlan, now: u64, retry: RetryNeed) -> Decision {
        let reset_after = if plan.count > 0 {
            window_end(rule, plan) - now
        } else {
            0
        };
        Decision {
            allowed: false,
            limit: rule.limit(),
            remaining: rule.limit().saturating_sub(plan.count),
            retry_after: match retry {
                RetryNeed::Never => RetryAfter::Never,
                RetryNeed::None => RetryAfter::micros(0),
                RetryNeed::Units(_) => RetryAfter::micros(reset_after),
            },
            reset_after,
            delay: 0,
        }
    }

    /// What a check of any cost gets after `admitted` left too little for it, with no other
    /// traffic: refused until the window ends, `reset_after` away.
    pub(crate) fn refusal_after(admitted: Decision) -> Decision {
        Decision {
            allowed: false,
            retry_after: RetryAfter::micros(admitted.reset_after),
            delay: 0,
            ..admitted
        }
    }

    pub(crate) fn expires_at(&self, rule: &Rule) -> u64 {
        if self.count == 0 {
            0
        } else {
            (self.window_index + 1) * rule.window_micros()
        }
    }
}

fn window_end(rule: &Rule, plan: FixedPlan) -> u64 {
    (plan.window_index + 1) * rule.window_micros()
}
