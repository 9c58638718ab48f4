//! The one entry point every front end uses: rules, key, cost and request id in, a
//! decision out. Front ends never see which store decides.
//!
//! Around the store it keeps deciding when the store cannot (seed 001 §5.2, seed 002
//! §4.6): a per-rule or server-wide [`FailurePolicy`], a circuit breaker that stops
//! calling a failing store, and a negative cache that answers repeated refusals without a
//! round trip. Every decision says who made it ([`DecidedBy`]) and [`LimiterStats`]
//! counts them.

mod breaker;
mod negative_cache;

pub use breaker::BreakerState;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breaker::{Breaker, Permit};
use negative_cache::NegativeCache;

use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, RetryAfter};
use crate::policy::FailurePolicy;
use crate::rule::Rule;
use crate::store::{
    Check, DecidedBy, Limit, MemoryStore, MemoryStoreConfig, Outcome, Store, StoreError,
};

/// How a [`Limiter`] copes with its store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimiterConfig {
    /// What rules without a policy of their own do when the store fails.
    pub on_store_error: FailurePolicy,
    /// Instances sharing the store: a `local` fallback allows L / instances (rounded up).
    pub instances: u32,
    /// Consecutive store failures that open the circuit breaker; 0 never opens it.
    pub breaker_failures: u32,
    /// How long an open breaker waits before a probe.
    pub breaker_cool_down: Duration,
    /// Entries of the negative cache; 0 (the default) turns it off. Worth it in front of
    /// a remote store, where it saves round trips; pointless in front of the in-memory
    /// store, which answers as fast.
    pub negative_cache_entries: usize,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            on_store_error: FailurePolicy::Error,
            instances: 1,
            breaker_failures: 5,
            breaker_cool_down: Duration::from_secs(1),
            negative_cache_entries: 0,
        }
    }
}

/// Counters of what the limiter did, for metrics.
#[derive(Debug, Default)]
pub struct LimiterStats {
    /// Checks the store decided.
    pub store_decisions: AtomicU64,
    /// Checks the store failed (errors, timeouts, and checks refused by an open breaker).
    pub store_errors: AtomicU64,
    /// Checks refused by the negative cache without a round trip.
    pub negative_cache_hits: AtomicU64,
    /// Checks a fallback policy decided.
    pub fallback_decisions: AtomicU64,
}

/// Decides checks against a store.
#[derive(Debug)]
pub struct Limiter<S = MemoryStore> {
    store: S,
    config: LimiterConfig,
    breaker: Breaker,
    negative: Option<NegativeCache>,
    /// The `local` fallback's own store and its scaled-down rules, by rule identity.
    local: MemoryStore,
    local_rules: Mutex<HashMap<String, Rule>>,
    stats: LimiterStats,
    /// Times the breaker, the negative cache and the local fallback.
    clock: Arc<dyn Clock>,
}

impl Default for Limiter<MemoryStore> {
    fn default() -> Self {
        Limiter::in_memory()
    }
}

