//! Leases: a hot key's units taken from the store k at a time, in one call, and spent by
//! this instance on its own checks of that key (docs/SPEC.md, "Leases").
//!
//! Why no window ever holds more than L across instances: every unit spent here was
//! recorded in the store by a take the store admitted, decided no earlier than the take
//! was sent, and is spent only while the store still counts it in every window around the
//! spend:
//!
//! - fixed window: before the window the take was counted in ends (the take's
//!   `reset_after`, counted from when it was sent), and within D;
//! - sliding log: within D of the take, the rule keeping its log over W + D (see
//!   [`Rule::with_lease`]): for any window of W, the store's check of the last of the
//!   takes and admissions whose units fall in it still counted every earlier one of them
//!   (each recorded at most D before its units were spent, so inside W + D of it);
//! - token bucket: tokens taken at t and spent later are later arrivals, which GCRA
//!   admits whenever it admitted them at t.
//!
//! The deadline is counted on the limiter's clock from when the take was sent, which is no
//! later than when the store decided it (on clocks that tick at the same rate, as the
//! negative cache's deadlines).
//!
//! A key takes a lease only while it is hot at this instance: its checks asked k units in
//! one span of D (spans aligned on the limiter's clock; the current span or the one
//! before). A take's units left unspent at its deadline are lost to admissions until the
//! store lets them go, and a key that asks fewer than k units per span would lose most of
//! every take: it goes to the store as without the lease.
//!
//! Memory: at most [`MAX_LEASES`] keys, their bytes counted in the memory budget's `lease`
//! part; expired ones are dropped first, and when none has expired a take's units left
//! over are not kept: fewer admissions, never more. What keys asked lately is a table of
//! fixed size ([`HEAT_SLOTS_PER_SHARD`] slots a shard, each shard allocated when a key first
//! reaches it).

use std::hash::Hasher;
use std::sync::Arc;

use super::room::{Expiring, ExpiringTable, Sharded};
use crate::budget::BudgetPart;
use crate::clock::Clock;
use crate::decision::{Decision, RetryAfter};
use crate::rule::{Algorithm, Lease, Rule};
use crate::store::{Charge, Check, Limit};

/// The name of the leases' part of a memory budget.
pub(crate) const LEASE_PART: &str = "lease";

/// The most keys with a lease at once: leases are for hot keys, of which there are few.
const MAX_LEASES: usize = 10_000;

/// Slots of the heat table per shard: with its 64 shards, what 4,096 keys asked lately,
/// 128 KiB in all.
const HEAT_SLOTS_PER_SHARD: usize = 64;

/// The leases this instance holds, by rule and key.
#[derive(Debug)]
pub(crate) struct Leases {
    table: ExpiringTable<Held>,
    /// What the checks of leased keys asked lately: a slot per hash, direct-mapped.
    heat: Sharded<Vec<Heat>>,
}

/// The units one key's checks asked of this instance in the current span of D (spans of D
/// aligned on the limiter's clock) and in the one before. A slot that another key counted
/// in within its current span or the one before stays that key's: a key whose hash falls
/// on it is not counted, and takes no lease until the slot is free again, so two keys on
/// one slot never undo each other's counts, whatever their rules' D. A key left out so
/// costs store calls, never admissions. No key is ever added or dropped, so no number of
/// keys grows the table or makes a check scan it.
#[derive(Clone, Copy, Debug, Default)]
struct Heat {
    hash: u64,
    /// The end of the span after the one `units` counts in: until then the slot is its
    /// key's. Its key's D gives back that span (`live_until / D − 2`).
    live_until: u64,
    units: u64,
    before: u64,
}

impl Heat {
    /// Counts `units` asked at `now` of the key filed under `hash`, whose spans are `d` µs
    /// long; whether the key is hot: at least `k` units asked in this span or in the one
    /// before. False, counting nothing, for a key that finds the slot another's.
    fn count(&mut self, hash: u64, now: u64, d: u64, units: u64, k: u64) -> bool {
        if self.hash != hash {
            if self.units > 0 && now < self.live_until {
                return false;
            }
            *self = Heat {
                hash,
                ..Heat::default()
            };
        }
        let span = now / d;
        let counted_in = (self.live_until / d).wrapping_sub(2);
        if span != counted_in {
            // A clock gone back starts afresh, as a gap of more than a span does.
            self.before = if span == counted_in.wrapping_add(1) {
                self.units
            } else {
                0
            };
            self.live_until = span.saturating_add(2).saturating_mul(d);
            self.units = 0;
        }
        self.units = self.units.saturating_add(units);
        self.units >= k || self.before >= k
    }
}

