//! `sluicegate bench`: decisions per second and latency percentiles against a store.
//!
//! `concurrency` tasks check keys picked at random among `keys` for `duration` (or until
//! `requests` checks are sent), either as fast as the store answers or, with `--rate`, at
//! a fixed total rate (each task on its own schedule). Latency is measured from when a check is sent to when its answer is
//! back; tokio's timers are only millisecond-accurate, so measuring from when a paced
//! check was due would mostly measure the timer.
//!
//! A check that fails is no decision: failures are counted by kind, apart, and neither
//! their number nor their latency enters the decisions or the percentiles. A failing
//! task backs off before its next check and an answered one yields to the others, so no
//! task spins on an instant error (an open breaker's) or an instant answer and starves
//! the connection driver and the timers sharing its worker.

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;
use sluicegate::internals::ScriptTime;
use sluicegate::redis::ScriptCalls;
use sluicegate::{Algorithm, AnyStore, Check, Limit, Limiter, LimiterConfig, RedisStore, Rule};

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
    /// Checks answered with a decision.
    pub(crate) decisions: u64,
    /// Of answered checks only.
    pub(crate) decisions_per_second: f64,
    pub(crate) allowed: u64,
    /// Checks that got no decision, by kind of failure: a store error's
    /// [`kind`](sluicegate::StoreError::kind), or the service's HTTP status or gRPC code.
    pub(crate) errors: BTreeMap<String, u64>,
    /// Checks that reached the store (the rest the negative cache answered); `None` when
    /// driving a service, whose store calls are its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) store_calls: Option<u64>,
    /// What the run cost Redis, by its own account; `None` off Redis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) redis: Option<RedisCost>,
    /// Latencies of answered checks only.
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) p999_us: u64,
    pub(crate) max_us: u64,
}

/// What a run cost Redis by its own account: the time `INFO commandstats` reports for
/// script calls over the run (every client's: run against a Redis of its own), per check
/// the store's script calls carried (`usec_per_call` ÷ checks per call).
#[derive(Debug, Serialize)]
pub(crate) struct RedisCost {
    /// How the checks were sent: `FCALL` or `EVALSHA`.
    pub(crate) command: &'static str,
    /// The store's script calls, and the checks they carried.
    pub(crate) script_calls: u64,
    pub(crate) checks: u64,
    /// Microseconds Redis spent in script calls, per check carried.
    pub(crate) us_per_decision: f64,
}

/// Readings of Redis' counters when a run starts.
struct RedisReadings {
    store: RedisStore,
    time: ScriptTime,
    calls: ScriptCalls,
}

impl RedisReadings {
    /// Reads them now; `None` off Redis, or when Redis does not tell (an ACL may deny
    /// `INFO`).
    async fn take(store: &AnyStore) -> Option<RedisReadings> {
        let AnyStore::Redis(store) = store else {
            return None;
        };
        let time = store
            .script_time()
            .await
            .inspect_err(|e| tracing::warn!("no Redis time per decision: {e}"))
            .ok()?;
        Some(RedisReadings {
            store: store.clone(),
            time,
            calls: store.script_calls(),
        })
    }

    /// What ran since these readings.
    async fn cost(&self) -> Option<RedisCost> {
        let time = self.store.script_time().await.ok()?.since(self.time);
        let calls = self.store.script_calls();
        let checks = calls.checks - self.calls.checks;
        Some(RedisCost {
            command: if self.store.uses_functions() {
                "FCALL"
            } else {
                "EVALSHA"
            },
            script_calls: calls.calls - self.calls.calls,
            checks,
            us_per_decision: if checks == 0 {
                0.0
            } else {
                time.micros as f64 / checks as f64
            },
        })
    }
}

/// The settings of one run.
pub(crate) struct BenchPlan {
    pub(crate) store_name: String,
    pub(crate) drive: Drive,
    /// Answer repeated refusals locally.
    pub(crate) negative_cache: bool,
    /// The local pre-check's factor, if on.
    pub(crate) local_precheck: Option<f64>,
    /// Instances the bench plays one of.
    pub(crate) instances: u32,
}

/// Why a call got no decision, as counted: a store error's kind, an HTTP status, a gRPC
/// code.
pub(crate) type FailureKind = std::borrow::Cow<'static, str>;

/// How long a task waits after its first failure in a row; each further one doubles it,
/// up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(1);
const MAX_BACKOFF: Duration = Duration::from_millis(64);

/// How to drive load.
pub(crate) struct Drive {
    pub(crate) keys: usize,
    pub(crate) concurrency: usize,
    /// How long to run; `None` for until `requests` are sent.
    pub(crate) duration: Option<Duration>,
    /// How many calls to send in all (answered or failed); `None` for no bound.
    pub(crate) requests: Option<NonZeroU64>,
    /// Total calls per second; `None` for as fast as possible.
    pub(crate) rate: Option<f64>,
}

/// What one task calls, one check at a time: with `&mut self`, a task can keep state of
/// its own between checks (a connection it renews).
pub(crate) trait Caller: Send + 'static {
    /// Checks key `key`: whether it was allowed, or why it got no decision.
    fn call(&mut self, key: usize) -> impl Future<Output = Result<bool, FailureKind>> + Send;
}

impl<C, F> Caller for C
where
    C: FnMut(usize) -> F + Send + 'static,
    F: Future<Output = Result<bool, FailureKind>> + Send,
{
    fn call(&mut self, key: usize) -> impl Future<Output = Result<bool, FailureKind>> + Send {
        self(key)
    }
}

