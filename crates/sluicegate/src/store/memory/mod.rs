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
//! Memory stays bounded three ways. Idle state expires: each shard drops the entries whose
//! state is back to empty at most once per [`SWEEP_INTERVAL`] when a check touches it, and
//! [`MemoryStore::sweep`] sweeps all (the server calls it periodically). A hard cap,
//! `max_keys`, bounds live (rule, key) entries. And every byte an entry holds — its table
//! bucket, a long key, a log's or a counter's buffer, the request ids it remembers — is
//! counted against a [`MemoryBudget`], of which (like the key cap) one rule may hold only
//! its share. A check that would create an entry past any of these first sweeps its shard;
//! if there is still no room, [`OnFull`] decides: refuse, allow uncounted, or evict idle
//! entries that still have room under their limit (never one at its limit, whose eviction
//! would hand its client a fresh limit). The answer is a decision, marked
//! [`DecidedBy::Full`], never an error. Keys already held keep deciding exactly; peeks and
//! refused checks never create entries.
//!
//! A key being refused is decided without the lock: each shard publishes the state of the
//! fixed window or bucket it refused last ([`refusal_hint`]), and its next refusals are
//! read from there.

mod refusal_hint;
mod rule_usage;

use parking_lot::{RwLock, RwLockWriteGuard};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use refusal_hint::{HintedRule, RefusalHint};
use rule_usage::RuleUsages;

use super::check::{Charge, Check, DecidedBy, Outcome, Store};
use super::error::StoreError;
use super::key::{key_kept, keys_kept, stored_key, with_stored_keys};
use crate::algorithm::{self, RuleState, StateWords};
use crate::budget::{BudgetPart, MemoryBudget, OnFull};
use crate::clock::{Clock, ClockMicros, SystemClock};
use crate::decision::{Decision, RetryAfter};
use crate::rule::Rule;

/// How often (µs of store time) a shard drops expired entries when checks touch it.
pub(crate) const SWEEP_INTERVAL: u64 = 1_000_000;

/// The Retry-After of a refusal for want of room: one sweep interval. Room comes back when
/// held keys expire, which the store takes note of once per interval per shard, and an
/// eviction may make room at the next check; the store cannot know sooner, and a longer
/// wait (say, the rule's window) would keep the new users a full store refuses out for
/// as long as the flood that filled it.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub const FULL_RETRY_AFTER: u64 = SWEEP_INTERVAL;

/// Entries of a shard an eviction looks at, at most, for a victim: the least recently
/// written of a sample, as Redis' approximated LRU does, rather than an order kept on every
/// check.
const EVICTION_SAMPLE: usize = 32;

/// How often, at most, a full shard is swept for room (µs): a flood of new keys into a
/// full store would otherwise walk the whole shard on every check.
const FULL_SWEEP_SPACING: u64 = SWEEP_INTERVAL / 10;

/// Entries evicted for one new entry, at most: one suffices unless the new one is larger.
const MAX_EVICTIONS_PER_KEY: u64 = 8;

/// Settings of a [`MemoryStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryStoreConfig {
    /// The most (rule, key) entries held at once.
    pub max_keys: usize,
    /// Number of independently locked shards (rounded up to a power of two).
    pub shards: usize,
    /// Where the store's bytes are counted; the budget's rule share also cuts `max_keys`
    /// per rule.
    pub budget: BudgetPart,
    /// What a new key gets when there is no room for it.
    pub on_full: OnFull,
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        MemoryStoreConfig {
            max_keys: 1_000_000,
            shards: 64,
            budget: MemoryBudget::unlimited().part(STORE_PART),
            on_full: OnFull::default(),
        }
    }
}

/// The name of the store's part of a memory budget.
pub(crate) const STORE_PART: &str = "store";

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
    budget: BudgetPart,
    /// Entries and bytes per rule, each at most its share.
    rules: RuleUsages,
    on_full: OnFull,
}

/// Aligned to two cache lines so that threads working in neighbouring shards never share a
/// line (adjacent-line prefetch pairs lines, hence 128).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    table: HashTable<Slot>,
    next_sweep: u64,
    /// When the shard was last swept: a full shard is swept again for room at most once
    /// per [`FULL_SWEEP_SPACING`].
    swept_at: u64,
    /// The rule this shard's hint names.
    hinted: HintedRule,
    /// The table's buckets as counted in the budget: what a shrink gives back. Not
    /// recomputed from the capacity, which removals that leave tombstones lower.
    counted_buckets: usize,
}

