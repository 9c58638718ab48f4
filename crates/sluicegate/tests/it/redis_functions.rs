//! The check script as a Redis Function: loaded once and called with FCALL, loaded again
//! when the server lost it (FUNCTION FLUSH, a restart), and EVALSHA where the server has no
//! functions; and what a zset log at its limit sends — each against a redis-server of its
//! own, whose INFO commandstats say which commands the store sent.

#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use sluicegate::redis::Scripting;
use sluicegate::{
    Algorithm, Check, Limit, LogLayout, RedisStore, RedisStoreConfig, RetryAfter, Rule, RuleSpec,
    Store, StoreError,
};
use sluicegate_test_support::{self as support, RedisServer, cmd};

fn rule() -> Rule {
    Rule::new(
        "fn",
        &RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_secs(3600)),
    )
    .unwrap()
}

async fn store_on(server: &RedisServer, scripting: Scripting) -> RedisStore {
    let mut config = RedisStoreConfig::new(&server.url());
    config.timeout = Duration::from_secs(2);
    config.scripting = scripting;
    RedisStore::connect(config).await.expect("connect")
}

/// One check of the rule for key `k`: its `remaining`.
async fn remaining(store: &RedisStore, rule: &Rule) -> Result<u64, StoreError> {
    let limits = [Limit { rule, key: "k" }];
    let outcome = store.check(&Check::new(&limits, 1)).await?;
    assert!(outcome.decision.allowed);
    Ok(outcome.decision.remaining)
}

/// How many times the server ran `command` (lower case), from INFO commandstats.
fn calls_of(server: &RedisServer, command: &str) -> u64 {
    let info: String = server
        .query(cmd("INFO").arg("commandstats"))
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |rest| {
            rest.split(',').next().unwrap().parse().expect("a count")
        })
}

/// The names of the function libraries the server holds.
fn libraries(server: &RedisServer) -> Vec<String> {
    let listed: Vec<redis::Value> = server
        .query(cmd("FUNCTION").arg("LIST"))
        .expect("FUNCTION LIST");
    listed
        .iter()
        .map(|library| {
            let fields: Vec<redis::Value> = redis::from_redis_value_ref(library).unwrap();
            redis::from_redis_value_ref(&fields[1]).unwrap()
        })
        .collect()
}

#[tokio::test]
async fn checks_are_calls_of_a_function_loaded_once() {
    let server = RedisServer::start(&[]);
    let store = store_on(&server, Scripting::Auto).await;
    assert!(store.uses_functions());
    let rule = rule();
    for want in (0..5).rev() {
        assert_eq!(remaining(&store, &rule).await.unwrap(), want);
    }
    assert_eq!(calls_of(&server, "fcall"), 5);
    assert_eq!(calls_of(&server, "evalsha") + calls_of(&server, "eval"), 0);
    assert_eq!(calls_of(&server, "function|load"), 1);
    let libraries = libraries(&server);
    assert_eq!(libraries.len(), 1, "{libraries:?}");
    assert!(libraries[0].starts_with("sluicegate_"), "{libraries:?}");
}

#[tokio::test]
async fn a_flushed_library_is_loaded_again_and_the_check_resent() {
    let server = RedisServer::start(&[]);
    let store = store_on(&server, Scripting::Auto).await;
    let rule = rule();
    assert_eq!(remaining(&store, &rule).await.unwrap(), 4);
    server.query::<()>(cmd("FUNCTION").arg("FLUSH")).unwrap();
    // The state stays; the check that found no function is sent again, counted once.
    assert_eq!(remaining(&store, &rule).await.unwrap(), 3);
    assert_eq!(remaining(&store, &rule).await.unwrap(), 2);
    assert_eq!(libraries(&server).len(), 1);
    assert_eq!(calls_of(&server, "function|load"), 2);
}

#[tokio::test]
async fn a_flushed_script_is_loaded_again_and_the_check_resent() {
    let server = RedisServer::start(&[]);
    let store = store_on(&server, Scripting::Eval).await;
    assert!(!store.uses_functions());
    let rule = rule();
    assert_eq!(remaining(&store, &rule).await.unwrap(), 4);
    server.query::<()>(cmd("SCRIPT").arg("FLUSH")).unwrap();
    assert_eq!(remaining(&store, &rule).await.unwrap(), 3);
    assert_eq!(calls_of(&server, "fcall"), 0);
    assert!(calls_of(&server, "evalsha") >= 2);
}

#[tokio::test]
async fn a_restarted_server_gets_the_library_again() {
    let server = RedisServer::start(&[]);
    let store = store_on(&server, Scripting::Auto).await;
    let rule = rule();
    assert_eq!(remaining(&store, &rule).await.unwrap(), 4);
    server.shutdown();
    let port = server.port;
    drop(server);
    let restarted = RedisServer::start_at(port, &[]);
    // Waiting for the store to reconnect to the real process; a fresh server (no
    // persistence) has neither the state nor the library.
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        match remaining(&store, &rule).await {
            Ok(remaining) => break remaining,
            Err(e) if Instant::now() < deadline => {
                assert!(
                    matches!(
                        e,
                        StoreError::Unavailable { .. } | StoreError::Timeout { .. }
                    ),
                    "{e:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no check succeeded after the restart: {e}"),
        }
    };
    assert_eq!(first, 4);
    assert!(store.uses_functions());
    assert_eq!(libraries(&restarted).len(), 1);
    assert!(calls_of(&restarted, "fcall") >= 2);
}

