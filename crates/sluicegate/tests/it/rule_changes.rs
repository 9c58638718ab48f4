//! A rule's identity is its place (docs/SPEC.md, "Changing a rule's numbers"): new numbers
//! under the same name keep each key's usage, and the same name in two scopes never shares
//! a counter, on the in-memory store, a real redis-server and a real Redis Cluster.

use std::sync::Arc;
use std::time::Duration;

use sluicegate::{
    Algorithm, Check, Decision, Limit, LogLayout, ManualClock, MemoryStore, MemoryStoreConfig,
    Rule, RuleSpec, Store,
};

/// Some instant well past the epoch; every check carries its own time, so all stores agree.
const T0: u64 = 1_700_000_000_000_000;
const S: u64 = 1_000_000;

async fn decide<S: Store>(store: &S, rule: &Rule, key: &str, cost: u64, at: u64) -> Decision {
    let limits = [Limit { rule, key }];
    let check = Check {
        at: Some(Duration::from_micros(at)),
        ..Check::new(&limits, cost)
    };
    store.check(&check).await.unwrap().decision
}

/// `spec` with its limit (and burst or queue, so that the capacity grows too) set to `limit`.
fn with_limit(spec: &RuleSpec, limit: u64) -> RuleSpec {
    RuleSpec {
        limit,
        burst: spec.burst.map(|_| limit),
        queue: spec.queue.map(|_| limit - 1),
        ..spec.clone()
    }
}

/// Every algorithm (and both log layouts) whose state a new limit keeps.
fn kept_specs() -> Vec<RuleSpec> {
    let w = 10 * S;
    let compact = RuleSpec {
        layout: Some(LogLayout::Compact),
        ..RuleSpec::new(Algorithm::SlidingLog, 2, Duration::from_micros(w))
    };
    Algorithm::ALL
        .into_iter()
        .map(|algorithm| {
            let spec = RuleSpec::new(algorithm, 2, Duration::from_micros(w));
            match algorithm {
                Algorithm::TokenBucket => RuleSpec {
                    burst: Some(2),
                    ..spec
                },
                Algorithm::LeakyBucket => RuleSpec {
                    queue: Some(1),
                    ..spec
                },
                _ => spec,
            }
        })
        .chain([compact])
        .collect()
}

/// Two units taken under a limit of 2, then the limit raised to 3: one more fits and the
/// key is then full — under either limit alone it would have had room for 2 or 3.
async fn a_raised_limit_keeps_usage<S: Store>(store: &S, test: &str) {
    for (i, spec) in kept_specs().iter().enumerate() {
        let name = format!("{test}-{i}");
        let before = Rule::new(&name, spec).unwrap();
        let after = Rule::new(&name, &with_limit(spec, 3)).unwrap();
        let algorithm = spec.algorithm;
        assert!(
            decide(store, &before, "k", 2, T0).await.allowed,
            "{algorithm}"
        );
        let more = decide(store, &after, "k", 1, T0).await;
        assert!(more.allowed, "{algorithm}: {more:?}");
        assert_eq!(more.remaining, 0, "{algorithm}: {more:?}");
        let full = decide(store, &after, "k", 1, T0).await;
        assert!(!full.allowed, "{algorithm}: {full:?}");
        // A lowered limit counts the units taken against it: 3 taken, 1 allowed.
        let lowered = Rule::new(&name, &with_limit(spec, 1)).unwrap();
        let peek = decide(store, &lowered, "k", 0, T0).await;
        assert!(!peek.allowed, "{algorithm}: {peek:?}");
    }
    // What the state cannot be read without restarts it: a window.
    let name = format!("{test}-window");
    let fixed = RuleSpec::new(Algorithm::FixedWindow, 2, Duration::from_micros(10 * S));
    let before = Rule::new(&name, &fixed).unwrap();
    assert!(decide(store, &before, "k", 2, T0).await.allowed);
    let after = Rule::new(
        &name,
        &RuleSpec {
            window: Duration::from_micros(20 * S),
            ..fixed
        },
    )
    .unwrap();
    assert_eq!(decide(store, &after, "k", 1, T0).await.remaining, 1);
}

/// The same name in two scopes (the service's domains), named or not: apart.
async fn scopes_count_apart<S: Store>(store: &S, test: &str) {
    for spec in kept_specs() {
        for name in [format!("{test}-per_user"), String::new()] {
            let rule = Rule::new(&name, &spec).unwrap();
            let (team_a, team_b) = (rule.in_scope("team_a"), rule.in_scope("team_b"));
            assert!(decide(store, &team_a, "alice", 2, T0).await.allowed);
            assert!(!decide(store, &team_a, "alice", 1, T0).await.allowed);
            let other = decide(store, &team_b, "alice", 1, T0).await;
            assert_eq!(other.remaining, 1, "{}: {other:?}", spec.algorithm);
        }
    }
}

fn memory() -> MemoryStore {
    MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::ZERO)),
    )
}

#[tokio::test]
async fn a_raised_limit_keeps_usage_in_memory() {
    a_raised_limit_keeps_usage(&memory(), "memory").await;
}

#[tokio::test]
async fn scopes_count_apart_in_memory() {
    scopes_count_apart(&memory(), "memory").await;
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use sluicegate::{RedisStore, RedisStoreConfig};
    use sluicegate_test_support as support;

    async fn store_at(url: &str, test: &str) -> RedisStore {
        let mut config = RedisStoreConfig::new(url);
        config.prefix = format!("test:{test}:{}:", std::process::id());
        config.timeout = std::time::Duration::from_secs(2);
        RedisStore::connect(config)
            .await
            .unwrap_or_else(|e| panic!("connect to the test server at {url}: {e}"))
    }

    #[tokio::test]
    async fn a_raised_limit_keeps_usage_on_redis() {
        let store = store_at(&support::standalone().url(), "raised").await;
        a_raised_limit_keeps_usage(&store, "redis").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_raised_limit_keeps_usage_on_the_cluster() {
        let store = store_at(&support::cluster().url(), "raised").await;
        a_raised_limit_keeps_usage(&store, "cluster").await;
    }

    #[tokio::test]
    async fn scopes_count_apart_on_redis() {
        let store = store_at(&support::standalone().url(), "scopes").await;
        scopes_count_apart(&store, "redis").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scopes_count_apart_on_the_cluster() {
        let store = store_at(&support::cluster().url(), "scopes").await;
        scopes_count_apart(&store, "cluster").await;
    }
}
