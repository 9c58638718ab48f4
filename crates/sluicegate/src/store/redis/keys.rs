//! Redis key names and Redis Cluster hash slots: every key the store reads or writes is
//! named here.

// The tests (and the service's) read the keys through `internals` with these.
#![cfg_attr(not(feature = "internals"), allow(unreachable_pub))]

use crate::rule::{Algorithm, LogLayout, Rule};
use crate::store::key::stored_key;

/// What one Redis key of a (rule, key) holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// The algorithm's state.
    State,
    /// The request ids whose admissions still count (checks with a request id).
    RequestIds,
    /// When each admission with a request id is released (leaky bucket).
    ReleaseTimes,
}

impl KeyKind {
    /// Every kind: together, all the keys of a (rule, key).
    pub const ALL: [KeyKind; 3] = [KeyKind::State, KeyKind::RequestIds, KeyKind::ReleaseTimes];

    /// The kind's letter in the key name.
    fn letter(self) -> char {
        match self {
            KeyKind::State => 's',
            KeyKind::RequestIds => 'i',
            KeyKind::ReleaseTimes => 'r',
        }
    }

    /// The Redis type the script keeps at a key of this kind for `rule`.
    pub(super) fn redis_type(self, rule: &Rule) -> &'static str {
        if self == KeyKind::State && rule.envoy_counter() {
            return "string";
        }
        match (self, rule.algorithm(), rule.layout()) {
            (KeyKind::State, Algorithm::SlidingLog, LogLayout::Zset)
            | (KeyKind::RequestIds, ..) => "zset",
            (KeyKind::State, Algorithm::SlidingLog, LogLayout::Compact) => "string",
            _ => "hash",
        }
    }
}

/// The Redis key of one kind of state of `rule` for the user's `key`:
/// `{prefix}{TAG}:{kind}:{len}:{rule identity}:{stored key}`, where the stored key is
/// [`stored_key`]'s (a long key's digest) and the tag is computed from it.
pub fn redis_key(prefix: &str, kind: KeyKind, rule: &Rule, key: &str) -> String {
    let key = stored_key(key);
    let identity = rule.identity();
    format!(
        "{prefix}{{{:0TAG_DIGITS$x}}}:{}:{}:{identity}:{key}",
        identity_tag(&key),
        kind.letter(),
        identity.len()
    )
}

/// The Redis key of an envoy counter ([`Rule::with_envoy_counter`]) of `rule` for `key` at
/// `at` (µs since the epoch): `{prefix}{key}_{window start in s}`, envoyproxy/ratelimit's
/// cache key, whose window start is `(now / unit) * unit` in whole seconds
/// (envoyproxy/ratelimit@f2fb157 src/limiter/cache_key.go:49-87). No hash tag: on a
/// Redis Cluster the whole name picks the slot, as envoy's client hashes it. The key is
/// whole, however long, never digested: envoy names its counters so, and a fleet of both
/// shares them only under the same name.
pub fn envoy_counter_key(prefix: &str, rule: &Rule, key: &str, at: u64) -> String {
    let window = rule.window_micros();
    format!("{prefix}{key}_{}", at / window * window / 1_000_000)
}

/// The Redis key holding the state of `rule` for `key`; an envoy counter's names the
/// window that `at` falls in.
pub(super) fn state_key(prefix: &str, rule: &Rule, key: &str, at: u64) -> String {
    if rule.envoy_counter() {
        envoy_counter_key(prefix, rule, key, at)
    } else {
        redis_key(prefix, KeyKind::State, rule, key)
    }
}

/// The key holding a server's epoch marker (see `lost_state`): on a single server
/// `{prefix}sluicegate-epoch`; on a Redis Cluster one per master,
/// `{prefix}sluicegate-epoch:{TAG}`, the tag chosen so that the key hashes to a slot the
/// master serves.
pub(super) fn marker_key(prefix: &str, tag: Option<u32>) -> String {
    match tag {
        None => format!("{prefix}sluicegate-epoch"),
        Some(tag) => format!("{prefix}sluicegate-epoch:{{{tag}}}"),
    }
}

/// The hash slot of every key of `rule` for `key` (at `at`, for an envoy counter).
pub(super) fn state_slot(prefix: &str, rule: &Rule, key: &str, at: u64) -> u16 {
    if rule.envoy_counter() {
        hash_slot(&envoy_counter_key(prefix, rule, key, at))
    } else {
        identity_slot(key)
    }
}

/// The time an envoy counter's key is named by when a check carries none: this
/// instance's wall clock, as envoy's instances name theirs (µs since the epoch).
pub(super) fn wall_clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// A Redis glob pattern (for `KEYS` or `SCAN … MATCH`) matching exactly the keys of `kind`
/// under `prefix`, of every rule and user key.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn key_pattern(prefix: &str, kind: KeyKind) -> String {
    let mut pattern = String::with_capacity(prefix.len() + TAG_DIGITS + 8);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('{');
    pattern.extend(std::iter::repeat_n('?', TAG_DIGITS));
    pattern.push_str(&format!("}}:{}:*", kind.letter()));
    pattern
}

/// The hash tag's length: a u64 in hex.
const TAG_DIGITS: usize = 16;

