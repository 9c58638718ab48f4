//! The `local` fallback: while the store fails, `local` rules decide on an in-memory
//! store with their limit divided by the number of instances sharing the store, each key
//! starting from what the store last said about it ([`Seeds`]). What it admits is owed to
//! the store ([`Owed`]) and written back when the store answers again, before the store
//! may admit that key again: as a report (never refused, so the store counts every unit
//! admitted) on the way of the key's next check, or by [`Limiter::write_back`] for keys
//! that see no further check.
//!
//! What that bounds, for a key the store last reported with R of L remaining: one
//! instance admits at most min(L / instances, R) more in that window, and the store then
//! counts them, so an instance alone never goes past L in a window, across an outage and
//! after it; n instances together admit at most L − R + n · min(L / n, R) during the
//! outage, which exceeds L by at most (n − 1) · R, and nothing more after it (the store
//! counts every unit they admitted and refuses until the window frees them).
//!
//! A report lands at the store's time, not at the moment the unit was admitted. Per
//! algorithm: a sliding log keeps the units until the report's time plus the window, a
//! sliding counter counts them whole in the report's window, a token or leaky bucket
//! (GCRA) takes them from its level at the report's time: each counts them at least as
//! long as the store would have, had it admitted them (conservative: it may refuse a unit
//! it would have admitted, never the reverse). A fixed window counts them in the window
//! of the report; a debt lasts only as long as the local state that admitted it is
//! non-empty, which for a fixed window ends with the window, so units are never written
//! into a window they were not admitted in. Units whose debt expired are not written
//! back: they no longer count under any algorithm.
//!
//! [`Limiter::write_back`]: super::Limiter::write_back

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Counters;
use super::in_flight::{InFlight, Joined};
use super::owed::{Owed, Owing};
use super::seeds::Seeds;
use super::share::Shares;
use crate::budget::MemoryBudget;
use crate::clock::Clock;
use crate::decision::{Decision, RetryAfter};
use crate::policy::FailurePolicy;
use crate::rule::Rule;
use crate::store::{Charge, Check, Limit, MemoryStore, MemoryStoreConfig, Store, StoreError};

/// The name of the local fallback's part of a memory budget: its store, its seeds and
/// the units it owes the store.
pub(crate) const FALLBACK_PART: &str = "fallback";

#[derive(Debug)]
pub(crate) struct LocalFallback {
    store: MemoryStore,
    /// The rules cut to L / instances.
    shares: Shares,
    seeds: Seeds,
    owed: Owed,
    /// Write-backs at the store, per key: a check of a key being written back waits for
    /// it, so the store never decides the key before it counts what it is owed.
    writing: InFlight,
}

