//! Where a settle and a refund give units back (docs/SPEC.md, "Usage"), on a real
//! redis-server (functions and EVALSHA) and a real Redis Cluster: each case is held line by
//! line to the Rust reference (the memory store) and its last answer to the figures the
//! SPEC's rules give.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;

use sluicegate::internals::{KeyKind, redis_key};
use sluicegate::redis::Scripting;
use sluicegate::{
    Algorithm, Charge, Check, Limit, LogLayout, ManualClock, MemoryStore, MemoryStoreConfig, Rule,
    RuleSpec, Store,
};

use sluicegate_test_support::{self as support, cmd};

use crate::redis_trace::stores;
use crate::redis_trace::usage;

use usage::{Line, Printed, every_store, printed};

const S: u64 = 1_000_000;

/// Runs `lines` under `rule` for one key through every store and a memory store of its
/// own, holds every answer to the reference and the last one to `last`.
async fn holds(test: &str, spec: RuleSpec, lines: &[Line], last: Printed) {
    let rule = Rule::new(test, &spec).unwrap();
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    for store in every_store(test).await {
        let reference = MemoryStore::new(
            MemoryStoreConfig::default(),
            Arc::new(ManualClock::new(Duration::ZERO)),
        );
        let mut answers = Vec::new();
        for &(at, cost, request_id, charge) in lines {
            let check = Check {
                at: Some(Duration::from_micros(at)),
                request_id,
                charge,
                ..Check::new(&limits, cost)
            };
            let got = store.check(&check).await.unwrap().decision;
            let want = reference.check_now(&check).unwrap().decision;
            answers.push((at, cost, request_id, charge, got, want));
        }
        let (.., got, _) = answers.last().unwrap();
        assert_eq!(printed(got), last, "{test}: the last answer ({store:?})");
        for (at, cost, request_id, charge, got, want) in answers {
            assert_eq!(
                got, want,
                "{test} at {at}: {cost} {request_id:?} {charge:?} ({store:?})"
            );
        }
    }
}

fn log(limit: u64, layout: LogLayout) -> RuleSpec {
    RuleSpec {
        layout: Some(layout),
        ..RuleSpec::new(Algorithm::SlidingLog, limit, Duration::from_micros(S))
    }
}

fn token_bucket() -> RuleSpec {
    RuleSpec {
        burst: Some(10),
        ..RuleSpec::new(Algorithm::TokenBucket, 10, Duration::from_micros(S))
    }
}

/// A settle below its reservation gives back the reservation's own units: in a sliding
/// log the entries at its instant, not the newest (a check's, which then counts on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_gives_back_a_logs_entries_at_its_reservations_instant() {
    use Charge::{Check as C, Reserve, Settle};
    for (layout, name) in [
        (LogLayout::Zset, "settle-zset"),
        (LogLayout::Compact, "settle-ring"),
    ] {
        // Back at 10.6 s: both entries of 10.0 s; the check's of 10.5 s still counts at 11.2 s.
        let lines = [
            (10 * S, 2, Some("R"), Reserve),
            (10_500_000, 1, None, C),
            (10_600_000, 0, Some("R"), Settle),
            (11_200_000, 1, None, C),
        ];
        holds(name, log(3, layout), &lines, (true, 1, 0, S, 0)).await;
    }
}

/// A settle whose reservation's entries are gone (refunded) changes nothing, not even the
/// expired entries it would drop: the log keeps its latest time (9.0 s), and a check
/// stamped 9.1 s still counts the entry of 9.0 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_that_finds_none_of_its_entries_changes_nothing() {
    use Charge::{Check as C, Refund, Reserve, Settle};
    for (layout, name) in [
        (LogLayout::Zset, "settle-none-zset"),
        (LogLayout::Compact, "settle-none-ring"),
    ] {
        let lines = [
            (9 * S, 1, None, C),
            (9_500_000, 2, Some("R"), Reserve),
            (9_600_000, 2, None, Refund),
            (10_200_000, 0, Some("R"), Settle),
            (9_100_000, 1, None, C),
        ];
        holds(name, log(3, layout), &lines, (true, 1, 0, S, 0)).await;
    }
}

