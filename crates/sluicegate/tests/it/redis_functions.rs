//! The check script as a Redis Function: loaded once and called with FCALL, loaded again
//! when the server lost it (FUNCTION FLUSH, a restart), and EVALSHA where the server has no
//! functions; and what a zset log's checks send, under a limit of one and a longer one at
//! its limit — each against a redis-server of its own, whose INFO commandstats say which
//! commands the store sent.

#![cfg(feature = "redis")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sluicegate::redis::Scripting;
use sluicegate::{
    Algorithm, Check, Decision, Limit, LogLayout, RedisStore, RedisStoreConfig, RetryAfter, Rule,
    RuleSpec, Store, StoreError,
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
    let outcome = store.check(&Check::new(&limits_of(rule), 1)).await?;
    assert!(outcome.decision.allowed);
    Ok(outcome.decision.remaining)
}

/// How many times the server ran each command (lower case), from INFO commandstats.
fn command_counts(server: &RedisServer) -> BTreeMap<String, u64> {
    let info: String = server
        .query(cmd("INFO").arg("commandstats"))
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (command, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let calls = rest.split(',').next().unwrap().parse().expect("a count");
            Some((command.to_owned(), calls))
        })
        .collect()
}

/// How many times the server ran `command` (lower case).
fn calls_of(server: &RedisServer, command: &str) -> u64 {
    command_counts(server).get(command).copied().unwrap_or(0)
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
    let restarted = server.restart(&[]);
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

/// The decision of a check of one unit of `limits` at `micros` (one_unit_at), and the
/// commands of the log (its sorted set's and its TTL's) the check sent: each it sent, how
/// many times.
async fn check_sending(
    server: &RedisServer,
    store: &RedisStore,
    limits: &[Limit<'_>],
    micros: u64,
) -> (Decision, BTreeMap<String, u64>) {
    let before = command_counts(server);
    let decision = store
        .check(&one_unit_at(limits, micros))
        .await
        .unwrap()
        .decision;
    let sent = command_counts(server)
        .into_iter()
        .filter(|(command, _)| command.starts_with('z') || command == "pexpire")
        .filter_map(|(command, calls)| {
            let sent = calls - before.get(&command).copied().unwrap_or(0);
            (sent > 0).then_some((command, sent))
        })
        .collect();
    (decision, sent)
}

/// Commands by name and count, as check_sending gives them.
fn commands(sent: &[(&str, u64)]) -> BTreeMap<String, u64> {
    sent.iter()
        .map(|&(command, calls)| (command.to_owned(), calls))
        .collect()
}

/// The entries of the log `state`, read with ZRANGEBYSCORE (ZRANGE is the checks' read).
fn entries(server: &RedisServer, state: &str) -> Vec<String> {
    server
        .query(cmd("ZRANGEBYSCORE").arg(state).arg("-inf").arg("+inf"))
        .unwrap()
}

/// Checks of `rule` for key `k`.
fn limits_of(rule: &Rule) -> [Limit<'_>; 1] {
    [Limit { rule, key: "k" }]
}

/// `decision` refused, to be retried after `retry` µs, its window reset after `reset`.
fn assert_refused(decision: &Decision, retry: u64, reset: u64) {
    assert!(!decision.allowed);
    assert_eq!(
        decision.retry_after(),
        RetryAfter::After(Duration::from_micros(retry))
    );
    assert_eq!(decision.reset_after(), Duration::from_micros(reset));
}

/// Under a limit of one, the newest entry decides a check: it is the entry a refusal waits
/// for, and the key's latest time, and once it has expired so has every older one. A refusal
/// reads it and sends nothing else; an admission reads it and prunes only if an entry is
/// there. So too on a log that holds more than one entry (its limit lowered to one).
#[tokio::test]
async fn a_zset_check_under_a_limit_of_one_decides_on_one_read() {
    let server = RedisServer::start(&[]);
    let store = store_on(&server, Scripting::Auto).await;
    let one = zset_log("one", 1);
    let limits = limits_of(&one);
    let (first, sent) = check_sending(&server, &store, &limits, 0).await;
    assert!(first.allowed);
    assert_eq!(
        sent,
        commands(&[("zrange", 1), ("zadd", 1), ("pexpire", 1)])
    );
    let state = store.state_key(&one, "k");
    assert_eq!(entries(&server, &state), ["1700000000000000:11"]);

    // W = 1000 µs: the entry of 0 expires at 1000.
    let (refused, sent) = check_sending(&server, &store, &limits, 300).await;
    assert_refused(&refused, 700, 700);
    assert_eq!(sent, commands(&[("zrange", 1)]));

    // Under L = 3 (rules of one name and window share their log) the log holds 0, 100, 200.
    let three = zset_log("one", 3);
    for at in [100, 200] {
        assert!(
            check_sending(&server, &store, &limits_of(&three), at)
                .await
                .0
                .allowed
        );
    }
    let before_refusal = entries(&server, &state);
    assert_eq!(before_refusal.len(), 3, "{before_refusal:?}");
    let (refused, sent) = check_sending(&server, &store, &limits, 1000).await;
    assert_refused(&refused, 200, 200);
    assert_eq!(sent, commands(&[("zrange", 1)]));
    assert_eq!(entries(&server, &state), before_refusal, "a refusal wrote");

    // At 1200 µs the newest entry, 200, has expired, and the two before it.
    let (admitted, sent) = check_sending(&server, &store, &limits, 1200).await;
    assert!(admitted.allowed);
    assert_eq!(admitted.remaining, 0);
    assert_eq!(
        sent,
        commands(&[
            ("zrange", 1),
            ("zremrangebyscore", 1),
            ("zadd", 1),
            ("pexpire", 1)
        ])
    );
    assert_eq!(entries(&server, &state), ["1700000000001200:11"]);
}

/// Under a longer limit a zset log is counted. At its limit it is pruned first: an admission
/// as its oldest entry expires reads no entry, and a refusal reads the two its answer needs
/// (the one it waits for, the newest) after a prune that removed none. Under a limit
/// lowered below what the log holds, a refusal reads them and prunes nothing.
#[tokio::test]
async fn a_zset_log_at_its_limit_admits_without_reading_an_entry() {
    let server = RedisServer::start(&[]);
    let store = store_on(&server, Scripting::Auto).await;
    let rule = zset_log("long", 20);
    let limits = limits_of(&rule);
    for at in (0..200).step_by(10) {
        assert!(check_sending(&server, &store, &limits, at).await.0.allowed);
    }

    // At 1000 µs the entry of 0 has expired (W = 1000 µs).
    let (admitted, sent) = check_sending(&server, &store, &limits, 1000).await;
    assert!(admitted.allowed);
    assert_eq!(admitted.remaining, 0);
    assert_eq!(
        sent,
        commands(&[
            ("zcard", 1),
            ("zremrangebyscore", 1),
            ("zcount", 1),
            ("zadd", 1),
            ("pexpire", 1)
        ])
    );
    let state = store.state_key(&rule, "k");
    let before_refusal = entries(&server, &state);
    assert_eq!(before_refusal.len(), 20, "{before_refusal:?}");

    // At 1005 µs the oldest live entry (10) expires in 5 µs; the newest (1000) in 995.
    let (refused, sent) = check_sending(&server, &store, &limits, 1005).await;
    assert_refused(&refused, 5, 995);
    assert_eq!(
        sent,
        commands(&[("zcard", 1), ("zremrangebyscore", 1), ("zrange", 2)])
    );
    assert_eq!(entries(&server, &state), before_refusal, "a refusal wrote");

    // Under L = 17 the check waits for the 17th newest entry, 40 (rules of one name and
    // window share their log).
    let lowered = zset_log("long", 17);
    let limits = limits_of(&lowered);
    let (refused, sent) = check_sending(&server, &store, &limits, 1006).await;
    assert_refused(&refused, 34, 994);
    assert_eq!(sent, commands(&[("zcard", 1), ("zrange", 2)]));
    assert_eq!(entries(&server, &state), before_refusal, "a refusal wrote");
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
