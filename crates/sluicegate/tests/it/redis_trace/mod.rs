//! Random traces of checks for the Redis differential tests: pairs of rules with random
//! numbers, reloaded now and then, and checks of every mode on a few keys, at times that
//! hit every rounding edge.

pub(crate) mod cases;
pub(crate) mod random;
pub(crate) mod scripted;
pub(crate) mod stores;
pub(crate) mod usage;

use std::time::Duration;

pub(crate) use cases::CASES;
use random::Random;
use sluicegate::internals::saturating_micros;
use sluicegate::{Algorithm, Charge, Check, Limit, LogLayout, Rule, RuleSpec};

/// Two rules named after the seed, so no trace meets state another trace left behind.
fn rules_for(
    algorithm: Algorithm,
    layout: Option<LogLayout>,
    seed: u64,
    random: &mut Random,
) -> Vec<Rule> {
    let window = WINDOWS[random.below(WINDOWS.len() as u64) as usize];
    (0..2)
        .map(|i| rule_for(algorithm, layout, seed, i, window * (i + 1), random))
        .collect()
}

/// Rule `i` of a trace's pair: its name, random numbers over `window`.
fn rule_for(
    algorithm: Algorithm,
    layout: Option<LogLayout>,
    seed: u64,
    i: u64,
    window: u64,
    random: &mut Random,
) -> Rule {
    let limit = 1 + random.below(6);
    let mut spec = RuleSpec::new(algorithm, limit, Duration::from_micros(window));
    match algorithm {
        Algorithm::SlidingCounter => {
            let fitting: Vec<u64> = [1, 4, 10]
                .into_iter()
                .filter(|buckets| window.is_multiple_of(*buckets))
                .collect();
            spec.buckets = Some(fitting[random.below(fitting.len() as u64) as usize])
        }
        Algorithm::TokenBucket => spec.burst = Some(1 + random.below(6)),
        Algorithm::LeakyBucket => spec.queue = Some(random.below(4)),
        Algorithm::SlidingLog => spec.layout = layout,
        Algorithm::FixedWindow => {}
    }
    Rule::new(&format!("seed-{seed}-rule-{i}"), &spec).unwrap()
}

const KEYS: [&str; 4] = ["user:1", "user:{2}", "}{", ""];

/// Tiny windows (µs) hit every rounding edge within a few hundred checks; the larger ones
/// are what production uses.
const WINDOWS: [u64; 6] = [10, 12, 60, 120, 100_000, 1_000_000];

/// A random sequence of checks on one pair of rules: same times, bursts, boundary jumps,
/// several keys, costs 0..3 (to 11 for reports and settles), request ids, every mode.
pub(crate) struct Trace {
    random: Random,
    algorithm: Algorithm,
    layout: Option<LogLayout>,
    seed: u64,
    pub(crate) rules: Vec<Rule>,
    t: u64,
}

/// One check of a trace: which rule limits which key, cost, request id, time.
pub(crate) struct Line {
    pub(crate) limits: Vec<(usize, &'static str)>,
    pub(crate) cost: u64,
    /// Each limit's own cost, sometimes.
    pub(crate) costs: Vec<u64>,
    pub(crate) request_id: Option<String>,
    pub(crate) at: u64,
    pub(crate) charge: Charge,
}

impl Trace {
    pub(crate) fn new(algorithm: Algorithm, layout: Option<LogLayout>, seed: u64) -> Trace {
        let mut random = Random(seed);
        let rules = rules_for(algorithm, layout, seed, &mut random);
        let t = 1_700_000_000_000_000 + random.below(1_000_000);
        Trace {
            random,
            algorithm,
            layout,
            seed,
            rules,
            t,
        }
    }

    /// Now and then a reload: one rule gets new numbers under its name, mostly over the
    /// same window (docs/SPEC.md, "Changing a rule's numbers").
    fn maybe_reload(&mut self) {
        if self.random.below(30) != 0 {
            return;
        }
        let i = self.random.below(2);
        let mut window = saturating_micros(self.rules[i as usize].window());
        if self.random.below(4) == 0 {
            window = WINDOWS[self.random.below(WINDOWS.len() as u64) as usize] * (i + 1);
        }
        self.rules[i as usize] = rule_for(
            self.algorithm,
            self.layout,
            self.seed,
            i,
            window,
            &mut self.random,
        );
    }

    pub(crate) fn next(&mut self) -> Line {
        self.maybe_reload();
        let random = &mut self.random;
        let window = saturating_micros(self.rules[0].window());
        self.t = match random.below(10) {
            0..=2 => self.t,
            3..=7 => self.t + random.below(window / 2 + 1),
            // Just before, at or after a window boundary.
            8 => (self.t / window + 1) * window + random.below(3) - 1,
            _ => self.t + random.below(4 * window),
        };
        let key = KEYS[random.below(KEYS.len() as u64) as usize];
        // Sometimes the second rule limits another key: on a cluster, another hash slot.
        let other = KEYS[random.below(KEYS.len() as u64) as usize];
        let limits = match random.below(4) {
            0 => vec![(0, key)],
            1 => vec![(1, key)],
            2 => vec![(0, key), (1, key)],
            _ => vec![(0, key), (1, other)],
        };
        // Every mode: mostly checks, a fifth of them charging their refusals, and the usage
        // modes (docs/SPEC.md, "Usage"), whose request ids come from the same few as the
        // checks', so that each mode meets retries of its own and of the others.
        let charge = match random.below(10) {
            0..=3 => Charge::Check,
            4 => Charge::CheckChargingRefusals,
            5 | 6 => Charge::Reserve,
            7 => Charge::Report,
            8 => Charge::Settle,
            _ => Charge::Refund,
        };
        let request_id = (charge.needs_request_id() || random.below(4) == 0)
            .then(|| format!("req-{}", random.below(5)));
        // Reports and settles now and then far beyond the limit, into debt.
        let most = if charge.may_refuse() { 4 } else { 12 };
        let costs = if random.below(4) == 0 {
            limits.iter().map(|_| random.below(most)).collect()
        } else {
            Vec::new()
        };
        Line {
            limits,
            costs,
            cost: random.below(most),
            request_id,
            at: self.t,
            charge,
        }
    }
}

/// The limits a line names.
pub(crate) fn limits_of<'a>(rules: &'a [Rule], line: &Line) -> Vec<Limit<'a>> {
    line.limits
        .iter()
        .map(|&(rule, key)| Limit {
            rule: &rules[rule],
            key,
        })
        .collect()
}

/// The check a line is, with its limits.
pub(crate) fn check_of<'a>(limits: &'a [Limit<'a>], line: &'a Line) -> Check<'a> {
    Check {
        limits,
        cost: line.cost,
        costs: &line.costs,
        request_id: line.request_id.as_deref(),
        at: Some(Duration::from_micros(line.at)),
        charge: line.charge,
    }
}
