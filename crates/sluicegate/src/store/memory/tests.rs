use super::*;
use crate::algorithm::Charge;
use crate::clock::ManualClock;
use crate::decision::Decision;
use crate::rule::{Algorithm, RuleSpec};
use crate::store::check::Limit;
use std::time::Duration;

const SECOND: u64 = 1_000_000;

/// A token bucket of one a second, and a store on a clock at 10 s.
fn bucket_store() -> (MemoryStore, Rule, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(Duration::from_micros(10 * SECOND)));
    let store = MemoryStore::new(MemoryStoreConfig::default(), clock.clone());
    let spec = RuleSpec::new(Algorithm::TokenBucket, 1, Duration::from_micros(SECOND));
    (store, Rule::new("hinted", &spec).unwrap(), clock)
}

fn decide(store: &MemoryStore, rule: &Rule, at: Option<u64>, charge: Charge) -> Decision {
    let limits = [Limit { rule, key: "k" }];
    let check = Check {
        at: at.map(Duration::from_micros),
        charge,
        ..Check::new(&limits, 1)
    };
    store.check_now(&check).unwrap().decision
}

/// Admits the key's one unit, then refuses it under the lock, which publishes the hint.
fn refused_once(store: &MemoryStore, rule: &Rule) -> Decision {
    assert!(decide(store, rule, None, Charge::Check).allowed);
    let refused = decide(store, rule, None, Charge::Check);
    assert!(!refused.allowed);
    refused
}

#[test]
fn a_refused_key_is_refused_while_its_shard_is_locked() {
    let (store, rule, _clock) = bucket_store();
    let first = refused_once(&store, &rule);
    let index = store.shard_of(store.hash(&rule, b"k"));
    let (sent, answered) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let held = store.shards[index].write();
        scope.spawn(|| {
            sent.send(decide(&store, &rule, None, Charge::Check))
                .unwrap()
        });
        // Without the hint the check waits for the lock, which is held until it answers
        // or this gives up.
        let got = answered.recv_timeout(std::time::Duration::from_secs(30));
        drop(held);
        assert_eq!(got.expect("refused without the shard's lock"), first);
    });
}

#[test]
fn a_refund_clears_the_hint_of_its_key_alone_or_with_another_rule() {
    let other = Rule::new(
        "other",
        &RuleSpec::new(Algorithm::FixedWindow, 5, Duration::from_micros(SECOND)),
    )
    .unwrap();
    for with_other in [false, true] {
        let (store, rule, _clock) = bucket_store();
        refused_once(&store, &rule);
        // One rule goes through check_one, two through check_many.
        let mut limits = vec![Limit {
            rule: &rule,
            key: "k",
        }];
        if with_other {
            limits.push(Limit {
                rule: &other,
                key: "k",
            });
        }
        let refund = Check {
            charge: Charge::Refund,
            request_id: Some("refund-1"),
            ..Check::new(&limits, 1)
        };
        store.check_now(&refund).unwrap();
        let after = decide(&store, &rule, None, Charge::Check);
        assert!(after.allowed, "with another rule: {with_other}");
    }
}

#[test]
fn a_swept_key_is_no_longer_hinted() {
    let (store, rule, clock) = bucket_store();
    refused_once(&store, &rule);
    clock.advance(Duration::from_micros(SECOND));
    assert_eq!(store.sweep(), 1);
    // Stamped before the sweep, a check finds no state at all, as the sweep left it.
    let earlier = 10 * SECOND;
    assert!(decide(&store, &rule, Some(earlier), Charge::Check).allowed);
}

#[test]
fn a_key_dropped_by_any_sweep_is_no_longer_hinted() {
    for trigger in ["a check", "a check of several rules", "the key cap"] {
        // One shard, so that other keys' checks sweep the hinted key's shard, and a
        // bucket that is empty again 100 ms after its one unit.
        let clock = Arc::new(ManualClock::new(Duration::from_micros(10 * SECOND)));
        let config = MemoryStoreConfig {
            max_keys: 2,
            shards: 1,
            on_full: OnFull::Refuse,
            ..MemoryStoreConfig::default()
        };
        let store = MemoryStore::new(config, clock.clone());
        let spec = RuleSpec::new(
            Algorithm::TokenBucket,
            1,
            Duration::from_micros(SECOND / 10),
        );
        let rule = Rule::new("hinted", &spec).unwrap();
        refused_once(&store, &rule);
        let other = Rule::new(
            "other",
            &RuleSpec::new(Algorithm::FixedWindow, 5, Duration::from_micros(SECOND)),
        )
        .unwrap();
        let at = |micros: u64, limits: &[Limit]| {
            let check = Check {
                at: Some(Duration::from_micros(micros)),
                ..Check::new(limits, 1)
            };
            store.check_now(&check)
        };
        let j = [Limit {
            rule: &rule,
            key: "j",
        }];
        match trigger {
            // Past the shard's next sweep (1 s after the first check).
            "a check" => assert!(at(12 * SECOND, &j).unwrap().decision.allowed),
            "a check of several rules" => {
                let both = [
                    j[0],
                    Limit {
                        rule: &other,
                        key: "j",
                    },
                ];
                assert!(at(12 * SECOND, &both).unwrap().decision.allowed);
            }
            // Before it: the cap's sweep makes the room.
            _ => {
                assert!(at(10 * SECOND + SECOND / 2, &j).unwrap().decision.allowed);
                let m = [Limit {
                    rule: &rule,
                    key: "m",
                }];
                assert!(at(10 * SECOND + SECOND / 2, &m).unwrap().decision.allowed);
            }
        }
        // Stamped when the key was refused, a check finds no state, as the sweep left it:
        // admitted, or, with the cap full, refused as full (never refused from the hint).
        let k = [Limit {
            rule: &rule,
            key: "k",
        }];
        let answer = at(10 * SECOND, &k).unwrap();
        assert!(
            answer.decision.allowed || answer.decided_by == DecidedBy::Full(OnFull::Refuse),
            "after {trigger}: {answer:?}"
        );
    }
}

#[test]
fn a_forgotten_key_is_no_longer_hinted() {
    let (store, rule, _clock) = bucket_store();
    refused_once(&store, &rule);
    store.forget(&rule, "k");
    assert!(decide(&store, &rule, None, Charge::Check).allowed);
}

#[test]
fn a_reloaded_rule_is_not_answered_from_the_old_rules_hint() {
    let (store, rule, _clock) = bucket_store();
    refused_once(&store, &rule);
    // The same identity with a larger burst: the state is shared, the numbers are not.
    let spec = RuleSpec {
        burst: Some(2),
        ..rule.spec()
    };
    let reloaded = Rule::new("hinted", &spec).unwrap();
    assert!(reloaded.same_identity(&rule));
    assert!(decide(&store, &reloaded, None, Charge::Check).allowed);
}

#[test]
fn an_entry_is_one_cache_line() {
    assert_eq!(std::mem::size_of::<CompactKey>(), 16);
    assert_eq!(std::mem::size_of::<Slot>(), 64);
}

#[test]
fn compact_keys_round_trip() {
    for key in ["", "a", "exactly-14-byt", "fifteen-bytes-k", "ключ-🔑"] {
        assert_eq!(CompactKey::new(key).as_bytes(), key.as_bytes());
    }
    assert!(matches!(
        CompactKey::new("fifteen-bytes-k"),
        CompactKey::Heap(_)
    ));
}
