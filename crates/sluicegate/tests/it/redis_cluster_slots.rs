//! A check whose limits live in several hash slots of a real three-master Redis Cluster:
//! one call, all-or-nothing, when its slots share a node; slot by slot with a give-back
//! when they do not; and nothing lost or doubled while one of its slots migrates.

#![cfg(feature = "redis")]

use crate::redis_trace::stores;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sluicegate::internals::identity_slot;
use sluicegate::redis::Scripting;
use sluicegate::{Algorithm, Check, Limit, Outcome, RedisStore, Rule, RuleSpec, Store, StoreError};
use sluicegate_test_support::{RedisCluster, RedisServer, cmd};
use stores::store_at;
use tokio::sync::Mutex;

/// The tests run one at a time: they count a node's script calls (`INFO commandstats`),
/// and one moves a slot.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// This module's own cluster, shared by its tests: they count the script calls each node
/// runs and move a slot, which no other module's checks may disturb.
fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}

/// The master serving `slot` in the shared cluster.
fn owner_of(slot: u16) -> &'static RedisServer {
    cluster().master_of(slot)
}

/// The first `count` keys named `{stem}:{i}` whose identity's slot passes `fits`.
fn keys_where(stem: &str, count: usize, fits: impl Fn(u16) -> bool) -> Vec<String> {
    (0..)
        .map(|i| format!("{stem}:{i}"))
        .filter(|key| fits(identity_slot(key)))
        .take(count)
        .collect()
}

/// A key named `{stem}:{i}` whose identity is in another slot than `key`'s, on the same
/// master (`same_node`) or on another.
fn key_beside(key: &str, stem: &str, same_node: bool) -> String {
    let (slot, owner) = (identity_slot(key), owner_of(identity_slot(key)).port);
    keys_where(stem, 1, |other| {
        other != slot && (owner_of(other).port == owner) == same_node
    })
    .remove(0)
}

