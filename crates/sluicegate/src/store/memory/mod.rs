//! The in-memory store: a sharded hash table of (rule, key) → state, each shard behind its
//! own mutex, so checks on different keys rarely contend and no lock is global.
//!
//! Why a lock per shard and not a concurrent map: a check of several rules must be atomic
//! across all its keys. Locking the shards it touches in ascending order gives that without
//! deadlock, and a check of one rule, the common case, takes exactly one lock and one hash
//! lookup. The lock is a reader-writer lock so that, when a hot key is contended, refusals
//! (which only read) are decided side by side (see `check_one`).
//!
//! Keys are hashed with foldhash, seeded at random per store: a fraction of SipHash's cost,
//! and without the seed a client cannot aim keys at one bucket.
//!
//! Memory stays bounded two ways. Idle state expires: each shard drops the entries whose
//! state is back to empty at most once per [`SWEEP_INTERVAL`] when a check touches it, and
//! [`MemoryStore::sweep`] sweeps all (the server calls it periodically). And a hard cap,
//! `max_keys`, bounds live (rule, key) entries: at the cap, a check that would create a new
//! entry first sweeps its shard, then fails with [`StoreError::KeyCapacity`] — it is neither
//! allowed nor rejected, and no existing entry is evicted, so a flood of new keys cannot
//! push a busy key's state out and reset its limit. Keys already held keep deciding
//! exactly; peeks and refused checks never create entries.
//!
//! A key being refused is decided without the lock: each shard publishes the state of the
//! fixed window or bucket it refused last ([`refusal_hint`]), and its next refusals are
//! read from there.

mod refusal_hint;

use parking_lot::{RwLock, RwLockWriteGuard};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use refusal_hint::{HintedRule, RefusalHint};

use super::check::{Check, Outcome, Store};
use super::error::StoreError;
use super::key::{stored_key, with_stored_keys};
use crate::algorithm::{self, RuleState, StateWords};
use crate::clock::{Clock, SystemClock};
use crate::rule::Rule;

/// How often (µs of store time) a shard drops expired entries when checks touch it.
pub const SWEEP_INTERVAL: u64 = 1_000_000;

/// Settings of a [`MemoryStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryStoreConfig {
    /// The most (rule, key) entries held at once.
    pub max_keys: usize,
    /// Number of independently locked shards (rounded up to a power of two).
    pub shards: usize,
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        MemoryStoreConfig {
            max_keys: 1_000_000,
            shards: 64,
        }
    }
}

/// The in-memory store. See the module documentation for memory bounds.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[RwLock<Shard>]>,
    /// Each shard's refusal hint, beside its lock, not under it: read without it.
    hints: Box<[RefusalHint]>,
    shard_mask: u64,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    /// Entries across all shards; at most `max_keys`.
    keys: AtomicUsize,
    max_keys: usize,
}

/// Aligned to two cache lines so that threads working in neighbouring shards never share a
/// line (adjacent-line prefetch pairs lines, hence 128).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    table: HashTable<Slot>,
    next_sweep: u64,
    /// The rule this shard's hint names.
    hinted: HintedRule,
}

/// One (rule, key) entry: one cache line, aligned to it, so a lookup that finds it reads one
/// line, a short key included. Half the 128 bytes of an entry that held a sliding log's
/// header inline: with 100,000 keys the table is what misses the cache, and at 64 bytes
/// twice as much of it stays there (the log's header is one more read, its buffer was one
/// already).
#[derive(Debug)]
#[repr(align(64))]
struct Slot {
    rule: Rule,
    key: CompactKey,
    state: RuleState,
}

impl Slot {
    fn holds(&self, rule: &Rule, key: &str) -> bool {
        self.key.as_bytes() == key.as_bytes() && self.rule.same_identity(rule)
    }
}

/// A key stored inline when it is short (user ids, most IPv4 addresses), so comparing it
/// costs no pointer chase, and on the heap otherwise. 16 bytes: a longer key's box is a
/// thin pointer to the string's own box, so the tag and the inline bytes fit beside it.
#[derive(Debug)]
enum CompactKey {
    Inline {
        len: u8,
        bytes: [u8; INLINE_KEY_BYTES],
    },
    Heap(Box<Box<str>>),
}

