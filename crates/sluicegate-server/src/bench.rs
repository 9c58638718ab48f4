//! `sluicegate bench`: decisions per second and latency percentiles against a store.
//!
//! `concurrency` tasks check keys picked at random among `keys` for `duration`, either as
//! fast as the store answers or, with `--rate`, at a fixed total rate (each task on its
//! own schedule). Latency is measured from when a check is sent to when its answer is
//! back; tokio's timers are only millisecond-accurate, so measuring from when a paced
//! check was due would mostly measure the timer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluicegate::{AnyStore, Check, Limit, Limiter, LimiterConfig, Rule};

/// What one run measured.
#[derive(Debug, Serialize)]
pub(crate) struct BenchReport {
    pub(crate) store: String,
    pub(crate) algorithm: String,
    pub(crate) keys: usize,
    pub(crate) concurrency: usize,
    pub(crate) seconds: f64,
    pub(crate) decisions: u64,
    pub(crate) decisions_per_second: f64,
    pub(crate) allowed: u64,
    pub(crate) errors: u64,
    /// Checks that reached the store (the rest the negative cache answered).
    pub(crate) store_calls: u64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) p999_us: u64,
    pub(crate) max_us: u64,
}

/// The settings of one run.
pub(crate) struct BenchPlan {
    pub(crate) store_name: String,
    pub(crate) keys: usize,
    pub(crate) concurrency: usize,
    pub(crate) duration: Duration,
    /// Total checks per second; `None` for as fast as possible.
    pub(crate) rate: Option<f64>,
    /// Answer repeated refusals locally.
    pub(crate) negative_cache: bool,
}

struct TaskResult {
    latencies: Vec<u32>,
    allowed: u64,
    errors: u64,
}

pub(crate) async fn run(store: AnyStore, rule: Rule, plan: BenchPlan) -> BenchReport {
    let limiter = Arc::new(Limiter::with_config(
        store,
        LimiterConfig {
            negative_cache_entries: if plan.negative_cache { 100_000 } else { 0 },
            ..LimiterConfig::default()
        },
    ));
    let keys: Arc<Vec<String>> = Arc::new((0..plan.keys).map(|i| format!("bench:{i}")).collect());
    let started = Instant::now();
    let deadline = started + plan.duration;
    let period = plan
        .rate
        .map(|rate| Duration::from_secs_f64(plan.concurrency as f64 / rate));
    let tasks: Vec<_> = (0..plan.concurrency)
        .map(|task| {
            let (limiter, rule, keys) = (Arc::clone(&limiter), rule.clone(), Arc::clone(&keys));
            tokio::spawn(async move {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (task as u64 + 1);
                let mut result = TaskResult {
                    latencies: Vec::new(),
                    allowed: 0,
                    errors: 0,
                };
                // Spread the tasks' schedules over one period so they do not fire together.
                let mut due = period.map(|p| started + p.mul_f64(task as f64 / 32.0));
                loop {
                    if let Some(at) = due {
                        tokio::time::sleep_until(at.into()).await;
                    }
                    let begin = Instant::now();
                    if begin >= deadline {
                        break;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = &keys[(x % keys.len() as u64) as usize];
                    let limits = [Limit { rule: &rule, key }];
                    match limiter.decide(&Check::new(&limits, 1)).await {
                        Ok(outcome) => result.allowed += u64::from(outcome.decision.allowed),
                        Err(_) => result.errors += 1,
                    }
                    let micros = begin.elapsed().as_micros();
                    result
                        .latencies
                        .push(u32::try_from(micros).unwrap_or(u32::MAX));
                    if let (Some(at), Some(p)) = (due.as_mut(), period) {
                        *at += p;
                    }
                }
                result
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let (mut allowed, mut errors) = (0, 0);
    for task in tasks {
        if let Ok(result) = task.await {
            latencies.extend(result.latencies);
            allowed += result.allowed;
            errors += result.errors;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let percentile = |p: f64| -> u64 {
        if latencies.is_empty() {
            return 0;
        }
        let index = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        u64::from(latencies[index])
    };
    BenchReport {
        store: plan.store_name,
        algorithm: rule.algorithm().to_string(),
        keys: plan.keys,
        concurrency: plan.concurrency,
        seconds,
        decisions: latencies.len() as u64,
        decisions_per_second: latencies.len() as f64 / seconds,
        allowed,
        errors,
        store_calls: limiter
            .stats()
            .store_decisions
            .load(std::sync::atomic::Ordering::Relaxed),
        p50_us: percentile(0.50),
        p99_us: percentile(0.99),
        p999_us: percentile(0.999),
        max_us: latencies.last().copied().map_or(0, u64::from),
    }
}

impl BenchReport {
    pub(crate) fn text(&self) -> String {
        format!(
            "store {} · {} · {} keys · concurrency {}\n\
             {} decisions in {:.2} s: {:.0} decisions/s ({} allowed, {} errors, {} store calls)\n\
             latency µs: p50 {}  p99 {}  p999 {}  max {}",
            self.store,
            self.algorithm,
            self.keys,
            self.concurrency,
            self.decisions,
            self.seconds,
            self.decisions_per_second,
            self.allowed,
            self.errors,
            self.store_calls,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.max_us
        )
    }
}
