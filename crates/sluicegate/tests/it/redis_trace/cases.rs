//! Every algorithm and layout the Redis tests run through.

use sluicegate::{Algorithm, LogLayout};

/// Every algorithm, the sliding log in both layouts.
pub(crate) const CASES: [(Algorithm, Option<LogLayout>); 6] = [
    (Algorithm::SlidingLog, Some(LogLayout::Zset)),
    (Algorithm::SlidingLog, Some(LogLayout::Compact)),
    (Algorithm::SlidingCounter, None),
    (Algorithm::FixedWindow, None),
    (Algorithm::TokenBucket, None),
    (Algorithm::LeakyBucket, None),
];
