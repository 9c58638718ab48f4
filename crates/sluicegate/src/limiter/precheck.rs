//! The local pre-check (two-tier limiting): each instance counts what it
//! sends to the store under every rule cut to factor × L / instances, and refuses at once,
//! without a round trip, what goes past that share; the rest the store decides exactly.
//!
//! The trade-off, unlike the negative cache: the pre-check refuses on this instance's
//! traffic alone. With traffic spread evenly over the instances and a factor above 1, an
//! instance reaches its share only past the global limit, so it refuses only what the
//! store would refuse too; with traffic spread unevenly, one instance can reach its share
//! while the limit as a whole still has room, and then it refuses what the store would
//! admit. It never admits what the store would refuse: everything it lets through goes to
//! the store.

use std::sync::Arc;

use super::share::Shares;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::store::{Check, Limit, MemoryStore, MemoryStoreConfig, Outcome};

#[derive(Debug)]
pub(crate) struct Precheck {
    shares: Shares,
    /// What this instance sent on, per key, under the shares.
    sent: MemoryStore,
}

impl Precheck {
    /// A pre-check at `factor` (at least 1) × L / `instances`, on `clock`.
    pub(crate) fn new(factor: f64, instances: u32, clock: &Arc<dyn Clock>) -> Self {
        // Thousandths: 1.2 is 1200; a factor below 1 is taken as 1.
        let per_mille = (factor.max(1.0) * 1000.0).round() as u64;
        Precheck {
            shares: Shares::new(per_mille, instances, "@precheck"),
            sent: MemoryStore::new(MemoryStoreConfig::default(), Arc::clone(clock)),
        }
    }

    /// The refusal of `check` if it goes past this instance's share of any of its limits;
    /// otherwise `None`, and the check counts against the shares. Checks that carry a request
    /// id (the store may recognise a retry) or their own time are not pre-checked, nor
    /// reports, settles and refunds, which are never refused and always reach the store.
    pub(crate) fn refusal(&self, check: &Check<'_>) -> Option<Outcome> {
        if check.request_id.is_some() || check.at_micros().is_some() || !check.charge.may_refuse() {
            return None;
        }
        let shares: Vec<_> = check
            .limits
            .iter()
            .map(|l| self.shares.of(l.rule))
            .collect();
        let limits: Vec<Limit<'_>> = check
            .limits
            .iter()
            .zip(&shares)
            .map(|(l, share)| Limit {
                rule: share,
                key: l.key,
            })
            .collect();
        // A full table of keys pre-checks nothing: the store still decides.
        let local = self
            .sent
            .check_now(&Check {
                limits: &limits,
                ..*check
            })
            .ok()?;
        if local.decision.allowed {
            return None;
        }
        // Answered in the rules' own numbers: the limit is L, not the share.
        let decisions = local
            .limits()
            .iter()
            .zip(check.limits)
            .map(|(&d, l)| Decision {
                limit: l.rule.capacity(),
                remaining: d.remaining.min(l.rule.capacity()),
                ..d
            })
            .collect();
        Some(Outcome::from_limits(decisions))
    }
}
