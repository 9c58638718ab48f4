//! The decision of docs/SPEC.md and the combination of several rules' decisions into one.

use std::fmt;
use std::time::Duration;

use crate::micros::saturating_micros;

/// How long until a request of the same cost could be allowed, assuming no other traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RetryAfter {
    /// After this long (zero when allowed), in whole microseconds.
    After(Duration),
    /// The cost can never fit under the rule (c > L, c > B, c > Q + 1).
    Never,
}

impl RetryAfter {
    /// After `us` µs.
    pub(crate) const fn micros(us: u64) -> RetryAfter {
        RetryAfter::After(Duration::from_micros(us))
    }

    /// The wait, or `None` for never.
    pub fn duration(self) -> Option<Duration> {
        match self {
            RetryAfter::After(wait) => Some(wait),
            RetryAfter::Never => None,
        }
    }

    /// µs, or `None` for never.
    pub(crate) fn as_micros(self) -> Option<u64> {
        match self {
            RetryAfter::After(wait) => Some(saturating_micros(wait)),
            RetryAfter::Never => None,
        }
    }
}

impl fmt::Display for RetryAfter {
    /// Whole µs, or `never`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_micros() {
            Some(us) => write!(f, "{us}"),
            None => f.write_str("never"),
        }
    }
}

/// `retry` in µs, with never as -1: the replay format's and the HTTP API's encoding.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]
pub fn signed_micros(retry: RetryAfter) -> i64 {
    match retry.as_micros() {
        Some(us) => i64::try_from(us).unwrap_or(i64::MAX),
        None => -1,
    }
}

/// The answer to one check (docs/SPEC.md, "The decision").
///
/// Its times are whole microseconds, as the stores count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request may go on.
    pub allowed: bool,
    /// L (B for token-bucket, Q + 1 for leaky-bucket).
    pub limit: u64,
    /// Whole units that a request at the same instant could still take, after this decision.
    pub remaining: u64,
    pub(crate) retry_after: RetryAfter,
    /// µs until the key is back to its empty state.
    pub(crate) reset_after: u64,
    /// µs the caller must wait before going on (leaky-bucket only).
    pub(crate) delay: u64,
}

impl Decision {
    /// A decision a front end makes itself (a refusal of its own, say), to answer as the
    /// library's decisions are answered. Times are kept in whole microseconds: a part
    /// below one microsecond is dropped, and a time past `u64::MAX` µs (about 584,000
    /// years) is held at that maximum.
    pub fn new(
        allowed: bool,
        limit: u64,
        remaining: u64,
        retry_after: RetryAfter,
        reset_after: Duration,
        delay: Duration,
    ) -> Decision {
        let retry_after = match retry_after.as_micros() {
            Some(us) => RetryAfter::micros(us),
            None => RetryAfter::Never,
        };
        Decision {
            allowed,
            limit,
            remaining,
            retry_after,
            reset_after: saturating_micros(reset_after),
            delay: saturating_micros(delay),
        }
    }

    /// How long until a request of the same cost could be allowed, assuming no other
    /// traffic: zero when allowed.
    pub fn retry_after(&self) -> RetryAfter {
        self.retry_after
    }

    /// How long until the key is back to its empty state, assuming no other traffic.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after)
    }

    /// How long the caller must wait before going on: leaky-bucket only, zero otherwise.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay)
    }

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
                (true, true) => RetryAfter::micros(0),
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
        let per_second = decision(true, 10, 3, RetryAfter::micros(0));
        let per_day = decision(false, 1000, 0, RetryAfter::micros(500));
        let global = decision(false, 5, 0, RetryAfter::micros(70));
        let combined = Decision::combine([&per_second, &per_day, &global]).unwrap();
        assert!(!combined.allowed);
        // Least remaining is 0 for two rules; the smaller limit breaks the tie.
        assert_eq!((combined.limit, combined.remaining), (5, 0));
        assert_eq!(combined.retry_after, RetryAfter::micros(500));
        assert_eq!(combined.reset_after, 10_000);
        assert_eq!(combined.delay, 3);
    }

    #[test]
    fn never_dominates_and_allowed_retry_is_zero() {
        let never = decision(false, 3, 3, RetryAfter::Never);
        let soon = decision(false, 3, 0, RetryAfter::micros(9));
        assert_eq!(
            Decision::combine([&soon, &never]).unwrap().retry_after,
            RetryAfter::Never
        );
        let ok = decision(true, 3, 1, RetryAfter::micros(0));
        let combined = Decision::combine([&ok, &ok]).unwrap();
        assert!(combined.allowed);
        assert_eq!(combined.retry_after, RetryAfter::micros(0));
        assert_eq!(Decision::combine([]), None);
        assert_eq!(signed_micros(RetryAfter::Never), -1);
    }
}
