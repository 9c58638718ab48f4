//! Checks in flight together on a real three-master Redis Cluster share script calls by
//! hash slot, decided exactly as one by one, through a slot migration too.

#![cfg(feature = "redis")]

use crate::redis_trace::stores;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluicegate::internals::identity_slot;
use sluicegate::redis::Scripting;
use sluicegate::{
    Algorithm, Charge, Check, Limit, Outcome, RedisStore, RedisStoreConfig, Rule, RuleSpec, Store,
    StoreError,
};
use sluicegate_test_support::{RedisCluster, RedisServer, cmd};
use stores::store_at;

/// This module's own cluster, shared by its tests: they move slots under checks in flight,
/// which no other module's checks may meet.
fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}

async fn check_one(
    store: &RedisStore,
    rule: &Rule,
    key: &str,
    cost: u64,
) -> Result<Outcome, StoreError> {
    store.check(&Check::new(&[Limit { rule, key }], cost)).await
}

/// `count` checks of one unit on each of `keys`, all in flight at once: each key's
/// admissions, and every error. With `request_ids`, the checks on every other key carry
/// request ids of their own (each a new one), which gives them two more keys.
async fn at_once(
    store: &RedisStore,
    rule: &Rule,
    keys: &[String],
    count: usize,
    request_ids: bool,
) -> (Vec<u64>, Vec<StoreError>) {
    at_once_in(store, rule, keys, count, request_ids, Charge::Check).await
}

/// [`at_once`] in mode `charge`: for a report, which is never refused, each key's reports
/// answered.
async fn at_once_in(
    store: &RedisStore,
    rule: &Rule,
    keys: &[String],
    count: usize,
    request_ids: bool,
    charge: Charge,
) -> (Vec<u64>, Vec<StoreError>) {
    static REQUESTS: AtomicU64 = AtomicU64::new(0);
    let mut tasks = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        for _ in 0..count {
            let (store, rule, key) = (store.clone(), rule.clone(), key.clone());
            let request_id = (request_ids && k % 2 == 1)
                .then(|| format!("request-{}", REQUESTS.fetch_add(1, Ordering::Relaxed)));
            tasks.push((
                k,
                tokio::spawn(async move {
                    let limits = [Limit {
                        rule: &rule,
                        key: &key,
                    }];
                    let check = Check {
                        request_id: request_id.as_deref(),
                        charge,
                        ..Check::new(&limits, 1)
                    };
                    store.check(&check).await
                }),
            ));
        }
    }
    let mut admitted = vec![0; keys.len()];
    let mut errors = Vec::new();
    for (k, task) in tasks {
        match task.await.unwrap() {
            Ok(outcome) => {
                admitted[k] += u64::from(outcome.decision.allowed || !charge.may_refuse())
            }
            Err(e) => errors.push(e),
        }
    }
    (admitted, errors)
}

/// What a check of nothing says is left of `key`: it answers as a check of one unit
/// would, so one less than is free.
async fn remaining(store: &RedisStore, rule: &Rule, key: &str) -> u64 {
    check_one(store, rule, key, 0)
        .await
        .expect("peek")
        .decision
        .remaining
}

/// Checks on one identity (one slot) in flight together share calls, and exactly the
/// limit is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_one_slot_share_a_call() {
    let store = store_at(&cluster().url(), "one-slot", Scripting::Auto).await;
    let rule = Rule::new(
        "b",
        &RuleSpec::new(Algorithm::SlidingLog, 50, Duration::from_secs(3600)),
    )
    .unwrap();
    let before = store.script_calls();
    let (admitted, errors) = at_once(&store, &rule, &["alice".to_owned()], 200, false).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(admitted, [50]);
    let after = store.script_calls();
    let (calls, checks) = (after.calls - before.calls, after.checks - before.checks);
    assert_eq!(checks, 200);
    assert!(
        calls < checks / 2,
        "{checks} checks of one slot took {calls} calls"
    );
    assert_eq!(remaining(&store, &rule, "alice").await, 0);
}

