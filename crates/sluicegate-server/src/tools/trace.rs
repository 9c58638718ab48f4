//! `sluicegate trace`: synthetic traffic in docs/SPEC.md's replay CSV (`time_us,key,cost`,
//! with usage a peek `time_us,key,0,id` and its report `time_us,key,cost,id,report`),
//! deterministic for a seed.

use std::f64::consts::TAU;
use std::io::{self, Write};

/// The shapes of traffic a trace can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Pattern {
    /// Independent arrivals at a steady mean rate.
    Poisson,
    /// Quiet stretches and bursts at ten times the rate (10 % of the time), same mean.
    Bursty,
    /// Each key fires its whole share just before and just after every window boundary:
    /// the traffic that fixed windows let through twice.
    BoundaryAttack,
    /// A day's swing compressed into the trace: the rate follows a sine from 10 % to 190 %
    /// of the mean.
    Diurnal,
}

/// What to generate.
pub(crate) struct TraceSpec {
    pub(crate) pattern: Pattern,
    /// Mean requests per second, all keys together.
    pub(crate) rate: f64,
    pub(crate) keys: u64,
    /// µs.
    pub(crate) duration: u64,
    /// µs; the window a boundary attack aims at.
    pub(crate) window: u64,
    pub(crate) seed: u64,
    /// µs since the epoch of the first request.
    pub(crate) start: u64,
    /// Mean units a request uses, known after it (an LLM answer's tokens): each request
    /// is then a peek and, at the same instant, a report of what it used, both with the
    /// request's id. `None`: each request is a check of one unit.
    pub(crate) usage: Option<f64>,
}

/// splitmix64: small, fast, and the same on every machine.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// An exponential gap with mean `mean` µs.
    fn gap(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }
}

/// Writes the trace; returns the number of lines.
pub(crate) fn write_trace(spec: &TraceSpec, out: &mut impl Write) -> io::Result<u64> {
    let mut random = Random(spec.seed);
    let mut lines = 0;
    let end = spec.start + spec.duration;
    // What a request used: exponential around the mean, at least one unit.
    let used = |random: &mut Random| {
        spec.usage
            .map(|mean| random.gap(mean).ceil().max(1.0) as u64)
    };
    let mut emit = |t: u64, key: u64, used: Option<u64>, out: &mut dyn Write| -> io::Result<()> {
        lines += 1;
        match used {
            None => writeln!(out, "{t},key-{key},1"),
            // The request id ties the report to its request (simulate charges nothing for
            // a request that was refused).
            Some(units) => writeln!(
                out,
                "{t},key-{key},0,r{lines}\n{t},key-{key},{units},r{lines},report"
            ),
        }
    };
    let mean_gap = 1e6 / spec.rate;
    match spec.pattern {
        Pattern::Poisson | Pattern::Bursty | Pattern::Diurnal => {
            let mut t = spec.start as f64;
            loop {
                let rate_factor = match spec.pattern {
                    Pattern::Poisson => 1.0,
                    // Bursts are 10 % of each second-long cycle at 10× the base rate; the
                    // base rate keeps the mean: 0.1·10r' + 0.9·r' = r ⇒ r' = r/1.9.
                    Pattern::Bursty => {
                        let phase = (t as u64 % 1_000_000) as f64 / 1e6;
                        if phase < 0.1 { 10.0 / 1.9 } else { 1.0 / 1.9 }
                    }
                    Pattern::Diurnal => {
                        let phase = (t - spec.start as f64) / spec.duration as f64;
                        1.0 + 0.9 * (TAU * phase).sin()
                    }
                    Pattern::BoundaryAttack => unreachable!("handled below"),
                };
                t += random.gap(mean_gap / rate_factor);
                if t >= end as f64 {
                    break;
                }
                let key = random.next() % spec.keys;
                let units = used(&mut random);
                emit(t as u64, key, units, out)?;
            }
        }
        Pattern::BoundaryAttack => {
            // Each window, every key sends its share in the last and first 1 % of the
            // window around the boundary.
            let per_window = spec.rate * spec.window as f64 / 1e6;
            let edge = (spec.window / 100).max(1);
            let mut boundary = (spec.start / spec.window + 1) * spec.window;
            while boundary < end {
                let mut times: Vec<(u64, u64, Option<u64>)> = (0..per_window.round() as u64)
                    .map(|_| {
                        let offset = random.next() % (2 * edge);
                        let key = random.next() % spec.keys;
                        (boundary - edge + offset, key, used(&mut random))
                    })
                    .collect();
                times.sort_unstable();
                for (t, key, units) in times {
                    if t >= spec.start && t < end {
                        emit(t, key, units, out)?;
                    }
                }
                boundary += spec.window;
            }
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generate(pattern: Pattern) -> Vec<(u64, String)> {
        let spec = TraceSpec {
            pattern,
            rate: 1000.0,
            keys: 3,
            duration: 10_000_000,
            window: 1_000_000,
            seed: 7,
            start: 1_700_000_000_000_000,
            usage: None,
        };
        let mut out = Vec::new();
        write_trace(&spec, &mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|line| {
                let mut fields = line.split(',');
                let t = fields.next().unwrap().parse().unwrap();
                (t, fields.next().unwrap().to_owned())
            })
            .collect()
    }

    #[test]
    fn traces_are_ordered_near_their_rate_and_deterministic() {
        for pattern in [
            Pattern::Poisson,
            Pattern::Bursty,
            Pattern::BoundaryAttack,
            Pattern::Diurnal,
        ] {
            let lines = generate(pattern);
            assert!(lines.windows(2).all(|w| w[0].0 <= w[1].0), "{pattern:?}");
            let n = lines.len() as f64;
            assert!((8_000.0..12_000.0).contains(&n), "{pattern:?}: {n} lines");
            assert_eq!(lines, generate(pattern), "{pattern:?}");
        }
    }

    #[test]
    fn boundary_attacks_hug_the_boundaries() {
        let lines = generate(Pattern::BoundaryAttack);
        assert!(lines.iter().all(|(t, _)| {
            let offset = t % 1_000_000;
            !(10_000..990_000).contains(&offset)
        }));
    }

    #[test]
    fn usage_traces_peek_then_report_what_was_used() {
        let spec = TraceSpec {
            pattern: Pattern::Poisson,
            rate: 100.0,
            keys: 2,
            duration: 10_000_000,
            window: 1_000_000,
            seed: 3,
            start: 1_700_000_000_000_000,
            usage: Some(500.0),
        };
        let mut out = Vec::new();
        let requests = write_trace(&spec, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len() as u64, 2 * requests);
        let mut used = 0;
        for pair in lines.chunks(2) {
            let peek = crate::tools::replay::parse_line(pair[0]).unwrap();
            let report = crate::tools::replay::parse_line(pair[1]).unwrap();
            assert_eq!((peek.cost, peek.charge), (0, sluicegate::Charge::Check));
            assert_eq!(report.charge, sluicegate::Charge::Report);
            assert_eq!((report.time, report.key), (peek.time, peek.key));
            assert_eq!(report.request_id, peek.request_id);
            assert!(report.cost >= 1);
            used += report.cost;
        }
        let mean = used as f64 / requests as f64;
        assert!((400.0..600.0).contains(&mean), "{mean}");
    }
}
