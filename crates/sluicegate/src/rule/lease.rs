//! A rule's lease: how many units an instance takes from the store at once for a key,
//! and how long it may spend them (docs/SPEC.md, "Leases").

use std::time::Duration;

use super::spec::{Algorithm, RuleError};
use crate::duration::format_duration;
use crate::micros::whole_micros;

/// The longest default spend time: a lease is meant for keys hot enough to spend k units
/// well within it.
const MAX_DEFAULT_SPEND_WITHIN: u64 = 1_000_000;

/// How a rule leases: k units taken at once, spendable for at most D after they were
/// asked for ([`Rule::with_lease`](crate::Rule::with_lease)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    units: u64,
    spend_within: u64,
}

impl Lease {
    /// k: the units one take asks the store for.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// D: how long after a take was sent its units may be spent.
    pub fn spend_within(&self) -> Duration {
        Duration::from_micros(self.spend_within)
    }

    /// D in µs.
    pub(crate) fn spend_within_micros(&self) -> u64 {
        self.spend_within
    }

    /// A lease of `units` for a rule of `algorithm` with capacity `capacity` and window
    /// `window` µs, spent within `spend_within` (by default min(W / 10, 1 s) for a fixed
    /// window; min(W / 100, 1 s) for a sliding log and a token bucket, whose stored numbers
    /// it changes), every bound checked.
    pub(super) fn new(
        algorithm: Algorithm,
        capacity: u64,
        window: u64,
        units: u64,
        spend_within: Option<Duration>,
    ) -> Result<Lease, RuleError> {
        match algorithm {
            Algorithm::SlidingLog | Algorithm::FixedWindow | Algorithm::TokenBucket => {}
            // A sliding counter weighs a bucket by when it is read, and a leaky bucket
            // tells each unit of a check when to go: units taken at once and spent later
            // would be neither's decision.
            Algorithm::SlidingCounter | Algorithm::LeakyBucket => {
                return Err(RuleError::new(
                    "lease",
                    format!(
                        "a lease applies to sliding-log, fixed-window and token-bucket, \
                         not to {algorithm}"
                    ),
                ));
            }
        }
        if units == 0 {
            return Err(RuleError::new("lease", "lease must be at least 1"));
        }
        if units > capacity {
            return Err(RuleError::new(
                "lease",
                format!(
                    "lease {units} exceeds the rule's capacity {capacity}: a take could \
                     never be admitted"
                ),
            ));
        }
        let spend_within = match spend_within {
            None => {
                // A fixed window's lease costs nothing while it is spent; the others'
                // stored numbers give up D's worth (see `Rule::with_lease`).
                let share = if algorithm == Algorithm::FixedWindow {
                    10
                } else {
                    100
                };
                (window / share).clamp(1, MAX_DEFAULT_SPEND_WITHIN)
            }
            Some(given) => match whole_micros(given) {
                Some(d) if (1..=window).contains(&d) => d,
                _ => {
                    return Err(RuleError::new(
                        "lease_for",
                        format!(
                            "lease_for {given:?} must be at least 1µs and at most the window {}",
                            format_duration(window)
                        ),
                    ));
                }
            },
        };
        Ok(Lease {
            units,
            spend_within,
        })
    }
}
