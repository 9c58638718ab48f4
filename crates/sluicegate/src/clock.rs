//! Where "now" comes from. The in-memory store reads a [`Clock`]; tests inject a
//! [`ManualClock`] and move it by hand instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::micros::saturating_micros;

/// A source of the time since the Unix epoch.
///
/// The library counts time in whole microseconds: a part of [`Clock::now`] below one
/// microsecond is dropped, and a time past `u64::MAX` µs reads as that maximum; a store
/// refuses to decide at a time past the last its state can hold (2^52 µs after the
/// epoch, the year 2112), with a [`StoreError`](crate::StoreError).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time since the Unix epoch.
    fn now(&self) -> Duration;
}

/// The time of a [`Clock`] in whole µs, as the library keeps it.
pub(crate) trait ClockMicros {
    /// [`Clock::now`] in µs since the Unix epoch.
    fn now_micros(&self) -> u64;
}

impl<C: Clock + ?Sized> ClockMicros for C {
    fn now_micros(&self) -> u64 {
        saturating_micros(self.now())
    }
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
    fn now(&self) -> Duration {
        Duration::from_micros(self.now_micros())
    }
}

impl SystemClock {
    /// µs since the Unix epoch, read without going through a [`Duration`].
    fn now_micros(&self) -> u64 {
        // Raw counts and their delta in ns, not `Instant`s and a `Duration`: the conversions
        // through seconds and nanoseconds take a sixth of a lock-free refusal. The delta is
        // 0 for a count at or before the anchor, so the clock never reads before it.
        let elapsed = self.clock.delta_as_nanos(self.anchor, self.clock.raw());
        self.anchor_micros.saturating_add(elapsed / 1_000)
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// It keeps whole microseconds since the Unix epoch: a part below one microsecond of a
/// time it is given is dropped, and it never moves past `u64::MAX` µs (about 584,000
/// years): a time beyond stands at that maximum rather than wrapping.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `since_epoch`.
    pub fn new(since_epoch: Duration) -> Self {
        ManualClock {
            micros: Arc::new(AtomicU64::new(saturating_micros(since_epoch))),
        }
    }

    /// Moves the clock to `since_epoch` (backwards too: stores must cope).
    pub fn set(&self, since_epoch: Duration) {
        self.micros
            .store(saturating_micros(since_epoch), Ordering::SeqCst);
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = saturating_micros(by);
        // Never fails: the closure always answers.
        let _ = self
            .micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(by))
            });
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_micros(self.micros.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let clock = ManualClock::new(Duration::from_micros(5));
        let other = clock.clone();
        clock.advance(Duration::from_micros(10));
        assert_eq!(other.now_micros(), 15);
        other.set(Duration::from_micros(3));
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
