//! The one entry point every front end uses: rules, key, cost and request id in, a
//! decision out. Front ends never see which store decides.
//!
//! Around the store it keeps deciding when the store cannot:
//! a per-rule or server-wide [`FailurePolicy`] (`local` continuing each key from
//! the store's last count), a circuit breaker per node of the store that stops calling a
//! node that fails too large a share of calls (checks of other nodes' keys go on), and a
//! negative cache that answers repeated refusals without a
//! round trip, and leases: a hot key's units taken from the store several at a time and
//! spent here. Every decision says who made it ([`DecidedBy`]) and [`LimiterStats`]
//! counts them.

mod breaker;
mod in_flight;
mod lease;
mod local;
mod negative_cache;
mod nodes;
mod owed;
mod precheck;
mod room;
mod seeds;
mod share;

pub use breaker::{BreakerConfig, BreakerState, BreakerTransitions};
#[cfg(test)]
use local::FALLBACK_PART;
use negative_cache::NEGATIVE_CACHE_PART;
pub use nodes::NodeBreaker;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use breaker::{Permit, Ticket};
use in_flight::{InFlight, Joined};
use lease::{LEASE_PART, Leases};
use local::LocalFallback;
use negative_cache::NegativeCache;
use nodes::NodeBreakers;
use precheck::Precheck;

use crate::budget::MemoryBudget;
use crate::clock::{Clock, ClockMicros, SystemClock};
use crate::decision::{Decision, RetryAfter};
use crate::policy::{FailurePolicy, OnStoreReset};
use crate::rule::{Algorithm, Rule};
use crate::store::{
    Charge, Check, DecidedBy, Limit, MemoryStore, NodeId, Nodes, Outcome, Store, StoreError,
};

/// How a [`Limiter`] copes with its store.
#[derive(Clone, Debug, PartialEq)]
pub struct LimiterConfig {
    /// What rules without a policy of their own do when the store fails.
    pub on_store_error: FailurePolicy,
    /// Instances sharing the store: a `local` fallback allows L / instances (rounded up).
    pub instances: u32,
    /// When a node's circuit breaker opens, and for how long (each node of the store has
    /// its own, with these settings).
    pub breaker: BreakerConfig,
    /// Entries of the negative cache; 0 (the default) turns it off. Worth it in front of
    /// a remote store, where it saves round trips; pointless in front of the in-memory
    /// store, which answers as fast.
    pub negative_cache_entries: usize,
    /// Keys of `local` rules whose last store answer is remembered to start the `local`
    /// fallback from; past it, a new key starts the fallback empty.
    pub local_seed_entries: usize,
    /// What a key whose state the store lost gets
    /// ([`Store::lost_state_generation`]): under [`OnStoreReset::Conservative`] (the
    /// default) the last count the store answered is remembered for every rule, not only
    /// `local` ones, and written back to the store after a loss — on a store that may lose
    /// state ([`Store::may_lose_state`]); the in-memory store never does.
    pub on_store_reset: OnStoreReset,
    /// The local pre-check's factor: each instance refuses on its own what it would send
    /// the store past factor × L / `instances` of a rule (at least 1; `None`, the default,
    /// turns it off). See docs/SPEC.md for what it may refuse that the store would admit.
    pub local_precheck: Option<f64>,
    /// Where the negative cache, the local fallback and the leases count their bytes
    /// (parts `negative-cache`, `fallback` and `lease`); past it they keep no more.
    pub memory: MemoryBudget,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            on_store_error: FailurePolicy::Error,
            instances: 1,
            breaker: BreakerConfig::default(),
            negative_cache_entries: 0,
            local_seed_entries: 100_000,
            on_store_reset: OnStoreReset::default(),
            local_precheck: None,
            memory: MemoryBudget::unlimited(),
        }
    }
}

