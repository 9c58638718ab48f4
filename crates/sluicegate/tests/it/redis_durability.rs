//! `Durability::Replicated` against real Redis: an admission answered is one a replica
//! has, so a master that is cut off from its replicas and then killed (`SIGKILL`) loses
//! none of them when the replica takes over, where `Durability::Async` over-admits; a
//! master whose replica is gone fails every check that admits, and the failure policy
//! answers; a master without a replica is refused at connect.

#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use sluicegate::internals::identity_slot;
use sluicegate::{
    Algorithm, Check, DecidedBy, Durability, FailurePolicy, Limit, Limiter, LimiterConfig,
    OnStoreReset, Outcome, RedisStore, RedisStoreConfig, Rule, RuleSpec, Store, StoreError,
};
use sluicegate_test_support::{self as support, RedisServer, cmd};
use tokio::sync::Mutex;

/// One test at a time: each times `WAIT` against the store timeout, and two nine-node
/// clusters starting beside it on two cores made a replica's acknowledgement late.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// L: units a minute per key. Every check of a test falls in one window.
const LIMIT: u64 = 20;
/// Keys checked at once, all on the master that fails.
const KEYS: usize = 4;

fn rule() -> Rule {
    Rule::new(
        "durable",
        &RuleSpec::new(Algorithm::SlidingLog, LIMIT, Duration::from_secs(60)),
    )
    .unwrap()
}

/// The store timeout of the cluster tests: their checks against a cut-off master each
/// wait out `WAIT`, so it is short.
const CUT_OFF_TIMEOUT: Duration = Duration::from_millis(400);

async fn store(
    url: &str,
    test: &str,
    durability: Durability,
    timeout: Duration,
) -> Result<RedisStore, StoreError> {
    let mut config = RedisStoreConfig::new(url);
    config.prefix = format!("test:{test}:{}:", std::process::id());
    // Redis waits half of it for a replica's acknowledgement.
    config.timeout = timeout;
    config.durability = durability;
    RedisStore::connect(config).await
}

/// `key` under `rule` at `cost` (0: a peek), as `store` decides it.
async fn decide(
    store: &impl Store,
    rule: &Rule,
    key: &str,
    cost: u64,
) -> Result<Outcome, StoreError> {
    let limits = [Limit { rule, key }];
    store.check(&Check::new(&limits, cost)).await
}

/// `key` under `rule`, as `limiter` answers it.
async fn answer(limiter: &Limiter<RedisStore>, rule: &Rule, key: &str) -> Outcome {
    let limits = [Limit { rule, key }];
    limiter
        .decide(&Check::new(&limits, 1))
        .await
        .expect("the policy answers")
}

/// Waits (bounded) until `ready` holds: for a real process to get there.
fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the checks of one key were answered.
#[derive(Clone, Copy, Debug, Default)]
struct Answers {
    allowed: u64,
    refused: u64,
    not_replicated: u64,
    other_errors: u64,
}

/// One check of `key`, its answer counted.
async fn check(limiter: &Limiter<RedisStore>, rule: &Rule, key: &str, answers: &mut Answers) {
    match limiter.check(rule, key, 1).await {
        Ok(decision) if decision.allowed => answers.allowed += 1,
        Ok(_) => answers.refused += 1,
        Err(StoreError::NotReplicated { .. }) => answers.not_replicated += 1,
        Err(_) => answers.other_errors += 1,
    }
}

/// Under `durability`, on a three-master cluster with two replicas each: every key is
/// brought to half its limit; the replicas of their master are cut off from it (their
/// links killed, and kept from coming back by a wrong `masterauth`), as a partition cuts
/// a master off; checks go on against the master alone, up to the limit and one more; the
/// master is killed, a replica promoted, the other replicates it; and checks go on until
/// every key refuses. Returns each key's answers.
async fn cut_off_then_killed(durability: Durability, test: &str) -> Vec<Answers> {
    let cluster = support::RedisCluster::start(3, 2);
    // A replica acknowledges nothing until its first copy is loaded.
    wait_for("every replica's first copy", || {
        cluster
            .current_masters()
            .iter()
            .all(|master| master.online_replicas() == 2)
    });
    let limiter = Limiter::with_config(
        store(&cluster.url(), test, durability, CUT_OFF_TIMEOUT)
            .await
            .expect("connect"),
        LimiterConfig {
            on_store_error: FailurePolicy::Error,
            // What Redis itself keeps is the subject: the failover is also seen as lost
            // state, and `conservative` would count each key's last known units again
            // (its own tests), refusing early where this test counts admissions.
            on_store_reset: OnStoreReset::Admit,
            ..LimiterConfig::default()
        },
    );
    let victim = cluster.master_of(identity_slot("key:0"));
    let keys: Vec<String> = (0..)
        .map(|i| format!("key:{i}"))
        .filter(|key| cluster.master_of(identity_slot(key)).port == victim.port)
        .take(KEYS)
        .collect();
    let rule = rule();
    let mut answers = vec![Answers::default(); KEYS];

    for (key, answers) in keys.iter().zip(&mut answers) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while answers.allowed < LIMIT / 2 {
            assert!(
                Instant::now() < deadline,
                "{key}: {answers:?} before the cut"
            );
            check(&limiter, &rule, key, answers).await;
        }
    }

    let replicas = cluster.replicas_of(victim);
    assert_eq!(replicas.len(), 2);
    let masterauth = |password: &str| {
        for replica in &replicas {
            replica
                .query::<()>(cmd("CONFIG").arg("SET").arg("masterauth").arg(password))
                .expect("CONFIG SET masterauth");
        }
    };
    masterauth("not-the-password");
    victim
        .query::<u64>(cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"))
        .expect("CLIENT KILL TYPE replica");
    wait_for("the replicas' disconnection", || {
        victim.online_replicas() == 0
    });
    for (key, answers) in keys.iter().zip(&mut answers) {
        for _ in 0..=LIMIT / 2 {
            check(&limiter, &rule, key, answers).await;
        }
    }

    victim.kill();
    masterauth("");
    let mut promoted = None;
    wait_for("a replica's promotion", || {
        promoted = replicas.iter().find(|replica| replica.is_master());
        promoted.is_some()
    });
    let promoted = promoted.expect("a promoted replica");
    wait_for("the other replica's first copy", || {
        promoted.online_replicas() == 1
    });
    for (key, answers) in keys.iter().zip(&mut answers) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let refused = answers.refused;
        while answers.refused == refused {
            assert!(
                Instant::now() < deadline,
                "{key}: {answers:?} after the failover"
            );
            check(&limiter, &rule, key, answers).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    eprintln!("{durability}: per key {answers:?}");
    answers
}

/// With `replicated`, the admissions the master took alone failed (no replica
/// acknowledged them), those answered allowed are all on the promoted replica, and
/// admissions resume once it has a replica of its own: no key is answered allowed more
/// than L times across the failover, and every key more than the L/2 of before the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_admissions_survive_a_cut_off_master_killed() {
    let _serial = SERIAL.lock().await;
    let answers = cut_off_then_killed(Durability::Replicated, "durability-replicated").await;
    // A check whose WAIT timed out on a loaded machine took units it was not answered
    // for: fewer than L may be answered allowed, never more.
    for answers in &answers {
        assert!(
            (LIMIT / 2 + 1..=LIMIT).contains(&answers.allowed),
            "{answers:?}"
        );
        assert!(answers.not_replicated > 0, "{answers:?}");
    }
}

