//! The breaker alone, on a manual clock: a rate over a window opens it, only its probe
//! closes it, and no stale result moves it.

use super::*;
use crate::clock::{ClockMicros, ManualClock};
use std::time::Duration;

const MS: u64 = 1_000;

fn breaker(failure_rate: f64, min_calls: u32) -> (Breaker, ManualClock) {
    let breaker = Breaker::new(
        BreakerConfig {
            failure_rate,
            window: Duration::from_secs(1),
            min_calls,
            cool_down: Duration::from_secs(1),
        },
        "127.0.0.1:6379".to_owned(),
    );
    (
        breaker,
        ManualClock::new(Duration::from_secs(1_700_000_000)),
    )
}

fn call(breaker: &Breaker, now: u64) -> Ticket<'_> {
    match breaker.permit(now) {
        Permit::Call(ticket) => ticket,
        Permit::Refuse => panic!("refused while {:?}", breaker.state(now)),
    }
}

fn refused(breaker: &Breaker, now: u64) -> bool {
    matches!(breaker.permit(now), Permit::Refuse)
}

/// `n` calls ending at `now`, `failed` of them failures.
fn calls(breaker: &Breaker, now: u64, n: u32, failed: u32) {
    for i in 0..n {
        call(breaker, now).finish(i >= failed, now);
    }
}

#[test]
fn a_burst_of_failures_among_many_successes_does_not_open_it() {
    let (breaker, clock) = breaker(0.5, 20);
    calls(&breaker, clock.now_micros(), 1_000, 0);
    // Every check in flight times out at once: what a 70 ms stall does under load.
    clock.advance(Duration::from_micros(100 * MS));
    calls(&breaker, clock.now_micros(), 300, 300);
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Closed);
    assert_eq!(breaker.transitions().to(BreakerState::Open), 0);
}

#[test]
fn it_opens_once_the_rate_over_the_window_is_reached_with_enough_calls() {
    let (breaker, clock) = breaker(0.5, 20);
    // Below the minimum of calls, even all failing.
    calls(&breaker, clock.now_micros(), 19, 19);
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Closed);
    // The 20th failure: 20 calls, all failed.
    calls(&breaker, clock.now_micros(), 1, 1);
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Open);
    assert_eq!(breaker.transitions().to(BreakerState::Open), 1);
}

#[test]
fn calls_older_than_the_window_no_longer_count() {
    let (breaker, clock) = breaker(0.5, 20);
    calls(&breaker, clock.now_micros(), 100, 0);
    clock.advance(Duration::from_micros(1_100 * MS));
    // The 100 successes have left the window: 20 failures alone are the whole of it.
    calls(&breaker, clock.now_micros(), 20, 20);
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Open);
}

#[test]
fn a_late_result_of_a_call_sent_before_it_opened_changes_nothing() {
    let (breaker, clock) = breaker(0.5, 20);
    let stale_failure = call(&breaker, clock.now_micros());
    let stale_success = call(&breaker, clock.now_micros());
    calls(&breaker, clock.now_micros(), 20, 20);
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Open);
    // A success sent while closed does not close it...
    stale_success.finish(true, clock.now_micros());
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Open);

    clock.advance(Duration::from_micros(1_000 * MS));
    let probe = call(&breaker, clock.now_micros());
    assert!(probe.is_probe());
    assert!(refused(&breaker, clock.now_micros()), "one probe at a time");
    // ...and a failure sent while closed neither re-arms the cool-down nor clears the probe.
    stale_failure.finish(false, clock.now_micros());
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::HalfOpen);
    assert!(refused(&breaker, clock.now_micros()));
    probe.finish(true, clock.now_micros());
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Closed);
    assert_eq!(
        [
            BreakerState::Open,
            BreakerState::HalfOpen,
            BreakerState::Closed
        ]
        .map(|s| breaker.transitions().to(s)),
        [1, 1, 1]
    );
}

#[test]
fn a_failed_probe_opens_it_for_another_cool_down() {
    let (breaker, clock) = breaker(0.5, 20);
    calls(&breaker, clock.now_micros(), 20, 20);
    clock.advance(Duration::from_micros(999 * MS));
    assert!(refused(&breaker, clock.now_micros()));
    assert_eq!(breaker.wait(clock.now_micros()), Duration::from_millis(1));
    clock.advance(Duration::from_micros(MS));
    let probe = call(&breaker, clock.now_micros());
    clock.advance(Duration::from_micros(50 * MS));
    probe.finish(false, clock.now_micros());
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Open);
    assert_eq!(breaker.wait(clock.now_micros()), Duration::from_secs(1));
    clock.advance(Duration::from_micros(1_000 * MS));
    call(&breaker, clock.now_micros()).finish(true, clock.now_micros());
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Closed);
}

#[test]
fn closing_starts_the_count_afresh() {
    let (breaker, clock) = breaker(0.5, 20);
    calls(&breaker, clock.now_micros(), 20, 20);
    clock.advance(Duration::from_micros(1_000 * MS));
    call(&breaker, clock.now_micros()).finish(true, clock.now_micros());
    // The failures that opened it are still within the window, but do not count again.
    calls(&breaker, clock.now_micros(), 19, 19);
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Closed);
}

#[test]
fn an_abandoned_probe_lets_the_next_check_probe() {
    let (breaker, clock) = breaker(0.5, 20);
    calls(&breaker, clock.now_micros(), 20, 20);
    clock.advance(Duration::from_micros(1_000 * MS));
    drop(call(&breaker, clock.now_micros()));
    let probe = call(&breaker, clock.now_micros());
    assert!(probe.is_probe());
    probe.finish(true, clock.now_micros());
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Closed);
}

#[test]
fn zero_min_calls_never_opens() {
    let (breaker, clock) = breaker(0.5, 0);
    calls(&breaker, clock.now_micros(), 1_000, 1_000);
    assert_eq!(breaker.state(clock.now_micros()), BreakerState::Closed);
}

/// Log lines, as a subscriber formats them, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn every_change_is_logged_at_warn_with_its_node_and_reason() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let (breaker, clock) = breaker(0.5, 20);
        calls(&breaker, clock.now_micros(), 20, 20);
        clock.advance(Duration::from_micros(1_000 * MS));
        call(&breaker, clock.now_micros()).finish(false, clock.now_micros());
        clock.advance(Duration::from_micros(1_000 * MS));
        call(&breaker, clock.now_micros()).finish(true, clock.now_micros());
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let expected = [
        "store circuit breaker of 127.0.0.1:6379 open: 20 of the last 20 store calls failed",
        "store circuit breaker of 127.0.0.1:6379 half_open: the cool-down passed",
        "store circuit breaker of 127.0.0.1:6379 open: the probe failed",
        "store circuit breaker of 127.0.0.1:6379 half_open: the cool-down passed",
        "store circuit breaker of 127.0.0.1:6379 closed: the probe succeeded",
    ];
    assert_eq!(lines.len(), expected.len(), "{text}");
    for (line, message) in lines.iter().zip(expected) {
        assert!(line.contains(" WARN ") && line.contains(message), "{line}");
    }
}
