//! `sluicegate simulate`: one trace through every algorithm, measured against the exact
//! sliding log.
//!
//! Each algorithm runs on its own in-memory store with the trace's timestamps. For each
//! it reports how many requests it decided differently from the exact log (wrongly
//! allowed, wrongly rejected), the most it admitted for one key in any window of length
//! W, and the Redis memory its state would take at the trace's peak.

mod run;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result, anyhow};
use sluicegate::internals::saturating_micros;
use sluicegate::{Algorithm, Charge, LogLayout, Rule, RuleSpec};

use self::run::{AlgorithmReport, Run};
use super::chart;
use super::redis_memory::{human_bytes, redis_bytes};
use super::replay::ReplayLine;
use super::trace_file::TraceFile;

/// Keys come from a trace file, not from clients at run time: a fast hash will do.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Runs `trace` through every algorithm with the numbers of `spec`, and prints the report
/// (`window` as the user wrote it); with `chart`, writes the SVG chart there too.
pub(crate) fn run(
    trace: TraceFile,
    spec: &RuleSpec,
    window: &str,
    chart: Option<&Path>,
) -> Result<()> {
    // Without a readable span, ten windows give the chart a sensible scale.
    let span = trace.span().unwrap_or(saturating_micros(spec.window) * 10);
    let mut sim = Simulation::new(spec, span)?;
    let started = Instant::now();
    let skipped = trace.read(|line| sim.request(line))?;
    let after_charges = match sim.after_charges {
        0 => String::new(),
        n => format!(", {n} reports/settles/refunds"),
    };
    println!(
        "{} requests{after_charges}, {} keys, limit {} per {}, in {:.1} s",
        sim.requests,
        sim.key_count(),
        spec.limit,
        window,
        started.elapsed().as_secs_f64()
    );
    if let Some(first) = &skipped.first {
        println!("{} malformed lines skipped (first: {first})", skipped.count);
    }
    print!("{}", table(&sim, spec.limit));
    if let Some(path) = chart {
        std::fs::write(path, sim.chart(spec.limit)).with_context(|| path.display().to_string())?;
        println!("chart written to {}", path.display());
    }
    Ok(())
}

/// The whole simulation, fed one request at a time.
struct Simulation {
    runs: Vec<Run>,
    keys: HashMap<String, u32>,
    window: u64,
    /// µs per chart bucket, and the first request's time.
    bucket_width: u64,
    start: Option<u64>,
    offered: Vec<u64>,
    requests: u64,
    /// Lines that charge after the fact: reports, settles, refunds.
    after_charges: u64,
}

/// How many points a chart series has.
const CHART_POINTS: u64 = 200;

impl Simulation {
    /// Every algorithm with `limit` per `window` (and the given extras); `span` is the
    /// trace's expected length in µs, for the chart's buckets.
    fn new(base: &RuleSpec, span: u64) -> Result<Simulation> {
        let runs = Algorithm::ALL
            .iter()
            .map(|&algorithm| {
                let spec = RuleSpec {
                    algorithm,
                    buckets: base
                        .buckets
                        .filter(|_| algorithm == Algorithm::SlidingCounter),
                    burst: base.burst.filter(|_| algorithm == Algorithm::TokenBucket),
                    queue: base.queue.filter(|_| algorithm == Algorithm::LeakyBucket),
                    layout: None,
                    ..*base
                };
                let rule = Rule::new(algorithm.name(), &spec)
                    .map_err(|e| anyhow!("{algorithm}: --{e}"))?;
                Ok(Run::new(rule))
            })
            .collect::<Result<Vec<Run>>>()?;
        Ok(Simulation {
            runs,
            keys: HashMap::default(),
            window: saturating_micros(base.window),
            bucket_width: (span / CHART_POINTS).max(1),
            start: None,
            offered: Vec::new(),
            requests: 0,
            after_charges: 0,
        })
    }

