//! Deciding when Redis fails: fallback policies, the circuit breaker, recovery after a
//! restart, and the negative cache — against real redis-server processes that the tests
//! start and stop.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluicegate::internals::identity_slot;
use sluicegate::redis::LossReason;
use sluicegate::{
    Algorithm, BreakerConfig, BreakerState, Check, DecidedBy, FailurePolicy, Limit, Limiter,
    LimiterConfig, ManualClock, OnStoreReset, RedisStore, RedisStoreConfig, Rule, RuleSpec, Store,
    StoreError,
};
use sluicegate_test_support as support;

const TIMEOUT: Duration = Duration::from_millis(100);

/// The store's timeout in tests that count every unit: long enough that no check of a
/// reachable store times out on a loaded machine (its answer would be the fallback's, and
/// the store might have counted it too); the outages they make are refused connections,
/// answered at once.
const COUNTING_TIMEOUT: Duration = Duration::from_secs(1);

async fn store_on(server: &support::RedisServer, test: &str) -> RedisStore {
    store_at(&server.url(), test, TIMEOUT).await
}

async fn store_at(url: &str, test: &str, timeout: Duration) -> RedisStore {
    let mut config = RedisStoreConfig::new(url);
    config.prefix = format!("resilience:{test}:{}:", std::process::id());
    config.timeout = timeout;
    RedisStore::connect(config).await.expect("connect")
}

fn rule(limit: u64) -> Rule {
    Rule::new(
        "r",
        &RuleSpec::new(Algorithm::SlidingLog, limit, Duration::from_secs(3600)),
    )
    .unwrap()
}

