//! Coalescing checks in flight, on a manual clock and a store that takes a while to answer:
//! the same decisions as the checks one after another, for a fraction of the round trips.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::rule::{Algorithm, RuleSpec};
use crate::store::MemoryStoreConfig;

const MS: u64 = 1_000;

/// An in-memory store whose answers take a few turns of the runtime, as a round trip
/// would: checks sent together are all in flight before the first is answered. It counts
/// the checks it decides.
#[derive(Debug)]
struct DistantStore {
    inner: MemoryStore,
    calls: AtomicU64,
}

impl Store for DistantStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.check_now(check)
    }
}

/// An abusive client: `rounds` times, 8 checks of one key sent at once, then `step` µs
/// later the next 8. Returns each check's decision, in the order sent, and the store's calls.
async fn abuse(
    config: LimiterConfig,
    algorithm: Algorithm,
    rounds: usize,
    step: u64,
) -> (Vec<bool>, u64) {
    let clock = ManualClock::new(Duration::from_micros(1_700_000_040 * 1_000_000));
    let store = DistantStore {
        inner: MemoryStore::new(MemoryStoreConfig::default(), Arc::new(clock.clone())),
        calls: AtomicU64::new(0),
    };
    let limiter = Arc::new(Limiter::with_clock(store, config, Arc::new(clock.clone())));
    let rule = Rule::new(
        algorithm.name(),
        &RuleSpec::new(algorithm, 100, Duration::from_micros(1_000 * MS)),
    )
    .unwrap();
    let mut decisions = Vec::new();
    for _ in 0..rounds {
        let sent: Vec<_> = (0..8)
            .map(|_| {
                let (limiter, rule) = (Arc::clone(&limiter), rule.clone());
                tokio::spawn(async move { limiter.check(&rule, "abuser", 1).await.unwrap() })
            })
            .collect();
        for check in sent {
            decisions.push(check.await.unwrap().allowed);
        }
        clock.advance(Duration::from_micros(step));
    }
    let calls = limiter.store().calls.load(Ordering::Relaxed);
    (decisions, calls)
}

/// At ten times its limit (8 checks every 8 ms against 100 a second), every algorithm
/// decides as the bare store does, while no more than a tenth of the refusals reach it.
#[tokio::test]
async fn checks_in_flight_for_one_key_wait_for_the_first_and_decide_the_same() {
    for algorithm in Algorithm::ALL {
        let (exact, exact_calls) = abuse(LimiterConfig::default(), algorithm, 500, 8 * MS).await;
        let cached = LimiterConfig {
            negative_cache_entries: 100,
            ..LimiterConfig::default()
        };
        let (coalesced, calls) = abuse(cached, algorithm, 500, 8 * MS).await;
        assert_eq!(coalesced, exact, "{algorithm}: the decisions differ");
        let admitted = exact.iter().filter(|&&allowed| allowed).count() as u64;
        let refused = exact_calls - admitted;
        let refused_at_the_store = calls - admitted;
        assert!(
            admitted >= 100 && refused >= 5 * admitted,
            "{algorithm}: {admitted} admitted of {exact_calls}"
        );
        assert!(
            refused_at_the_store * 10 <= refused,
            "{algorithm}: {refused_at_the_store} of {refused} refusals reached the store"
        );
    }
}