#[tokio::test]
async fn a_server_without_functions_is_sent_evalsha() {
    // What Redis 6 answers to FUNCTION and FCALL: unknown command.
    let server = RedisServer::start(&[
        "--rename-command",
        "FUNCTION",
        "",
        "--rename-command",
        "FCALL",
        "",
    ]);
    let store = store_on(&server, Scripting::Auto).await;
    assert!(!store.uses_functions());
    let rule = rule();
    for want in (0..5).rev() {
        assert_eq!(remaining(&store, &rule).await.unwrap(), want);
    }
    assert!(calls_of(&server, "evalsha") >= 5);
}

/// A sliding log of `limit` per 1,000 µs, in the zset layout.
fn zset_log(name: &str, limit: u64) -> Rule {
    Rule::new(
        name,
        &RuleSpec {
            layout: Some(LogLayout::Zset),
            ..RuleSpec::new(Algorithm::SlidingLog, limit, Duration::from_micros(1000))
        },
    )
    .unwrap()
}

/// A check of one unit of `limits` at `micros` past a fixed start, on the client's clock.
fn one_unit_at<'a>(limits: &'a [Limit<'a>], micros: u64) -> Check<'a> {
    Check {
        at: Some(Duration::from_micros(1_700_000_000_000_000 + micros)),
        ..Check::new(limits, 1)
    }
}

/// A zset log at its limit, checked as its oldest entry expires, admits without reading an
/// entry: the check prunes first and finds room. A refusal there reads the two entries its
/// answer needs (the one it waits for, the newest) and writes nothing: its prune removes
/// none.
#[tokio::test]
async fn a_zset_log_at_its_limit_admits_without_reading_an_entry() {
    let server = RedisServer::start(&[]);
    let store = store_on(&server, Scripting::Auto).await;
    let rule = zset_log("at-limit", 3);
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let check_at = |micros| one_unit_at(&limits, micros);
    for at in [0, 100, 200] {
        assert!(store.check(&check_at(at)).await.unwrap().decision.allowed);
    }
    let state = store.state_key(&rule, "k");
    // Read with ZRANGEBYSCORE: ZRANGE counts the store's reads.
    let entries = || -> Vec<String> {
        server
            .query(cmd("ZRANGEBYSCORE").arg(&state).arg("-inf").arg("+inf"))
            .unwrap()
    };
    let (reads, prunes) = (
        calls_of(&server, "zrange"),
        calls_of(&server, "zremrangebyscore"),
    );

    // At 1000 µs the entry of 0 has expired (W = 1000 µs).
    let admitted = store.check(&check_at(1000)).await.unwrap().decision;
    assert!(admitted.allowed);
    assert_eq!(admitted.remaining, 0);
    assert_eq!(
        calls_of(&server, "zrange"),
        reads,
        "an admission read an entry"
    );
    assert_eq!(calls_of(&server, "zremrangebyscore"), prunes + 1);
    let before_refusal = entries();
    assert_eq!(before_refusal.len(), 3, "{before_refusal:?}");

    // At 1050 µs the oldest live entry (100) expires in 50 µs; the newest (1000) in 950.
    let refused = store.check(&check_at(1050)).await.unwrap().decision;
    assert!(!refused.allowed);
    assert_eq!(
        refused.retry_after(),
        RetryAfter::After(Duration::from_micros(50))
    );
    assert_eq!(refused.reset_after(), Duration::from_micros(950));
    assert_eq!(calls_of(&server, "zrange"), reads + 2);
    assert_eq!(entries(), before_refusal, "a refusal changed the log");
}

/// Under a limit of one, the entry a refusal waits for is the newest, which the refusal reads
/// for `reset_after`: it is read once.
#[tokio::test]
async fn a_zset_refusal_under_a_limit_of_one_reads_its_entry_once() {
    let server = RedisServer::start(&[]);
    let store = store_on(&server, Scripting::Auto).await;
    let rule = zset_log("one", 1);
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let check_at = |micros| one_unit_at(&limits, micros);
    assert!(store.check(&check_at(0)).await.unwrap().decision.allowed);
    let reads = calls_of(&server, "zrange");
    let refused = store.check(&check_at(300)).await.unwrap().decision;
    assert!(!refused.allowed);
    assert_eq!(
        refused.retry_after(),
        RetryAfter::After(Duration::from_micros(700))
    );
    assert_eq!(refused.reset_after(), Duration::from_micros(700));
    assert_eq!(calls_of(&server, "zrange"), reads + 1);
}

/// Consistency of the cluster path: every master holds the library after connect.
#[tokio::test]
async fn every_master_of_a_cluster_holds_the_library() {
    let cluster = support::cluster();
    let mut config = RedisStoreConfig::new(&cluster.url());
    config.timeout = Duration::from_secs(2);
    config.prefix = format!("fn:{}:", std::process::id());
    let store = RedisStore::connect(config).await.unwrap();
    assert!(store.uses_functions());
    for master in cluster.current_masters() {
        let held = libraries(master);
        assert!(
            held.iter().any(|name| name.starts_with("sluicegate_")),
            "master {} holds {held:?}",
            master.port
        );
    }
    assert!(remaining(&store, &rule()).await.is_ok());
}
