//! Redis key names and Redis Cluster hash slots.

use crate::rule::Rule;

/// The Redis key of one kind of state (`s` state, `i` request ids, `r` release times) of
/// `rule` for the user's `key`: `{prefix}{TAG}:{kind}:{len}:{rule identity}:{key}`.
pub fn redis_key(prefix: &str, kind: char, rule: &Rule, key: &str) -> String {
    let identity = rule.identity();
    format!(
        "{prefix}{{{:016x}}}:{kind}:{}:{identity}:{key}",
        identity_tag(key),
        identity.len()
    )
}

/// The hash tag of an identity: FNV-1a of the key's bytes. Stable across processes and
/// versions (every instance must name the same key), and the only part of a key Redis
/// Cluster hashes, so whatever braces a user's key holds, it cannot pick its slot.
fn identity_tag(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The hash slot of every key of the identity `key` (what the tag hashes to).
pub fn identity_slot(key: &str) -> u16 {
    crc16(format!("{:016x}", identity_tag(key)).as_bytes()) % 16384
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
    use crate::rule::{Algorithm, RuleSpec};

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
        let rule =
            |name| Rule::new(name, &RuleSpec::new(Algorithm::SlidingLog, 5, 1_000_000)).unwrap();
        let (a, b) = (rule("a"), rule("b"));
        let user_keys = ["x", "x:y", "{x}", "x}", "{", "", "a:1:b"];
        let mut seen = std::collections::HashSet::new();
        for key in user_keys {
            for r in [&a, &b] {
                for kind in ['s', 'i', 'r'] {
                    assert!(seen.insert(redis_key("p:", kind, r, key)), "{key:?}");
                }
            }
            // Every rule and kind of one identity shares one slot.
            let slot = hash_slot(&redis_key("p:", 's', &a, key));
            assert_eq!(identity_slot(key), slot);
            assert_eq!(hash_slot(&redis_key("p:", 'i', &b, key)), slot);
        }
        // A key naming another key's tag does not land in its slot.
        let victim = redis_key("p:", 's', &a, "victim");
        let tag = &victim[victim.find('{').unwrap()..=victim.find('}').unwrap()];
        let attacker = redis_key("p:", 's', &a, tag);
        assert_ne!(attacker.find('{'), None);
        assert_ne!(
            &attacker[attacker.find('{').unwrap()..=attacker.find('}').unwrap()],
            tag
        );
    }
}
