//! The breaker and the negative cache through the limiter, on a manual clock: time moves
//! when a test says so, and no test sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::rule::{Algorithm, RuleSpec};
use crate::store::MemoryStoreConfig;

const S: u64 = 1_000_000;

/// An in-memory store that can be taken down: then every check fails as an unreachable
/// Redis would. It can also lose a key's state, as a Redis restarted without persistence
/// would, and say so in its lost-state generation.
#[derive(Debug)]
struct FlakyStore {
    inner: MemoryStore,
    down: AtomicBool,
    generation: AtomicU64,
}

impl FlakyStore {
    /// Forgets what `rule` counted for `key`, and tells it by a new generation.
    fn lose(&self, rule: &Rule, key: &str) {
        self.inner.forget(rule, key);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

impl Store for FlakyStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable {
                server: "test".into(),
                message: "down".into(),
            });
        }
        self.inner.check_now(check)
    }

    fn lost_state_generation(&self, _check: &Check<'_>) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    fn may_lose_state(&self) -> bool {
        true
    }
}

/// A limiter and its store on one manual clock, at the start of a minute.
fn limiter(config: LimiterConfig) -> (Limiter<FlakyStore>, ManualClock) {
    let clock = ManualClock::new(Duration::from_micros(1_700_000_040 * S));
    let store = FlakyStore {
        inner: MemoryStore::new(MemoryStoreConfig::default(), Arc::new(clock.clone())),
        down: AtomicBool::new(false),
        generation: AtomicU64::new(0),
    };
    (
        Limiter::with_clock(store, config, Arc::new(clock.clone())),
        clock,
    )
}

fn rule(algorithm: Algorithm, limit: u64, window: u64) -> Rule {
    Rule::new(
        algorithm.name(),
        &RuleSpec::new(algorithm, limit, Duration::from_micros(window)),
    )
    .unwrap()
}

async fn decide(limiter: &Limiter<FlakyStore>, rule: &Rule, key: &str) -> Outcome {
    let limits = [Limit { rule, key }];
    limiter.decide(&Check::new(&limits, 1)).await.unwrap()
}

#[tokio::test]
async fn the_breaker_probes_once_the_clock_passes_its_cool_down() {
    let (limiter, clock) = limiter(LimiterConfig {
        on_store_error: FailurePolicy::Deny,
        breaker: BreakerConfig {
            min_calls: 2,
            cool_down: Duration::from_secs(1),
            ..BreakerConfig::default()
        },
        ..LimiterConfig::default()
    });
    let rule = rule(Algorithm::SlidingLog, 10, 60 * S);
    limiter.store().down.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        let outcome = decide(&limiter, &rule, "k").await;
        assert_eq!(outcome.decided_by, DecidedBy::Fallback(FailurePolicy::Deny));
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    // Refused without calling the store, told to come back when the breaker probes.
    clock.advance(Duration::from_millis(400));
    let refused = decide(&limiter, &rule, "k").await;
    assert_eq!(refused.decision.retry_after, RetryAfter::micros(600_000));
    assert_eq!(limiter.stats().store_errors, 3);

    limiter.store().down.store(false, Ordering::SeqCst);
    assert_eq!(
        decide(&limiter, &rule, "k").await.decided_by,
        DecidedBy::Fallback(FailurePolicy::Deny),
        "the store is back, but the cool-down has not passed"
    );
    clock.advance(Duration::from_millis(600));
    assert_eq!(limiter.breaker_state(), BreakerState::HalfOpen);
    assert_eq!(
        decide(&limiter, &rule, "k").await.decided_by,
        DecidedBy::Store
    );
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
}

#[tokio::test]
async fn a_refusal_is_answered_locally_until_its_retry_after_passes() {
    let (limiter, clock) = limiter(LimiterConfig {
        negative_cache_entries: 10,
        ..LimiterConfig::default()
    });
    let rule = rule(Algorithm::SlidingLog, 2, 10 * S);
    for _ in 0..2 {
        assert!(decide(&limiter, &rule, "k").await.decision.allowed);
        clock.advance(Duration::from_micros(S));
    }
    let refused = decide(&limiter, &rule, "k").await;
    assert_eq!(refused.decided_by, DecidedBy::Store);
    assert_eq!(refused.decision.retry_after, RetryAfter::micros(8 * S));

    clock.advance(Duration::from_micros(3 * S));
    let cached = decide(&limiter, &rule, "k").await;
    assert_eq!(cached.decided_by, DecidedBy::NegativeCache);
    assert!(!cached.decision.allowed);
    // The waits shrink with the time since the store answered.
    assert_eq!(cached.decision.retry_after, RetryAfter::micros(5 * S));
    assert_eq!(
        cached.decision.reset_after,
        refused.decision.reset_after - 3 * S
    );
    // Another key, or another cost, is not the refusal the store gave.
    assert_eq!(
        decide(&limiter, &rule, "other").await.decided_by,
        DecidedBy::Store
    );
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let costly = limiter.decide(&Check::new(&limits, 2)).await.unwrap();
    assert_eq!(costly.decided_by, DecidedBy::Store);

    clock.advance(Duration::from_micros(5 * S));
    let again = decide(&limiter, &rule, "k").await;
    assert_eq!(again.decided_by, DecidedBy::Store);
    assert!(again.decision.allowed);
    assert_eq!(limiter.stats().negative_cache_hits, 1);
}