impl LocalFallback {
    /// `instances` share the store; `seeds` keys at most are remembered; the keys, the
    /// seeds and the debts count in `budget`'s [`FALLBACK_PART`].
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
            owed: Owed::new(config.max_keys, Arc::clone(clock), part.clone()),
            store: MemoryStore::new(config, Arc::clone(clock)),
            shares: Shares::new(1000, instances, "@local"),
            seeds: Seeds::new(seeds, Arc::clone(clock), part),
            writing: InFlight::new(),
        }
    }

    /// Remembers what the store decided for the limits of `check`, sent at `sent` in
    /// lost-state `generation`, that keep a seed (`seeded`, one per limit).
    pub(crate) fn remember(
        &self,
        check: &Check<'_>,
        seeded: impl Iterator<Item = bool>,
        sent: u64,
        generation: u64,
        decisions: &[Decision],
    ) {
        for ((limit, seeded), decision) in check.limits.iter().zip(seeded).zip(decisions) {
            if seeded {
                self.remember_one(limit, sent, generation, decision);
            }
        }
    }

    fn remember_one(&self, limit: &Limit<'_>, sent: u64, generation: u64, decision: &Decision) {
        let used = decision.limit.saturating_sub(decision.remaining);
        self.seeds.remember(
            limit.rule,
            limit.key,
            sent,
            (used, decision.reset_after),
            generation,
        );
    }

    /// The store lost state of `check`'s keys since it last answered them (their
    /// lost-state generation is `generation` now): owes it again the units this instance
    /// last saw it count for them, while they still count at `now`. Returns how many keys
    /// owe units so.
    pub(crate) fn owe_lost(&self, check: &Check<'_>, generation: u64, now: u64) -> u64 {
        let mut keys = 0;
        for limit in check.limits {
            if let Some((used, until)) = self.seeds.lost(limit.rule, limit.key, generation, now)
                && used > 0
                && self.owed.add(limit.rule, limit.key, used, until)
            {
                keys += 1;
            }
        }
        keys
    }

    /// Whether no key owes the store anything: then no check has a write-back to wait for.
    pub(crate) fn owes_nothing(&self) -> bool {
        self.owed.is_empty()
    }

    /// Writes what `check`'s keys owe to `store` before the check itself may go there
    /// (sent at `now`, in lost-state `generation`). An error means some key still owes
    /// its units, and the check must not go to the store.
    pub(crate) async fn write_back<S: Store>(
        &self,
        store: &S,
        check: &Check<'_>,
        generation: u64,
        now: u64,
        stats: &Counters,
    ) -> Result<(), StoreError> {
        for limit in check.limits {
            self.write_back_key(store, limit, generation, now, stats)
                .await?;
        }
        Ok(())
    }

    /// Writes what `limit`'s key owes to `store`, or waits for the write-back of it in
    /// flight. On success its local state is forgotten and the store's answer becomes its
    /// seed: a later outage starts it from what the store counts with the units written.
    pub(crate) async fn write_back_key<S: Store>(
        &self,
        store: &S,
        limit: &Limit<'_>,
        generation: u64,
        now: u64,
        stats: &Counters,
    ) -> Result<(), StoreError> {
        let (rule, key) = (limit.rule, limit.key);
        let hash = self.owed.hash(rule, key);
        loop {
            if self.owed.owing(hash, rule, key, now) == Owing::Nothing {
                return Ok(());
            }
            let leading = match self.writing.join(hash) {
                Joined::Wait(written) => {
                    written.await;
                    continue;
                }
                Joined::Lead(leading) => leading,
            };
            // Looked at again as leader: a write-back that led before may have paid it.
            let units = match self.owed.owing(hash, rule, key, now) {
                Owing::Nothing => return Ok(()),
                Owing::Expired(units) => {
                    stats.write_backs_expired.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(rule = rule.name(), key, units, "units owed expired");
                    return Ok(());
                }
                Owing::Units(units) => units,
            };
            let limits = [*limit];
            let written = store
                .check(&Check {
                    // An envoy counter takes only checks; one that counts its refusals
                    // adds the units whatever it answers, as a report does.
                    charge: if rule.envoy_counter() {
                        Charge::CheckChargingRefusals
                    } else {
                        Charge::Report
                    },
                    ..Check::new(&limits, units)
                })
                .await;
            return match written {
                Ok(outcome) => {
                    self.owed.paid(hash, rule, key, units);
                    self.store.forget(&self.shares.of(rule), key);
                    self.remember_one(limit, now, generation, &outcome.decision);
                    stats.write_backs_written.fetch_add(1, Ordering::Relaxed);
                    drop(leading);
                    Ok(())
                }
                // The store cannot take these units, ever: keeping them would stop the key
                // at every check until they expire.
                Err(e @ (StoreError::InvalidCheck(_) | StoreError::RequestIdConflict(_))) => {
                    self.owed.paid(hash, rule, key, units);
                    stats.write_backs_dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        rule = rule.name(),
                        key,
                        units,
                        error = %e,
                        "the store refused the units the local fallback owes it; dropped"
                    );
                    Ok(())
                }
                Err(e) => {
                    stats.write_backs_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        rule = rule.name(),
                        key,
                        units,
                        error = %e,
                        "writing back owed units failed; they stay owed"
                    );
                    Err(e)
                }
            };
        }
    }

    /// Up to `max` keys owing units at `now`, expired debts dropped (counted in `stats`).
    pub(crate) fn due(&self, max: usize, now: u64, stats: &Counters) -> Vec<(Rule, Box<str>)> {
        let (due, expired) = self.owed.due(max, now);
        if expired > 0 {
            stats
                .write_backs_expired
                .fetch_add(expired, Ordering::Relaxed);
        }
        due
    }

    /// Keys owing units, and the units, now.
    pub(crate) fn owed(&self) -> (usize, u64) {
        (self.owed.keys(), self.owed.units())
    }

    /// Drops what no longer counts at `now` — seeds, and the in-memory store's expired
    /// keys — and gives the memory of emptied tables back.
    pub(crate) fn sweep(&self, now: u64) {
        self.seeds.sweep(now);
        self.store.sweep();
    }

    /// `local` rules decide on the in-memory store; `allow` rules allow. All-or-nothing,
    /// as ever.
    pub(crate) fn decide(
        &self,
        check: &Check<'_>,
        policies: &[FailurePolicy],
        now: u64,
        stats: &Counters,
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
            let decided = self.store.check_now(&local_check)?;
            if decided.decision.allowed {
                self.owe(check, &local_rules, decided.limits(), now, stats);
            }
            decided.limits().to_vec().into_iter()
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
                    retry_after: RetryAfter::micros(0),
                    reset_after: 0,
                    delay: 0,
                },
            })
            .collect())
    }

    /// Owes the store the units of `check` its `local` limits (those with a rule in
    /// `local_rules`) admitted at `now`, as the in-memory store decided them (`decided`,
    /// one per local limit): until each key's local state is back to empty.
    fn owe(
        &self,
        check: &Check<'_>,
        local_rules: &[Option<Rule>],
        decided: &[Decision],
        now: u64,
        stats: &Counters,
    ) {
        let local = (0..check.limits.len()).filter(|&i| local_rules[i].is_some());
        for (i, decision) in local.zip(decided) {
            let (limit, units) = (&check.limits[i], check.cost_of(i));
            if units == 0 {
                continue;
            }
            let until = now.saturating_add(decision.reset_after);
            if !self.owed.add(limit.rule, limit.key, units, until)
                && stats.unowed_units.fetch_add(units, Ordering::Relaxed) == 0
            {
                // Counted every time; said once, not at every check of a flood.
                tracing::warn!(
                    rule = limit.rule.name(),
                    "no room to owe the store the units the local fallback admits (the \
                     fallback's memory budget or key cap is full): they will not be \
                     written back, and an instance may pass its limit after the outage"
                );
            }
        }
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
