//! The latest refusal of a fixed window or a bucket in one shard, published so that the
//! next refusals of the same key are decided without the shard's lock.
//!
//! Why: a key over its limit is checked far more often than it admits (an abusive client,
//! a hot key), and every one of those checks took the shard's lock, a write to a cache line
//! that every core checking the key pulls back and forth. A refusal only reads, and the
//! state of a fixed window or a bucket is two words: the shard's writer copies them here
//! when it refuses, and readers decide from the copy, taking no lock and writing nothing.
//!
//! Exactness: the copy is a sequence lock. Every field is an atomic (no data race), and a
//! reader uses what it read only when the sequence number is even and unchanged around its
//! reads, so the words are those of one instant. A writer of the shard that changes the
//! words of the hinted entry or drops it clears the hint before it lets go of the write
//! lock. Until then nobody else can see the change (the lock keeps it from them), so a
//! refusal read from the hint is ordered before the change, as if it had been decided under
//! the lock just before it. The hint names its rule by [`Rule::address`], and keeps that
//! rule alive while it names it (in [`HintedRule`], which lives under the shard's lock): an
//! address read in a consistent snapshot is then one of a live rule, so a check's rule at
//! the same address is that rule.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

use crate::algorithm::StateWords;
use crate::rule::Rule;

/// The longest key a hint holds: 15 bytes and a length in two words.
const HINT_KEY_BYTES: usize = 15;

/// One shard's hint: one cache line, written only when the shard's writer publishes or
/// clears it, and aligned to two so that no neighbour's writes reach its readers (the
/// adjacent-line prefetch pairs lines, as for the shards).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct RefusalHint {
    /// Even while the fields below are stable, odd while the shard's writer changes them.
    sequence: AtomicU64,
    /// The entry's hash, to turn other keys away with one compare.
    hash: AtomicU64,
    /// [`Rule::address`] of the rule the refusal was decided under; 0 when empty.
    rule: AtomicUsize,
    /// The key, zero-padded, its length in the last byte.
    key: [AtomicU64; 2],
    latest: AtomicU64,
    words: [AtomicU64; 2],
}

/// What the shard's writers know of its hint: the hash of the entry it holds, so that a
/// writer tells whether it must clear the hint from a line it holds anyway, and the rule
/// the hint names, kept alive for as long as it names it (and until the next rule is
/// published: a clear leaves it, so that neither touches the rule's shared count). Held in
/// the shard, under its lock: a `&mut HintedRule` is the proof that the caller may write
/// the hint.
#[derive(Debug, Default)]
pub(super) struct HintedRule {
    hash: Option<u64>,
    rule: Option<Rule>,
}

impl RefusalHint {
    /// The published state of `rule` for `key` (whose entry hashes to `hash`), if this hint
    /// holds it: read without a lock.
    // Inlined: its words returned through the stack are read back wider than written, and
    // the read waits for the stores to land (perf: a fifth of a refusal).
    #[inline(always)]
    pub(super) fn read(&self, hash: u64, rule: &Rule, key: &str) -> Option<StateWords> {
        let sequence = self.sequence.load(Ordering::Acquire);
        if sequence % 2 == 1
            || self.hash.load(Ordering::Relaxed) != hash
            || self.rule.load(Ordering::Relaxed) != rule.address()
        {
            return None;
        }
        let key = packed(key)?;
        let held_key = load_pair(&self.key);
        let words = StateWords {
            latest: self.latest.load(Ordering::Relaxed),
            words: load_pair(&self.words),
        };
        // Orders the reads above before the sequence is read again: if it is unchanged, no
        // writer touched them in between.
        fence(Ordering::Acquire);
        (self.sequence.load(Ordering::Relaxed) == sequence && held_key == key).then_some(words)
    }

    /// Publishes the state `words` of `rule` for `key` (hash `hash`), just refused.
    pub(super) fn publish(
        &self,
        hinted: &mut HintedRule,
        hash: u64,
        rule: &Rule,
        key: &str,
        words: StateWords,
    ) {
        let Some(key) = packed(key) else {
            return;
        };
        self.write(|hint| {
            hint.hash.store(hash, Ordering::Relaxed);
            hint.rule.store(rule.address(), Ordering::Relaxed);
            for (field, word) in hint.key.iter().zip(key) {
                field.store(word, Ordering::Relaxed);
            }
            hint.latest.store(words.latest, Ordering::Relaxed);
            for (field, word) in hint.words.iter().zip(words.words) {
                field.store(word, Ordering::Relaxed);
            }
        });
        hinted.hash = Some(hash);
        // The rule it replaces is dropped only now: until the sequence moved, readers could
        // still match its address.
        if hinted.rule.as_ref().map(Rule::address) != Some(rule.address()) {
            hinted.rule = Some(rule.clone());
        }
    }

    /// Clears the hint if it may hold the entry that hashes to `hash`: to be called, under
    /// the write lock, before that entry's words may change or it goes.
    #[inline]
    pub(super) fn clear_if_holds(&self, hinted: &mut HintedRule, hash: u64) {
        if hinted.hash == Some(hash) {
            self.clear(hinted);
        }
    }

