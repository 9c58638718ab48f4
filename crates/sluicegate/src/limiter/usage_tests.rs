//! Reports, settles and refunds through the limiter: they always reach the store, a refund
//! or settle makes the negative cache forget refusals that may no longer hold, and a store
//! failure is an error whatever the failure policy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;
use crate::algorithm::Charge;
use crate::clock::ManualClock;
use crate::rule::{Algorithm, RuleSpec};
use crate::store::MemoryStoreConfig;

const S: u64 = 1_000_000;

/// An in-memory store that can be taken down, and counts the checks it is asked.
#[derive(Debug)]
struct CountingStore {
    inner: MemoryStore,
    down: AtomicBool,
    asked: AtomicU64,
}

impl Store for CountingStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable {
                server: "test".into(),
                message: "down".into(),
            });
        }
        self.inner.check_now(check)
    }
}

fn limiter(config: LimiterConfig) -> Limiter<CountingStore> {
    let clock = ManualClock::new(Duration::from_micros(1_700_000_040 * S));
    let store = CountingStore {
        inner: MemoryStore::new(MemoryStoreConfig::default(), Arc::new(clock.clone())),
        down: AtomicBool::new(false),
        asked: AtomicU64::new(0),
    };
    Limiter::with_clock(store, config, Arc::new(clock))
}

fn rule(name: &str, limit: u64) -> Rule {
    Rule::new(
        name,
        &RuleSpec::new(Algorithm::FixedWindow, limit, Duration::from_micros(60 * S)),
    )
    .unwrap()
}

async fn decide(
    limiter: &Limiter<CountingStore>,
    limits: &[Limit<'_>],
    cost: u64,
    charge: Charge,
    request_id: Option<&str>,
) -> Result<Outcome, StoreError> {
    limiter
        .decide(&Check {
            charge,
            request_id,
            ..Check::new(limits, cost)
        })
        .await
}

fn with_negative_cache() -> LimiterConfig {
    LimiterConfig {
        negative_cache_entries: 100,
        ..LimiterConfig::default()
    }
}

#[tokio::test]
async fn a_refund_makes_the_negative_cache_forget_the_refusals_it_freed() {
    let limiter = limiter(with_negative_cache());
    let (a, b) = (rule("a", 2), rule("b", 10));
    let one = [Limit { rule: &a, key: "k" }];
    let both = [Limit { rule: &a, key: "k" }, Limit { rule: &b, key: "k" }];
    let check = async |limits, charge| decide(&limiter, limits, 1, charge, None).await.unwrap();
    assert!(check(&one, Charge::Check).await.decision.allowed);
    assert!(check(&one, Charge::Check).await.decision.allowed);
    // The window is spent: both refusals are cached (the second predicted from the
    // admission that spent it).
    for limits in [&one[..], &both[..]] {
        assert!(!check(limits, Charge::Check).await.decision.allowed);
        assert_eq!(
            check(limits, Charge::Check).await.decided_by,
            DecidedBy::NegativeCache
        );
    }
    let reported = check(&one, Charge::Report).await;
    assert_eq!(
        reported.decided_by,
        DecidedBy::Store,
        "a report always reaches the store"
    );
    let refunded = decide(&limiter, &one, 3, Charge::Refund, None)
        .await
        .unwrap();
    assert_eq!(refunded.decided_by, DecidedBy::Store);
    assert_eq!(refunded.decision.remaining, 2, "the window is empty again");
    // What the store now admits, the cache no longer refuses: neither the limit alone nor
    // the check of both.
    for limits in [&both[..], &one[..]] {
        let admitted = check(limits, Charge::Check).await;
        assert_eq!(admitted.decided_by, DecidedBy::Store);
        assert!(admitted.decision.allowed);
    }
}

#[tokio::test]
async fn a_settle_that_refunds_makes_the_negative_cache_forget_too() {
    let limiter = limiter(with_negative_cache());
    let a = rule("a", 5);
    let one = [Limit { rule: &a, key: "k" }];
    let reserved = decide(&limiter, &one, 5, Charge::Reserve, Some("r"))
        .await
        .unwrap();
    assert!(reserved.decision.allowed);
    for decided_by in [DecidedBy::Store, DecidedBy::NegativeCache] {
        let refused = decide(&limiter, &one, 1, Charge::Check, None)
            .await
            .unwrap();
        assert_eq!(
            (refused.decision.allowed, refused.decided_by),
            (false, decided_by)
        );
    }
    let settled = decide(&limiter, &one, 1, Charge::Settle, Some("r"))
        .await
        .unwrap();
    assert_eq!(settled.decision.remaining, 4);
    let admitted = decide(&limiter, &one, 1, Charge::Check, None)
        .await
        .unwrap();
    assert_eq!(
        (admitted.decision.allowed, admitted.decided_by),
        (true, DecidedBy::Store)
    );
}

#[tokio::test]
async fn usage_modes_are_not_counted_or_refused_by_the_local_precheck() {
    let limiter = limiter(LimiterConfig {
        local_precheck: Some(1.0),
        instances: 2,
        ..LimiterConfig::default()
    });
    let a = rule("a", 10);
    let one = [Limit { rule: &a, key: "k" }];
    // The instance's share is 5: a report of 8 goes past it, and must reach the store.
    let reported = decide(&limiter, &one, 8, Charge::Report, None)
        .await
        .unwrap();
    assert_eq!(reported.decided_by, DecidedBy::Store);
    assert_eq!(reported.decision.remaining, 2);
    let refunded = decide(&limiter, &one, 8, Charge::Refund, None)
        .await
        .unwrap();
    assert_eq!(refunded.decided_by, DecidedBy::Store);
    // Nothing of them was counted against the share: five checks pass it.
    for _ in 0..5 {
        let admitted = decide(&limiter, &one, 1, Charge::Check, None)
            .await
            .unwrap();
        assert_eq!(admitted.decided_by, DecidedBy::Store);
    }
}

#[tokio::test]
async fn usage_modes_fail_when_the_store_fails_whatever_the_policy() {
    for policy in [
        FailurePolicy::Allow,
        FailurePolicy::Deny,
        FailurePolicy::Local,
        FailurePolicy::Error,
    ] {
        let limiter = limiter(LimiterConfig {
            on_store_error: policy,
            ..LimiterConfig::default()
        });
        let a = rule("a", 10);
        let one = [Limit { rule: &a, key: "k" }];
        limiter.store().down.store(true, Ordering::SeqCst);
        for (charge, id) in [
            (Charge::Report, None),
            (Charge::Settle, Some("s")),
            (Charge::Refund, None),
        ] {
            let failed = decide(&limiter, &one, 3, charge, id).await;
            assert!(
                matches!(failed, Err(StoreError::Unavailable { .. })),
                "{policy:?} {charge:?}: {failed:?}"
            );
        }
        // Checks still fall back as the policy says.
        let checked = decide(&limiter, &one, 1, Charge::Check, None).await;
        assert_eq!(
            checked.is_err(),
            policy == FailurePolicy::Error,
            "{policy:?}"
        );
        assert_eq!(limiter.store().asked.load(Ordering::SeqCst), 4);
    }
}

#[tokio::test]
async fn a_refund_under_an_override_forgets_the_refusals_of_the_rule_it_shares_state_with() {
    let limiter = limiter(with_negative_cache());
    let (a, overridden) = (rule("a", 2), rule("a", 10));
    assert!(a.same_identity(&overridden) && !a.same_rule(&overridden));
    let one = [Limit { rule: &a, key: "k" }];
    assert!(
        decide(&limiter, &one, 2, Charge::Check, None)
            .await
            .unwrap()
            .decision
            .allowed
    );
    for decided_by in [DecidedBy::Store, DecidedBy::NegativeCache] {
        let refused = decide(&limiter, &one, 1, Charge::Check, None)
            .await
            .unwrap();
        assert_eq!(
            (refused.decision.allowed, refused.decided_by),
            (false, decided_by)
        );
    }
    let other = [Limit {
        rule: &overridden,
        key: "k",
    }];
    decide(&limiter, &other, 2, Charge::Refund, None)
        .await
        .unwrap();
    let admitted = decide(&limiter, &one, 1, Charge::Check, None)
        .await
        .unwrap();
    assert_eq!(
        (admitted.decision.allowed, admitted.decided_by),
        (true, DecidedBy::Store)
    );
}

/// An in-memory store that, while `hold` is set, holds the answer of a check after
/// deciding it, until `release` is notified; `decided` is notified once it has decided.
#[derive(Debug, Default)]
struct HoldingStore {
    inner: MemoryStore,
    hold: AtomicBool,
    decided: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Store for HoldingStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        let outcome = self.inner.check_now(check);
        if self.hold.swap(false, Ordering::SeqCst) {
            self.decided.notify_one();
            self.release.notified().await;
        }
        outcome
    }
}

