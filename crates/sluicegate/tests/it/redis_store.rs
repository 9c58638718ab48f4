//! The Redis store against the Rust reference (the in-memory store), on a real
//! redis-server and a real three-master Redis Cluster started by the tests: random traces
//! of every mode, through functions and EVALSHA, one check per call and many sharing one.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;

use sluicegate::internals::saturating_micros;
use sluicegate::redis::Scripting;
use sluicegate::{
    Algorithm, Check, Limit, LogLayout, ManualClock, MemoryStore, MemoryStoreConfig, RedisStore,
    RedisStoreConfig, Rule, RuleSpec, Store, StoreError,
};
use sluicegate_test_support::{self as support, cmd};

use crate::redis_trace;
use crate::redis_trace::stores;

use redis_trace::scripted::{self, Scripted};
use redis_trace::{CASES, Line, Trace, check_of, limits_of};
use stores::{prefix, store_at};

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
    let reference = reference();
    for n in 0..lines {
        let line = trace.next();
        let what = format!("{algorithm} {layout:?} seed {seed} line {n}");
        decide_both(store, &reference, &trace.rules, &line, &what).await;
    }
}

fn reference() -> MemoryStore {
    MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::ZERO)),
    )
}

/// Decides `line` on the reference and on `store`, and holds the decisions equal.
async fn decide_both(
    store: &RedisStore,
    reference: &MemoryStore,
    rules: &[Rule],
    line: &Line,
    what: &str,
) {
    let limits = limits_of(rules, line);
    let check = check_of(&limits, line);
    // A conflicting reuse of a request id is an error on both, naming the same rule and uses.
    let want = reference.check_now(&check);
    if let Err(e) = &want {
        assert!(matches!(e, StoreError::RequestIdConflict(_)), "{what}: {e}");
    }
    let got = store.check(&check).await;
    assert_eq!(
        got, want,
        "{what}: t={} limits={:?} cost={} costs={:?} id={:?} {:?}",
        line.at, line.limits, line.cost, line.costs, line.request_id, line.charge
    );
}

/// A store on the standalone server that sends its checks with EVALSHA.
async fn evalsha_store(test: &str) -> RedisStore {
    let store = store_at(&support::standalone().url(), test, Scripting::Eval).await;
    assert!(!store.uses_functions());
    store
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
    let store = store_at(
        &support::standalone().url(),
        "differential",
        Scripting::Auto,
    )
    .await;
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
    let store = store_at(&support::cluster().url(), "differential", Scripting::Auto).await;
    assert!(store.uses_functions());
    agrees_with_the_reference(&store, 104_729, 2, 500).await;
}

/// The scripted traces of sliding logs (redis_trace/scripted.rs), in either layout, through
/// functions, EVALSHA and on the cluster: a compact log far beyond its entries' span, grown
/// and shrunk, either log holding more than a lowered limit, and plain checks under a limit
/// of one at every edge: each decides as the reference does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_sliding_logs_agree_with_the_reference() {
    let stores = [
        store_at(&support::standalone().url(), "scripted", Scripting::Auto).await,
        evalsha_store("scripted-evalsha").await,
        store_at(&support::cluster().url(), "scripted", Scripting::Auto).await,
    ];
    for (i, store) in stores.iter().enumerate() {
        for layout in [LogLayout::Compact, LogLayout::Zset] {
            for (trace, Scripted { rules, lines }) in [
                (
                    "spanning",
                    scripted::spanning(&format!("spanning-{i}-{layout:?}"), layout),
                ),
                (
                    "growing",
                    scripted::growing_and_shrinking(&format!("growing-{i}-{layout:?}"), layout),
                ),
                (
                    "one",
                    scripted::limit_of_one(&format!("one-{i}-{layout:?}"), layout),
                ),
            ] {
                let reference = reference();
                for (n, line) in lines.iter().enumerate() {
                    let what = format!("store {i}, {layout:?}, {trace} line {n}");
                    decide_both(store, &reference, &rules, line, &what).await;
                }
            }
        }
    }
}

/// A compact log's string as stored (docs/SPEC.md, "Redis state": room, head, count,
/// latest time) for entries of 3 bytes: (head, count, room, latest) and the ring's entries.
fn compact_log_of(bytes: &[u8]) -> ([u64; 4], Vec<u64>) {
    let number = |at: usize, width: usize| {
        let mut le = [0; 8];
        le[..width].copy_from_slice(&bytes[at..at + width]);
        u64::from_le_bytes(le)
    };
    let latest = f64::from_le_bytes(bytes[12..20].try_into().unwrap()) as u64;
    let header = [number(4, 4), number(8, 4), number(0, 4), latest];
    let ring = (20..bytes.len())
        .step_by(3)
        .map(|at| number(at, 3))
        .collect();
    (header, ring)
}

