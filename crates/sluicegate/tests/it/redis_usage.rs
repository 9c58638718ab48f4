//! Reports, reservations, settlements and refunds (docs/SPEC.md, "Usage") on a real
//! redis-server and a real Redis Cluster: the worked examples, debt and its TTLs, the
//! request ids of each mode, and the two sliding-log layouts against each other.

#![cfg(feature = "redis")]

use std::time::Duration;

use sluicegate::internals::{KeyKind, identity_slot, redis_key, saturating_micros};
use sluicegate::redis::Scripting;
use sluicegate::{
    Algorithm, Charge, Check, Decision, Limit, LogLayout, RedisStore, RequestIdConflict,
    RequestUse, Rule, RuleSpec, Store, StoreError,
};
use sluicegate_test_support::{self as support, cmd};

use crate::redis_trace::cases;
use crate::redis_trace::random;
use crate::redis_trace::stores;
use crate::redis_trace::usage;

use cases::CASES;
use random::Random;
use stores::store_at;
use usage::{Line, Printed, every_store, printed};

const S: u64 = 1_000_000;

fn rule(name: &str, spec: RuleSpec) -> Rule {
    Rule::new(name, &spec).unwrap()
}

/// Runs `lines` under `rule` for one key and holds each answer to `expected`.
async fn replay(store: &RedisStore, rule: &Rule, lines: &[Line], expected: &[Printed]) {
    let limits = [Limit { rule, key: "k" }];
    for (&(at, cost, request_id, charge), want) in lines.iter().zip(expected) {
        let check = Check {
            at: Some(Duration::from_micros(at)),
            request_id,
            charge,
            ..Check::new(&limits, cost)
        };
        let got = store.check(&check).await.unwrap().decision;
        assert_eq!(
            printed(&got),
            *want,
            "{} at {at}: {cost} {request_id:?} {charge:?} ({store:?})",
            rule.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_examples_of_the_spec_hold_on_redis() {
    use Charge::{Check as C, Refund, Report, Reserve, Settle};
    for store in every_store("examples").await {
        let log = |name| {
            rule(
                name,
                RuleSpec::new(Algorithm::SlidingLog, 3, Duration::from_micros(S)),
            )
        };
        replay(
            &store,
            &log("report-into-debt"),
            &[
                (10 * S, 2, None, C),
                (10_200_000, 4, None, Report),
                (10_500_000, 1, None, C),
                (11_200_000, 1, None, C),
            ],
            &[
                (true, 1, 0, S, 0),
                (false, 0, S, S, 0),
                (false, 0, 700_000, 700_000, 0),
                (true, 2, 0, S, 0),
            ],
        )
        .await;
        let bucket = RuleSpec {
            burst: Some(10),
            ..RuleSpec::new(Algorithm::TokenBucket, 10, Duration::from_micros(S))
        };
        replay(
            &store,
            &rule("bucket-in-debt", bucket),
            &[
                (10 * S, 15, None, Report),
                (10_599_999, 1, None, C),
                (10_600_000, 1, None, C),
            ],
            &[
                (false, 0, 600_000, 1_500_000, 0),
                (false, 0, 1, 900_001, 0),
                (true, 0, 0, S, 0),
            ],
        )
        .await;
        replay(
            &store,
            &rule(
                "reserve-settle",
                RuleSpec::new(Algorithm::FixedWindow, 100, Duration::from_micros(60 * S)),
            ),
            &[
                (60 * S, 30, Some("r1"), Reserve),
                (60_500_000, 45, Some("r1"), Settle),
                (60_600_000, 45, Some("r1"), Settle),
                (61 * S, 40, Some("r2"), Reserve),
                (62 * S, 10, Some("r2"), Settle),
                (63 * S, 5, Some("r3"), Settle),
            ],
            &[
                (true, 70, 0, 60 * S, 0),
                (true, 55, 0, 59_500_000, 0),
                (true, 55, 0, 59_400_000, 0),
                (true, 15, 0, 59 * S, 0),
                (true, 45, 0, 58 * S, 0),
                (true, 40, 0, 57 * S, 0),
            ],
        )
        .await;
        replay(
            &store,
            &log("refund"),
            &[
                (10 * S, 3, None, C),
                (10_100_000, 2, None, Refund),
                (10_200_000, 2, None, C),
            ],
            &[
                (true, 0, 0, S, 0),
                (true, 2, 0, 900_000, 0),
                (true, 0, 0, S, 0),
            ],
        )
        .await;
    }
}

/// A report, settle or refund is never refused: a check of several limits is not
/// all-or-nothing, each limit does its part — on a cluster too, with the limits in
/// different hash slots, where nothing is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_does_its_part_of_a_report_across_slots() {
    let (user, everyone) = ("alice", "everyone");
    assert_ne!(identity_slot(user), identity_slot(everyone));
    let per_user = rule(
        "user",
        RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_micros(3600 * S)),
    );
    let global = rule(
        "global",
        RuleSpec::new(Algorithm::FixedWindow, 2, Duration::from_micros(3600 * S)),
    );
    let limits = [
        Limit {
            rule: &per_user,
            key: user,
        },
        Limit {
            rule: &global,
            key: everyone,
        },
    ];
    let t0 = 1_700_000_000 * S;
    for store in every_store("parts").await {
        let usage = |at, cost, charge| Check {
            at: Some(Duration::from_micros(at)),
            charge,
            ..Check::new(&limits, cost)
        };
        // 3 units: the user's limit holds them, the global one goes into debt.
        let reported = store.check(&usage(t0, 3, Charge::Report)).await.unwrap();
        assert_eq!(reported.limits()[0].remaining, 2, "{store:?}");
        assert!(reported.limits()[0].allowed);
        assert!(!reported.limits()[1].allowed);
        assert!(!reported.decision.allowed);
        // A refund of 2 frees the user's two and leaves the global count at 1.
        let refunded = store
            .check(&usage(t0 + 1, 2, Charge::Refund))
            .await
            .unwrap();
        assert_eq!(refunded.limits()[0].remaining, 4, "{store:?}");
        assert_eq!(refunded.limits()[1].remaining, 1, "{store:?}");
        assert!(refunded.decision.allowed);
        let checked = store.check(&usage(t0 + 2, 1, Charge::Check)).await.unwrap();
        assert!(checked.decision.allowed);
        assert_eq!(checked.limits()[1].remaining, 0);
    }
}

/// The Redis key named `kind` of `rule` for `key`, on whichever node holds it: its PTTL
/// (-2 when it does not exist).
fn pttl(store: &RedisStore, kind: KeyKind, rule: &Rule, key: &str, cluster: bool) -> i64 {
    let name = redis_key(store.prefix(), kind, rule, key);
    if !cluster {
        return support::standalone().query(cmd("PTTL").arg(&name)).unwrap();
    }
    support::cluster()
        .nodes
        .iter()
        .filter_map(|node| node.query::<i64>(cmd("PTTL").arg(&name)).ok())
        .max()
        .unwrap_or(-2)
}

/// A key in debt lasts exactly as long as its debt (its TTL is the standing's
/// `reset_after`, to the ms), a usage request id W from its request however long the debt
/// (the ids' key as long as the latest among them), and all of it is gone once empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_debt_expires_when_empty_and_not_before() {
    let server = support::standalone().url();
    let mut longest = 0;
    let mut rules = Vec::new();
    for (scripting, name) in [(Scripting::Auto, "ttl"), (Scripting::Eval, "ttl-eval")] {
        let store = store_at(&server, name, scripting).await;
        for (algorithm, layout) in CASES {
            let spec = RuleSpec {
                layout,
                ..RuleSpec::new(algorithm, 2, Duration::from_millis(300))
            };
            let rule = rule("debt", spec);
            let limits = [Limit {
                rule: &rule,
                key: "spender",
            }];
            let usage = |cost, id, charge| Check {
                request_id: Some(id),
                charge,
                ..Check::new(&limits, cost)
            };
            let reported = store
                .check(&usage(5, "p1", Charge::Report))
                .await
                .unwrap()
                .decision;
            assert!(!reported.allowed, "{algorithm}: in debt");
            let reset_ms = saturating_micros(reported.reset_after()).div_ceil(1000) as i64;
            let state_ttl = pttl(&store, KeyKind::State, &rule, "spender", false);
            assert!(
                state_ttl <= reset_ms && state_ttl + 50 >= reset_ms,
                "{algorithm}: PTTL {state_ttl} for reset_after {reset_ms} ms"
            );
            let remembered_ms = 300;
            let ids_ttl = pttl(&store, KeyKind::RequestIds, &rule, "spender", false);
            assert!(
                ids_ttl <= remembered_ms && ids_ttl + 50 >= remembered_ms,
                "{algorithm}: request ids PTTL {ids_ttl}, remembered {remembered_ms} ms"
            );
            let refunded = store
                .check(&usage(4, "f1", Charge::Refund))
                .await
                .unwrap()
                .decision;
            let state_ttl = pttl(&store, KeyKind::State, &rule, "spender", false);
            assert!(
                state_ttl + 50 >= saturating_micros(refunded.reset_after()).div_ceil(1000) as i64,
                "{algorithm}: PTTL {state_ttl} after the refund, reset_after {:?}",
                refunded.reset_after()
            );
            let after_refund = pttl(&store, KeyKind::RequestIds, &rule, "spender", false);
            assert!(
                after_refund + 100 >= ids_ttl,
                "{algorithm}: the refund's memory cut the report's: {after_refund} < {ids_ttl}"
            );
            longest = longest.max(reset_ms.max(remembered_ms));
            rules.push((store.clone(), rule));
        }
    }
    // Redis expires on its own clock: a wait for Redis, not for sluicegate.
    tokio::time::sleep(Duration::from_millis(longest as u64 + 100)).await;
    for (store, rule) in &rules {
        for kind in KeyKind::ALL {
            assert_eq!(
                pttl(store, kind, rule, "spender", false),
                -2,
                "{}: {kind:?} outlived its debt",
                rule.algorithm()
            );
        }
    }
}