/// Script calls (`FCALL`, `EVALSHA`, `EVAL`) `node` has run, by its `INFO commandstats`.
fn script_calls_on(node: &RedisServer) -> u64 {
    let info: String = node
        .query(cmd("INFO").arg("commandstats"))
        .expect("INFO commandstats");
    info.lines()
        .filter(|line| {
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|name| line.starts_with(name))
        })
        .filter_map(|line| line.split(['=', ',']).nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Gives the store time (bounded) to read the slot map, which it does after its first
/// calls: peeks of `limits` (which record nothing) until one is a single call, for two
/// seconds at most. What a test asserts after it holds either way.
async fn until_routed(store: &RedisStore, limits: &[Limit<'_>]) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let before = store.script_calls().calls;
        store.check(&Check::new(limits, 0)).await.expect("a peek");
        if store.script_calls().calls == before + 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A per-user sliding log of 5 an hour and a global fixed window of 1 an hour.
fn user_and_global() -> (Rule, Rule) {
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
    (per_user, global)
}

/// One check of both rules admitted at `t0`, then three refused by the global rule: what
/// every refused check answers, whichever path it took, and what the user's limit holds
/// after.
async fn admit_then_refuse(store: &RedisStore, limits: &[Limit<'_>; 2], t0: u64) {
    let at = |t| Check {
        at: Some(Duration::from_micros(t)),
        ..Check::new(limits, 1)
    };
    assert!(store.check(&at(t0)).await.unwrap().decision.allowed);
    for i in 1..4 {
        let refused = store.check(&at(t0 + i)).await.unwrap();
        assert!(!refused.decision.allowed);
        assert!(refused.limits()[0].allowed);
        assert_eq!(refused.limits()[0].remaining, 4);
        assert!(!refused.limits()[1].allowed);
    }
    let alone = [limits[0]];
    let peek = Check {
        at: Some(Duration::from_micros(t0 + 10)),
        ..Check::new(&alone, 0)
    };
    assert_eq!(store.check(&peek).await.unwrap().decision.remaining, 3);
}

/// Two rules whose keys are in different slots of one master: each check is one script
/// call on that master, and a refused one takes nothing, so gives nothing back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_of_two_slots_of_one_node_is_one_call() {
    let _serial = SERIAL.lock().await;
    let store = store_at(&cluster().url(), "one-node", Scripting::Auto).await;
    let (per_user, global) = user_and_global();
    let user = "alice";
    let everyone = key_beside(user, "everyone", true);
    let limits = [limit(&per_user, user), limit(&global, &everyone)];
    until_routed(&store, &limits).await;
    let node = owner_of(identity_slot(user));
    let (calls, on_node) = (store.script_calls(), script_calls_on(node));
    admit_then_refuse(&store, &limits, 1_700_000_000_000_000).await;
    // Four checks and the peek: five calls, every one run on the node.
    let after = store.script_calls();
    assert_eq!(
        (after.calls - calls.calls, after.checks - calls.checks),
        (5, 5)
    );
    assert_eq!(script_calls_on(node) - on_node, 5);
}

/// The same on two masters: slot by slot, each refused check gives its first slot's unit
/// back; the decisions are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_of_slots_on_two_nodes_gives_back() {
    let _serial = SERIAL.lock().await;
    let store = store_at(&cluster().url(), "two-nodes", Scripting::Auto).await;
    let (per_user, global) = user_and_global();
    let user = "alice";
    let everyone = key_beside(user, "everyone", false);
    let limits = [limit(&per_user, user), limit(&global, &everyone)];
    // The map read, by a pair of the user's master.
    let beside = key_beside(user, "beside", true);
    until_routed(&store, &[limits[0], limit(&global, &beside)]).await;
    let calls = store.script_calls().calls;
    admit_then_refuse(&store, &limits, 1_700_000_000_000_000).await;
    // The admission: two calls. Each refusal: two checks, a give-back and a dry run of the
    // first slot. The peek: one.
    assert_eq!(store.script_calls().calls - calls, 2 + 3 * 4 + 1);
}

/// While checks of a user's limit and a global one on the same master are refused by the
/// global, again and again, a reader of the user's limit alone never sees a unit of it
/// taken: no check takes it and gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_check_of_one_node_never_shows_units_taken() {
    let _serial = SERIAL.lock().await;
    let store = store_at(&cluster().url(), "never-taken", Scripting::Auto).await;
    let (per_user, global) = user_and_global();
    let user = "bob";
    let everyone = key_beside(user, "everyone", true);
    let limits = [limit(&per_user, user), limit(&global, &everyone)];
    until_routed(&store, &limits).await;
    // The global limit's one unit, taken alone.
    let global_alone = [limits[1]];
    assert!(
        store
            .check(&Check::new(&global_alone, 1))
            .await
            .unwrap()
            .decision
            .allowed
    );
    let refusing = {
        let (store, per_user, global, everyone) = (
            store.clone(),
            per_user.clone(),
            global.clone(),
            everyone.clone(),
        );
        tokio::spawn(async move {
            let limits = [limit(&per_user, user), limit(&global, &everyone)];
            for _ in 0..300 {
                let outcome: Outcome = store.check(&Check::new(&limits, 1)).await.unwrap();
                assert!(!outcome.decision.allowed);
            }
        })
    };
    let user_alone = [limits[0]];
    let mut peeks = 0;
    while !refusing.is_finished() {
        let seen = store.check(&Check::new(&user_alone, 0)).await.unwrap();
        assert_eq!(
            seen.decision.remaining, 4,
            "a refused check's unit was seen taken"
        );
        peeks += 1;
    }
    refusing.await.unwrap();
    assert!(peeks > 10, "the reader ran {peeks} times only");
}

/// The user's slot moves to another master while checks of a user's limit and a global
/// one (another slot of the user's master) are in flight: a check meets its user's key
/// on the old master (one call there), gone from it (the call writes nothing and the
/// check runs slot by slot), then on the new master (slot by slot: two masters). Every
/// check is answered and admitted, and each limit holds exactly what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_under_checks_of_two_slots_loses_and_doubles_nothing() {
    let _serial = SERIAL.lock().await;
    let store = store_at(&cluster().url(), "migration", Scripting::Auto).await;
    let per_user = Rule::new(
        "user",
        &RuleSpec::new(Algorithm::SlidingLog, 1000, Duration::from_secs(3600)),
    )
    .unwrap();
    let global = Rule::new(
        "global",
        &RuleSpec::new(Algorithm::SlidingLog, 100_000, Duration::from_secs(3600)),
    )
    .unwrap();
    let first = "traveller";
    let slot = identity_slot(first);
    let users = keys_where(first, 4, |other| other == slot);
    let everyone = key_beside(first, "everyone", true);
    let traffic = Arc::new(Traffic {
        store: store.clone(),
        per_user: per_user.clone(),
        global: global.clone(),
        users: users.clone(),
        everyone: everyone.clone(),
    });
    // Seeded, so that the migration has keys to move while checks arrive: each check one
    // script run on the user's master.
    until_routed(
        &store,
        &[limit(&per_user, &users[0]), limit(&global, &everyone)],
    )
    .await;
    let before = store.script_calls().checks;
    let errors = traffic.round().await;
    assert!(errors.is_empty(), "{errors:?}");
    let checks_made = users.len() as u64 * PER_ROUND;
    assert_eq!(store.script_calls().checks - before, checks_made);

    // Rounds of checks until the slot has moved; it moves a key at a time, each once
    // another round has ended, so that checks meet every stage of the migration.
    let moved = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(1));
    let checks = tokio::spawn({
        let (moved, rounds, traffic) = (moved.clone(), rounds.clone(), traffic.clone());
        async move {
            let mut errors = Vec::new();
            while !moved.load(Ordering::SeqCst) {
                errors.extend(traffic.round().await);
                rounds.fetch_add(1, Ordering::SeqCst);
            }
            errors
        }
    });
    let source = owner_of(slot);
    let target = cluster()
        .current_masters()
        .into_iter()
        .find(|m| m.port != source.port)
        .unwrap();
    let migration = tokio::task::spawn_blocking({
        let (moved, rounds) = (moved.clone(), rounds.clone());
        move || {
            cluster().move_slot(slot, source, target, || {
                let since = rounds.load(Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(10);
                while rounds.load(Ordering::SeqCst) < since + 2 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            moved.store(true, Ordering::SeqCst);
        }
    });
    migration.await.unwrap();
    let errors = checks.await.unwrap();
    assert!(
        errors.is_empty(),
        "checks failed during the migration: {errors:?}"
    );
    assert_eq!(owner_of(slot).port, target.port);
    // On two masters now: once the map is read again (a round finds it out of date, and
    // readings are at least the store's refresh gap apart), each check is two calls, one
    // per slot. Rounds until one costs that, then one more that must cost it too.
    let mut settling = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let before = store.script_calls().checks;
        let errors = traffic.round().await;
        assert!(errors.is_empty(), "{errors:?}");
        settling += 1;
        if store.script_calls().checks - before == 2 * checks_made {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot map was not read again within 5 s of the migration"
        );
    }
    let before = store.script_calls().checks;
    let errors = traffic.round().await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(store.script_calls().checks - before, 2 * checks_made);

    let admitted = (rounds.load(Ordering::SeqCst) + settling + 1) * PER_ROUND;
    let remaining = |rule: &Rule, key: &str| {
        let (store, rule, key) = (store.clone(), rule.clone(), key.to_owned());
        async move {
            let alone = [limit(&rule, &key)];
            let peek = store.check(&Check::new(&alone, 0)).await.expect("a peek");
            peek.decision.remaining
        }
    };
    for user in &users {
        assert_eq!(
            remaining(&per_user, user).await,
            1000 - admitted - 1,
            "{user}"
        );
    }
    let everyone_admitted = admitted * users.len() as u64;
    assert_eq!(
        remaining(&global, &everyone).await,
        100_000 - everyone_admitted - 1
    );
}

/// Checks of a user's limit and a global one, for several users.
struct Traffic {
    store: RedisStore,
    per_user: Rule,
    global: Rule,
    users: Vec<String>,
    everyone: String,
}

/// Checks of each user in a round.
const PER_ROUND: u64 = 4;

impl Traffic {
    /// [`PER_ROUND`] checks of each user, all in flight at once: each must be admitted;
    /// the errors.
    async fn round(self: &Arc<Self>) -> Vec<StoreError> {
        let mut tasks = Vec::new();
        for user in 0..self.users.len() {
            for _ in 0..PER_ROUND {
                let traffic = Arc::clone(self);
                tasks.push(tokio::spawn(async move {
                    let limits = [
                        limit(&traffic.per_user, &traffic.users[user]),
                        limit(&traffic.global, &traffic.everyone),
                    ];
                    traffic.store.check(&Check::new(&limits, 1)).await
                }));
            }
        }
        let mut errors = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Ok(outcome) => assert!(outcome.decision.allowed),
                Err(e) => errors.push(e),
            }
        }
        errors
    }
}

/// `rule` on `key`.
fn limit<'a>(rule: &'a Rule, key: &'a str) -> Limit<'a> {
    Limit { rule, key }
}
