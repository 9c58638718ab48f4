//! What the Redis tests share: a seeded random sequence, and every algorithm and layout.

use sluicegate::{Algorithm, LogLayout};

/// A deterministic random sequence (xorshift), so a failure names a seed to replay.
pub(crate) struct Random(pub(crate) u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Every algorithm, the sliding log in both layouts.
pub(crate) const CASES: [(Algorithm, Option<LogLayout>); 6] = [
    (Algorithm::SlidingLog, Some(LogLayout::Zset)),
    (Algorithm::SlidingLog, Some(LogLayout::Compact)),
    (Algorithm::SlidingCounter, None),
    (Algorithm::FixedWindow, None),
    (Algorithm::TokenBucket, None),
    (Algorithm::LeakyBucket, None),
];
