//! The Redis store against the Rust reference (the in-memory store), on a real
//! redis-server and a real three-master Redis Cluster started by the tests.

#![cfg(feature = "redis")]

use std::sync::Arc;

use sluicegate::store::redis::{KeyKind, Scripting, hash_slot, redis_key};
use sluicegate::{
    Algorithm, Check, Limit, LogLayout, ManualClock, MemoryStore, MemoryStoreConfig, Outcome,
    RedisStore, RedisStoreConfig, Rule, RuleSpec, Store, StoreError,
};
use sluicegate_test_support::{self as support, cmd};

mod redis_trace;

use redis_trace::{CASES, Trace, check_of, limits_of};

/// Runs `lines` random checks through the memory store and `store`, comparing every
/// decision. Times are the caller's, so both stores see the same instants.
async fn differential(
    store: &RedisStore,
    algorithm: Algorithm,
    layout: Option<LogLayout>,
    seed: u64,
    lines: usize,
) {
    let mut trace = Trace::new(algorithm, layout, seed);
    let reference = MemoryStore::new(MemoryStoreConfig::default(), Arc::new(ManualClock::new(0)));
    for n in 0..lines {
        let line = trace.next();
        let limits = limits_of(&trace.rules, &line);
        let check = check_of(&limits, &line);
        let want = reference.check_now(&check).unwrap();
        let got = store.check(&check).await.unwrap();
        assert_eq!(
            got, want,
            "{algorithm} {layout:?} seed {seed} line {n}: t={} limits={:?} cost={} costs={:?} id={:?} {:?}",
            line.at, line.limits, line.cost, line.costs, line.request_id, line.charge
        );
    }
}

fn prefix(test: &str) -> String {
    format!("test:{test}:{}:", std::process::id())
}

/// A store on `url` with keys of its own (`test` names them) and a patient timeout.
async fn store_at(url: &str, test: &str) -> RedisStore {
    let mut config = RedisStoreConfig::new(url);
    config.prefix = prefix(test);
    config.timeout = std::time::Duration::from_secs(2);
    RedisStore::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect to the test server at {url}: {e}"))
}

/// A check of `cost` under one rule for one key, on the store's clock.
async fn check_one(
    store: &RedisStore,
    rule: &Rule,
    key: &str,
    cost: u64,
) -> Result<Outcome, StoreError> {
    store.check(&Check::new(&[Limit { rule, key }], cost)).await
}

async fn standalone_store(test: &str) -> RedisStore {
    store_at(&support::standalone().url(), test).await
}

/// A store on the standalone server that sends its checks with EVALSHA.
async fn evalsha_store(test: &str) -> RedisStore {
    let mut config = RedisStoreConfig::new(&support::standalone().url());
    config.prefix = prefix(test);
    config.timeout = std::time::Duration::from_secs(2);
    config.scripting = Scripting::Eval;
    let store = RedisStore::connect(config).await.expect("connect");
    assert!(!store.uses_functions());
    store
}

async fn cluster_store(test: &str) -> RedisStore {
    store_at(&support::cluster().url(), test).await
}

