//! The worked examples of docs/SPEC.md and others, with every value derived by hand.

use std::sync::Arc;
use std::time::Duration;

use sluicegate::internals::{saturating_micros, signed_micros};
use sluicegate::{
    Algorithm, Charge, Check, Decision, Limit, ManualClock, MemoryStore, MemoryStoreConfig,
    RetryAfter, Rule, RuleSpec, StoreError,
};

const MS: u64 = 1_000;
const S: u64 = 1_000_000;

fn store() -> MemoryStore {
    MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::ZERO)),
    )
}

fn rule(name: &str, algorithm: Algorithm, limit: u64, window: u64) -> Rule {
    Rule::new(
        name,
        &RuleSpec::new(algorithm, limit, Duration::from_micros(window)),
    )
    .unwrap()
}

fn check_at(store: &MemoryStore, rule: &Rule, key: &str, cost: u64, at: u64) -> Decision {
    let limits = [Limit { rule, key }];
    let check = Check {
        at: Some(Duration::from_micros(at)),
        ..Check::new(&limits, cost)
    };
    store.check_now(&check).unwrap().decision
}

/// docs/SPEC.md's classic sliding-log trace: W = 1000 ms, L = 3.
#[test]
fn the_classic_sliding_log_trace() {
    let store = store();
    let rule = rule("classic", Algorithm::SlidingLog, 3, 1000 * MS);
    // (time ms, allowed, remaining, retry_after ms, reset_after ms)
    let expected = [
        (100, true, 2, 0, 1000),
        (400, true, 1, 0, 1000),
        (800, true, 0, 0, 1000),
        // Oldest live entry 100 leaves at 1100: 200 ms; newest 800 leaves at 1800.
        (900, false, 0, 200, 900),
        (1200, true, 0, 0, 1000),
        (1500, true, 0, 0, 1000),
        // Live: 800, 1200, 1500; 800 leaves at 1800.
        (1600, false, 0, 200, 900),
        (1900, true, 0, 0, 1000),
    ];
    for (at, allowed, remaining, retry, reset) in expected {
        let d = check_at(&store, &rule, "seed", 1, at * MS);
        assert_eq!(
            d,
            Decision::new(
                allowed,
                3,
                remaining,
                RetryAfter::After(Duration::from_millis(retry)),
                Duration::from_millis(reset),
                Duration::ZERO,
            ),
            "request at {at} ms"
        );
    }
}

/// Cloudflare's example: 42 in the previous minute, 18 in the current one, 15 s in: the
/// estimate is 42 · 45/60 + 18 = 49.5.
#[test]
fn cloudflare_estimate_for_one_bucket() {
    let spec = |limit| RuleSpec {
        buckets: Some(1),
        ..RuleSpec::new(
            Algorithm::SlidingCounter,
            limit,
            Duration::from_micros(60 * S),
        )
    };
    for (limit, peek_allowed, remaining) in [(50, false, 0), (51, true, 0), (100, true, 49)] {
        let store = store();
        let rule = Rule::new("cloudflare", &spec(limit)).unwrap();
        let minute = 1_000 * 60 * S;
        assert!(check_at(&store, &rule, "k", 42, minute + 30 * S).allowed);
        let current = check_at(&store, &rule, "k", 18, minute + 75 * S);
        assert!(current.allowed, "42 · 45/60 + 18 = 49.5 fits under {limit}");
        assert_eq!(current.remaining, (limit * 2 - 99) / 2, "floor(L − 49.5)");
        // A peek answers as a cost of 1: 49.5 + 1 fits under 51 but not under 50.
        let d = check_at(&store, &rule, "k", 0, minute + 75 * S);
        assert_eq!(
            (d.allowed, d.remaining),
            (peek_allowed, remaining),
            "L = {limit}"
        );
        if limit == 50 {
            // Fits once 42·(60 s − r) ≤ 31·60 s: r ≥ 60 s − ⌊1860 s/42⌋ = 15.714286 s.
            assert_eq!(
                d.retry_after(),
                RetryAfter::After(Duration::from_micros(714_286))
            );
            // The current bucket (index 1001) stops weighing at (1001 + 2)·60 s.
            assert_eq!(d.reset_after(), Duration::from_micros(105 * S));
        }
    }
}

