//! The in-memory store's own promises: exact under concurrency, idle keys expire, and a
//! hard cap on keys that never evicts a key's state.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use sluicegate::internals::{FULL_RETRY_AFTER, stored_key};
use sluicegate::{
    Algorithm, Charge, Check, DecidedBy, Limit, ManualClock, MemoryStore, MemoryStoreConfig,
    OnFull, Outcome, RequestIdConflict, RequestUse, RetryAfter, Rule, RuleSpec, StoreError,
};

const S: u64 = 1_000_000;
const HOUR: u64 = 3600 * S;

fn rule(name: &str, algorithm: Algorithm, limit: u64, window: u64) -> Rule {
    Rule::new(
        name,
        &RuleSpec::new(algorithm, limit, Duration::from_micros(window)),
    )
    .unwrap()
}

fn check(store: &MemoryStore, rule: &Rule, key: &str, cost: u64) -> Result<bool, StoreError> {
    let limits = [Limit { rule, key }];
    store
        .check_now(&Check::new(&limits, cost))
        .map(|o| o.decision.allowed)
}

#[test]
fn eight_threads_admit_exactly_the_limit() {
    let clock = ManualClock::new(Duration::from_micros(1_000 * HOUR));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(clock.clone()),
    ));
    let rule = rule("hourly", Algorithm::SlidingLog, 1000, HOUR);
    let admitted: usize = thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let store = &store;
                let rule = &rule;
                scope.spawn(move || {
                    (0..10_000)
                        .filter(|_| check(store, rule, "hot", 1).unwrap())
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 1000);
}

