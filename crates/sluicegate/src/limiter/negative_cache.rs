//! The negative cache: a check the store refused with `retry_after` R is refused locally
//! until R has passed, without a round trip.
//!
//! Why this never admits a request the store would reject: it never admits anything. Its
//! only answer is a refusal, and it gives it only while the store would refuse too:
//!
//! - `retry_after` is the wait before a request *of the same cost, under the same limits*
//!   could be allowed *with no other traffic* (docs/SPEC.md). Other traffic only takes units,
//!   and a refused check takes none, so with any traffic the wait can only be longer. So
//!   an entry answers only checks with the same limits and the same cost. (The answer's
//!   `remaining` is as the store last reported it.)
//! - The wait is counted from when the check was *sent*, which is no later than when the
//!   store decided it, so the local deadline never outlasts the store's refusal (on clocks
//!   that tick at the same rate; the limiter's [`Clock`] is monotonic).
//! - Checks that carry a request id bypass it (the store may recognise a retried
//!   admission and allow it), and so do checks that carry their own time, and reports,
//!   settles and refunds, which are never refused.
//! - A refund or a settle can free units. A refusal that was decided before the refund
//!   applied can come back after that, so the cache keeps no refusal of a check sent while
//!   a refund of one of its limits was in flight, or sent before one was answered
//!   ([`Freeing`]). Once a refund is answered, the cache forgets the refusals of one limit
//!   it holds for its limits, by rule identity whatever the numbers (`forget`, one lookup
//!   per limit); a refusal of several limits is not looked for (that would walk the whole
//!   table per refund): a hit on one checks, per limit, that no refund was answered since
//!   it was sent. Refunds are told apart by a hash of (rule identity, key) into
//!   [`FREEING_SLOTS`] slots: two limits that share a slot only make the cache keep less.
//!
//! Memory: at most `capacity` entries, their bytes counted in the memory budget's
//! `negative-cache` part; expired ones are dropped first, and when none has
//! expired a new refusal is simply not cached (a miss only costs a round trip).
//!
//! Cost: a lookup is on the path of every check, so it hashes the check's limits where
//! they lie (each rule's precomputed fingerprint and the key's bytes), locks one of
//! `SHARDS` shards, and compares; no lock is shared by all checks, and nothing is
//! allocated but the answer to a hit on several limits. Only an insert copies the keys.

use std::hash::Hasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::room::{Expiring, ExpiringTable};
use crate::algorithm;
use crate::budget::BudgetPart;
use crate::clock::{Clock, ClockMicros};
use crate::decision::{Decision, RetryAfter};
use crate::rule::Rule;
use crate::store::{Charge, Check, Limit, Outcome};

/// Checks of more limits than this are not cached: entries stay small and comparing one
/// stays short.
const MAX_LIMITS: usize = 4;

/// Slots that track the refunds and settles of limits hashed into them.
const FREEING_SLOTS: usize = 1024;

/// The name of the negative cache's part of a memory budget.
pub(crate) const NEGATIVE_CACHE_PART: &str = "negative-cache";

#[derive(Debug)]
pub(crate) struct NegativeCache {
    table: ExpiringTable<Entry>,
    /// Per slot of (rule identity, key): refunds and settles in flight, and when the last
    /// one was answered (µs of the limiter's clock).
    freeing: Box<[FreeingSlot]>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct FreeingSlot {
    in_flight: AtomicU64,
    answered_at: AtomicU64,
}

/// A refund or a settle at the store: made by [`NegativeCache::freeing`], dropped when it
/// is answered (or given up: a dropped one may still have been applied), which makes the
/// cache forget the refusals its limits had.
pub(crate) struct Freeing<'a> {
    cache: &'a NegativeCache,
    limits: &'a [Limit<'a>],
}

impl Drop for Freeing<'_> {
    fn drop(&mut self) {
        let now = self.cache.clock.now_micros();
        for limit in self.limits {
            let slot = self.cache.freeing_slot(limit);
            // Answered before it leaves the flight: a refusal looking in between sees one.
            slot.answered_at.fetch_max(now, Ordering::SeqCst);
            slot.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        self.cache.forget(self.limits);
    }
}

