//! Checks of one key that reach Redis in one call — a hot key: the checks that waited on
//! one in flight go on together — are decided by the script one after another on a state
//! it holds, written to Redis once per run of them (prelude.lua, "held"). Held to the
//! memory store deciding the same checks one by one: on a redis-server of the test's own
//! (its command counts are the test's alone), as a function and by EVALSHA, and on a
//! Redis Cluster.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;

use sluicegate::redis::Scripting;
use sluicegate::{
    Algorithm, Check, Decision, Limit, ManualClock, MemoryStore, MemoryStoreConfig, RedisStore,
    Rule, RuleSpec, Store, StoreError,
};
use sluicegate_test_support::{RedisCluster, RedisServer, cmd};

use crate::redis_trace::stores;

/// One check of the batch: which key, at what cost, at what time (µs).
#[derive(Clone, Copy, Debug)]
struct Planned {
    key: &'static str,
    cost: u64,
    at: u64,
}

/// Sixty checks 7 ms apart, mostly of `hot`, every seventh of `cold`, costs 1 to 3: with
/// a window of 100 ms, several windows start and the limit is reached in each.
fn plan() -> Vec<Planned> {
    (0..60u64)
        .map(|i| Planned {
            key: if i % 7 == 3 { "cold" } else { "hot" },
            cost: 1 + i % 3,
            at: 1_700_000_000_000_000 + i * 7_000,
        })
        .collect()
}

/// `planned` sent together, so that they share one script call, in order: on this
/// current-thread runtime every check is queued before the store's batcher runs.
async fn together(
    store: &RedisStore,
    rule: &Rule,
    planned: &[Planned],
) -> Vec<Result<Decision, StoreError>> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, p) in planned.iter().copied().enumerate() {
        let (store, rule) = (store.clone(), rule.clone());
        tasks.spawn(async move {
            let limits = [Limit {
                rule: &rule,
                key: p.key,
            }];
            let check = Check {
                at: Some(Duration::from_micros(p.at)),
                ..Check::new(&limits, p.cost)
            };
            (i, store.check(&check).await.map(|outcome| outcome.decision))
        });
    }
    let mut decisions: Vec<_> = planned.iter().map(|_| None).collect();
    while let Some(joined) = tasks.join_next().await {
        let (i, decision) = joined.unwrap();
        decisions[i] = Some(decision);
    }
    decisions.into_iter().map(Option::unwrap).collect()
}

/// The same checks one after another on the memory store.
async fn one_by_one(store: &MemoryStore, rule: &Rule, planned: &[Planned]) -> Vec<Decision> {
    let mut decisions = Vec::new();
    for p in planned {
        let limits = [Limit { rule, key: p.key }];
        let check = Check {
            at: Some(Duration::from_micros(p.at)),
            ..Check::new(&limits, p.cost)
        };
        decisions.push(store.check(&check).await.unwrap().decision);
    }
    decisions
}

