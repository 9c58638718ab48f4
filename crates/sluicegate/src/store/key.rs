//! The key a store keeps for a check's key (docs/SPEC.md, "Keys"): a key up to
//! [`MAX_STORED_KEY_BYTES`] is kept as it is, a longer one becomes a fixed-size SHA-256
//! digest, so that what a client sends (a descriptor value may be 60 KiB) never sets what
//! a key costs in memory or in Redis.
//!
//! Every stored key that starts with [`DIGEST_MARKER`] is a digest: a short key that starts
//! with it is digested too, so no key can be written to look like the digest of another
//! and share its counter.

use std::borrow::Cow;
use std::fmt::Write;

use sha2::{Digest, Sha256};

use super::check::{Check, Limit};

/// The longest key stored as it is, in bytes. Every key people read in a store — user
/// ids, IPv4 and IPv6 addresses, UUIDs, API key ids, a few descriptor entries joined — fits
/// and stays readable in `redis-cli` and in the store's errors; and a digest
/// ([`DIGESTED_KEY_BYTES`]) is not much shorter, so a lower bound would save little.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub const MAX_STORED_KEY_BYTES: usize = 128;

/// What every digested key starts with, and only they.
pub(crate) const DIGEST_MARKER: &str = "~sha256:";

/// The length of a digested key: the marker and 64 hex digits.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub const DIGESTED_KEY_BYTES: usize = DIGEST_MARKER.len() + 64;

/// Whether `key` is stored as it is.
#[inline]
pub(crate) fn key_kept(key: &str) -> bool {
    key.len() <= MAX_STORED_KEY_BYTES && !key.starts_with(DIGEST_MARKER)
}

/// The key stored for `key`: `key` itself, or, when it is longer than
/// [`MAX_STORED_KEY_BYTES`] or starts with [`DIGEST_MARKER`], the marker followed by the
/// SHA-256 of its bytes in lowercase hex.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
#[inline]
pub fn stored_key(key: &str) -> Cow<'_, str> {
    if key_kept(key) {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(digest(key))
    }
}

#[cold]
fn digest(key: &str) -> String {
    let mut digested = String::with_capacity(DIGESTED_KEY_BYTES);
    digested.push_str(DIGEST_MARKER);
    for byte in Sha256::digest(key.as_bytes()) {
        write!(digested, "{byte:02x}").expect("writing to a String cannot fail");
    }
    digested
}

/// Whether every limit's key of `check` is stored as it is: nearly every check's. Tested
/// before [`with_stored_keys`] rather than inside it, so that the common case stays a
/// straight call the compiler inlines.
#[inline]
pub(crate) fn keys_kept(check: &Check<'_>) -> bool {
    check.limits.iter().all(|limit| key_kept(limit.key))
}

/// Runs `decide` on `check` with every limit's key replaced by its stored key (for a check
/// some of whose keys are not [`keys_kept`]).
#[cold]
#[inline(never)]
pub(crate) fn with_stored_keys<R>(check: &Check<'_>, decide: impl FnOnce(&Check<'_>) -> R) -> R {
    let keys: Vec<Cow<'_, str>> = check.limits.iter().map(|l| stored_key(l.key)).collect();
    let limits: Vec<Limit<'_>> = check
        .limits
        .iter()
        .zip(&keys)
        .map(|(limit, key)| Limit {
            rule: limit.rule,
            key,
        })
        .collect();
    decide(&Check {
        limits: &limits,
        ..*check
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_kept_and_long_ones_become_a_digest_of_fixed_size() {
        for key in ["", "alice", "10.0.0.1", &"k".repeat(MAX_STORED_KEY_BYTES)] {
            assert!(matches!(stored_key(key), Cow::Borrowed(kept) if kept == key));
        }
        let long = "v".repeat(60 * 1024);
        let digested = stored_key(&long);
        assert_eq!(digested.len(), DIGESTED_KEY_BYTES);
        assert!(digested.starts_with(DIGEST_MARKER));
        assert_eq!(
            stored_key(&"k".repeat(MAX_STORED_KEY_BYTES + 1)).len(),
            DIGESTED_KEY_BYTES
        );
        // SHA-256 of "abc" (FIPS 180-2, appendix B.1), behind the marker.
        assert_eq!(
            digest("abc"),
            "~sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn long_keys_differing_in_their_last_byte_stay_apart() {
        let a = format!("{}a", "v".repeat(4096));
        let b = format!("{}b", "v".repeat(4096));
        assert_ne!(stored_key(&a), stored_key(&b));
    }

    #[test]
    fn a_key_written_as_a_digest_is_digested_again() {
        let long = "v".repeat(1000);
        let digested = stored_key(&long).into_owned();
        // The digest of `long`, sent as a key of its own, is not stored as `long` is.
        assert_ne!(stored_key(&digested), digested);
        assert_eq!(stored_key(&digested).len(), DIGESTED_KEY_BYTES);
        assert!(matches!(stored_key(DIGEST_MARKER), Cow::Owned(_)));
        assert!(matches!(stored_key("~sha256"), Cow::Borrowed(_)));
    }
}