/// The hash tag of an identity: FNV-1a of the stored key's bytes. Stable across processes and
/// versions (every instance must name the same key), and the only part of a key Redis
/// Cluster hashes, so whatever braces a user's key holds, it cannot pick its slot.
fn identity_tag(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The hash slot of every key of the identity `key` (what the tag of its stored key
/// hashes to).
pub fn identity_slot(key: &str) -> u16 {
    // The tag as its lowercase hex digits, written without an allocation: every check of a
    // cluster is routed by it.
    let tag = identity_tag(&stored_key(key));
    let digits: [u8; TAG_DIGITS] = std::array::from_fn(|i| {
        let nibble = (tag >> (4 * (TAG_DIGITS - 1 - i))) & 0xf;
        b"0123456789abcdef"[nibble as usize]
    });
    crc16(&digits) % 16384
}

/// The Redis Cluster hash slot of a key: CRC16 (XMODEM) of its hash tag, modulo 16384.
pub fn hash_slot(redis_key: &str) -> u16 {
    let bytes = redis_key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16(tagged) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::RuleSpec;
    use std::time::Duration;

    #[test]
    fn crc16_matches_redis_cluster_spec() {
        // The Redis Cluster specification's test vector, and a hash tag.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(
            hash_slot("{user1000}.following"),
            hash_slot("{user1000}.followers")
        );
        assert_eq!(hash_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }

    #[test]
    fn keys_are_distinct_and_slots_follow_the_identity() {
        let rule = |name| {
            Rule::new(
                name,
                &RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_secs(1)),
            )
            .unwrap()
        };
        let (a, b) = (rule("a"), rule("b"));
        let user_keys = ["x", "x:y", "{x}", "x}", "{", "", "a:1:b"];
        let mut seen = std::collections::HashSet::new();
        for key in user_keys {
            for r in [&a, &b] {
                for kind in KeyKind::ALL {
                    assert!(seen.insert(redis_key("p:", kind, r, key)), "{key:?}");
                }
            }
            // Every rule and kind of one identity shares one slot.
            let slot = hash_slot(&redis_key("p:", KeyKind::State, &a, key));
            assert_eq!(identity_slot(key), slot);
            assert_eq!(
                hash_slot(&redis_key("p:", KeyKind::RequestIds, &b, key)),
                slot
            );
        }
        // A long key's names and slot are its digest's.
        let long = "v".repeat(4096);
        let name = redis_key("p:", KeyKind::State, &a, &long);
        assert!(name.ends_with(&*crate::store::key::stored_key(&long)));
        assert_eq!(identity_slot(&long), hash_slot(&name));
        // A key naming another key's tag does not land in its slot.
        let victim = redis_key("p:", KeyKind::State, &a, "victim");
        let tag = &victim[victim.find('{').unwrap()..=victim.find('}').unwrap()];
        let attacker = redis_key("p:", KeyKind::State, &a, tag);
        assert_ne!(attacker.find('{'), None);
        assert_ne!(
            &attacker[attacker.find('{').unwrap()..=attacker.find('}').unwrap()],
            tag
        );
    }

    #[test]
    fn envoy_counters_are_named_as_envoy_names_them() {
        let minute = Rule::new(
            "m",
            &RuleSpec::new(Algorithm::FixedWindow, 10, Duration::from_secs(60)),
        )
        .unwrap()
        .with_envoy_counter()
        .unwrap();
        let second = Rule::new(
            "s",
            &RuleSpec::new(Algorithm::FixedWindow, 10, Duration::from_secs(1)),
        )
        .unwrap()
        .with_envoy_counter()
        .unwrap();
        // envoyproxy/ratelimit@f2fb157 test/redis/fixed_cache_impl_test.go:70,87 (now =
        // 1234 s) and test/limiter/base_limiter_test.go:47-54 (CACHE_KEY_PREFIX).
        let at = 1_234_567_890;
        assert_eq!(
            envoy_counter_key("", &second, "domain_key_value", at),
            "domain_key_value_1234"
        );
        assert_eq!(
            state_key("", &minute, "domain_key2_value2_subkey2_subvalue2", at),
            "domain_key2_value2_subkey2_subvalue2_1200"
        );
        assert_eq!(
            envoy_counter_key("prefix:", &second, "domain_key_value", at),
            "prefix:domain_key_value_1234"
        );
        assert_eq!(KeyKind::State.redis_type(&second), "string");
        // Envoy's key is whole, however long: a fleet of both shares it only so.
        let long = "v".repeat(4096);
        assert_eq!(state_key("", &second, &long, at), format!("{long}_1234"));
        // Not hash-tagged: the slot is the whole name's.
        let name = envoy_counter_key("", &second, "domain_key_value", at);
        assert_eq!(hash_slot(&name), crc16(name.as_bytes()) % 16384);
    }

    #[test]
    fn a_pattern_matches_exactly_the_keys_of_its_kind() {
        let rule = Rule::new(
            "a",
            &RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_secs(1)),
        )
        .unwrap();
        let prefix = "p*[1]:";
        let pattern = key_pattern(prefix, KeyKind::State);
        assert_eq!(pattern, r"p\*\[1\]:{????????????????}:s:*");
        for key in ["x", "}:s:", "{x}:i:"] {
            for kind in KeyKind::ALL {
                let name = redis_key(prefix, kind, &rule, key);
                assert_eq!(glob(&pattern, &name), kind == KeyKind::State, "{name}");
            }
        }
        assert!(!glob(&pattern, &redis_key("p", KeyKind::State, &rule, "x")));
    }

    /// Redis' glob, for the parts `key_pattern` writes: `\c`, `?`, `*`.
    fn glob(pattern: &str, name: &str) -> bool {
        match pattern.chars().next() {
            None => name.is_empty(),
            Some('*') => (0..=name.len())
                .filter(|&i| name.is_char_boundary(i))
                .any(|i| glob(&pattern[1..], &name[i..])),
            Some(c) => {
                let (literal, rest) = match c {
                    '\\' => (pattern[1..].chars().next(), &pattern[2..]),
                    _ => (Some(c), &pattern[c.len_utf8()..]),
                };
                match name.chars().next() {
                    Some(n) if c == '?' || Some(n) == literal => glob(rest, &name[n.len_utf8()..]),
                    _ => false,
                }
            }
        }
    }
}
