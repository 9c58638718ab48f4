//! Redis stalls under load (`CLIENT PAUSE`), and what the circuit breaker makes of them: a
//! blip costs only the checks that really timed out; a stall of seconds opens the breaker,
//! and full rate is back within one cool-down plus one timeout of Redis answering again.
//!
//! Real time, because a real redis-server sets the pace: each test drives the limiter from
//! many tokio tasks for a second (the breaker's window fills with successes), pauses Redis,
//! and keeps driving until well after it answers again.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::cmd;
use sluicegate::{
    Algorithm, BreakerState, Check, Limit, Limiter, LimiterConfig, RedisStore, RedisStoreConfig,
    Rule, RuleSpec, StoreError,
};
use sluicegate_test_support as support;

/// A store timeout well under the default: a pause longer than it makes checks time out.
const TIMEOUT: Duration = Duration::from_millis(50);
/// Checks in flight at once.
const CONCURRENCY: usize = 32;
/// How long the load runs before Redis is paused: the breaker's window (1 s) fills.
const WARM_UP: Duration = Duration::from_millis(1_200);

/// How one check ended.
#[derive(Clone, Debug, PartialEq)]
enum Ended {
    Decided,
    TimedOut,
    BreakerOpen,
    Failed(String),
}

#[derive(Debug)]
struct Call {
    sent: Instant,
    ended: Instant,
    how: Ended,
}

/// Many tasks checking as fast as they can until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Call>>>,
}

impl Load {
    fn start(limiter: &Arc<Limiter<RedisStore>>, rule: &Rule) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..CONCURRENCY)
            .map(|task| {
                let (limiter, rule, stop) = (Arc::clone(limiter), rule.clone(), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut calls = Vec::new();
                    let mut i = 0_u64;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let key = format!("user:{task}:{}", i % 50);
                        let limits = [Limit {
                            rule: &rule,
                            key: &key,
                        }];
                        let sent = Instant::now();
                        let how = match limiter.decide(&Check::new(&limits, 1)).await {
                            Ok(_) => Ended::Decided,
                            Err(StoreError::Timeout { .. }) => Ended::TimedOut,
                            Err(StoreError::Unavailable { server, .. })
                                if server.contains("circuit breaker") =>
                            {
                                Ended::BreakerOpen
                            }
                            Err(e) => Ended::Failed(e.to_string()),
                        };
                        let failed = how != Ended::Decided;
                        calls.push(Call {
                            sent,
                            ended: Instant::now(),
                            how,
                        });
                        // An open breaker answers at once: let the runtime's other tasks
                        // (the Redis connection, the timers) run.
                        if failed {
                            tokio::task::yield_now().await;
                        }
                    }
                    calls
                })
            })
            .collect();
        Load { stop, tasks }
    }

    async fn stop(self) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        let mut calls = Vec::new();
        for task in self.tasks {
            calls.extend(task.await.expect("a load task"));
        }
        calls.sort_by_key(|c| c.ended);
        calls
    }
}

/// Pauses every client of `server` for `pause`; returns when Redis will answer again.
async fn pause(server: &support::RedisServer, pause: Duration) -> Instant {
    let millis = pause.as_millis().to_string();
    let command = cmd("CLIENT").arg("PAUSE").arg(&millis).arg("ALL").clone();
    let before = Instant::now();
    let server_port = server.port;
    tokio::task::spawn_blocking(move || {
        let client = redis::Client::open(("127.0.0.1", server_port)).expect("a client");
        let mut connection = client.get_connection().expect("a connection");
        command.query::<()>(&mut connection).expect("CLIENT PAUSE");
    })
    .await
    .expect("the pause");
    // The pause began between sending the command and reading its reply; count from the
    // send, so that "Redis answers again" is never placed late.
    before + pause
}

struct Run {
    calls: Vec<Call>,
    resumed: Instant,
    limiter: Arc<Limiter<RedisStore>>,
}

/// Drives a limiter (default breaker, a 50 ms timeout) from many tasks, pausing Redis for
/// `stall` after the warm-up, and stopping `after` Redis answers again.
async fn stall(test: &str, stall: Duration, after: Duration) -> Run {
    let server = support::RedisServer::start(&[]);
    let mut config = RedisStoreConfig::new(&server.url());
    config.prefix = format!("stalls:{test}:{}:", std::process::id());
    config.timeout = TIMEOUT;
    let store = RedisStore::connect(config).await.expect("connect");
    let limiter = Arc::new(Limiter::with_config(store, LimiterConfig::default()));
    let rule = Rule::new(
        "r",
        &RuleSpec::new(Algorithm::SlidingLog, 1_000_000, Duration::from_secs(3600)),
    )
    .unwrap();
    let load = Load::start(&limiter, &rule);
    tokio::time::sleep(WARM_UP).await;
    let resumed = pause(&server, stall).await;
    tokio::time::sleep_until((resumed + after).into()).await;
    let calls = load.stop().await;
    Run {
        calls,
        resumed,
        limiter,
    }
}

