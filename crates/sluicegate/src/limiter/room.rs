//! A bounded, sharded table of entries that expire, forgotten only when the table is full:
//! what the negative cache and the local fallback's seeds are both made of. One lookup
//! locks one shard; no lock is shared by every check. Bounded twice: in entries, and in
//! the bytes they hold, counted in the table's part of the memory budget.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use foldhash::fast::{FoldHasher, RandomState};
use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::budget::BudgetPart;
use crate::clock::{Clock, ClockMicros};

/// Independently locked parts of a table: enough that concurrent checks rarely meet on
/// one lock, few enough that empty shards cost little (a few cache lines each).
pub(crate) const SHARDS: usize = 64;

/// [`SHARDS`] values of `T`, each behind its own lock, picked by a hash: the one way the
/// limiter's tables spread their locks.
#[derive(Debug)]
pub(crate) struct Sharded<T> {
    shards: Box<[Shard<T>]>,
}

impl<T: Default> Sharded<T> {
    pub(crate) fn new() -> Self {
        Sharded {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl<T> Sharded<T> {
    /// The shard of `hash`.
    pub(crate) fn shard(&self, hash: u64) -> &Mutex<T> {
        // The high bits: hash tables use the low ones and the top seven.
        &self.shards[(hash >> 32) as usize % SHARDS].0
    }

    /// Every shard, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Mutex<T>> {
        self.shards.iter().map(|shard| &shard.0)
    }
}

/// An entry that stops mattering at `until` (µs of the limiter's clock).
pub(crate) trait Expiring {
    fn until(&self) -> u64;
    /// The hash the entry was filed under, to move it when its shard shrinks.
    fn hash(&self) -> u64;
    /// The bytes this entry holds: its bucket in the table and its heap.
    fn bytes(&self) -> usize;
}

/// Aligned to two cache lines, with its lock, so threads in neighbouring shards never share
/// a line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard<T>(Mutex<T>);

#[derive(Debug)]
pub(crate) struct ExpiringTable<T> {
    shards: Sharded<HashTable<T>>,
    /// Seeded at random per table, so a client cannot aim keys at one bucket.
    hasher: RandomState,
    /// Entries across all shards; at most `capacity`.
    len: AtomicUsize,
    capacity: usize,
    /// The limiter's clock, read to drop expired entries when the table is full.
    clock: Arc<dyn Clock>,
    /// Where the entries' bytes are counted.
    budget: BudgetPart,
}

impl<T: Expiring> ExpiringTable<T> {
    pub(crate) fn new(capacity: usize, clock: Arc<dyn Clock>, budget: BudgetPart) -> Self {
        ExpiringTable {
            shards: Sharded::new(),
            hasher: RandomState::default(),
            len: AtomicUsize::new(0),
            capacity,
            clock,
            budget,
        }
    }

    /// A hasher of this table's seed, for the caller to feed an entry's identity.
    pub(crate) fn hasher(&self) -> FoldHasher<'_> {
        self.hasher.build_hasher()
    }

    /// The shard an entry of `hash` lives in.
    pub(crate) fn shard(&self, hash: u64) -> &Mutex<HashTable<T>> {
        self.shards.shard(hash)
    }

    /// Takes room for one entry of `bytes`. When the table or the budget is full, every
    /// expired entry is dropped and the room is tried once more.
    pub(crate) fn reserve(&self, bytes: usize) -> bool {
        let take = || {
            let entry = self
                .len
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < self.capacity).then_some(n + 1)
                })
                .is_ok();
            if entry && !self.budget.try_take(bytes) {
                self.len.fetch_sub(1, Ordering::Relaxed);
                return false;
            }
            entry
        };
        if take() {
            return true;
        }
        let now = self.clock.now_micros();
        self.remove_where(|entry| entry.until() <= now);
        take()
    }

    /// Removes every entry for which `remove` says so, shard by shard (no lock is held
    /// across shards), gives back their room, and shrinks each shard that emptied enough
    /// that its memory goes back to the allocator. Returns how many were removed.
    pub(crate) fn remove_where(&self, mut remove: impl FnMut(&T) -> bool) -> usize {
        let (mut removed, mut bytes) = (0, 0);
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|entry| {
                let gone = remove(entry);
                if gone {
                    removed += 1;
                    bytes += entry.bytes();
                }
                !gone
            });
            shrink(&mut shard);
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        self.budget.give_back(bytes);
        removed
    }

    /// Every shard, in order.
    pub(crate) fn shards(&self) -> impl Iterator<Item = &Mutex<HashTable<T>>> {
        self.shards.iter()
    }

    /// Entries across all shards.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Gives back the room of one entry of `bytes`, removed or never made.
    pub(crate) fn give_back(&self, bytes: usize) {
        self.len.fetch_sub(1, Ordering::Relaxed);
        self.budget.give_back(bytes);
    }
}

/// Shrinks `table` when it holds nothing, or no more than a quarter of its buckets hold
/// entries: after a flood of keys (an outage of the store with many clients) the room goes
/// back to the allocator instead of staying with a table that will not hold as many again
/// soon. Keeping twice the entries leaves room to grow without shrinking and growing back.
pub(crate) fn shrink<T: Expiring>(table: &mut HashTable<T>) {
    if table.capacity() > 4 * table.len().max(8) || table.is_empty() {
        table.shrink_to(2 * table.len(), Expiring::hash);
    }
}
