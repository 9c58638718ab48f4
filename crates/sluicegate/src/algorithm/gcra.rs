//! GCRA, the state machine behind both `token-bucket` (same contract as redis-cell's
//! CL.THROTTLE) and `leaky-bucket` (B = Q + 1, and an allowed request waits `tat − t` so
//! that what passes leaves at one unit per T). State: the theoretical arrival time.

use super::retry::RetryNeed;
use crate::decision::{Decision, RetryAfter};
use crate::rule::{Algorithm, Rule};

/// The most backlog `TAT − t` a report may leave (about 71 years): with τ ≤ 2^51 as well,
/// every number a check computes stays below 2^53.
const MAX_BACKLOG: u64 = 1 << 51;

#[derive(Clone, Debug, Default)]
pub(crate) struct GcraState {
    /// TAT; 0 stands for "absent", which `max(TAT, t)` turns into `t`.
    tat: u64,
    /// The emission interval TAT was written under.
    interval: u64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct GcraPlan {
    /// max(TAT, t).
    tat: u64,
}

/// τ = T·B.
fn tolerance(rule: &Rule) -> u64 {
    rule.emission_interval_micros() * rule.capacity()
}

impl GcraState {
    /// TAT and its interval, as [`GcraState::from_words`] takes them back.
    pub(crate) fn words(&self) -> [u64; 2] {
        [self.tat, self.interval]
    }

    pub(crate) fn from_words([tat, interval]: [u64; 2]) -> Self {
        GcraState { tat, interval }
    }

    /// `max(TAT, t)`, read under `rule`'s numbers: the backlog `TAT − t` as it stands when
    /// it was written under the rule's interval, debt included (d' = d); under another, the
    /// units it holds (rounded up, as a decision reports them used) at the rule's interval,
    /// at most the capacity: a change of rate forgives debt beyond it.
    #[inline(always)] // on the memory store's checks (RuleState::plan)
    pub(crate) fn plan(&self, rule: &Rule, now: u64) -> GcraPlan {
        let backlog = self.tat.saturating_sub(now);
        let interval = rule.emission_interval_micros();
        let backlog = if backlog == 0 || self.interval == interval {
            backlog
        } else {
            backlog.div_ceil(self.interval).min(rule.capacity()) * interval
        };
        GcraPlan { tat: now + backlog }
    }

    /// `new − t ≤ τ` with `new = tat + c·T`.
    #[inline(always)] // on the memory store's checks (RuleState::plan)
    pub(crate) fn fits(plan: GcraPlan, rule: &Rule, now: u64, units: u64) -> bool {
        plan.tat + units * rule.emission_interval_micros() - now <= tolerance(rule)
    }

    /// The answer to a check of `units` that is allowed at `now`.
    #[inline(always)] // on the memory store's checks (RuleState::admit)
    pub(crate) fn allowed(rule: &Rule, plan: GcraPlan, now: u64, units: u64) -> Decision {
        let new = plan.tat + units * rule.emission_interval_micros();
        Decision {
            allowed: true,
            limit: rule.capacity(),
            remaining: (tolerance(rule) - (new - now)) / rule.emission_interval_micros(),
            retry_after: RetryAfter::micros(0),
            reset_after: new - now,
            delay: if rule.algorithm() == Algorithm::LeakyBucket {
                plan.tat - now
            } else {
                0
            },
        }
    }

    /// Records `cost` units, whatever the limit says: `TAT = tat + c·T`, the backlog held at
    /// most [`MAX_BACKLOG`] (an admission never comes near it: it stays within τ).
    #[inline(always)] // on the memory store's checks (RuleState::record)
    pub(crate) fn record(&mut self, rule: &Rule, plan: GcraPlan, now: u64, cost: u64) {
        let interval = rule.emission_interval_micros();
        self.tat = plan
            .tat
            .saturating_add(cost.saturating_mul(interval))
            .min(now + MAX_BACKLOG);
        self.interval = interval;
    }

    /// Gives back up to `units`, under the rule's interval: a refund (`reserved_tat` =
    /// `None`) sets `TAT = max(t, tat − c·T)`; a reservation's give-back, whose units are
    /// the last before the TAT `e` it set, only what of them is still pending:
    /// `TAT = max(t, tat − min(c·T, e − t))`. A leaky bucket gives nothing back (its units
    /// were handed slots to pass in), and neither does a key that holds nothing (`tat = t`):
    /// writing TAT = t would make a check stamped before t (but after `latest`) find units
    /// that were never there. Whether anything was given back.
    pub(crate) fn refund(
        &mut self,
        rule: &Rule,
        plan: GcraPlan,
        now: u64,
        reserved_tat: Option<u64>,
        units: u64,
    ) -> bool {
        let interval = rule.emission_interval_micros();
        let pending = reserved_tat.map_or(u64::MAX, |e| e.saturating_sub(now));
        if rule.algorithm() == Algorithm::LeakyBucket || plan.tat == now || pending == 0 {
            return false;
        }
        self.tat = plan
            .tat
            .saturating_sub(units.saturating_mul(interval).min(pending))
            .max(now);
        self.interval = interval;
        true
    }

    #[inline] // on the memory store's refusal without a lock (RuleState::from_words)
    pub(crate) fn refuse(rule: &Rule, plan: GcraPlan, now: u64, retry: RetryNeed) -> Decision {
        let interval = rule.emission_interval_micros();
        let tolerance = tolerance(rule);
        Decision {
            allowed: false,
            limit: rule.capacity(),
            remaining: tolerance.saturating_sub(plan.tat - now) / interval,
            retry_after: match retry {
                RetryNeed::Never => RetryAfter::Never,
                RetryNeed::None => RetryAfter::micros(0),
                RetryNeed::Units(units) => {
                    RetryAfter::micros(plan.tat + units * interval - tolerance - now)
                }
            },
            // The state as read: with the numbers it was written under, max(0, TAT − t).
            reset_after: plan.tat - now,
            delay: 0,
        }
    }

    /// What a check of `units` gets after `admitted` left too little for it, with no other
    /// traffic: with TAT − t = `reset_after`, `units` fit again once TAT + units·T − t' ≤ τ,
    /// that is `reset_after + units·T − τ` away.
    pub(crate) fn refusal_after(rule: &Rule, admitted: Decision, units: u64) -> Decision {
        let interval = rule.emission_interval_micros();
        let tolerance = tolerance(rule);
        let opens = (admitted.reset_after + units * interval).saturating_sub(tolerance);
        Decision {
            allowed: false,
            remaining: tolerance.saturating_sub(admitted.reset_after) / interval,
            retry_after: RetryAfter::micros(opens),
            delay: 0,
            ..admitted
        }
    }

    pub(crate) fn expires_at(&self) -> u64 {
        self.tat
    }
}
