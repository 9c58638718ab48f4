//! Property tests: the in-memory store against a brute-force model of docs/SPEC.md.
//!
//! The model keeps what every (rule, key) recorded and recomputes every decision field from
//! it with docs/SPEC.md's formulas, literally (`model/state.rs`), and records by the SPEC's
//! words (`model/usage.rs`): admissions, charged refusals, and the usage modes — reports
//! into debt, reservations and their settles, refunds, each mode's request ids. It shares no
//! code with the store beyond the public types, so a disagreement is a bug in one of them.
//!
//! Traces mix the modes, retry request ids, name several rules, step time back, and reload
//! rules mid-way (docs/SPEC.md, "Changing a rule's numbers"): a rule keeps its name and gets
//! new numbers; the model keeps one history per state the SPEC says the rule shares, and
//! reads it under the numbers in force.

mod reload;
mod state;
mod usage;

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use sluicegate::internals::saturating_micros;
use sluicegate::{
    Algorithm, Charge, Check, Decision, Limit, LogLayout, ManualClock, MemoryStore,
    MemoryStoreConfig, Rule, RuleSpec, StoreError,
};
use std::sync::Arc;

use reload::{Reload, reload_strategy, reloaded, shared_by};
use state::{Fit, ModelId, ModelKey, delayed, model_combine, model_evaluate};

/// The model of a whole store: one history per (rule name, state it shares, key).
#[derive(Default)]
struct Model {
    keys: HashMap<(usize, String, String), ModelKey>,
}

impl Model {
    fn check(
        &mut self,
        rules: &[(usize, &Rule)],
        key: &str,
        t: u64,
        costs: &[u64],
        id: Option<&str>,
        charge: Charge,
    ) -> Option<(Decision, Vec<Decision>)> {
        // A conflicting reuse of the id in any rule: refused whole, nothing recorded.
        if let Some(id) = id
            && rules.iter().zip(costs).any(|(&(i, rule), &cost)| {
                self.keys
                    .get(&(i, shared_by(rule), key.to_owned()))
                    .is_some_and(|state| usage::conflicts(state, t, cost, id, charge))
            })
        {
            return None;
        }
        let per_rule = if charge.may_refuse() {
            self.admit(rules, key, t, costs, id, charge)
        } else {
            // Never refused: each limit does its part.
            rules
                .iter()
                .zip(costs)
                .map(|(&(i, rule), &cost)| {
                    let state = self
                        .keys
                        .entry((i, shared_by(rule), key.to_owned()))
                        .or_default();
                    usage::usage(rule, state, t, cost, id, charge)
                })
                .collect()
        };
        Some((model_combine(&per_rule), per_rule))
    }

