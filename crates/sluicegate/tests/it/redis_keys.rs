//! Redis keys of the store, on a real redis-server and a real three-master Redis Cluster
//! started by the tests: where they land (every master, one slot per identity, several
//! slots given back when a later one refuses), how long they last, what a key of the wrong
//! type or an unreachable server answers, and what a log's entry costs.

#![cfg(feature = "redis")]

use std::time::Duration;

use sluicegate::internals::{
    DIGESTED_KEY_BYTES, KeyKind, hash_slot, key_pattern, redis_key, saturating_micros, stored_key,
};
use sluicegate::redis::Scripting;
use sluicegate::{
    Algorithm, Check, Limit, LogLayout, Outcome, RedisStore, RedisStoreConfig, Rule, RuleSpec,
    Store, StoreError,
};
use sluicegate_test_support::{self as support, cmd};

use crate::redis_trace::cases;
use crate::redis_trace::stores;

use cases::CASES;
use stores::store_at;

/// A check of `cost` under one rule for one key, on the store's clock.
async fn check_one(
    store: &RedisStore,
    rule: &Rule,
    key: &str,
    cost: u64,
) -> Result<Outcome, StoreError> {
    store.check(&Check::new(&[Limit { rule, key }], cost)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_spread_over_every_master() {
    let store = store_at(&support::cluster().url(), "spread", Scripting::Auto).await;
    // A sliding log keeps each key for its window after the admission: a fixed window's
    // keys would vanish at the next minute boundary, perhaps before they are counted.
    let rule = Rule::new(
        "spread",
        &RuleSpec::new(Algorithm::SlidingLog, 10, Duration::from_secs(3600)),
    )
    .unwrap();
    for i in 0..10_000 {
        let key = format!("user:{i}");
        assert!(
            check_one(&store, &rule, &key, 1)
                .await
                .unwrap()
                .decision
                .allowed
        );
    }
    for master in &support::cluster().nodes {
        let keys: u64 = master.query(&cmd("DBSIZE")).unwrap();
        assert!(keys > 2_000, "master {} holds {keys} keys", master.port);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_rule_check_on_one_identity_is_atomic_on_the_cluster() {
    let store = store_at(&support::cluster().url(), "atomic", Scripting::Auto).await;
    let per_second = Rule::new(
        "s",
        &RuleSpec::new(Algorithm::SlidingLog, 1, Duration::from_secs(1)),
    )
    .unwrap();
    let per_hour = Rule::new(
        "h",
        &RuleSpec::new(Algorithm::TokenBucket, 100, Duration::from_secs(3600)),
    )
    .unwrap();
    let limits = [
        Limit {
            rule: &per_second,
            key: "alice",
        },
        Limit {
            rule: &per_hour,
            key: "alice",
        },
    ];
    assert_eq!(
        hash_slot(&store.state_key(&per_second, "alice")),
        hash_slot(&store.state_key(&per_hour, "alice"))
    );
    assert!(
        store
            .check(&Check::new(&limits, 1))
            .await
            .unwrap()
            .decision
            .allowed
    );
    // The per-second rule is full: the check is refused and the hourly bucket untouched.
    for _ in 0..5 {
        let refused = store.check(&Check::new(&limits, 1)).await.unwrap();
        assert!(!refused.decision.allowed);
        assert_eq!(refused.limits()[1].remaining, 99);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_once_their_window_has_passed() {
    let store = store_at(&support::standalone().url(), "expiry", Scripting::Auto).await;
    let server = support::standalone();
    for (algorithm, layout) in CASES {
        let mut spec = RuleSpec::new(algorithm, 5, Duration::from_millis(200));
        spec.layout = layout;
        let rule = Rule::new("expiry", &spec).unwrap();
        let limits = [Limit {
            rule: &rule,
            key: "idle",
        }];
        let check = Check {
            request_id: Some("r1"),
            ..Check::new(&limits, 1)
        };
        let admitted = store.check(&check).await.unwrap().decision;
        assert!(admitted.allowed);
        let key = store.state_key(&rule, "idle");
        let ttl: u64 = server.query(cmd("PTTL").arg(&key)).unwrap();
        // No shorter than the state matters (reset_after, rounded up to a ms), no longer.
        let reset_ms = saturating_micros(admitted.reset_after()).div_ceil(1000);
        assert!(
            ttl <= reset_ms && ttl + 50 >= reset_ms,
            "{algorithm}: PTTL {ttl} for reset_after {reset_ms} ms"
        );
        // Redis expires on its own clock; this is the one wait on real time in these tests,
        // and it waits for Redis, not for sluicegate.
        tokio::time::sleep(std::time::Duration::from_millis(reset_ms + 60)).await;
        for kind in KeyKind::ALL {
            let key = redis_key(store.prefix(), kind, &rule, "idle");
            let exists: u64 = server.query(cmd("EXISTS").arg(&key)).unwrap();
            assert_eq!(exists, 0, "{algorithm}: {key} outlived its window");
        }
    }
}

/// For each algorithm (a lone fixed-window check is decided in one step, the others through
/// the short path's steps), a lone check of a key of the wrong type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_is_a_typed_error() {
    let store = store_at(&support::standalone().url(), "wrongtype", Scripting::Auto).await;
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
    ] {
        let rule = Rule::new(
            &format!("w-{algorithm}"),
            &RuleSpec::new(algorithm, 5, Duration::from_secs(1)),
        )
        .unwrap();
        let key = store.state_key(&rule, "mallory");
        support::standalone()
            .query::<()>(cmd("SET").arg(&key).arg("oops"))
            .unwrap();
        match check_one(&store, &rule, "mallory", 1).await {
            Err(StoreError::WrongType {
                key: culprit,
                server,
            }) => {
                assert_eq!(culprit, key, "{algorithm}");
                assert!(server.contains("127.0.0.1"), "{algorithm}");
            }
            other => panic!("{algorithm}: expected a wrong-type error, got {other:?}"),
        }
        // The store goes on serving other keys.
        assert!(
            check_one(&store, &rule, "bob", 1)
                .await
                .unwrap()
                .decision
                .allowed,
            "{algorithm}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_an_error_naming_it() {
    let port = support::free_port();
    let config = RedisStoreConfig::new(&format!("redis://127.0.0.1:{port}"));
    let err = RedisStore::connect(config).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

/// MEMORY USAGE of the state key of `rule` for `key`, in bytes.
fn memory_usage(store: &RedisStore, rule: &Rule, key: &str) -> u64 {
    let state_key = store.state_key(rule, key);
    support::standalone()
        .query(cmd("MEMORY").arg("USAGE").arg(&state_key))
        .unwrap()
}

/// Admits one unit of `rule` for `key` at each of `times`.
async fn admit_at(store: &RedisStore, rule: &Rule, key: &str, times: impl Iterator<Item = u64>) {
    let limits = [Limit { rule, key }];
    for at in times {
        let check = Check {
            at: Some(Duration::from_micros(at)),
            ..Check::new(&limits, 1)
        };
        let outcome = store.check(&check).await.unwrap();
        assert!(outcome.decision.allowed, "at {at}: {outcome:?}");
    }
}

/// A sliding log of L = 1000 over W, in `layout`.
fn log_rule(layout: LogLayout, window: u64) -> Rule {
    let spec = RuleSpec {
        layout: Some(layout),
        ..RuleSpec::new(Algorithm::SlidingLog, 1000, Duration::from_micros(window))
    };
    Rule::new(&format!("memory-{window}"), &spec).unwrap()
}

/// A compact log's string grows with what it holds: at every occupancy from 1 entry to L it
/// costs no more than the zset, and from a tenth of L on at most 10 bytes an entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_log_costs_what_it_holds() {
    let store = store_at(
        &support::standalone().url(),
        "memory-usage",
        Scripting::Auto,
    )
    .await;
    const T0: u64 = 1_700_000_000_000_000;
    for window in [1_000_000, 3_600_000_000] {
        let (zset, compact) = (
            log_rule(LogLayout::Zset, window),
            log_rule(LogLayout::Compact, window),
        );
        for n in [1, 2, 5, 10, 50, 100, 128, 129, 200, 500, 999, 1000] {
            let key = format!("fresh:{n}");
            let times = || (0..n).map(|i| T0 + i * 10);
            admit_at(&store, &zset, &key, times()).await;
            admit_at(&store, &compact, &key, times()).await;
            let (zset_bytes, compact_bytes) = (
                memory_usage(&store, &zset, &key),
                memory_usage(&store, &compact, &key),
            );
            eprintln!("W={window} n={n}: zset {zset_bytes} B, compact {compact_bytes} B");
            assert!(
                compact_bytes <= zset_bytes,
                "W={window} n={n}: compact {compact_bytes} B, zset {zset_bytes} B"
            );
            if n >= 100 {
                assert!(
                    compact_bytes <= 10 * n,
                    "W={window} n={n}: compact {compact_bytes} B"
                );
            }
        }
    }
}

/// A compact log that held L and whose traffic falls to a steady tenth of L (one admission
/// every W/100: entries expire as new ones arrive) shrinks to what is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_log_shrinks_to_what_is_live() {
    let store = store_at(
        &support::standalone().url(),
        "memory-steady",
        Scripting::Auto,
    )
    .await;
    const T0: u64 = 1_700_000_000_000_000;
    for window in [1_000_000, 3_600_000_000] {
        let rule = log_rule(LogLayout::Compact, window);
        admit_at(&store, &rule, "steady", (0..1000).map(|i| T0 + i)).await;
        let full = memory_usage(&store, &rule, "steady");
        // From when those have expired, three windows of a tenth of L: the last window's
        // 100 admissions are what is live.
        let step = window / 100;
        let start = T0 + 1000 + window;
        admit_at(&store, &rule, "steady", (0..300).map(|i| start + i * step)).await;
        let steady = memory_usage(&store, &rule, "steady");
        eprintln!("W={window}: full {full} B, steady at 100 live {steady} B");
        assert!(steady <= 10 * 100, "W={window}: {steady} B for 100 live");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_across_slots_gives_back_when_a_later_slot_refuses() {
    let store = store_at(&support::cluster().url(), "give-back", Scripting::Auto).await;
    let per_user = Rule::new(
        "user",
        &RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_secs(3600)),
    )
    .unwrap();
    let global = Rule::new(
        "global",
        &RuleSpec::new(Algorithm::FixedWindow, 1, Duration::from_secs(3600)),
    )
    .unwrap();
    let (user, everyone) = ("alice", "everyone");
    assert_ne!(
        sluicegate::internals::identity_slot(user),
        sluicegate::internals::identity_slot(everyone)
    );
    let limits = [
        Limit {
            rule: &per_user,
            key: user,
        },
        Limit {
            rule: &global,
            key: everyone,
        },
    ];
    let at = |t| Check {
        at: Some(Duration::from_micros(t)),
        ..Check::new(&limits, 1)
    };
    let t0 = 1_700_000_000_000_000;
    assert!(store.check(&at(t0)).await.unwrap().decision.allowed);
    for i in 1..4 {
        let refused = store.check(&at(t0 + i)).await.unwrap();
        assert!(!refused.decision.allowed);
        // The user's slot took a unit first, then gave it back.
        assert!(refused.limits()[0].allowed);
        assert_eq!(refused.limits()[0].remaining, 4);
        assert!(!refused.limits()[1].allowed);
    }
    let alone = [Limit {
        rule: &per_user,
        key: user,
    }];
    let alone_at = |t, cost| Check {
        at: Some(Duration::from_micros(t)),
        ..Check::new(&alone, cost)
    };
    assert_eq!(
        store
            .check(&alone_at(t0 + 10, 0))
            .await
            .unwrap()
            .decision
            .remaining,
        3
    );
    // Units of one instant, some given back between others: none may be lost or doubled.
    let t5 = t0 + 20;
    assert!(
        store
            .check(&alone_at(t5, 1))
            .await
            .unwrap()
            .decision
            .allowed
    );
    assert!(!store.check(&at(t5)).await.unwrap().decision.allowed);
    assert!(
        store
            .check(&alone_at(t5, 1))
            .await
            .unwrap()
            .decision
            .allowed
    );
    assert_eq!(
        store
            .check(&alone_at(t5, 0))
            .await
            .unwrap()
            .decision
            .remaining,
        1
    );
    let key = store.state_key(&per_user, user);
    let master = support::cluster().nodes.iter().find(|master| {
        master
            .query::<u64>(cmd("EXISTS").arg(&key))
            .is_ok_and(|n| n == 1)
    });
    let master = master.expect("the key lives on one master");
    assert_eq!(master.query::<u64>(cmd("ZCARD").arg(&key)).unwrap(), 3);
}

/// A 60 KiB key is a key of fixed size in Redis; two long keys that differ in their last
/// byte, and a short key written as the digest of one of them, each keep a limit of their
/// own, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_keys_are_stored_as_digests_and_stay_apart() {
    let store = store_at(&support::standalone().url(), "long-keys", Scripting::Auto).await;
    let server = support::standalone();
    let rule = Rule::new(
        "long",
        &RuleSpec::new(Algorithm::FixedWindow, 3, Duration::from_secs(86_400)),
    )
    .unwrap();
    let long_a = format!("{}a", "v".repeat(60 * 1024));
    let long_b = format!("{}b", "v".repeat(60 * 1024));
    let crafted = stored_key(&long_a).into_owned();
    for key in [&long_a, &long_b, &crafted] {
        for _ in 0..3 {
            assert!(
                check_one(&store, &rule, key, 1)
                    .await
                    .unwrap()
                    .decision
                    .allowed
            );
        }
        assert!(
            !check_one(&store, &rule, key, 1)
                .await
                .unwrap()
                .decision
                .allowed
        );
    }
    let names: Vec<String> = server
        .query(cmd("KEYS").arg(key_pattern(store.prefix(), KeyKind::State)))
        .unwrap();
    assert_eq!(names.len(), 3, "{names:?}");
    let bound = store.prefix().len() + 32 + rule.identity().len() + DIGESTED_KEY_BYTES;
    for name in &names {
        assert!(name.len() <= bound, "{} bytes: {name}", name.len());
    }
    assert!(names.contains(&redis_key(store.prefix(), KeyKind::State, &rule, &long_a)));
}
