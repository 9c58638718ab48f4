//! Redis losing what the store wrote, against real redis-server processes: a restart
//! without persistence, a `FLUSHALL` and a failover that lost writes are each reported
//! (reason, node, count) at the first check of the node after them, and bump the
//! generation of that node's keys only; a restart with persistence and a clean `CLUSTER
//! FAILOVER` are not losses.

#![cfg(feature = "redis")]

use std::process::Command;
use std::time::Duration;

use sluicegate::internals::identity_slot;
use sluicegate::redis::{LossReason, LostState};
use sluicegate::{Algorithm, Check, Limit, RedisStore, RedisStoreConfig, Rule, RuleSpec, Store};
use sluicegate_test_support::{RedisCluster, RedisServer, cmd};
use tokio::time::Instant;

/// The check period of these tests: short, so that a test waits little for the next.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// How long a test waits for the store's check to see what a real process did: many
/// periods, for a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);

fn config(url: &str) -> RedisStoreConfig {
    let mut config = RedisStoreConfig::new(url);
    config.prefix = "lost:".to_owned();
    config.timeout = Duration::from_millis(500);
    config.lost_state_check_interval = CHECK_EVERY;
    config
}

fn rule() -> Rule {
    Rule::new(
        "per-user",
        &RuleSpec::new(Algorithm::SlidingLog, 1_000, Duration::from_secs(60)),
    )
    .unwrap()
}

/// The generation the store answers for `key` under `rule`.
fn generation(store: &RedisStore, rule: &Rule, key: &str) -> u64 {
    let limits = [Limit { rule, key }];
    store.lost_state_generation(&Check::new(&limits, 1))
}

/// Admits `n` units of `key` under `rule`.
async fn admit(store: &RedisStore, rule: &Rule, key: &str, n: usize) {
    let limits = [Limit { rule, key }];
    for _ in 0..n {
        let outcome = store.check(&Check::new(&limits, 1)).await.unwrap();
        assert!(outcome.decision.allowed);
    }
}