    /// A check or a reserve, all-or-nothing, and envoy's counting of refusals.
    fn admit(
        &mut self,
        rules: &[(usize, &Rule)],
        key: &str,
        t: u64,
        costs: &[u64],
        id: Option<&str>,
        charge: Charge,
    ) -> Vec<Decision> {
        let evals: Vec<_> = rules
            .iter()
            .zip(costs)
            .map(|(&(i, rule), &cost)| {
                let state = self
                    .keys
                    .entry((i, shared_by(rule), key.to_owned()))
                    .or_default();
                model_evaluate(rule, state, t, cost, id, charge)
            })
            .collect();
        let all = evals
            .iter()
            .all(|e| matches!(e.fit, Fit::Fits | Fit::Repeat(_)));
        rules
            .iter()
            .zip(&evals)
            .zip(costs)
            .map(|((&(i, rule), e), &cost)| {
                let state = self
                    .keys
                    .get_mut(&(i, shared_by(rule), key.to_owned()))
                    .unwrap();
                match (all, e.fit) {
                    (true, Fit::Repeat(release)) => {
                        let mut repeated = delayed(e.refused, release.saturating_sub(e.now));
                        repeated.allowed = true;
                        repeated
                    }
                    (true, _) => {
                        if cost > 0 {
                            usage::record(rule, state, e.now, cost);
                            if let Some(id) = id {
                                // A reservation is remembered at least a window, with its units,
                                // its instant and the TAT it set.
                                let reserve = charge == Charge::Reserve;
                                let reset = saturating_micros(e.admitted.reset_after());
                                usage::forget_expired_ids(state, e.now);
                                state.ids.push(ModelId {
                                    namespace: "admission",
                                    id: id.to_owned(),
                                    used: (charge.name(), cost),
                                    expires: e.now
                                        + if reserve {
                                            reset.max(saturating_micros(rule.window()))
                                        } else {
                                            reset
                                        },
                                    release: e.now + saturating_micros(e.admitted.delay()),
                                    reservation: reserve.then_some((cost, e.now, e.now + reset)),
                                });
                            }
                        }
                        e.admitted
                    }
                    // docs/SPEC.md, "Charging refusals": a fixed window that refuses
                    // counts the units all the same, then answers as refused after them.
                    (false, Fit::Over | Fit::Never)
                        if charge == Charge::CheckChargingRefusals
                            && cost > 0
                            && rule.algorithm() == Algorithm::FixedWindow =>
                    {
                        usage::record(rule, state, e.now, cost);
                        model_evaluate(rule, state, t, cost, id, charge).refused
                    }
                    (false, fit) => {
                        let mut unsent = e.refused;
                        unsent.allowed = matches!(fit, Fit::Fits | Fit::Repeat(_));
                        unsent
                    }
                }
            })
            .collect()
    }
}

