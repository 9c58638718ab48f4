//! The decision of docs/SPEC.md and the combination of several rules' decisions into one.

use std::fmt;

/// How long until a request of the same cost could be allowed, assuming no other traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RetryAfter {
    /// After this many µs (0 when allowed).
    Micros(u64),
    /// The cost can never fit under the rule (c > L, c > B, c > Q + 1).
    Never,
}

impl RetryAfter {
    /// µs, with `never` as -1: the replay format's encoding.
    pub fn as_signed_micros(self) -> i64 {
        match self {
            RetryAfter::Micros(us) => i64::try_from(us).unwrap_or(i64::MAX),
            RetryAfter::Never => -1,
        }
    }

    /// µs, or `None` for never.
    pub fn micros(self) -> Option<u64> {
        match self {
            RetryAfter::Micros(us) => Some(us),
            RetryAfter::Never => None,
        }
    }
}

impl fmt::Display for RetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryAfter::Micros(us) => write!(f, "{us}"),
            RetryAfter::Never => f.write_str("never"),
        }
    }
}

/// The answer to one check (docs/SPEC.md, "The decision").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request may go on.
    pub allowed: bool,
    /// L (B for token-bucket, Q + 1 for leaky-bucket).
    pub limit: u64,
    /// Whole units that a request at the same instant could still take, after this decision.
    pub remaining: u64,
    /// µs until a request of the same cost could be allowed; 0 when allowed.
    pub retry_after: RetryAfter,
    /// µs until the key is back to its empty state, assuming no other traffic.
    pub reset_after: u64,
    /// leaky-bucket only: µs the caller must wait before going on.
    pub delay: u64,
}

impl Decision {
    /// Combines the decisions of every rule of one check (docs/SPEC.md, "Several rules"): allowed
    /// iff all allowed; `limit` and `remaining` of the rule with the least remaining (then the
    /// smallest limit); the largest `retry_after` among the rejecting rules; the largest
    /// `reset_after` and `delay`. `None` for no decisions.
    pub fn combine<'a>(decisions: impl IntoIterator<Item = &'a Decision>) -> Option<Decision> {
        let mut decisions = decisions.into_iter();
        let first = *decisions.next()?;
        Some(decisions.fold(first, |acc, d| {
            let tightest = if (d.remaining, d.limit) < (acc.remaining, acc.limit) {
                d
            } else {
                &acc
            };
            let retry_after = match (acc.allowed, d.allowed) {
                (true, true) => RetryAfter::Micros(0),
                (true, false) => d.retry_after,
                (false, true) => acc.retry_after,
                (false, false) => acc.retry_after.max(d.retry_after),
            };
            Decision {
                allowed: acc.allowed && d.allowed,
                limit: tightest.limit,
                remaining: tightest.remaining,
                retry_after,
                reset_after: acc.reset_after.max(d.reset_after),
                delay: acc.delay.max(d.delay),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool, limit: u64, remaining: u64, retry: RetryAfter) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            retry_after: retry,
            reset_after: limit * 10,
            delay: remaining,
        }
    }

    #[test]
    fn combine_takes_tightest_rule_and_largest_waits() {
        let per_second = decision(true, 10, 3, RetryAfter::Micros(0));
        let per_day = decision(false, 1000, 0, RetryAfter::Micros(500));
        let global = decision(false, 5, 0, RetryAfter::Micros(70));
        let combined = Decision::combine([&per_second, &per_day, &global]).unwrap();
        assert!(!combined.allowed);
        // Least remaining is 0 for two rules; the smaller limit breaks the tie.
        assert_eq!((combined.limit, combined.remaining), (5, 0));
        assert_eq!(combined.retry_after, RetryAfter::Micros(500));
        assert_eq!(combined.reset_after, 10_000);
        assert_eq!(combined.delay, 3);
    }

    #[test]
    fn never_dominates_and_allowed_retry_is_zero() {
        let never = decision(false, 3, 3, RetryAfter::Never);
        let soon = decision(false, 3, 0, RetryAfter::Micros(9));
        assert_eq!(
            Decision::combine([&soon, &never]).unwrap().retry_after,
            RetryAfter::Never
        );
        let ok = decision(true, 3, 1, RetryAfter::Micros(0));
        let combined = Decision::combine([&ok, &ok]).unwrap();
        assert!(combined.allowed);
        assert_eq!(combined.retry_after, RetryAfter::Micros(0));
        assert_eq!(Decision::combine([]), None);
        assert_eq!(RetryAfter::Never.as_signed_micros(), -1);
    }
}
