//! What the store last said about each key of a `local`-policy rule: how many units it
//! counted, and until when. When the store fails, the local fallback starts each key from
//! that, not from empty; otherwise a client at 40 of 50 when Redis died could take 50 more
//! locally within the same window.
//!
//! An entry lasts until the store said the key would be back to empty (`reset_after` from
//! when the check was sent): after that, nothing it counted still counts.
//!
//! Memory: at most `capacity` entries. When full, expired entries are dropped first; when
//! none has expired, a key not yet remembered is not remembered, and if the store fails it
//! starts empty in the fallback, as if the store had never seen it (L / instances).
//!
//! Cost: on the way of every store decision of a `local` rule, so like the negative cache
//! it hashes the rule's fingerprint and the key where they lie, locks one of [`SHARDS`]
//! shards, and updates in place; only a new key copies its bytes.

use std::hash::Hasher;
use std::sync::Arc;

use super::room::{Expiring, ExpiringTable};
use crate::budget::BudgetPart;
use crate::clock::Clock;
use crate::rule::Rule;

#[derive(Debug)]
pub(crate) struct Seeds {
    table: ExpiringTable<Seed>,
}

#[derive(Debug)]
struct Seed {
    hash: u64,
    rule: Rule,
    key: Box<str>,
    /// Units the store counted for the key, of the rule's capacity.
    used: u64,
    /// When they have all freed (µs of the limiter's clock).
    until: u64,
    /// The store's lost-state generation for the key when it was asked
    /// ([`Store::lost_state_generation`](crate::Store::lost_state_generation)).
    generation: u64,
}

impl Expiring for Seed {
    fn until(&self) -> u64 {
        self.until
    }

    fn hash(&self) -> u64 {
        self.hash
    }

    fn bytes(&self) -> usize {
        seed_bytes(&self.key)
    }
}

/// The bytes of a seed of `key`: its bucket and its key.
fn seed_bytes(key: &str) -> usize {
    size_of::<Seed>() + 1 + key.len()
}

impl Seeds {
    pub(crate) fn new(capacity: usize, clock: Arc<dyn Clock>, budget: BudgetPart) -> Self {
        Seeds {
            table: ExpiringTable::new(capacity, clock, budget),
        }
    }

    fn hash(&self, rule: &Rule, key: &str) -> u64 {
        let mut hasher = self.table.hasher();
        hasher.write_u64(rule.fingerprint());
        hasher.write(key.as_bytes());
        hasher.finish()
    }

    /// Remembers that the store, asked at `sent` in lost-state `generation`, counted `used`
    /// units of `rule` for `key`, all free `reset_after` µs later.
    pub(crate) fn remember(
        &self,
        rule: &Rule,
        key: &str,
        sent: u64,
        (used, reset_after): (u64, u64),
        generation: u64,
    ) {
        let hash = self.hash(rule, key);
        let until = sent.saturating_add(reset_after);
        let mut shard = self.table.shard(hash).lock();
        let found = shard.find_entry(hash, |s| *s.key == *key && s.rule.same_identity(rule));
        match found {
            Ok(mut seed) if used > 0 => {
                let seed = seed.get_mut();
                (seed.used, seed.until, seed.generation) = (used, until, generation);
            }
            Ok(seed) => {
                self.table.give_back(seed.remove().0.bytes());
            }
            Err(_) if used == 0 => {}
            Err(_) => {
                drop(shard);
                if !self.table.reserve(seed_bytes(key)) {
                    return;
                }
                let seed = Seed {
                    hash,
                    rule: rule.clone(),
                    key: key.into(),
                    used,
                    until,
                    generation,
                };
                let mut shard = self.table.shard(hash).lock();
                if let Ok(old) =
                    shard.find_entry(hash, |s| *s.key == *key && s.rule.same_identity(rule))
                {
                    // Another check remembered the key meanwhile; the room taken is not needed.
                    self.table.give_back(old.remove().0.bytes());
                }
                shard.insert_unique(hash, seed, |s| s.hash);
            }
        }
    }

    /// Takes what the store last said about `key` under `rule`, if it still counts at
    /// `now`, and hands the units still counted to `seed` under the entry's lock: a
    /// concurrent check of the same key waits until the seeding is done.
    pub(crate) fn take(&self, rule: &Rule, key: &str, now: u64, seed: impl FnOnce(u64)) {
        let hash = self.hash(rule, key);
        let mut shard = self.table.shard(hash).lock();
        let Ok(found) = shard.find_entry(hash, |s| *s.key == *key && s.rule.same_identity(rule))
        else {
            return;
        };
        let (entry, _) = found.remove();
        self.table.give_back(entry.bytes());
        if now < entry.until {
            seed(entry.used);
        }
    }

    /// When the store's lost-state generation for `key` is `generation` and differs from
    /// the one of its last answer, that answer's units (if they still count at `now`) and
    /// until when they count: what the store has lost of them. Remembers `generation`, so
    /// that one loss is answered once.
    pub(crate) fn lost(
        &self,
        rule: &Rule,
        key: &str,
        generation: u64,
        now: u64,
    ) -> Option<(u64, u64)> {
        let hash = self.hash(rule, key);
        let mut shard = self.table.shard(hash).lock();
        let seed = shard.find_mut(hash, |s| *s.key == *key && s.rule.same_identity(rule))?;
        if seed.generation == generation {
            return None;
        }
        seed.generation = generation;
        (now < seed.until).then_some((seed.used, seed.until))
    }

    /// Drops every seed that no longer counts at `now`, and gives its room back.
    pub(crate) fn sweep(&self, now: u64) -> usize {
        self.table.remove_where(|seed| seed.until <= now)
    }
}
