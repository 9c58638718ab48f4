//! What the `local` fallback admits is written back to the store, and a store that lost a
//! key's state gets the instance's last count back: one instance never passes L in a
//! window, across an outage or a loss. On a manual clock and a store that a test takes
//! down, or makes forget.

use super::*;
use crate::budget::MemoryBudget;
use crate::policy::OnStoreReset;
use crate::store::Charge;
use std::time::Duration;

/// The limit of the outage tests: 200 a minute.
const L: u32 = 200;

fn local(instances: u32) -> LimiterConfig {
    LimiterConfig {
        on_store_error: FailurePolicy::Local,
        instances,
        ..LimiterConfig::default()
    }
}

/// How many of `n` checks of one unit of `limits` `limiter` admits.
async fn admitted_of<S: Store>(limiter: &Limiter<S>, limits: &[Limit<'_>], n: u32) -> u32 {
    let mut allowed = 0;
    for _ in 0..n {
        let outcome = limiter.decide(&Check::new(limits, 1)).await.unwrap();
        allowed += u32::from(outcome.decision.allowed);
    }
    allowed
}

/// The store counts exactly L units for `key`: it refuses one more, and admits one once
/// one unit is refunded.
fn holds_exactly_the_limit(store: &FlakyStore, rule: &Rule, key: &str) -> bool {
    let limits = [Limit { rule, key }];
    let peek = |store: &FlakyStore| {
        store
            .inner
            .check_now(&Check::new(&limits, 0))
            .unwrap()
            .decision
            .allowed
    };
    let full = !peek(store);
    store
        .inner
        .check_now(&Check {
            charge: Charge::Refund,
            ..Check::new(&limits, 1)
        })
        .unwrap();
    full && peek(store)
}

/// The algorithms that admit a burst of L at once (a leaky bucket admits at its outflow
/// rate; it is a GCRA like the token bucket, written back alike).
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::SlidingLog,
    Algorithm::SlidingCounter,
    Algorithm::FixedWindow,
    Algorithm::TokenBucket,
];

#[tokio::test]
async fn one_instance_never_passes_its_limit_across_an_outage() {
    for algorithm in ALGORITHMS {
        // No time passes: a bucket would refill meanwhile.
        let (limiter, _clock) = limiter(local(1));
        let rule = rule(algorithm, u64::from(L), 60 * S);
        assert_eq!(
            admitted(&limiter, &rule, "k", 150).await,
            150,
            "{algorithm}"
        );
        limiter.store().down.store(true, Ordering::SeqCst);
        let during = admitted(&limiter, &rule, "k", 100).await;
        assert_eq!(during, 50, "{algorithm}");
        assert_eq!(limiter.owed(), (1, 50), "{algorithm}");
        limiter.store().down.store(false, Ordering::SeqCst);
        // The store, back, counts what the instance admitted without it before it decides.
        let first = decide(&limiter, &rule, "k").await;
        assert_eq!(first.decided_by, DecidedBy::Store, "{algorithm}");
        assert!(!first.decision.allowed, "{algorithm}: admitted past L");
        let after = admitted(&limiter, &rule, "k", 99).await;
        assert_eq!(150 + during + after, L, "{algorithm}");
        assert_eq!(limiter.owed(), (0, 0), "{algorithm}");
        assert!(
            holds_exactly_the_limit(limiter.store(), &rule, "k"),
            "{algorithm}: the store does not count every unit admitted"
        );
        let stats = limiter.stats();
        assert_eq!(stats.write_backs_written, 1);
        // A second outage in the window starts from the count written back: nothing more.
        limiter.store().down.store(true, Ordering::SeqCst);
        assert_eq!(admitted(&limiter, &rule, "k", 10).await, 0, "{algorithm}");
    }
}

#[tokio::test]
async fn n_instances_pass_the_limit_only_by_what_they_admit_during_the_outage() {
    // Two instances on one store, each at 150 / 200 when it fails: each admits its share
    // min(100, 50) alone, and the store, back, counts both and admits nothing more.
    let clock = ManualClock::new(Duration::from_micros(1_700_000_040 * S));
    let store = Arc::new(FlakyStore {
        inner: MemoryStore::new(MemoryStoreConfig::default(), Arc::new(clock.clone())),
        down: AtomicBool::new(false),
        generation: AtomicU64::new(0),
    });
    let instance = || {
        Limiter::with_clock(
            SharedFlaky(Arc::clone(&store)),
            local(2),
            Arc::new(clock.clone()),
        )
    };
    let (a, b) = (instance(), instance());
    let rule = rule(Algorithm::SlidingLog, u64::from(L), 60 * S);
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let mut allowed = 0;
    for limiter in [&a, &b].into_iter().cycle().take(150) {
        allowed += admitted_of(limiter, &limits, 1).await;
    }
    // Each instance last saw the store at 149 or 150.
    store.down.store(true, Ordering::SeqCst);
    for limiter in [&a, &b] {
        allowed += admitted_of(limiter, &limits, 100).await;
    }
    // The last answers: 149 to one (R = 51), 150 to the other; each admits min(100, R).
    assert_eq!(allowed, 150 + 51 + 50);
    store.down.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_micros(S));
    assert_eq!(a.write_back(10).await + b.write_back(10).await, 2);
    for limiter in [&a, &b] {
        let outcome = limiter.decide(&Check::new(&limits, 1)).await.unwrap();
        assert_eq!(outcome.decided_by, DecidedBy::Store);
        assert!(!outcome.decision.allowed);
    }
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let standing = store.inner.check_now(&Check::new(&limits, 0)).unwrap();
    assert!(!standing.decision.allowed);
}

