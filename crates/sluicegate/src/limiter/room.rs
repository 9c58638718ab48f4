//! The bound on a sharded table's entries, shared by the tables that forget what has
//! expired only when they are full (the negative cache, the local fallback's seeds).

use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub(crate) struct Room {
    /// Entries across all shards; at most `capacity`.
    len: AtomicUsize,
    capacity: usize,
}

impl Room {
    pub(crate) fn new(capacity: usize) -> Self {
        Room {
            len: AtomicUsize::new(0),
            capacity,
        }
    }

    /// Takes room for one entry. When the table is full, `drop_expired` drops what has
    /// expired and returns how many entries it dropped, and the room is tried once more.
    pub(crate) fn take(&self, drop_expired: impl FnOnce() -> usize) -> bool {
        let take = || {
            self.len
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < self.capacity).then_some(n + 1)
                })
                .is_ok()
        };
        if take() {
            return true;
        }
        self.give_back(drop_expired());
        take()
    }

    /// Gives back the room of `entries` removed.
    pub(crate) fn give_back(&self, entries: usize) {
        self.len.fetch_sub(entries, Ordering::Relaxed);
    }
}
