//! Property tests: the in-memory store against a brute-force model of docs/SPEC.md.
//!
//! The model keeps the whole history of admissions per (rule, key) and recomputes every
//! decision field from it with docs/SPEC.md's formulas, literally: sliding-log expands units
//! into timestamps, sliding-counter's `retry_after` is found by trying every µs, GCRA's
//! TAT is refolded from the history. It shares no code with the store beyond the public
//! types, so a disagreement is a bug in one of them.
//!
//! Traces also reload rules mid-way (docs/SPEC.md, "Changing a rule's numbers"): a rule
//! keeps its name and gets new numbers; the model keeps one history per state the SPEC says
//! the rule shares, and reads it under the numbers in force.

#[path = "model/reload.rs"]
mod reload;

use std::collections::HashMap;

use proptest::prelude::*;
use sluicegate::{
    Algorithm, Charge, Check, Decision, Limit, ManualClock, MemoryStore, MemoryStoreConfig,
    RetryAfter, Rule, RuleSpec,
};
use std::sync::Arc;

use reload::{Reload, reload_strategy, reloaded, shared_by};

#[derive(Clone, Debug, Default)]
struct ModelKey {
    /// (time, units) of every admission, in order.
    admissions: Vec<(u64, u64)>,
    /// The GCRA numbers (T, capacity) in force at each admission, beside `admissions`.
    written_under: Vec<(u64, u64)>,
    latest: u64,
    /// (request id, expires at, release at).
    ids: Vec<(String, u64, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fit {
    Fits,
    Over,
    Never,
    Repeat(u64),
}

struct ModelEval {
    now: u64,
    fit: Fit,
    admitted: Decision,
    refused: Decision,
}

/// docs/SPEC.md's reading of a stored TAT under numbers (T, C), at `now`: the backlog as
/// written when T is the one it was written under (d' = d), else its units rounded up at the
/// new T, at most C of them.
fn gcra_read(tat: u64, written_interval: u64, now: u64, interval: u64, capacity: u64) -> u64 {
    let backlog = tat.saturating_sub(now);
    let read = if backlog == 0 {
        0
    } else if written_interval == interval {
        backlog
    } else {
        backlog.div_ceil(written_interval).min(capacity) * interval
    };
    now + read
}

/// The stored TAT and the T it was written under, refolded from the history.
fn gcra_tat(key: &ModelKey) -> (u64, u64) {
    key.admissions.iter().zip(&key.written_under).fold(
        (0, 0),
        |(tat, written), (&(s, units), &(t, cap))| {
            (gcra_read(tat, written, s, t, cap) + units * t, t)
        },
    )
}

fn counter_estimate_w(rule: &Rule, key: &ModelKey, at: u64) -> u64 {
    let n = rule.buckets();
    let w = rule.window() / n;
    let b = at / w;
    let r = at - b * w;
    key.admissions
        .iter()
        .map(|&(s, units)| {
            let j = s / w;
            if j + n > b && j <= b {
                w * units
            } else if j + n == b {
                units * (w - r)
            } else {
                0
            }
        })
        .sum()
}

fn decision(allowed: bool, limit: u64, remaining: u64, retry: RetryAfter, reset: u64) -> Decision {
    Decision {
        allowed,
        limit,
        remaining,
        retry_after: retry,
        reset_after: reset,
        delay: 0,
    }
}

fn model_evaluate(rule: &Rule, key: &ModelKey, t: u64, cost: u64, id: Option<&str>) -> ModelEval {
    let now = t.max(key.latest);
    let units = cost.max(1);
    let l = rule.limit();
    let w_full = rule.window();
    let (fits, admitted, mut refused, retry_units);
    match rule.algorithm() {
        Algorithm::SlidingLog => {
            let mut live: Vec<u64> = key
                .admissions
                .iter()
                .filter(|&&(s, _)| s + w_full > now)
                .flat_map(|&(s, u)| std::iter::repeat_n(s, u as usize))
                .collect();
            live.sort_unstable();
            let n = live.len() as u64;
            fits = n + units <= l;
            admitted = decision(
                true,
                l,
                l.saturating_sub(n + units),
                RetryAfter::Micros(0),
                w_full,
            );
            let reset = live.last().map_or(0, |s| s + w_full - now);
            retry_units = if units <= l && !fits {
                let k = (n + units - l) as usize;
                RetryAfter::Micros(live[k - 1] + w_full - now)
            } else {
                RetryAfter::Micros(0)
            };
            refused = decision(false, l, l.saturating_sub(n), retry_units, reset);
        }
        Algorithm::FixedWindow => {
            let k = now / w_full;
            let n: u64 = key
                .admissions
                .iter()
                .filter(|&&(s, _)| s / w_full == k)
                .map(|&(_, u)| u)
                .sum();
            fits = n + units <= l;
            let end = (k + 1) * w_full - now;
            admitted = decision(
                true,
                l,
                l.saturating_sub(n + units),
                RetryAfter::Micros(0),
                end,
            );
            let reset = if n > 0 { end } else { 0 };
            refused = decision(
                false,
                l,
                l.saturating_sub(n),
                RetryAfter::Micros(reset),
                reset,
            );
        }
        Algorithm::SlidingCounter => {
            let n = rule.buckets();
            let w = w_full / n;
            let e = counter_estimate_w(rule, key, now);
            fits = units <= l && e + units * w <= l * w;
            let b = now / w;
            admitted = decision(
                true,
                l,
                (l * w).saturating_sub(e + units * w) / w,
                RetryAfter::Micros(0),
                (b + n + 1) * w - now,
            );
            let reset = key
                .admissions
                .iter()
                .map(|&(s, _)| ((s / w) + n + 1) * w)
                .filter(|&end| end > now)
                .max()
                .map_or(0, |end| end - now);
            let retry = if units <= l && !fits {
                let d = (0..=w_full + w)
                    .find(|d| counter_estimate_w(rule, key, now + d) + units * w <= l * w)
                    .expect("every bucket has left the window by then");
                RetryAfter::Micros(d)
            } else {
                RetryAfter::Micros(0)
            };
            refused = decision(false, l, (l * w).saturating_sub(e) / w, retry, reset);
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let interval = w_full / l;
            let cap = rule.capacity();
            let tau = interval * cap;
            let (stored, written) = gcra_tat(key);
            let tat = gcra_read(stored, written, now, interval, cap);
            let new = tat + units * interval;
            fits = units <= cap && new - now <= tau;
            admitted = Decision {
                delay: if rule.algorithm() == Algorithm::LeakyBucket {
                    tat - now
                } else {
                    0
                },
                ..decision(
                    true,
                    cap,
                    tau.saturating_sub(new - now) / interval,
                    RetryAfter::Micros(0),
                    new - now,
                )
            };
            let retry = if units <= cap && !fits {
                RetryAfter::Micros(new - tau - now)
            } else {
                RetryAfter::Micros(0)
            };
            refused = decision(
                false,
                cap,
                tau.saturating_sub(tat - now) / interval,
                retry,
                tat - now,
            );
        }
    }
    let repeat = id.and_then(|id| {
        key.ids
            .iter()
            .find(|(i, expires, _)| i == id && *expires > now)
            .map(|&(_, _, release)| release)
    });
    let fit = match repeat {
        Some(release) => Fit::Repeat(release),
        None if units > rule.capacity() => Fit::Never,
        None if fits => Fit::Fits,
        None => Fit::Over,
    };
    match fit {
        Fit::Never => refused.retry_after = RetryAfter::Never,
        Fit::Fits | Fit::Repeat(_) => refused.retry_after = RetryAfter::Micros(0),
        Fit::Over => {}
    }
    ModelEval {
        now,
        fit,
        admitted,
        refused,
    }
}

fn model_combine(ds: &[Decision]) -> Decision {
    let allowed = ds.iter().all(|d| d.allowed);
    let tightest = ds
        .iter()
        .min_by_key(|d| (d.remaining, d.limit))
        .expect("at least one rule");
    let retry_after = if allowed {
        RetryAfter::Micros(0)
    } else {
        ds.iter()
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after)
            .max()
            .expect("a refusing rule")
    };
    Decision {
        allowed,
        limit: tightest.limit,
        remaining: tightest.remaining,
        retry_after,
        reset_after: ds.iter().map(|d| d.reset_after).max().unwrap_or(0),
        delay: ds.iter().map(|d| d.delay).max().unwrap_or(0),
    }
}

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
    ) -> (Decision, Vec<Decision>) {
        let evals: Vec<ModelEval> = rules
            .iter()
            .zip(costs)
            .map(|(&(i, rule), &cost)| {
                let state = self
                    .keys
                    .entry((i, shared_by(rule), key.to_owned()))
                    .or_default();
                model_evaluate(rule, state, t, cost, id)
            })
            .collect();
        let all = evals
            .iter()
            .all(|e| matches!(e.fit, Fit::Fits | Fit::Repeat(_)));
        let per_rule: Vec<Decision> = rules
            .iter()
            .zip(&evals)
            .zip(costs)
            .map(|((&(i, rule), e), &cost)| {
                let state = self
                    .keys
                    .get_mut(&(i, shared_by(rule), key.to_owned()))
                    .unwrap();
                match (all, e.fit) {
                    (true, Fit::Repeat(release)) => Decision {
                        allowed: true,
                        delay: release.saturating_sub(e.now),
                        ..e.refused
                    },
                    (true, _) => {
                        if cost > 0 {
                            state.admissions.push((e.now, cost));
                            state
                                .written_under
                                .push((rule.emission_interval(), rule.capacity()));
                            state.latest = e.now;
                            if let Some(id) = id {
                                state.ids.push((
                                    id.to_owned(),
                                    e.now + e.admitted.reset_after,
                                    e.now + e.admitted.delay,
                                ));
                            }
                        }
                        e.admitted
                    }
                    // docs/SPEC.md, "Charging refusals": a fixed window that refuses
                    // counts the units all the same, then answers as refused after them.
                    (false, Fit::Over | Fit::Never)
                        if charge == Charge::Attempted
                            && cost > 0
                            && rule.algorithm() == Algorithm::FixedWindow =>
                    {
                        state.admissions.push((e.now, cost));
                        state.latest = e.now;
                        model_evaluate(rule, state, t, cost, id).refused
                    }
                    (false, fit) => Decision {
                        allowed: matches!(fit, Fit::Fits | Fit::Repeat(_)),
                        ..e.refused
                    },
                }
            })
            .collect();
        (model_combine(&per_rule), per_rule)
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
    )
        .prop_map(|(algo, limit, window, burst, queue, bucket_pick)| {
            let algorithm = Algorithm::ALL[algo];
            let mut spec = RuleSpec::new(algorithm, limit, window);
            match algorithm {
                Algorithm::SlidingCounter => {
                    let divisors: Vec<u64> = (1..=12).filter(|n| window % n == 0).collect();
                    spec.buckets = Some(*bucket_pick.get(&divisors));
                }
                Algorithm::TokenBucket => spec.burst = Some(burst),
                Algorithm::LeakyBucket => spec.queue = Some(queue),
                _ => {}
            }
            spec
        })
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
    /// Before the check, a reload gives one rule (the `key`-th, modulo) new numbers.
    reload: Option<Reload>,
}