/// Multi-rule checks lock several shards; opposite orders in two threads must not deadlock
/// and must stay exact.
#[test]
fn multi_rule_checks_across_shards_stay_exact() {
    let store = MemoryStore::new(
        MemoryStoreConfig {
            shards: 4,
            ..MemoryStoreConfig::default()
        },
        Arc::new(ManualClock::new(Duration::from_micros(HOUR))),
    );
    let rule = rule("r", Algorithm::FixedWindow, 1_500, HOUR);
    let keys: Vec<String> = (0..16).map(|i| format!("key-{i}")).collect();
    let admitted: usize = thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (store, rule, keys) = (&store, &rule, &keys);
                scope.spawn(move || {
                    (0..4_000)
                        .filter(|i| {
                            let a = &keys[(i + t) % 16];
                            let b = &keys[(i * 7 + 3 * t + 1) % 16];
                            let (a, b) = if t % 2 == 0 { (a, b) } else { (b, a) };
                            if a == b {
                                return false;
                            }
                            let limits = [Limit { rule, key: a }, Limit { rule, key: b }];
                            store
                                .check_now(&Check::new(&limits, 1))
                                .unwrap()
                                .decision
                                .allowed
                        })
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    // Every admitted check took one unit from two keys; no key exceeded its limit.
    let remaining: u64 = keys
        .iter()
        .map(|key| {
            let limits = [Limit { rule: &rule, key }];
            let d = store.check_now(&Check::new(&limits, 0)).unwrap().decision;
            // A peek answers as a cost of 1.
            d.remaining + u64::from(d.allowed)
        })
        .sum();
    assert!(admitted < 16_000, "some checks were refused");
    assert_eq!(16 * 1_500 - remaining, 2 * admitted as u64);
}

#[test]
fn idle_keys_expire_exactly_when_their_state_is_empty() {
    let clock = ManualClock::new(Duration::from_micros(500 * HOUR));
    let store = MemoryStore::new(MemoryStoreConfig::default(), Arc::new(clock.clone()));
    for algorithm in Algorithm::ALL {
        let rule = rule(algorithm.name(), algorithm, 4, 60 * S);
        let limits = [Limit {
            rule: &rule,
            key: "idle",
        }];
        let reset = store
            .check_now(&Check::new(&limits, 1))
            .unwrap()
            .decision
            .reset_after();
        assert!(reset > Duration::ZERO, "{algorithm}");
        clock.advance(reset - Duration::from_micros(1));
        assert_eq!(store.sweep(), 0, "{algorithm}: state still matters");
        assert_eq!(store.len(), 1);
        clock.advance(Duration::from_micros(1));
        assert_eq!(store.sweep(), 1, "{algorithm}: back to empty");
        assert!(store.is_empty());
    }
}

#[test]
fn shards_sweep_themselves_as_checks_pass() {
    let clock = ManualClock::new(Duration::from_micros(HOUR));
    let store = MemoryStore::new(
        MemoryStoreConfig {
            shards: 1,
            ..MemoryStoreConfig::default()
        },
        Arc::new(clock.clone()),
    );
    let rule = rule("r", Algorithm::SlidingLog, 1, S);
    for i in 0..100 {
        assert!(check(&store, &rule, &format!("k{i}"), 1).unwrap());
    }
    assert_eq!(store.len(), 100);
    clock.advance(Duration::from_micros(2 * S));
    assert!(check(&store, &rule, "fresh", 1).unwrap());
    assert_eq!(store.len(), 1, "the shard dropped the 100 expired keys");
}

/// Under `refuse`, a full store refuses new keys as full, with a Retry-After of one sweep.
#[test]
fn key_cap_refuses_new_keys_without_evicting_any() {
    let clock = ManualClock::new(Duration::from_micros(HOUR));
    let store = MemoryStore::new(
        MemoryStoreConfig {
            max_keys: 100,
            shards: 8,
            on_full: OnFull::Refuse,
            ..MemoryStoreConfig::default()
        },
        Arc::new(clock.clone()),
    );
    let rule = rule("r", Algorithm::SlidingLog, 5, 60 * S);
    for _ in 0..5 {
        assert!(check(&store, &rule, "victim", 1).unwrap());
    }
    assert!(!check(&store, &rule, "victim", 1).unwrap());

    let mut admitted = 0;
    let mut full = 0;
    for i in 0..10_000 {
        let key = format!("flood-{i}");
        let limits = [Limit {
            rule: &rule,
            key: &key,
        }];
        let outcome = store.check_now(&Check::new(&limits, 1)).unwrap();
        match outcome.decided_by {
            DecidedBy::Store if outcome.decision.allowed => admitted += 1,
            DecidedBy::Full(OnFull::Refuse) => {
                assert!(!outcome.decision.allowed);
                assert_eq!(
                    outcome.decision.retry_after(),
                    RetryAfter::After(Duration::from_micros(FULL_RETRY_AFTER))
                );
                full += 1;
            }
            _ => panic!("unexpected {outcome:?}"),
        }
    }
    assert_eq!((admitted, full), (99, 10_000 - 99));
    assert_eq!(store.len(), 100);
    // The flood evicted nothing: the victim is still at its limit.
    assert!(!check(&store, &rule, "victim", 1).unwrap());
    // Peeks create nothing, so they still answer for new keys at the cap.
    assert!(check(&store, &rule, "newcomer", 0).unwrap());

    // Once the window has passed the old keys are swept to make room.
    clock.advance(Duration::from_micros(60 * S));
    assert!(check(&store, &rule, "newcomer", 1).unwrap());
    assert!(store.len() <= 100);
}

fn usage(
    store: &MemoryStore,
    limits: &[Limit<'_>],
    cost: u64,
    charge: Charge,
    request_id: Option<&str>,
) -> Result<Outcome, StoreError> {
    store.check_now(&Check {
        charge,
        request_id,
        ..Check::new(limits, cost)
    })
}

/// A report, settle or refund is never refused, so a check of several limits is not
/// all-or-nothing: each limit does its part, spent or not.
#[test]
fn usage_modes_do_their_part_in_every_limit() {
    let store = MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::from_micros(HOUR))),
    );
    let small = rule("small", Algorithm::FixedWindow, 2, HOUR);
    let large = rule("large", Algorithm::SlidingLog, 100, HOUR);
    let limits = [
        Limit {
            rule: &small,
            key: "k",
        },
        Limit {
            rule: &large,
            key: "k",
        },
    ];
    assert!(check(&store, &small, "k", 2).unwrap());
    let reported = usage(&store, &limits, 5, Charge::Report, None).unwrap();
    assert!(!reported.decision.allowed, "the small limit is in debt");
    assert_eq!(
        reported
            .limits()
            .iter()
            .map(|d| d.remaining)
            .collect::<Vec<_>>(),
        [0, 95],
        "both recorded, though the small one was spent"
    );
    let refunded = usage(&store, &limits, 6, Charge::Refund, Some("r")).unwrap();
    assert_eq!(
        refunded
            .limits()
            .iter()
            .map(|d| d.remaining)
            .collect::<Vec<_>>(),
        [1, 100]
    );
    // No reservation: the settle reports its cost, leaving the small limit exactly spent.
    let settled = usage(&store, &limits, 1, Charge::Settle, Some("s")).unwrap();
    assert!(!settled.decision.allowed);
    assert_eq!(
        settled
            .limits()
            .iter()
            .map(|d| d.remaining)
            .collect::<Vec<_>>(),
        [0, 99]
    );
}

