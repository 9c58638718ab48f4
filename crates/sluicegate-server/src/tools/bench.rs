//! `sluicegate bench`: decisions per second and latency percentiles against a store.
//!
//! `concurrency` tasks check keys picked at random among `keys` for `duration`, either as
//! fast as the store answers or, with `--rate`, at a fixed total rate (each task on its
//! own schedule). Latency is measured from when a check is sent to when its answer is
//! back; tokio's timers are only millisecond-accurate, so measuring from when a paced
//! check was due would mostly measure the timer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use sluicegate::{AnyStore, Check, Limit, Limiter, LimiterConfig, Rule};

/// What one run measured.
#[derive(Debug, Serialize)]
pub(crate) struct BenchReport {
    /// The store, or the service's address.
    pub(crate) target: String,
    /// The algorithm, or the protocol.
    pub(crate) workload: String,
    pub(crate) keys: usize,
    pub(crate) concurrency: usize,
    pub(crate) seconds: f64,
    pub(crate) decisions: u64,
    pub(crate) decisions_per_second: f64,
    pub(crate) allowed: u64,
    pub(crate) errors: u64,
    /// Checks that reached the store (the rest the negative cache answered); `None` when
    /// driving a service, whose store calls are its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) store_calls: Option<u64>,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) p999_us: u64,
    pub(crate) max_us: u64,
}

/// The settings of one run.
pub(crate) struct BenchPlan {
    pub(crate) store_name: String,
    pub(crate) drive: Drive,
    /// Answer repeated refusals locally.
    pub(crate) negative_cache: bool,
}

struct TaskResult {
    latencies: Vec<u32>,
    allowed: u64,
    errors: u64,
}

/// How to drive load.
pub(crate) struct Drive {
    pub(crate) keys: usize,
    pub(crate) concurrency: usize,
    pub(crate) duration: Duration,
    /// Total calls per second; `None` for as fast as possible.
    pub(crate) rate: Option<f64>,
}

/// What driving load measured.
pub(crate) struct Driven {
    /// Sorted.
    latencies: Vec<u32>,
    allowed: u64,
    errors: u64,
    seconds: f64,
}

impl Driven {
    fn percentile(&self, p: f64) -> u64 {
        if self.latencies.is_empty() {
            return 0;
        }
        let n = self.latencies.len();
        let index = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
        u64::from(self.latencies[index])
    }

    /// The report, for `target` and `workload`.
    pub(crate) fn report(
        &self,
        target: String,
        workload: String,
        drive: &Drive,
        store_calls: Option<u64>,
    ) -> BenchReport {
        let decisions = self.latencies.len() as u64;
        BenchReport {
            target,
            workload,
            keys: drive.keys,
            concurrency: drive.concurrency,
            seconds: self.seconds,
            decisions,
            decisions_per_second: decisions as f64 / self.seconds,
            allowed: self.allowed,
            errors: self.errors,
            store_calls,
            p50_us: self.percentile(0.50),
            p99_us: self.percentile(0.99),
            p999_us: self.percentile(0.999),
            max_us: self.latencies.last().copied().map_or(0, u64::from),
        }
    }
}

/// Runs `concurrency` tasks for `duration`, each calling `call` with keys picked at random
/// (as fast as answers come, or paced to `rate` in total); `call` answers whether the
/// request was allowed, or failed.
pub(crate) async fn drive<C, F>(drive: &Drive, call: C) -> Driven
where
    C: Fn(usize) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Result<bool, ()>> + Send,
{
    let started = Instant::now();
    let deadline = started + drive.duration;
    let period = drive
        .rate
        .map(|rate| Duration::from_secs_f64(drive.concurrency as f64 / rate));
    let keys = drive.keys as u64;
    let tasks: Vec<_> = (0..drive.concurrency)
        .map(|task| {
            let call = call.clone();
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
                    match call((x % keys) as usize).await {
                        Ok(allowed) => result.allowed += u64::from(allowed),
                        Err(()) => result.errors += 1,
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
    let mut driven = Driven {
        latencies: Vec::new(),
        allowed: 0,
        errors: 0,
        seconds: 0.0,
    };
    for task in tasks {
        if let Ok(result) = task.await {
            driven.latencies.extend(result.latencies);
            driven.allowed += result.allowed;
            driven.errors += result.errors;
        }
    }
    driven.seconds = started.elapsed().as_secs_f64();
    driven.latencies.sort_unstable();
    driven
}

/// Checks against a store, through a limiter.
pub(crate) async fn run(store: AnyStore, rule: Rule, plan: BenchPlan) -> BenchReport {
    let limiter = Arc::new(Limiter::with_config(
        store,
        LimiterConfig {
            negative_cache_entries: if plan.negative_cache { 100_000 } else { 0 },
            ..LimiterConfig::default()
        },
    ));
    let keys: Arc<Vec<String>> =
        Arc::new((0..plan.drive.keys).map(|i| format!("bench:{i}")).collect());
    let call = {
        let (limiter, rule) = (Arc::clone(&limiter), rule.clone());
        move |i: usize| {
            let (limiter, rule, keys) = (Arc::clone(&limiter), rule.clone(), Arc::clone(&keys));
            async move {
                let limits = [Limit {
                    rule: &rule,
                    key: &keys[i],
                }];
                limiter
                    .decide(&Check::new(&limits, 1))
                    .await
                    .map(|o| o.decision.allowed)
                    .map_err(drop)
            }
        }
    };
    let driven = drive(&plan.drive, call).await;
    let store_calls = limiter
        .stats()
        .store_decisions
        .load(std::sync::atomic::Ordering::Relaxed);
    driven.report(
        plan.store_name,
        rule.algorithm().to_string(),
        &plan.drive,
        Some(store_calls),
    )
}

impl BenchReport {
    /// Prints the report, as JSON or as text.
    pub(crate) fn print(&self, json: bool) -> Result<()> {
        if json {
            println!("{}", serde_json::to_string(self)?);
        } else {
            println!("{}", self.text());
        }
        Ok(())
    }

    pub(crate) fn text(&self) -> String {
        format!(
            "{} · {} · {} keys · concurrency {}\n\
             {} decisions in {:.2} s: {:.0} decisions/s ({} allowed, {} errors{})\n\
             latency µs: p50 {}  p99 {}  p999 {}  max {}",
            self.target,
            self.workload,
            self.keys,
            self.concurrency,
            self.decisions,
            self.seconds,
            self.decisions_per_second,
            self.allowed,
            self.errors,
            self.store_calls
                .map_or(String::new(), |n| format!(", {n} store calls")),
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.max_us
        )
    }
}