const INLINE_KEY_BYTES: usize = 14;

impl CompactKey {
    fn new(key: &str) -> Self {
        if key.len() <= INLINE_KEY_BYTES {
            let mut bytes = [0; INLINE_KEY_BYTES];
            bytes[..key.len()].copy_from_slice(key.as_bytes());
            CompactKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            CompactKey::Heap(Box::new(key.into()))
        }
    }

    /// The key's UTF-8 bytes: compared and hashed as bytes, so no check re-validates them.
    fn as_bytes(&self) -> &[u8] {
        match self {
            CompactKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            CompactKey::Heap(key) => key.as_bytes(),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(MemoryStoreConfig::default(), Arc::new(SystemClock::new()))
    }
}

impl MemoryStore {
    /// A store reading time from `clock` (checks that carry their own time use theirs).
    pub fn new(config: MemoryStoreConfig, clock: Arc<dyn Clock>) -> Self {
        let shard_count = config.shards.clamp(1, 1 << 16).next_power_of_two();
        MemoryStore {
            shards: (0..shard_count).map(|_| RwLock::default()).collect(),
            hints: (0..shard_count).map(|_| RefusalHint::default()).collect(),
            shard_mask: shard_count as u64 - 1,
            hasher: RandomState::default(),
            clock,
            keys: AtomicUsize::new(0),
            max_keys: config.max_keys,
        }
    }

    /// Live (rule, key) entries, including expired ones not swept yet.
    pub fn len(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry whose state is back to empty at the clock's current time, and
    /// returns how many were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_micros();
        (0..self.shards.len())
            .map(|index| self.sweep_shard(index, &mut self.shards[index].write(), now))
            .sum()
    }