#[derive(Debug)]
struct Entry {
    /// The hash of `limits`, kept so that the table can grow without rehashing keys.
    hash: u64,
    cost: u64,
    /// When the check was sent whose answer made this entry (µs of the limiter's clock).
    since: u64,
    until: u64,
    /// The check's limits, in its order, with the store's answer for each.
    limits: Box<[CachedLimit]>,
}

#[derive(Debug)]
struct CachedLimit {
    /// A handle on the rule (a reference count, not a copy).
    rule: Rule,
    key: Box<str>,
    decision: Decision,
}

impl Expiring for Entry {
    fn until(&self) -> u64 {
        self.until
    }

    fn hash(&self) -> u64 {
        self.hash
    }

    fn bytes(&self) -> usize {
        entry_bytes(self.limits.iter().map(|l| l.key.len()))
    }
}

/// The bytes of an entry of limits with keys of these lengths: its bucket, its limits'
/// box, and their keys.
fn entry_bytes(keys: impl ExactSizeIterator<Item = usize>) -> usize {
    size_of::<Entry>() + 1 + keys.len() * size_of::<CachedLimit>() + keys.sum::<usize>()
}

impl Entry {
    /// Whether this entry is for exactly these limits: the same rules (by identity and
    /// numbers: a reload that changes a limit is not answered from the old one) and keys,
    /// in the same order.
    fn holds(&self, limits: &[Limit<'_>]) -> bool {
        self.limits.len() == limits.len()
            && self
                .limits
                .iter()
                .zip(limits)
                .all(|(cached, l)| *cached.key == *l.key && cached.rule.same_rule(l.rule))
    }
}

impl NegativeCache {
    pub(crate) fn new(capacity: usize, clock: Arc<dyn Clock>, budget: BudgetPart) -> Self {
        NegativeCache {
            table: ExpiringTable::new(capacity, Arc::clone(&clock), budget),
            freeing: (0..FREEING_SLOTS).map(|_| FreeingSlot::default()).collect(),
            clock,
        }
    }

    /// Whether the cache answers checks of this shape at all.
    pub(crate) fn applies(check: &Check<'_>) -> bool {
        check.request_id.is_none()
            && check.at_micros().is_none()
            && check.limits.len() <= MAX_LIMITS
            // A refusal that is charged must reach the store to be counted.
            && check.charge == Charge::Check
            // Its entries hold one cost for every limit.
            && check.costs.is_empty()
    }

