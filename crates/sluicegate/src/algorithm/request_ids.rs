//! The request ids one state remembers (docs/SPEC.md, "Retries" and "Usage", request ids):
//! an admission's, so that a retry is not counted twice, and a reservation's units, for its
//! settle; and the ids of reports, settles and refunds, each mode in its own namespace.
//!
//! A state can hold millions of ids (a daily budget with an id per call), so they are
//! indexed by (namespace, id) for the lookups and kept in a min-heap by expiry for the
//! forgetting: neither walks every id.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::{BuildHasher, Hash, Hasher};

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use super::Charge;

/// The ids a state remembers. Boxed, like the logs, to keep a state small: the memory store
/// holds it inline in its hash table, where every byte of an entry is a byte of cache a
/// lookup drags in.
#[derive(Clone, Debug, Default)]
pub(super) struct RequestIds {
    ids: Option<Box<Index>>,
}

#[derive(Clone, Debug, Default)]
struct Index {
    by_id: HashTable<Remembered>,
    /// (expires_at, hash) of every id remembered, the soonest to expire on top. A line that
    /// surfaces drops the entry of its hash that expires then, if any: whichever id that is,
    /// it has expired. An id remembered again (after it expired) leaves its old line here
    /// until it surfaces, and the line then finds nothing.
    by_expiry: BinaryHeap<Reverse<(u64, u64)>>,
    hasher: RandomState,
    /// The latest `expires_at` of the ids held: each expires at or before it.
    last_expiry: u64,
    /// The bytes of the ids held, for [`RequestIds::heap_bytes`].
    id_bytes: usize,
}

/// Which ids an id is compared with: a `check` and a `reserve` are both admissions; each
/// never-refused mode keeps its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Namespace {
    Admission,
    Report,
    Settle,
    Refund,
}

impl Namespace {
    pub(super) fn of(charge: Charge) -> Self {
        match charge {
            Charge::Check | Charge::CheckChargingRefusals | Charge::Reserve => Namespace::Admission,
            Charge::Report => Namespace::Report,
            Charge::Settle => Namespace::Settle,
            Charge::Refund => Namespace::Refund,
        }
    }
}

/// What a request id was used for: its mode and its cost (docs/SPEC.md, "Retries"). A
/// later check with the id while it is remembered is a retry only if it asks the same;
/// else it is a conflicting reuse, refused as an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestUse {
    /// The mode: `CheckChargingRefusals` is held as `Check`, both a `check`.
    pub mode: Charge,
    /// The cost the check asked (its limit's own, when each has one).
    pub cost: u64,
}

impl RequestUse {
    /// A use of `cost` in mode `charge`.
    pub fn new(charge: Charge, cost: u64) -> Self {
        let mode = match charge {
            Charge::CheckChargingRefusals => Charge::Check,
            mode => mode,
        };
        RequestUse { mode, cost }
    }
}

impl std::fmt::Display for RequestUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of cost {}", self.mode.name(), self.cost)
    }
}

/// One remembered id.
#[derive(Clone, Debug)]
pub(super) struct Remembered {
    pub(super) request_id: Box<str>,
    pub(super) namespace: Namespace,
    /// What the id was used for: a retry asks the same.
    pub(super) used: RequestUse,
    /// A reservation's units and where they were put, until a settle uses them up.
    pub(super) reservation: Option<Reservation>,
    /// Until when the id is remembered.
    pub(super) expires_at: u64,
    /// When the admitted request could go on (`delay` for leaky-bucket).
    pub(super) release_at: u64,
}

/// What a `reserve` recorded (docs/SPEC.md, "Settle"): `units` at instant `at`, and, for
/// the GCRA algorithms, `tat`, the TAT it set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub(crate) units: u64,
    pub(crate) at: u64,
    pub(crate) tat: u64,
}

impl Index {
    /// Forgets the ids that have expired at `now`; whether none is left.
    #[inline(never)]
    fn forget_expired(&mut self, now: u64) -> bool {
        while let Some(Reverse((expires_at, ..))) = self.by_expiry.peek()
            && *expires_at <= now
        {
            let Reverse((expires_at, hash)) = self.by_expiry.pop().expect("peeked just now");
            if let Ok(held) = self.by_id.find_entry(hash, |r| r.expires_at == expires_at) {
                self.id_bytes -= held.remove().0.request_id.len();
            }
        }
        self.by_id.is_empty()
    }

    fn hash(&self, namespace: Namespace, id: &str) -> u64 {
        id_hash(&self.hasher, namespace, id)
    }

    /// The id of this name, if it is still remembered at `now` (and below, the same
    /// lookup for a change).
    fn live(&self, namespace: Namespace, id: &str, now: u64) -> Option<&Remembered> {
        let hash = self.hash(namespace, id);
        self.by_id
            .find(hash, |r| r.is(namespace, id))
            .filter(|r| r.expires_at > now)
    }

    fn live_mut(&mut self, namespace: Namespace, id: &str, now: u64) -> Option<&mut Remembered> {
        let hash = self.hash(namespace, id);
        self.by_id
            .find_mut(hash, |r| r.is(namespace, id))
            .filter(|r| r.expires_at > now)
    }
}

impl Remembered {
    /// Whether this is the id `id` of `namespace`.
    fn is(&self, namespace: Namespace, id: &str) -> bool {
        self.namespace == namespace && *self.request_id == *id
    }
}

