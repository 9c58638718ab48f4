//! Where "now" comes from. The in-memory store reads a [`Clock`]; tests inject a
//! [`ManualClock`] and move it by hand instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of µs since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time in µs since the Unix epoch.
    fn now_micros(&self) -> u64;
}

/// The process's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        // A clock before 1970 is a broken host; treating it as the epoch keeps deciding
        // (the store never lets a key's time run backwards anyway).
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `micros`.
    pub fn new(micros: u64) -> Self {
        ManualClock {
            micros: Arc::new(AtomicU64::new(micros)),
        }
    }

    /// Moves the clock to `micros` (backwards too: stores must cope).
    pub fn set(&self, micros: u64) {
        self.micros.store(micros, Ordering::SeqCst);
    }

    /// Moves the clock forward by `micros`.
    pub fn advance(&self, micros: u64) {
        self.micros.fetch_add(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.micros.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let clock = ManualClock::new(5);
        let other = clock.clone();
        clock.advance(10);
        assert_eq!(other.now_micros(), 15);
        other.set(3);
        assert_eq!(clock.now_micros(), 3);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_micros() > 1_577_836_800_000_000);
    }
}
