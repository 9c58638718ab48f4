//! The local pre-check through the limiter, on a manual clock: instances that share one
//! store each refuse past their share; with traffic spread evenly they decide as the store
//! alone would, with all of it on one instance they refuse what the store would admit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::rule::{Algorithm, RuleSpec};
use crate::store::MemoryStoreConfig;

/// One in-memory store shared by several limiters, counting the checks it decides.
#[derive(Debug, Clone)]
struct SharedStore {
    inner: Arc<MemoryStore>,
    calls: Arc<AtomicU64>,
}

impl Store for SharedStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.check_now(check)
    }
}

/// Two instances (each told `--instances 2`) on one store, pre-checking at `factor`.
fn two_instances(factor: Option<f64>) -> ([Limiter<SharedStore>; 2], SharedStore) {
    let clock = ManualClock::new(Duration::from_micros(1_700_000_040 * 1_000_000));
    let store = SharedStore {
        inner: Arc::new(MemoryStore::new(
            MemoryStoreConfig::default(),
            Arc::new(clock.clone()),
        )),
        calls: Arc::new(AtomicU64::new(0)),
    };
    let config = LimiterConfig {
        instances: 2,
        local_precheck: factor,
        ..LimiterConfig::default()
    };
    let limiter = || Limiter::with_clock(store.clone(), config.clone(), Arc::new(clock.clone()));
    ([limiter(), limiter()], store)
}

/// 10 per minute, one window: the store admits the first 10 checks, whoever sends them.
fn rule() -> Rule {
    Rule::new(
        "ten",
        &RuleSpec::new(Algorithm::FixedWindow, 10, Duration::from_secs(60)),
    )
    .unwrap()
}

/// Sends 30 checks of one key, the `n`th through the instance `through(n)`; each decision
/// and who made it.
async fn send(
    instances: &[Limiter<SharedStore>; 2],
    through: impl Fn(usize) -> usize,
) -> Vec<(bool, DecidedBy)> {
    let rule = rule();
    let limits = [Limit {
        rule: &rule,
        key: "client",
    }];
    let mut answers = Vec::new();
    for n in 0..30 {
        let outcome = instances[through(n)]
            .decide(&Check::new(&limits, 1))
            .await
            .unwrap();
        answers.push((outcome.decision.allowed, outcome.decided_by));
    }
    answers
}

fn allowed(answers: &[(bool, DecidedBy)]) -> Vec<bool> {
    answers.iter().map(|&(allowed, _)| allowed).collect()
}

#[tokio::test]
async fn evenly_spread_traffic_is_decided_as_the_store_alone_decides_it() {
    let (exact, _) = two_instances(None);
    let (prechecked, store) = two_instances(Some(1.2));
    let exact = send(&exact, |n| n % 2).await;
    let answers = send(&prechecked, |n| n % 2).await;
    assert_eq!(allowed(&answers), allowed(&exact));
    assert_eq!(allowed(&answers).iter().filter(|&&a| a).count(), 10);
    // Each instance sends the store its share, ⌈1.2 × 10 / 2⌉ = 6, and refuses the rest
    // itself: 12 round trips instead of 30.
    assert_eq!(store.calls.load(Ordering::Relaxed), 12);
    let local = answers
        .iter()
        .filter(|&&(_, by)| by == DecidedBy::LocalPrecheck)
        .count();
    assert_eq!(local, 18);
    assert!(
        answers
            .iter()
            .all(|&(allowed, by)| !(allowed && by == DecidedBy::LocalPrecheck))
    );
    assert_eq!(prechecked[0].stats().local_precheck_refusals, 9);
}

#[tokio::test]
async fn traffic_on_one_instance_is_refused_past_its_share_though_the_limit_has_room() {
    let (prechecked, store) = two_instances(Some(1.2));
    let answers = send(&prechecked, |_| 0).await;
    // The store would admit 10; the instance stops at its share of 6.
    let admitted = allowed(&answers).iter().filter(|&&a| a).count();
    assert_eq!(admitted, 6);
    assert_eq!(store.calls.load(Ordering::Relaxed), 6);
    let refusal = answers[6];
    assert_eq!(refusal, (false, DecidedBy::LocalPrecheck));
    // The other instance still has the rest of the limit to give.
    let rest = send(&prechecked, |_| 1).await;
    assert_eq!(allowed(&rest).iter().filter(|&&a| a).count(), 4);
}

#[tokio::test]
async fn a_local_refusal_answers_in_the_rules_numbers() {
    let (prechecked, _) = two_instances(Some(1.2));
    let rule = rule();
    for _ in 0..6 {
        assert!(prechecked[0].check(&rule, "k", 1).await.unwrap().allowed);
    }
    let refused = prechecked[0].check(&rule, "k", 1).await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.limit, 10);
    assert_eq!(refused.remaining, 0);
    assert!(refused.retry_after.as_micros().is_some_and(|us| us > 0));
}