    /// Clears the hint, whatever entry it holds.
    #[cold]
    pub(super) fn clear(&self, hinted: &mut HintedRule) {
        if hinted.hash.take().is_some() {
            self.write(|hint| hint.rule.store(0, Ordering::Relaxed));
        }
    }

    /// Changes fields between an odd and the next even sequence number. Only the holder of
    /// the shard's write lock writes, so plain stores suffice for the sequence.
    fn write(&self, change: impl FnOnce(&Self)) {
        let sequence = self.sequence.load(Ordering::Relaxed);
        self.sequence.store(sequence + 1, Ordering::Relaxed);
        // Orders the odd number before the changes: a reader that sees a change sees it.
        fence(Ordering::Release);
        change(self);
        self.sequence.store(sequence + 2, Ordering::Release);
    }
}

/// Both words of `pair`, each loaded by name: `[0, 1].map` is a call out of line on every
/// refusal.
#[inline(always)]
fn load_pair(pair: &[AtomicU64; 2]) -> [u64; 2] {
    let [low, high] = pair;
    [low.load(Ordering::Relaxed), high.load(Ordering::Relaxed)]
}

/// `key` in two words, zero-padded, its length in the last byte; `None` when longer than a
/// hint holds.
#[inline] // on every refusal from the hint
fn packed(key: &str) -> Option<[u64; 2]> {
    let bytes = key.as_bytes();
    if bytes.len() > HINT_KEY_BYTES {
        return None;
    }
    let (low, high) = bytes.split_at(bytes.len().min(8));
    Some([
        little_endian(low),
        little_endian(high) | (bytes.len() as u64) << 56,
    ])
}

/// Up to 8 bytes as a little-endian word, read with at most three loads and no copy: a
/// check packs its key every time, and bytes copied to the stack and read back as a word
/// stall the load until the copies land.
#[inline]
fn little_endian(bytes: &[u8]) -> u64 {
    let len = bytes.len();
    let at = |i: usize| u64::from(bytes[i]) << (8 * i);
    match len {
        0 => 0,
        // The first, the middle and the last byte: all of them for 1 to 3.
        1..=3 => at(0) | at(len / 2) | at(len - 1),
        // Two 4-byte reads that overlap in the middle, where they agree.
        4..=7 => {
            let word = |from: usize| {
                u64::from(u32::from_le_bytes(
                    bytes[from..from + 4].try_into().expect("4 bytes"),
                ))
            };
            word(0) | word(len - 4) << (8 * (len - 4))
        }
        _ => u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_hint_has_a_pair_of_cache_lines_to_itself() {
        assert_eq!(std::mem::size_of::<RefusalHint>(), 128);
    }

    fn bucket(burst: u64) -> Rule {
        let spec = crate::rule::RuleSpec {
            burst: Some(burst),
            ..crate::rule::RuleSpec::new(
                crate::rule::Algorithm::TokenBucket,
                1,
                Duration::from_millis(1),
            )
        };
        Rule::new("hinted", &spec).unwrap()
    }

    #[test]
    fn a_hint_answers_only_its_own_rule_and_key() {
        let (hint, mut hinted) = (RefusalHint::default(), HintedRule::default());
        let rule = bucket(1);
        let words = StateWords {
            latest: 5,
            words: [7, 9],
        };
        hint.publish(&mut hinted, 42, &rule, "k", words);
        assert_eq!(hint.read(42, &rule, "k"), Some(words));
        assert_eq!(hint.read(42, &rule.clone(), "k"), Some(words));
        // Another rule of the same identity and numbers, another key, another hash: none.
        let twin = bucket(1);
        assert!(twin.same_rule(&rule));
        assert_eq!(hint.read(42, &twin, "k"), None);
        assert_eq!(hint.read(42, &rule, "j"), None);
        assert_eq!(hint.read(43, &rule, "k"), None);
        // The rule stays alive with the hint, whoever else lets it go.
        drop(rule);
        let held = hinted.rule.as_ref().expect("the hint keeps its rule");
        assert_eq!(hint.read(42, held, "k"), Some(words));
        // Cleared, it answers nothing; a long key is never published.
        hint.clear_if_holds(&mut hinted, 42);
        assert_eq!(hint.read(42, hinted.rule.as_ref().unwrap(), "k"), None);
        let long = "sixteen-bytes-ky";
        hint.publish(&mut hinted, 44, &twin, long, words);
        assert_eq!(hint.read(44, &twin, long), None);
    }

    #[test]
    fn keys_pack_apart_by_bytes_and_length() {
        let keys = ["", "\0", "a", "a\0", "exactly-15-byte", "ключ"];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(packed(a), packed(b), "{a:?} and {b:?}");
            }
        }
        assert_eq!(packed("sixteen-bytes-ky"), None);
        for len in 0..=HINT_KEY_BYTES {
            let key: String = ('a'..).take(len).collect();
            let mut bytes = [0u8; 16];
            bytes[..len].copy_from_slice(key.as_bytes());
            bytes[HINT_KEY_BYTES] = len as u8;
            let (low, high) = bytes.split_at(8);
            let words = [low, high].map(|half| u64::from_le_bytes(half.try_into().unwrap()));
            assert_eq!(packed(&key), Some(words), "{key:?}");
        }
    }
}