/// A settle gives back nothing once a trim into debt reached its reservation's entries
/// (L = 15): 5 admitted at 9.9 s (or at 10.0 s, one run with the reservation's), 10
/// reserved at 10.0 s, a report of 10 at 10.1 s keeps the newest 15 (5 of 10.0 s, 10 of
/// 10.1 s). Whose 5 are left can no longer be told: the settle of 0 at 10.2 s keeps all 15.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_gives_back_nothing_after_a_trim_reached_its_entries() {
    use Charge::{Check as C, Report, Reserve, Settle};
    for (layout, name) in [
        (LogLayout::Zset, "settle-trimmed-zset"),
        (LogLayout::Compact, "settle-trimmed-ring"),
    ] {
        for admitted_at in [9_900_000, 10 * S] {
            let lines = [
                (admitted_at, 5, None, C),
                (10 * S, 10, Some("R"), Reserve),
                (10_100_000, 10, None, Report),
                (10_200_000, 0, Some("R"), Settle),
            ];
            let last = (false, 0, 800_000, 900_000, 0);
            let name = format!("{name}-{admitted_at}");
            holds(&name, log(15, layout), &lines, last).await;
        }
    }
}

/// In a ring that has wrapped (L = 4, 9.0 s expired, its slot 0 reused): the settle's
/// give-back shifts the later entries back across the ring's end — read from slots 3 and 0
/// into 2 and 3 (the reservation at 9.2 s), or read from 0 and 1 into 3 and 0 (at 9.3 s).
/// Then 3 count, and one more fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_gives_back_from_a_ring_that_has_wrapped() {
    use Charge::{Check as C, Reserve, Settle};
    let read_wraps = [
        (9 * S, 1, None, C),
        (9_100_000, 1, None, C),
        (9_200_000, 1, Some("R"), Reserve),
        (9_300_000, 1, None, C),
        (10_050_000, 1, None, C),
        (10_080_000, 0, Some("R"), Settle),
        (10_090_000, 1, None, C),
    ];
    let write_wraps = [
        (9 * S, 1, None, C),
        (9_100_000, 1, None, C),
        (9_200_000, 1, None, C),
        (9_300_000, 1, Some("R"), Reserve),
        (10_050_000, 1, None, C),
        (10_150_000, 1, None, C),
        (10_180_000, 0, Some("R"), Settle),
        (10_190_000, 1, None, C),
    ];
    let spec = log(4, LogLayout::Compact);
    let last = (true, 0, 0, S, 0);
    holds("settle-ring-read-wraps", spec.clone(), &read_wraps, last).await;
    holds("settle-ring-write-wraps", spec, &write_wraps, last).await;
}

/// In a sliding counter, from the reservation's bucket: 3 of the 4 units of bucket 100
/// (10.0 s), none of bucket 105's 2; at 11.05 s bucket 100 weighs half: 2 + 0.5 + 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_gives_back_from_its_reservations_bucket() {
    use Charge::{Check as C, Reserve, Settle};
    let spec = RuleSpec {
        buckets: Some(10),
        ..RuleSpec::new(Algorithm::SlidingCounter, 10, Duration::from_micros(S))
    };
    let lines = [
        (10 * S, 4, Some("R"), Reserve),
        (10_550_000, 2, None, C),
        (10_600_000, 1, Some("R"), Settle),
        (11_050_000, 1, None, C),
    ];
    holds("settle-counter", spec, &lines, (true, 6, 0, 1_050_000, 0)).await;
}

/// In a fixed window, only while the reservation's window is the current one: a later
/// window never counted its units, so a settle there gives back none of the new window's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_in_a_later_window_gives_back_nothing() {
    use Charge::{Check as C, Reserve, Settle};
    let lines = [
        (59 * S, 30, Some("R"), Reserve),
        (61 * S, 10, None, C),
        (62 * S, 0, Some("R"), Settle),
        (63 * S, 1, None, C),
    ];
    let spec = RuleSpec::new(Algorithm::FixedWindow, 100, Duration::from_micros(60 * S));
    holds("settle-window", spec, &lines, (true, 89, 0, 57 * S, 0)).await;
}