fn event_strategy() -> impl Strategy<Value = Event> {
    let step = prop_oneof![
        3 => Just(Step::Same),
        6 => (1u64..40).prop_map(Step::Forward),
        2 => (prop::sample::select(vec![10u64, 12, 30, 60, 100, 120]), -1i8..=1)
            .prop_map(|(m, o)| Step::Boundary(m, o)),
        1 => (1u64..30).prop_map(Step::Back),
    ];
    let id = prop_oneof![3 => Just(None), 1 => (0u8..4).prop_map(Some)];
    let own_costs = prop::option::weighted(0.3, [0u64..=3, 0u64..=3, 0u64..=3]);
    (
        step,
        0usize..3,
        0u64..=3,
        own_costs,
        any::<u8>(),
        id,
        reload_strategy(),
    )
        .prop_map(|(step, key, cost, own_costs, rules, id, reload)| Event {
            step,
            key,
            cost,
            own_costs,
            rules,
            id,
            reload,
        })
}

const KEYS: [&str; 3] = ["user:1", "user:{1}", ""];

fn run_trace(specs: &[RuleSpec], events: &[Event], charge: Charge) -> Result<(), TestCaseError> {
    let name = |i: usize| format!("r{i}");
    let mut rules: Vec<Rule> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| Rule::new(&name(i), s).unwrap())
        .collect();
    let store = MemoryStore::new(MemoryStoreConfig::default(), Arc::new(ManualClock::new(0)));
    let mut model = Model::default();
    let mut t: u64 = 1_000;
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
        let key = KEYS[event.key];
        let id = event.id.map(|i| format!("req-{i}"));
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
            at: Some(t),
            charge,
        };
        let got = store.check_now(&check).unwrap();
        let costs: Vec<u64> = (0..limits.len())
            .map(|i| own_costs.get(i).copied().unwrap_or(event.cost))
            .collect();
        let (want, want_limits) = model.check(&chosen, key, t, &costs, id.as_deref(), charge);
        prop_assert_eq!(
            got.limits(),
            &want_limits,
            "event {} at t={} {:?}: per-rule decisions differ",
            n,
            t,
            event
        );
        prop_assert_eq!(
            got.decision,
            want,
            "event {} at t={}: combined differs",
            n,
            t
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// One rule per trace: every algorithm, every decision field.
    #[test]
    fn single_rule_matches_model(
        spec in rule_strategy(),
        events in prop::collection::vec(event_strategy(), 1..150),
    ) {
        run_trace(&[spec], &events, Charge::Admitted)?;
    }

    /// Several rules per check: all-or-nothing and the combined decision.
    #[test]
    fn several_rules_match_model(
        specs in prop::collection::vec(rule_strategy(), 2..=3),
        events in prop::collection::vec(event_strategy(), 1..120),
    ) {
        run_trace(&specs, &events, Charge::Admitted)?;
    }

    /// Refusals charged (`Charge::Attempted`), one rule or several: fixed windows count
    /// what they refuse, the rules that would have allowed record nothing, the other
    /// algorithms are as without the charge.
    #[test]
    fn charged_refusals_match_model(
        specs in prop::collection::vec(rule_strategy(), 1..=3),
        events in prop::collection::vec(event_strategy(), 1..120),
    ) {
        run_trace(&specs, &events, Charge::Attempted)?;
    }
}

/// Each algorithm on its own, so a failure names the algorithm and a run covers all five.
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
                    ..template
                };
                if let Some(n) = spec.buckets
                    && spec.window % n != 0
                {
                    spec.buckets = Some(1);
                }
                spec
            }),
            prop::collection::vec(event_strategy(), 1..150),
        );
        runner
            .run(&strategy, |(spec, events)| {
                run_trace(&[spec], &events, Charge::Admitted)
            })
            .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
    }
}
