//! The request ids one state remembers (docs/SPEC.md, "Retries" and "Usage", request ids):
//! an admission's, so that a retry is not counted twice, and a reservation's units, for its
//! settle; and the ids of reports, settles and refunds, each mode in its own namespace.

use super::Charge;

/// The ids a state remembers, oldest first. Boxed, like the logs, to keep a state small:
/// the memory store holds it inline in its hash table, where every byte of an entry is a
/// byte of cache a lookup drags in.
#[derive(Clone, Debug, Default)]
pub(super) struct RequestIds {
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer: 8 bytes in every entry instead of a Vec's 24"
    )]
    ids: Option<Box<Vec<Remembered>>>,
}

/// Which ids an id is compared with: a `check` and a `reserve` are both admissions; each
/// never-refused mode keeps its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Namespace {
    Admission,
    Report,
    Settle,
    Refund,
}

impl Namespace {
    pub(super) fn of(charge: Charge) -> Self {
        match charge {
            Charge::Admitted | Charge::Attempted | Charge::Reserved => Namespace::Admission,
            Charge::Reported => Namespace::Report,
            Charge::Settled => Namespace::Settle,
            Charge::Refunded => Namespace::Refund,
        }
    }
}

/// One remembered id.
#[derive(Clone, Debug)]
pub(super) struct Remembered {
    pub(super) request_id: Box<str>,
    pub(super) namespace: Namespace,
    /// A reservation's units, until a settle uses them up; 0 for every other id.
    pub(super) reserved: u64,
    /// Until when the id is remembered.
    pub(super) expires_at: u64,
    /// When the admitted request could go on (`delay` for leaky-bucket).
    pub(super) release_at: u64,
}

impl RequestIds {
    fn find_mut(&mut self, namespace: Namespace, id: &str, now: u64) -> Option<&mut Remembered> {
        self.ids
            .as_deref_mut()?
            .iter_mut()
            .find(|r| r.namespace == namespace && r.expires_at > now && &*r.request_id == id)
    }

    fn find(&self, namespace: Namespace, id: &str, now: u64) -> Option<&Remembered> {
        self.ids
            .as_deref()?
            .iter()
            .find(|r| r.namespace == namespace && r.expires_at > now && &*r.request_id == id)
    }

    /// The release time of a live admission with this id: a retry of it is a repeat.
    pub(super) fn admission(&self, id: &str, now: u64) -> Option<u64> {
        self.find(Namespace::Admission, id, now)
            .map(|r| r.release_at)
    }

    /// Whether an id of this namespace is still remembered at `now`.
    pub(super) fn holds(&self, namespace: Namespace, id: &str, now: u64) -> bool {
        self.find(namespace, id, now).is_some()
    }

    /// The units of the live reservation with this id, used up: a later settle finds none.
    pub(super) fn take_reservation(&mut self, id: &str, now: u64) -> u64 {
        self.find_mut(Namespace::Admission, id, now)
            .map_or(0, |r| std::mem::take(&mut r.reserved))
    }

    /// Remembers an id, forgetting those that have expired at `now`.
    pub(super) fn remember(&mut self, now: u64, remembered: Remembered) {
        self.forget_expired(now);
        self.ids.get_or_insert_default().push(remembered);
    }

    /// Forgets the ids that have expired at `now`: a state does so whenever it is written
    /// (docs/SPEC.md, "Usage", request ids).
    pub(super) fn forget_expired(&mut self, now: u64) {
        if let Some(ids) = &mut self.ids {
            ids.retain(|r| r.expires_at > now);
        }
    }

    /// Until when the last of these ids is remembered (0 for none).
    pub(super) fn expires_at(&self) -> u64 {
        self.ids
            .iter()
            .flat_map(|ids| ids.iter())
            .map(|r| r.expires_at)
            .max()
            .unwrap_or(0)
    }
}
