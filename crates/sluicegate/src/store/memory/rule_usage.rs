//! What each rule holds in the store, in entries and bytes, so that no rule takes more than
//! its share of the key cap and of the memory budget.
//!
//! Touched only when an entry is made, dropped, or its heap size changes (a log's buffer
//! grows, an id is remembered): never on a check of a held key whose size stays. Rules are
//! told apart by their owner (`Rule::owner`: a configured rule's place, which a reload
//! keeps as it keeps its state, and which its limit overrides share), spread over a few locks by it.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::rule::Rule;

const SHARDS: usize = 16;

/// Entries and bytes per rule.
#[derive(Debug)]
pub(super) struct RuleUsages {
    shards: Box<[Mutex<HashMap<u64, Usage>>]>,
    /// The most entries and bytes one rule may hold.
    max_keys: usize,
    max_bytes: usize,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Usage {
    pub(super) keys: usize,
    pub(super) bytes: usize,
}

impl RuleUsages {
    pub(super) fn new(max_keys: usize, max_bytes: usize) -> Self {
        RuleUsages {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            max_keys,
            max_bytes,
        }
    }

    fn shard(&self, owner: u64) -> &Mutex<HashMap<u64, Usage>> {
        &self.shards[(owner >> 40) as usize % SHARDS]
    }

    /// Takes one entry of `bytes` for `rule` if that keeps it within its share.
    pub(super) fn try_take(&self, rule: &Rule, bytes: usize) -> bool {
        let mut shard = self.shard(rule.owner()).lock();
        let usage = shard.entry(rule.owner()).or_default();
        let fits = usage.keys < self.max_keys
            && usage
                .bytes
                .checked_add(bytes)
                .is_some_and(|after| after <= self.max_bytes);
        if fits {
            usage.keys += 1;
            usage.bytes += bytes;
        } else if usage.keys == 0 {
            shard.remove(&rule.owner());
        }
        fits
    }

    /// Whether `rule` may hold `bytes` more within its share.
    pub(super) fn has_room(&self, rule: &Rule, bytes: usize) -> bool {
        self.of(rule)
            .bytes
            .checked_add(bytes)
            .is_some_and(|after| after <= self.max_bytes)
    }

    /// Gives back `keys` entries of `bytes` in all, of the rule of `owner`.
    pub(super) fn give_back(&self, owner: u64, keys: usize, bytes: usize) {
        let mut shard = self.shard(owner).lock();
        if let Some(usage) = shard.get_mut(&owner) {
            usage.keys -= keys;
            usage.bytes -= bytes;
            if usage.keys == 0 {
                shard.remove(&owner);
            }
        }
    }

    /// Counts a held entry of `rule` grown or shrunk from `before` to `after` bytes.
    pub(super) fn resize(&self, rule: &Rule, before: usize, after: usize) {
        let mut shard = self.shard(rule.owner()).lock();
        if let Some(usage) = shard.get_mut(&rule.owner()) {
            usage.bytes = usage.bytes + after - before;
        }
    }

    /// What `rule` holds now.
    pub(super) fn of(&self, rule: &Rule) -> Usage {
        self.shard(rule.owner())
            .lock()
            .get(&rule.owner())
            .copied()
            .unwrap_or_default()
    }
}