/// Reports create entries as admissions do, within `max_keys`; a refund never creates one.
#[test]
fn usage_modes_create_entries_within_the_key_cap_and_refunds_create_none() {
    let store = MemoryStore::new(
        MemoryStoreConfig {
            max_keys: 2,
            on_full: OnFull::Refuse,
            ..MemoryStoreConfig::default()
        },
        Arc::new(ManualClock::new(Duration::from_micros(HOUR))),
    );
    let rule = rule("r", Algorithm::TokenBucket, 10, HOUR);
    let one = |key| [Limit { rule: &rule, key }];
    let refunded = usage(&store, &one("a"), 3, Charge::Refund, Some("id")).unwrap();
    assert!(refunded.decision.allowed);
    assert_eq!(store.len(), 0, "a refund never creates an entry");
    usage(&store, &one("a"), 0, Charge::Report, None).unwrap();
    usage(&store, &one("a"), 0, Charge::Settle, Some("id")).unwrap();
    assert_eq!(store.len(), 0, "nothing to record, nothing created");
    usage(&store, &one("a"), 30, Charge::Report, None).unwrap();
    usage(&store, &one("b"), 1, Charge::Settle, Some("id")).unwrap();
    assert_eq!(store.len(), 2);
    let both = [
        Limit {
            rule: &rule,
            key: "a",
        },
        Limit {
            rule: &rule,
            key: "c",
        },
    ];
    // A report is never refused: the held key records its unit, the new one finds no room
    // and is not kept, and the outcome says the store was full.
    let reported = usage(&store, &both, 1, Charge::Report, None).unwrap();
    assert_eq!(reported.decided_by, DecidedBy::Full(OnFull::Refuse));
    assert_eq!(store.len(), 2);
    // 31 units in debt, 21 past the burst, so one unit fits again in 22 · T.
    let standing = usage(&store, &one("a"), 0, Charge::Report, None).unwrap();
    assert_eq!(
        standing.decision.retry_after(),
        RetryAfter::After(Duration::from_micros(22 * HOUR / 10))
    );
    assert!(usage(&store, &one("a"), 5, Charge::Refund, None).is_ok());
}