/// Fixed windows admit about 2L across a boundary; the sliding log refuses the second half.
#[test]
fn fixed_window_boundary_burst() {
    let limit = 100;
    let window = 60 * S;
    let boundary = 10_000 * window;
    let fixed = rule("fixed", Algorithm::FixedWindow, limit, window);
    let log = rule("log", Algorithm::SlidingLog, limit, window);
    for (rule, want) in [(&fixed, 2 * limit), (&log, limit)] {
        let store = store();
        // 200 requests in the 200 ms around the boundary, one per ms.
        let admitted = (0..200)
            .filter(|i| check_at(&store, rule, "attacker", 1, boundary - 100 * MS + i * MS).allowed)
            .count() as u64;
        assert_eq!(admitted, want, "{}", rule.algorithm());
    }
}

/// Rejected requests change no state: a cost that does not fit leaves room for a smaller one
/// (unlike a counter incremented before it is compared, which counts rejected requests).
#[test]
fn rejected_large_request_burns_nothing() {
    for algorithm in Algorithm::ALL {
        let store = store();
        let rule = rule("r", algorithm, 4, S);
        assert!(
            check_at(&store, &rule, "k", 1, 10 * S).allowed,
            "{algorithm}"
        );
        let before = check_at(&store, &rule, "k", 0, 10 * S);
        let refused = check_at(&store, &rule, "k", rule.capacity(), 10 * S);
        assert!(!refused.allowed, "{algorithm}");
        assert_eq!(
            check_at(&store, &rule, "k", 0, 10 * S),
            before,
            "{algorithm}"
        );
        if refused.remaining > 0 {
            let rest = check_at(&store, &rule, "k", refused.remaining, 10 * S);
            assert!(rest.allowed, "{algorithm}: the refused cost left its room");
            assert_eq!(rest.remaining, 0, "{algorithm}");
        }
    }
}

#[test]
fn cost_that_can_never_fit() {
    let store = store();
    for algorithm in Algorithm::ALL {
        let rule = rule("r", algorithm, 5, S);
        let d = check_at(&store, &rule, "k", rule.capacity() + 1, S);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), RetryAfter::Never, "{algorithm}");
        assert_eq!(signed_micros(d.retry_after()), -1);
    }
}

#[test]
fn leaky_bucket_shapes_with_delay() {
    let store = store();
    // 10 per second with a queue of 2: one unit per 100 ms, three in flight at most.
    let rule = Rule::new(
        "shape",
        &RuleSpec {
            queue: Some(2),
            ..RuleSpec::new(Algorithm::LeakyBucket, 10, Duration::from_micros(S))
        },
    )
    .unwrap();
    let delays: Vec<Option<u64>> = (0..4)
        .map(|_| {
            let d = check_at(&store, &rule, "k", 1, 100 * S);
            d.allowed.then_some(saturating_micros(d.delay()))
        })
        .collect();
    assert_eq!(delays, [Some(0), Some(100 * MS), Some(200 * MS), None]);
    let refused = check_at(&store, &rule, "k", 1, 100 * S);
    assert_eq!(
        refused.retry_after(),
        RetryAfter::After(Duration::from_micros(100 * MS))
    );
    assert_eq!(refused.limit, 3);
}

#[test]
fn token_bucket_burst_then_rate() {
    let store = store();
    let rule = Rule::new(
        "api",
        &RuleSpec {
            burst: Some(5),
            ..RuleSpec::new(Algorithm::TokenBucket, 10, Duration::from_micros(S))
        },
    )
    .unwrap();
    let burst = (0..6)
        .filter(|_| check_at(&store, &rule, "k", 1, 50 * S).allowed)
        .count();
    assert_eq!(burst, 5);
    // One token back every 100 ms.
    let d = check_at(&store, &rule, "k", 1, 50 * S + 99 * MS);
    assert_eq!(
        d.retry_after(),
        RetryAfter::After(Duration::from_micros(MS))
    );
    assert!(check_at(&store, &rule, "k", 1, 50 * S + 100 * MS).allowed);
}

#[test]
fn request_id_retry_is_not_counted_twice() {
    let store = store();
    let rule = rule("r", Algorithm::SlidingLog, 2, S);
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let with_id = |id, at| Check {
        request_id: Some(id),
        at: Some(Duration::from_micros(at)),
        ..Check::new(&limits, 1)
    };
    let first = store.check_now(&with_id("a", 10 * S)).unwrap().decision;
    let retry = store.check_now(&with_id("a", 10 * S + 5)).unwrap().decision;
    assert!(first.allowed && retry.allowed);
    assert_eq!((first.remaining, retry.remaining), (1, 1));
    assert!(
        store
            .check_now(&with_id("b", 10 * S + 6))
            .unwrap()
            .decision
            .allowed
    );
    let c = store.check_now(&with_id("c", 10 * S + 7)).unwrap().decision;
    assert!(!c.allowed);
    // Still within a's admission: its retry is answered as allowed, recording nothing.
    assert!(
        store
            .check_now(&with_id("a", 10 * S + 8))
            .unwrap()
            .decision
            .allowed
    );
    // Once a's admission has left the window, the same id is a new request.
    let later = store.check_now(&with_id("a", 11 * S)).unwrap().decision;
    assert_eq!((later.allowed, later.remaining), (true, 0));
}