    /// Marks a refund or a settle of `limits` in flight until the guard is dropped.
    pub(crate) fn freeing<'a>(&'a self, limits: &'a [Limit<'a>]) -> Freeing<'a> {
        for limit in limits {
            self.freeing_slot(limit)
                .in_flight
                .fetch_add(1, Ordering::SeqCst);
        }
        Freeing {
            cache: self,
            limits,
        }
    }

    fn freeing_slot(&self, limit: &Limit<'_>) -> &FreeingSlot {
        // The rule's fingerprint hashes its identity only: overrides share a slot.
        let hash = self.hash(std::slice::from_ref(limit));
        &self.freeing[(hash >> 32) as usize % FREEING_SLOTS]
    }

    /// Whether a refusal of a check of `limits` sent at `sent` may be stale: a refund or a
    /// settle of one of them is in flight, or was answered since `sent`.
    fn may_be_stale(&self, limits: &[Limit<'_>], sent: u64) -> bool {
        limits.iter().any(|limit| {
            let slot = self.freeing_slot(limit);
            slot.in_flight.load(Ordering::SeqCst) > 0
                || slot.answered_at.load(Ordering::SeqCst) >= sent
        })
    }

    /// Each limit's rule fingerprint and key, length-prefixed so that no two lists of
    /// limits feed the hasher the same bytes.
    pub(crate) fn hash(&self, limits: &[Limit<'_>]) -> u64 {
        let mut hasher = self.table.hasher();
        for limit in limits {
            hasher.write_u64(limit.rule.fingerprint());
            hasher.write_usize(limit.key.len());
            hasher.write(limit.key.as_bytes());
        }
        hasher.finish()
    }

    /// The cached refusal of `check`, whose limits hash to `hash`, with its waits shortened
    /// by the time since. Here and below, `check` is one the cache [applies](Self::applies)
    /// to: the limiter asks that once per check.
    pub(crate) fn lookup(&self, check: &Check<'_>, hash: u64, now: u64) -> Option<Outcome> {
        let shard = self.table.shard(hash).lock();
        let entry = shard.find(hash, |e| e.holds(check.limits))?;
        if now >= entry.until || check.cost.max(1) != entry.cost {
            return None;
        }
        // A refund forgets entries of one limit; one of several it leaves to this look.
        if entry.limits.len() > 1 && self.may_be_stale(check.limits, entry.since) {
            return None;
        }
        let left = entry.until - now;
        let elapsed = now.saturating_sub(entry.since);
        let shorten = |d: Decision| Decision {
            retry_after: match d.retry_after.as_micros() {
                Some(us) if us > 0 => RetryAfter::micros(us.min(left).max(1)),
                _ => d.retry_after,
            },
            reset_after: d.reset_after.saturating_sub(elapsed),
            ..d
        };
        Some(match &*entry.limits {
            [one] => Outcome::single(shorten(one.decision)),
            several => Outcome::from_limits(several.iter().map(|l| shorten(l.decision)).collect()),
        })
    }

    /// Remembers a refusal the store gave to `check`, sent at `sent`.
    pub(crate) fn remember(
        &self,
        check: &Check<'_>,
        hash: u64,
        sent: u64,
        combined: Decision,
        limits: &[Decision],
    ) {
        let Some(wait) = combined.retry_after.as_micros() else {
            return;
        };
        if combined.allowed || wait == 0 {
            return;
        }
        self.insert(check, hash, sent, wait, limits);
    }

    /// Predicts a refusal from an admission of a one-limit check that left too little for
    /// another of the same cost, where the algorithm can tell the next opening from the
    /// decision alone (the same argument as above: with other traffic, later still).
    pub(crate) fn remember_admission(
        &self,
        check: &Check<'_>,
        hash: u64,
        sent: u64,
        decision: Decision,
    ) {
        let [limit] = check.limits else { return };
        let units = check.cost.max(1);
        if !decision.allowed || check.cost == 0 || decision.remaining >= units {
            return;
        }
        let Some(refused) = algorithm::refusal_after_admission(limit.rule, decision, units) else {
            return;
        };
        if let Some(wait) = refused.retry_after.as_micros()
            && wait > 0
        {
            self.insert(check, hash, sent, wait, &[refused]);
        }
    }

    /// Caches `decisions` (one per limit) for `check` until `wait` µs after `sent`,
    /// replacing what the same limits had cached, if the cache has room.
    fn insert(&self, check: &Check<'_>, hash: u64, sent: u64, wait: u64, decisions: &[Decision]) {
        // Room is taken before an entry for the same limits is replaced, so a full cache
        // of live refusals keeps them as they are.
        let bytes = entry_bytes(check.limits.iter().map(|l| l.key.len()));
        if !self.table.reserve(bytes) {
            return;
        }
        let entry = Entry {
            hash,
            cost: check.cost.max(1),
            since: sent,
            until: sent.saturating_add(wait),
            limits: check
                .limits
                .iter()
                .zip(decisions)
                .map(|(l, &decision)| CachedLimit {
                    rule: l.rule.clone(),
                    key: l.key.into(),
                    decision,
                })
                .collect(),
        };
        let mut shard = self.table.shard(hash).lock();
        // Looked at under the shard's lock, which `forget` takes too: a refund answered
        // after this look forgets the entry made here.
        if self.may_be_stale(check.limits, sent) {
            self.table.give_back(bytes);
            return;
        }
        if let Ok(old) = shard.find_entry(hash, |e| e.holds(check.limits)) {
            self.table.give_back(old.remove().0.bytes());
        }
        shard.insert_unique(hash, entry, |e| e.hash);
    }

    /// Forgets every refusal held for a check that names any of `limits`, by rule identity
    /// (an override with other numbers shares the state): a refund or a settle may have
    /// freed their units, and a refusal cached before could now be wrong.
    fn forget(&self, limits: &[Limit<'_>]) {
        for limit in limits {
            let hash = self.hash(std::slice::from_ref(limit));
            let mut shard = self.table.shard(hash).lock();
            while let Ok(entry) = shard.find_entry(hash, |e| match &*e.limits {
                [cached] => *cached.key == *limit.key && cached.rule.same_identity(limit.rule),
                _ => false,
            }) {
                self.table.give_back(entry.remove().0.bytes());
            }
        }
    }
}