/// Checks on identities of many slots, in flight together: each is decided as if alone
/// (each key admits exactly its limit), whichever slot and master it lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_many_slots_are_each_decided_on_their_own() {
    let store = store_at(&cluster().url(), "many-slots", Scripting::Auto).await;
    let rule = Rule::new(
        "m",
        &RuleSpec::new(Algorithm::TokenBucket, 7, Duration::from_secs(3600)),
    )
    .unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("user:{i}")).collect();
    let (admitted, errors) = at_once(&store, &rule, &keys, 10, true).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(admitted, vec![7; keys.len()]);
}

/// Checks of many identities (each its own slot, nearly always) in flight together share
/// calls by node: routed by one key, the others passed as arguments, each decided alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_one_node_share_a_call_across_slots() {
    let store = store_at(&cluster().url(), "by-node", Scripting::Auto).await;
    let rule = Rule::new(
        "n",
        &RuleSpec::new(Algorithm::FixedWindow, 1, Duration::from_secs(86_400)),
    )
    .unwrap();
    identities_share_calls(&store, &rule, true).await;
}

/// A cluster of one node names itself in `CLUSTER SLOTS` by an empty host (it knows no
/// address of its own: Redis' documentation of the command says to read it as the node that
/// answered). Its checks are routed to it, share calls across slots, and none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_one_node_decides_every_check_in_shared_calls() {
    let cluster = RedisCluster::start_one_node();
    let store = store_at(&cluster.url(), "one-node", Scripting::Auto).await;
    let rule = Rule::new(
        "o",
        &RuleSpec::new(Algorithm::SlidingLog, 1, Duration::from_secs(86_400)),
    )
    .unwrap();
    // Each sent once: none turned away by an address the node does not answer at.
    assert_eq!(identities_share_calls(&store, &rule, false).await, 300);
}

/// One check of one unit on each of 300 identities under `rule` (a limit of one), all in
/// flight at once (every other with request ids, if asked): each is admitted, in fewer
/// calls than half the checks sent; then, each answered alone, a second round refuses every
/// one. Returns the checks the first round sent (more than 300 if some were sent again).
async fn identities_share_calls(store: &RedisStore, rule: &Rule, request_ids: bool) -> u64 {
    let keys: Vec<String> = (0..300).map(|i| format!("visitor:{i}")).collect();
    let before = store.script_calls();
    let (admitted, errors) = at_once(store, rule, &keys, 1, request_ids).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(admitted, vec![1; keys.len()]);
    let after = store.script_calls();
    let (calls, checks) = (after.calls - before.calls, after.checks - before.checks);
    assert!(
        calls < checks / 2,
        "{checks} checks of {} identities took {calls} calls",
        keys.len()
    );
    let (admitted, errors) = at_once(store, rule, &keys, 1, request_ids).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(admitted, vec![0; keys.len()]);
    checks
}

/// Keys whose identities share the slot of `first`.
fn keys_of_one_slot(first: &str, count: usize) -> Vec<String> {
    let slot = identity_slot(first);
    (0..)
        .map(|i| format!("{first}:{i}"))
        .filter(|key| identity_slot(key) == slot)
        .take(count)
        .collect()
}