#[tokio::test]
async fn a_refusal_decided_before_a_refund_but_answered_after_it_is_not_cached() {
    let clock = ManualClock::new(Duration::from_micros(1_700_000_040 * S));
    let store = HoldingStore {
        inner: MemoryStore::new(MemoryStoreConfig::default(), Arc::new(clock.clone())),
        ..HoldingStore::default()
    };
    let limiter = Limiter::with_clock(store, with_negative_cache(), Arc::new(clock.clone()));
    let a = rule("a", 2);
    let one = [Limit { rule: &a, key: "k" }];
    let check = |cost, charge| {
        let limiter = &limiter;
        async move {
            limiter
                .decide(&Check {
                    charge,
                    ..Check::new(&one, cost)
                })
                .await
                .unwrap()
        }
    };
    assert!(check(2, Charge::Check).await.decision.allowed);
    clock.advance(Duration::from_millis(1));
    // A check of 1 is refused at the store; its answer is held there while a refund of
    // the whole window is sent, applied and answered.
    limiter.store().hold.store(true, Ordering::SeqCst);
    let (refused, refunded) = tokio::join!(check(1, Charge::Check), async {
        limiter.store().decided.notified().await;
        clock.advance(Duration::from_millis(1));
        let refunded = check(2, Charge::Refund).await;
        limiter.store().release.notify_one();
        refunded
    });
    assert!(!refused.decision.allowed);
    assert_eq!(refunded.decision.remaining, 2);
    clock.advance(Duration::from_millis(1));
    // The refusal came back stale: the cache must not answer with it.
    let admitted = check(1, Charge::Check).await;
    assert_eq!(
        (admitted.decision.allowed, admitted.decided_by),
        (true, DecidedBy::Store)
    );
    // Refusals sent after the refund was answered are cached again.
    check(1, Charge::Check).await;
    assert_eq!(
        check(1, Charge::Check).await.decided_by,
        DecidedBy::NegativeCache
    );
}