#[test]
fn several_rules_are_all_or_nothing() {
    let store = store();
    let per_second = rule("per-second", Algorithm::SlidingLog, 2, S);
    let per_minute = rule("per-minute", Algorithm::FixedWindow, 3, 60 * S);
    let limits = [
        Limit {
            rule: &per_second,
            key: "u",
        },
        Limit {
            rule: &per_minute,
            key: "u",
        },
    ];
    let at = |t| Check {
        at: Some(Duration::from_micros(t)),
        ..Check::new(&limits, 1)
    };
    assert!(store.check_now(&at(60 * S)).unwrap().decision.allowed);
    assert!(store.check_now(&at(60 * S)).unwrap().decision.allowed);
    let refused = store.check_now(&at(60 * S)).unwrap();
    assert!(!refused.decision.allowed);
    // The per-second rule refused; the per-minute rule had room and recorded nothing.
    assert!(!refused.limits()[0].allowed);
    assert!(refused.limits()[1].allowed);
    assert_eq!(refused.limits()[1].remaining, 1);
    assert_eq!(
        refused.decision.retry_after(),
        RetryAfter::After(Duration::from_micros(S))
    );
    // One second later the per-second rule has room again and the minute still has one.
    let later = store.check_now(&at(61 * S)).unwrap();
    assert!(later.decision.allowed);
    assert_eq!(later.limits()[1].remaining, 0);
    let full = store.check_now(&at(61 * S)).unwrap();
    assert!(!full.decision.allowed);
    assert!(full.limits()[0].allowed && !full.limits()[1].allowed);
    assert_eq!(
        store.check_now(&at(61 * S)).unwrap().limits()[0].remaining,
        1,
        "the refused check took nothing from the per-second rule"
    );
}

#[test]
fn keys_never_share_state() {
    let store = store();
    let rule_a = rule("a", Algorithm::FixedWindow, 1, S);
    let rule_b = rule("b", Algorithm::FixedWindow, 1, S);
    let keys = ["x:y", "x", "x:", "{x}", "{x}:y", "", " ", "x y"];
    for key in keys {
        assert!(check_at(&store, &rule_a, key, 1, S).allowed, "{key:?}");
    }
    for key in keys {
        assert!(check_at(&store, &rule_b, key, 1, S).allowed, "{key:?}");
        assert!(!check_at(&store, &rule_a, key, 1, S).allowed, "{key:?}");
    }
}

#[test]
fn invalid_checks_are_errors_not_decisions() {
    let store = store();
    let rule = rule("r", Algorithm::SlidingLog, 1, S);
    let one = [Limit {
        rule: &rule,
        key: "k",
    }];
    let twice = [one[0], one[0]];
    let long_id = "x".repeat(300);
    let cases = [
        (Check::new(&[], 1), "a check needs at least one rule"),
        (
            Check::new(&twice, 1),
            "rule \"r\" is named twice for key \"k\" in one check",
        ),
        (
            Check::new(&one, 1 << 53),
            "cost 9007199254740992 is not below 2^53",
        ),
        (
            Check {
                costs: &[1, 2],
                ..Check::new(&one, 1)
            },
            "2 costs given for 1 limits",
        ),
        (
            Check {
                costs: &[(1 << 53) + 1],
                ..Check::new(&one, 1)
            },
            "cost 9007199254740993 is not below 2^53",
        ),
        (
            Check {
                at: Some(Duration::from_micros(1 << 52)),
                ..Check::new(&one, 1)
            },
            "time 4503599627370496 µs is not below 2^52 µs (the year 2112)",
        ),
        (
            Check {
                charge: Charge::Reserve,
                ..Check::new(&one, 1)
            },
            "a reserve needs a request id",
        ),
        (
            Check {
                request_id: Some(""),
                ..Check::new(&one, 1)
            },
            "request id must be 1 to 256 bytes, got 0",
        ),
        (
            Check {
                request_id: Some(&long_id),
                ..Check::new(&one, 1)
            },
            "request id must be 1 to 256 bytes, got 300",
        ),
    ];
    for (check, message) in cases {
        match store.check_now(&check) {
            Err(StoreError::InvalidCheck(said)) => assert_eq!(said, message),
            other => panic!("{message:?}: {other:?}"),
        }
    }
    assert!(store.is_empty());
}