/// The same with `async`: what the cut-off master admitted is lost when its replica takes
/// over, and every key is answered allowed more than L times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_admissions_of_a_cut_off_master_are_lost_when_it_is_killed() {
    let _serial = SERIAL.lock().await;
    let answers = cut_off_then_killed(Durability::Async, "durability-async").await;
    for answers in &answers {
        assert!(answers.allowed > LIMIT, "{answers:?}");
        assert_eq!(answers.not_replicated, 0, "{answers:?}");
    }
}

/// A master and its replica.
fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start(&[]);
    let port = master.port.to_string();
    let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &port]);
    wait_for("the replica's connection", || master.online_replicas() == 1);
    (master, replica)
}

/// A master whose replica stopped: checks that admit fail as not replicated (counted),
/// the failure policy answers them, and checks that record nothing still answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_replica_a_master_fails_admissions_and_the_policy_answers() {
    let _serial = SERIAL.lock().await;
    let (master, replica) = master_and_replica();
    // Long enough that a replica on a loaded machine acknowledges the admissions made
    // while it is there: a late acknowledgement is what the test takes for its absence.
    let store = store(
        &master.url(),
        "durability-alone",
        Durability::Replicated,
        Duration::from_secs(2),
    )
    .await
    .expect("connect");
    let replication = store.replication();
    assert_eq!(replication.nodes.len(), 1);
    assert_eq!(replication.nodes[0].replicas, Ok(1));
    assert_eq!(
        replication.nodes[0]
            .min_replicas
            .as_ref()
            .map(|m| m.to_write),
        Ok(0)
    );
    let limiter = Limiter::with_config(
        store,
        LimiterConfig {
            on_store_error: FailurePolicy::Deny,
            ..LimiterConfig::default()
        },
    );
    let rule = rule();
    let direct = decide(limiter.store(), &rule, "k", 1)
        .await
        .expect("an admission the replica acknowledged");
    assert!(direct.decision.allowed);
    let admitted = answer(&limiter, &rule, "k").await;
    assert_eq!(admitted.decided_by, DecidedBy::Store);
    assert!(admitted.decision.allowed);

    replica.shutdown();
    wait_for("the replica's disconnection", || {
        master.online_replicas() == 0
    });
    let direct = decide(limiter.store(), &rule, "k", 1).await.unwrap_err();
    assert!(
        matches!(
            direct,
            StoreError::NotReplicated {
                acknowledged: 0,
                ..
            }
        ),
        "{direct:?}"
    );
    assert_eq!(direct.kind(), "not_replicated");
    assert!(
        direct.to_string().contains("not replicated within 1s"),
        "{direct}"
    );
    assert_eq!(limiter.store().script_calls().not_replicated, 1);
    let answered = answer(&limiter, &rule, "k").await;
    assert_eq!(
        answered.decided_by,
        DecidedBy::Fallback(FailurePolicy::Deny)
    );
    assert!(!answered.decision.allowed);
    // A peek records nothing: nothing to replicate, so the store answers it.
    let peek = decide(limiter.store(), &rule, "k", 0)
        .await
        .expect("a peek");
    assert_eq!(peek.decided_by, DecidedBy::Store);
}

/// `replicated` on a server without a replica is refused at connect, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_without_a_replica_is_refused_at_connect() {
    let _serial = SERIAL.lock().await;
    let alone = RedisServer::start(&[]);
    let refused = store(
        &alone.url(),
        "durability-refused",
        Durability::Replicated,
        CUT_OFF_TIMEOUT,
    )
    .await
    .unwrap_err();
    let said = refused.to_string();
    assert!(said.contains("store durability replicated"), "{said}");
    assert!(said.contains("has no replica online"), "{said}");
    store(
        &alone.url(),
        "durability-refused",
        Durability::Async,
        CUT_OFF_TIMEOUT,
    )
    .await
    .expect("async needs no replica");
}