/// Units of one key this instance holds.
#[derive(Debug)]
struct Held {
    /// The hash of the rule's fingerprint and the key, kept so that the table can grow
    /// without rehashing keys.
    hash: u64,
    rule: Rule,
    key: Box<str>,
    /// Units taken and not yet spent.
    units: u64,
    /// When they may no longer be spent (µs of the limiter's clock).
    until: u64,
    /// What the store said remained after the last take.
    remaining: u64,
    /// When the store's state is back to empty, as the last take said (µs of the
    /// limiter's clock).
    reset_at: u64,
}

impl Expiring for Held {
    fn until(&self) -> u64 {
        self.until
    }

    fn hash(&self) -> u64 {
        self.hash
    }

    fn bytes(&self) -> usize {
        held_bytes(&self.key)
    }
}

/// The bytes of a lease of `key`: its bucket and its key.
fn held_bytes(key: &str) -> usize {
    size_of::<Held>() + 1 + key.len()
}

impl Held {
    fn holds(&self, limit: &Limit<'_>) -> bool {
        *self.key == *limit.key && self.rule.same_rule(limit.rule)
    }
}

impl Leases {
    pub(crate) fn new(clock: Arc<dyn Clock>, budget: BudgetPart) -> Self {
        Leases {
            table: ExpiringTable::new(MAX_LEASES, clock, budget),
            heat: Sharded::new(),
        }
    }

    /// The lease a check is answered under: one limit whose rule leases, no request id,
    /// no time of its own, a check (envoy's counting too) of one cost from 1 to k. Any
    /// other check of a leased rule goes to the store as it would without the lease.
    pub(crate) fn applies(check: &Check<'_>) -> Option<Lease> {
        let [limit] = check.limits else {
            return None;
        };
        let lease = limit.rule.lease()?;
        (check.request_id.is_none()
            && check.at.is_none()
            && check.costs.is_empty()
            && matches!(check.charge, Charge::Check | Charge::CheckChargingRefusals)
            && (1..=lease.units()).contains(&check.cost))
        .then_some(lease)
    }

    /// Counts a check of `cost` units of the key filed under `hash` at `now`, and says
    /// whether the key is hot here: its checks asked at least k units in the current span
    /// of D or in the one before. Only a hot key takes a lease.
    pub(crate) fn hot(&self, hash: u64, lease: Lease, cost: u64, now: u64) -> bool {
        let mut shard = self.heat.shard(hash).lock();
        if shard.is_empty() {
            shard.resize(HEAT_SLOTS_PER_SHARD, Heat::default());
        }
        // The shard was picked by the hash's high half; the slot is picked by its low one.
        let slot = &mut shard[hash as usize % HEAT_SLOTS_PER_SHARD];
        slot.count(hash, now, lease.spend_within_micros(), cost, lease.units())
    }

    /// The hash a lease of `limit` is filed under.
    pub(crate) fn hash(&self, limit: &Limit<'_>) -> u64 {
        let mut hasher = self.table.hasher();
        hasher.write_u64(limit.rule.fingerprint());
        hasher.write(limit.key.as_bytes());
        hasher.finish()
    }

    /// Spends `cost` units of the lease of `limit` (filed under `hash`) at `now`, if this
    /// instance holds that many that may still be spent: the decision, as the store would
    /// have answered a check of the units spent so far at the take.
    pub(crate) fn spend(
        &self,
        limit: &Limit<'_>,
        hash: u64,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let mut shard = self.table.shard(hash).lock();
        let Ok(mut found) = shard.find_entry(hash, |h| h.hash == hash && h.holds(limit)) else {
            return None;
        };
        let held = found.get_mut();
        if held.until <= now {
            self.table.give_back(found.remove().0.bytes());
            return None;
        }
        if held.units < cost {
            return None;
        }
        held.units -= cost;
        let capacity = held.rule.capacity();
        let decision = Decision {
            allowed: true,
            limit: capacity,
            remaining: held.remaining.saturating_add(held.units).min(capacity),
            retry_after: RetryAfter::micros(0),
            reset_after: held.reset_at.saturating_sub(now),
            delay: 0,
        };
        if held.units == 0 {
            self.table.give_back(found.remove().0.bytes());
        }
        Some(decision)
    }