/// Declares [`LimiterStats`], a snapshot of plain counts, and the atomics the limiter
/// counts in ([`Counters`]), from one list of counters.
macro_rules! limiter_counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// What the limiter has done so far, for metrics: a snapshot ([`Limiter::stats`]).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct LimiterStats {
            $($(#[$doc])* pub $name: u64,)*
        }

        /// The limiter's counters, bumped as it decides.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
        }

        impl Counters {
            fn snapshot(&self) -> LimiterStats {
                LimiterStats {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

limiter_counters! {
    /// Checks the store decided.
    store_decisions,
    /// Checks of a leased rule answered from units this instance held (no round trip).
    lease_decisions,
    /// Takes of a lease's units the store admitted (each one call, counted in
    /// `store_decisions` with the check it answered).
    lease_takes,
    /// Checks the store failed (errors, timeouts, and checks refused by an open breaker).
    store_errors,
    /// Checks refused by the negative cache without a round trip.
    negative_cache_hits,
    /// Checks refused by the local pre-check without a round trip.
    local_precheck_refusals,
    /// Checks a fallback policy decided.
    fallback_decisions,
    /// Keys whose owed units (admitted by the `local` fallback, or lost by the store) were
    /// written to the store.
    write_backs_written,
    /// Write-backs of owed units the store failed; the units stay owed.
    write_backs_failed,
    /// Keys whose owed units expired before they could be written back: they no longer
    /// count.
    write_backs_expired,
    /// Keys whose owed units the store refused as invalid: dropped, logged at error.
    write_backs_dropped,
    /// Units the `local` fallback admitted with no room left to owe them (its memory
    /// budget or key cap full): never written back.
    unowed_units,
    /// Keys found in a store that lost their state, whose last count was owed to the
    /// store again (`--on-store-reset conservative`).
    store_reset_keys,
}

/// What a check may do with this instance's lease of its key, where its rule leases. No
/// more than a flag: the future of every check holds it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leasing {
    /// Spend from it, or take anew where the key is hot: a caller's check.
    SpendOrTake,
    /// Take anew at the store: a check of a hot key the lease could not answer (the take in
    /// flight, or one that waited for it).
    Take,
}

/// Decides checks against a store.
#[derive(Debug)]
pub struct Limiter<S = MemoryStore> {
    store: S,
    config: LimiterConfig,
    breakers: NodeBreakers,
    negative: Option<NegativeCache>,
    /// Checks at the store, which later checks of the same limits wait for while the
    /// negative cache is on.
    in_flight: InFlight,
    precheck: Option<Precheck>,
    /// Units of leased rules' keys this instance took from the store and has not spent.
    leases: Leases,
    /// Takes at the store, which later checks of the same key wait for to spend from.
    lease_takes: InFlight,
    local: LocalFallback,
    stats: Counters,
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

/// Whether the store was reached, for a breaker: only an unreachable, silent or
/// unreplicated node counts against its breaker; a key of the wrong type says nothing about
/// the next check. A node that says the cluster is down answered at once: calling it costs
/// no wait, so its breaker has nothing to save, and it is the first to know when the
/// cluster is ok again. Counted as a failure, the healthy masters' answers while a failover
/// finishes would open their breakers and hold their keys for a cool-down after it.
fn reached(error: &StoreError) -> bool {
    !matches!(
        error,
        StoreError::Unavailable { .. }
            | StoreError::Timeout { .. }
            | StoreError::NotReplicated { .. }
    )
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
            breakers: NodeBreakers::new(config.breaker),
            negative: (config.negative_cache_entries > 0).then(|| {
                NegativeCache::new(
                    config.negative_cache_entries,
                    Arc::clone(&clock),
                    config.memory.part(NEGATIVE_CACHE_PART),
                )
            }),
            in_flight: InFlight::new(),
            precheck: config
                .local_precheck
                .map(|factor| Precheck::new(factor, config.instances, &clock)),
            leases: Leases::new(Arc::clone(&clock), config.memory.part(LEASE_PART)),
            lease_takes: InFlight::new(),
            local: LocalFallback::new(
                config.instances,
                config.local_seed_entries,
                &clock,
                &config.memory,
            ),
            config,
            stats: Counters::default(),
            clock,
        }
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The memory budget the limiter's tables count in (`LimiterConfig::memory`).
    pub fn memory(&self) -> &MemoryBudget {
        &self.config.memory
    }

    /// The clock this limiter's own timers run on.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// What the limiter has done so far.
    pub fn stats(&self) -> LimiterStats {
        self.stats.snapshot()
    }

    /// The whole store's circuit breaker state now, over the nodes it sends checks to:
    /// open while any one's breaker is open (the checks of that node's keys fall back
    /// unsent), else half-open while any one's is probing, else closed. A store of one
    /// server has one node: its breaker's state.
    pub fn breaker_state(&self) -> BreakerState {
        nodes::worst(self.node_breakers().iter().map(|node| node.state))
    }

    /// How many times the nodes' circuit breakers entered each state, summed over every
    /// node that ever had a check.
    pub fn breaker_transitions(&self) -> BreakerTransitions {
        self.breakers.transitions()
    }

    /// The circuit breaker of each node the store sends checks to now (that has had a
    /// check), in the order of the store's numbers. A node that no longer serves any key
    /// (a master that failed over) is left out: whatever its breaker says holds no key.
    pub fn node_breakers(&self) -> Vec<NodeBreaker<'_>> {
        self.breakers
            .all(self.clock.now_micros())
            .filter(|node| self.store.node_name(node.node).is_some())
            .collect()
    }

    /// Writes back to the store what up to `max_keys` keys owe it — units the `local`
    /// fallback admitted, or counts a store that lost them no longer holds — for keys that
    /// saw no check since the store answered again (a check of a key writes its own back
    /// first); drops what no longer counts, and gives the fallback's memory back. Does
    /// nothing for a key whose node's breaker is open; a key whose write fails stays
    /// owed (the first failure is logged). Returns how many keys it wrote back. The server
    /// calls it periodically.
    pub async fn write_back(&self, max_keys: usize) -> usize {
        let now = self.clock.now_micros();
        self.local.sweep(now);
        let mut written = 0;
        let mut failed = false;
        for (rule, key) in self.local.due(max_keys, now, &self.stats) {
            let limits = [Limit {
                rule: &rule,
                key: &key,
            }];
            let check = Check::new(&limits, 0);
            let nodes = self.store.nodes(&check);
            let Ok(tickets) = self.permits(&nodes, now) else {
                continue;
            };
            let generation = self.store.lost_state_generation(&check);
            let result = self
                .local
                .write_back_key(&self.store, &limits[0], generation, now, &self.stats)
                .await;
            tickets.finish(
                result.as_ref().err().is_none_or(reached),
                self.clock.now_micros(),
            );
            match result {
                Ok(()) => written += 1,
                Err(error) if !failed => {
                    failed = true;
                    let (keys, units) = self.local.owed();
                    tracing::warn!(%error, owing = keys, units, "writing back units owed to the store failed; they stay owed");
                }
                Err(_) => {}
            }
        }
        if written > 0 {
            let (keys, units) = self.local.owed();
            tracing::info!(
                written,
                owing = keys,
                units,
                "wrote back units owed to the store"
            );
        }
        written
    }

    /// Keys owing units to the store, and the units, now: what the `local` fallback
    /// admitted, or a store that lost state no longer counts, not yet written back.
    pub fn owed(&self) -> (usize, u64) {
        self.local.owed()
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
    pub fn decide<'a>(
        &'a self,
        check: &'a Check<'a>,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + 'a {
        // Not an async fn around another: every check's future would hold both.
        self.decide_leasing(check, Leasing::SpendOrTake)
    }

    /// Decides `check`, using this instance's lease of its key as `leasing` says.
    async fn decide_leasing(
        &self,
        check: &Check<'_>,
        leasing: Leasing,
    ) -> Result<Outcome, StoreError> {
        check.validate()?;
        let take = leasing == Leasing::Take;
        if leasing == Leasing::SpendOrTake
            && let Some(lease) = Leases::applies(check)
        {
            let hash = self.leases.hash(&check.limits[0]);
            let now = self.clock.now_micros();
            let hot = self.leases.hot(hash, lease, check.cost, now);
            if let Some(spent) = self.spend_lease(check, hash, now) {
                return Ok(spent);
            }
            if hot {
                // Boxed, a take's future is allocated only by the checks that take, and
                // does not grow every check's future.
                return Box::pin(self.take_lease(check, hash)).await;
            }
            // A key not hot here goes on to the store as without the lease (no take).
        }
        let Some(negative) = self
            .negative
            .as_ref()
            .filter(|_| NegativeCache::applies(check))
        else {
            return self.send(check, self.clock.now_micros(), None, take).await;
        };
        let hash = negative.hash(check.limits);
        let mut now = self.clock.now_micros();
        if let Some(refused) = self.cached_refusal(negative, check, hash, now) {
            return Ok(refused);
        }
        let leading = match self.in_flight.join(hash) {
            Joined::Lead(leading) => Some(leading),
            Joined::Wait(answered) => {
                answered.await;
                now = self.clock.now_micros();
                if let Some(refused) = self.cached_refusal(negative, check, hash, now) {
                    return Ok(refused);
                }
                None
            }
        };
        let outcome = self.send(check, now, Some(hash), take).await;
        // Only now, with its answer in the negative cache, may the checks waiting on it
        // look again.
        drop(leading);
        outcome
    }

    /// Decides a check of a leased rule that this instance's lease of its key (filed under
    /// `hash`) could not answer: one take of a key at a time, and checks that come
    /// meanwhile spend from it.
    async fn take_lease(&self, check: &Check<'_>, hash: u64) -> Result<Outcome, StoreError> {
        match self.lease_takes.join(hash) {
            Joined::Lead(leading) => {
                let outcome = self.decide_leasing(check, Leasing::Take).await;
                drop(leading);
                outcome
            }
            Joined::Wait(taken) => {
                taken.await;
                match self.spend_lease(check, hash, self.clock.now_micros()) {
                    Some(spent) => Ok(spent),
                    None => self.decide_leasing(check, Leasing::Take).await,
                }
            }
        }
    }

    /// A check of a leased rule answered from this instance's lease of its key (filed
    /// under `hash`), counted, if it holds enough units that may still be spent.
    fn spend_lease(&self, check: &Check<'_>, hash: u64, now: u64) -> Option<Outcome> {
        let decision = self.leases.spend(&check.limits[0], hash, check.cost, now)?;
        self.stats.lease_decisions.fetch_add(1, Ordering::Relaxed);
        let mut outcome = Outcome::single(decision);
        outcome.decided_by = DecidedBy::Lease;
        Some(outcome)
    }

    /// The negative cache's refusal of `check` (its limits hashed to `hash`), counted.
    fn cached_refusal(
        &self,
        negative: &NegativeCache,
        check: &Check<'_>,
        hash: u64,
        now: u64,
    ) -> Option<Outcome> {
        let mut outcome = negative.lookup(check, hash, now)?;
        self.stats
            .negative_cache_hits
            .fetch_add(1, Ordering::Relaxed);
        outcome.decided_by = DecidedBy::NegativeCache;
        Some(outcome)
    }

    /// Asks the store (through the local pre-check and the breaker), sent at `now`, with
    /// `take` a take of the rule's lease; remembers its answer — in the negative cache under
    /// `cached`, the hash of its limits, when the cache applies to it — or falls back on a
    /// failure.
    async fn send(
        &self,
        check: &Check<'_>,
        now: u64,
        cached: Option<u64>,
        take: bool,
    ) -> Result<Outcome, StoreError> {
        if let Some(mut refused) = self.precheck.as_ref().and_then(|p| p.refusal(check)) {
            self.stats
                .local_precheck_refusals
                .fetch_add(1, Ordering::Relaxed);
            refused.decided_by = DecidedBy::LocalPrecheck;
            return Ok(refused);
        }
        let nodes = self.store.nodes(check);
        let error = match self.permits(&nodes, now) {
            Err(refused) => {
                self.store.node_refused(refused);
                let breaker = self.breaker(refused);
                StoreError::breaker_open(format!(
                    "store node {} failed too often; next try in {:?}",
                    breaker.node(),
                    breaker.wait(now)
                ))
            }
            Ok(tickets) => {
                let generation = self.store.lost_state_generation(check);
                // A generation of 0 has never lost anything: no seed to look up.
                if generation > 0 && self.config.on_store_reset == OnStoreReset::Conservative {
                    let keys = self.local.owe_lost(check, generation, now);
                    self.stats
                        .store_reset_keys
                        .fetch_add(keys, Ordering::Relaxed);
                }
                let freeing = self
                    .negative
                    .as_ref()
                    .filter(|_| check.charge.may_free_units())
                    .map(|negative| negative.freeing(check.limits));
                // Boxed, the write-back's future (a store check of its own) is allocated
                // only by the checks that have one to wait for, and does not grow every
                // check's future.
                let written_back = if self.local.owes_nothing() {
                    Ok(())
                } else {
                    Box::pin(self.local.write_back(
                        &self.store,
                        check,
                        generation,
                        now,
                        &self.stats,
                    ))
                    .await
                };
                // Only whether to take is known here, and `take` finds the lease in the
                // rule: the lease carried across the store's call would grow the future of
                // every check, leased or not.
                let answer = match written_back {
                    Ok(()) if !take => self.store.check(check).await,
                    // Boxed, as the write-back: a take holds two store checks.
                    Ok(()) => Box::pin(self.take(check, now)).await,
                    Err(e) => Err(e),
                };
                drop(freeing);
                match answer {
                    Ok(outcome) => {
                        tickets.finish(true, self.clock.now_micros());
                        self.stats.store_decisions.fetch_add(1, Ordering::Relaxed);
                        // A full store's answer says nothing about the key's usage: neither
                        // a refusal to cache nor a count to start a fallback from.
                        if matches!(outcome.decided_by, DecidedBy::Full(_)) {
                            return Ok(outcome);
                        }
                        if let (Some(negative), Some(hash)) = (&self.negative, cached) {
                            negative.remember(check, hash, now, outcome.decision, outcome.limits());
                            negative.remember_admission(check, hash, now, outcome.decision);
                        }
                        // A loss found while the check was on its way (the store verifies
                        // a server on a new connection before sending to it) makes this
                        // answer one from the state that is left: what the instance last
                        // knew stays, to be owed again at the key's next check.
                        if self.store.lost_state_generation(check) == generation {
                            self.local.remember(
                                check,
                                self.seeded(check),
                                now,
                                generation,
                                outcome.limits(),
                            );
                        }
                        return Ok(outcome);
                    }
                    // A malformed check, or a request id reused for another request, is the
                    // caller's fault, not the store's: drop the ticket unreported, and never
                    // let a failure policy answer it.
                    Err(e @ (StoreError::InvalidCheck(_) | StoreError::RequestIdConflict(_))) => {
                        return Err(e);
                    }
                    Err(e) => {
                        tickets.finish(reached(&e), self.clock.now_micros());
                        e
                    }
                }
            }
        };
        self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
        self.fall_back(check, &nodes, error)
    }

    /// The store's answer to `check` of a rule with a lease, sent at `now`: a take of its k
    /// units whose admission answers the check and leaves the rest to spend here; when the
    /// take is refused (fewer than k left) or not the store's (a full store decided it),
    /// the check alone, so that the answer is what it would be without the lease.
    async fn take(&self, check: &Check<'_>, now: u64) -> Result<Outcome, StoreError> {
        // Only a check its rule's lease applies to is sent to take (decide_leasing); a rule
        // without a lease has nothing to take.
        let Some(lease) = check.limits[0].rule.lease() else {
            return self.store.check(check).await;
        };
        let take = Check {
            cost: lease.units(),
            // A take refused records nothing, even where refusals are charged: the check
            // alone that follows records what its mode does.
            charge: Charge::Check,
            ..*check
        };
        let mut taken = self.store.check(&take).await?;
        if taken.decided_by != DecidedBy::Store {
            return self.store.check(check).await;
        }
        if !taken.decision.allowed {
            // A fixed window's refusal says the same whatever the cost: when the check
            // would not fit either, the take's refusal is its answer.
            let refused_alike = check.limits[0].rule.algorithm() == Algorithm::FixedWindow
                && check.charge == Charge::Check
                && taken.decision.remaining < check.cost;
            if refused_alike {
                return Ok(taken);
            }
            return self.store.check(check).await;
        }
        self.stats.lease_takes.fetch_add(1, Ordering::Relaxed);
        let limit = &check.limits[0];
        let held = self.leases.keep(
            limit,
            lease,
            lease.units() - check.cost,
            now,
            self.clock.now_micros(),
            &taken.decision,
        );
        // As the store would have answered at the take, had the units held been left in it.
        taken.decision.remaining = taken
            .decision
            .remaining
            .saturating_add(held)
            .min(limit.rule.capacity());
        Ok(taken)
    }

    /// The breaker of `node`.
    fn breaker(&self, node: NodeId) -> &breaker::Breaker {
        self.breakers.of(node, || self.store.node_name(node))
    }

    /// A ticket of each of `nodes`' breakers, or the first node whose breaker refuses (the
    /// tickets already given are dropped unreported).
    fn permits(&self, nodes: &Nodes, now: u64) -> Result<Tickets<'_>, NodeId> {
        let mut each = nodes.iter();
        let first = each.next().unwrap_or(NodeId::FIRST);
        let Permit::Call(ticket) = self.breaker(first).permit(now) else {
            return Err(first);
        };
        let mut others = Vec::new();
        for node in each {
            match self.breaker(node).permit(now) {
                Permit::Call(other) => others.push(other),
                Permit::Refuse => return Err(node),
            }
        }
        Ok(Tickets {
            first: ticket,
            others,
        })
    }

    /// Each limit's failure policy: its rule's own, or the limiter's.
    fn policies<'c>(&self, check: &'c Check<'_>) -> impl Iterator<Item = FailurePolicy> + 'c {
        let default = self.config.on_store_error;
        check
            .limits
            .iter()
            .map(move |l| l.rule.failure_policy().unwrap_or(default))
    }

    /// Whether each limit of `check` keeps a seed: `local` rules start their fallback
    /// from it, and every rule writes it back after a loss under
    /// [`OnStoreReset::Conservative`] on a store that may lose state
    /// ([`Store::may_lose_state`]).
    fn seeded<'c>(&self, check: &'c Check<'_>) -> impl Iterator<Item = bool> + 'c {
        let every =
            self.config.on_store_reset == OnStoreReset::Conservative && self.store.may_lose_state();
        self.policies(check)
            .map(move |p| every || p == FailurePolicy::Local)
    }

    /// Decides `check` by the policies of its rules, the store having failed with `error`.
    /// The strictest policy among the rules settles it: any `error` rule surfaces the
    /// error; any `deny` rule refuses; otherwise `local` rules decide in memory, and
    /// `allow` rules allow.
    ///
    /// A report, a settle or a refund fails whatever the policies: an answer made up
    /// without the store would lose its units, and retried with its id it counts once.
    ///
    /// A `deny` refusal says to come back when the first of `nodes` (the check's) to probe
    /// again does.
    fn fall_back(
        &self,
        check: &Check<'_>,
        nodes: &Nodes,
        error: StoreError,
    ) -> Result<Outcome, StoreError> {
        if !check.charge.may_refuse() {
            return Err(error);
        }
        let policies: Vec<FailurePolicy> = self.policies(check).collect();
        let strictest = policies
            .iter()
            .copied()
            .max_by_key(|p| p.strictness())
            .unwrap_or_default();
        let now = self.clock.now_micros();
        let decisions: Vec<Decision> = match strictest {
            FailurePolicy::Error => return Err(error),
            FailurePolicy::Deny => {
                let wait = nodes
                    .iter()
                    .map(|node| self.breaker(node).wait(now))
                    .max()
                    .unwrap_or_default();
                let wait = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX).max(1);
                check
                    .limits
                    .iter()
                    .zip(&policies)
                    .map(|(l, p)| Decision {
                        allowed: *p != FailurePolicy::Deny,
                        limit: l.rule.capacity(),
                        remaining: 0,
                        retry_after: RetryAfter::micros(if *p == FailurePolicy::Deny {
                            wait
                        } else {
                            0
                        }),
                        reset_after: 0,
                        delay: 0,
                    })
                    .collect()
            }
            FailurePolicy::Local | FailurePolicy::Allow => {
                self.local.decide(check, &policies, now, &self.stats)?
            }
        };
        self.stats
            .fallback_decisions
            .fetch_add(1, Ordering::Relaxed);
        let mut outcome = Outcome::from_limits(decisions);
        outcome.decided_by = DecidedBy::Fallback(strictest);
        Ok(outcome)
    }
}

/// The breakers' tickets of one check: one per node it goes to. Its result goes to every
/// one of them: a check of several nodes that failed counts against each.
struct Tickets<'a> {
    first: Ticket<'a>,
    others: Vec<Ticket<'a>>,
}

impl Tickets<'_> {
    fn finish(self, reachable: bool, now: u64) {
        self.first.finish(reachable, now);
        for ticket in self.others {
            ticket.finish(reachable, now);
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod in_flight_tests;

#[cfg(test)]
mod nodes_tests;

#[cfg(test)]
mod precheck_tests;

#[cfg(test)]
mod usage_tests;