impl Limiter<MemoryStore> {
    /// A limiter on a fresh in-memory store with default settings and the system clock.
    pub fn in_memory() -> Self {
        Limiter::new(MemoryStore::default())
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter deciding with `store`, with the default [`LimiterConfig`].
    pub fn new(store: S) -> Self {
        Limiter::with_config(store, LimiterConfig::default())
    }

    /// A limiter deciding with `store` as `config` says, on the system clock.
    pub fn with_config(store: S, config: LimiterConfig) -> Self {
        Limiter::with_clock(store, config, Arc::new(SystemClock::new()))
    }

    /// A limiter deciding with `store` as `config` says, its own timers (the breaker's
    /// cool-down, the negative cache's deadlines, the `local` fallback's windows) on
    /// `clock`. The store keeps its own clock: Redis its `TIME`, a [`MemoryStore`] the one
    /// it was made with (give both the same [`ManualClock`](crate::ManualClock) to move
    /// all time by hand).
    pub fn with_clock(store: S, config: LimiterConfig, clock: Arc<dyn Clock>) -> Self {
        Limiter {
            store,
            breaker: Breaker::new(config.breaker_failures, config.breaker_cool_down),
            negative: (config.negative_cache_entries > 0)
                .then(|| NegativeCache::new(config.negative_cache_entries, Arc::clone(&clock))),
            local: MemoryStore::new(MemoryStoreConfig::default(), Arc::clone(&clock)),
            local_rules: Mutex::new(HashMap::new()),
            config,
            stats: LimiterStats::default(),
            clock,
        }
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// What the limiter has done so far.
    pub fn stats(&self) -> &LimiterStats {
        &self.stats
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state(self.clock.now_micros())
    }

    /// Takes `cost` units for `key` under `rule`.
    pub async fn check(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, StoreError> {
        let limits = [Limit { rule, key }];
        self.decide(&Check::new(&limits, cost))
            .await
            .map(|outcome| outcome.decision)
    }

    /// Decides a check of any shape: several limits (all-or-nothing), a request id, the
    /// caller's clock.
    pub async fn decide(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        check.validate()?;
        let now = self.clock.now_micros();
        if let Some(mut outcome) = self.negative.as_ref().and_then(|n| n.lookup(check, now)) {
            self.stats
                .negative_cache_hits
                .fetch_add(1, Ordering::Relaxed);
            outcome.decided_by = DecidedBy::NegativeCache;
            return Ok(outcome);
        }
        let error = match self.breaker.permit(now) {
            Permit::Refuse => StoreError::breaker_open(format!(
                "the store failed {} times in a row; next try in {:?}",
                self.config.breaker_failures,
                self.breaker.wait(now)
            )),
            Permit::Call | Permit::Probe => match self.store.check(check).await {
                Ok(outcome) => {
                    self.breaker.success();
                    self.stats.store_decisions.fetch_add(1, Ordering::Relaxed);
                    if let Some(negative) = &self.negative {
                        negative.remember(check, now, outcome.decision, outcome.limits());
                        negative.remember_admission(check, now, outcome.decision);
                    }
                    return Ok(outcome);
                }
                // A malformed check is the caller's fault, not the store's.
                Err(e @ StoreError::InvalidCheck(_)) => return Err(e),
                // Only an unreachable or silent store trips the breaker: a full in-memory
                // store or a key of the wrong type says nothing about the next check.
                Err(e @ (StoreError::Unavailable { .. } | StoreError::Timeout { .. })) => {
                    self.breaker.failure(self.clock.now_micros());
                    e
                }
                // The store answered, if only with an error: it is reachable.
                Err(e) => {
                    self.breaker.success();
                    e
                }
            },
        };
        self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
        self.fall_back(check, error)
    }

    /// Decides `check` by the policies of its rules, the store having failed with `error`.
    /// The strictest policy among the rules settles it: any `error` rule surfaces the
    /// error; any `deny` rule refuses; otherwise `local` rules decide in memory, and
    /// `allow` rules allow.
    fn fall_back(&self, check: &Check<'_>, error: StoreError) -> Result<Outcome, StoreError> {
        let policies: Vec<FailurePolicy> = check
            .limits
            .iter()
            .map(|l| {
                l.rule
                    .failure_policy()
                    .unwrap_or(self.config.on_store_error)
            })
            .collect();
        let strictest = policies
            .iter()
            .copied()
            .max_by_key(|p| p.strictness())
            .unwrap_or_default();
        let decisions: Vec<Decision> = match strictest {
            FailurePolicy::Error => return Err(error),
            FailurePolicy::Deny => {
                let wait = u64::try_from(self.breaker.wait(self.clock.now_micros()).as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1);
                check
                    .limits
                    .iter()
                    .zip(&policies)
                    .map(|(l, p)| Decision {
                        allowed: *p != FailurePolicy::Deny,
                        limit: l.rule.capacity(),
                        remaining: 0,
                        retry_after: RetryAfter::Micros(if *p == FailurePolicy::Deny {
                            wait
                        } else {
                            0
                        }),
                        reset_after: 0,
                        delay: 0,
                    })
                    .collect()
            }
            FailurePolicy::Local | FailurePolicy::Allow => self.decide_locally(check, &policies)?,
        };
        self.stats
            .fallback_decisions
            .fetch_add(1, Ordering::Relaxed);
        let mut outcome = Outcome::from_limits(decisions);
        outcome.decided_by = DecidedBy::Fallback(strictest);
        Ok(outcome)
    }

    /// `local` rules decide on the in-memory store with their limit divided by the number
    /// of instances; `allow` rules allow. All-or-nothing, as ever.
    fn decide_locally(
        &self,
        check: &Check<'_>,
        policies: &[FailurePolicy],
    ) -> Result<Vec<Decision>, StoreError> {
        let local_rules: Vec<Option<Rule>> = check
            .limits
            .iter()
            .zip(policies)
            .map(|(l, p)| (*p == FailurePolicy::Local).then(|| self.local_rule(l.rule)))
            .collect();
        let limits: Vec<Limit<'_>> = check
            .limits
            .iter()
            .zip(&local_rules)
            .filter_map(|(l, rule)| rule.as_ref().map(|rule| Limit { rule, key: l.key }))
            .collect();
        let mut local = if limits.is_empty() {
            Vec::new().into_iter()
        } else {
            let local_check = Check {
                limits: &limits,
                ..*check
            };
            self.local
                .check_now(&local_check)?
                .limits()
                .to_vec()
                .into_iter()
        };
        Ok(check
            .limits
            .iter()
            .zip(&local_rules)
            .map(|(l, rule)| match rule {
                Some(_) => local.next().expect("one local decision per local rule"),
                None => Decision {
                    allowed: true,
                    limit: l.rule.capacity(),
                    remaining: l.rule.capacity().saturating_sub(check.cost.max(1)),
                    retry_after: RetryAfter::Micros(0),
                    reset_after: 0,
                    delay: 0,
                },
            })
            .collect())
    }

    /// `rule` with its limit (and burst or queue) divided by the number of instances.
    fn local_rule(&self, rule: &Rule) -> Rule {
        let mut cache = self
            .local_rules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(local) = cache.get(rule.identity()) {
            return local.clone();
        }
        let instances = u64::from(self.config.instances.max(1));
        let share = |n: u64| n.div_ceil(instances).max(1);
        let mut spec = rule.spec();
        spec.limit = share(spec.limit);
        spec.burst = spec.burst.map(share);
        spec.queue = spec.queue.map(|q| q.div_ceil(instances));
        // Scaling down only shrinks every product, so the original's bounds still hold;
        // should one not, the rule itself decides locally.
        let local =
            Rule::new(&format!("{}@local", rule.name()), &spec).unwrap_or_else(|_| rule.clone());
        cache.insert(rule.identity().to_owned(), local.clone());
        local
    }
}

#[cfg(test)]
mod tests;
