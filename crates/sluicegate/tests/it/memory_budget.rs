//! The memory budget and what a full store answers: bytes counted honestly (every byte an
//! entry held is given back when it goes), a flood under one rule leaves room for the
//! others, eviction never touches a key at its limit, and held keys decide exactly.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sluicegate::internals::{FULL_RETRY_AFTER, MAX_STORED_KEY_BYTES};
use sluicegate::{
    Algorithm, Charge, Check, DecidedBy, Limit, ManualClock, MemoryBudget, MemoryStore,
    MemoryStoreConfig, OnFull, Outcome, RetryAfter, Rule, RuleSpec,
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

fn store(
    budget: &MemoryBudget,
    max_keys: usize,
    on_full: OnFull,
    clock: &ManualClock,
) -> MemoryStore {
    MemoryStore::new(
        MemoryStoreConfig {
            max_keys,
            shards: 4,
            budget: budget.part(MemoryStore::BUDGET_PART),
            on_full,
        },
        Arc::new(clock.clone()),
    )
}

fn check(store: &MemoryStore, rule: &Rule, key: &str, cost: u64) -> Outcome {
    let limits = [Limit { rule, key }];
    store.check_now(&Check::new(&limits, cost)).unwrap()
}

/// What a table bucket counts: a 64-byte slot and its control byte.
const BUCKET_BYTES: usize = 65;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// After any trace (every algorithm, long keys, request ids, several limits per check),
    /// the rules' counts add up to the store's entries, and once every key is forgotten all
    /// that stays counted is the tables' buckets: every heap byte counted came back.
    #[test]
    fn counted_bytes_match_what_the_store_holds(
        steps in prop::collection::vec(
            (0usize..5, 0usize..40, 0u64..4, any::<bool>(), any::<bool>(), 0u64..3),
            1..300,
        )
    ) {
        let clock = ManualClock::new(Duration::from_micros(HOUR));
        let budget = MemoryBudget::new(1 << 30, 1.0).unwrap();
        let store = store(&budget, 1_000_000, OnFull::EvictIdle, &clock);
        let rules = [
            rule("log", Algorithm::SlidingLog, 5, 10 * S),
            rule("fixed", Algorithm::FixedWindow, 5, 10 * S),
            rule("counter", Algorithm::SlidingCounter, 5, 10 * S),
            rule("bucket", Algorithm::TokenBucket, 5, 10 * S),
            rule("leaky", Algorithm::LeakyBucket, 5, 10 * S),
        ];
        let key_of = |k: usize| {
            if k.is_multiple_of(3) { format!("a-long-key-of-many-bytes-{k}") } else { format!("k{k}") }
        };
        let mut id = 0;
        for (r, k, cost, with_id, two, advance) in steps {
            let key = key_of(k);
            let other = key_of(k + 1);
            let mut limits = vec![Limit { rule: &rules[r], key: &key }];
            if two {
                limits.push(Limit { rule: &rules[(r + 1) % rules.len()], key: &other });
            }
            id += 1;
            let request_id = format!("request-{id}");
            let check = Check {
                request_id: with_id.then_some(request_id.as_str()),
                ..Check::new(&limits, cost)
            };
            store.check_now(&check).unwrap();
            clock.advance(Duration::from_micros(advance * S));
            let held: usize = rules.iter().map(|r| store.rule_usage(r).0).sum();
            prop_assert_eq!(held, store.len());
        }
        for r in &rules {
            for k in 0..41 {
                store.forget(r, &key_of(k));
            }
            prop_assert_eq!(store.rule_usage(r), (0, 0));
        }
        prop_assert_eq!(store.len(), 0);
        prop_assert_eq!(store.bytes() % BUCKET_BYTES, 0, "heap bytes left: {}", store.bytes());
        prop_assert_eq!(budget.used(), store.bytes());
    }

    /// However a flood and legitimate keys interleave, `evict-idle` never evicts a key at
    /// its limit: each such key is still refused once the flood is over.
    #[test]
    fn eviction_never_evicts_a_key_at_its_limit(
        order in prop::collection::vec(any::<bool>(), 50..200),
        algorithm in prop::sample::select(vec![
            Algorithm::SlidingLog,
            Algorithm::FixedWindow,
            Algorithm::SlidingCounter,
            Algorithm::TokenBucket,
        ]),
    ) {
        let clock = ManualClock::new(Duration::from_micros(HOUR));
        let budget = MemoryBudget::new(1 << 30, 1.0).unwrap();
        let store = store(&budget, 20, OnFull::EvictIdle, &clock);
        let rule = rule("hourly", algorithm, 3, HOUR);
        let mut at_limit = Vec::new();
        let mut flood = 0;
        for (i, legit) in order.into_iter().enumerate() {
            if legit {
                let key = format!("user-{i}");
                let taken = check(&store, &rule, &key, 3);
                if taken.decision.allowed {
                    at_limit.push(key);
                }
            } else {
                flood += 1;
                check(&store, &rule, &format!("flood-{flood}"), 1);
            }
            clock.advance(Duration::from_micros(S));
        }
        for key in &at_limit {
            let again = check(&store, &rule, key, 1);
            prop_assert!(!again.decision.allowed, "{key} was evicted: {again:?}");
            prop_assert_eq!(again.decided_by, DecidedBy::Store);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Keys held before the store fills decide exactly as on a store without bounds, while
    /// a flood of new keys keeps it full, under the policies that evict nothing.
    #[test]
    fn held_keys_decide_exactly_while_the_store_is_full(
        steps in prop::collection::vec((0usize..4, 0u64..4, any::<bool>(), 0u64..500), 1..200),
        on_full in prop::sample::select(vec![OnFull::Refuse, OnFull::Allow]),
        algorithm in prop::sample::select(vec![
            Algorithm::SlidingLog,
            Algorithm::FixedWindow,
            Algorithm::SlidingCounter,
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
        ]),
    ) {
        let clock = ManualClock::new(Duration::from_micros(HOUR));
        let budget = MemoryBudget::new(1 << 30, 0.5).unwrap();
        let bounded = store(&budget, 16, on_full, &clock);
        let unbounded = store(&MemoryBudget::unlimited(), 1_000_000, on_full, &clock);
        let rule = rule("hourly", algorithm, 6, HOUR);
        let held = ["alice", "bob", "carol", "dave"];
        for key in held {
            check(&bounded, &rule, key, 1);
            check(&unbounded, &rule, key, 1);
        }
        let mut flood = 0;
        for (k, cost, flooding, advance_ms) in steps {
            if flooding {
                flood += 1;
                check(&bounded, &rule, &format!("flood-{flood}"), 1);
            } else {
                let got = check(&bounded, &rule, held[k], cost);
                let want = check(&unbounded, &rule, held[k], cost);
                prop_assert_eq!(got.decision, want.decision, "{}", held[k]);
                prop_assert_eq!(got.decided_by, DecidedBy::Store);
            }
            clock.advance(Duration::from_micros(advance_ms * 1_000));
        }
    }
}

/// The second attack of a full store, in the library: one rule flooded with new keys until full.
/// Under every policy, the other rule's new keys still get in (its share is untouched),
/// and a key held before the flood keeps deciding exactly.
#[test]
fn a_flood_on_one_rule_leaves_the_other_rules_their_share() {
    for on_full in [OnFull::Refuse, OnFull::Allow, OnFull::EvictIdle] {
        let clock = ManualClock::new(Duration::from_micros(HOUR));
        let budget = MemoryBudget::new(1 << 30, 0.5).unwrap();
        let store = store(&budget, 100, on_full, &clock);
        let flooded = rule("per-user-hourly", Algorithm::FixedWindow, 10, HOUR);
        let other = rule("per-api", Algorithm::TokenBucket, 5, S);
        // At its limit, so that no policy may evict it.
        for _ in 0..10 {
            assert!(check(&store, &flooded, "held", 1).decision.allowed);
        }
        let mut full = 0;
        for i in 0..1_000 {
            let outcome = check(&store, &flooded, &format!("attacker-{i}"), 1);
            if let DecidedBy::Full(policy) = outcome.decided_by {
                assert_eq!(policy, on_full);
                full += 1;
                match on_full {
                    OnFull::Allow => assert!(outcome.decision.allowed),
                    _ => {
                        assert!(!outcome.decision.allowed);
                        assert_eq!(
                            outcome.decision.retry_after(),
                            RetryAfter::After(Duration::from_micros(FULL_RETRY_AFTER))
                        );
                    }
                }
            }
        }
        assert_eq!(
            store.rule_usage(&flooded).0,
            50,
            "{on_full:?}: its share of 100 keys"
        );
        if on_full == OnFull::EvictIdle {
            // The attacker's idle keys make room for the next new ones of the same rule.
            assert_eq!(full, 0, "evicted its own idle keys");
        } else {
            assert_eq!(full, 1_000 - 49, "{on_full:?}");
        }
        for i in 0..50 {
            let outcome = check(&store, &other, &format!("user-{i}"), 1);
            assert!(outcome.decision.allowed, "{on_full:?}: {outcome:?}");
            assert_eq!(outcome.decided_by, DecidedBy::Store, "{on_full:?}");
        }
        // Held keys decide exactly: 10 of 10 taken before the flood, refused after it.
        let refused = check(&store, &flooded, "held", 1);
        assert!(!refused.decision.allowed);
        assert_eq!(refused.decided_by, DecidedBy::Store);
    }
}

/// Shares are counted per place, not per state identity: two rules counting in envoy's
/// counters of one window share an identity (`envoy|w=…`), and requests' limit overrides
/// that match no rule are each a rule of their own name — yet a flood through one place
/// leaves another place its share, and a flood of distinct overrides in one place takes
/// that place's share only.
#[test]
fn shares_are_counted_per_place_not_per_state_identity() {
    let clock = ManualClock::new(Duration::from_micros(HOUR));
    let budget = MemoryBudget::new(1 << 30, 0.5).unwrap();
    let store = store(&budget, 100, OnFull::Refuse, &clock);
    let minute = |name: &str, place: &str| {
        rule(name, Algorithm::FixedWindow, 10, 60 * S)
            .in_scope(place)
            .with_envoy_counter()
            .unwrap()
    };
    let flooded = minute("d.user", "6:d.user");
    let other = minute("d.api", "5:d.api");
    assert_eq!(flooded.identity(), other.identity(), "one envoy counter");
    for i in 0..200 {
        // Each flood key a rule of its own name, as an override matching no rule is.
        let overriding = minute(&format!("d.user_{i}"), "6:d.user");
        check(&store, &overriding, &format!("attacker-{i}"), 1);
    }
    assert_eq!(store.rule_usage(&flooded).0, 50, "one share for the place");
    for i in 0..50 {
        let outcome = check(&store, &other, &format!("user-{i}"), 1);
        assert!(outcome.decision.allowed, "{outcome:?}");
        assert_eq!(outcome.decided_by, DecidedBy::Store);
    }
}

/// `evict-idle` takes the least recently written idle key of the flooding rule; with only
/// keys at their limit left, it evicts nothing and refuses as full.
#[test]
fn evict_idle_evicts_idle_keys_and_refuses_when_none_may_go() {
    let clock = ManualClock::new(Duration::from_micros(HOUR));
    let budget = MemoryBudget::new(1 << 30, 1.0).unwrap();
    let store = MemoryStore::new(
        MemoryStoreConfig {
            max_keys: 4,
            shards: 1,
            budget: budget.part(MemoryStore::BUDGET_PART),
            on_full: OnFull::EvictIdle,
        },
        Arc::new(clock.clone()),
    );
    let rule = rule("hourly", Algorithm::SlidingLog, 2, HOUR);
    for i in 0..4 {
        assert!(
            check(&store, &rule, &format!("idle-{i}"), 1)
                .decision
                .allowed
        );
        clock.advance(Duration::from_micros(S));
    }
    let made_room = check(&store, &rule, "new", 2);
    assert!(made_room.decision.allowed);
    assert_eq!(
        (made_room.decided_by, made_room.evictions),
        (DecidedBy::Store, 1)
    );
    // The oldest went: it starts again from empty, evicting the next oldest.
    let oldest = check(&store, &rule, "idle-0", 1);
    assert_eq!(oldest.evictions, 1);
    assert_eq!(oldest.decision.remaining, 1);
    // Fill every key to its limit: nothing may go, so a new key is refused as full.
    for key in ["idle-0", "idle-2", "idle-3"] {
        while check(&store, &rule, key, 1).decision.allowed {}
    }
    let refused = check(&store, &rule, "newer", 1);
    assert_eq!(refused.decided_by, DecidedBy::Full(OnFull::EvictIdle));
    assert!(!refused.decision.allowed);
    assert_eq!(refused.evictions, 0);
}

/// The budget bounds bytes, not entries: long keys (as long as a key is stored whole)
/// fill it long before the key cap, and a key's bytes count in its rule's share.
#[test]
fn long_keys_fill_the_byte_budget_before_the_key_cap() {
    let clock = ManualClock::new(Duration::from_micros(HOUR));
    let budget = MemoryBudget::new(256 * 1024, 0.5).unwrap();
    let store = store(&budget, 1_000_000, OnFull::Refuse, &clock);
    let hourly = rule("hourly", Algorithm::FixedWindow, 10, HOUR);
    let value = "v".repeat(MAX_STORED_KEY_BYTES - 8);
    let mut held = 0;
    for i in 0..10_000 {
        if check(&store, &hourly, &format!("{i:07}-{value}"), 1)
            .decision
            .allowed
        {
            held += 1;
        }
    }
    let (keys, bytes) = store.rule_usage(&hourly);
    assert_eq!(keys, held);
    let share = 128 * 1024;
    assert!(bytes <= share, "within its share: {bytes}");
    // Refused for bytes: the share has no room for one more key of this size.
    assert!(held < 10_000, "{held} keys");
    assert!(
        bytes + bytes / held > share,
        "{held} keys of {} bytes in a {share}-byte share",
        bytes / held
    );
    assert!(budget.used() <= budget.limit());
    // A short key of another rule still fits.
    let other = rule("other", Algorithm::FixedWindow, 10, HOUR);
    assert!(check(&store, &other, "short", 1).decision.allowed);
}

/// A report is never refused: full, it is answered as if alone, not kept, and marked full.
#[test]
fn a_report_without_room_is_answered_and_not_kept() {
    let clock = ManualClock::new(Duration::from_micros(HOUR));
    let budget = MemoryBudget::new(1 << 30, 1.0).unwrap();
    let store = store(&budget, 1, OnFull::Refuse, &clock);
    let rule = rule("hourly", Algorithm::TokenBucket, 10, HOUR);
    assert!(check(&store, &rule, "a", 10).decision.allowed);
    let limits = [Limit {
        rule: &rule,
        key: "b",
    }];
    let report = Check {
        charge: Charge::Report,
        ..Check::new(&limits, 3)
    };
    let outcome = store.check_now(&report).unwrap();
    assert_eq!(outcome.decided_by, DecidedBy::Full(OnFull::Refuse));
    assert_eq!(store.len(), 1);
}

/// Request ids on one held key are bounded by the budget too: past it, a report is still
/// counted (units are never dropped) but its id is not remembered, and a check that may
/// refuse is answered by the policy; the store never holds more than the budget.
#[test]
fn request_ids_on_a_held_key_stay_within_the_budget() {
    for on_full in [OnFull::Refuse, OnFull::Allow, OnFull::EvictIdle] {
        let clock = ManualClock::new(Duration::from_micros(HOUR));
        let budget = MemoryBudget::new(64 * 1024, 1.0).unwrap();
        let store = store(&budget, 1_000, on_full, &clock);
        let tokens = rule("tokens", Algorithm::TokenBucket, 1_000_000, HOUR);
        let limits = [Limit {
            rule: &tokens,
            key: "model",
        }];
        let id_of = |i: usize| format!("{i:08}-{}", "r".repeat(200));
        let mut full = 0;
        for i in 0..1_000 {
            let id = id_of(i);
            let report = Check {
                charge: Charge::Report,
                request_id: Some(&id),
                ..Check::new(&limits, 1)
            };
            let outcome = store.check_now(&report).unwrap();
            if outcome.decided_by == DecidedBy::Full(on_full) {
                full += 1;
            }
            assert!(store.bytes() <= budget.limit(), "{on_full:?}: report {i}");
        }
        assert!(full > 500, "{on_full:?}: {full} reports found no room");
        // Every report's unit was counted, remembered or not: 1,000 of 1,000,000 spent (a
        // peek answers as a cost of 1 would).
        let peek = store.check_now(&Check::new(&limits, 0)).unwrap();
        assert_eq!(
            peek.decision.remaining,
            1_000_000 - 1_000 - 1,
            "{on_full:?}"
        );
        // A check with a new id: the policy answers it, as a new key's.
        let id = id_of(5_000);
        let checked = store
            .check_now(&Check {
                request_id: Some(&id),
                ..Check::new(&limits, 1)
            })
            .unwrap();
        assert_eq!(checked.decided_by, DecidedBy::Full(on_full), "{on_full:?}");
        assert_eq!(
            checked.decision.allowed,
            on_full == OnFull::Allow,
            "{on_full:?}"
        );
        assert!(store.bytes() <= budget.limit());
    }
}
