//! The `local` fallback: while the store fails, `local` rules decide on an in-memory
//! store with their limit divided by the number of instances sharing the store, each key
//! starting from what the store last said about it ([`Seeds`]).
//!
//! What that bounds, for a key the store last reported with R of L remaining: one
//! instance admits at most min(L / instances, R) more in that window, so an instance alone
//! never goes past L; n instances together admit at most L − R + n · min(L / n, R), which
//! exceeds L by at most (n − 1) · R.

use std::sync::Arc;

use super::seeds::Seeds;
use super::share::Shares;
use crate::budget::MemoryBudget;
use crate::clock::Clock;
use crate::decision::{Decision, RetryAfter};
use crate::policy::FailurePolicy;
use crate::rule::Rule;
use crate::store::{Check, Limit, MemoryStore, MemoryStoreConfig, StoreError};

/// The name of the local fallback's part of a memory budget: its store and its seeds.
pub const FALLBACK_PART: &str = "fallback";

#[derive(Debug)]
pub(crate) struct LocalFallback {
    store: MemoryStore,
    /// The rules cut to L / instances.
    shares: Shares,
    seeds: Seeds,
}

impl LocalFallback {
    /// `instances` share the store; `seeds` keys at most are remembered; the keys and the
    /// seeds count in `budget`'s [`FALLBACK_PART`].
    pub(crate) fn new(
        instances: u32,
        seeds: usize,
        clock: &Arc<dyn Clock>,
        budget: &MemoryBudget,
    ) -> Self {
        let part = budget.part(FALLBACK_PART);
        let config = MemoryStoreConfig {
            budget: part.clone(),
            ..MemoryStoreConfig::default()
        };
        LocalFallback {
            store: MemoryStore::new(config, Arc::clone(clock)),
            shares: Shares::new(1000, instances, "@local"),
            seeds: Seeds::new(seeds, Arc::clone(clock), part),
        }
    }

    /// Remembers what the store decided for the limits of `check`, sent at `sent`, that
    /// fall back locally (`policies`, one per limit).
    pub(crate) fn remember(
        &self,
        check: &Check<'_>,
        policies: impl Iterator<Item = FailurePolicy>,
        sent: u64,
        decisions: &[Decision],
    ) {
        for ((limit, policy), decision) in check.limits.iter().zip(policies).zip(decisions) {
            if policy == FailurePolicy::Local {
                let used = decision.limit.saturating_sub(decision.remaining);
                self.seeds
                    .remember(limit.rule, limit.key, sent, used, decision.reset_after);
            }
        }
    }

    /// `local` rules decide on the in-memory store; `allow` rules allow. All-or-nothing,
    /// as ever.
    pub(crate) fn decide(
        &self,
        check: &Check<'_>,
        policies: &[FailurePolicy],
        now: u64,
    ) -> Result<Vec<Decision>, StoreError> {
        let local_rules: Vec<Option<Rule>> = check
            .limits
            .iter()
            .zip(policies)
            .map(|(l, p)| (*p == FailurePolicy::Local).then(|| self.shares.of(l.rule)))
            .collect();
        let local_costs = check.costs_of(
            local_rules
                .iter()
                .enumerate()
                .filter_map(|(i, rule)| rule.as_ref().map(|_| i)),
        );
        let limits: Vec<Limit<'_>> = check
            .limits
            .iter()
            .zip(&local_rules)
            .filter_map(|(l, rule)| rule.as_ref().map(|local| (l, local)))
            .map(|(l, local)| {
                self.seed(l, local, now);
                Limit {
                    rule: local,
                    key: l.key,
                }
            })
            .collect();
        let mut local = if limits.is_empty() {
            Vec::new().into_iter()
        } else {
            let local_check = Check {
                limits: &limits,
                costs: &local_costs,
                ..*check
            };
            self.store
                .check_now(&local_check)?
                .limits()
                .to_vec()
                .into_iter()
        };
        Ok(check
            .limits
            .iter()
            .zip(&local_rules)
            .enumerate()
            .map(|(i, (l, rule))| match rule {
                Some(_) => local.next().expect("one local decision per local rule"),
                None => Decision {
                    allowed: true,
                    limit: l.rule.capacity(),
                    remaining: l.rule.capacity().saturating_sub(check.cost_of(i).max(1)),
                    retry_after: RetryAfter::Micros(0),
                    reset_after: 0,
                    delay: 0,
                },
            })
            .collect())
    }

    /// Starts `limit`'s key under its `local` rule from what the store last said, if it
    /// said anything that still counts: the units it counted take the local share first.
    fn seed(&self, limit: &Limit<'_>, local: &Rule, now: u64) {
        self.seeds.take(limit.rule, limit.key, now, |used| {
            let remaining = limit.rule.capacity().saturating_sub(used);
            let taken = local.capacity().saturating_sub(remaining);
            self.store.forget(local, limit.key);
            if taken > 0 {
                let limits = [Limit {
                    rule: local,
                    key: limit.key,
                }];
                // From empty, a cost within the rule's capacity is always admitted; were
                // it not, the key would simply start empty.
                let _ = self.store.check_now(&Check::new(&limits, taken));
            }
        });
    }
}
