//! The after-charges in flight (`Usage::pending`, `Usage::drain`) and how each attempt is
//! bounded: a real axum server behind the layer on a loopback socket, a real HTTP client,
//! a store that answers the after-charges late or never.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluicegate::{Charge, Check, Limiter, MemoryStore, Outcome, Store, StoreError};
use sluicegate_tower::{KeyExtractor, RateLimitLayer, Usage};

use crate::common;

use common::*;

/// A store whose after-charges (reports and settles) answer after `delay`, or never.
struct Late {
    store: MemoryStore,
    delay: Option<Duration>,
}

impl Store for Late {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        if matches!(check.charge, Charge::Report | Charge::Settle) {
            match self.delay {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        }
        self.store.check(check).await
    }
}

/// Serves `usage` on a store whose after-charges take `delay` (or forever), and sends one
/// request that costs 30 tokens.
async fn one_charge(usage: &Usage, delay: Option<Duration>) {
    let limiter = Arc::new(Limiter::new(Late {
        store: memory(),
        delay,
    }));
    let layer = RateLimitLayer::new(limiter)
        .limit(tokens_rule(1_000), KeyExtractor::header(API_KEY))
        .charge_after(usage.clone());
    let address = serve(layer).await;
    assert_eq!(complete(address, "30", "").await.status, 200);
}

/// A shutdown's drain waits for a charge still in flight, and it is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_for_the_charges_in_flight() {
    let usage = Usage::from_header(TOKENS);
    one_charge(&usage, Some(Duration::from_millis(500))).await;
    assert_eq!(usage.pending(), 1, "the charge runs beside the response");
    assert_eq!(usage.drain(Duration::from_secs(30)).await, 0);
    let stats = usage.stats();
    assert_eq!(
        (usage.pending(), stats.recorded(), stats.failed()),
        (0, 1, 0)
    );
}

/// A drain gives up, at its deadline, a charge the store never answers: counted failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_gives_up_what_is_pending_at_its_deadline() {
    let usage = Usage::from_header(TOKENS).attempt_timeout(Duration::from_secs(600));
    one_charge(&usage, None).await;
    let started = Instant::now();
    assert_eq!(usage.drain(Duration::from_millis(200)).await, 1);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded by its timeout"
    );
    let stats = usage.stats();
    assert_eq!(
        (usage.pending(), stats.recorded(), stats.failed()),
        (0, 0, 1)
    );
}

/// An attempt the store does not answer in time is tried again, then given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_takes_too_long_is_tried_again() {
    let usage = Usage::from_header(TOKENS)
        .attempts(2)
        .attempt_timeout(Duration::from_millis(100));
    one_charge(&usage, None).await;
    let stats = usage.stats();
    settled(&stats, 1).await;
    assert_eq!(
        (stats.recorded(), stats.retries(), stats.failed()),
        (0, 1, 1)
    );
}

/// An invalid check (a fallback cost no store decides) is given up at once, not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_charge_is_not_retried() {
    let limiter = Arc::new(Limiter::new(memory()));
    let usage = Usage::from_header(TOKENS).when_missing(Check::MAX_COST + 1);
    let layer = RateLimitLayer::new(limiter)
        .limit(tokens_rule(1_000), KeyExtractor::header(API_KEY))
        .charge_after(usage.clone());
    let address = serve(layer).await;
    assert_eq!(complete(address, "none", "").await.status, 200);
    let stats = usage.stats();
    settled(&stats, 1).await;
    assert_eq!(
        (stats.recorded(), stats.retries(), stats.failed()),
        (0, 0, 1)
    );
}

/// A store whose first after-charge is recorded but its answer lost (a timeout), and which
/// keeps the standing each later after-charge answered.
struct LosesFirstAnswer {
    store: MemoryStore,
    lost: std::sync::atomic::AtomicBool,
    answered: std::sync::Mutex<Vec<Outcome>>,
}

impl Store for LosesFirstAnswer {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        let outcome = self.store.check(check).await;
        if !matches!(check.charge, Charge::Report | Charge::Settle) {
            return outcome;
        }
        if !self.lost.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return Err(StoreError::Timeout {
                server: "test".into(),
                key: None,
                after: Duration::from_millis(1),
            });
        }
        self.answered.lock().unwrap().push(outcome.clone()?);
        outcome
    }
}

/// A retried charge sends the same id and cost: the store counts it once, and the retry is
/// no conflicting reuse of its id but a repeat, recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_charge_is_counted_once() {
    let limiter = Arc::new(Limiter::new(LosesFirstAnswer {
        store: memory(),
        lost: false.into(),
        answered: Vec::new().into(),
    }));
    let usage = Usage::from_header(TOKENS).attempts(3);
    let layer = RateLimitLayer::new(Arc::clone(&limiter))
        .limit(tokens_rule(1_000), KeyExtractor::header(API_KEY))
        .charge_after(usage.clone());
    let address = serve(layer).await;
    assert_eq!(complete(address, "30", "").await.status, 200);
    let stats = usage.stats();
    settled(&stats, 1).await;
    assert_eq!(
        (stats.recorded(), stats.retries(), stats.failed()),
        (1, 1, 0)
    );
    let store = limiter.store();
    // The retry's standing: 30 tokens taken once, not twice.
    let answered = store.answered.lock().unwrap();
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].decision.remaining, 970);
}
