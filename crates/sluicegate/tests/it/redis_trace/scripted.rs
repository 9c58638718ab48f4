//! Scripted traces of the compact sliding log for the differential tests: a log whose
//! times run past the span of its entries again and again, and one that
//! fills to its limit, quiets down and fills again (its string grows and shrinks), also
//! under a lowered limit.

use std::time::Duration;

use sluicegate::{Algorithm, Charge, LogLayout, Rule, RuleSpec};

use super::Line;
use super::random::Random;

/// A trace of lines written out in advance, and the rules its lines name by index.
pub(crate) struct Scripted {
    pub(crate) rules: Vec<Rule>,
    pub(crate) lines: Vec<Line>,
}

const T0: u64 = 1_700_000_000_000_000;
const SECOND: u64 = 1_000_000;

/// A compact log named `name`; rules of one name and window share their log whatever L.
fn compact(name: &str, limit: u64, window: u64) -> Rule {
    let spec = RuleSpec {
        layout: Some(LogLayout::Compact),
        ..RuleSpec::new(Algorithm::SlidingLog, limit, Duration::from_micros(window))
    };
    Rule::new(name, &spec).unwrap()
}

/// Writes lines for one key, each a random step after the last, of every mode: mostly
/// checks, some into debt, refunds, reservations and their settles.
struct Writer {
    random: Random,
    t: u64,
    lines: Vec<Line>,
}

impl Writer {
    fn new(seed: u64) -> Writer {
        Writer {
            random: Random(seed),
            t: T0,
            lines: Vec::new(),
        }
    }

    /// `count` lines under rule `rule`, steps below `step_below` µs, costs to `most_cost`.
    fn lines(&mut self, rule: usize, count: usize, step_below: u64, most_cost: u64) {
        for _ in 0..count {
            let random = &mut self.random;
            self.t += random.below(step_below);
            let charge = match random.below(12) {
                0..=6 => Charge::Check,
                7 => Charge::CheckChargingRefusals,
                8 => Charge::Report,
                9 => Charge::Refund,
                10 => Charge::Reserve,
                _ => Charge::Settle,
            };
            let request_id = (charge.needs_request_id() || random.below(4) == 0)
                .then(|| format!("req-{}", random.below(4)));
            // Reports now and then far beyond the limit, into debt.
            let cost = match charge {
                Charge::Report if random.below(3) == 0 => random.below(4 * most_cost),
                _ => random.below(most_cost + 1),
            };
            self.lines.push(Line {
                limits: vec![(rule, "user:1")],
                cost,
                costs: Vec::new(),
                request_id,
                at: self.t,
                charge,
            });
        }
    }

    fn pause(&mut self, micros: u64) {
        self.t += micros;
    }
}

/// W = 2 s, so entries of 3 bytes (a span of 16.8 s), over a minute of checks every 0 to
/// 300 ms: the log is never empty while its times pass three spans and more.
pub(crate) fn spanning(name: &str) -> Scripted {
    let mut writer = Writer::new(0x5eed_0001);
    writer.lines(0, 500, 300_000, 3);
    assert!(writer.t > T0 + 60 * SECOND);
    Scripted {
        rules: vec![compact(name, 20, 2 * SECOND)],
        lines: writer.lines,
    }
}

/// L = 300 over W = 1 s: bursts to the limit (the string grows), quiet spells (what is
/// live falls to a few, the string shrinks), and a burst under L lowered to 100 while the
/// log holds more.
pub(crate) fn growing_and_shrinking(name: &str) -> Scripted {
    let mut writer = Writer::new(0x5eed_0002);
    writer.lines(0, 400, 500, 2);
    writer.pause(3 * SECOND);
    writer.lines(0, 40, 100_000, 1);
    writer.lines(0, 300, 300, 5);
    writer.lines(1, 100, 300, 2);
    writer.pause(2 * SECOND);
    writer.lines(0, 30, 200_000, 2);
    writer.lines(0, 300, 1_000, 3);
    Scripted {
        rules: vec![compact(name, 300, SECOND), compact(name, 100, SECOND)],
        lines: writer.lines,
    }
}