    /// Decides one line in every algorithm: a request (a check or a reserve), compared
    /// with the exact log, or a report, settle or refund, never refused — but not charged
    /// in an algorithm that refused its request (same key and request id).
    fn request(&mut self, line: &ReplayLine<'_>) -> Result<()> {
        let t = line.time;
        if line.charge.may_refuse() {
            self.requests += 1;
        } else {
            self.after_charges += 1;
        }
        let next_id = self.keys.len() as u32;
        let id = match self.keys.get(line.key) {
            Some(&id) => id,
            None => {
                self.keys.insert(line.key.to_owned(), next_id);
                next_id
            }
        };
        let start = *self.start.get_or_insert(t);
        let bucket = (t.saturating_sub(start) / self.bucket_width) as usize;
        // Every bucket since the last line's (those without lines too) is sampled at its
        // start for what each key still holds; counts only rise at recordings, so that and
        // the recordings give each bucket's peak (a refund's drop shows at the next sample).
        let unsampled = self.offered.len()..bucket + 1;
        for run in &mut self.runs {
            for earlier in unsampled.clone() {
                run.expire(start + earlier as u64 * self.bucket_width, self.window);
                let busiest = run.busiest();
                raise(&mut run.window_peaks, earlier, busiest);
            }
        }
        // The units offered: a peek offers one request, a refund gives back.
        let offered = match line.charge {
            Charge::Reserve | Charge::Report | Charge::Settle => line.cost,
            Charge::Refund => 0,
            _ => line.cost.max(1),
        };
        bump(&mut self.offered, bucket, offered);
        let mut exact = None;
        for run in &mut self.runs {
            if run.never_ran(line, id) {
                continue;
            }
            let decision = run.decide(line)?;
            if line.charge.may_refuse() {
                // Algorithm::ALL starts with the sliding log: the reference for the others.
                let reference = *exact.get_or_insert(decision.allowed);
                let report = &mut run.report;
                if decision.allowed {
                    report.allowed += 1;
                }
                match (decision.allowed, reference) {
                    (true, false) => report.wrongly_allowed += 1,
                    (false, true) => report.wrongly_rejected += 1,
                    _ => {}
                }
            }
            run.expire(t, self.window);
            let held = run.account(line, id, &decision);
            raise(&mut run.window_peaks, bucket, held);
        }
        Ok(())
    }

    /// The reports, in `Algorithm::ALL` order.
    fn reports(&self) -> Vec<(Algorithm, AlgorithmReport)> {
        self.runs
            .iter()
            .map(|run| (run.rule.algorithm(), run.report.clone()))
            .collect()
    }

    /// Distinct keys seen.
    fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Estimated Redis bytes for an algorithm's state at its peak (see `redis_bytes`).
    fn redis_estimate(&self, algorithm: Algorithm, layout: LogLayout) -> u64 {
        let run = self
            .runs
            .iter()
            .find(|run| run.rule.algorithm() == algorithm)
            .expect("every algorithm runs");
        let entries_per_key = run
            .report
            .peak_live_units
            .checked_div(run.report.peak_keys)
            .unwrap_or(0);
        run.report.peak_keys * redis_bytes(&run.rule, layout, entries_per_key)
    }

    /// The SVG chart: per algorithm, the most units one key held within its window over
    /// time, against L and the exact log; the offered load apart.
    fn chart(&self, limit: u64) -> String {
        let algorithms: Vec<(&str, &[u64])> = self
            .runs
            .iter()
            .map(|run| (run.rule.algorithm().name(), run.window_peaks.as_slice()))
            .collect();
        chart::Chart {
            bucket_width: self.bucket_width,
            window: self.window,
            limit,
            offered: &self.offered,
            algorithms: &algorithms,
        }
        .svg()
    }
}

fn bump(series: &mut Vec<u64>, bucket: usize, units: u64) {
    grown(series, bucket)[bucket] += units;
}

fn raise(series: &mut Vec<u64>, bucket: usize, value: u64) {
    let slot = &mut grown(series, bucket)[bucket];
    *slot = (*slot).max(value);
}