/// What driving load measured: one task's, or all of them together.
#[derive(Default)]
pub(crate) struct Driven {
    /// Of answered calls; sorted once every task's are in.
    latencies: Vec<u32>,
    allowed: u64,
    errors: BTreeMap<String, u64>,
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
            errors: self.errors.clone(),
            store_calls,
            redis: None,
            p50_us: self.percentile(0.50),
            p99_us: self.percentile(0.99),
            p999_us: self.percentile(0.999),
            max_us: self.latencies.last().copied().map_or(0, u64::from),
        }
    }
}

/// Runs `concurrency` tasks for `duration` or until `requests` calls are sent, whichever
/// comes first, each task calling its own caller (`caller(task)`) with keys picked at
/// random, as fast as answers come or paced to `rate` in total.
pub(crate) async fn drive<M, C>(drive: &Drive, mut caller: M) -> Driven
where
    M: FnMut(usize) -> C,
    C: Caller,
{
    let started = Instant::now();
    let deadline = drive.duration.map(|duration| started + duration);
    let period = drive
        .rate
        .map(|rate| Duration::from_secs_f64(drive.concurrency as f64 / rate));
    let keys = drive.keys as u64;
    // Calls claimed so far by all tasks together, for `requests`.
    let sent = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..drive.concurrency)
        .map(|task| {
            let mut caller = caller(task);
            let (sent, requests) = (Arc::clone(&sent), drive.requests);
            tokio::spawn(async move {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (task as u64 + 1);
                let mut result = Driven::default();
                let mut backoff = FIRST_BACKOFF;
                // Spread the tasks' schedules over one period so they do not fire together.
                let mut due = period.map(|p| started + p.mul_f64(task as f64 / 32.0));
                loop {
                    if let Some(at) = due {
                        tokio::time::sleep_until(at.into()).await;
                    }
                    let begin = Instant::now();
                    if deadline.is_some_and(|deadline| begin >= deadline) {
                        break;
                    }
                    if requests.is_some_and(|n| sent.fetch_add(1, Ordering::Relaxed) >= n.get()) {
                        break;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    match caller.call((x % keys) as usize).await {
                        Ok(allowed) => {
                            let micros = begin.elapsed().as_micros();
                            result
                                .latencies
                                .push(u32::try_from(micros).unwrap_or(u32::MAX));
                            result.allowed += u64::from(allowed);
                            backoff = FIRST_BACKOFF;
                            // An answer can come without the call ever waiting (the
                            // negative cache, the memory store): let the others run.
                            tokio::task::yield_now().await;
                        }
                        Err(kind) => {
                            *result.errors.entry(kind.into_owned()).or_default() += 1;
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(MAX_BACKOFF);
                        }
                    }
                    if let (Some(at), Some(p)) = (due.as_mut(), period) {
                        *at += p;
                    }
                }
                result
            })
        })
        .collect();
    let mut driven = Driven::default();
    for task in tasks {
        if let Ok(result) = task.await {
            driven.latencies.extend(result.latencies);
            driven.allowed += result.allowed;
            for (kind, n) in result.errors {
                *driven.errors.entry(kind).or_default() += n;
            }
        }
    }
    driven.seconds = started.elapsed().as_secs_f64();
    driven.latencies.sort_unstable();
    driven
}

/// Checks against a store, through a limiter.
pub(crate) async fn run(store: AnyStore, rule: Rule, plan: BenchPlan) -> BenchReport {
    let readings = RedisReadings::take(&store).await;
    let limiter = Arc::new(Limiter::with_config(
        store,
        LimiterConfig {
            negative_cache_entries: if plan.negative_cache { 100_000 } else { 0 },
            local_precheck: plan.local_precheck,
            instances: plan.instances,
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
                    .map_err(|e| FailureKind::Borrowed(e.kind()))
            }
        }
    };
    let driven = drive(&plan.drive, |_| call.clone()).await;
    let redis = match &readings {
        Some(readings) => readings.cost().await,
        None => None,
    };
    let store_calls = limiter.stats().store_decisions;
    // A sliding log's layout decides what Redis does, so the report names it.
    let workload = match rule.algorithm() {
        Algorithm::SlidingLog => format!("{} ({})", rule.algorithm(), rule.layout().name()),
        other => other.to_string(),
    };
    BenchReport {
        redis,
        ..driven.report(plan.store_name, workload, &plan.drive, Some(store_calls))
    }
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

    /// Checks that got no decision.
    fn failed_checks(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The failures by kind, `timeout 12, breaker_open 3`.
    fn errors_text(&self) -> String {
        let kinds: Vec<String> = self
            .errors
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        kinds.join(", ")
    }

    /// An error when any check failed: a run with failures is not a clean measurement.
    pub(crate) fn verdict(&self) -> Result<()> {
        let failed = self.failed_checks();
        if failed > 0 {
            bail!(
                "the run failed: {failed} checks got no decision ({})",
                self.errors_text()
            );
        }
        Ok(())
    }

    pub(crate) fn text(&self) -> String {
        let errors = match self.failed_checks() {
            0 => "no errors".to_owned(),
            n => format!("{n} errors: {}", self.errors_text()),
        };
        let redis = self.redis.as_ref().map_or(String::new(), |cost| {
            format!(
                "\nRedis time per decision: {:.2} µs ({}, {} checks in {} script calls)",
                cost.us_per_decision, cost.command, cost.checks, cost.script_calls
            )
        });
        format!(
            "{} · {} · {} keys · concurrency {}\n\
             {} decisions in {:.2} s: {:.0} decisions/s ({} allowed; {}{})\n\
             latency µs (answered checks): p50 {}  p99 {}  p999 {}  max {}{}",
            self.target,
            self.workload,
            self.keys,
            self.concurrency,
            self.decisions,
            self.seconds,
            self.decisions_per_second,
            self.allowed,
            errors,
            self.store_calls
                .map_or(String::new(), |n| format!(", {n} store calls")),
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.max_us,
            redis
        )
    }
}
