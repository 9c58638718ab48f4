//! Failure state per node on a real Redis Cluster (three masters, a replica each): one
//! master is shut down under steady checks of keys on every master, with the limiter's
//! default breaker and `deny` as the failure policy, so that every answer says who made it.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluicegate::internals::identity_slot;
use sluicegate::{
    Algorithm, BreakerConfig, BreakerState, Check, DecidedBy, FailurePolicy, Limit, Limiter,
    LimiterConfig, RedisStore, RedisStoreConfig, Rule, RuleSpec, Store,
};
use sluicegate_test_support as support;

/// The store's timeout: what a check of a dead master would wait without failure state
/// per node.
const TIMEOUT: Duration = Duration::from_millis(250);
/// Keys checked on each master, all at once in every round: enough failures in one round
/// to open a node's breaker (the default: 20 calls, half of them failed).
const KEYS_PER_MASTER: usize = 24;
/// The limit of every key: far above what a run takes, so that every refusal would be the
/// store's or the policy's, never the limit's.
const L: u64 = 1_000_000;

/// What one key has been answered so far.
#[derive(Clone, Copy, Default)]
struct Answers {
    by_store: u64,
    by_policy: u64,
}

/// What one round of checks saw, per key.
struct Round {
    /// (key's index, decided by, how long the check took).
    checks: Vec<(usize, DecidedBy, Duration)>,
}

/// Checks every key once, all at once.
async fn round(limiter: &Arc<Limiter<RedisStore>>, rule: &Arc<Rule>, keys: &[String]) -> Round {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, key) in keys.iter().enumerate() {
        let (limiter, rule, key) = (Arc::clone(limiter), Arc::clone(rule), key.clone());
        tasks.spawn(async move {
            let limits = [Limit {
                rule: &rule,
                key: &key,
            }];
            let started = Instant::now();
            let outcome = limiter
                .decide(&Check::new(&limits, 1))
                .await
                .expect("the deny policy answers every failure");
            (i, outcome.decided_by, started.elapsed())
        });
    }
    let mut checks = Vec::with_capacity(keys.len());
    while let Some(done) = tasks.join_next().await {
        checks.push(done.expect("a check task"));
    }
    Round { checks }
}

/// The cluster, and `KEYS_PER_MASTER` keys on each master, the victim's first.
struct Setup {
    cluster: support::RedisCluster,
    victim: u16,
    keys: Vec<String>,
    /// Whether the key of that index is on the victim.
    on_victim: Vec<bool>,
}

fn setup(full_coverage: bool) -> Setup {
    let cluster = support::RedisCluster::start(3, 1);
    cluster.require_full_coverage(full_coverage);
    let masters: Vec<u16> = cluster.current_masters().iter().map(|m| m.port).collect();
    let victim = masters[0];
    let mut keys = Vec::new();
    let mut on_victim = Vec::new();
    for master in &masters {
        let mut found = 0;
        for i in 0.. {
            if found == KEYS_PER_MASTER {
                break;
            }
            let key = format!("user:{master}:{i}");
            if cluster.master_of(identity_slot(&key)).port == *master {
                on_victim.push(*master == victim);
                keys.push(key);
                found += 1;
            }
        }
    }
    Setup {
        cluster,
        victim,
        keys,
        on_victim,
    }
}

/// A limiter on `cluster` whose failures are answered `deny`, its breakers opening as by
/// default, resting `cool_down` once open.
async fn limiter_on(
    cluster: &support::RedisCluster,
    test: &str,
    cool_down: Duration,
) -> Arc<Limiter<RedisStore>> {
    let mut config = RedisStoreConfig::new(&cluster.url());
    config.prefix = format!("nodes:{test}:");
    config.timeout = TIMEOUT;
    let store = RedisStore::connect(config).await.expect("connect");
    Arc::new(Limiter::with_config(
        store,
        LimiterConfig {
            on_store_error: FailurePolicy::Deny,
            breaker: BreakerConfig {
                cool_down,
                ..BreakerConfig::default()
            },
            ..LimiterConfig::default()
        },
    ))
}