#[test]
fn time_never_runs_backwards_per_key() {
    let store = store();
    let rule = rule("r", Algorithm::SlidingLog, 1, 10 * S);
    assert!(check_at(&store, &rule, "k", 1, 100 * S).allowed);
    // A check stamped earlier is decided at the key's latest time: still inside the window.
    let d = check_at(&store, &rule, "k", 1, 50 * S);
    assert!(!d.allowed);
    assert_eq!(
        d.retry_after(),
        RetryAfter::After(Duration::from_micros(10 * S))
    );
}

/// Decides a trace of docs/SPEC.md's replay format (`time_us,key,cost[,request_id[,mode]]`)
/// under `rule` on a fresh memory store, each line at its own time, and asserts each
/// answer equals the expected output line (`…,allowed,remaining,retry_after,reset_after,delay`).
fn assert_trace(rule: &Rule, input: &str, expected: &str) {
    let store = store();
    for (line, want) in input.lines().zip(expected.lines()) {
        let fields: Vec<&str> = line.split(',').collect();
        let at: u64 = fields[0].parse().unwrap();
        let cost: u64 = fields[2].parse().unwrap();
        let request_id = fields.get(3).filter(|id| !id.is_empty()).copied();
        let charge = fields
            .get(4)
            .map_or(Charge::Check, |mode| Charge::from_name(mode).unwrap());
        let limits = [Limit {
            rule,
            key: fields[1],
        }];
        let d = store
            .check_now(&Check {
                at: Some(Duration::from_micros(at)),
                request_id,
                charge,
                ..Check::new(&limits, cost)
            })
            .unwrap()
            .decision;
        let got = format!(
            "{at},{},{cost},{},{},{},{},{}",
            fields[1],
            u8::from(d.allowed),
            d.remaining,
            signed_micros(d.retry_after()),
            saturating_micros(d.reset_after()),
            saturating_micros(d.delay())
        );
        assert_eq!(got, want, "the answer to {line}");
    }
    assert_eq!(input.lines().count(), expected.lines().count());
}

/// docs/SPEC.md, "Usage: worked examples": a report into debt (sliding-log, W = 1 s, L = 3).
#[test]
fn usage_a_report_into_debt() {
    assert_trace(
        &rule("debt", Algorithm::SlidingLog, 3, S),
        "10000000,k,2\n10200000,k,4,,report\n10500000,k,1\n11200000,k,1",
        "10000000,k,2,1,1,0,1000000,0\n\
         10200000,k,4,0,0,1000000,1000000,0\n\
         10500000,k,1,0,0,700000,700000,0\n\
         11200000,k,1,1,2,0,1000000,0",
    );
}

/// A token bucket in debt (L = 10 per 1 s, B = 10: T = 100 ms, τ = 1 s).
#[test]
fn usage_a_token_bucket_in_debt() {
    let rule = Rule::new(
        "bucket",
        &RuleSpec {
            burst: Some(10),
            ..RuleSpec::new(Algorithm::TokenBucket, 10, Duration::from_micros(S))
        },
    )
    .unwrap();
    assert_trace(
        &rule,
        "10000000,k,15,,report\n10599999,k,1\n10600000,k,1",
        "10000000,k,15,0,0,600000,1500000,0\n\
         10599999,k,1,0,0,1,900001,0\n\
         10600000,k,1,1,0,0,1000000,0",
    );
}

/// Reserve, then settle (fixed-window, W = 1 min, L = 100).
#[test]
fn usage_reserve_then_settle() {
    assert_trace(
        &rule("settle", Algorithm::FixedWindow, 100, 60 * S),
        "60000000,k,30,r1,reserve\n\
         60500000,k,45,r1,settle\n\
         60600000,k,45,r1,settle\n\
         61000000,k,40,r2,reserve\n\
         62000000,k,10,r2,settle\n\
         63000000,k,5,r3,settle",
        "60000000,k,30,1,70,0,60000000,0\n\
         60500000,k,45,1,55,0,59500000,0\n\
         60600000,k,45,1,55,0,59400000,0\n\
         61000000,k,40,1,15,0,59000000,0\n\
         62000000,k,10,1,45,0,58000000,0\n\
         63000000,k,5,1,40,0,57000000,0",
    );
}

/// A refund (sliding-log, W = 1 s, L = 3).
#[test]
fn usage_a_refund() {
    assert_trace(
        &rule("refund", Algorithm::SlidingLog, 3, S),
        "10000000,k,3\n10100000,k,2,,refund\n10200000,k,2",
        "10000000,k,3,1,0,0,1000000,0\n\
         10100000,k,2,1,2,0,900000,0\n\
         10200000,k,2,1,0,0,1000000,0",
    );
}