/// Long keys are held as their digests: two that differ in their last byte, and a short key
/// written as the digest of one of them, each keep a limit of their own, exactly; a key
/// forgotten by its whole value is forgotten.
#[test]
fn long_keys_keep_limits_of_their_own() {
    let store = MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::from_micros(HOUR))),
    );
    let per_hour = rule("long", Algorithm::SlidingLog, 3, HOUR);
    let long_a = format!("{}a", "v".repeat(60 * 1024));
    let long_b = format!("{}b", "v".repeat(60 * 1024));
    let crafted = stored_key(&long_a).into_owned();
    for key in [&long_a, &long_b, &crafted] {
        for _ in 0..3 {
            assert!(check(&store, &per_hour, key, 1).unwrap());
        }
        assert!(!check(&store, &per_hour, key, 1).unwrap());
    }
    // Several limits in one check take the same stored keys.
    let other = rule("other", Algorithm::SlidingLog, 10, HOUR);
    let both = [
        Limit {
            rule: &other,
            key: &long_a,
        },
        Limit {
            rule: &per_hour,
            key: &long_a,
        },
    ];
    assert!(
        !store
            .check_now(&Check::new(&both, 1))
            .unwrap()
            .decision
            .allowed
    );
    assert_eq!(store.len(), 3);
    store.forget(&per_hour, &long_a);
    assert_eq!(store.len(), 2);
    assert!(check(&store, &per_hour, &long_a, 1).unwrap());
    assert!(!check(&store, &per_hour, &crafted, 1).unwrap());
}

/// A request id admitted at cost 1 admits no later request of another cost or mode: each is
/// a conflicting reuse, refused as an error that names both uses, and records nothing; the
/// retry of what it was used for is still a repeat. Each mode keeps its own ids.
#[test]
fn a_request_id_reused_for_another_request_is_a_conflict() {
    let store = MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::from_micros(HOUR))),
    );
    let per_hour = rule("tokens", Algorithm::TokenBucket, 10, HOUR);
    let other = rule("other", Algorithm::SlidingLog, 100, HOUR);
    let limits = [
        Limit {
            rule: &other,
            key: "k",
        },
        Limit {
            rule: &per_hour,
            key: "k",
        },
    ];
    let with_id = |cost, charge| Check {
        request_id: Some("R1"),
        charge,
        ..Check::new(&limits[1..], cost)
    };
    let first = store.check_now(&with_id(1, Charge::Check)).unwrap();
    assert_eq!(first.decision.remaining, 9);
    for (cost, charge) in [
        (5, Charge::Check),
        (1_000_000, Charge::Check),
        (0, Charge::Check),
        (1, Charge::Reserve),
    ] {
        assert_eq!(
            store.check_now(&with_id(cost, charge)),
            Err(StoreError::RequestIdConflict(RequestIdConflict {
                request_id: "R1".into(),
                rule: "tokens".into(),
                remembered: RequestUse::new(Charge::Check, 1),
                asked: RequestUse::new(charge, cost),
            })),
            "{cost} {charge:?}"
        );
    }
    // Envoy's counting is a check: the same use.
    let retried = store
        .check_now(&with_id(1, Charge::CheckChargingRefusals))
        .unwrap();
    assert!(retried.decision.allowed);
    assert_eq!(retried.decision.remaining, 9, "a repeat takes nothing");
    // In a check of several rules the conflict in one refuses all: the other records nothing.
    let both = Check {
        request_id: Some("R1"),
        ..Check::new(&limits, 2)
    };
    assert!(matches!(
        store.check_now(&both),
        Err(StoreError::RequestIdConflict(RequestIdConflict { ref rule, .. })) if rule == "tokens"
    ));
    // A peek answers as one unit would: 99 of 100 left in `other`, which recorded nothing.
    let peek = store.check_now(&Check::new(&limits, 0)).unwrap();
    assert_eq!(peek.limits()[0].remaining, 99);
    assert_eq!(peek.limits()[1].remaining, 8);
    // A report's ids are its own: R1 reported at 3, then again at 4, conflicts there.
    let report = |cost| Check {
        request_id: Some("R1"),
        charge: Charge::Report,
        ..Check::new(&limits[1..], cost)
    };
    store.check_now(&report(3)).unwrap();
    assert!(matches!(
        store.check_now(&report(4)),
        Err(StoreError::RequestIdConflict(_))
    ));
    assert_eq!(
        store.check_now(&report(3)).unwrap().decision.remaining,
        6,
        "the report's retry records nothing more"
    );
}