/// In a token bucket, only what of the reservation's r · T before the TAT it set (10.5 s)
/// is still pending: at 10.4 s, 0.1 s of it; the check's 0.3 s after it stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_gives_back_only_its_reservations_pending_tat() {
    use Charge::{Check as C, Reserve, Settle};
    let lines = [
        (10 * S, 5, Some("R"), Reserve),
        (10 * S, 3, None, C),
        (10_400_000, 0, Some("R"), Settle),
    ];
    holds(
        "settle-tat",
        token_bucket(),
        &lines,
        (true, 7, 0, 300_000, 0),
    )
    .await;
}

/// A leaky bucket gives nothing back, to a refund or to a settle: the refund answers the
/// standing that a report of nothing answered just before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaky_bucket_gives_nothing_back() {
    use Charge::{Check as C, Refund, Report, Reserve, Settle};
    let spec = RuleSpec {
        queue: Some(5),
        ..RuleSpec::new(Algorithm::LeakyBucket, 10, Duration::from_micros(S))
    };
    let lines = [
        (10 * S, 2, None, C),
        (10 * S, 2, Some("R"), Reserve),
        (10 * S, 0, None, Report),
    ];
    let rule = Rule::new("leaky-standing", &spec).unwrap();
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let reference = MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::ZERO)),
    );
    let mut standing = None;
    for &(at, cost, request_id, charge) in &lines {
        let check = Check {
            at: Some(Duration::from_micros(at)),
            request_id,
            charge,
            ..Check::new(&limits, cost)
        };
        standing = Some(printed(&reference.check_now(&check).unwrap().decision));
    }
    let standing = standing.unwrap();
    let refunded = [lines.as_slice(), &[(10 * S, 3, None, Refund)]].concat();
    holds("leaky-refund", spec.clone(), &refunded, standing).await;
    let settled = [lines.as_slice(), &[(10 * S, 0, Some("R"), Settle)]].concat();
    holds("leaky-settle", spec, &settled, standing).await;
}

/// A refund that finds nothing live changes nothing, its request id included: its retry,
/// once units are recorded, gives back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_finds_nothing_remembers_no_id() {
    use Charge::{Refund, Report};
    let lines = [
        (60 * S, 3, Some("R"), Refund),
        (60_100_000, 5, None, Report),
        (60_200_000, 3, Some("R"), Refund),
    ];
    let spec = RuleSpec::new(Algorithm::FixedWindow, 10, Duration::from_micros(60 * S));
    holds("refund-nothing", spec, &lines, (true, 8, 0, 59_800_000, 0)).await;
}

/// A refund that prunes expired entries and takes the newest leaves the newest instant's
/// members numbered within the live count: checks clamped to that instant later add units
/// rather than overwrite the ones there (5 live at 10.5 s, then 1 more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_keeps_the_newest_instants_units_apart() {
    use Charge::{Check as C, Refund};
    for (layout, name) in [
        (LogLayout::Zset, "renumber-zset"),
        (LogLayout::Compact, "renumber-ring"),
    ] {
        let lines = [
            (10 * S, 2, None, C),
            (10_500_000, 3, None, C),
            (11_200_000, 1, None, Refund),
            (10_500_000, 3, None, C),
            (10_500_000, 1, None, C),
        ];
        holds(name, log(10, layout), &lines, (true, 4, 0, S, 0)).await;
    }
}

/// A report's request id is remembered W, however long its debt lasts: the same id 1.2 s
/// later (W = 1 s, the debt lasts 1.5 s) is a new report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_id_is_remembered_for_the_window() {
    use Charge::Report;
    let lines = [
        (10 * S, 15, Some("p1"), Report),
        (11_200_000, 1, Some("p1"), Report),
    ];
    holds(
        "usage-id-window",
        token_bucket(),
        &lines,
        (true, 6, 0, 400_000, 0),
    )
    .await;
}