/// The zset and compact layouts decide alike under every mode — reports into debt, refunds
/// reaching back past an instant, reservations settled up and down — on random traces
/// with many checks at one instant (where the zset's member numbering must stay unique),
/// and both keep at most L entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_two_log_layouts_decide_alike_under_reports_and_refunds() {
    let store = store_at(&support::standalone().url(), "layouts", Scripting::Auto).await;
    for seed in 1..=24u64 {
        let mut random = Random(seed * 7919);
        let limit = 1 + random.below(6);
        let window = [10, 100, S][random.below(3) as usize];
        let layouts = [LogLayout::Zset, LogLayout::Compact].map(|layout| {
            let spec = RuleSpec {
                layout: Some(layout),
                ..RuleSpec::new(Algorithm::SlidingLog, limit, Duration::from_micros(window))
            };
            rule(&format!("layouts-{seed}"), spec)
        });
        let mut t = 1_700_000_000 * S;
        for n in 0..300 {
            // Now and then time steps back (a client's clock): the check is clamped to the
            // key's latest time, which a refund may have moved back to an older instant.
            t = match random.below(7) {
                0..=2 => t,
                3 | 4 => t + random.below(window / 3 + 1),
                5 => t - random.below(window),
                _ => t + random.below(2 * window),
            };
            let charge = Charge::ALL[random.below(Charge::ALL.len() as u64) as usize];
            let request_id = (charge.needs_request_id() || random.below(3) == 0)
                .then(|| format!("r{}", random.below(4)));
            let cost = random.below(limit + 3);
            let decisions = decisions_under(&store, &layouts, t, cost, &request_id, charge).await;
            assert_eq!(
                decisions[0], decisions[1],
                "seed {seed} line {n}: t={t} cost={cost} {charge:?} {request_id:?} (L {limit}, W {window})"
            );
        }
        let zset = store.state_key(&layouts[0], "k");
        let entries: u64 = support::standalone()
            .query(cmd("ZCARD").arg(&zset))
            .unwrap();
        assert!(
            entries <= limit,
            "seed {seed}: {entries} entries, L = {limit}"
        );
    }
}