/// One (rule, key) entry: one cache line, aligned to it, so a lookup that finds it reads one
/// line, a short key included. Half the 128 bytes an entry would take with a sliding log's
/// header inline: with 100,000 keys the table is what misses the cache, and at 64 bytes
/// twice as much of it stays there (the log's header is one more read, as its buffer is
/// anyway).
#[derive(Debug)]
#[repr(align(64))]
struct Slot {
    rule: Rule,
    key: CompactKey,
    state: RuleState,
}

/// What an entry counts against its rule's share beyond its heap bytes.
const SLOT_BYTES: usize = size_of::<Slot>();
/// What a table counts per bucket of its capacity: the slot and its control byte.
const BUCKET_BYTES: usize = size_of::<Slot>() + 1;

impl Slot {
    fn holds(&self, rule: &Rule, key: &str) -> bool {
        self.key.as_bytes() == key.as_bytes() && self.rule.same_identity(rule)
    }

    /// The bytes this entry holds on the heap: a long key's and its state's.
    #[inline(always)]
    fn heap_bytes(&self) -> usize {
        self.key.heap_bytes() + self.state.heap_bytes()
    }

    /// Whether evicting this entry at `now` loses nothing a client could exploit: it has
    /// expired, or it still has room for a unit under its limit and remembers no request
    /// id. An entry at or over its limit is never evicted: that would reset the limit.
    fn evictable(&self, now: u64) -> bool {
        self.state.expires_at(&self.rule) <= now
            || (!self.state.holds_request_ids(now)
                && self
                    .state
                    .refusal(&self.rule, now, 1, None, Charge::Check)
                    .is_none())
    }
}

/// Why a new entry found no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Full {
    /// Its rule holds its share of the keys or of the budget.
    Share,
    /// The store holds `max_keys`, or the budget is spent.
    Whole,
}

/// Room taken for a new entry: the table's growth counted in advance, to settle on insert.
#[derive(Clone, Copy, Debug)]
struct Room {
    growth: usize,
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