/// `INFO commandstats` calls of `command` (lower case) on `redis`.
fn calls_of(redis: &RedisServer, command: &str) -> u64 {
    let info: String = redis.query(cmd("INFO").arg("commandstats")).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// How many runs of consecutive checks of one key `planned` holds.
fn runs(planned: &[Planned]) -> u64 {
    let switches = planned.windows(2).filter(|w| w[0].key != w[1].key).count();
    1 + switches as u64
}

#[tokio::test]
async fn a_hot_keys_checks_in_one_call_decide_as_one_after_another() {
    let redis = RedisServer::start(&[]);
    // A cluster of its own: the calls each node runs are counted.
    let cluster = RedisCluster::start(3, 0);
    let planned = plan();
    // Where the checks go, and how many calls they take: one on a server; on a cluster the
    // two keys' slots may be on two nodes, one call each.
    let deployments: [(&str, Scripting, Vec<&RedisServer>, u64); 3] = [
        ("server", Scripting::Auto, vec![&redis], 1),
        ("server-eval", Scripting::Eval, vec![&redis], 1),
        (
            "cluster",
            Scripting::Auto,
            cluster.nodes.iter().collect(),
            2,
        ),
    ];
    for (deployment, scripting, servers, most_calls) in &deployments {
        let url = if *deployment == "cluster" {
            cluster.url()
        } else {
            redis.url()
        };
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
        ] {
            let name = format!("{algorithm}-{deployment}");
            let store = stores::store_at(&url, &name, *scripting).await;
            let rule = Rule::new(
                &name,
                &RuleSpec::new(algorithm, 10, Duration::from_millis(100)),
            )
            .unwrap();
            let reference = MemoryStore::new(
                MemoryStoreConfig::default(),
                Arc::new(ManualClock::new(Duration::ZERO)),
            );

            for server in servers {
                server.query::<()>(cmd("CONFIG").arg("RESETSTAT")).unwrap();
            }
            let before = store.script_calls();
            let decided: Vec<Decision> = together(&store, &rule, &planned)
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
            let calls = store.script_calls().calls - before.calls;
            let writes: u64 = servers.iter().map(|s| calls_of(s, "hset")).sum();
            let expected = one_by_one(&reference, &rule, &planned).await;

            assert!(calls <= *most_calls, "{name}: {calls} calls");
            for (i, (got, want)) in decided.iter().zip(&expected).enumerate() {
                assert_eq!(got, want, "{name}: check {i} ({:?})", planned[i]);
            }
            let admitted = expected.iter().filter(|d| d.allowed).count() as u64;
            assert!(
                admitted > runs(&planned) && writes <= runs(&planned),
                "{name}: {writes} writes for {admitted} admissions in {} runs of one key",
                runs(&planned)
            );
            // What was written out is the state the checks left: the next checks of each
            // key, one call each, decide as the memory store's.
            let later = [
                Planned {
                    key: "hot",
                    cost: 1,
                    at: planned[59].at + 1,
                },
                Planned {
                    key: "cold",
                    cost: 1,
                    at: planned[59].at + 2,
                },
            ];
            for p in later {
                assert_eq!(
                    together(&store, &rule, &[p]).await[0].as_ref().unwrap(),
                    &one_by_one(&reference, &rule, &[p]).await[0],
                    "{name}: {p:?} after the batch"
                );
            }
        }
    }
}

/// A held state Redis refuses to take (out of memory, where a script's writes may fail one
/// by one: by EVALSHA) fails the whole call: no check of it is answered, so none is told it
/// was admitted with units Redis never took. Through functions Redis refuses the call before
/// it starts. Either way every check is a store error, and the key is as it was.
#[tokio::test]
async fn a_held_state_that_cannot_be_written_fails_the_whole_call() {
    let redis = RedisServer::start(&[]);
    let planned = plan();
    for scripting in [Scripting::Auto, Scripting::Eval] {
        let name = format!("oom-{scripting:?}");
        let store = stores::store_at(&redis.url(), &name, scripting).await;
        let rule = Rule::new(
            &name,
            &RuleSpec::new(Algorithm::FixedWindow, 10, Duration::from_millis(100)),
        )
        .unwrap();
        // The script is loaded, and the keys exist, before memory runs out.
        let first = together(&store, &rule, &planned[..4]).await;
        assert!(first.iter().all(Result::is_ok), "{name}: {first:?}");
        let state: Vec<(String, String)> = redis
            .query(cmd("HGETALL").arg(store.state_key(&rule, "hot")))
            .unwrap();
        redis
            .query::<()>(cmd("CONFIG").arg("SET").arg("maxmemory").arg("1"))
            .unwrap();
        let refused = together(&store, &rule, &planned[4..]).await;
        redis
            .query::<()>(cmd("CONFIG").arg("SET").arg("maxmemory").arg("0"))
            .unwrap();
        for (i, outcome) in refused.iter().enumerate() {
            assert!(
                outcome.is_err(),
                "{name}: check {} answered {outcome:?}",
                i + 4
            );
        }
        let after: Vec<(String, String)> = redis
            .query(cmd("HGETALL").arg(store.state_key(&rule, "hot")))
            .unwrap();
        assert_eq!(after, state, "{name}: the hot key changed");
    }
}