async fn check(
    limiter: &Limiter<RedisStore>,
    rule: &Rule,
    key: &str,
) -> (Result<sluicegate::Outcome, StoreError>, Duration) {
    let limits = [Limit { rule, key }];
    let started = Instant::now();
    let outcome = limiter.decide(&Check::new(&limits, 1)).await;
    (outcome, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_policy_answers_when_redis_dies_and_redis_decides_again_after_a_restart() {
    let server = support::RedisServer::start(&[]);
    let cool_down = Duration::from_millis(300);
    let config = |policy| LimiterConfig {
        on_store_error: policy,
        instances: 2,
        breaker: BreakerConfig {
            min_calls: 3,
            cool_down,
            ..BreakerConfig::default()
        },
        ..LimiterConfig::default()
    };
    // The limiters' own timers (the breaker's cool-down) move only when this test says so;
    // Redis keeps its own time.
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let policies = [
        FailurePolicy::Error,
        FailurePolicy::Allow,
        FailurePolicy::Deny,
        FailurePolicy::Local,
    ];
    let mut limiters = Vec::new();
    for policy in policies {
        let store = store_on(&server, policy.name()).await;
        limiters.push(Limiter::with_clock(
            store,
            config(policy),
            Arc::new(clock.clone()),
        ));
    }
    let rule = rule(4);
    for limiter in &limiters {
        let (outcome, _) = check(limiter, &rule, "k").await;
        assert_eq!(outcome.unwrap().decided_by, DecidedBy::Store);
    }

    server.shutdown();
    for (limiter, policy) in limiters.iter().zip(policies) {
        let mut answers = Vec::new();
        for _ in 0..6 {
            let (outcome, took) = check(limiter, &rule, "k").await;
            // Every request is answered within the timeout and a margin.
            assert!(
                took < TIMEOUT + Duration::from_millis(400),
                "{policy}: {took:?}"
            );
            answers.push(outcome);
        }
        match policy {
            FailurePolicy::Error => assert!(answers.iter().all(|a| matches!(
                a,
                Err(StoreError::Unavailable { .. } | StoreError::Timeout { .. })
            ))),
            FailurePolicy::Allow | FailurePolicy::Deny => {
                for answer in &answers {
                    let outcome = answer.as_ref().unwrap();
                    assert_eq!(outcome.decided_by, DecidedBy::Fallback(policy));
                    assert_eq!(outcome.decision.allowed, policy == FailurePolicy::Allow);
                }
            }
            FailurePolicy::Local => {
                // L = 4 over 2 instances: 2 locally.
                let allowed: Vec<bool> = answers
                    .iter()
                    .map(|a| a.as_ref().unwrap().decision.allowed)
                    .collect();
                assert_eq!(allowed, [true, true, false, false, false, false]);
            }
        }
        // Three failures opened the breaker: the store is not called any more.
        assert_eq!(limiter.breaker_state(), BreakerState::Open, "{policy}");
        assert!(limiter.stats().store_errors >= 6);
    }

    let restarted = server.restart(&[]);
    let back = Instant::now();
    for (limiter, policy) in limiters.iter().zip(policies) {
        loop {
            // Past the cool-down, the breaker lets a probe through.
            clock.advance(Duration::from_micros(
                u64::try_from(cool_down.as_micros()).unwrap(),
            ));
            let (outcome, _) = check(limiter, &rule, "k").await;
            if matches!(outcome, Ok(ref o) if o.decided_by == DecidedBy::Store) {
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(2),
                "{policy}: Redis not back in 2 s"
            );
            // The probe failed: the restarted Redis is not accepting the connection yet.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    }
    drop(restarted);
}

/// Redis counted 40 of 50 when it died: the local fallback starts the key there, so the
/// window admits 10 more, not 50 (with 2 instances each may take min(25, 10)).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_fallback_starts_from_what_redis_counted() {
    let server = support::RedisServer::start(&[]);
    let mut limiters = Vec::new();
    for instances in [1, 2] {
        let limiter = Limiter::with_config(
            store_on(&server, &format!("seeded-{instances}")).await,
            LimiterConfig {
                on_store_error: FailurePolicy::Local,
                instances,
                ..LimiterConfig::default()
            },
        );
        limiters.push(limiter);
    }
    let rule = rule(50);
    for limiter in &limiters {
        for _ in 0..40 {
            let (outcome, _) = check(limiter, &rule, "k").await;
            let outcome = outcome.unwrap();
            assert_eq!(outcome.decided_by, DecidedBy::Store);
            assert!(outcome.decision.allowed);
        }
    }
    server.shutdown();
    for limiter in &limiters {
        let mut allowed = 0;
        for _ in 0..60 {
            let (outcome, _) = check(limiter, &rule, "k").await;
            let outcome = outcome.unwrap();
            assert_eq!(
                outcome.decided_by,
                DecidedBy::Fallback(FailurePolicy::Local)
            );
            allowed += u32::from(outcome.decision.allowed);
        }
        assert_eq!(allowed, 10);
    }
}

/// The negative cache refuses only what Redis refuses, and spares Redis most refusals of
/// an abusive client — learnt from refusals, and for fixed windows and GCRA predicted from
/// the admission that used up the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_negative_cache_refuses_only_what_redis_refuses() {
    let server = support::RedisServer::start(&[]);
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        let cached = Limiter::with_config(
            store_on(&server, "negative").await,
            LimiterConfig {
                negative_cache_entries: 1000,
                ..LimiterConfig::default()
            },
        );
        let direct = store_on(&server, "negative").await;
        // 20 per 200 ms; the client sends several times that.
        let rule = Rule::new(
            algorithm.name(),
            &RuleSpec::new(algorithm, 20, Duration::from_millis(200)),
        )
        .unwrap();
        let limits = [Limit {
            rule: &rule,
            key: "abuser",
        }];
        let (mut hits, mut refusals, mut compared) = (0, 0, 0);
        let until = Instant::now() + Duration::from_millis(800);
        while Instant::now() < until {
            let outcome = cached.decide(&Check::new(&limits, 1)).await.unwrap();
            refusals += u64::from(!outcome.decision.allowed);
            if outcome.decided_by == DecidedBy::NegativeCache {
                hits += 1;
                assert!(!outcome.decision.allowed);
                // Redis, asked right away without recording, refuses too — if the answer
                // comes back while the cached refusal still stands (on a loaded machine the
                // peek may land after it, and then proves nothing).
                let stands = outcome.decision.retry_after().duration().unwrap();
                let asked = Instant::now();
                let peek = direct.check(&Check::new(&limits, 0)).await.unwrap();
                if asked.elapsed() < stands {
                    compared += 1;
                    assert!(
                        !peek.decision.allowed,
                        "{algorithm}: the cache refused what Redis would allow"
                    );
                    assert_eq!(peek.decision.limit, outcome.decision.limit, "{algorithm}");
                }
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        assert!(
            compared * 2 >= hits,
            "{algorithm}: only {compared} of {hits} cached refusals compared"
        );
        // Each refusal from Redis covers the refusals after it until a unit frees, so most
        // are spared a round trip (the token bucket frees a unit every 10 ms, and the
        // checks sent in the moment after each opening still reach Redis: a margin for
        // loaded machines).
        assert!(
            hits * 2 >= refusals,
            "{algorithm}: {hits} of {refusals} refusals answered by the cache"
        );
        assert_eq!(cached.stats().negative_cache_hits, hits);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_own_policy_beats_the_limiters() {
    let server = support::RedisServer::start(&[]);
    let limiter = Limiter::with_config(
        store_on(&server, "per-rule").await,
        LimiterConfig {
            on_store_error: FailurePolicy::Deny,
            ..LimiterConfig::default()
        },
    );
    server.shutdown();
    let open = rule(3).with_failure_policy(FailurePolicy::Allow);
    let (outcome, _) = check(&limiter, &open, "k").await;
    assert_eq!(
        outcome.unwrap().decided_by,
        DecidedBy::Fallback(FailurePolicy::Allow)
    );
    // With a deny rule beside it, the strictest wins.
    let closed = Rule::new(
        "other",
        &RuleSpec::new(Algorithm::FixedWindow, 3, Duration::from_secs(1)),
    )
    .unwrap();
    let limits = [
        Limit {
            rule: &open,
            key: "k",
        },
        Limit {
            rule: &closed,
            key: "k",
        },
    ];
    let outcome = limiter.decide(&Check::new(&limits, 1)).await.unwrap();
    assert_eq!(outcome.decided_by, DecidedBy::Fallback(FailurePolicy::Deny));
    assert!(!outcome.decision.allowed);
    assert!(outcome.limits()[0].allowed && !outcome.limits()[1].allowed);
}

/// A 3-master, 3-replica cluster loses a master under load; once its replica takes over,
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_fails_over_under_load_and_decisions_come_back() {
    let cluster = support::RedisCluster::start(3, 1);
    let hosts: Vec<String> = cluster
        .current_masters()
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port))
        .collect();
    let mut config = RedisStoreConfig::new(&format!("redis-cluster://{}", hosts.join(",")));
    config.prefix = "failover:".into();
    config.timeout = Duration::from_millis(250);
    let limiter = Limiter::with_config(
        RedisStore::connect(config)
            .await
            .expect("connect to the cluster"),
        LimiterConfig {
            on_store_error: FailurePolicy::Local,
            breaker: BreakerConfig {
                min_calls: 0,
                ..BreakerConfig::default()
            },
            ..LimiterConfig::default()
        },
    );
    let rule = rule(1_000_000);
    let keys: Vec<String> = (0..60).map(|i| format!("user:{i}")).collect();
    assert_eq!(decided_by_store(&limiter, &rule, &keys).await, keys.len());

    let victim = cluster.current_masters()[0].port;
    let node = cluster.nodes.iter().find(|n| n.port == victim).unwrap();
    node.shutdown();
    let started = Instant::now();
    let mut saw_fallback = false;
    loop {
        let by_store = decided_by_store(&limiter, &rule, &keys).await;
        saw_fallback |= by_store < keys.len();
        if by_store == keys.len() && saw_fallback {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "decisions did not come back from the cluster ({by_store} of {})",
            keys.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The replica of the stopped master is a master now.
    assert_eq!(cluster.current_masters().len(), 3);
}

/// Checks of two slots of one master are one routed call to it. When that master dies,
/// the routed calls fail whole (refused, then turned away by the old master come back as
/// a replica): the store reads the slot map again and runs them slot by slot meanwhile.
/// Once the replica has taken over, every check is decided again, and no limit counts
/// more units than checks were answered allowed or failed (a check that may have run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_one_node_are_decided_again_after_its_master_fails_over() {
    const PAIRS: usize = 8;
    let cluster = support::RedisCluster::start(3, 1);
    let mut config = RedisStoreConfig::new(&cluster.url());
    config.prefix = "failover-routed:".into();
    config.timeout = Duration::from_millis(250);
    let store = Arc::new(RedisStore::connect(config).await.expect("connect"));
    let victim = cluster.master_of(identity_slot("user:0")).port;
    let of_victim = |stem: &'static str| {
        (0..)
            .map(move |i| format!("{stem}:{i}"))
            .filter(|key| cluster.master_of(identity_slot(key)).port == victim)
    };
    // Pairs of keys of two slots of the victim, no key in two pairs.
    let mut others = of_victim("other");
    let pairs: Vec<(String, String)> = of_victim("user")
        .take(PAIRS)
        .map(|first| {
            let second = others
                .find(|other| identity_slot(other) != identity_slot(&first))
                .expect("keys without end");
            (first, second)
        })
        .collect();
    let rule = Arc::new(rule(1_000_000));
    // Per pair: checks answered allowed, checks that failed.
    let mut answered = vec![(0u64, 0u64); PAIRS];
    assert_eq!(
        check_pairs(&store, &rule, &pairs, &mut answered).await,
        0,
        "checks before the failover"
    );

    cluster
        .nodes
        .iter()
        .find(|n| n.port == victim)
        .unwrap()
        .shutdown();
    let started = Instant::now();
    let mut saw_failures = false;
    loop {
        let failed = check_pairs(&store, &rule, &pairs, &mut answered).await;
        saw_failures |= failed > 0;
        if failed == 0 && saw_failures {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "checks of the failed-over node were not decided again ({failed} of {PAIRS} failed)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for ((first, second), (allowed, failed)) in pairs.iter().zip(&answered) {
        let limits = [limit(&rule, first), limit(&rule, second)];
        let peek = store.check(&Check::new(&limits, 0)).await.expect("a peek");
        for counted in peek.limits().iter().map(|l| 1_000_000 - l.remaining) {
            assert!(
                counted <= allowed + failed,
                "{counted} units counted for {allowed} checks allowed and {failed} failed"
            );
        }
    }
}

/// Checks every pair at once; counts each pair's checks allowed and failed in `answered`
/// and returns how many failed.
async fn check_pairs(
    store: &Arc<RedisStore>,
    rule: &Arc<Rule>,
    pairs: &[(String, String)],
    answered: &mut [(u64, u64)],
) -> usize {
    let mut checks = tokio::task::JoinSet::new();
    for (i, (first, second)) in pairs.iter().cloned().enumerate() {
        let (store, rule) = (Arc::clone(store), Arc::clone(rule));
        checks.spawn(async move {
            let limits = [limit(&rule, &first), limit(&rule, &second)];
            (i, store.check(&Check::new(&limits, 1)).await)
        });
    }
    let mut failed = 0;
    while let Some(done) = checks.join_next().await {
        let (i, outcome) = done.expect("a check task");
        match outcome {
            Ok(outcome) => {
                assert!(outcome.decision.allowed);
                answered[i].0 += 1;
            }
            Err(_) => {
                answered[i].1 += 1;
                failed += 1;
            }
        }
    }
    failed
}

fn limit<'a>(rule: &'a Rule, key: &'a str) -> Limit<'a> {
    Limit { rule, key }
}

/// Checks every key once; returns how many the store decided.
async fn decided_by_store(limiter: &Limiter<RedisStore>, rule: &Rule, keys: &[String]) -> usize {
    let mut by_store = 0;
    for key in keys {
        let limits = [Limit { rule, key }];
        let outcome = limiter
            .decide(&Check::new(&limits, 1))
            .await
            .expect("an answer");
        by_store += usize::from(outcome.decided_by == DecidedBy::Store);
    }
    by_store
}

/// The store counts exactly `limit` units for `key`: it refuses one more, and admits one
/// once one unit is refunded (the refund is the test's last word on the key).
async fn counts_exactly(store: &RedisStore, rule: &Rule, key: &str) -> bool {
    let limits = [Limit { rule, key }];
    let peek = || async {
        store
            .check(&Check::new(&limits, 0))
            .await
            .unwrap()
            .decision
            .allowed
    };
    let full = !peek().await;
    store
        .check(&Check {
            charge: sluicegate::Charge::Refund,
            ..Check::new(&limits, 1)
        })
        .await
        .unwrap();
    full && peek().await
}

/// What one key was answered across an outage.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    admitted: u64,
    by_fallback: u64,
    refused_by_store: bool,
}

/// Checks every key once, in turn, tallying each answer in `tallies` (by key's index).
async fn check_each(
    limiter: &Limiter<RedisStore>,
    rule: &Rule,
    keys: &[String],
    tallies: &mut [Tally],
) {
    for (key, tally) in keys.iter().zip(tallies.iter_mut()) {
        let outcome = check(limiter, rule, key).await.0.expect("an answer");
        tally.admitted += u64::from(outcome.decision.allowed);
        match outcome.decided_by {
            DecidedBy::Store => tally.refused_by_store |= !outcome.decision.allowed,
            DecidedBy::Fallback(FailurePolicy::Local) => tally.by_fallback += 1,
            other => panic!("{key}: decided by {other:?}"),
        }
    }
}

/// 150 units of each key admitted by the store.
async fn fill_to_150(limiter: &Limiter<RedisStore>, rule: &Rule, keys: &[String]) -> Vec<Tally> {
    let mut tallies = vec![Tally::default(); keys.len()];
    for _ in 0..150 {
        check_each(limiter, rule, keys, &mut tallies).await;
    }
    for (key, tally) in keys.iter().zip(&tallies) {
        assert!(
            tally.admitted == 150 && tally.by_fallback == 0,
            "{key}: {tally:?}"
        );
    }
    tallies
}

/// With the store away, 100 checks of each key at 150 / 200: the local fallback decides
/// each, admits the 50 left, and owes them to the store.
async fn fill_from_150_with_the_local_fallback(
    limiter: &Limiter<RedisStore>,
    rule: &Rule,
    keys: &[String],
    tallies: &mut [Tally],
) {
    for _ in 0..100 {
        check_each(limiter, rule, keys, tallies).await;
    }
    for (key, tally) in keys.iter().zip(tallies.iter()) {
        assert!(
            tally.admitted == 200 && tally.by_fallback == 100,
            "{key}: {tally:?}"
        );
    }
    assert_eq!(limiter.owed(), (keys.len(), keys.len() as u64 * 50));
}

/// Checks every key in rounds until the store has refused each of them, for at most
/// `within`; the store is coming back meanwhile (the breaker's cool-down, a promotion),
/// waited for against real processes.
async fn until_the_store_refuses_each(
    limiter: &Limiter<RedisStore>,
    rule: &Rule,
    keys: &[String],
    tallies: &mut [Tally],
    within: Duration,
) {
    let started = Instant::now();
    while !tallies.iter().all(|tally| tally.refused_by_store) {
        assert!(
            started.elapsed() < within,
            "not every key refused by the store within {within:?}: {tallies:?}"
        );
        check_each(limiter, rule, keys, tallies).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The units of `key` stored in `server`: its log's entries.
fn stored(
    server: &support::RedisServer,
    limiter: &Limiter<RedisStore>,
    rule: &Rule,
    key: &str,
) -> u64 {
    server
        .query(support::cmd("ZCARD").arg(limiter.store().state_key(rule, key)))
        .expect("ZCARD")
}

/// One instance whose store failures are answered by the local fallback, its breaker
/// opening after three failures and resting 200 ms.
fn one_instance_with_the_local_fallback() -> LimiterConfig {
    LimiterConfig {
        on_store_error: FailurePolicy::Local,
        instances: 1,
        breaker: BreakerConfig {
            min_calls: 3,
            cool_down: Duration::from_millis(200),
            ..BreakerConfig::default()
        },
        ..LimiterConfig::default()
    }
}

/// One instance, keys at 150 / 200 when a persistent Redis dies for a while: the local
/// fallback admits 50 more of each, and Redis, back, counts them before it decides the
/// key again — through the key's next check, or in the background for a key that sees
/// none. No key passes 200 in its window, and Redis counts every unit admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_never_passes_l_across_a_redis_restart_with_the_local_fallback() {
    let persistent = ["--appendonly", "yes", "--appendfsync", "always"];
    let server = support::RedisServer::start(&persistent);
    let limiter = Limiter::with_config(
        store_at(&server.url(), "write-back", COUNTING_TIMEOUT).await,
        one_instance_with_the_local_fallback(),
    );
    let rule = rule(200);
    // Checked again after the restart (the first 8), and left to the background
    // write-back.
    let keys: Vec<String> = (0..8)
        .map(|i| format!("checked:{i}"))
        .chain((0..4).map(|i| format!("idle:{i}")))
        .collect();
    let mut tallies = fill_to_150(&limiter, &rule, &keys).await;
    server.shutdown();
    fill_from_150_with_the_local_fallback(&limiter, &rule, &keys, &mut tallies).await;
    let restarted = server.restart(&persistent);
    until_the_store_refuses_each(
        &limiter,
        &rule,
        &keys[..8],
        &mut tallies[..8],
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(limiter.owed(), (4, 4 * 50));
    assert_eq!(limiter.write_back(100).await, 4);
    assert_eq!(limiter.owed(), (0, 0));
    let direct = store_on(&restarted, "write-back").await;
    for (key, tally) in keys.iter().zip(&tallies) {
        assert_eq!(tally.admitted, 200, "{key}: admitted past L");
        assert!(
            counts_exactly(&direct, &rule, key).await,
            "{key}: Redis does not count every unit admitted"
        );
    }
    let stats = limiter.stats();
    assert_eq!(stats.write_backs_written, 12);
}

/// One instance, keys at 150 / 200, a Redis restarted without persistence on the same
/// port while every key is checked continuously: the store verifies the new process
/// before it decides a check there, so what the instance last knew of each key (150) is
/// written back before the key is decided again, instead of being overwritten by answers
/// from the empty server. No key passes 200 in its window, and Redis counts, on top of
/// the 150 written back, every unit it admitted since the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_without_its_data_is_seeded_before_it_decides_a_busy_key() {
    let server = support::RedisServer::start(&[]);
    let limiter = Arc::new(Limiter::with_config(
        store_on(&server, "restart-seeded").await,
        LimiterConfig {
            on_store_error: FailurePolicy::Deny,
            on_store_reset: OnStoreReset::Conservative,
            instances: 1,
            breaker: BreakerConfig {
                min_calls: 3,
                cool_down: Duration::from_millis(50),
                ..BreakerConfig::default()
            },
            ..LimiterConfig::default()
        },
    ));
    let rule = rule(200);
    let keys: Vec<String> = (0..12).map(|i| format!("busy:{i}")).collect();
    for key in &keys {
        for _ in 0..150 {
            let outcome = check(&limiter, &rule, key).await.0.unwrap();
            assert!(outcome.decision.allowed && outcome.decided_by == DecidedBy::Store);
        }
    }
    server.shutdown();
    // Every key, round after round, until each has been refused by the restarted Redis:
    // admissions since the restart by key, and the keys Redis refused.
    let record = Arc::new(parking_lot::Mutex::new((
        std::collections::HashMap::<String, u64>::new(),
        std::collections::HashSet::<String>::new(),
    )));
    let checking = {
        let (limiter, rule, keys, record) = (
            Arc::clone(&limiter),
            rule.clone(),
            keys.clone(),
            Arc::clone(&record),
        );
        tokio::spawn(async move {
            loop {
                for key in &keys {
                    let Ok(outcome) = check(&limiter, &rule, key).await.0 else {
                        continue;
                    };
                    let mut record = record.lock();
                    if outcome.decision.allowed {
                        *record.0.entry(key.clone()).or_default() += 1;
                    } else if outcome.decided_by == DecidedBy::Store {
                        record.1.insert(key.clone());
                    }
                    if record.1.len() == keys.len() {
                        return;
                    }
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let restarted = server.restart(&[]);
    tokio::time::timeout(Duration::from_secs(20), checking)
        .await
        .expect("every key refused by the restarted Redis within 20 s")
        .unwrap();
    let losses = limiter.store().lost_state().losses;
    assert!(
        losses
            .iter()
            .any(|loss| loss.reason == LossReason::Restarted),
        "{losses:?}"
    );
    let (since_restart, _) = record.lock().clone();
    // Each key: (admitted in its window, units Redis stores).
    let mut counted = Vec::new();
    for key in &keys {
        let stored: u64 = restarted
            .query(support::cmd("ZCARD").arg(limiter.store().state_key(&rule, key)))
            .unwrap();
        counted.push((150 + since_restart.get(key).copied().unwrap_or(0), stored));
    }
    assert!(
        counted
            .iter()
            .all(|&(admitted, stored)| admitted <= 200 && stored >= admitted),
        "(admitted of 200, stored) by key: {counted:?}"
    );
}

/// One instance, keys at 150 / 200, its connections to a Redis that keeps its data cut
/// by the fault proxy (open ones reset, new ones refused) for a while: the local fallback
/// admits 50 more of each, and Redis, reachable again, counts them before it decides the
/// key again — it would otherwise admit 50 more of its own. No key passes 200 in its
/// window, and Redis stores every unit admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_never_passes_l_across_a_cut_connection_with_the_local_fallback() {
    let server = support::RedisServer::start(&[]);
    let proxy = support::FaultProxy::start(server.port);
    let limiter = Limiter::with_config(
        store_at(&proxy.url(), "cut", COUNTING_TIMEOUT).await,
        one_instance_with_the_local_fallback(),
    );
    let rule = rule(200);
    let keys: Vec<String> = (0..12).map(|i| format!("cut:{i}")).collect();
    let mut tallies = fill_to_150(&limiter, &rule, &keys).await;

    proxy.refuse();
    fill_from_150_with_the_local_fallback(&limiter, &rule, &keys, &mut tallies).await;

    proxy.accept_again();
    until_the_store_refuses_each(&limiter, &rule, &keys, &mut tallies, Duration::from_secs(5))
        .await;
    // (admitted of 200, stored) by key.
    let counted: Vec<(u64, u64)> = keys
        .iter()
        .zip(&tallies)
        .map(|(key, tally)| (tally.admitted, stored(&server, &limiter, &rule, key)))
        .collect();
    assert!(
        counted.iter().all(|&c| c == (200, 200)),
        "(admitted of 200, stored) by key: {counted:?}"
    );
    assert_eq!(limiter.owed(), (0, 0));
}

/// One instance on a cluster of three masters with a replica each, keys at 150 / 200 on
/// every master, one master shut down once its replica has every write: the local
/// fallback answers that master's keys until its replica is promoted, and the new master
/// counts what the fallback admitted before it decides them again. No key passes 200,
/// the cluster stores every unit admitted, and the keys of the other masters are decided
/// by the store throughout (the cluster serves the slots it still covers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_never_passes_l_across_a_cluster_failover_with_the_local_fallback() {
    let cluster = support::RedisCluster::start(3, 1);
    cluster.require_full_coverage(false);
    let limiter = Limiter::with_config(
        store_at(&cluster.url(), "failover", COUNTING_TIMEOUT).await,
        one_instance_with_the_local_fallback(),
    );
    let rule = rule(200);
    let masters: Vec<u16> = cluster.current_masters().iter().map(|m| m.port).collect();
    // Keys on each master, the victim's first.
    const PER_MASTER: usize = 4;
    let keys: Vec<String> = masters
        .iter()
        .flat_map(|&master| {
            (0..)
                .map(move |i| format!("failover:{master}:{i}"))
                .filter(|key| cluster.master_of(identity_slot(key)).port == master)
                .take(PER_MASTER)
                .collect::<Vec<_>>()
        })
        .collect();
    let mut tallies = fill_to_150(&limiter, &rule, &keys).await;

    let victim = cluster.nodes.iter().find(|n| n.port == masters[0]).unwrap();
    cluster.await_replicas_of(victim, Duration::from_secs(15));
    victim.shutdown();
    until_the_store_refuses_each(
        &limiter,
        &rule,
        &keys,
        &mut tallies,
        Duration::from_secs(20),
    )
    .await;
    // (admitted of 200, stored, decided by the fallback) by key.
    let counted: Vec<(u64, u64, u64)> = keys
        .iter()
        .zip(&tallies)
        .map(|(key, tally)| {
            let master = cluster.master_of(identity_slot(key));
            (
                tally.admitted,
                stored(master, &limiter, &rule, key),
                tally.by_fallback,
            )
        })
        .collect();
    assert!(
        counted
            .iter()
            .all(|&(admitted, stored, _)| (admitted, stored) == (200, 200)),
        "(admitted of 200, stored, by the fallback) by key: {counted:?}"
    );
    assert!(
        counted
            .iter()
            .enumerate()
            .all(|(i, &(_, _, by_fallback))| (i < PER_MASTER) == (by_fallback > 0)),
        "only the victim's keys are decided by the fallback: {counted:?}"
    );
    assert_eq!(limiter.owed(), (0, 0));
}