/// The same check under each of `rules` (one key), one after the other: each decision, or
/// the uses a conflicting reuse of the request id names.
async fn decisions_under(
    store: &RedisStore,
    rules: &[Rule; 2],
    at: u64,
    cost: u64,
    request_id: &Option<String>,
    charge: Charge,
) -> Vec<Result<Decision, (RequestUse, RequestUse)>> {
    let mut decisions = Vec::new();
    for rule in rules {
        let limits = [Limit { rule, key: "k" }];
        let check = Check {
            at: Some(Duration::from_micros(at)),
            request_id: request_id.as_deref(),
            charge,
            ..Check::new(&limits, cost)
        };
        decisions.push(match store.check(&check).await {
            Ok(outcome) => Ok(outcome.decision),
            Err(StoreError::RequestIdConflict(c)) => Err((c.remembered, c.asked)),
            Err(e) => panic!("{e}"),
        });
    }
    decisions
}

/// A reservation recorded by the previous script holds its units alone (`6`, not
/// `6:s:e`): where they went is unknown, so a settle below it gives back nothing (4 of 10
/// left, not the 2 a report of the settle's whole cost would leave), and one above it
/// reports the excess (8 of 6: 2 left, not 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_the_previous_script_recorded_is_settled_without_a_give_back() {
    let server = support::standalone();
    let store = store_at(&server.url(), "old-reservation", Scripting::Auto).await;
    for layout in [Some(LogLayout::Zset), Some(LogLayout::Compact), None] {
        let algorithm = layout.map_or(Algorithm::FixedWindow, |_| Algorithm::SlidingLog);
        let rule = rule(
            "old",
            RuleSpec {
                layout,
                ..RuleSpec::new(algorithm, 10, Duration::from_micros(100 * S))
            },
        );
        let limits = [Limit {
            rule: &rule,
            key: "k",
        }];
        let releases = redis_key(store.prefix(), KeyKind::ReleaseTimes, &rule, "k");
        for (id, settled, left) in [("R1", 2, 4), ("R2", 8, 2)] {
            let usage = |cost, charge| Check {
                at: Some(Duration::from_micros(10 * S)),
                request_id: Some(id),
                charge,
                ..Check::new(&limits, cost)
            };
            store.check(&usage(6, Charge::Reserve)).await.unwrap();
            let field = [b"\xffu".as_slice(), id.as_bytes()].concat();
            let record: String = server
                .query(cmd("HGET").arg(&releases).arg(&field))
                .unwrap();
            assert!(
                record.starts_with("6:"),
                "{algorithm}: the record is r:s:e: {record}"
            );
            let _: i64 = server
                .query(cmd("HSET").arg(&releases).arg(&field).arg("6"))
                .unwrap();
            let settle = store
                .check(&usage(settled, Charge::Settle))
                .await
                .unwrap()
                .decision;
            assert_eq!(
                settle.remaining, left,
                "{algorithm} {layout:?}: settle {settled} of 6"
            );
            // The next reservation starts from an empty key.
            store.check(&usage(10, Charge::Refund)).await.unwrap();
        }
    }
}