/// Two limiters sharing one flaky store.
struct SharedFlaky(Arc<FlakyStore>);

impl Store for SharedFlaky {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        self.0.check(check).await
    }
}

#[tokio::test]
async fn keys_no_check_reaches_are_written_back_in_the_background() {
    let (limiter, clock) = limiter(local(1));
    let rule = rule(Algorithm::SlidingLog, u64::from(L), 60 * S);
    assert_eq!(admitted(&limiter, &rule, "k", 150).await, 150);
    limiter.store().down.store(true, Ordering::SeqCst);
    assert_eq!(admitted(&limiter, &rule, "k", 100).await, 50);
    // Still down: the write fails, the units stay owed.
    let failed = || limiter.stats().write_backs_failed;
    let before = failed();
    assert_eq!(limiter.write_back(10).await, 0);
    assert_eq!(limiter.owed(), (1, 50));
    assert_eq!(failed(), before + 1);
    limiter.store().down.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_micros(S));
    assert_eq!(limiter.write_back(10).await, 1);
    assert_eq!(limiter.owed(), (0, 0));
    assert!(holds_exactly_the_limit(limiter.store(), &rule, "k"));
}

#[tokio::test]
async fn the_background_write_back_does_a_bounded_share_each_time() {
    let (limiter, clock) = limiter(local(1));
    let rule = rule(Algorithm::FixedWindow, 5, 60 * S);
    limiter.store().down.store(true, Ordering::SeqCst);
    for i in 0..25 {
        assert_eq!(admitted(&limiter, &rule, &format!("k{i}"), 1).await, 1);
    }
    limiter.store().down.store(false, Ordering::SeqCst);
    // Past the breaker's cool-down.
    clock.advance(Duration::from_micros(S));
    for (written, owing) in [(10, 15), (10, 5), (5, 0)] {
        assert_eq!(limiter.write_back(10).await, written);
        assert_eq!(limiter.owed().0, owing);
    }
}

#[tokio::test]
async fn owed_units_are_not_written_back_once_their_window_is_over() {
    for algorithm in ALGORITHMS {
        let (limiter, clock) = limiter(local(1));
        let rule = rule(algorithm, u64::from(L), 60 * S);
        limiter.store().down.store(true, Ordering::SeqCst);
        assert_eq!(admitted(&limiter, &rule, "k", 10).await, 10, "{algorithm}");
        // A sliding counter weighs the previous window too: two windows free everything.
        clock.advance(Duration::from_micros(121 * S));
        limiter.store().down.store(false, Ordering::SeqCst);
        assert_eq!(limiter.write_back(10).await, 0, "{algorithm}");
        assert_eq!(limiter.owed(), (0, 0), "{algorithm}");
        assert_eq!(limiter.stats().write_backs_expired, 1, "{algorithm}");
        assert_eq!(admitted(&limiter, &rule, "k", L).await, L, "{algorithm}");
    }
}

#[tokio::test]
async fn a_key_the_store_lost_gets_its_last_count_back_under_conservative() {
    for (policy, after) in [(OnStoreReset::Conservative, 50), (OnStoreReset::Admit, 100)] {
        // Not a `local` rule: the policy covers every rule.
        let (limiter, _clock) = limiter(LimiterConfig {
            on_store_reset: policy,
            ..LimiterConfig::default()
        });
        let rule = rule(Algorithm::SlidingLog, u64::from(L), 60 * S);
        assert_eq!(admitted(&limiter, &rule, "k", 150).await, 150);
        assert_eq!(admitted(&limiter, &rule, "other", 10).await, 10);
        limiter.store().lose(&rule, "k");
        assert_eq!(admitted(&limiter, &rule, "k", 100).await, after, "{policy}");
        let reseeded = limiter.stats().store_reset_keys;
        assert_eq!(reseeded, u64::from(policy == OnStoreReset::Conservative));
        if policy == OnStoreReset::Conservative {
            assert!(holds_exactly_the_limit(limiter.store(), &rule, "k"));
        }
        // The generation is the store's, not the key's: a key it did not lose is counted
        // again too under conservative (10 more), never less than it holds.
        let other = admitted(&limiter, &rule, "other", 200).await;
        match policy {
            OnStoreReset::Conservative => assert_eq!(other, 180),
            OnStoreReset::Admit => assert_eq!(other, 190),
        }
        // One loss is answered once.
        assert_eq!(limiter.owed(), (0, 0));
    }
}