/// A report that records nothing (a sliding counter whose debt is at its cap) remembers no
/// request id: the ids' key holds none after it, on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_that_records_nothing_remembers_no_id() {
    use Charge::Report;
    let spec = RuleSpec {
        buckets: Some(1),
        ..RuleSpec::new(Algorithm::SlidingCounter, 10, Duration::from_micros(S))
    };
    // The cap: w · (units held) below 2^53, w = 1 s.
    let cap = ((1u64 << 53) - 1) / S;
    let lines = [(10 * S, cap, None, Report), (10 * S, 1, Some("p"), Report)];
    holds(
        "report-nothing",
        spec.clone(),
        &lines,
        (false, 0, 2 * S, 2 * S, 0),
    )
    .await;
    let rule = Rule::new("report-nothing", &spec).unwrap();
    let mut nodes = vec![support::standalone()];
    nodes.extend(&support::cluster().nodes);
    for store in every_store("report-nothing").await {
        let ids = redis_key(store.prefix(), KeyKind::RequestIds, &rule, "k");
        let remembered: u64 = nodes
            .iter()
            .filter_map(|node| node.query::<u64>(cmd("ZCARD").arg(&ids)).ok())
            .sum();
        assert_eq!(remembered, 0, "{ids} ({store:?})");
    }
}

/// The library's check function on `server`, by its name in `FUNCTION LIST` (the library
/// and its function share it; the routed one ends in `_routed`).
fn check_function(server: &support::RedisServer) -> String {
    let listed: Vec<redis::Value> = server
        .query(cmd("FUNCTION").arg("LIST"))
        .expect("FUNCTION LIST");
    let names: Vec<String> = listed
        .iter()
        .map(|library| {
            let fields: Vec<redis::Value> = redis::from_redis_value_ref(library).unwrap();
            redis::from_redis_value_ref(&fields[1]).unwrap()
        })
        .collect();
    match names.as_slice() {
        [name] => name.clone(),
        _ => panic!("one check library expected, the server holds {names:?}"),
    }
}

/// A give-back of an instant older than the log's newest (on a cluster, another client's
/// check landed between a multi-slot check's first slot and its refusal by the second)
/// leaves the newest instant's units apart from the ones checks clamped to it add: after
/// 1 s (given back) and 2 s, two more units fit at 2 s, and a third does not (W = 10 s). The undo is
/// the script's own call with the arguments the store sends (script.rs), so that the
/// interleaving is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_of_an_older_instant_keeps_the_newest_instants_units_apart() {
    let server = support::standalone();
    for (layout, name) in [
        (LogLayout::Zset, "older-give-back-zset"),
        (LogLayout::Compact, "older-give-back-ring"),
    ] {
        let spec = RuleSpec {
            window: Duration::from_micros(10 * S),
            ..log(3, layout)
        };
        let rule = Rule::new(name, &spec).unwrap();
        let limits = [Limit {
            rule: &rule,
            key: "k",
        }];
        let store = stores::store_at(&server.url(), name, Scripting::Auto).await;
        let check = |at| Check {
            at: Some(Duration::from_micros(at)),
            ..Check::new(&limits, 1)
        };
        for at in [S, 2 * S] {
            assert!(store.check(&check(at)).await.unwrap().decision.allowed);
        }
        let state = redis_key(store.prefix(), KeyKind::State, &rule, "k");
        let layout_code = match layout {
            LogLayout::Zset => 0,
            LogLayout::Compact => 1,
        };
        // One rule (sliding log, L, W, no buckets, capacity or interval, layout, no envoy
        // counter's jitter), one
        // shape (client time, cost, no request id, mode, one rule: number 1 recorded at
        // 1 s), one check.
        let given_back: Vec<i64> = server
            .query(
                cmd("FCALL")
                    .arg(check_function(server))
                    .arg(1)
                    .arg(&state)
                    .arg(&[1, 1, 3, 10 * S, 0, 0, 0, layout_code, 0, 1])
                    .arg(&[S.to_string(), "1".into(), String::new(), "undo".into()])
                    .arg(&[1, 1, S, 1]),
            )
            .expect("the undo");
        assert_eq!(given_back, [1], "{name}: the undo's answer (one check)");
        let answers: Vec<bool> = [
            store.check(&check(2 * S)).await,
            store.check(&check(2 * S)).await,
            store.check(&check(2 * S)).await,
        ]
        .into_iter()
        .map(|outcome| outcome.unwrap().decision.allowed)
        .collect();
        assert_eq!(answers, [true, true, false], "{name}");
    }
}