    /// Forgets the state `rule` holds for `key`, as if it had never been used.
    pub fn forget(&self, rule: &Rule, key: &str) {
        let key = &*stored_key(key);
        let hash = self.hash(rule, key.as_bytes());
        let index = self.shard_of(hash);
        let shard = &mut *self.shards[index].write();
        self.hints[index].clear_if_holds(&mut shard.hinted, hash);
        if let Ok(entry) = shard.table.find_entry(hash, |s| s.holds(rule, key)) {
            entry.remove();
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Decides `check` synchronously: the memory store never waits on anything but a shard
    /// lock held for the length of one decision.
    pub fn check_now(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        check.validate()?;
        let t = check.at.unwrap_or_else(|| self.clock.now_micros());
        with_stored_keys(check, |check| match check.limits {
            [limit] => self
                .check_one(limit.rule, limit.key, t, check)
                .map(Outcome::single),
            _ => self.check_many(t, check).map(Outcome::from_limits),
        })
    }

    fn check_one(
        &self,
        rule: &Rule,
        key: &str,
        t: u64,
        check: &Check<'_>,
    ) -> Result<crate::Decision, StoreError> {
        let hash = self.hash(rule, key.as_bytes());
        let index = self.shard_of(hash);
        let cost = check.cost_of(0);
        let (request_id, charge) = (check.request_id, check.charge);
        let hint = &self.hints[index];
        if request_id.is_none()
            && charge.may_refuse()
            && StateWords::hold(rule)
            && let Some(refused) = hint
                .read(hash, rule, key)
                .and_then(|words| RuleState::from_words(rule, words))
                .and_then(|state| state.refusal(rule, t, cost, None, charge))
        {
            return Ok(refused);
        }
        let lock = &self.shards[index];
        // Uncontended, take the shard exclusively at once: most checks write. Contended (a
        // hot key hammered from several threads), decide under a shared lock first: a
        // refusal only reads, so concurrent refusals of one key run side by side instead of
        // queueing; only a check that fits goes on to the exclusive lock, and decides again
        // there. Either way each decision sees a state no writer is changing.
        let mut guard = match lock.try_write() {
            Some(shard) => shard,
            None => {
                if let Some(refused) = Self::refuse_shared(&lock.read(), hash, rule, key, t, check)
                {
                    return Ok(refused);
                }
                lock.write()
            }
        };
        let shard = &mut *guard;
        self.sweep_if_due(index, shard, t);
        if let Some(slot) = shard.table.find_mut(hash, |s| s.holds(rule, key)) {
            if let Some(id) = request_id
                && let Some(remembered) = slot.state.request_id_conflict(t, cost, id, charge)
            {
                return Err(check.request_id_conflict(0, remembered));
            }
            // Whatever the mode, a hint of this entry goes before its state may change (a
            // panic cannot leave it stale), and a refusal publishes the state it leaves.
            hint.clear_if_holds(&mut shard.hinted, hash);
            let decision = slot.state.decide_alone(rule, t, cost, request_id, charge).0;
            if !decision.allowed && StateWords::hold(rule) {
                Self::publish_refusal(hint, &mut shard.hinted, hash, rule, key, &slot.state);
            }
            return Ok(decision);
        }
        // A new entry is made only for what records; deciding on a fresh state first is
        // safe, as nothing is stored until the key is accounted for.
        let mut state = RuleState::new(rule);
        let (decision, records) = state.decide_alone(rule, t, cost, request_id, charge);
        if records {
            self.reserve_keys(index, shard, t, 1)?;
            shard.table.insert_unique(
                hash,
                Slot {
                    rule: rule.clone(),
                    key: CompactKey::new(key),
                    state,
                },
                |s| self.hash(&s.rule, s.key.as_bytes()),
            );
        }
        Ok(decision)
    }

    /// Publishes the state a refusal left, if it is words. Out of line and cold: an
    /// admission only tests whether to call it.
    #[cold]
    #[inline(never)]
    fn publish_refusal(
        hint: &RefusalHint,
        hinted: &mut HintedRule,
        hash: u64,
        rule: &Rule,
        key: &str,
        state: &RuleState,
    ) {
        if let Some(words) = state.words() {
            hint.publish(hinted, hash, rule, key, words);
        }
    }

    /// The refusal of a check of a held key, decided under a shared lock; `None` when the
    /// check fits (or the key is not held) and needs the exclusive lock.
    fn refuse_shared(
        shard: &Shard,
        hash: u64,
        rule: &Rule,
        key: &str,
        t: u64,
        check: &Check<'_>,
    ) -> Option<crate::Decision> {
        let slot = shard.table.find(hash, |s| s.holds(rule, key))?;
        slot.state
            .refusal(rule, t, check.cost_of(0), check.request_id, check.charge)
    }

    /// A check of several limits, maybe in several shards: lock every shard it touches in
    /// ascending order (so two such checks cannot deadlock), take the slots out, decide
    /// all-or-nothing, put them back.
    fn check_many(&self, t: u64, check: &Check<'_>) -> Result<Vec<crate::Decision>, StoreError> {
        let hashes: Vec<u64> = check
            .limits
            .iter()
            .map(|l| self.hash(l.rule, l.key.as_bytes()))
            .collect();
        let mut shard_ids: Vec<usize> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: Vec<RwLockWriteGuard<'_, Shard>> =
            shard_ids.iter().map(|&i| self.shards[i].write()).collect();
        for (&index, guard) in shard_ids.iter().zip(&mut guards) {
            self.sweep_if_due(index, guard, t);
        }
        let guard_of = |hash: u64| {
            shard_ids
                .binary_search(&self.shard_of(hash))
                .expect("every touched shard is locked")
        };

        // Every entry the check takes out may change: no hint may hold one of them.
        for &hash in &hashes {
            let index = self.shard_of(hash);
            self.hints[index].clear_if_holds(&mut guards[guard_of(hash)].hinted, hash);
        }
        let mut slots: Vec<(Slot, bool)> = check
            .limits
            .iter()
            .zip(&hashes)
            .map(|(limit, &hash)| {
                let table = &mut guards[guard_of(hash)].table;
                match table.find_entry(hash, |s| s.holds(limit.rule, limit.key)) {
                    Ok(entry) => (entry.remove().0, true),
                    Err(_) => (
                        Slot {
                            rule: limit.rule.clone(),
                            key: CompactKey::new(limit.key),
                            state: RuleState::new(limit.rule),
                        },
                        false,
                    ),
                }
            })
            .collect();

        // Copied out: the states below borrow the slots for the rest of the check.
        let held: Vec<bool> = slots.iter().map(|&(_, held)| held).collect();
        let rules: Vec<&Rule> = check.limits.iter().map(|l| l.rule).collect();
        let mut states: Vec<&mut RuleState> = slots.iter_mut().map(|(s, _)| &mut s.state).collect();
        let may_refuse = check.charge.may_refuse();
        let evaluations = if may_refuse {
            algorithm::evaluate_all(
                &rules,
                &states,
                t,
                |i| check.cost_of(i),
                check.request_id,
                check.charge,
            )
        } else {
            Vec::new()
        };
        // Which limits record: all of an admitted check (but a peek), or the charged
        // refusals of a refused one; in a never-refused mode, each limit on its own.
        let records: Vec<bool> = if may_refuse {
            let admits = algorithm::all_allow(&evaluations);
            evaluations
                .iter()
                .map(|e| e.records(admits, check.charge))
                .collect()
        } else {
            (0..rules.len())
                .map(|i| algorithm::creates_entry(check.charge, check.cost_of(i)))
                .collect()
        };
        let new_keys = held
            .iter()
            .zip(&records)
            .filter(|&(&held, &records)| !held && records)
            .count();
        // A conflicting reuse of the request id in any limit refuses the whole check.
        let conflict = check.request_id.and_then(|id| {
            states.iter().enumerate().find_map(|(i, state)| {
                state
                    .request_id_conflict(t, check.cost_of(i), id, check.charge)
                    .map(|remembered| check.request_id_conflict(i, remembered))
            })
        });
        let reserved = if let Some(conflict) = conflict {
            Err(conflict)
        } else if new_keys > 0 {
            // Sweeping for room may touch any locked shard; the first is as good as any.
            self.reserve_keys(shard_ids[0], &mut guards[0], t, new_keys)
        } else {
            Ok(())
        };
        let decisions = reserved.map(|()| {
            if may_refuse {
                algorithm::finish_all(
                    &rules,
                    &mut states,
                    &evaluations,
                    check.request_id,
                    check.charge,
                )
            } else {
                // Never refused, so not all-or-nothing: each limit does its part.
                rules
                    .iter()
                    .zip(states.iter_mut())
                    .enumerate()
                    .map(|(i, (rule, state))| {
                        let cost = check.cost_of(i);
                        state.record_usage(rule, t, cost, check.request_id, check.charge)
                    })
                    .collect()
            }
        });
        drop(states);
        let keep_new = decisions.is_ok();
        for (((slot, held), &hash), records) in slots.into_iter().zip(&hashes).zip(records) {
            if held || (keep_new && records) {
                guards[guard_of(hash)]
                    .table
                    .insert_unique(hash, slot, |s| self.hash(&s.rule, s.key.as_bytes()));
            }
        }
        decisions
    }

    /// Accounts for `count` new entries, sweeping `shard` (number `index`) once if the cap
    /// is reached.
    fn reserve_keys(
        &self,
        index: usize,
        shard: &mut Shard,
        now: u64,
        count: usize,
    ) -> Result<(), StoreError> {
        for attempt in 0..2 {
            let before = self.keys.fetch_add(count, Ordering::Relaxed);
            if before + count <= self.max_keys {
                return Ok(());
            }
            self.keys.fetch_sub(count, Ordering::Relaxed);
            if attempt == 0 && self.sweep_shard(index, shard, now) == 0 {
                break;
            }
        }
        Err(StoreError::KeyCapacity {
            max_keys: self.max_keys,
        })
    }

    fn sweep_if_due(&self, index: usize, shard: &mut Shard, now: u64) {
        if now >= shard.next_sweep {
            self.sweep_shard(index, shard, now);
        }
    }

    /// Drops the expired entries of `shard`, number `index`.
    fn sweep_shard(&self, index: usize, shard: &mut Shard, now: u64) -> usize {
        let before = shard.table.len();
        shard
            .table
            .retain(|slot| slot.state.expires_at(&slot.rule) > now);
        let removed = before - shard.table.len();
        if removed > 0 {
            // The hinted entry may be among them, and a check must then find no state.
            self.hints[index].clear(&mut shard.hinted);
        }
        self.keys.fetch_sub(removed, Ordering::Relaxed);
        shard.next_sweep = now.saturating_add(SWEEP_INTERVAL);
        removed
    }

    fn hash(&self, rule: &Rule, key: &[u8]) -> u64 {
        self.hasher.hash_one((rule.fingerprint(), key))
    }

    /// Bits 32.. pick the shard; the table itself uses the low bits and the top seven.
    fn shard_of(&self, hash: u64) -> usize {
        ((hash >> 32) & self.shard_mask) as usize
    }
}

impl Store for MemoryStore {
    fn check(
        &self,
        check: &Check<'_>,
    ) -> impl std::future::Future<Output = Result<Outcome, StoreError>> + Send {
        std::future::ready(self.check_now(check))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Charge;
    use crate::clock::ManualClock;
    use crate::decision::Decision;
    use crate::rule::{Algorithm, RuleSpec};
    use crate::store::check::Limit;

    const SECOND: u64 = 1_000_000;

    /// A token bucket of one a second, and a store on a clock at 10 s.
    fn bucket_store() -> (MemoryStore, Rule, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(10 * SECOND));
        let store = MemoryStore::new(MemoryStoreConfig::default(), clock.clone());
        let spec = RuleSpec::new(Algorithm::TokenBucket, 1, SECOND);
        (store, Rule::new("hinted", &spec).unwrap(), clock)
    }

    fn decide(store: &MemoryStore, rule: &Rule, at: Option<u64>, charge: Charge) -> Decision {
        let limits = [Limit { rule, key: "k" }];
        let check = Check {
            at,
            charge,
            ..Check::new(&limits, 1)
        };
        store.check_now(&check).unwrap().decision
    }

    /// Admits the key's one unit, then refuses it under the lock, which publishes the hint.
    fn refused_once(store: &MemoryStore, rule: &Rule) -> Decision {
        assert!(decide(store, rule, None, Charge::Admitted).allowed);
        let refused = decide(store, rule, None, Charge::Admitted);
        assert!(!refused.allowed);
        refused
    }

    #[test]
    fn a_refused_key_is_refused_while_its_shard_is_locked() {
        let (store, rule, _clock) = bucket_store();
        let first = refused_once(&store, &rule);
        let index = store.shard_of(store.hash(&rule, b"k"));
        let (sent, answered) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            let held = store.shards[index].write();
            scope.spawn(|| {
                sent.send(decide(&store, &rule, None, Charge::Admitted))
                    .unwrap()
            });
            // Without the hint the check waits for the lock, which is held until it answers
            // or this gives up.
            let got = answered.recv_timeout(std::time::Duration::from_secs(30));
            drop(held);
            assert_eq!(got.expect("refused without the shard's lock"), first);
        });
    }