#[tokio::test]
async fn an_admission_that_empties_a_fixed_window_predicts_its_refusals() {
    let (limiter, clock) = limiter(LimiterConfig {
        negative_cache_entries: 10,
        ..LimiterConfig::default()
    });
    let rule = rule(Algorithm::FixedWindow, 2, 60 * S);
    clock.advance(Duration::from_micros(20 * S));
    assert!(decide(&limiter, &rule, "k").await.decision.allowed);
    let last = decide(&limiter, &rule, "k").await;
    assert_eq!((last.decision.allowed, last.decision.remaining), (true, 0));

    clock.advance(Duration::from_micros(10 * S));
    let predicted = decide(&limiter, &rule, "k").await;
    assert_eq!(predicted.decided_by, DecidedBy::NegativeCache);
    assert_eq!(predicted.decision.retry_after, RetryAfter::micros(30 * S));
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let peek = limiter
        .store()
        .inner
        .check_now(&Check::new(&limits, 0))
        .unwrap();
    assert_eq!(peek.decision, predicted.decision);

    clock.advance(Duration::from_micros(30 * S));
    let next_window = decide(&limiter, &rule, "k").await;
    assert_eq!(next_window.decided_by, DecidedBy::Store);
    assert!(next_window.decision.allowed);
}

#[tokio::test]
async fn a_full_cache_drops_what_has_expired_and_otherwise_caches_nothing_new() {
    let (limiter, clock) = limiter(LimiterConfig {
        negative_cache_entries: 1,
        ..LimiterConfig::default()
    });
    let short = rule(Algorithm::SlidingLog, 1, S);
    let long = rule(Algorithm::SlidingLog, 1, 60 * S);
    for rule in [&short, &long] {
        assert!(decide(&limiter, rule, "k").await.decision.allowed);
    }
    assert_eq!(
        decide(&limiter, &long, "k").await.decided_by,
        DecidedBy::Store
    );
    // The long refusal holds the one entry: the short one is not cached.
    assert_eq!(
        decide(&limiter, &short, "k").await.decided_by,
        DecidedBy::Store
    );
    assert_eq!(
        decide(&limiter, &short, "k").await.decided_by,
        DecidedBy::Store
    );
    assert_eq!(
        decide(&limiter, &long, "k").await.decided_by,
        DecidedBy::NegativeCache
    );
    // Once the long refusal has expired, it makes room.
    clock.advance(Duration::from_micros(60 * S));
    for rule in [&short, &long] {
        assert!(decide(&limiter, rule, "k").await.decision.allowed);
    }
    assert_eq!(
        decide(&limiter, &short, "k").await.decided_by,
        DecidedBy::Store
    );
    assert_eq!(
        decide(&limiter, &short, "k").await.decided_by,
        DecidedBy::NegativeCache
    );
}

#[tokio::test]
async fn a_check_of_several_limits_is_cached_whole_and_only_in_its_order() {
    let (limiter, clock) = limiter(LimiterConfig {
        negative_cache_entries: 10,
        ..LimiterConfig::default()
    });
    let wide = rule(Algorithm::SlidingLog, 100, 60 * S);
    let narrow = rule(Algorithm::SlidingCounter, 1, 60 * S);
    let limits = [
        Limit {
            rule: &wide,
            key: "k",
        },
        Limit {
            rule: &narrow,
            key: "k",
        },
    ];
    let check = Check::new(&limits, 1);
    assert!(limiter.decide(&check).await.unwrap().decision.allowed);
    let refused = limiter.decide(&check).await.unwrap();
    assert_eq!(refused.decided_by, DecidedBy::Store);
    clock.advance(Duration::from_micros(S));
    let cached = limiter.decide(&check).await.unwrap();
    assert_eq!(cached.decided_by, DecidedBy::NegativeCache);
    assert_eq!(cached.limits().len(), 2);
    assert!(cached.limits()[0].allowed && !cached.limits()[1].allowed);
    assert_eq!(cached.limits()[0].limit, refused.limits()[0].limit);
    let reversed = [limits[1], limits[0]];
    let other_order = limiter.decide(&Check::new(&reversed, 1)).await.unwrap();
    assert_eq!(other_order.decided_by, DecidedBy::Store);
}

/// Takes `n` units one by one and returns how many were allowed.
async fn admitted(limiter: &Limiter<FlakyStore>, rule: &Rule, key: &str, n: u32) -> u32 {
    let mut allowed = 0;
    for _ in 0..n {
        allowed += u32::from(decide(limiter, rule, key).await.decision.allowed);
    }
    allowed
}