/// Over a minute under W = 2 s the log's times run past the span of 3-byte entries
/// (2^24 µs, 16.8 s) several times, and no entry is rewritten for it: each entry is its
/// time modulo the span, read against the latest time (a check's, no later than the
/// line's), the live ones in time order within the ring and within W of the latest, and
/// the string is its room, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_log_reads_its_entries_far_beyond_their_span() {
    const SPAN: u64 = 1 << 24;
    let store = store_at(&support::standalone().url(), "span", Scripting::Auto).await;
    let Scripted { rules, lines } = scripted::spanning("span", LogLayout::Compact);
    let key = store.state_key(&rules[0], "user:1");
    let window = saturating_micros(rules[0].window());
    let reference = reference();
    let mut checked_at = Vec::new();
    let mut latests = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        decide_both(&store, &reference, &rules, line, &format!("line {n}")).await;
        checked_at.push(line.at);
        let bytes: Vec<u8> = support::standalone().query(cmd("GET").arg(&key)).unwrap();
        if bytes.is_empty() {
            continue;
        }
        let ([head, count, room, latest], ring) = compact_log_of(&bytes);
        assert_eq!(ring.len() as u64, room, "line {n}: {bytes:?}");
        let times: Vec<u64> = (head..head + count)
            .map(|i| latest - (latest - ring[(i % room) as usize]) % SPAN)
            .collect();
        assert!(times.is_sorted(), "line {n}: {times:?}");
        assert_eq!(times.last(), Some(&latest), "line {n}");
        assert!(latest <= line.at, "line {n}");
        for time in &times {
            assert!(time + window > latest, "line {n}: {time} in {times:?}");
            assert!(checked_at.contains(time), "line {n}: {time} in {times:?}");
        }
        latests.push(latest);
    }
    let spans = (latests.last().unwrap() - latests[0]) / SPAN;
    assert!(spans >= 3, "the trace ran {spans} spans");
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
        store_at(&support::standalone().url(), "batched", Scripting::Auto).await,
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
    let references: Vec<MemoryStore> = lanes.iter().map(|_| reference()).collect();
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
            // A conflicting reuse of a request id fails that check alone, as on the reference.
            let got = decided.await.unwrap();
            let limits = limits_of(&lane.rules, &line);
            let want = reference.check_now(&check_of(&limits, &line));
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
    let store = store_at(
        &support::standalone().url(),
        "batched-wrongtype",
        Scripting::Auto,
    )
    .await;
    let rule = Rule::new(
        "w",
        &RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_secs(60)),
    )
    .unwrap();
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
            tokio::spawn(async move {
                store
                    .check(&Check::new(
                        &[Limit {
                            rule: &rule,
                            key: &key,
                        }],
                        2,
                    ))
                    .await
            })
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
    let peek = store
        .check(&Check::new(
            &[Limit {
                rule: &rule,
                key: "user-0",
            }],
            0,
        ))
        .await
        .unwrap();
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
    let rule = Rule::new(
        "g",
        &RuleSpec::new(Algorithm::SlidingLog, 100, Duration::from_secs(60)),
    )
    .unwrap();
    let check = |store: RedisStore, rule: Rule| async move {
        store
            .check(&Check::new(
                &[Limit {
                    rule: &rule,
                    key: "k",
                }],
                1,
            ))
            .await
    };
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
        if let Ok(outcome) = store
            .check(&Check::new(
                &[Limit {
                    rule: &rule,
                    key: "k",
                }],
                0,
            ))
            .await
        {
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

/// A peek (cost 0) under charged refusals, envoy's counting, is decided for no units
/// (docs/SPEC.md, "Charging refusals"): allowed at exactly the limit, with nothing left;
/// refused only once the key is past it (a fixed window's charged refusal, or a report's
/// debt elsewhere); the sliding log, which cannot tell a full log from one past its
/// limit, refuses it once full. A plain check's peek is one unit's, refused at the limit.
/// A peek records nothing: a fresh key stays absent. Redis and the memory store answer
/// alike, and as said here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charged_peek_is_refused_only_past_the_limit_on_both_stores() {
    use sluicegate::Charge;

    const T: u64 = 3_600 * 1_000_000 * 24 * 365 * 50 + 1_000;
    let store = store_at(
        &support::standalone().url(),
        "charged-peek",
        Scripting::Auto,
    )
    .await;
    let reference = reference();
    for (algorithm, layout) in CASES {
        let spec = RuleSpec {
            layout,
            ..RuleSpec::new(algorithm, 3, Duration::from_secs(60))
        };
        let rule = Rule::new(&format!("peek-{algorithm}-{layout:?}"), &spec).unwrap();
        let limits = [Limit {
            rule: &rule,
            key: "k",
        }];
        // A check of `cost` in mode `charge`, `step` µs in, on both stores.
        let both = |cost: u64, charge: Charge, step: u64| {
            let (store, reference, limits) = (&store, &reference, &limits);
            async move {
                let check = Check {
                    at: Some(Duration::from_micros(T + step)),
                    charge,
                    ..Check::new(limits, cost)
                };
                let want = reference.check_now(&check).unwrap().decision;
                let got = store.check(&check).await.unwrap().decision;
                assert_eq!(got, want, "{algorithm} {layout:?}: {charge:?} of {cost}");
                (got.allowed, got.remaining)
            }
        };
        let is_log = algorithm == Algorithm::SlidingLog;
        // Fresh: allowed, every unit left, and nothing written.
        let capacity = rule.capacity();
        let entries = reference.len();
        let fresh = both(0, Charge::CheckChargingRefusals, 0).await;
        let all = if is_log { capacity - 1 } else { capacity };
        assert_eq!(fresh, (true, all), "{algorithm}");
        assert_eq!(
            reference.len(),
            entries,
            "{algorithm}: a peek made no entry"
        );
        // The limit taken.
        assert_eq!(
            both(capacity, Charge::CheckChargingRefusals, 1).await,
            (true, 0)
        );
        let at_limit = both(0, Charge::CheckChargingRefusals, 2).await;
        assert_eq!(at_limit, (!is_log, 0), "{algorithm} at the limit");
        assert_eq!(
            both(0, Charge::Check, 3).await,
            (false, 0),
            "{algorithm}: a plain peek at the limit"
        );
        // Past it: a fixed window counts a refused hit; the others take a report's debt.
        if algorithm == Algorithm::FixedWindow {
            assert_eq!(both(1, Charge::CheckChargingRefusals, 4).await, (false, 0));
        } else {
            both(1, Charge::Report, 4).await;
        }
        let past = both(0, Charge::CheckChargingRefusals, 5).await;
        assert_eq!(past, (false, 0), "{algorithm} past the limit");
    }
}