/// Waits until `done` holds of what the store reports, for at most [`PATIENCE`].
async fn until(store: &RedisStore, what: &str, done: impl Fn(&LostState) -> bool) -> LostState {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let state = store.lost_state();
        if done(&state) {
            return state;
        }
        assert!(Instant::now() < deadline, "{what}: {state:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The run_id the store last read of `node`.
fn run_id_of(state: &LostState, node: &str) -> Option<String> {
    state
        .nodes
        .iter()
        .find(|watched| watched.node == node)
        .map(|watched| watched.run_id.clone())
}

fn run_id(server: &RedisServer) -> String {
    let info: String = server.query(cmd("INFO").arg("server")).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .unwrap()
        .trim()
        .to_owned()
}

/// Restarts `server` (same port, same directory) with `extra` options, after a stop that
/// saves nothing; the new process.
fn restart(server: RedisServer, extra: &[&str]) -> RedisServer {
    server.shutdown();
    server.restart(extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_is_a_loss_seen_at_the_first_check_after_it() {
    let server = RedisServer::start(&[]);
    let store = RedisStore::connect(config(&server.url())).await.unwrap();
    let rule = rule();
    admit(&store, &rule, "alice", 5).await;
    assert_eq!(generation(&store, &rule, "alice"), 0);
    assert_eq!(store.lost_state().losses, vec![]);

    let server = restart(server, &[]);
    let new_run_id = run_id(&server);
    // The first check that reads the new process reports the loss: within one period.
    let state = until(&store, "the new process read", |state| {
        run_id_of(state, &server.url()).as_deref() == Some(new_run_id.as_str())
    })
    .await;
    assert_eq!(state.losses.len(), 1, "{state:?}");
    let loss = &state.losses[0];
    assert_eq!(
        (loss.node.as_str(), loss.reason, loss.count),
        (server.url().as_str(), LossReason::Restarted, 1)
    );
    assert!(
        loss.detail.contains("restarted without its data"),
        "{loss:?}"
    );
    assert_eq!(generation(&store, &rule, "alice"), 1);
    let warning = state.warning().unwrap();
    assert!(
        warning.contains(&format!("redis at {} lost state", server.url())),
        "{warning}"
    );
    // The marker is written again: the next checks find nothing more.
    admit(&store, &rule, "alice", 1).await;
    let marker: bool = server
        .query(cmd("EXISTS").arg("lost:sluicegate-epoch"))
        .unwrap();
    assert!(marker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_persistence_is_not_a_loss() {
    let persistent = ["--appendonly", "yes", "--appendfsync", "always"];
    let server = RedisServer::start(&persistent);
    let store = RedisStore::connect(config(&server.url())).await.unwrap();
    let rule = rule();
    admit(&store, &rule, "bob", 5).await;

    let server = restart(server, &persistent);
    let new_run_id = run_id(&server);
    let state = until(&store, "the new process read", |state| {
        run_id_of(state, &server.url()).as_deref() == Some(new_run_id.as_str())
    })
    .await;
    assert_eq!(state.losses, vec![], "{state:?}");
    assert_eq!(state.warning(), None);
    assert_eq!(generation(&store, &rule, "bob"), 0);
}

/// Two instances share the marker: whichever checks first after the flush writes a new
/// epoch, and the other, finding that one instead of its own, reports the loss too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_is_a_loss_for_every_instance() {
    let server = RedisServer::start(&[]);
    let first = RedisStore::connect(config(&server.url())).await.unwrap();
    let second = RedisStore::connect(config(&server.url())).await.unwrap();
    let rule = rule();
    admit(&first, &rule, "carol", 3).await;
    server.query::<()>(&cmd("FLUSHALL")).unwrap();
    for store in [&first, &second] {
        let state = until(store, "the flush reported", |state| {
            !state.losses.is_empty()
        })
        .await;
        let loss = &state.losses[0];
        assert_eq!(
            (loss.reason, loss.count),
            (LossReason::Flushed, 1),
            "{state:?}"
        );
        assert!(loss.detail.contains("FLUSHALL"), "{loss:?}");
        assert_eq!(generation(store, &rule, "carol"), 1);
    }
}

/// A cluster of one node names itself by no host in `CLUSTER SLOTS`: it is watched by the
/// address it was reached at, and a flush there is a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_on_a_cluster_of_one_node_is_a_loss() {
    let cluster = RedisCluster::start_one_node();
    let node = &cluster.nodes[0];
    let store = RedisStore::connect(config(&cluster.url())).await.unwrap();
    let rule = rule();
    admit(&store, &rule, "dave", 3).await;
    let name = format!("127.0.0.1:{}", node.port);
    until(&store, "the node read", |state| {
        run_id_of(state, &name).is_some()
    })
    .await;
    node.query::<()>(&cmd("FLUSHALL")).unwrap();
    let state = until(&store, "the flush reported", |state| {
        !state.losses.is_empty()
    })
    .await;
    assert_eq!(state.losses[0].reason, LossReason::Flushed, "{state:?}");
    assert_eq!(generation(&store, &rule, "dave"), 1);
}

/// Runs redis-cli on `port` with `password`: for a server whose new connections need it.
fn cli(port: u16, password: &str, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "-a", password, "--no-auth-warning"])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The replica of `master` in `cluster`.
fn replica_of<'c>(cluster: &'c RedisCluster, master: &RedisServer) -> &'c RedisServer {
    cluster
        .nodes
        .iter()
        .find(|node| {
            node.query::<Vec<String>>(&cmd("ROLE"))
                .is_ok_and(|role| role.get(2) == Some(&master.port.to_string()))
        })
        .expect("every master has a replica")
}

/// A key whose slot `master` serves.
fn key_on(cluster: &RedisCluster, master: &RedisServer) -> String {
    (0..)
        .map(|i| format!("user-{i}"))
        .find(|key| cluster.master_of(identity_slot(key)).port == master.port)
        .unwrap()
}

/// Three masters with a replica each. A clean `CLUSTER FAILOVER` of one master loses
/// nothing and is not reported. Then another master's replica is cut off (the master
/// requires a password it does not have, and its link is killed), admissions are made on
/// the master and read by the store's check, the master is killed and the replica takes
/// over: reported as a failover that lost writes, on that node's keys only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_lost_writes_is_a_loss_and_a_clean_one_is_not() {
    let cluster = RedisCluster::start(3, 1);
    let store = RedisStore::connect(config(&cluster.url())).await.unwrap();
    let rule = rule();
    let masters = cluster.current_masters();
    let (clean, lossy) = (masters[0], masters[1]);
    let (clean_key, lossy_key) = (key_on(&cluster, clean), key_on(&cluster, lossy));
    admit(&store, &rule, &clean_key, 3).await;
    admit(&store, &rule, &lossy_key, 3).await;
    // A manual failover waits for the replica to reach the master's offset, and gives up
    // silently after 5 s: a replica still loading its first copy would never be promoted.
    cluster.await_replicas_of(clean, PATIENCE);

    let promoted = replica_of(&cluster, clean);
    let promoted_run_id = run_id(promoted);
    promoted
        .query::<()>(cmd("CLUSTER").arg("FAILOVER"))
        .unwrap();
    let promoted_name = format!("127.0.0.1:{}", promoted.port);
    let state = until(&store, "the promoted replica read", |state| {
        run_id_of(state, &promoted_name).as_deref() == Some(promoted_run_id.as_str())
    })
    .await;
    assert_eq!(state.losses, vec![], "a clean failover lost nothing");
    assert_eq!(generation(&store, &rule, &clean_key), 0);

    let lossy_name = format!("127.0.0.1:{}", lossy.port);
    let read_before = until(&store, "the master read", |state| {
        run_id_of(state, &lossy_name).is_some()
    })
    .await;
    let offset_of = |state: &LostState| {
        state
            .nodes
            .iter()
            .find(|watched| watched.node == lossy_name)
            .map(|watched| watched.repl_offset)
    };
    let offset_before = offset_of(&read_before).unwrap();
    let pid = lossy.pid();
    let cut_off = replica_of(&cluster, lossy);
    lossy
        .query::<()>(cmd("CONFIG").arg("SET").arg("requirepass").arg("cut-off"))
        .unwrap();
    cli(
        lossy.port,
        "cut-off",
        &["CLIENT", "KILL", "TYPE", "replica"],
    );
    admit(&store, &rule, &lossy_key, 20).await;
    until(&store, "the master's writes read", |state| {
        offset_of(state).is_some_and(|offset| offset > offset_before)
    })
    .await;
    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    cut_off
        .query::<()>(cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"))
        .unwrap();

    let cut_off_name = format!("127.0.0.1:{}", cut_off.port);
    let state = until(&store, "the lost writes reported", |state| {
        !state.losses.is_empty()
    })
    .await;
    assert_eq!(state.losses.len(), 1, "{state:?}");
    let loss = &state.losses[0];
    assert_eq!(
        (loss.node.as_str(), loss.reason),
        (cut_off_name.as_str(), LossReason::FailedOver),
        "{loss:?}"
    );
    assert!(
        loss.detail.contains("bytes of replication stream"),
        "{loss:?}"
    );
    assert_eq!(generation(&store, &rule, &lossy_key), 1);
    assert_eq!(generation(&store, &rule, &clean_key), 0);
}