fn rule_strategy() -> impl Strategy<Value = RuleSpec> {
    let windows = prop::sample::select(vec![10u64, 12, 30, 60, 100, 120]);
    (
        0usize..5,
        1u64..=6,
        windows,
        1u64..=6,
        0u64..=4,
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(
            |(algo, limit, window, burst, queue, bucket_pick, compact)| {
                let algorithm = Algorithm::ALL[algo];
                let mut spec = RuleSpec::new(algorithm, limit, Duration::from_micros(window));
                match algorithm {
                    // Both layouts decide alike; they differ in what a reload keeps.
                    Algorithm::SlidingLog if compact => spec.layout = Some(LogLayout::Compact),
                    Algorithm::SlidingCounter => {
                        let divisors: Vec<u64> = (1..=12).filter(|n| window % n == 0).collect();
                        spec.buckets = Some(*bucket_pick.get(&divisors));
                    }
                    Algorithm::TokenBucket => spec.burst = Some(burst),
                    Algorithm::LeakyBucket => spec.queue = Some(queue),
                    _ => {}
                }
                spec
            },
        )
}

#[derive(Clone, Debug)]
enum Step {
    Same,
    Forward(u64),
    /// Jump to just before, at, or just after the next multiple of this many µs.
    Boundary(u64, i8),
    Back(u64),
}

#[derive(Clone, Debug)]
struct Event {
    step: Step,
    key: usize,
    cost: u64,
    /// Each rule's own cost (`Check::costs`), instead of `cost` for all.
    own_costs: Option<[u64; 3]>,
    /// Which of the rules the check names (bit mask; 0 means all).
    rules: u8,
    id: Option<u8>,
    /// The check's mode.
    mode: Charge,
    /// Before the check, a reload gives one rule (the `key`-th, modulo) new numbers.
    reload: Option<Reload>,
}

/// Plain checks only.
const CHECKS: &[Charge] = &[Charge::Check];
/// Checks with refusals charged only.
const CHARGED: &[Charge] = &[Charge::CheckChargingRefusals];
/// Every mode: checks and reservations to take units, reports, settles and refunds to
/// move them, in about equal parts.
const MIXED: &[Charge] = &[
    Charge::Check,
    Charge::Check,
    Charge::CheckChargingRefusals,
    Charge::Reserve,
    Charge::Reserve,
    Charge::Report,
    Charge::Report,
    Charge::Settle,
    Charge::Settle,
    Charge::Refund,
    Charge::Refund,
];

fn event_strategy(modes: &'static [Charge]) -> impl Strategy<Value = Event> {
    let step = prop_oneof![
        3 => Just(Step::Same),
        6 => (1u64..40).prop_map(Step::Forward),
        2 => (prop::sample::select(vec![10u64, 12, 30, 60, 100, 120]), -1i8..=1)
            .prop_map(|(m, o)| Step::Boundary(m, o)),
        1 => (1u64..30).prop_map(Step::Back),
    ];
    let id = prop_oneof![3 => Just(None), 1 => (0u8..4).prop_map(Some)];
    let own_costs = prop::option::weighted(0.3, [0u64..=3, 0u64..=3, 0u64..=3]);
    // Now and then more than any limit holds: a report of it goes into debt.
    let cost = prop_oneof![6 => 0u64..=3, 1 => 4u64..=12];
    (
        step,
        0usize..3,
        cost,
        own_costs,
        any::<u8>(),
        id,
        prop::sample::select(modes),
        reload_strategy(),
    )
        .prop_map(
            |(step, key, cost, own_costs, rules, id, mode, reload)| Event {
                step,
                key,
                cost,
                own_costs,
                rules,
                // The few ids make retries common (a reserve and a settle without one get
                // theirs in `run_trace`).
                id,
                mode,
                reload,
            },
        )
}

const KEYS: [&str; 3] = ["user:1", "user:{1}", ""];

fn run_trace(specs: &[RuleSpec], events: &[Event]) -> Result<(), TestCaseError> {
    let name = |i: usize| format!("r{i}");
    let mut rules: Vec<Rule> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| Rule::new(&name(i), s).unwrap())
        .collect();
    // The default shards, and one shard for every key: there every check meets the refusal
    // another key published, and the writes that must clear it.
    let stores = [MemoryStoreConfig::default().shards, 1].map(|shards| {
        let config = MemoryStoreConfig {
            shards,
            ..MemoryStoreConfig::default()
        };
        MemoryStore::new(config, Arc::new(ManualClock::new(Duration::ZERO)))
    });
    let mut model = Model::default();
    let mut t: u64 = 1_000;
    let mut last_reserve: Option<(String, usize)> = None;
    for (n, event) in events.iter().enumerate() {
        t = match event.step {
            Step::Same => t,
            Step::Forward(d) => t + d,
            Step::Boundary(m, o) => ((t / m + 1) * m).saturating_add_signed(i64::from(o)),
            Step::Back(d) => t.saturating_sub(d),
        };
        if let Some(reload) = &event.reload {
            let i = event.key % rules.len();
            let spec = reloaded(&rules[i].spec(), reload);
            rules[i] = Rule::new(&name(i), &spec).unwrap();
        }
        let chosen: Vec<(usize, &Rule)> = rules
            .iter()
            .enumerate()
            .filter(|(i, _)| event.rules == 0 || event.rules & (1 << i) != 0)
            .collect();
        let chosen = if chosen.is_empty() {
            rules.iter().enumerate().collect()
        } else {
            chosen
        };
        // A reserve without a drawn id gets one of its own, and a settle without one settles
        // the latest reserve, on its key: so settles meet their reservations, live, expired,
        // or in a later window or bucket, and not only retries.
        let (id, key) = match (event.id, event.mode) {
            (Some(i), _) => (Some(format!("req-{i}")), event.key),
            (None, Charge::Reserve) => (Some(format!("reserve-{n}")), event.key),
            (None, Charge::Settle) => last_reserve
                .clone()
                .map_or((Some("req-0".into()), event.key), |(id, key)| {
                    (Some(id), key)
                }),
            (None, _) => (None, event.key),
        };
        if event.mode == Charge::Reserve {
            last_reserve = id.clone().map(|id| (id, key));
        }
        let key = KEYS[key];
        let limits: Vec<Limit> = chosen
            .iter()
            .map(|&(_, rule)| Limit { rule, key })
            .collect();
        let own_costs: Vec<u64> = event
            .own_costs
            .map_or(Vec::new(), |c| c[..limits.len()].to_vec());
        let check = Check {
            limits: &limits,
            cost: event.cost,
            costs: &own_costs,
            request_id: id.as_deref(),
            at: Some(Duration::from_micros(t)),
            charge: event.mode,
        };
        let costs: Vec<u64> = (0..limits.len())
            .map(|i| own_costs.get(i).copied().unwrap_or(event.cost))
            .collect();
        let wanted = model.check(&chosen, key, t, &costs, id.as_deref(), event.mode);
        for (store, shards) in stores.iter().zip(["default shards", "one shard"]) {
            let got = store.check_now(&check);
            let Some((want, want_limits)) = &wanted else {
                prop_assert!(
                    matches!(got, Err(StoreError::RequestIdConflict(_))),
                    "{}: event {} at t={} {:?}: a conflicting reuse answered {:?}",
                    shards,
                    n,
                    t,
                    event,
                    got
                );
                continue;
            };
            let got = got.unwrap();
            prop_assert_eq!(
                got.limits(),
                want_limits,
                "{}: event {} at t={} {:?}: per-rule decisions differ",
                shards,
                n,
                t,
                event
            );
            prop_assert_eq!(
                got.decision,
                *want,
                "{}: event {} at t={}: combined differs",
                shards,
                n,
                t
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 250, ..ProptestConfig::default() })]

    /// One rule per trace: every algorithm, every decision field.
    #[test]
    fn single_rule_matches_model(
        spec in rule_strategy(),
        events in prop::collection::vec(event_strategy(CHECKS), 1..150),
    ) {
        run_trace(&[spec], &events)?;
    }

    /// Several rules per check: all-or-nothing and the combined decision.
    #[test]
    fn several_rules_match_model(
        specs in prop::collection::vec(rule_strategy(), 2..=3),
        events in prop::collection::vec(event_strategy(CHECKS), 1..120),
    ) {
        run_trace(&specs, &events)?;
    }

    /// Refusals charged (`Charge::CheckChargingRefusals`), one rule or several: fixed windows count
    /// what they refuse, the rules that would have allowed record nothing, the other
    /// algorithms are as without the charge.
    #[test]
    fn charged_refusals_match_model(
        specs in prop::collection::vec(rule_strategy(), 1..=3),
        events in prop::collection::vec(event_strategy(CHARGED), 1..120),
    ) {
        run_trace(&specs, &events)?;
    }

    /// Every mode mixed, one rule or several: checks and reservations all-or-nothing,
    /// reports (into debt), settles and refunds limit by limit, each mode's retries, and
    /// the standing they answer.
    #[test]
    fn usage_modes_match_model(
        specs in prop::collection::vec(rule_strategy(), 1..=3),
        events in prop::collection::vec(event_strategy(MIXED), 1..150),
    ) {
        run_trace(&specs, &events)?;
    }
}

/// Each algorithm on its own, every mode mixed, so a failure names the algorithm and a run
/// covers all five.
#[test]
fn every_algorithm_matches_model() {
    for algorithm in Algorithm::ALL {
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 150,
            ..ProptestConfig::default()
        });
        let strategy = (
            rule_strategy().prop_map(move |mut spec| {
                let template = RuleSpec::new(algorithm, spec.limit, spec.window);
                spec = RuleSpec {
                    buckets: (algorithm == Algorithm::SlidingCounter)
                        .then_some(spec.buckets.unwrap_or(1)),
                    burst: (algorithm == Algorithm::TokenBucket).then_some(spec.limit),
                    queue: (algorithm == Algorithm::LeakyBucket).then_some(spec.limit / 2),
                    layout: spec.layout.filter(|_| algorithm == Algorithm::SlidingLog),
                    ..template
                };
                if let Some(n) = spec.buckets
                    && !saturating_micros(spec.window).is_multiple_of(n)
                {
                    spec.buckets = Some(1);
                }
                spec
            }),
            prop::collection::vec(event_strategy(MIXED), 1..150),
        );
        runner
            .run(&strategy, |(spec, events)| run_trace(&[spec], &events))
            .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
    }
}