/// `series` with room for `bucket`.
fn grown(series: &mut Vec<u64>, bucket: usize) -> &mut Vec<u64> {
    if series.len() <= bucket {
        series.resize(bucket + 1, 0);
    }
    series
}

/// The report table.
fn table(sim: &Simulation, limit: u64) -> String {
    let mut out = String::new();
    // Debt only arises from reports and settles: its columns only for traces that have them.
    let debt = sim.after_charges > 0;
    let _ = write!(
        out,
        "{:<16} {:>10} {:>20} {:>20} {:>13} {:>16}",
        "algorithm",
        "allowed",
        "wrongly allowed",
        "wrongly rejected",
        "max in any W",
        "Redis (est.)"
    );
    if debt {
        let _ = write!(out, " {:>16} {:>13}", "refused in debt", "longest debt");
    }
    out.push('\n');
    let percent = |n: u64| 100.0 * n as f64 / sim.requests.max(1) as f64;
    for (algorithm, report) in sim.reports() {
        let memory = if algorithm == Algorithm::SlidingLog {
            format!(
                "{} / {}",
                human_bytes(sim.redis_estimate(algorithm, LogLayout::Zset)),
                human_bytes(sim.redis_estimate(algorithm, LogLayout::Compact))
            )
        } else {
            human_bytes(sim.redis_estimate(algorithm, LogLayout::Zset))
        };
        let _ = write!(
            out,
            "{:<16} {:>10} {:>11} ({:>5.2}%) {:>11} ({:>5.2}%) {:>13} {:>16}",
            algorithm.name(),
            report.allowed,
            report.wrongly_allowed,
            percent(report.wrongly_allowed),
            report.wrongly_rejected,
            percent(report.wrongly_rejected),
            format!(
                "{}{}",
                report.max_in_window,
                if report.max_in_window > limit {
                    " (> L)"
                } else {
                    ""
                }
            ),
            memory
        );
        if debt {
            let longest = format!("{:.1} s", report.longest_debt as f64 / 1e6);
            let _ = write!(out, " {:>16} {:>13}", report.refused_in_debt, longest);
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "sliding-log memory: zset / compact layout. Estimates from MEMORY USAGE on Redis 7.0; \
         `sluicegate plan --redis URL` measures them on yours."
    );
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::tools::replay::parse_line;

    const S: u64 = 1_000_000;

    fn simulate(lines: &[(u64, &str, u64)], limit: u64, window: u64) -> Simulation {
        let text: Vec<String> = lines
            .iter()
            .map(|(t, key, cost)| format!("{t},{key},{cost}"))
            .collect();
        simulate_lines(&text, limit, window)
    }

    /// Feeds replay-format `lines` to a simulation.
    fn simulate_lines(lines: &[impl AsRef<str>], limit: u64, window: u64) -> Simulation {
        let spec = RuleSpec::new(Algorithm::SlidingLog, limit, Duration::from_micros(window));
        let mut sim = Simulation::new(&spec, 10 * window).unwrap();
        for line in lines {
            sim.request(&parse_line(line.as_ref()).unwrap()).unwrap();
        }
        sim
    }

    fn report(sim: &Simulation, algorithm: Algorithm) -> AlgorithmReport {
        sim.reports()
            .into_iter()
            .find(|(a, _)| *a == algorithm)
            .unwrap()
            .1
    }

    #[test]
    fn fixed_windows_admit_twice_the_limit_across_a_boundary() {
        let boundary = 1_000 * 60 * S;
        let lines: Vec<(u64, &str, u64)> = (0..40)
            .map(|i| (boundary - 20 * S / 1000 + i * S / 1000, "k", 1))
            .collect();
        let sim = simulate(&lines, 10, 60 * S);
        assert_eq!(report(&sim, Algorithm::SlidingLog).max_in_window, 10);
        assert_eq!(report(&sim, Algorithm::FixedWindow).max_in_window, 20);
        assert_eq!(report(&sim, Algorithm::FixedWindow).wrongly_allowed, 10);
        assert_eq!(report(&sim, Algorithm::SlidingLog).wrongly_allowed, 0);
    }

    #[test]
    fn windows_are_counted_per_key_and_expire() {
        let lines = [(0, "a", 3), (S / 2, "b", 2), (S, "a", 1), (2 * S, "a", 1)];
        let sim = simulate(&lines, 5, S);
        let log = report(&sim, Algorithm::SlidingLog);
        // a: 3 at 0 expire at 1 s exactly, so a never holds more than 3 in one window.
        assert_eq!(log.max_in_window, 3);
        assert_eq!(log.peak_keys, 2);
        assert_eq!(log.peak_live_units, 5);
    }

    #[test]
    fn retries_are_told_by_their_request_ids() {
        // The second line is the first one's retry: allowed, and nothing more recorded.
        let sim = simulate_lines(&["0,k,1,a", "1000,k,1,a", "400000,k,1,b"], 5, S);
        for (algorithm, report) in sim.reports() {
            assert_eq!(report.allowed, 3, "{algorithm}");
            assert_eq!(report.max_in_window, 2, "{algorithm}");
        }
    }

    #[test]
    fn debt_is_counted_and_timed_per_algorithm() {
        // L = 10 per 1 s. A peek, then a report of 25: the key is spent, and the checks
        // until the debt is paid are refused in debt.
        let lines = [
            "0,k,0",
            "0,k,25,,report",
            "500000,k,1",
            "900000,k,1",
            "1700000,k,1",
        ];
        let sim = simulate_lines(&lines, 10, S);
        assert_eq!((sim.requests, sim.after_charges), (4, 1));
        let log = report(&sim, Algorithm::SlidingLog);
        // The newest ten units, all at 0, leave at 1 s.
        assert_eq!((log.longest_debt, log.refused_in_debt), (S, 2));
        assert_eq!(log.max_in_window, 25);
        // TAT = 2.5 s: one unit fits once TAT + T − t ≤ τ, at 1.6 s.
        let bucket = report(&sim, Algorithm::TokenBucket);
        assert_eq!(
            (bucket.longest_debt, bucket.refused_in_debt),
            (1_600_000, 2)
        );
        assert_eq!(bucket.allowed, 2, "the peek, and the check at 1.7 s");
        let table = table(&sim, 10);
        assert!(table.contains("refused in debt"), "{table}");
    }

    #[test]
    fn a_refused_request_reports_nothing() {
        // L = 10: the second request is refused at its peek (the key is spent), so its
        // report is not charged; one without an id is.
        let lines = [
            "0,k,0,a",
            "0,k,10,a,report",
            "1000,k,0,b",
            "1000,k,7,b,report",
            "2000,k,3,,report",
        ];
        let sim = simulate_lines(&lines, 10, S);
        let log = report(&sim, Algorithm::SlidingLog);
        assert_eq!((log.allowed, log.refused_in_debt), (1, 1));
        assert_eq!(log.max_in_window, 13);
    }

    #[test]
    fn settles_and_refunds_keep_the_books() {
        let lines = [
            "0,k,5,r1,reserve",
            "100,k,8,r1,settle",
            "200,k,8,r1,settle",
            "300,k,3,,refund",
        ];
        let sim = simulate_lines(&lines, 100, S);
        // 5 reserved, 3 more settled, the repeat nothing, 3 refunded: 8 at most, 5 left.
        let log = report(&sim, Algorithm::SlidingLog);
        assert_eq!(log.max_in_window, 8);
        assert_eq!(log.peak_live_units, 8);
        assert_eq!(sim.runs[0].busiest(), 5);
        assert!(table(&sim, 100).contains("refused in debt"));
        let checks_only = simulate(&[(0, "k", 1)], 100, S);
        assert!(!table(&checks_only, 100).contains("refused in debt"));
    }
}