fn rule() -> Arc<Rule> {
    Arc::new(
        Rule::new(
            "r",
            &RuleSpec::new(Algorithm::SlidingLog, L, Duration::from_secs(3600)),
        )
        .unwrap(),
    )
}

/// The state of the breaker of the node at `port`, if it has had a check.
fn node_state(limiter: &Limiter<RedisStore>, port: u16) -> Option<BreakerState> {
    let name = format!("127.0.0.1:{port}");
    limiter
        .node_breakers()
        .iter()
        .find(|node| node.name == name)
        .map(|node| node.state)
}

/// What a run saw after the victim was shut down.
struct Run {
    answers: Vec<Answers>,
    /// When the test saw the victim's replica promoted (a node's `CLUSTER SLOTS` names
    /// another master for the victim's slots).
    promoted: Instant,
    /// The first round after `promoted` in which every key was decided by the store.
    all_back: Instant,
    /// Policy answers to checks of the victim's keys sent while its breaker was open, and
    /// the slowest of them.
    unsent: (usize, Duration),
}

/// Shuts the victim down and checks every key in rounds until, after its replica was
/// promoted, a whole round is decided by the store again.
async fn fail_over(setup: &Setup, limiter: &Arc<Limiter<RedisStore>>, rule: &Arc<Rule>) -> Run {
    let mut answers = vec![Answers::default(); setup.keys.len()];
    let before = round(limiter, rule, &setup.keys).await;
    for (i, by, _) in before.checks {
        assert_eq!(
            by,
            DecidedBy::Store,
            "key {} before the failover",
            setup.keys[i]
        );
        answers[i].by_store += 1;
    }
    let victim_slot = identity_slot(&setup.keys[0]);
    let started = Instant::now();
    setup
        .cluster
        .nodes
        .iter()
        .find(|n| n.port == setup.victim)
        .unwrap()
        .shutdown();
    limiter
        .store()
        .ping()
        .await
        .expect("ready while the other masters answer");
    let mut promoted = None;
    let mut unsent = (0, Duration::ZERO);
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the keys of the failed master were not decided by the store again"
        );
        let victim_open = node_state(limiter, setup.victim) == Some(BreakerState::Open);
        let this = round(limiter, rule, &setup.keys).await;
        let mut all_by_store = true;
        for &(i, by, took) in &this.checks {
            if by == DecidedBy::Store {
                answers[i].by_store += 1;
                continue;
            }
            all_by_store = false;
            answers[i].by_policy += 1;
            if setup.on_victim[i] && victim_open {
                unsent = (unsent.0 + 1, unsent.1.max(took));
            }
        }
        if let Some(promoted) = promoted
            && all_by_store
        {
            return Run {
                answers,
                promoted,
                all_back: Instant::now(),
                unsent,
            };
        }
        if promoted.is_none()
            && setup
                .cluster
                .serving(victim_slot)
                .is_some_and(|master| master.port != setup.victim)
        {
            promoted = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Counts every unit each key holds in the store now (a peek) against what it was
/// answered: on a healthy master exactly what the store admitted; on the victim no more
/// than the store admitted plus the checks that failed (a check that timed out may have
/// run); never more than L.
async fn assert_counted(setup: &Setup, limiter: &Limiter<RedisStore>, rule: &Rule, run: &Run) {
    for (i, key) in setup.keys.iter().enumerate() {
        let limits = [Limit { rule, key }];
        let peek = limiter
            .store()
            .check(&Check::new(&limits, 0))
            .await
            .expect("a peek once the cluster is whole");
        // A peek answers as a check of one unit would.
        let stored = L - peek.decision.remaining - 1;
        let Answers {
            by_store,
            by_policy,
        } = run.answers[i];
        assert!(stored <= L, "key {key}: {stored} units over {L}");
        if setup.on_victim[i] {
            assert!(
                stored <= by_store + by_policy,
                "key {key}: {stored} units stored for {by_store} admitted and {by_policy} failed"
            );
        } else {
            assert_eq!(stored, by_store, "key {key} on a healthy master");
        }
    }
}

/// How long after the promotion the victim's keys may take to be decided by the store
/// again: one reading of the slot map — asked for by every check the victim's open
/// breaker answers, at most one per 100 ms, each bounded by the store's timeout — then one
/// check's round trip (the timeout again), and a round of the test's own pace.
const BACK_WITHIN: Duration = Duration::from_millis(100 + 250 + 250 + 100);

/// Without full coverage, the masters that keep their slots serve them throughout: their
/// keys see no failure at all, while the victim's keys are answered by their policy — at
/// once, without a call, as soon as the victim's breaker is open — and are decided by the
/// store again within one slot-map reading of the promotion: the victim's breaker rests
/// far longer than the run (its cool-down), so they are decided by the replica that took
/// the slots over, under a breaker of its own. Nothing is counted that was not answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_master_holds_up_only_its_own_keys() {
    let setup = setup(false);
    let limiter = limiter_on(&setup.cluster, "partial", Duration::from_secs(60)).await;
    let rule = rule();
    let run = fail_over(&setup, &limiter, &rule).await;

    for (i, answers) in run.answers.iter().enumerate() {
        if !setup.on_victim[i] {
            assert_eq!(
                answers.by_policy, 0,
                "key {} on a healthy master was answered by the policy",
                setup.keys[i]
            );
        }
    }
    let (unsent, slowest) = run.unsent;
    assert!(unsent > 0, "no check met the victim's open breaker");
    assert!(
        slowest < TIMEOUT / 5,
        "a check of the open node took {slowest:?}: it should not wait for the store"
    );
    let back = run.all_back - run.promoted;
    assert!(
        back <= BACK_WITHIN,
        "the victim's keys were decided by the store again {back:?} after the promotion"
    );
    // The victim's breaker opened and never closed (it rests for a minute): the keys came
    // back under the replica's. The victim serves no slot now, so it is left out of what
    // the breakers show, and the whole store's is closed.
    let transitions = limiter.breaker_transitions();
    assert!(transitions.to(BreakerState::Open) >= 1);
    assert_eq!(transitions.to(BreakerState::Closed), 0);
    assert_eq!(node_state(&limiter, setup.victim), None);
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    assert_counted(&setup, &limiter, &rule, &run).await;
}

/// With full coverage (Redis' default), every master answers CLUSTERDOWN while the
/// victim's slots have no master: those checks are answered by their policy, but they do
/// not open the breakers of masters that answered at once, so as soon as the replica is
/// promoted and the cluster is ok, their keys are decided by the store again — not a
/// cool-down later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_that_say_the_cluster_is_down_are_not_held_after_it_is_up() {
    let setup = setup(true);
    let limiter = limiter_on(&setup.cluster, "full", BreakerConfig::default().cool_down).await;
    let rule = rule();
    let run = fail_over(&setup, &limiter, &rule).await;

    let healthy: Vec<u16> = setup
        .cluster
        .current_masters()
        .iter()
        .map(|m| m.port)
        .collect();
    for node in limiter.node_breakers() {
        if healthy
            .iter()
            .any(|port| node.name == format!("127.0.0.1:{port}"))
        {
            assert_eq!(
                node.transitions.to(BreakerState::Open),
                0,
                "the breaker of {} opened",
                node.name
            );
        }
    }
    let back = run.all_back - run.promoted;
    assert!(
        back <= BACK_WITHIN,
        "keys were decided by the store again {back:?} after the promotion"
    );
    assert_counted(&setup, &limiter, &rule, &run).await;
}
