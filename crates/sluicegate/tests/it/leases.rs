//! Leases (docs/SPEC.md, "Leases"): four instances — four limiters, each with leases of
//! its own — sharing one store, driven by one manual clock over random arrivals at a hot
//! key. Every admission is held to the rule without leases: a brute-force count of every
//! window for a sliding log and a fixed window, and for a token bucket the admissions
//! replayed at their times on a fresh store, which must admit them all. A hot key's
//! under-admission stays within k × instances per window, and its store calls come to
//! about one per k decisions; on a real Redis too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use sluicegate::{
    Algorithm, Check, DecidedBy, Limit, Limiter, LimiterConfig, ManualClock, MemoryStore,
    MemoryStoreConfig, Outcome, Rule, RuleSpec, Store, StoreError,
};

const INSTANCES: usize = 4;
/// Where the clock starts: a whole second, so windows of 100 ms and 1 s start with it.
const START: u64 = 1_700_000_000_000_000;

/// One store behind several limiters, as one Redis is behind several instances, counting
/// the calls it gets.
struct Shared {
    store: Arc<MemoryStore>,
    calls: Arc<AtomicU64>,
}

impl Store for Shared {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.store.check(check).await
    }
}

/// One arrival: at which instance, how long after the one before (µs), at what cost.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    instance: usize,
    gap: u64,
    cost: u64,
}

/// What a run admitted: each admission's time (µs) and cost; and how many checks were
/// decided and how many calls the store got.
struct Run {
    admitted: Vec<(u64, u64)>,
    decisions: u64,
    store_calls: u64,
    lease_decisions: u64,
}

/// `arrivals` at four limiters of one memory store, all on one manual clock, each with
/// `config`.
fn run(rule: &Rule, arrivals: &[Arrival], config: &LimiterConfig) -> Run {
    let clock = ManualClock::new(Duration::from_micros(START));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(clock.clone()),
    ));
    let calls = Arc::new(AtomicU64::new(0));
    let limiters: Vec<_> = (0..INSTANCES)
        .map(|_| {
            Limiter::with_clock(
                Shared {
                    store: Arc::clone(&store),
                    calls: Arc::clone(&calls),
                },
                config.clone(),
                Arc::new(clock.clone()),
            )
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut now = START;
    let mut admitted = Vec::new();
    runtime.block_on(async {
        for a in arrivals {
            now += a.gap;
            clock.set(Duration::from_micros(now));
            let limits = [Limit { rule, key: "hot" }];
            let outcome = limiters[a.instance]
                .decide(&Check::new(&limits, a.cost))
                .await
                .unwrap();
            if outcome.decision.allowed {
                admitted.push((now, a.cost));
            }
        }
    });
    Run {
        admitted,
        decisions: arrivals.len() as u64,
        store_calls: calls.load(Ordering::Relaxed),
        lease_decisions: limiters.iter().map(|l| l.stats().lease_decisions).sum(),
    }
}

/// The most units any window of `rule`'s algorithm without the lease holds among
/// `admitted`, for a window of `window` µs: every sliding window ending at an admission,
/// or every aligned fixed window.
fn most_in_a_window(algorithm: Algorithm, window: u64, admitted: &[(u64, u64)]) -> u64 {
    match algorithm {
        Algorithm::FixedWindow => {
            let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
            for (t, cost) in admitted {
                *per_window.entry(t / window).or_default() += cost;
            }
            per_window.values().copied().max().unwrap_or(0)
        }
        _ => admitted
            .iter()
            .map(|(end, _)| {
                admitted
                    .iter()
                    .filter(|(t, _)| *t + window > *end && t <= end)
                    .map(|(_, cost)| cost)
                    .sum()
            })
            .max()
            .unwrap_or(0),
    }
}

/// Whether a token bucket of `spec` without a lease, on a fresh store, admits every one of
/// `admitted` at its time: the admissions conform to it.
fn a_token_bucket_admits_them_all(spec: &RuleSpec, admitted: &[(u64, u64)]) -> bool {
    let store = MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::ZERO)),
    );
    let rule = Rule::new("replay", spec).unwrap();
    admitted.iter().all(|&(t, cost)| {
        let limits = [Limit {
            rule: &rule,
            key: "hot",
        }];
        let check = Check {
            at: Some(Duration::from_micros(t)),
            ..Check::new(&limits, cost)
        };
        store.check_now(&check).unwrap().decision.allowed
    })
}