/// On a store that never loses what it wrote (the in-memory store), `conservative` keeps
/// no count per key: there is nothing to write back, and every check would pay for one.
#[tokio::test]
async fn a_store_that_cannot_lose_state_keeps_no_counts() {
    let memory = MemoryBudget::new(64 << 20, 1.0).unwrap();
    let limiter = Limiter::with_config(
        MemoryStore::default(),
        LimiterConfig {
            on_store_reset: OnStoreReset::Conservative,
            memory: memory.clone(),
            ..LimiterConfig::default()
        },
    );
    let rule = rule(Algorithm::SlidingLog, 10, 10 * S);
    for i in 0..100 {
        let limits = [Limit {
            rule: &rule,
            key: &format!("client:{i}"),
        }];
        assert!(
            limiter
                .decide(&Check::new(&limits, 1))
                .await
                .unwrap()
                .decision
                .allowed
        );
    }
    assert_eq!(memory.part(FALLBACK_PART).used(), 0);
}

#[tokio::test]
async fn the_fallback_gives_its_memory_back_after_an_outage() {
    let memory = MemoryBudget::new(64 << 20, 1.0).unwrap();
    let (limiter, clock) = limiter(LimiterConfig {
        memory: memory.clone(),
        ..local(1)
    });
    let rule = rule(Algorithm::SlidingLog, 10, 10 * S);
    let keys: Vec<String> = (0..20_000).map(|i| format!("client:{i}")).collect();
    for key in &keys {
        assert_eq!(admitted(&limiter, &rule, key, 1).await, 1);
    }
    limiter.store().down.store(true, Ordering::SeqCst);
    for key in &keys {
        assert_eq!(admitted(&limiter, &rule, key, 1).await, 1);
    }
    let during = memory.part(FALLBACK_PART).used();
    assert!(during > 20_000 * 64, "{during} bytes during the outage");
    limiter.store().down.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_micros(S));
    while limiter.write_back(1000).await > 0 {}
    assert_eq!(limiter.owed(), (0, 0));
    clock.advance(Duration::from_micros(11 * S));
    limiter.write_back(1000).await;
    assert_eq!(memory.part(FALLBACK_PART).used(), 0);
}

/// A flaky store whose reports, while it is up, wait for a permit of `gate`.
struct GatedReports {
    store: Arc<FlakyStore>,
    gate: tokio::sync::Semaphore,
}

impl Store for GatedReports {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        if check.charge == Charge::Report && !self.store.down.load(Ordering::SeqCst) {
            self.gate.acquire().await.unwrap().forget();
        }
        self.store.check(check).await
    }
}

#[tokio::test]
async fn a_check_of_a_key_being_written_back_waits_for_the_write() {
    let clock = ManualClock::new(Duration::from_micros(1_700_000_040 * S));
    let flaky = Arc::new(FlakyStore {
        inner: MemoryStore::new(MemoryStoreConfig::default(), Arc::new(clock.clone())),
        down: AtomicBool::new(false),
        generation: AtomicU64::new(0),
    });
    let gated = GatedReports {
        store: Arc::clone(&flaky),
        gate: tokio::sync::Semaphore::new(0),
    };
    let limiter = Limiter::with_clock(gated, local(1), Arc::new(clock.clone()));
    let rule = rule(Algorithm::SlidingLog, u64::from(L), 60 * S);
    let limits = [Limit {
        rule: &rule,
        key: "k",
    }];
    let mut allowed = admitted_of(&limiter, &limits, 150).await;
    flaky.down.store(true, Ordering::SeqCst);
    allowed += admitted_of(&limiter, &limits, 100).await;
    assert_eq!(allowed, L);
    flaky.down.store(false, Ordering::SeqCst);
    // The first check writes the debt back and is held there; the second must wait for
    // that write, not ask the store, which still counts 150, on its own.
    let release = async {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(limiter.owed(), (1, 50), "written before the release");
        limiter.store().gate.add_permits(1);
    };
    let one = Check::new(&limits, 1);
    let (first, second, ()) = tokio::join!(limiter.decide(&one), limiter.decide(&one), release);
    for outcome in [first.unwrap(), second.unwrap()] {
        assert_eq!(outcome.decided_by, DecidedBy::Store);
        assert!(!outcome.decision.allowed, "admitted past L");
    }
    assert_eq!(limiter.owed(), (0, 0));
    assert!(holds_exactly_the_limit(&flaky, &rule, "k"));
}