/// A slot moves from one master to another (`CLUSTER SETSLOT … IMPORTING/MIGRATING`,
/// `MIGRATE` key by key, then `SETSLOT … NODE`) while checks on several of its identities
/// are in flight: every check is answered, none is lost or counted twice, and afterwards
/// every identity's state is on the new master and shows exactly what was admitted. (No
/// request ids: a check of several keys, some not yet written, is refused with `TRYAGAIN`
/// by Redis for as long as its slot migrates.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_under_checks_loses_and_doubles_nothing() {
    let store = store_at(&cluster().url(), "migration", Scripting::Auto).await;
    let rule = Rule::new(
        "g",
        &RuleSpec::new(Algorithm::SlidingLog, 1000, Duration::from_secs(3600)),
    )
    .unwrap();
    let keys = keys_of_one_slot("migrant", 8);
    let (admitted, errors) = migrate_under(&store, &rule, &keys, Charge::Check).await;
    assert!(
        errors.is_empty(),
        "checks failed during the migration: {errors:?}"
    );
    for (key, admitted) in keys.iter().zip(admitted) {
        assert_eq!(admitted, 1 + 30 * 4, "{key}");
        assert_eq!(
            remaining(&store, &rule, key).await,
            1000 - admitted - 1,
            "{key}"
        );
    }
}

/// The same migration under reports, which are never refused and write into debt: a
/// routed report reads every key before it writes, so a report that meets a key gone from
/// its node is sent again and counted once. A token bucket of one unit an hour holds the
/// count: its backlog is one emission interval per report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_under_reports_loses_and_doubles_nothing() {
    let store = store_at(&cluster().url(), "migration-reports", Scripting::Auto).await;
    let rule = Rule::new(
        "r",
        &RuleSpec::new(Algorithm::TokenBucket, 1, Duration::from_secs(3600)),
    )
    .unwrap();
    let keys = keys_of_one_slot("reporter", 8);
    let (reported, errors) = migrate_under(&store, &rule, &keys, Charge::Report).await;
    assert!(
        errors.is_empty(),
        "reports failed during the migration: {errors:?}"
    );
    for (key, reported) in keys.iter().zip(reported) {
        assert_eq!(reported, 1 + 30 * 4, "{key}");
        assert_eq!(units_held(&store, &rule, key).await, reported, "{key}");
    }
}

/// Reports on many identities (each its own slot, nearly always), in flight together,
/// share calls by node (routed by one key, the others passed as arguments) and each is
/// counted in its own state: three reports on each key, half of them with request ids, put
/// three units of debt on a token bucket whose burst is two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_of_one_node_share_a_call_and_each_counts() {
    let store = store_at(&cluster().url(), "reports-by-node", Scripting::Auto).await;
    let rule = Rule::new(
        "p",
        &RuleSpec::new(Algorithm::TokenBucket, 2, Duration::from_secs(3600)),
    )
    .unwrap();
    let keys: Vec<String> = (0..100).map(|i| format!("spender:{i}")).collect();
    let before = store.script_calls();
    let (reported, errors) = at_once_in(&store, &rule, &keys, 3, true, Charge::Report).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(reported, vec![3; keys.len()]);
    let after = store.script_calls();
    let (calls, checks) = (after.calls - before.calls, after.checks - before.checks);
    assert!(calls < checks / 2, "{checks} reports took {calls} calls");
    for key in &keys {
        assert_eq!(units_held(&store, &rule, key).await, 3, "{key}");
    }
}

/// How many units a token bucket holds for `key`: its backlog (the standing of a report of
/// nothing says how long until the key is empty) in emission intervals, rounded up.
async fn units_held(store: &RedisStore, rule: &Rule, key: &str) -> u64 {
    let limits = [Limit { rule, key }];
    let check = Check {
        charge: Charge::Report,
        ..Check::new(&limits, 0)
    };
    let standing = store.check(&check).await.expect("a report of nothing");
    let units = standing
        .decision
        .reset_after()
        .as_micros()
        .div_ceil(rule.emission_interval().as_micros());
    u64::try_from(units).expect("a bucket holds fewer than 2^64 units")
}

