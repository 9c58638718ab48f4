//! Scripted traces of sliding logs, in either layout, for the differential tests: a log
//! whose times run past the span of a compact log's entries again and again; one that fills
//! to its limit, quiets down and fills again (a compact log's string grows and shrinks),
//! also under a lowered limit, where a log holds more than its limit; and plain checks
//! under a limit of one, at every edge of a tiny window and with time stepping back.

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

/// A sliding log named `name` in `layout`; rules of one name and window share their log
/// whatever L.
fn log(name: &str, layout: LogLayout, limit: u64, window: u64) -> Rule {
    let spec = RuleSpec {
        layout: Some(layout),
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

    /// `count` plain checks of one unit under rule `rule`, steps below `step_below` µs: the
    /// checks a sliding log's layout decides in a step of its own (main.lua, short_decider).
    fn checks(&mut self, rule: usize, count: usize, step_below: u64) {
        for _ in 0..count {
            self.t += self.random.below(step_below);
            self.lines.push(Line {
                limits: vec![(rule, "user:1")],
                cost: 1,
                costs: Vec::new(),
                request_id: None,
                at: self.t,
                charge: Charge::Check,
            });
        }
    }

    fn pause(&mut self, micros: u64) {
        self.t += micros;
    }

    /// Time steps back (Redis' clock, or a replay's time): later lines are checked before
    /// the log's latest entry.
    fn step_back(&mut self, micros: u64) {
        self.t -= micros;
    }
}

/// W = 2 s, so a compact log's entries of 3 bytes (a span of 16.8 s), over a minute of
/// checks every 0 to 300 ms: the log is never empty while its times pass three spans and
/// more.
pub(crate) fn spanning(name: &str, layout: LogLayout) -> Scripted {
    let mut writer = Writer::new(0x5eed_0001);
    writer.lines(0, 500, 300_000, 3);
    assert!(writer.t > T0 + 60 * SECOND);
    Scripted {
        rules: vec![log(name, layout, 20, 2 * SECOND)],
        lines: writer.lines,
    }
}

/// L = 300 over W = 1 s: bursts to the limit (a compact log's string grows), quiet spells
/// (what is live falls to a few, the string shrinks), and checks and a burst under L
/// lowered to 100 while the log holds more.
pub(crate) fn growing_and_shrinking(name: &str, layout: LogLayout) -> Scripted {
    let mut writer = Writer::new(0x5eed_0002);
    writer.lines(0, 400, 500, 2);
    writer.pause(3 * SECOND);
    writer.lines(0, 40, 100_000, 1);
    writer.lines(0, 300, 300, 5);
    writer.checks(1, 20, 300);
    writer.lines(1, 100, 300, 2);
    writer.pause(2 * SECOND);
    writer.lines(0, 30, 200_000, 2);
    writer.lines(0, 300, 1_000, 3);
    Scripted {
        rules: vec![
            log(name, layout, 300, SECOND),
            log(name, layout, 100, SECOND),
        ],
        lines: writer.lines,
    }
}

/// L = 1 over W = 10 µs: plain checks 0 to 24 µs apart, so that many land as the entry
/// expires, before it and after; now and then time steps back, by less than W or more.
pub(crate) fn limit_of_one(name: &str, layout: LogLayout) -> Scripted {
    let mut writer = Writer::new(0x5eed_0003);
    for _ in 0..30 {
        writer.checks(0, 20, 25);
        let back = writer.random.below(30);
        writer.step_back(back);
    }
    Scripted {
        rules: vec![log(name, layout, 1, 10)],
        lines: writer.lines,
    }
}
