//! Explain against the real check, over the memory store on a manual clock: it agrees with
//! what the next check decides, and changes nothing (a twin that never explains decides
//! alike), for every algorithm and every counting.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sluicegate::{
    AnyStore, Clock, Limiter, LimiterConfig, ManualClock, MemoryStore, MemoryStoreConfig,
};

use super::Match;
use crate::compat::Counting;
use crate::config::{Config, DEFAULT_ALGORITHM, Entry, LoadOptions};
use crate::service::{Modes, Service, ServiceOptions};

/// One rule per algorithm, small enough that a few checks reach each limit; `twin` is
/// the log rule again under another key, and `free` is unlimited.
const RULES: &str = "domain: d
descriptors:
  - key: log
    rate_limit: {algorithm: sliding-log, window: 10s, requests_per_unit: 5}
  - key: counter
    rate_limit: {algorithm: sliding-counter, window: 10s, requests_per_unit: 5, buckets: 5}
  - key: fixed
    rate_limit: {algorithm: fixed-window, window: 10s, requests_per_unit: 5}
  - key: token
    rate_limit: {algorithm: token-bucket, window: 10s, requests_per_unit: 5, burst: 3}
  - key: leaky
    rate_limit: {algorithm: leaky-bucket, window: 10s, requests_per_unit: 5, queue: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: plan
    value: gold
    rate_limit: {name: gold, window: 10s, requests_per_unit: 9}
  - key: watch
    rate_limit: {window: 10s, requests_per_unit: 1}
    shadow_mode: true
  - key: vip
    rate_limit: {window: 10s, requests_per_unit: 20, replaces: [{name: gold}]}
";

const KEYS: [&str; 5] = ["log", "counter", "fixed", "token", "leaky"];

fn service(counting: Counting, clock: &ManualClock) -> Service {
    let config = Config::parse(
        Path::new("rules.yaml"),
        RULES,
        LoadOptions::new(DEFAULT_ALGORITHM),
    )
    .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let store = MemoryStore::new(MemoryStoreConfig::default(), Arc::clone(&clock));
    let limiter = Limiter::with_clock(AnyStore::Memory(store), LimiterConfig::default(), clock);
    let options = ServiceOptions {
        counting,
        ..ServiceOptions::default()
    };
    Service::new(config, Arc::new(limiter), options)
}

fn entry(key: &str, value: &str) -> Vec<Entry> {
    vec![Entry {
        key: key.into(),
        value: value.into(),
    }]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// One step: advance the clock, then a request of these descriptors at this cost.
#[derive(Debug, Clone)]
struct Step {
    advance_ms: u64,
    /// Indices into KEYS, each with value `a` or `b`.
    descriptors: Vec<(usize, bool)>,
    cost: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![Just(0u64), 0..3_000u64],
        prop::collection::vec((0..KEYS.len(), any::<bool>()), 1..4),
        0..5u64,
    )
        .prop_map(|(advance_ms, descriptors, cost)| Step {
            advance_ms,
            descriptors,
            cost,
        });
    prop::collection::vec(step, 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Before each real check, explain says whether it will be admitted and which
    /// descriptors' limits refuse; the service that explained decides exactly as its twin
    /// that never did.
    #[test]
    fn explain_agrees_with_the_next_check_and_changes_nothing(
        steps in steps(),
        counting in prop_oneof![
            Just(Counting::AllOrNothing),
            Just(Counting::EachDescriptor),
            Just(Counting::StopIncrementWhenOverLimit),
        ],
    ) {
        let (clock, twin_clock) = (ManualClock::new(Duration::from_secs(1000)), ManualClock::new(Duration::from_secs(1000)));
        let (explaining, twin) = (service(counting, &clock), service(counting, &twin_clock));
        runtime().block_on(async {
            for step in &steps {
                clock.advance(Duration::from_millis(step.advance_ms));
                twin_clock.advance(Duration::from_millis(step.advance_ms));
                let descriptors: Vec<Vec<Entry>> = step
                    .descriptors
                    .iter()
                    .map(|&(k, a)| entry(KEYS[k], if a { "a" } else { "b" }))
                    .collect();
                let costs = vec![step.cost; descriptors.len()];
                let explained = explaining.explain("d", &descriptors, step.cost).await.ok().unwrap();
                let decided = explaining.decide("d", &descriptors, &costs, &[], Modes::CHECK).await.ok().unwrap();
                let alone = twin.decide("d", &descriptors, &costs, &[], Modes::CHECK).await.ok().unwrap();
                prop_assert_eq!(explained.allowed, decided.allowed(), "{:?}", step);
                let decisions: Vec<_> = decided.descriptors.iter().map(|d| d.decision).collect();
                let twins: Vec<_> = alone.descriptors.iter().map(|d| d.decision).collect();
                prop_assert_eq!(decisions, twins, "{:?}", step);
                // Each descriptor on a key of its own: its refusal is its limit's own (one
                // held back by another's reports allowed).
                let distinct = step.descriptors.iter().enumerate().all(|(i, d)| !step.descriptors[..i].contains(d));
                if distinct {
                    for (e, d) in explained.descriptors.iter().zip(&decided.descriptors) {
                        prop_assert_eq!(e.would_refuse, !d.decision.unwrap().allowed, "{:?}", step);
                    }
                }
            }
            Ok(())
        })?;
    }
}

/// Why nothing matched, an unlimited rule, a block and a replaced match, each said.
#[test]
fn explain_names_what_matched_and_why_not() {
    let clock = ManualClock::new(Duration::from_secs(1000));
    let service = service(Counting::AllOrNothing, &clock);
    let descriptors = [
        entry("nobody", "x"),
        entry("plan", "silver"),
        entry("free", "x"),
        entry("plan", "gold"),
        entry("vip", "yes"),
    ];
    let explained = runtime()
        .block_on(service.explain("d", &descriptors, 1))
        .ok()
        .unwrap();
    let said: Vec<String> = explained
        .descriptors
        .iter()
        .map(|d| match &d.matched {
            Match::Nothing(why) => format!("none: {why}"),
            Match::Unlimited => "unlimited".into(),
            Match::Block => "block".into(),
            Match::Replaced { path, by } => format!("{path} replaced by {by}"),
            Match::Rule(rule) => format!("{} {}", d.path.as_deref().unwrap(), rule.limit()),
        })
        .collect();
    assert_eq!(
        said,
        [
            "none: entries[0]: the domain has no rule for key \"nobody\"",
            "none: entries[0]: the domain has rules for key \"plan\", none for value \
             \"silver\" and none for the key alone",
            "unlimited",
            "d.plan_gold replaced by d.vip",
            "d.vip 20",
        ]
    );
    assert!(explained.allowed);
    let blocked = runtime()
        .block_on(service.explain("d", &[entry("blocked", "x")], 1))
        .ok()
        .unwrap();
    assert!(matches!(blocked.descriptors[0].matched, Match::Block));
    assert!(!blocked.allowed && blocked.descriptors[0].would_refuse);
    // A shadow limit's refusal is said, and not enforced.
    let watched = runtime()
        .block_on(service.explain("d", &[entry("watch", "x")], 2))
        .ok()
        .unwrap();
    let watch = &watched.descriptors[0];
    assert!(watch.shadow && watch.would_refuse && watched.allowed);
}