    #[test]
    fn a_refund_clears_the_hint_of_its_key_alone_or_with_another_rule() {
        let other = Rule::new("other", &RuleSpec::new(Algorithm::FixedWindow, 5, SECOND)).unwrap();
        for with_other in [false, true] {
            let (store, rule, _clock) = bucket_store();
            refused_once(&store, &rule);
            // One rule goes through check_one, two through check_many.
            let mut limits = vec![Limit {
                rule: &rule,
                key: "k",
            }];
            if with_other {
                limits.push(Limit {
                    rule: &other,
                    key: "k",
                });
            }
            let refund = Check {
                charge: Charge::Refunded,
                request_id: Some("refund-1"),
                ..Check::new(&limits, 1)
            };
            store.check_now(&refund).unwrap();
            let after = decide(&store, &rule, None, Charge::Admitted);
            assert!(after.allowed, "with another rule: {with_other}");
        }
    }

    #[test]
    fn a_swept_key_is_no_longer_hinted() {
        let (store, rule, clock) = bucket_store();
        refused_once(&store, &rule);
        clock.advance(SECOND);
        assert_eq!(store.sweep(), 1);
        // Stamped before the sweep, a check finds no state at all, as the sweep left it.
        let earlier = 10 * SECOND;
        assert!(decide(&store, &rule, Some(earlier), Charge::Admitted).allowed);
    }

