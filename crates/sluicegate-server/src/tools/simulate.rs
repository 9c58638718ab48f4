//! `sluicegate simulate`: one trace through every algorithm, measured against the exact
//! sliding log.
//!
//! Each algorithm runs on its own in-memory store with the trace's timestamps. For each
//! it reports how many requests it decided differently from the exact log (wrongly
//! allowed, wrongly rejected), the most it admitted for one key in any window of length
//! W, and the Redis memory its state would take at the trace's peak.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result, anyhow};
use sluicegate::{Algorithm, Check, Limit, LogLayout, MemoryStore, Rule, RuleSpec};

use super::chart;
use super::redis_memory::{human_bytes, redis_bytes};
use super::replay::trace_store;
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
    let span = trace.span().unwrap_or(spec.window * 10);
    let mut sim = Simulation::new(spec, span)?;
    let started = Instant::now();
    let skipped = trace.read(|t, key, cost| sim.request(t, key, cost))?;
    println!(
        "{} requests, {} keys, limit {} per {}, in {:.1} s",
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

/// What one algorithm did with the trace.
#[derive(Clone, Debug, Default, PartialEq)]
struct AlgorithmReport {
    allowed: u64,
    wrongly_allowed: u64,
    wrongly_rejected: u64,
    /// The most units admitted for one key in any window `(t − W, t]`.
    max_in_window: u64,
    /// Keys holding state at once, at the peak.
    peak_keys: u64,
    /// Units admitted within the last W, all keys together, at the peak.
    peak_live_units: u64,
}

/// One algorithm's run.
struct Run {
    rule: Rule,
    store: MemoryStore,
    report: AlgorithmReport,
    /// Admissions within the last W, oldest first: (time, key id, units).
    recent: VecDeque<(u64, u32, u64)>,
    /// Units per key within the last W.
    live: HashMap<u32, u64>,
    live_units: u64,
    /// Per chart bucket, the most units one key held within its window.
    window_peaks: Vec<u64>,
}

impl Run {
    /// Forgets the admissions that have left the window `(t − window, t]`.
    fn expire(&mut self, t: u64, window: u64) {
        while let Some(&(at, old_key, old_units)) = self.recent.front() {
            if at + window > t {
                break;
            }
            self.recent.pop_front();
            self.live_units -= old_units;
            if let Some(count) = self.live.get_mut(&old_key) {
                *count -= old_units;
                if *count == 0 {
                    self.live.remove(&old_key);
                }
            }
        }
    }

    /// Records `units` admitted for `key` at `t` (after [`Run::expire`] to `t`); returns
    /// what `key` now holds within its window.
    fn admit(&mut self, t: u64, key: u32, units: u64) -> u64 {
        if units == 0 {
            return self.live.get(&key).copied().unwrap_or(0);
        }
        self.recent.push_back((t, key, units));
        self.live_units += units;
        let count = self.live.entry(key).or_default();
        *count += units;
        let count = *count;
        let report = &mut self.report;
        report.max_in_window = report.max_in_window.max(count);
        report.peak_keys = report.peak_keys.max(self.live.len() as u64);
        report.peak_live_units = report.peak_live_units.max(self.live_units);
        count
    }

    /// The most any key holds within its window now.
    fn busiest(&self) -> u64 {
        self.live.values().copied().max().unwrap_or(0)
    }
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
                Ok(Run {
                    rule,
                    store: trace_store(),
                    report: AlgorithmReport::default(),
                    recent: VecDeque::new(),
                    live: HashMap::default(),
                    live_units: 0,
                    window_peaks: Vec::new(),
                })
            })
            .collect::<Result<Vec<Run>>>()?;
        Ok(Simulation {
            runs,
            keys: HashMap::default(),
            window: base.window,
            bucket_width: (span / CHART_POINTS).max(1),
            start: None,
            offered: Vec::new(),
            requests: 0,
        })
    }

    /// Decides one request in every algorithm.
    fn request(&mut self, t: u64, key: &str, cost: u64) -> Result<()> {
        self.requests += 1;
        let next_id = self.keys.len() as u32;
        let id = match self.keys.get(key) {
            Some(&id) => id,
            None => {
                self.keys.insert(key.to_owned(), next_id);
                next_id
            }
        };
        let start = *self.start.get_or_insert(t);
        let bucket = (t.saturating_sub(start) / self.bucket_width) as usize;
        // Every bucket since the last request's (those without requests too) is sampled at
        // its start for what each key still holds; counts only rise at admissions, so that
        // and the admissions give each bucket's peak.
        let unsampled = self.offered.len()..bucket + 1;
        for run in &mut self.runs {
            for earlier in unsampled.clone() {
                run.expire(start + earlier as u64 * self.bucket_width, self.window);
                let busiest = run.busiest();
                raise(&mut run.window_peaks, earlier, busiest);
            }
        }
        bump(&mut self.offered, bucket, cost.max(1));
        let mut exact = None;
        for run in &mut self.runs {
            let limits = [Limit {
                rule: &run.rule,
                key,
            }];
            let check = Check {
                at: Some(t),
                ..Check::new(&limits, cost)
            };
            let allowed = run.store.check_now(&check)?.decision.allowed;
            // Algorithm::ALL starts with the sliding log: the reference for the others.
            let reference = *exact.get_or_insert(allowed);
            let report = &mut run.report;
            if allowed {
                report.allowed += 1;
            }
            match (allowed, reference) {
                (true, false) => report.wrongly_allowed += 1,
                (false, true) => report.wrongly_rejected += 1,
                _ => {}
            }
            run.expire(t, self.window);
            let held = run.admit(t, id, if allowed { cost } else { 0 });
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
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>20} {:>20} {:>13} {:>16}",
        "algorithm",
        "allowed",
        "wrongly allowed",
        "wrongly rejected",
        "max in any W",
        "Redis (est.)"
    );
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
        let _ = writeln!(
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
    use super::*;

    const S: u64 = 1_000_000;

    fn simulate(lines: &[(u64, &str, u64)], limit: u64, window: u64) -> Simulation {
        let spec = RuleSpec::new(Algorithm::SlidingLog, limit, window);
        let mut sim = Simulation::new(&spec, 10 * window).unwrap();
        for &(t, key, cost) in lines {
            sim.request(t, key, cost).unwrap();
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
}