    /// Keeps `left` units of a take of `limit` sent at `sent`, which
    /// the store admitted with `taken`, at `now`: added to those still held, which may
    /// then be spent only until the earlier of the two deadlines. Returns the units now
    /// held (0 when none may be kept).
    pub(crate) fn keep(
        &self,
        limit: &Limit<'_>,
        lease: Lease,
        left: u64,
        sent: u64,
        now: u64,
        taken: &Decision,
    ) -> u64 {
        let mut spend_within = lease.spend_within_micros();
        if limit.rule.algorithm() == Algorithm::FixedWindow {
            // An admitted fixed window's `reset_after` is the time left in its window.
            spend_within = spend_within.min(taken.reset_after);
        }
        let until = sent.saturating_add(spend_within);
        if left == 0 || until <= now {
            return 0;
        }
        let reset_at = sent.saturating_add(taken.reset_after);
        let hash = self.hash(limit);
        let add = |held: &mut Held| {
            // Units of two takes share the earlier deadline; none left, none to share it.
            if held.until <= now || held.units == 0 {
                held.units = left;
                held.until = until;
            } else {
                held.units = held.units.saturating_add(left);
                held.until = held.until.min(until);
            }
            held.remaining = taken.remaining;
            held.reset_at = reset_at;
            held.units
        };
        let find = |h: &Held| h.hash == hash && h.holds(limit);
        if let Some(held) = self.table.shard(hash).lock().find_mut(hash, find) {
            return add(held);
        }
        let bytes = held_bytes(limit.key);
        if !self.table.reserve(bytes) {
            return 0;
        }
        let mut shard = self.table.shard(hash).lock();
        // Another take of the key may have been kept while the room was taken.
        if let Some(held) = shard.find_mut(hash, find) {
            let units = add(held);
            drop(shard);
            self.table.give_back(bytes);
            return units;
        }
        shard.insert_unique(
            hash,
            Held {
                hash,
                rule: limit.rule.clone(),
                key: limit.key.into(),
                units: left,
                until,
                remaining: taken.remaining,
                reset_at,
            },
            Expiring::hash,
        );
        left
    }
}

#[cfg(test)]
mod tests {
    use super::Heat;

    /// k = 4, D = 1 µs (a span per µs): hot once a span asked 4 units, through the span
    /// after it; cold again after a span that asked fewer, or after a gap of a span. A slot
    /// counted in lately stays its key's; a stale one goes to the next key that falls on it.
    #[test]
    fn a_key_is_hot_while_a_span_of_d_asks_k_units() {
        let mut heat = Heat::default();
        assert!(
            Heat::default().count(9, 0, 1, 4, 4),
            "a slot never counted in is free, at span 0 too"
        );
        let count =
            |heat: &mut Heat, key: u64, span: u64, units: u64| heat.count(key, span, 1, units, 4);
        assert!(!count(&mut heat, 7, 10, 1));
        assert!(!count(&mut heat, 7, 10, 2));
        assert!(count(&mut heat, 7, 10, 1), "4 units in span 10");
        assert!(
            count(&mut heat, 7, 11, 1),
            "the span after one that asked 4"
        );
        assert!(!count(&mut heat, 7, 12, 1), "span 11 asked 1");
        assert!(count(&mut heat, 7, 12, 3));
        assert!(!count(&mut heat, 7, 14, 1), "span 13 asked nothing");
        assert!(
            !count(&mut heat, 7, 13, 1),
            "a clock gone back counts afresh"
        );
        assert!(count(&mut heat, 7, 13, 3));
        assert!(
            !count(&mut heat, 8, 13, 4),
            "key 7's slot, counted in this span"
        );
        assert!(!count(&mut heat, 8, 14, 4), "and in the span before");
        assert!(
            count(&mut heat, 7, 14, 1),
            "key 7's 4 units of span 13 still count"
        );
        assert!(count(&mut heat, 8, 16, 4), "a stale slot is key 8's");
        assert!(!count(&mut heat, 7, 16, 4), "now key 8's");
    }

    /// Keys of rules with different D on one slot: the slot stays its key's until the end
    /// of the span after the one it counted in, on that key's D.
    #[test]
    fn a_slot_stays_its_keys_whatever_the_other_keys_d() {
        let mut heat = Heat::default();
        // Key 7, D = 1,000 µs: 4 units at 10,000 µs (span 10), its slot until 12,000.
        assert!(heat.count(7, 10_000, 1_000, 4, 4));
        // Key 8, D = 10 µs: its spans say nothing of key 7's.
        assert!(!heat.count(8, 10_500, 10, 4, 4));
        assert!(!heat.count(8, 11_990, 10, 4, 4));
        // Key 7 again in span 11: the slot is its own until 13,000.
        assert!(heat.count(7, 11_500, 1_000, 1, 4), "span 10 asked 4");
        assert!(!heat.count(8, 12_990, 10, 4, 4));
        assert!(heat.count(8, 13_000, 10, 4, 4), "key 7's slot is stale");
    }
}