/// Every algorithm and layout, `seeds` traces each of `lines` lines.
async fn agrees_with_the_reference(store: &RedisStore, first_seed: u64, seeds: u64, lines: usize) {
    for (i, (algorithm, layout)) in CASES.into_iter().enumerate() {
        for seed in 1..=seeds {
            differential(
                store,
                algorithm,
                layout,
                seed * first_seed + i as u64,
                lines,
            )
            .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_agrees_with_the_reference() {
    let store = standalone_store("differential").await;
    assert!(store.uses_functions());
    agrees_with_the_reference(&store, 7919, 4, 600).await;
}

/// The same traces through EVALSHA, the path of servers without functions: the same
/// decisions, bit for bit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_through_evalsha_agrees_with_the_reference() {
    let store = evalsha_store("differential-evalsha").await;
    agrees_with_the_reference(&store, 7919, 4, 600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_agrees_with_the_reference() {
    let store = cluster_store("differential").await;
    assert!(store.uses_functions());
    agrees_with_the_reference(&store, 104_729, 2, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_spread_over_every_master() {
    let store = cluster_store("spread").await;
    // A sliding log keeps each key for its window after the admission: a fixed window's
    // keys would vanish at the next minute boundary, perhaps before they are counted.
    let rule = Rule::new(
        "spread",
        &RuleSpec::new(Algorithm::SlidingLog, 10, 3_600_000_000),
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
    let store = cluster_store("atomic").await;
    let per_second = Rule::new("s", &RuleSpec::new(Algorithm::SlidingLog, 1, 1_000_000)).unwrap();
    let per_hour = Rule::new(
        "h",
        &RuleSpec::new(Algorithm::TokenBucket, 100, 3_600_000_000),
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
    let store = standalone_store("expiry").await;
    let server = support::standalone();
    for (algorithm, layout) in CASES {
        let mut spec = RuleSpec::new(algorithm, 5, 200_000);
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
        let reset_ms = admitted.reset_after.div_ceil(1000);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_is_a_typed_error() {
    let store = standalone_store("wrongtype").await;
    let rule = Rule::new("w", &RuleSpec::new(Algorithm::TokenBucket, 5, 1_000_000)).unwrap();
    let key = store.state_key(&rule, "mallory");
    support::standalone()
        .query::<()>(cmd("SET").arg(&key).arg("oops"))
        .unwrap();
    match check_one(&store, &rule, "mallory", 1).await {
        Err(StoreError::WrongType {
            key: culprit,
            server,
        }) => {
            assert_eq!(culprit, key);
            assert!(server.contains("127.0.0.1"));
        }
        other => panic!("expected a wrong-type error, got {other:?}"),
    }
    // The store goes on serving other keys.
    assert!(
        check_one(&store, &rule, "bob", 1)
            .await
            .unwrap()
            .decision
            .allowed
    );
}

/// Checks in flight together on one server share script calls (the store batches them), and
/// each is still decided as if alone: lanes of every algorithm and layout, each with rules
/// and keys of its own, send one check each per round, all at once, and every decision is
/// held to the reference. (A current-thread runtime: every lane's check is queued before
/// the batching task runs, so a round is one call.)
#[tokio::test]
async fn checks_in_flight_together_share_a_call_and_agree_with_the_reference() {
    const ROUNDS: usize = 60;
    const LANES: usize = 42;
    let lanes = || -> Vec<Trace> {
        (0..LANES)
            .map(|lane| {
                let (algorithm, layout) = CASES[lane % CASES.len()];
                Trace::new(algorithm, layout, 9_000 + lane as u64)
            })
            .collect()
    };
    // As a function, and through EVALSHA.
    for store in [
        standalone_store("batched").await,
        evalsha_store("batched-evalsha").await,
    ] {
        let lane_count = LANES;
        let before = store.script_calls();
        in_shared_calls(&store, lanes(), ROUNDS).await;
        let after = store.script_calls();
        let (calls, checks) = (after.calls - before.calls, after.checks - before.checks);
        assert_eq!(checks, (ROUNDS * lane_count) as u64);
        assert!(
            calls * 10 <= checks,
            "{checks} checks in {calls} script calls: they were not batched"
        );
    }
}

/// Sends each lane's next check, all at once, `rounds` times, and holds every decision to
/// the reference: a memory store per lane, since each lane keeps its own time.
async fn in_shared_calls(store: &RedisStore, mut lanes: Vec<Trace>, rounds: usize) {
    let references: Vec<MemoryStore> = lanes
        .iter()
        .map(|_| MemoryStore::new(MemoryStoreConfig::default(), Arc::new(ManualClock::new(0))))
        .collect();
    for round in 0..rounds {
        let mut sent = Vec::new();
        for lane in &mut lanes {
            let line = Arc::new(lane.next());
            let (store, rules, line_sent) = (store.clone(), lane.rules.clone(), Arc::clone(&line));
            let decided = tokio::spawn(async move {
                let limits = limits_of(&rules, &line_sent);
                store.check(&check_of(&limits, &line_sent)).await
            });
            sent.push((line, decided));
        }
        for ((lane, reference), (line, decided)) in lanes.iter().zip(&references).zip(sent) {
            let got = decided.await.unwrap().unwrap();
            let limits = limits_of(&lane.rules, &line);
            let want = reference.check_now(&check_of(&limits, &line)).unwrap();
            assert_eq!(
                got,
                want,
                "round {round}, {} {:?} rules: t={} limits={:?} cost={} id={:?}",
                lane.rules[0].algorithm(),
                lane.rules[0].layout(),
                line.at,
                line.limits,
                line.cost,
                line.request_id
            );
        }
    }
}

/// A check whose key holds the wrong type fails alone: the checks that share its script
/// call are decided and recorded as usual.
#[tokio::test]
async fn a_wrong_type_key_fails_only_its_own_check_in_a_shared_call() {
    let store = standalone_store("batched-wrongtype").await;
    let rule = Rule::new("w", &RuleSpec::new(Algorithm::SlidingLog, 5, 60_000_000)).unwrap();
    let culprit = store.state_key(&rule, "mallory");
    support::standalone()
        .query::<()>(cmd("SET").arg(&culprit).arg("oops"))
        .unwrap();
    let keys: Vec<String> = (0..20)
        .map(|i| {
            if i == 7 {
                "mallory".into()
            } else {
                format!("user-{i}")
            }
        })
        .collect();
    let before = store.script_calls();
    let decided: Vec<_> = keys
        .iter()
        .map(|key| {
            let (store, rule, key) = (store.clone(), rule.clone(), key.clone());
            tokio::spawn(async move { check_one(&store, &rule, &key, 2).await })
        })
        .collect();
    for (key, decided) in keys.iter().zip(decided) {
        match (key.as_str(), decided.await.unwrap()) {
            ("mallory", Err(StoreError::WrongType { key, .. })) => assert_eq!(key, culprit),
            ("mallory", other) => panic!("expected a wrong-type error, got {other:?}"),
            (_, Ok(outcome)) => {
                assert!(outcome.decision.allowed, "{key}");
                assert_eq!(outcome.decision.remaining, 3, "{key}");
            }
            (_, Err(e)) => panic!("{key} failed with its neighbour: {e}"),
        }
    }
    let after = store.script_calls();
    assert!(
        after.calls - before.calls < after.checks - before.checks,
        "the checks did not share a call"
    );
    // What the others recorded stays recorded: 2 of 5 taken, and a peek answers as a
    // check of 1 would.
    let peek = check_one(&store, &rule, "user-0", 0).await.unwrap();
    assert_eq!(peek.decision.remaining, 2);
}

/// A check still queued when its caller's timeout passes is never sent: its caller was
/// told the store failed, so it must not take units. Redis is held up with CLIENT PAUSE (on
/// a server of this test's own) while calls are in flight; the checks queued behind them
/// time out, and once Redis answers again none of them reaches it.
#[tokio::test]
async fn a_check_whose_caller_gave_up_is_never_sent() {
    let server = support::RedisServer::start(&[]);
    let mut config = RedisStoreConfig::new(&server.url());
    config.prefix = prefix("gave-up");
    config.timeout = std::time::Duration::from_millis(100);
    let store = RedisStore::connect(config).await.unwrap();
    let rule = Rule::new("g", &RuleSpec::new(Algorithm::SlidingLog, 100, 60_000_000)).unwrap();
    let check =
        |store: RedisStore, rule: Rule| async move { check_one(&store, &rule, "k", 1).await };
    server
        .query::<()>(cmd("CLIENT").arg(&["PAUSE", "700", "ALL"]))
        .unwrap();
    // Checks one by one, each sent on its own call, until every call the connection allows
    // is in flight: then the next one stays queued.
    let mut decided = Vec::new();
    let mut sent = 0;
    loop {
        decided.push(tokio::spawn(check(store.clone(), rule.clone())));
        for _ in 0..100 {
            if store.script_calls().calls > sent {
                break;
            }
            tokio::task::yield_now().await;
        }
        if store.script_calls().calls == sent {
            break;
        }
        sent = store.script_calls().calls;
    }
    for _ in 0..9 {
        decided.push(tokio::spawn(check(store.clone(), rule.clone())));
    }
    for decided in decided {
        match decided.await.unwrap() {
            Err(StoreError::Timeout { .. }) => {}
            other => panic!("expected a timeout while Redis is paused, got {other:?}"),
        }
    }
    // Answers once the pause is over; then the calls in flight complete and a new check
    // goes through once a call is free.
    server.query::<()>(&cmd("PING")).unwrap();
    let peek = loop {
        if let Ok(outcome) = check_one(&store, &rule, "k", 0).await {
            break outcome;
        }
    };
    assert!(peek.decision.allowed);
    assert_eq!(
        store.script_calls().checks,
        sent + 1,
        "{sent} checks were sent before Redis paused, then the peek; the 10 that timed out \
         in the queue must not have been"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_an_error_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = RedisStoreConfig::new(&format!("redis://127.0.0.1:{port}"));
    let err = RedisStore::connect(config).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_log_costs_at_most_ten_bytes_an_entry() {
    let store = standalone_store("memory-usage").await;
    let server = support::standalone();
    let mut usage = Vec::new();
    for layout in [LogLayout::Zset, LogLayout::Compact] {
        let spec = RuleSpec {
            layout: Some(layout),
            ..RuleSpec::new(Algorithm::SlidingLog, 1000, 3_600_000_000)
        };
        let rule = Rule::new("memory", &spec).unwrap();
        let limits = [Limit {
            rule: &rule,
            key: "full",
        }];
        for i in 0..1000 {
            let check = Check {
                at: Some(1_700_000_000_000_000 + i * 10),
                ..Check::new(&limits, 1)
            };
            assert!(store.check(&check).await.unwrap().decision.allowed);
        }
        let key = store.state_key(&rule, "full");
        let bytes: f64 = server.query(cmd("MEMORY").arg("USAGE").arg(&key)).unwrap();
        usage.push(bytes / 1000.0);
    }
    assert!(usage[1] <= 10.0, "compact: {} bytes per entry", usage[1]);
    assert!(usage[0] > 50.0, "zset: {} bytes per entry", usage[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_across_slots_gives_back_when_a_later_slot_refuses() {
    let store = cluster_store("give-back").await;
    let per_user = Rule::new(
        "user",
        &RuleSpec::new(Algorithm::SlidingLog, 5, 3_600_000_000),
    )
    .unwrap();
    let global = Rule::new(
        "global",
        &RuleSpec::new(Algorithm::FixedWindow, 1, 3_600_000_000),
    )
    .unwrap();
    let (user, everyone) = ("alice", "everyone");
    assert_ne!(
        sluicegate::store::redis::identity_slot(user),
        sluicegate::store::redis::identity_slot(everyone)
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
        at: Some(t),
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
        at: Some(t),
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