/// A request id admitted at cost 1 admits no later request of another cost or mode, through
/// functions, EVALSHA and on a cluster: each is a conflicting reuse naming both uses, and
/// records nothing anywhere — in a check of two slots, and in a report of two slots, whose
/// slots each do their part — while the retry of what it was used for is a repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_reused_for_another_request_is_a_conflict() {
    let tokens = Rule::new(
        "tokens",
        &RuleSpec::new(Algorithm::TokenBucket, 10, Duration::from_secs(3600)),
    )
    .unwrap();
    let other = Rule::new(
        "other",
        &RuleSpec::new(Algorithm::FixedWindow, 100, Duration::from_secs(3600)),
    )
    .unwrap();
    // Two keys in two hash slots: on the cluster, a check of both runs slot by slot.
    let (here, there) = ("k", "elsewhere");
    assert_ne!(identity_slot(here), identity_slot(there));
    let limits = [
        Limit {
            rule: &other,
            key: there,
        },
        Limit {
            rule: &tokens,
            key: here,
        },
    ];
    let at = 1_700_000_000_000_000;
    let with_id = |limits, cost, charge| Check {
        request_id: Some("R1"),
        charge,
        at: Some(Duration::from_micros(at)),
        ..Check::new(limits, cost)
    };
    let conflict = |remembered, asked| {
        Err(StoreError::RequestIdConflict(RequestIdConflict {
            request_id: "R1".into(),
            rule: "tokens".into(),
            remembered,
            asked,
        }))
    };
    for store in every_store("conflicts").await {
        let first = store
            .check(&with_id(&limits[1..], 1, Charge::Check))
            .await
            .unwrap();
        assert_eq!(first.decision.remaining, 9);
        for (cost, charge) in [(5, Charge::Check), (1_000_000, Charge::Check)] {
            assert_eq!(
                store.check(&with_id(&limits[1..], cost, charge)).await,
                conflict(
                    RequestUse::new(Charge::Check, 1),
                    RequestUse::new(charge, cost)
                )
            );
        }
        assert_eq!(
            store
                .check(&with_id(&limits[1..], 1, Charge::Reserve))
                .await,
            conflict(
                RequestUse::new(Charge::Check, 1),
                RequestUse::new(Charge::Reserve, 1)
            )
        );
        let retried = store
            .check(&with_id(&limits[1..], 1, Charge::CheckChargingRefusals))
            .await
            .unwrap();
        assert!(retried.decision.allowed);
        assert_eq!(retried.decision.remaining, 9, "a repeat takes nothing");
        assert!(
            store
                .check(&with_id(&limits, 2, Charge::Check))
                .await
                .is_err()
        );
        // A report of R1 at 3 in `tokens` alone; then one of both slots at 4 conflicts
        // there, and records nothing in `other` either.
        store
            .check(&with_id(&limits[1..], 3, Charge::Report))
            .await
            .unwrap();
        assert_eq!(
            store.check(&with_id(&limits, 4, Charge::Report)).await,
            conflict(
                RequestUse::new(Charge::Report, 3),
                RequestUse::new(Charge::Report, 4)
            )
        );
        let peek = store
            .check(&Check {
                at: Some(Duration::from_micros(at)),
                ..Check::new(&limits, 0)
            })
            .await
            .unwrap();
        assert_eq!(
            (peek.limits()[0].remaining, peek.limits()[1].remaining),
            (99, 5),
            "nothing recorded in `other`; 1 + 3 in `tokens`"
        );
    }
}