/// docs/SPEC.md, "Time never runs backwards for a key": checks stamped earlier than the
/// key's latest admission are decided at that admission's time, on Redis as in memory, by
/// every algorithm and layout. The key's state is never empty meanwhile, so no store may
/// have forgotten it. A sliding log full at its latest time refuses a check stamped before
/// it with the retry and reset of that time, not of the earlier stamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_stamped_before_a_keys_latest_admission_are_decided_at_it_on_both_stores() {
    use sluicegate::RetryAfter;

    const S: u64 = 1_000_000;
    const T: u64 = 3_600 * S * 24 * 365 * 50 + 1_000;
    let store = store_at(&support::standalone().url(), "backwards", Scripting::Auto).await;
    let reference = reference();
    for (algorithm, layout) in CASES {
        let spec = RuleSpec {
            layout,
            ..RuleSpec::new(algorithm, 2, Duration::from_secs(10))
        };
        let rule = Rule::new(&format!("backwards-{algorithm}-{layout:?}"), &spec).unwrap();
        let limits = [Limit {
            rule: &rule,
            key: "k",
        }];
        let mut last = None;
        // (time after T, cost): two admissions, then checks stamped between them.
        for (step, cost) in [
            (0, 1),
            (4 * S, 1),
            (2 * S, 1),
            (S, 0),
            (3 * S, 2),
            (2 * S, 1),
        ] {
            let check = Check {
                at: Some(Duration::from_micros(T + step)),
                ..Check::new(&limits, cost)
            };
            let want = reference.check_now(&check).unwrap().decision;
            let got = store.check(&check).await.unwrap().decision;
            assert_eq!(got, want, "{algorithm} {layout:?}: {cost} at T + {step} µs");
            if step == 2 * S && last.is_none() {
                last = Some(got);
            }
        }
        if algorithm == Algorithm::SlidingLog {
            // Decided at T + 4 s, when the log holds T and T + 4 s: the entry at T expires
            // at T + 10 s, 6 s on; the newest at T + 14 s.
            let back = last.unwrap();
            assert!(!back.allowed, "{layout:?}");
            assert_eq!(
                back.retry_after(),
                RetryAfter::After(Duration::from_secs(6)),
                "{layout:?}"
            );
            assert_eq!(back.reset_after(), Duration::from_secs(10), "{layout:?}");
        }
    }
}