    #[test]
    fn a_key_dropped_by_any_sweep_is_no_longer_hinted() {
        for trigger in ["a check", "a check of several rules", "the key cap"] {
            // One shard, so that other keys' checks sweep the hinted key's shard, and a
            // bucket that is empty again 100 ms after its one unit.
            let clock = Arc::new(ManualClock::new(10 * SECOND));
            let config = MemoryStoreConfig {
                max_keys: 2,
                shards: 1,
            };
            let store = MemoryStore::new(config, clock.clone());
            let spec = RuleSpec::new(Algorithm::TokenBucket, 1, SECOND / 10);
            let rule = Rule::new("hinted", &spec).unwrap();
            refused_once(&store, &rule);
            let other =
                Rule::new("other", &RuleSpec::new(Algorithm::FixedWindow, 5, SECOND)).unwrap();
            let at = |micros: u64, limits: &[Limit]| {
                let check = Check {
                    at: Some(micros),
                    ..Check::new(limits, 1)
                };
                store.check_now(&check)
            };
            let j = [Limit {
                rule: &rule,
                key: "j",
            }];
            match trigger {
                // Past the shard's next sweep (1 s after the first check).
                "a check" => assert!(at(12 * SECOND, &j).unwrap().decision.allowed),
                "a check of several rules" => {
                    let both = [
                        j[0],
                        Limit {
                            rule: &other,
                            key: "j",
                        },
                    ];
                    assert!(at(12 * SECOND, &both).unwrap().decision.allowed);
                }
                // Before it: the cap's sweep makes the room.
                _ => {
                    assert!(at(10 * SECOND + SECOND / 2, &j).unwrap().decision.allowed);
                    let m = [Limit {
                        rule: &rule,
                        key: "m",
                    }];
                    assert!(at(10 * SECOND + SECOND / 2, &m).unwrap().decision.allowed);
                }
            }
            // Stamped when the key was refused, a check finds no state, as the sweep left it:
            // admitted, or, with the cap full, not taken in (never refused from the hint).
            let k = [Limit {
                rule: &rule,
                key: "k",
            }];
            let answer = at(10 * SECOND, &k);
            assert!(
                matches!(answer, Ok(ref o) if o.decision.allowed)
                    || matches!(answer, Err(StoreError::KeyCapacity { .. })),
                "after {trigger}: {answer:?}"
            );
        }
    }