#[tokio::test]
async fn the_local_fallback_starts_each_key_from_what_the_store_last_said() {
    for (instances, after_the_store) in [(1, 10), (2, 10), (5, 10), (10, 5)] {
        let (limiter, clock) = limiter(LimiterConfig {
            on_store_error: FailurePolicy::Local,
            instances,
            ..LimiterConfig::default()
        });
        let rule = rule(Algorithm::SlidingLog, 50, 60 * S);
        assert_eq!(admitted(&limiter, &rule, "k", 40).await, 40);
        // A key the store never saw starts empty, at L / instances.
        limiter.store().down.store(true, Ordering::SeqCst);
        clock.advance(Duration::from_micros(S));
        assert_eq!(
            admitted(&limiter, &rule, "k", 60).await,
            after_the_store,
            "{instances} instances"
        );
        assert_eq!(
            admitted(&limiter, &rule, "fresh", 60).await,
            50_u32.div_ceil(instances),
            "{instances} instances"
        );
    }
}

#[tokio::test]
async fn what_the_store_said_stops_counting_once_the_key_is_back_to_empty() {
    let (limiter, clock) = limiter(LimiterConfig {
        on_store_error: FailurePolicy::Local,
        ..LimiterConfig::default()
    });
    let rule = rule(Algorithm::FixedWindow, 50, 60 * S);
    assert_eq!(admitted(&limiter, &rule, "k", 50).await, 50);
    // The fixed window the store counted in is over: the whole limit again.
    clock.advance(Duration::from_micros(60 * S));
    limiter.store().down.store(true, Ordering::SeqCst);
    assert_eq!(admitted(&limiter, &rule, "k", 60).await, 50);
}

#[tokio::test]
async fn past_its_bound_a_new_key_starts_the_fallback_empty() {
    let (limiter, _clock) = limiter(LimiterConfig {
        on_store_error: FailurePolicy::Local,
        local_seed_entries: 1,
        ..LimiterConfig::default()
    });
    let rule = rule(Algorithm::SlidingLog, 50, 60 * S);
    assert_eq!(admitted(&limiter, &rule, "first", 40).await, 40);
    assert_eq!(admitted(&limiter, &rule, "second", 40).await, 40);
    limiter.store().down.store(true, Ordering::SeqCst);
    assert_eq!(admitted(&limiter, &rule, "first", 60).await, 10);
    assert_eq!(admitted(&limiter, &rule, "second", 60).await, 50);
}

#[tokio::test]
async fn the_local_fallback_keeps_scopes_apart() {
    let (limiter, _clock) = limiter(LimiterConfig {
        on_store_error: FailurePolicy::Local,
        ..LimiterConfig::default()
    });
    let per_user = rule(Algorithm::SlidingLog, 2, 60 * S);
    let (team_a, team_b) = (per_user.in_scope("team_a"), per_user.in_scope("team_b"));
    limiter.store().down.store(true, Ordering::SeqCst);
    let allowed = |outcome: Outcome| {
        assert_eq!(
            outcome.decided_by,
            DecidedBy::Fallback(FailurePolicy::Local)
        );
        outcome.decision.allowed
    };
    for _ in 0..2 {
        assert!(allowed(decide(&limiter, &team_a, "alice").await));
    }
    assert!(!allowed(decide(&limiter, &team_a, "alice").await));
    assert!(allowed(decide(&limiter, &team_b, "alice").await));
}

/// A reload that raises a limit keeps the key's state (the same identity) but is never
/// answered from a refusal cached under the old numbers, nor from the old local share.
#[tokio::test]
async fn new_numbers_are_not_answered_from_what_the_old_ones_cached() {
    let (limiter, _clock) = limiter(LimiterConfig {
        negative_cache_entries: 10,
        on_store_error: FailurePolicy::Local,
        ..LimiterConfig::default()
    });
    let before = rule(Algorithm::FixedWindow, 1, 60 * S);
    let after = rule(Algorithm::FixedWindow, 2, 60 * S);
    assert!(before.same_identity(&after));
    assert!(decide(&limiter, &before, "k").await.decision.allowed);
    let refused = decide(&limiter, &before, "k").await;
    assert_eq!(refused.decided_by, DecidedBy::NegativeCache);
    let raised = decide(&limiter, &after, "k").await;
    assert_eq!(raised.decided_by, DecidedBy::Store);
    assert!(raised.decision.allowed);
    assert_eq!(raised.decision.remaining, 0);
    // Down, the local share follows the new numbers too: 3 on another key, not 2.
    let more = rule(Algorithm::FixedWindow, 3, 60 * S);
    limiter.store().down.store(true, Ordering::SeqCst);
    assert_eq!(admitted(&limiter, &after, "other", 5).await, 2);
    assert_eq!(admitted(&limiter, &more, "third", 5).await, 3);
}

#[path = "write_back_tests.rs"]
mod write_back;
