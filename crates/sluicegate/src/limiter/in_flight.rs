//! Checks in flight, per set of limits: while one check of some limits is at the store,
//! later checks of the same limits wait for its answer instead of sending their own
//! (single flight). Once it is back, the negative cache knows whether they would be
//! refused — from its refusal, or predicted from an admission that used the limit up — and
//! answers them without a round trip; if not, they go on to the store together.
//!
//! Why this changes no decision: a waiting check is either refused by the negative cache,
//! whose refusals stand whatever else happens (see `negative_cache`), or sent to the store
//! as it would have been, only later. It only saves round trips: an abusive client with
//! eight checks in flight would otherwise send all eight before the first refusal is
//! cached, at every unit that frees up.
//!
//! Entries live only while a check is in flight, so the table is as large as the
//! concurrency. They are found by the hash of the limits alone: two sets of limits that
//! collide only make one wait for the other and then find no cached refusal — a later
//! round trip, not a different answer.

use std::sync::Arc;

use event_listener::{Event, EventListener};
use hashbrown::HashTable;
use parking_lot::Mutex;

use super::room::Sharded;

#[derive(Debug)]
pub(crate) struct InFlight {
    shards: Sharded<HashTable<Flight>>,
}

#[derive(Debug)]
struct Flight {
    hash: u64,
    /// Told when the check in flight is answered (or given up).
    answered: Arc<Event>,
}

/// What a check of some limits does when it would go to the store.
pub(crate) enum Joined<'a> {
    /// None is in flight: send it, and hold this until its answer is in the negative cache.
    Lead(Leading<'a>),
    /// One is in flight: wait for this, then look again.
    Wait(EventListener),
}

/// A check at the store that later checks of the same limits wait for; dropping it (after
/// the answer is remembered, or when the check is abandoned) lets them go.
pub(crate) struct Leading<'a> {
    table: &'a InFlight,
    hash: u64,
    answered: Arc<Event>,
}

impl InFlight {
    pub(crate) fn new() -> Self {
        InFlight {
            shards: Sharded::new(),
        }
    }

    fn shard(&self, hash: u64) -> &Mutex<HashTable<Flight>> {
        self.shards.shard(hash)
    }

    /// Leads the check of the limits hashed to `hash`, or waits for the one in flight.
    pub(crate) fn join(&self, hash: u64) -> Joined<'_> {
        let mut shard = self.shard(hash).lock();
        if let Some(flight) = shard.find(hash, |f| f.hash == hash) {
            // Listening under the lock: the leader notifies only after taking it.
            return Joined::Wait(flight.answered.listen());
        }
        let answered = Arc::new(Event::new());
        shard.insert_unique(
            hash,
            Flight {
                hash,
                answered: Arc::clone(&answered),
            },
            |f| f.hash,
        );
        Joined::Lead(Leading {
            table: self,
            hash,
            answered,
        })
    }
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let mut shard = self.table.shard(self.hash).lock();
        if let Ok(flight) =
            shard.find_entry(self.hash, |f| Arc::ptr_eq(&f.answered, &self.answered))
        {
            flight.remove();
        }
        drop(shard);
        self.answered.notify(usize::MAX);
    }
}