/// Moves the slot of `keys` to another master while 30 rounds of 4 checks of one unit in
/// mode `charge` on each key are in flight (after one each to seed them): each key's
/// admissions (for reports: reports answered), seed included, and every error. Afterwards
/// every key is on the new master.
async fn migrate_under(
    store: &RedisStore,
    rule: &Rule,
    keys: &[String],
    charge: Charge,
) -> (Vec<u64>, Vec<StoreError>) {
    let slot = identity_slot(&keys[0]);
    // Seed every key, so that the migration has keys to move while checks arrive.
    let (seeded, errors) = at_once_in(store, rule, keys, 1, false, charge).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(seeded, vec![1; keys.len()]);
    let cluster = cluster();
    let masters = cluster.current_masters();
    let owner_of = |key: &str| -> &RedisServer {
        let state = store.state_key(rule, key);
        masters
            .iter()
            .copied()
            // A master that no longer owns the slot answers MOVED.
            .find(|m| {
                m.query::<u64>(cmd("EXISTS").arg(&state))
                    .is_ok_and(|n| n == 1)
            })
            .expect("a master holds the key")
    };
    let source = owner_of(&keys[0]);
    let target = masters
        .iter()
        .copied()
        .find(|m| m.port != source.port)
        .unwrap();

    let checks = {
        let (store, rule, keys) = (store.clone(), rule.clone(), keys.to_vec());
        tokio::spawn(async move {
            let mut admitted = vec![1; keys.len()];
            let mut errors = Vec::new();
            for _ in 0..30 {
                let (more, failed) = at_once_in(&store, &rule, &keys, 4, false, charge).await;
                for (total, more) in admitted.iter_mut().zip(more) {
                    *total += more;
                }
                errors.extend(failed);
            }
            (admitted, errors)
        })
    };
    // Moves the slot's keys one at a time, each once the checks have made a few more calls,
    // so that checks meet every stage of the migration.
    let checks_move_on = |since: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.script_calls().calls < since + 5 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    cluster.move_slot(slot, source, target, || {
        checks_move_on(store.script_calls().calls)
    });
    let (admitted, errors) = checks.await.unwrap();
    for key in keys {
        assert_eq!(owner_of(key).port, target.port, "{key} did not move");
    }
    (admitted, errors)
}

/// `count` keys `{stem}:{i}` whose identities live on the master at `port` of `cluster`
/// (`on` true), or on the other masters (`on` false).
fn keys_by_node(
    cluster: &RedisCluster,
    stem: &str,
    port: u16,
    on: bool,
    count: usize,
) -> Vec<String> {
    (0..)
        .map(|i| format!("{stem}:{i}"))
        .filter(|key| (cluster.master_of(identity_slot(key)).port == port) == on)
        .take(count)
        .collect()
}

