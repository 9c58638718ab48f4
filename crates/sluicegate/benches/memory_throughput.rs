//! In-memory checks per second: every algorithm next to governor's keyed (dashmap) limiter,
//! on the same workloads, in one run.
//!
//! Run with: `cargo bench -p sluicegate --bench memory_throughput`
//! (`BENCH_SECONDS=3` for longer cells; the default is 1 s per cell after 0.3 s of warm-up;
//! `BENCH_ONLY=token` runs only the limiters whose name contains `token`, and governor).
//!
//! Workloads: 1 or 2 threads; one hot key, or 100,000 keys picked at random. Every limiter
//! allows 100 per second per key (the token bucket and governor with a burst of 100), so
//! the hot key is mostly refused and the 100,000 keys are mostly allowed.

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

const LIMIT: u64 = 100;
const WINDOW: u64 = 1_000_000;

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

fn sluicegate(algorithm: Algorithm) -> Sluicegate {
    let mut spec = RuleSpec::new(algorithm, LIMIT, WINDOW);
    if algorithm == Algorithm::LeakyBucket {
        spec.queue = Some(LIMIT - 1);
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

fn governor() -> Governor {
    let per_second = NonZeroU32::new(LIMIT as u32).expect("non-zero");
    Governor(RateLimiter::keyed(Quota::per_second(per_second)))
}

/// Runs `threads` threads for `duration`, each checking keys from `keys`; returns checks
/// per second and the share allowed.
fn measure(
    contender: &dyn Contender,
    keys: &[String],
    threads: usize,
    duration: Duration,
) -> (f64, f64) {
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
    let elapsed = start.elapsed().as_secs_f64();
    let checks: u64 = counts.iter().map(|c| c.0).sum();
    let allowed: u64 = counts.iter().map(|c| c.1).sum();
    (checks as f64 / elapsed, allowed as f64 / checks as f64)
}

fn main() {
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let duration = Duration::from_secs_f64(seconds);
    let hot = vec!["hot-key".to_owned()];
    let many: Vec<String> = (0..100_000).map(|i| format!("user:{i}")).collect();
    let workloads: [(&str, &[String]); 2] = [("1 hot key", &hot), ("100,000 keys", &many)];

    println!("| limiter | workload | threads | checks/s | allowed | vs governor |");
    println!("|---|---|---|---:|---:|---:|");
    for (workload, keys) in workloads {
        for threads in [1, 2] {
            // Fresh limiters per cell, each warmed up on the same workload before measuring.
            let mut contenders: Vec<(String, Box<dyn Contender>)> =
                vec![("governor (keyed, dashmap)".to_owned(), Box::new(governor()))];
            for algorithm in Algorithm::ALL {
                contenders.push((
                    format!("sluicegate {algorithm}"),
                    Box::new(sluicegate(algorithm)),
                ));
            }
            let only = std::env::var("BENCH_ONLY").unwrap_or_default();
            contenders.retain(|(name, _)| name.contains(&only) || name.starts_with("governor"));
            let mut baseline = None;
            for (name, contender) in &contenders {
                measure(
                    contender.as_ref(),
                    keys,
                    threads,
                    Duration::from_millis(300),
                );
                let (rate, allowed) = measure(contender.as_ref(), keys, threads, duration);
                let base = *baseline.get_or_insert(rate);
                println!(
                    "| {name} | {workload} | {threads} | {:.2} M | {:.1}% | {:.2}× |",
                    rate / 1e6,
                    allowed * 100.0,
                    rate / base
                );
            }
        }
    }
}
