//! The negative cache: a check the store refused with `retry_after` R is refused locally
//! until R has passed, without a round trip.
//!
//! Why this never admits a request the store would reject: it never admits anything. Its
//! only answer is a refusal, and it gives it only while the store would refuse too:
//!
//! - `retry_after` is the wait before a request *of the same cost, under the same limits*
//!   could be allowed *with no other traffic* (SPEC.md). Other traffic only takes units,
//!   and a refused check takes none, so with any traffic the wait can only be longer. So
//!   an entry answers only checks with the same limits and the same cost. (The answer's
//!   `remaining` is as the store last reported it.)
//! - The wait is counted from when the check was *sent*, which is no later than when the
//!   store decided it, so the local deadline never outlasts the store's refusal (on clocks
//!   that tick at the same rate; the limiter's [`Clock`] is monotonic).
//! - Checks that carry a request id bypass it (the store may recognise a retried
//!   admission and allow it), and so do checks that carry their own time.
//!
//! Memory: at most `capacity` entries; expired ones are dropped first, and when none has
//! expired a new refusal is simply not cached (a miss only costs a round trip).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::algorithm;
use crate::clock::Clock;
use crate::decision::{Decision, RetryAfter};
use crate::store::Check;

#[derive(Debug)]
pub(crate) struct NegativeCache {
    entries: Mutex<HashMap<String, Entry>>,
    capacity: usize,
    /// The limiter's clock, read to drop expired entries when the cache is full.
    clock: Arc<dyn Clock>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    cost: u64,
    /// When the check was sent whose answer made this entry (µs of the limiter's clock).
    since: u64,
    until: u64,
    limits: usize,
    decisions: [Option<Decision>; MAX_LIMITS],
}

/// Checks of more limits than this are not cached (the entry stays a fixed size).
const MAX_LIMITS: usize = 4;

/// What identifies the limits of a check: each rule's identity and key, length-prefixed.
fn signature(check: &Check<'_>) -> String {
    let mut out = String::new();
    for limit in check.limits {
        for part in [limit.rule.identity(), limit.key] {
            out.push_str(&part.len().to_string());
            out.push(':');
            out.push_str(part);
        }
    }
    out
}

impl NegativeCache {
    pub(crate) fn new(capacity: usize, clock: Arc<dyn Clock>) -> Self {
        NegativeCache {
            entries: Mutex::new(HashMap::new()),
            capacity,
            clock,
        }
    }

    fn applies(check: &Check<'_>) -> bool {
        check.request_id.is_none() && check.at.is_none() && check.limits.len() <= MAX_LIMITS
    }

    /// The cached refusal of `check`, with its waits shortened by the time since.
    pub(crate) fn lookup(&self, check: &Check<'_>, now: u64) -> Option<Vec<Decision>> {
        if !Self::applies(check) {
            return None;
        }
        let entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = entries.get(&signature(check))?;
        if now >= entry.until || check.cost.max(1) != entry.cost {
            return None;
        }
        let left = entry.until - now;
        let elapsed = now.saturating_sub(entry.since);
        let shorten = |d: Decision| Decision {
            retry_after: match d.retry_after {
                RetryAfter::Micros(us) if us > 0 => RetryAfter::Micros(us.min(left).max(1)),
                other => other,
            },
            reset_after: d.reset_after.saturating_sub(elapsed),
            ..d
        };
        Some(
            entry.decisions[..entry.limits]
                .iter()
                .map(|d| shorten(d.expect("stored for every limit")))
                .collect(),
        )
    }

    /// Remembers a refusal the store gave to `check`, sent at `sent`.
    pub(crate) fn remember(
        &self,
        check: &Check<'_>,
        sent: u64,
        combined: Decision,
        limits: &[Decision],
    ) {
        let RetryAfter::Micros(wait) = combined.retry_after else {
            return;
        };
        if combined.allowed || wait == 0 || !Self::applies(check) {
            return;
        }
        let decisions: Vec<Option<Decision>> = limits.iter().copied().map(Some).collect();
        self.insert(check, sent, wait, &decisions);
    }

    /// Predicts a refusal from an admission of a one-limit check that left too little for
    /// another of the same cost, where the algorithm can tell the next opening from the
    /// decision alone (the same argument as above: with other traffic, later still).
    pub(crate) fn remember_admission(&self, check: &Check<'_>, sent: u64, decision: Decision) {
        let [limit] = check.limits else { return };
        let units = check.cost.max(1);
        if !decision.allowed
            || check.cost == 0
            || decision.remaining >= units
            || !Self::applies(check)
        {
            return;
        }
        let Some(refused) = algorithm::refusal_after_admission(limit.rule, decision, units) else {
            return;
        };
        if let RetryAfter::Micros(wait) = refused.retry_after
            && wait > 0
        {
            self.insert(check, sent, wait, &[Some(refused)]);
        }
    }

    fn insert(&self, check: &Check<'_>, sent: u64, wait: u64, limits: &[Option<Decision>]) {
        let mut decisions = [None; MAX_LIMITS];
        decisions[..limits.len()].copy_from_slice(limits);
        let entry = Entry {
            cost: check.cost.max(1),
            since: sent,
            until: sent.saturating_add(wait),
            limits: limits.len(),
            decisions,
        };
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= self.capacity {
            let now = self.clock.now_micros();
            entries.retain(|_, e| e.until > now);
            if entries.len() >= self.capacity {
                return;
            }
        }
        entries.insert(signature(check), entry);
    }
}
