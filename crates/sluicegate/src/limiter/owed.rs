//! Units owed to the store: what the `local` fallback admitted while the store failed, and
//! what a store that lost a key's state no longer counts of what this instance saw it
//! count. They are written to the store before it may admit the key again, so that the
//! store counts every unit this instance let through.
//!
//! A debt lasts as long as its units count under the rule: until the state that took them
//! would be back to empty (`reset_after` from when they were taken). Writing them back
//! later would count them in a window they were not taken in.
//!
//! Memory: one entry per key, in the fallback's part of the memory budget; shards shrink
//! when their keys are written back and expire.

use std::hash::Hasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::room::{Expiring, ExpiringTable};
use crate::budget::BudgetPart;
use crate::clock::Clock;
use crate::rule::Rule;

#[derive(Debug)]
pub(crate) struct Owed {
    table: ExpiringTable<Debt>,
    /// Units across all debts.
    units: AtomicU64,
}

#[derive(Debug)]
struct Debt {
    hash: u64,
    rule: Rule,
    key: Box<str>,
    units: u64,
    /// When the units no longer count (µs of the limiter's clock).
    until: u64,
}

impl Expiring for Debt {
    fn until(&self) -> u64 {
        self.until
    }

    fn hash(&self) -> u64 {
        self.hash
    }

    fn bytes(&self) -> usize {
        debt_bytes(&self.key)
    }
}

/// The bytes of a debt of `key`: its bucket and its key.
fn debt_bytes(key: &str) -> usize {
    size_of::<Debt>() + 1 + key.len()
}

/// What is owed for one key now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owing {
    /// Nothing.
    Nothing,
    /// These units, still counting.
    Units(u64),
    /// These units, which no longer count: the debt is dropped.
    Expired(u64),
}

impl Owed {
    /// Debts of at most `capacity` keys, counted in `budget`.
    pub(crate) fn new(capacity: usize, clock: Arc<dyn Clock>, budget: BudgetPart) -> Self {
        Owed {
            table: ExpiringTable::new(capacity, clock, budget),
            units: AtomicU64::new(0),
        }
    }

    /// Whether nothing is owed: one relaxed load, on the way of every store check.
    pub(crate) fn is_empty(&self) -> bool {
        self.table.len() == 0
    }

    /// Keys owing units now.
    pub(crate) fn keys(&self) -> usize {
        self.table.len()
    }

    /// Units owed now, across all keys.
    pub(crate) fn units(&self) -> u64 {
        self.units.load(Ordering::Relaxed)
    }

    pub(crate) fn hash(&self, rule: &Rule, key: &str) -> u64 {
        let mut hasher = self.table.hasher();
        hasher.write_u64(rule.fingerprint());
        hasher.write(key.as_bytes());
        hasher.finish()
    }

    /// Owes `units` more of `rule` for `key`, counting until `until` at least. False when
    /// there is no room for a new debt.
    pub(crate) fn add(&self, rule: &Rule, key: &str, units: u64, until: u64) -> bool {
        let hash = self.hash(rule, key);
        {
            let mut shard = self.table.shard(hash).lock();
            if let Some(debt) = shard.find_mut(hash, |d| d.holds(rule, key)) {
                debt.units = debt.units.saturating_add(units);
                debt.until = debt.until.max(until);
                self.units.fetch_add(units, Ordering::Relaxed);
                return true;
            }
        }
        if !self.table.reserve(debt_bytes(key)) {
            return false;
        }
        let mut shard = self.table.shard(hash).lock();
        if let Some(debt) = shard.find_mut(hash, |d| d.holds(rule, key)) {
            // Another check made the debt meanwhile; the room taken is not needed.
            debt.units = debt.units.saturating_add(units);
            debt.until = debt.until.max(until);
            drop(shard);
            self.table.give_back(debt_bytes(key));
        } else {
            shard.insert_unique(
                hash,
                Debt {
                    hash,
                    rule: rule.clone(),
                    key: key.into(),
                    units,
                    until,
                },
                |d| d.hash,
            );
        }
        self.units.fetch_add(units, Ordering::Relaxed);
        true
    }

    /// What `key` (hashed to `hash`) owes under `rule` at `now`; an expired debt is dropped.
    pub(crate) fn owing(&self, hash: u64, rule: &Rule, key: &str, now: u64) -> Owing {
        let mut shard = self.table.shard(hash).lock();
        let Ok(debt) = shard.find_entry(hash, |d| d.holds(rule, key)) else {
            return Owing::Nothing;
        };
        if now < debt.get().until {
            return Owing::Units(debt.get().units);
        }
        let (debt, _) = debt.remove();
        drop(shard);
        self.dropped(&debt);
        Owing::Expired(debt.units)
    }

    /// `units` of what `key` owes under `rule` were written to the store: the debt goes
    /// down by them, and away once it is paid.
    pub(crate) fn paid(&self, hash: u64, rule: &Rule, key: &str, units: u64) {
        let mut shard = self.table.shard(hash).lock();
        let Ok(mut debt) = shard.find_entry(hash, |d| d.holds(rule, key)) else {
            return;
        };
        let paid = units.min(debt.get().units);
        debt.get_mut().units -= paid;
        self.units.fetch_sub(paid, Ordering::Relaxed);
        if debt.get().units == 0 {
            let (debt, _) = debt.remove();
            drop(shard);
            self.dropped(&debt);
        }
    }

    /// Up to `max` keys that owe units at `now`, with their rules; every expired debt is
    /// dropped on the way. Returns them and how many debts expired.
    pub(crate) fn due(&self, max: usize, now: u64) -> (Vec<(Rule, Box<str>)>, u64) {
        let mut units = 0;
        let expired = self.table.remove_where(|debt| {
            let gone = debt.until <= now;
            if gone {
                units += debt.units;
            }
            gone
        });
        self.units.fetch_sub(units, Ordering::Relaxed);
        let mut due = Vec::new();
        for shard in self.table.shards() {
            if due.len() >= max {
                break;
            }
            let shard = shard.lock();
            due.extend(
                shard
                    .iter()
                    .take(max - due.len())
                    .map(|d| (d.rule.clone(), d.key.clone())),
            );
        }
        (due, expired as u64)
    }

    /// Gives back the room of a debt taken out of the table, and its units.
    fn dropped(&self, debt: &Debt) {
        self.units.fetch_sub(debt.units, Ordering::Relaxed);
        self.table.give_back(debt.bytes());
    }
}

impl Debt {
    fn holds(&self, rule: &Rule, key: &str) -> bool {
        *self.key == *key && self.rule.same_identity(rule)
    }
}