fn count(calls: &[Call], how: &Ended) -> usize {
    calls.iter().filter(|c| c.how == *how).count()
}

/// A blip: no breaker, no error but the checks that really timed out.
async fn blip(test: &str, length: Duration) {
    let run = stall(test, length, Duration::from_millis(500)).await;
    let timed_out = count(&run.calls, &Ended::TimedOut);
    eprintln!(
        "{length:?} pause: {} checks, {timed_out} timed out, {} refused by the breaker",
        run.calls.len(),
        count(&run.calls, &Ended::BreakerOpen)
    );
    for call in &run.calls {
        match &call.how {
            Ended::Decided => {}
            // Timed out for real: it waited the whole timeout.
            Ended::TimedOut => assert!(call.ended - call.sent >= TIMEOUT, "{call:?}"),
            other => panic!("a {length:?} pause made a check fail with {other:?}"),
        }
    }
    assert!(timed_out > 0, "the pause made no check time out");
    assert_eq!(run.limiter.breaker_transitions().to(BreakerState::Open), 0);
    assert_eq!(run.limiter.breaker_state(), BreakerState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_70ms_pause_costs_only_the_checks_that_timed_out() {
    blip("70ms", Duration::from_millis(70)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200ms_pause_costs_only_the_checks_that_timed_out() {
    blip("200ms", Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_2s_pause_full_rate_is_back_within_a_cool_down_and_a_timeout() {
    let cool_down = LimiterConfig::default().breaker.cool_down;
    let run = stall("2s", Duration::from_secs(2), Duration::from_secs(2)).await;
    assert!(
        run.limiter.breaker_transitions().to(BreakerState::Open) >= 1,
        "a 2 s stall did not open the breaker"
    );
    // Back: the first check Redis decided after answering again.
    let back = run
        .calls
        .iter()
        .find(|c| c.ended >= run.resumed && c.how == Ended::Decided)
        .expect("Redis decided again")
        .ended;
    let late = back.saturating_duration_since(run.resumed);
    eprintln!(
        "2 s pause: {} checks, {} timed out, {} refused by the breaker; decided again {late:?} \
         after Redis answered",
        run.calls.len(),
        count(&run.calls, &Ended::TimedOut),
        count(&run.calls, &Ended::BreakerOpen),
    );
    // Scheduling on a loaded machine: a margin of 250 ms over the bound.
    let bound = cool_down + TIMEOUT + Duration::from_millis(250);
    assert!(late <= bound, "decided again {late:?} after Redis answered");
    // And full rate from then on: every check sent after it was decided.
    let failed: Vec<&Call> = run
        .calls
        .iter()
        .filter(|c| c.sent >= back && c.how != Ended::Decided)
        .collect();
    assert!(
        failed.is_empty(),
        "{} checks failed after recovery, first {:?}",
        failed.len(),
        failed[0]
    );
    assert_eq!(run.limiter.breaker_state(), BreakerState::Closed);
}

/// The default timeout outlasts the slow round trips of a loaded machine (the 99.9th
/// percentile reached 226 ms under `sluicegate bench`): a check Redis answers 100 ms late
/// is decided, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_timeout_waits_out_a_100ms_round_trip() {
    let server = support::RedisServer::start(&[]);
    let mut config = RedisStoreConfig::new(&server.url());
    config.prefix = format!("stalls:default:{}:", std::process::id());
    let limiter = Limiter::new(RedisStore::connect(config).await.expect("connect"));
    let rule = Rule::new(
        "r",
        &RuleSpec::new(Algorithm::SlidingLog, 10, Duration::from_secs(60)),
    )
    .unwrap();
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    // Connected and warm: the script is loaded.
    limiter.decide(&Check::new(&limits, 1)).await.unwrap();
    pause(&server, Duration::from_millis(100)).await;
    let started = Instant::now();
    let outcome = limiter.decide(&Check::new(&limits, 1)).await;
    assert!(outcome.is_ok(), "{outcome:?} after {:?}", started.elapsed());
}