impl RequestIds {
    fn live(&self, namespace: Namespace, id: &str, now: u64) -> Option<&Remembered> {
        self.ids.as_deref()?.live(namespace, id, now)
    }

    /// What a live id of this namespace was used for, when it differs from `asked`: a
    /// conflicting reuse.
    pub(super) fn conflict(
        &self,
        namespace: Namespace,
        id: &str,
        now: u64,
        asked: RequestUse,
    ) -> Option<RequestUse> {
        self.live(namespace, id, now)
            .map(|r| r.used)
            .filter(|&used| used != asked)
    }

    /// The release time of a live admission with this id: a retry of it is a repeat.
    pub(super) fn admission(&self, id: &str, now: u64) -> Option<u64> {
        self.live(Namespace::Admission, id, now)
            .map(|r| r.release_at)
    }

    /// Whether an id of this namespace is still remembered at `now`.
    pub(super) fn holds(&self, namespace: Namespace, id: &str, now: u64) -> bool {
        self.live(namespace, id, now).is_some()
    }

    /// The live reservation with this id, used up: a later settle finds none.
    pub(super) fn take_reservation(&mut self, id: &str, now: u64) -> Option<Reservation> {
        self.ids
            .as_deref_mut()?
            .live_mut(Namespace::Admission, id, now)?
            .reservation
            .take()
    }

    /// Remembers an id (replacing an expired one of the same name), forgetting those that
    /// have expired at `now`.
    pub(super) fn remember(&mut self, now: u64, remembered: Remembered) {
        self.forget_expired(now);
        let index = self.ids.get_or_insert_default();
        let hash = index.hash(remembered.namespace, &remembered.request_id);
        index.last_expiry = index.last_expiry.max(remembered.expires_at);
        index.by_expiry.push(Reverse((remembered.expires_at, hash)));
        let hasher = &index.hasher;
        match index.by_id.entry(
            hash,
            |r| r.is(remembered.namespace, &remembered.request_id),
            |r| id_hash(hasher, r.namespace, &r.request_id),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut held) => *held.get_mut() = remembered,
            hashbrown::hash_table::Entry::Vacant(slot) => {
                index.id_bytes += remembered.request_id.len();
                slot.insert(remembered);
            }
        }
    }

    /// Forgets the ids that have expired at `now`: a state does so whenever it records
    /// (docs/SPEC.md, "Usage", request ids). Costs one heap pop per id forgotten.
    // The test inline, the work out of line: nearly every state records with no id held.
    #[inline]
    pub(super) fn forget_expired(&mut self, now: u64) {
        if let Some(index) = self.ids.as_deref_mut()
            && index.forget_expired(now)
        {
            self.ids = None;
        }
    }

    /// About what remembering one more id of `id_len` bytes adds on the heap: its entry in
    /// each table, and the id. A table that must grow to take it grows by more; this is
    /// what is asked of a budget before an id is remembered, and what it holds is then
    /// counted exactly.
    pub(crate) fn one_more(id_len: usize) -> usize {
        size_of::<Remembered>() + 1 + size_of::<Reverse<(u64, u64)>>() + id_len
    }

    /// The bytes these ids hold on the heap: the index, its tables' capacities and the
    /// ids themselves.
    #[inline]
    pub(super) fn heap_bytes(&self) -> usize {
        self.ids.as_deref().map_or(0, |index| {
            size_of::<Index>()
                + index.by_id.capacity() * (size_of::<Remembered>() + 1)
                + index.by_expiry.capacity() * size_of::<Reverse<(u64, u64)>>()
                + index.id_bytes
        })
    }

    /// Until when the last of these ids is remembered (0 for none).
    pub(super) fn expires_at(&self) -> u64 {
        self.ids.as_deref().map_or(0, |index| index.last_expiry)
    }
}

fn id_hash(hasher: &RandomState, namespace: Namespace, id: &str) -> u64 {
    let mut hasher = hasher.build_hasher();
    namespace.hash(&mut hasher);
    id.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod heap_tests {
    use super::*;

    fn id(name: &str, expires_at: u64) -> Remembered {
        Remembered {
            request_id: name.into(),
            namespace: Namespace::Admission,
            used: RequestUse::new(Charge::Check, 1),
            reservation: None,
            expires_at,
            release_at: 0,
        }
    }

    /// The bytes counted are the ids held now: an id forgotten takes its bytes with it.
    #[test]
    fn heap_bytes_follow_the_ids_held() {
        let mut ids = RequestIds::default();
        assert_eq!(ids.heap_bytes(), 0);
        ids.remember(0, id(&"a".repeat(200), 10));
        ids.remember(0, id("b", 20));
        let index = ids.ids.as_deref().unwrap();
        let tables = size_of::<Index>()
            + index.by_id.capacity() * (size_of::<Remembered>() + 1)
            + index.by_expiry.capacity() * size_of::<Reverse<(u64, u64)>>();
        assert_eq!(ids.heap_bytes(), tables + 201);
        ids.forget_expired(10);
        assert_eq!(ids.heap_bytes(), tables + 1, "the 200-byte id is gone");
        ids.forget_expired(20);
        assert_eq!(ids.heap_bytes(), 0);
    }
}