/// Under load, the checks of one node's many slots gather into calls as a single
/// server's do: its calls in flight are bounded per node, so 64 checks kept in flight on
/// keys of one node (each its own slot, nearly always) go in calls of many checks each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_one_node_gather_under_load() {
    const IN_FLIGHT: usize = 64;
    const ROUNDS: usize = 25;
    let cluster = cluster();
    let store = store_at(&cluster.url(), "node-load", Scripting::Auto).await;
    let rule = Rule::new(
        "l",
        &RuleSpec::new(Algorithm::FixedWindow, 1_000_000, Duration::from_secs(3600)),
    )
    .unwrap();
    let node = cluster.master_of(identity_slot("loaded")).port;
    let keys = keys_by_node(cluster, "loaded", node, true, IN_FLIGHT);
    let before = store.script_calls();
    let tasks: Vec<_> = keys
        .into_iter()
        .map(|key| {
            let (store, rule) = (store.clone(), rule.clone());
            tokio::spawn(async move {
                let limits = [Limit {
                    rule: &rule,
                    key: &key,
                }];
                for _ in 0..ROUNDS {
                    let outcome = store.check(&Check::new(&limits, 1)).await.expect("a check");
                    assert!(outcome.decision.allowed, "{key}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let after = store.script_calls();
    let (calls, checks) = (after.calls - before.calls, after.checks - before.checks);
    assert_eq!(checks, (IN_FLIGHT * ROUNDS) as u64);
    assert!(
        calls * 8 <= checks,
        "{checks} checks of one node, {IN_FLIGHT} in flight, took {calls} calls"
    );
}

/// One master stops answering (`CLIENT PAUSE`) while checks of every master are in flight:
/// its own checks time out, and the other masters' checks are decided throughout, none of
/// them held up behind its calls; once it answers again, its checks are decided again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_node_holds_up_only_its_own_checks() {
    const TIMEOUT: Duration = Duration::from_millis(500);
    const PAUSE: Duration = Duration::from_secs(3);
    // Shorter than the pause by more than a timeout: every check of the stalled node is
    // sent and answered while it is paused.
    const LOAD: Duration = Duration::from_secs(2);
    let cluster = RedisCluster::start(3, 0);
    let mut config = RedisStoreConfig::new(&cluster.url());
    config.prefix = stores::prefix("stalled-node");
    config.timeout = TIMEOUT;
    let store = RedisStore::connect(config).await.expect("connect");
    let rule = Rule::new(
        "s",
        &RuleSpec::new(Algorithm::FixedWindow, 1_000_000, Duration::from_secs(3600)),
    )
    .unwrap();
    let victim = cluster.master_of(identity_slot("stalled"));
    let stalled_keys = keys_by_node(&cluster, "stalled", victim.port, true, 8);
    let healthy_keys = keys_by_node(&cluster, "healthy", victim.port, false, 16);
    let stalled_key = stalled_keys[0].clone();
    for key in stalled_keys.iter().chain(&healthy_keys) {
        check_one(&store, &rule, key, 1)
            .await
            .expect("before the pause");
    }

    victim
        .query::<()>(
            cmd("CLIENT")
                .arg("PAUSE")
                .arg(PAUSE.as_millis().to_string())
                .arg("ALL"),
        )
        .expect("CLIENT PAUSE");
    let load_ends = tokio::time::Instant::now() + LOAD;
    // The stalled node's checks keep coming, one per key every 10 ms, none awaited.
    let stalled = {
        let (store, rule) = (store.clone(), rule.clone());
        tokio::spawn(async move {
            let mut pace = tokio::time::interval(Duration::from_millis(10));
            let mut checks = Vec::new();
            while tokio::time::Instant::now() < load_ends {
                pace.tick().await;
                for key in &stalled_keys {
                    let (store, rule, key) = (store.clone(), rule.clone(), key.clone());
                    checks.push(tokio::spawn(async move {
                        check_one(&store, &rule, &key, 1).await
                    }));
                }
            }
            let mut answers = Vec::new();
            for check in checks {
                answers.push(check.await.unwrap());
            }
            answers
        })
    };
    let mut healthy_checks = 0;
    while tokio::time::Instant::now() < load_ends {
        let (admitted, errors) = at_once(&store, &rule, &healthy_keys, 1, false).await;
        assert!(
            errors.is_empty(),
            "checks of healthy masters failed while another stalled: {errors:?}"
        );
        assert_eq!(admitted, vec![1; healthy_keys.len()]);
        healthy_checks += healthy_keys.len();
    }
    let stalled = stalled.await.unwrap();
    assert!(
        healthy_checks >= 10 * healthy_keys.len(),
        "only {healthy_checks} checks of healthy masters were decided in {LOAD:?}"
    );
    assert!(!stalled.is_empty());
    for answer in &stalled {
        assert!(
            matches!(answer, Err(StoreError::Timeout { .. })),
            "a check of the stalled master: {answer:?}"
        );
    }

    // Once the pause is over, the stalled master's checks are decided again.
    let deadline = tokio::time::Instant::now() + PAUSE + Duration::from_secs(10);
    loop {
        match check_one(&store, &rule, &stalled_key, 1).await {
            Ok(outcome) => {
                assert!(outcome.decision.allowed);
                break;
            }
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "the master that stalled is still not answering: {e}"
            ),
        }
    }
}