    #[test]
    fn a_forgotten_key_is_no_longer_hinted() {
        let (store, rule, _clock) = bucket_store();
        refused_once(&store, &rule);
        store.forget(&rule, "k");
        assert!(decide(&store, &rule, None, Charge::Admitted).allowed);
    }

    #[test]
    fn a_reloaded_rule_is_not_answered_from_the_old_rules_hint() {
        let (store, rule, _clock) = bucket_store();
        refused_once(&store, &rule);
        // The same identity with a larger burst: the state is shared, the numbers are not.
        let spec = RuleSpec {
            burst: Some(2),
            ..rule.spec()
        };
        let reloaded = Rule::new("hinted", &spec).unwrap();
        assert!(reloaded.same_identity(&rule));
        assert!(decide(&store, &reloaded, None, Charge::Admitted).allowed);
    }

    #[test]
    fn an_entry_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<CompactKey>(), 16);
        assert_eq!(std::mem::size_of::<Slot>(), 64);
    }

    #[test]
    fn compact_keys_round_trip() {
        for key in ["", "a", "exactly-14-byt", "fifteen-bytes-k", "ключ-🔑"] {
            assert_eq!(CompactKey::new(key).as_bytes(), key.as_bytes());
        }
        assert!(matches!(
            CompactKey::new("fifteen-bytes-k"),
            CompactKey::Heap(_)
        ));
    }
}
