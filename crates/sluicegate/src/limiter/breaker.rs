//! A circuit breaker for the store: after `failures` consecutive failures, stop calling it
//! for `cool_down`, then let one check through as a probe; its success closes the circuit.
//!
//! Times are µs of the limiter's [`Clock`](crate::Clock), passed in by the caller, so
//! tests move a manual clock past the cool-down instead of sleeping through it.
//!
//! Every check asks the breaker, so a healthy store must not make every check queue on
//! one lock: while nothing has failed, asking and reporting success read one flag and take
//! no lock. Only a failure, and everything while failures count, takes the lock.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The breaker's state, as a metric reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Checks go to the store.
    Closed,
    /// The store failed repeatedly; checks fall back without calling it.
    Open,
    /// One probe is on its way to the store.
    HalfOpen,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    failures_to_open: u32,
    /// µs.
    cool_down: u64,
    /// Whether `state` is anything but closed with no failure counted. Written only under
    /// the lock; read without it, as if the read came just before or after a concurrent
    /// change (no other data is read on the strength of it, hence relaxed).
    failing: AtomicBool,
    state: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    consecutive_failures: u32,
    /// µs of the limiter's clock.
    open_until: Option<u64>,
    probing: bool,
}

/// Whether a check may call the store.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Permit {
    Call,
    Probe,
    Refuse,
}

impl Breaker {
    /// `failures_to_open` = 0 never opens.
    pub(crate) fn new(failures_to_open: u32, cool_down: Duration) -> Self {
        Breaker {
            failures_to_open,
            cool_down: u64::try_from(cool_down.as_micros()).unwrap_or(u64::MAX),
            failing: AtomicBool::new(false),
            state: Mutex::new(Inner {
                consecutive_failures: 0,
                open_until: None,
                probing: false,
            }),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn healthy(&self) -> bool {
        !self.failing.load(Ordering::Relaxed)
    }

    pub(crate) fn permit(&self, now: u64) -> Permit {
        if self.healthy() {
            return Permit::Call;
        }
        let mut inner = self.inner();
        match inner.open_until {
            None => Permit::Call,
            Some(until) if now < until || inner.probing => Permit::Refuse,
            Some(_) => {
                inner.probing = true;
                Permit::Probe
            }
        }
    }

    pub(crate) fn success(&self) {
        if self.healthy() {
            return;
        }
        let mut inner = self.inner();
        inner.consecutive_failures = 0;
        inner.open_until = None;
        inner.probing = false;
        self.failing.store(false, Ordering::Relaxed);
    }

    pub(crate) fn failure(&self, now: u64) {
        let mut inner = self.inner();
        inner.consecutive_failures = inner.consecutive_failures.saturating_add(1);
        inner.probing = false;
        self.failing.store(true, Ordering::Relaxed);
        if self.failures_to_open > 0
            && (inner.open_until.is_some() || inner.consecutive_failures >= self.failures_to_open)
        {
            inner.open_until = Some(now.saturating_add(self.cool_down));
        }
    }

    /// How long until the store is tried again (zero when closed).
    pub(crate) fn wait(&self, now: u64) -> Duration {
        if self.healthy() {
            return Duration::ZERO;
        }
        self.inner().open_until.map_or(Duration::ZERO, |until| {
            Duration::from_micros(until.saturating_sub(now))
        })
    }

    pub(crate) fn state(&self, now: u64) -> BreakerState {
        if self.healthy() {
            return BreakerState::Closed;
        }
        let inner = self.inner();
        match inner.open_until {
            None => BreakerState::Closed,
            Some(_) if inner.probing => BreakerState::HalfOpen,
            Some(until) if now >= until => BreakerState::HalfOpen,
            Some(_) => BreakerState::Open,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_the_cool_down() {
        let breaker = Breaker::new(3, Duration::from_secs(1));
        let clock = ManualClock::new(1_700_000_000_000_000);
        let now = || clock.now_micros();
        for _ in 0..2 {
            breaker.failure(now());
        }
        assert_eq!(breaker.permit(now()), Permit::Call);
        breaker.success();
        for _ in 0..3 {
            breaker.failure(now());
        }
        assert_eq!(breaker.state(now()), BreakerState::Open);
        clock.advance(999_000);
        assert_eq!(breaker.permit(now()), Permit::Refuse);
        assert_eq!(breaker.wait(now()), Duration::from_millis(1));
        clock.advance(1_000);
        assert_eq!(breaker.permit(now()), Permit::Probe);
        // One probe at a time.
        assert_eq!(breaker.permit(now()), Permit::Refuse);
        breaker.failure(now());
        assert_eq!(breaker.state(now()), BreakerState::Open);
        clock.advance(1_000_000);
        assert_eq!(breaker.permit(now()), Permit::Probe);
        breaker.success();
        assert_eq!(breaker.state(now()), BreakerState::Closed);
        assert_eq!(breaker.permit(now()), Permit::Call);
    }

    #[test]
    fn zero_failures_never_opens() {
        let breaker = Breaker::new(0, Duration::from_secs(1));
        let t = ManualClock::new(1_700_000_000_000_000).now_micros();
        for _ in 0..100 {
            breaker.failure(t);
        }
        assert_eq!(breaker.permit(t), Permit::Call);
    }
}