/// Runs of 1 to 6 arrivals at one instance, at most `most_gap` µs after the run before,
/// the rest of a run at the same instant: an instance often spends its lease in a burst.
fn arrivals(most_gap: u64) -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec((0..INSTANCES, 0..most_gap, 1..=3u64, 1..=6usize), 1..120).prop_map(
        |runs| {
            runs.into_iter()
                .flat_map(|(instance, gap, cost, length)| {
                    (0..length).map(move |i| Arrival {
                        instance,
                        gap: if i == 0 { gap } else { 0 },
                        cost,
                    })
                })
                .collect()
        },
    )
}

fn leased_rule() -> impl Strategy<Value = (RuleSpec, u64, Option<u64>)> {
    (
        prop_oneof![
            Just(Algorithm::SlidingLog),
            Just(Algorithm::FixedWindow),
            Just(Algorithm::TokenBucket),
        ],
        3..40u64,
        prop_oneof![Just(20_000u64), Just(100_000), Just(1_000_000)],
        // Up to 8, or the whole limit: one take empties a window. Mostly the former: a key
        // takes only once an instance asked k units in a span of D, and after a whole
        // limit's worth of checks a take of the whole limit seldom finds it free.
        prop_oneof![3 => 1..=8u64, 1 => Just(u64::MAX)],
        prop_oneof![Just(None), (1..=500u64).prop_map(Some)],
    )
        .prop_map(|(algorithm, limit, window, units, thousandths)| {
            let spec = RuleSpec::new(algorithm, limit, Duration::from_micros(window));
            (
                spec,
                units.min(limit),
                thousandths.map(|t| window * t / 1000),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Never more than L in any window across the four instances, whatever the arrivals.
    #[test]
    fn four_instances_with_leases_never_admit_past_the_limit(
        (spec, units, spend_within) in leased_rule(),
        arrivals in arrivals(3_000),
    ) {
        let leased = Rule::new("hot", &spec)
            .unwrap()
            .with_lease(units, spend_within.map(Duration::from_micros));
        // A token bucket's burst cut by D may leave less than k.
        prop_assume!(leased.is_ok());
        let run = run(&leased.unwrap(), &arrivals, &LimiterConfig::default());
        let window = u64::try_from(spec.window.as_micros()).unwrap();
        if spec.algorithm == Algorithm::TokenBucket {
            prop_assert!(
                a_token_bucket_admits_them_all(&spec, &run.admitted),
                "admissions {:?} do not conform to {:?}",
                run.admitted,
                spec
            );
        } else {
            let most = most_in_a_window(spec.algorithm, window, &run.admitted);
            prop_assert!(most <= spec.limit, "{most} units in one window of {:?}", spec);
        }
    }
}

/// A hot key, at four instances in turn, each seeing a check every 400 µs — k = 10 of them
/// well within a lease's 100 ms: every fixed window of 1 s admits at least L − k ×
/// instances and at most L, and the store gets one call per k admissions; past the limit,
/// one call per refusal, or with the negative cache a few per window.
#[test]
fn a_hot_key_under_leases_loses_at_most_k_per_instance_and_calls_the_store_once_per_k() {
    let (limit, units, windows) = (1_000u64, 10u64, 5u64);
    let spec = RuleSpec::new(Algorithm::FixedWindow, limit, Duration::from_secs(1));
    let rule = Rule::new("hot", &spec)
        .unwrap()
        .with_lease(units, None)
        .unwrap();
    // Demand of 10,000 per window: the limit is reached early in each.
    let arrivals: Vec<Arrival> = (0..windows * 10_000)
        .map(|i| Arrival {
            instance: (i % INSTANCES as u64) as usize,
            gap: 100,
            cost: 1,
        })
        .collect();
    for negative_cache in [false, true] {
        let config = LimiterConfig {
            negative_cache_entries: if negative_cache { 1_000 } else { 0 },
            ..LimiterConfig::default()
        };
        let run = run(&rule, &arrivals, &config);
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for (t, cost) in &run.admitted {
            *per_window.entry(t / 1_000_000).or_default() += cost;
        }
        // The first and last windows are partly outside the run.
        let whole: Vec<u64> = per_window.values().copied().skip(1).take(3).collect();
        assert_eq!(whole.len(), 3, "{per_window:?}");
        for admitted in &whole {
            assert!(
                *admitted <= limit && *admitted >= limit - units * INSTANCES as u64,
                "a window admitted {admitted} of {limit}: {per_window:?}"
            );
        }
        let admitted: u64 = run.admitted.iter().map(|(_, c)| c).sum();
        let refused = run.decisions - admitted;
        // Per window and instance, at most a take refused and its check alone, twice.
        let edges = INSTANCES as u64 * (windows + 1) * 4;
        let most_calls = admitted / units + edges + if negative_cache { 0 } else { refused };
        assert!(
            run.store_calls <= most_calls,
            "{} store calls for {admitted} admissions and {refused} refusals",
            run.store_calls
        );
        assert!(run.lease_decisions >= admitted - admitted / units - edges);
        println!(
            "fixed window L={limit} k={units}, 4 instances, negative cache {negative_cache}: \
             admitted per whole window {whole:?}, {} store calls for {admitted} admissions \
             ({} from leases) and {refused} refusals",
            run.store_calls, run.lease_decisions
        );
    }
}

/// A lease's decisions say who decided, and answer as the store would have at the take. A
/// key takes a lease once its checks asked k units in a span of D, and keeps taking while
/// the span before asked as many.
#[test]
fn a_decision_from_a_lease_says_so_and_counts_down() {
    let spec = RuleSpec::new(Algorithm::SlidingLog, 20, Duration::from_secs(1));
    let rule = Rule::new("hot", &spec)
        .unwrap()
        .with_lease(4, None)
        .unwrap();
    let clock = ManualClock::new(Duration::from_micros(START));
    let store = MemoryStore::new(MemoryStoreConfig::default(), Arc::new(clock.clone()));
    let limiter = Limiter::with_clock(store, LimiterConfig::default(), Arc::new(clock.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let limits = [Limit {
        rule: &rule,
        key: "hot",
    }];
    let decide = |cost| {
        runtime
            .block_on(limiter.decide(&Check::new(&limits, cost)))
            .unwrap()
    };
    // 1 and 2 units asked of the span of D (10 ms for a sliding log of 1 s): not hot yet.
    for (cost, remaining) in [(1, 19), (2, 17)] {
        let cold = decide(cost);
        assert_eq!(cold.decided_by, DecidedBy::Store);
        assert_eq!(cold.decision.remaining, remaining);
    }
    assert_eq!(limiter.stats().lease_takes, 0);
    // The fourth unit: a take of 4.
    let first = decide(1);
    assert_eq!(first.decided_by, DecidedBy::Store);
    assert_eq!(
        first.decision.remaining, 16,
        "the take of 4 left 13, and 3 are held"
    );
    let second = decide(2);
    assert_eq!(second.decided_by, DecidedBy::Lease);
    assert!(second.decision.allowed);
    assert_eq!(second.decision.remaining, 14);
    assert_eq!(second.decision.reset_after(), Duration::from_millis(1010));
    // One unit left in the lease: a cost of 2 takes again.
    let third = decide(2);
    assert_eq!(third.decided_by, DecidedBy::Store);
    assert_eq!(
        third.decision.remaining, 12,
        "9 in the store, the lease's unit and the new take's 2"
    );
    // Past D the lease is spent no more; the span before asked 8 units: a take.
    clock.advance(Duration::from_millis(10));
    let fourth = decide(1);
    assert_eq!(fourth.decided_by, DecidedBy::Store);
    assert_eq!(fourth.decision.remaining, 8, "5 in the store and 3 held");
    assert_eq!(limiter.stats().lease_takes, 3);
    // A span later the one before asked 1 unit: cold, the check alone.
    clock.advance(Duration::from_millis(10));
    let fifth = decide(1);
    assert_eq!(fifth.decided_by, DecidedBy::Store);
    assert_eq!(fifth.decision.remaining, 4);
    assert_eq!(limiter.stats().lease_takes, 3);
    assert_eq!(limiter.stats().lease_decisions, 1);
}

/// A key checked too slowly to spend a lease within D takes none: it loses nothing to
/// leases. One instance checks a key of a fixed window of 100 a minute with `lease: 10`
/// (D = 1 s) every 2 s, 30 times in one window: all 30 admitted, as without the lease,
/// where a take at every check would lose 9 units each and admit 10.
#[test]
fn a_key_too_cold_for_its_lease_loses_nothing() {
    let spec = RuleSpec::new(Algorithm::FixedWindow, 100, Duration::from_secs(60));
    let rule = Rule::new("cold", &spec)
        .unwrap()
        .with_lease(10, None)
        .unwrap();
    // START + 40 s begins a window of a minute.
    let arrivals: Vec<Arrival> = (0..30)
        .map(|i| Arrival {
            instance: 0,
            gap: if i == 0 { 40_000_000 } else { 2_000_000 },
            cost: 1,
        })
        .collect();
    let run = run(&rule, &arrivals, &LimiterConfig::default());
    assert_eq!(run.admitted.len(), 30, "{:?}", run.admitted);
    assert_eq!(run.lease_decisions, 0);
    assert_eq!(run.store_calls, 30);
}

/// A fixed window's lease ends with the window it was counted in: units taken just before
/// a boundary are not spent after it, where the next window's L is taken afresh.
#[test]
fn a_fixed_windows_lease_ends_with_its_window() {
    let spec = RuleSpec::new(Algorithm::FixedWindow, 8, Duration::from_millis(100));
    let rule = Rule::new("hot", &spec)
        .unwrap()
        .with_lease(4, Some(Duration::from_millis(50)))
        .unwrap();
    let at = |instance, gap| Arrival {
        instance,
        gap,
        cost: 1,
    };
    // Instance 0 asks 3 units at 96-98 ms and takes 4 at 99 ms (7 in the window), spending
    // one; instance 1 fills the next window's 8; instance 0's 3 left are not spent in it.
    let mut arrivals = vec![
        at(0, 96_000),
        at(0, 1_000),
        at(0, 1_000),
        at(0, 1_000),
        at(1, 1_000),
    ];
    arrivals.extend((0..7).map(|_| at(1, 0)));
    arrivals.extend((0..3).map(|_| at(0, 0)));
    let run = run(&rule, &arrivals, &LimiterConfig::default());
    let most = most_in_a_window(Algorithm::FixedWindow, 100_000, &run.admitted);
    assert_eq!(most, 8, "{:?}", run.admitted);
    assert_eq!(run.admitted.len(), 12, "{:?}", run.admitted);
    assert!(run.lease_decisions > 0);
}

/// Four instances, each its own connections and leases, on one real Redis, a hot key
/// checked by eight workers per instance until six times its limit was asked for: never
/// more than L in the window (a sliding log of a minute, longer than the run), no more
/// than k − 1 per instance left unspent, and about one script call per k admissions (the
/// negative cache on, as the service runs it: refusals are answered locally).
#[cfg(feature = "redis")]
#[tokio::test]
async fn four_instances_on_one_redis_call_it_once_per_k_and_never_admit_past_the_limit() {
    use sluicegate::RedisStore;
    use sluicegate::redis::Scripting;
    use sluicegate_test_support::RedisServer;

    use crate::redis_trace::stores;

    const WORKERS: usize = 8;
    let redis = RedisServer::start(&[]);
    let (limit, units) = (2_000u64, 20u64);
    for layout in [sluicegate::LogLayout::Zset, sluicegate::LogLayout::Compact] {
        let name = format!("leases-{}", layout.name());
        let spec = RuleSpec {
            layout: Some(layout),
            ..RuleSpec::new(Algorithm::SlidingLog, limit, Duration::from_secs(60))
        };
        // Spent within 30 s: no lease expires while a loaded machine runs the test.
        let rule = Rule::new(&name, &spec)
            .unwrap()
            .with_lease(units, Some(Duration::from_secs(30)))
            .unwrap();
        let mut limiters: Vec<Arc<Limiter<RedisStore>>> = Vec::new();
        for _ in 0..INSTANCES {
            let store = stores::store_at(&redis.url(), &name, Scripting::Auto).await;
            let config = LimiterConfig {
                negative_cache_entries: 1_000,
                ..LimiterConfig::default()
            };
            limiters.push(Arc::new(Limiter::with_config(store, config)));
        }
        let per_worker = 6 * limit / (INSTANCES * WORKERS) as u64;
        let mut workers = tokio::task::JoinSet::new();
        for limiter in &limiters {
            for _ in 0..WORKERS {
                let (limiter, rule) = (Arc::clone(limiter), rule.clone());
                workers.spawn(async move {
                    let mut admitted = 0u64;
                    for _ in 0..per_worker {
                        let decision = limiter.check(&rule, "hot", 1).await.unwrap();
                        admitted += u64::from(decision.allowed);
                    }
                    admitted
                });
            }
        }
        let mut admitted = 0;
        while let Some(worker) = workers.join_next().await {
            admitted += worker.unwrap();
        }
        let decisions = per_worker * (INSTANCES * WORKERS) as u64;
        let sent = limiters.iter().map(|l| l.store().script_calls());
        let (calls, checks) = sent.fold((0, 0), |(calls, checks), s| {
            (calls + s.calls, checks + s.checks)
        });
        let from_leases: u64 = limiters.iter().map(|l| l.stats().lease_decisions).sum();
        println!(
            "redis sliding log ({}) L={limit} k={units}, 4 instances × {WORKERS} workers: \
             {admitted} admitted of {decisions} decisions ({from_leases} from leases), \
             {calls} script calls carrying {checks} checks: {:.4} calls per admission, \
             {:.4} per decision",
            layout.name(),
            calls as f64 / admitted as f64,
            calls as f64 / decisions as f64
        );
        assert!(admitted <= limit, "{admitted} admitted past {limit}");
        assert!(
            admitted >= limit - INSTANCES as u64 * (units - 1),
            "{admitted} admitted: more than k − 1 per instance left unspent"
        );
        // A take per k admissions; and per instance, a few calls when the takes are
        // refused and the checks alone fill the limit, and the refusals the negative cache
        // learns from.
        let most_calls = admitted / units + (INSTANCES * WORKERS * 4) as u64;
        assert!(
            calls <= most_calls,
            "{calls} script calls for {admitted} admissions and {decisions} decisions"
        );
    }
}

/// Saturated for five seconds (a check every 100 µs at four instances in turn, k = 10): a
/// sliding log of 1000 per second with a lease admits 1000 per W + D (D = 10 ms) less what
/// the instances hold, and a token bucket of 1000 per second its rate and its burst cut by
/// ⌈D / T⌉ = 10, less what they hold.
#[test]
fn saturated_a_sliding_log_and_a_token_bucket_lose_what_docs_spec_says() {
    let (limit, units, held) = (1_000u64, 10u64, INSTANCES as u64 * 9);
    let arrivals: Vec<Arrival> = (0..50_000u64)
        .map(|i| Arrival {
            instance: (i % INSTANCES as u64) as usize,
            gap: 100,
            cost: 1,
        })
        .collect();
    // The run spans 5 s less 100 µs.
    let span = 50_000 * 100 - 100;
    for algorithm in [Algorithm::SlidingLog, Algorithm::TokenBucket] {
        let spec = RuleSpec::new(algorithm, limit, Duration::from_secs(1));
        let rule = Rule::new("hot", &spec)
            .unwrap()
            .with_lease(units, None)
            .unwrap();
        let run = run(&rule, &arrivals, &LimiterConfig::default());
        let admitted: u64 = run.admitted.iter().map(|(_, c)| c).sum();
        let (least, most) = match algorithm {
            // Every W + D = 1.01 s holds L, but for what is held; a window of the log
            // begins at the first admission.
            Algorithm::SlidingLog => (
                (span / 1_010_000 + 1) * limit - held,
                (span / 1_010_000 + 1) * limit,
            ),
            // The burst (1000 − 10) at once, then one unit per 1000 µs.
            _ => (
                limit - 10 + span / 1_000 - held,
                limit - 10 + span / 1_000 + 1,
            ),
        };
        println!(
            "{algorithm} L={limit}/s k={units}, 4 instances saturated for 5 s: admitted \
             {admitted} ({} without a lease would be {}), {} store calls",
            if algorithm == Algorithm::SlidingLog {
                "at most"
            } else {
                "exactly"
            },
            if algorithm == Algorithm::SlidingLog {
                5 * limit
            } else {
                limit + span / 1_000
            },
            run.store_calls
        );
        assert!(
            (least..=most).contains(&admitted),
            "{algorithm}: {admitted} admitted, not within {least}..={most}"
        );
    }
}