    /// The bytes a long key holds on the heap: the string's box and the string.
    fn heap_bytes(&self) -> usize {
        match self {
            CompactKey::Inline { .. } => 0,
            CompactKey::Heap(key) => size_of::<Box<str>>() + key.len(),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(MemoryStoreConfig::default(), Arc::new(SystemClock::new()))
    }
}

impl MemoryStore {
    /// The name of the store's part of a memory budget: what
    /// [`MemoryStoreConfig::budget`] is named when the store shares a budget with others.
    pub const BUDGET_PART: &str = STORE_PART;

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
            rules: RuleUsages::new(
                config.budget.budget().share_of(config.max_keys),
                config
                    .budget
                    .budget()
                    .share_of(config.budget.budget().limit()),
            ),
            budget: config.budget,
            on_full: config.on_full,
        }
    }

    /// The bytes the store holds, as counted in its budget.
    pub fn bytes(&self) -> usize {
        self.budget.used()
    }

    /// The entries and bytes `rule` holds (counted against its share: each entry's slot
    /// and heap bytes).
    pub fn rule_usage(&self, rule: &Rule) -> (usize, usize) {
        let usage = self.rules.of(rule);
        (usage.keys, usage.bytes)
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
            self.released(&entry.remove().0);
        }
    }

    /// Decides `check` synchronously: the memory store never waits on anything but a shard
    /// lock held for the length of one decision.
    pub fn check_now(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        check.validate()?;
        let t = check.at_micros().unwrap_or_else(|| self.clock.now_micros());
        match check.limits {
            [limit] if key_kept(limit.key) => self.check_one(limit.rule, limit.key, t, check),
            _ if keys_kept(check) => self.check_many(t, check),
            // Some key is stored as a digest: rare, so decided by the general path, which
            // leaves `check_one` a single call site the compiler inlines into this one.
            _ => with_stored_keys(check, |check| self.check_many(t, check)),
        }
    }

    fn check_one(
        &self,
        rule: &Rule,
        key: &str,
        t: u64,
        check: &Check<'_>,
    ) -> Result<Outcome, StoreError> {
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
            return Ok(Outcome::single(refused));
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
                    return Ok(Outcome::single(refused));
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
            // A new id on a held key grows it: with no room for that, the key is full.
            let mut request_id = request_id;
            let id_without_room = request_id.is_some_and(|id| {
                !slot.state.remembers(t, id, charge) && !self.room_for_ids(&[rule], id.len())
            });
            if id_without_room {
                if charge.may_refuse() && self.on_full != OnFull::Allow {
                    return Ok(self.full(rule, full_refusal(rule), charge, 0));
                }
                request_id = None;
            }
            // Whatever the mode, a hint of this entry goes before its state may change (a
            // panic cannot leave it stale), and a refusal publishes the state it leaves.
            hint.clear_if_holds(&mut shard.hinted, hash);
            let before = slot.state.heap_bytes();
            let decision = slot.state.decide_alone(rule, t, cost, request_id, charge).0;
            let after = slot.state.heap_bytes();
            if after != before {
                self.resized(rule, before, after);
            }
            if !decision.allowed && StateWords::hold(rule) {
                Self::publish_refusal(hint, &mut shard.hinted, hash, rule, key, &slot.state);
            }
            if id_without_room {
                return Ok(self.full(rule, decision, charge, 0));
            }
            return Ok(Outcome::single(decision));
        }
        // A new entry is made only for what records; deciding on a fresh state first is
        // safe, as nothing is stored until the key is accounted for.
        let mut state = RuleState::new(rule);
        let (decision, records) = state.decide_alone(rule, t, cost, request_id, charge);
        if !records {
            return Ok(Outcome::single(decision));
        }
        let slot = Slot {
            rule: rule.clone(),
            key: CompactKey::new(key),
            state,
        };
        let mut evictions = 0;
        let heap = slot.heap_bytes();
        match self.make_room(
            &mut [(index, &mut *shard)],
            0,
            rule,
            heap,
            t,
            &mut evictions,
        ) {
            Some(room) => {
                self.insert(shard, hash, slot, room.growth);
                let mut outcome = Outcome::single(decision);
                outcome.evictions = evictions;
                Ok(outcome)
            }
            None => Ok(self.full(rule, decision, charge, evictions)),
        }
    }

    /// What a check whose new entry found no room answers: `fresh`, what the check decided
    /// on an empty state (recorded nowhere), when the policy allows or the mode is never
    /// refused; otherwise a refusal that asks for [`FULL_RETRY_AFTER`].
    #[cold]
    fn full(&self, rule: &Rule, fresh: Decision, charge: Charge, evictions: u64) -> Outcome {
        let decision = if self.on_full == OnFull::Allow || !charge.may_refuse() {
            fresh
        } else {
            full_refusal(rule)
        };
        let mut outcome = Outcome::single(decision);
        outcome.decided_by = DecidedBy::Full(self.on_full);
        outcome.evictions = evictions;
        outcome
    }

    /// Whether the budget, and each of `rules`' shares, have room to remember one more
    /// request id of `id_len` bytes in a key of each rule.
    fn room_for_ids(&self, rules: &[&Rule], id_len: usize) -> bool {
        let bytes = algorithm::request_id_bytes(id_len);
        let budget = self.budget.budget();
        budget.used().saturating_add(bytes * rules.len()) <= budget.limit()
            && rules.iter().all(|rule| self.rules.has_room(rule, bytes))
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
    /// ascending order (so two such checks cannot deadlock), take the slots out, give each
    /// new entry room, decide all-or-nothing, put them back.
    fn check_many(&self, t: u64, check: &Check<'_>) -> Result<Outcome, StoreError> {
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
        // Each slot's heap bytes as counted: a held one's, or a new one's when room is taken.
        let heaps: Vec<usize> = slots.iter().map(|(s, _)| s.heap_bytes()).collect();

        // Copied out: the states below borrow the slots for the rest of the check.
        let held: Vec<bool> = slots.iter().map(|&(_, held)| held).collect();
        let rules: Vec<&Rule> = check.limits.iter().map(|l| l.rule).collect();
        let mut states: Vec<&mut RuleState> = slots.iter_mut().map(|(s, _)| &mut s.state).collect();
        let may_refuse = check.charge.may_refuse();
        // A conflicting reuse of the request id in any limit refuses the whole check: the
        // held entries go back as they were, and no new one is made.
        let conflict = check.request_id.and_then(|id| {
            states.iter().enumerate().find_map(|(i, state)| {
                state
                    .request_id_conflict(t, check.cost_of(i), id, check.charge)
                    .map(|remembered| check.request_id_conflict(i, remembered))
            })
        });
        if let Some(conflict) = conflict {
            drop(states);
            for (i, (slot, held)) in slots.into_iter().enumerate() {
                if held {
                    self.insert(&mut guards[guard_of(hashes[i])], hashes[i], slot, 0);
                }
            }
            return Err(conflict);
        }
        // A new id in a held key grows it: with no room for that, the check is full. A
        // mode that may refuse is then answered by the policy before anything is recorded;
        // otherwise it is recorded without its id.
        let id_without_room = check.request_id.is_some_and(|id| {
            let growing: Vec<&Rule> = rules
                .iter()
                .zip(&states)
                .zip(&held)
                .filter(|((_, state), held)| **held && !state.remembers(t, id, check.charge))
                .map(|((rule, _), _)| *rule)
                .collect();
            !growing.is_empty() && !self.room_for_ids(&growing, id.len())
        });
        if id_without_room && may_refuse && self.on_full != OnFull::Allow {
            drop(states);
            let mut refusals = Vec::with_capacity(rules.len());
            for (i, (slot, held)) in slots.into_iter().enumerate() {
                refusals.push(full_refusal(&slot.rule));
                if held {
                    self.insert(&mut guards[guard_of(hashes[i])], hashes[i], slot, 0);
                }
            }
            let mut outcome = Outcome::from_limits(refusals);
            outcome.decided_by = DecidedBy::Full(self.on_full);
            return Ok(outcome);
        }
        let request_id = if id_without_room {
            None
        } else {
            check.request_id
        };

        let evaluations = if may_refuse {
            algorithm::evaluate_all(
                &rules,
                &states,
                t,
                |i| check.cost_of(i),
                request_id,
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

        // Room for every entry the check makes, before anything is recorded.
        let mut evictions = 0;
        let mut rooms: Vec<Option<Room>> = vec![None; rules.len()];
        let mut full = vec![false; rules.len()];
        for i in 0..rules.len() {
            if held[i] || !records[i] {
                continue;
            }
            let own = guard_of(hashes[i]);
            let mut locked: Vec<(usize, &mut Shard)> = shard_ids
                .iter()
                .copied()
                .zip(guards.iter_mut().map(|g| &mut **g))
                .collect();
            rooms[i] = self.make_room(&mut locked, own, rules[i], heaps[i], t, &mut evictions);
            full[i] = rooms[i].is_none();
        }
        let any_full = full.contains(&true);
        let refuse_full = any_full && may_refuse && self.on_full != OnFull::Allow;
        let decisions = if refuse_full {
            // All-or-nothing: no entry is made and nothing is recorded.
            for (i, room) in rooms.iter_mut().enumerate() {
                if let Some(room) = room.take() {
                    self.return_room(rules[i], heaps[i], room);
                }
            }
            rules
                .iter()
                .zip(&states)
                .zip(&evaluations)
                .zip(&full)
                .map(|(((rule, state), eval), &full)| {
                    if full {
                        full_refusal(rule)
                    } else {
                        state.unrecorded(rule, eval)
                    }
                })
                .collect()
        } else if may_refuse {
            algorithm::finish_all(&rules, &mut states, &evaluations, request_id, check.charge)
        } else {
            // Never refused, so not all-or-nothing: each limit does its part.
            rules
                .iter()
                .zip(states.iter_mut())
                .enumerate()
                .map(|(i, (rule, state))| {
                    let cost = check.cost_of(i);
                    state.record_usage(rule, t, cost, request_id, check.charge)
                })
                .collect()
        };
        drop(states);
        for (i, (slot, held)) in slots.into_iter().enumerate() {
            let shard = &mut *guards[guard_of(hashes[i])];
            let counted_growth = match (held, rooms[i]) {
                (true, _) => 0,
                (false, Some(room)) => room.growth,
                (false, None) => continue,
            };
            let heap = slot.heap_bytes();
            if heap != heaps[i] {
                self.resized(&slot.rule, heaps[i], heap);
            }
            self.insert(shard, hashes[i], slot, counted_growth);
        }
        let mut outcome = Outcome::from_limits(decisions);
        outcome.evictions = evictions;
        if any_full || id_without_room {
            outcome.decided_by = DecidedBy::Full(self.on_full);
        }
        Ok(outcome)
    }

    /// Puts `slot` in `shard`, counting the table's growth (`counted_growth` of it counted
    /// already, when its room was taken).
    fn insert(&self, shard: &mut Shard, hash: u64, slot: Slot, counted_growth: usize) {
        let before = shard.table.capacity();
        shard
            .table
            .insert_unique(hash, slot, |s| self.hash(&s.rule, s.key.as_bytes()));
        let grown = (shard.table.capacity() - before) * BUCKET_BYTES;
        shard.counted_buckets += grown;
        self.budget.resize(counted_growth, grown);
    }

    /// Room for a new entry of `rule` holding `heap` bytes on the heap, in the shard
    /// `locked[own]`: taken if there is some; else, after a sweep of that shard (unless
    /// one ran within [`FULL_SWEEP_SPACING`]), made by
    /// evicting (the `evict-idle` policy), up to [`MAX_EVICTIONS_PER_KEY`] entries of the
    /// shards locked, each counted in `evictions`. `None`: there is none.
    fn make_room(
        &self,
        locked: &mut [(usize, &mut Shard)],
        own: usize,
        rule: &Rule,
        heap: usize,
        now: u64,
        evictions: &mut u64,
    ) -> Option<Room> {
        let mut swept = false;
        let mut evicted = 0;
        loop {
            let (index, shard) = &mut locked[own];
            let full = match self.take_room(&shard.table, rule, heap) {
                Ok(room) => return Some(room),
                Err(full) => full,
            };
            if !swept && now >= shard.swept_at.saturating_add(FULL_SWEEP_SPACING) {
                swept = true;
                if self.sweep_shard(*index, shard, now) > 0 {
                    continue;
                }
            }
            if self.on_full != OnFull::EvictIdle
                || evicted == MAX_EVICTIONS_PER_KEY
                || !self.evict_one(locked, own, rule, full == Full::Share, now)
            {
                return None;
            }
            evicted += 1;
            *evictions += 1;
        }
    }

    /// Takes room for a new entry of `rule` holding `heap` bytes, to go in `table`: one of
    /// the rule's share of keys and bytes, one of `max_keys`, and its bytes (and the
    /// table's growth, if it must grow) in the budget.
    fn take_room(&self, table: &HashTable<Slot>, rule: &Rule, heap: usize) -> Result<Room, Full> {
        if !self.rules.try_take(rule, SLOT_BYTES + heap) {
            return Err(Full::Share);
        }
        // Growing doubles the capacity (from 3 buckets' worth): at most this many more.
        let growth = if table.len() == table.capacity() {
            (table.capacity() + 4) * BUCKET_BYTES
        } else {
            0
        };
        let key = self
            .keys
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok();
        if key && self.budget.try_take(heap + growth) {
            return Ok(Room { growth });
        }
        if key {
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
        self.rules.give_back(rule.owner(), 1, SLOT_BYTES + heap);
        Err(Full::Whole)
    }

    /// Gives back room taken for an entry that was not made.
    fn return_room(&self, rule: &Rule, heap: usize, room: Room) {
        self.keys.fetch_sub(1, Ordering::Relaxed);
        self.budget.give_back(heap + room.growth);
        self.rules.give_back(rule.owner(), 1, SLOT_BYTES + heap);
    }

    /// Evicts one entry for a new entry of `rule`, from the shards `locked` (`locked[own]`,
    /// the new entry's, first): of the first [`EVICTION_SAMPLE`] that may go
    /// ([`Slot::evictable`]), an expired one, else the least recently written, of `rule`
    /// before any other rule's — and of `rule` only when `own_only` (its rule holds its
    /// share). Whether one was evicted.
    fn evict_one(
        &self,
        locked: &mut [(usize, &mut Shard)],
        own: usize,
        rule: &Rule,
        own_only: bool,
        now: u64,
    ) -> bool {
        let count = locked.len();
        for position in (0..count).map(|i| (own + i) % count) {
            let (index, shard) = &mut locked[position];
            let victim = shard
                .table
                .iter()
                .take(EVICTION_SAMPLE * 8)
                .filter(|s| !own_only || s.rule.owner() == rule.owner())
                .take(EVICTION_SAMPLE)
                .filter(|s| s.evictable(now))
                .min_by_key(|s| {
                    (
                        s.state.expires_at(&s.rule) > now,
                        s.rule.owner() != rule.owner(),
                        s.state.latest(),
                    )
                })
                .map(|s| (self.hash(&s.rule, s.key.as_bytes()), std::ptr::from_ref(s)));
            if let Some((hash, victim)) = victim {
                let entry = shard
                    .table
                    .find_entry(hash, |s| std::ptr::eq(s, victim))
                    .expect("the victim was just seen in this table");
                self.hints[*index].clear(&mut shard.hinted);
                self.released(&entry.remove().0);
                return true;
            }
        }
        false
    }

    /// Counts a held entry of `rule` whose heap bytes went from `before` to `after`.
    #[cold]
    fn resized(&self, rule: &Rule, before: usize, after: usize) {
        self.budget.resize(before, after);
        self.rules.resize(rule, before, after);
    }

    /// Gives back what a removed entry held.
    fn released(&self, slot: &Slot) {
        let mut freed = Freed::default();
        freed.add(slot);
        self.give_back(&freed);
    }

    fn give_back(&self, freed: &Freed) {
        self.keys.fetch_sub(freed.keys, Ordering::Relaxed);
        self.budget.give_back(freed.heap);
        for &(owner, keys, bytes) in &freed.rules {
            self.rules.give_back(owner, keys, bytes);
        }
    }

    fn sweep_if_due(&self, index: usize, shard: &mut Shard, now: u64) {
        if now >= shard.next_sweep {
            self.sweep_shard(index, shard, now);
        }
    }

    /// Drops the expired entries of `shard`, number `index`.
    fn sweep_shard(&self, index: usize, shard: &mut Shard, now: u64) -> usize {
        let mut freed = Freed::default();
        shard.table.retain(|slot| {
            let live = slot.state.expires_at(&slot.rule) > now;
            if !live {
                freed.add(slot);
            }
            live
        });
        if freed.keys > 0 {
            // The hinted entry may be among them, and a check must then find no state.
            self.hints[index].clear(&mut shard.hinted);
            self.give_back(&freed);
        }
        self.shrink(shard);
        shard.next_sweep = now.saturating_add(SWEEP_INTERVAL);
        shard.swept_at = now;
        freed.keys
    }

    /// Shrinks `shard`'s table when it holds nothing, or no more than a quarter of its
    /// buckets hold entries, to twice its entries, and gives the buckets' bytes back to the
    /// budget: after a flood of keys (the local fallback through an outage of the store, a
    /// burst of new clients) the memory goes back to the allocator once the keys expire.
    /// Twice, so that a table at a steady size never shrinks and grows back.
    fn shrink(&self, shard: &mut Shard) {
        let table = &mut shard.table;
        if table.capacity() <= 4 * table.len().max(8) && !table.is_empty() {
            return;
        }
        table.shrink_to(2 * table.len(), |s| self.hash(&s.rule, s.key.as_bytes()));
        let kept = table.capacity() * BUCKET_BYTES;
        if kept < shard.counted_buckets {
            self.budget.give_back(shard.counted_buckets - kept);
            shard.counted_buckets = kept;
        }
    }

    fn hash(&self, rule: &Rule, key: &[u8]) -> u64 {
        self.hasher.hash_one((rule.fingerprint(), key))
    }

    /// Bits 32.. pick the shard; the table itself uses the low bits and the top seven.
    fn shard_of(&self, hash: u64) -> usize {
        ((hash >> 32) & self.shard_mask) as usize
    }
}

/// What removed entries held, to give back: entries, heap bytes, and per rule (by its
/// owner) entries and bytes as counted against its share.
#[derive(Debug, Default)]
struct Freed {
    keys: usize,
    heap: usize,
    rules: Vec<(u64, usize, usize)>,
}

impl Freed {
    fn add(&mut self, slot: &Slot) {
        let heap = slot.heap_bytes();
        self.keys += 1;
        self.heap += heap;
        let owner = slot.rule.owner();
        match self.rules.iter_mut().find(|(o, ..)| *o == owner) {
            Some((_, keys, bytes)) => {
                *keys += 1;
                *bytes += SLOT_BYTES + heap;
            }
            None => self.rules.push((owner, 1, SLOT_BYTES + heap)),
        }
    }
}

/// A refusal for want of room: nothing is held for the key, and room may come back within
/// [`FULL_RETRY_AFTER`].
fn full_refusal(rule: &Rule) -> Decision {
    Decision {
        allowed: false,
        limit: rule.capacity(),
        remaining: 0,
        retry_after: RetryAfter::micros(FULL_RETRY_AFTER),
        reset_after: 0,
        delay: 0,
    }
}

impl Store for MemoryStore {
    fn check(
        &self,
        check: &Check<'_>,
    ) -> impl std::future::Future<Output = Result<Outcome, StoreError>> + Send {
        std::future::ready(self.check_now(check))
    }

    /// Its one node is this process's memory.
    fn node_name(&self, node: crate::store::check::NodeId) -> Option<String> {
        (node == crate::store::check::NodeId::FIRST).then(|| "memory".to_owned())
    }
}

#[cfg(test)]
mod tests;
