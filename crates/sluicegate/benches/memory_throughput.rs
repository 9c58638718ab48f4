//! In-memory checks per second: every algorithm next to governor's keyed (dashmap) limiter,
//! on the same workloads, in one run.
//!
//! Run with: `cargo bench -p sluicegate --bench memory_throughput`
//! (`BENCH_SECONDS=3` for longer cells; the default is 1 s per limiter and cell after 0.3 s
//! of warm-up, in turns of 0.1 s; `BENCH_ONLY=token` runs only the limiters whose name
//! contains `token`, and governor; `BENCH_WORKLOAD=hot` or `=100,000` only the workloads whose
//! name contains it, for a profile of one).
//!
//! Workloads: 1 or 2 threads; one hot key, or 100,000 keys picked at random. On the hot key
//! every limiter allows 100 per second (the token bucket and governor with a burst of 100),
//! so every limiter refuses almost every check. On the 100,000 keys every limiter allows
//! 10,000 per second per key, far above what any of them reaches (at 25 M checks/s a key
//! sees 250 a second), so every limiter admits (nearly) everything and the cells compare
//! the same work: with 100 per second the fastest limiters refused up to 60 % there while
//! the slower ones admitted all, and a refusal costs less than an admission.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sluicegate::{
    Algorithm, Check, Limit, MemoryStore, MemoryStoreConfig, Rule, RuleSpec, SystemClock,
};

const WINDOW: u64 = 1_000_000;

/// The keys a workload checks and what each limiter allows per key per [`WINDOW`].
struct Workload {
    name: &'static str,
    keys: Vec<String>,
    limit: u64,
}

/// Something that decides one check for a key and says whether it was allowed.
trait Contender: Sync {
    /// Checks `keys[index]`.
    fn check(&self, keys: &[String], index: usize) -> bool;
}

struct Sluicegate {
    store: MemoryStore,
    rule: Rule,
}

impl Contender for Sluicegate {
    fn check(&self, keys: &[String], index: usize) -> bool {
        let limits = [Limit {
            rule: &self.rule,
            key: &keys[index],
        }];
        self.store
            .check_now(&Check::new(&limits, 1))
            .expect("the benchmark stays under the key cap")
            .decision
            .allowed
    }
}

struct Governor(DefaultKeyedRateLimiter<String>);

impl Contender for Governor {
    fn check(&self, keys: &[String], index: usize) -> bool {
        // A borrow of the key; governor clones it only to insert a new key, as sluicegate
        // copies it only for a new entry.
        self.0.check_key(&keys[index]).is_ok()
    }
}

fn sluicegate(algorithm: Algorithm, limit: u64) -> Sluicegate {
    let mut spec = RuleSpec::new(algorithm, limit, Duration::from_micros(WINDOW));
    if algorithm == Algorithm::LeakyBucket {
        spec.queue = Some(limit - 1);
    }
    Sluicegate {
        store: MemoryStore::new(
            MemoryStoreConfig {
                max_keys: 1 << 22,
                ..MemoryStoreConfig::default()
            },
            Arc::new(SystemClock::new()),
        ),
        rule: Rule::new("bench", &spec).expect("a valid rule"),
    }
}

fn governor(limit: u64) -> Governor {
    let per_second = u32::try_from(limit)
        .ok()
        .and_then(NonZeroU32::new)
        .expect("a limit in 1..2^32");
    Governor(RateLimiter::keyed(Quota::per_second(per_second)))
}

/// How long each contender runs at a stretch before the next takes over: the contenders of
/// a cell take turns, so load from elsewhere on a shared machine falls on all of them alike.
const SLICE: Duration = Duration::from_millis(100);

/// Checks made, checks allowed and seconds taken, summed over slices.
#[derive(Clone, Copy, Default)]
struct Tally {
    checks: u64,
    allowed: u64,
    seconds: f64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.checks += other.checks;
        self.allowed += other.allowed;
        self.seconds += other.seconds;
    }

    fn rate(&self) -> f64 {
        self.checks as f64 / self.seconds
    }

    fn allowed_share(&self) -> f64 {
        self.allowed as f64 / self.checks as f64
    }
}

/// Runs `threads` threads for `duration`, each checking keys from `keys`.
fn measure(
    contender: &dyn Contender,
    keys: &[String],
    threads: usize,
    duration: Duration,
) -> Tally {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let counts: Vec<(u64, u64)> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let stop = &stop;
                scope.spawn(move || {
                    // xorshift: a cheap, per-thread key sequence.
                    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1);
                    let (mut checks, mut allowed) = (0u64, 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let index = (x % keys.len() as u64) as usize;
                            allowed += u64::from(black_box(contender.check(keys, index)));
                        }
                        checks += 256;
                    }
                    (checks, allowed)
                })
            })
            .collect();
        thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    Tally {
        checks: counts.iter().map(|c| c.0).sum(),
        allowed: counts.iter().map(|c| c.1).sum(),
        seconds: start.elapsed().as_secs_f64(),
    }
}

fn main() {
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let duration = Duration::from_secs_f64(seconds);
    let workloads = [
        Workload {
            name: "1 hot key",
            keys: vec!["hot-key".to_owned()],
            limit: 100,
        },
        Workload {
            name: "100,000 keys",
            keys: (0..100_000).map(|i| format!("user:{i}")).collect(),
            limit: 10_000,
        },
    ];
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let only_workload = std::env::var("BENCH_WORKLOAD").unwrap_or_default();

    println!("| limiter | workload | threads | checks/s | allowed | vs governor |");
    println!("|---|---|---|---:|---:|---:|");
    for workload in workloads.iter().filter(|w| w.name.contains(&only_workload)) {
        let (keys, limit) = (&workload.keys, workload.limit);
        for threads in [1, 2] {
            // Fresh limiters per cell, each warmed up on the same workload before measuring.
            let mut contenders: Vec<(String, Box<dyn Contender>)> = vec![(
                "governor (keyed, dashmap)".to_owned(),
                Box::new(governor(limit)),
            )];
            for algorithm in Algorithm::ALL {
                contenders.push((
                    format!("sluicegate {algorithm}"),
                    Box::new(sluicegate(algorithm, limit)),
                ));
            }
            contenders.retain(|(name, _)| name.contains(&only) || name.starts_with("governor"));
            for (_, contender) in &contenders {
                measure(
                    contender.as_ref(),
                    keys,
                    threads,
                    Duration::from_millis(300),
                );
            }
            let mut tallies = vec![Tally::default(); contenders.len()];
            for _ in 0..(duration.as_secs_f64() / SLICE.as_secs_f64()).ceil() as usize {
                for ((_, contender), tally) in contenders.iter().zip(&mut tallies) {
                    tally.add(measure(contender.as_ref(), keys, threads, SLICE));
                }
            }
            let base = tallies[0].rate();
            for ((name, _), tally) in contenders.iter().zip(&tallies) {
                println!(
                    "| {name} | {} | {threads} | {:.2} M | {:.1}% | {:.2}× |",
                    workload.name,
                    tally.rate() / 1e6,
                    tally.allowed_share() * 100.0,
                    tally.rate() / base
                );
            }
        }
    }
}
