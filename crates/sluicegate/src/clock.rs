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

/// The process clock: monotonic, anchored to the wall clock when it was created, so it
/// reads µs since the Unix epoch but never jumps when the host's clock is stepped (a rate
/// limiter cares about intervals; an NTP step backwards must not reopen a window).
///
/// It reads the CPU's time-stamp counter where that is stable (about 15 ns a read, half
/// of `SystemTime::now`), and the OS monotonic clock elsewhere.
#[derive(Clone, Debug)]
pub struct SystemClock {
    clock: quanta::Clock,
    /// The clock's raw count when `anchor_micros` was read.
    anchor: u64,
    anchor_micros: u64,
}

impl SystemClock {
    /// A clock reading the wall time now, and moving monotonically from there.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let anchor = clock.raw();
        // A clock before 1970 is a broken host; starting at the epoch keeps deciding.
        let anchor_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        SystemClock {
            clock,
            anchor,
            anchor_micros,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        // Raw counts and their delta in ns, not `Instant`s and a `Duration`: the conversions
        // through seconds and nanoseconds take a sixth of a lock-free refusal. The delta is
        // 0 for a count at or before the anchor, so the clock never reads before it.
        let elapsed = self.clock.delta_as_nanos(self.anchor, self.clock.raw());
        self.anchor_micros.saturating_add(elapsed / 1_000)
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
    fn system_clock_reads_wall_time_and_never_goes_back() {
        let clock = SystemClock::new();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        let first = clock.now_micros();
        assert!(first.abs_diff(wall) < 1_000_000, "{first} vs {wall}");
        let mut last = first;
        for _ in 0..10_000 {
            let now = clock.now_micros();
            assert!(now >= last);
            last = now;
        }
    }
}
