//! Prometheus metrics, written in the text exposition format (0.0.4) at `GET /metrics`.
//!
//! A registry of its own per service rather than a process-global recorder: every server
//! (and every test's server) counts only its own traffic. Nothing on the decision path
//! takes a lock: a rule's counters are looked up once per configuration load
//! ([`RuleMetrics`], kept beside the configuration) and shared as atomics; only
//! `detailed_metric` rules, whose label is the request's value, go through the family's
//! map. The limiter's own counters are read when the metrics are.

mod connections;
mod detailed;
mod envoy;
mod mapping;
mod statsd;
mod xds;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sluicegate::{
    AnyStore, BreakerState, Charge, DecidedBy, Decision, FailurePolicy, Limit, Limiter, OnFull,
    Outcome,
};

pub(crate) use self::connections::{ConnectionMetrics, ConnectionTimeout, OpenConnection, Refused};
pub(crate) use self::detailed::DEFAULT_MAX_DETAILED_SERIES;
use self::detailed::{DetailedSeries, Slot};
pub(crate) use self::envoy::CallError;
use self::envoy::{EnvoyCounters, EnvoyMetrics, ServiceCounts};
pub use self::mapping::PrometheusMapping;
pub(crate) use self::statsd::StatsdSink;
pub use self::statsd::{StatsdOptions, StatsdTags};
pub(crate) use self::xds::XdsMetrics;
use crate::config::Config;

/// The memory budget's part the `detailed_metric` series are counted in.
pub(crate) const METRIC_SERIES_PART: &str = "metric_series";

/// The content type of [`Metrics::render`]'s text.
pub(crate) const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Upper bounds (seconds) of the check latency histogram's buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// A hit is near the limit past this share of it (envoyproxy/ratelimit's
/// NEAR_LIMIT_RATIO default), unless `--near-limit-ratio` says otherwise.
pub(crate) const DEFAULT_NEAR_LIMIT_RATIO: f32 = 0.8;

/// Everyone who can decide a check, in the order the metrics list them.
const DECIDERS: [DecidedBy; 10] = [
    DecidedBy::Store,
    DecidedBy::NegativeCache,
    DecidedBy::LocalPrecheck,
    DecidedBy::Fallback(FailurePolicy::Allow),
    DecidedBy::Fallback(FailurePolicy::Deny),
    DecidedBy::Fallback(FailurePolicy::Local),
    DecidedBy::Full(OnFull::Refuse),
    DecidedBy::Full(OnFull::Allow),
    DecidedBy::Full(OnFull::EvictIdle),
    DecidedBy::Lease,
];

/// Where `decided_by` stands in [`DECIDERS`]; `None` for the `error` policy, which never
/// decides (and for deciders a later library version may add).
const fn decider_index(decided_by: DecidedBy) -> Option<usize> {
    match decided_by {
        DecidedBy::Store => Some(0),
        DecidedBy::NegativeCache => Some(1),
        DecidedBy::LocalPrecheck => Some(2),
        DecidedBy::Fallback(FailurePolicy::Allow) => Some(3),
        DecidedBy::Fallback(FailurePolicy::Deny) => Some(4),
        DecidedBy::Fallback(FailurePolicy::Local) => Some(5),
        DecidedBy::Full(OnFull::Refuse) => Some(6),
        DecidedBy::Full(OnFull::Allow) => Some(7),
        DecidedBy::Full(OnFull::EvictIdle) => Some(8),
        DecidedBy::Lease => Some(9),
        _ => None,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: String,
    result: &'static str,
}

/// The results [`RuleLabels`] count, as [`RuleMetrics`] holds them.
const RESULTS: [&str; 5] = [
    "total",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    rule: String,
}

/// A domain and a mode that is never refused (`report`, `settle`, `refund`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UsageLabels {
    domain: String,
    mode: &'static str,
}

/// A rule of the configuration, by its name (the configuration's path to it): as many as
/// the configuration has.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConflictLabels {
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BreakerLabels {
    to: &'static str,
}

/// One node of the store and a state of its circuit breaker.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeStateLabels {
    node: String,
    state: &'static str,
}

/// One node of the store and a state its circuit breaker entered.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeTransitionLabels {
    node: String,
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LossLabels {
    node: String,
    reason: &'static str,
}

/// A Redis server: the store's URL without credentials, or a cluster master's address.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

/// A rule and the policy that decided its new key without room.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FullLabels {
    rule: String,
    policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartLabels {
    part: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecidedByLabels {
    decided_by: &'static str,
}

/// One rule's hit counters, by result: sluicegate's (a decision each) and envoy's (a hit
/// each, [`EnvoyCounters`]).
#[derive(Clone, Debug)]
pub(crate) struct RuleMetrics {
    envoy: Arc<EnvoyCounters>,
    near_limit_ratio: f32,
    total: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    /// Over the limit, but in shadow mode: let through.
    shadow_mode: Counter,
}

/// A rule's counters read at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct RuleTotals {
    pub(crate) total: u64,
    pub(crate) over_limit: u64,
    pub(crate) near_limit: u64,
    pub(crate) within_limit: u64,
    pub(crate) shadow_mode: u64,
}

impl RuleMetrics {
    /// The counters as they stand.
    pub(crate) fn totals(&self) -> RuleTotals {
        RuleTotals {
            total: self.total.get(),
            over_limit: self.over_limit.get(),
            near_limit: self.near_limit.get(),
            within_limit: self.within_limit.get(),
            shadow_mode: self.shadow_mode.get(),
        }
    }

    /// Counts one decision of the rule, of `hits` hits.
    pub(crate) fn count(&self, decision: &Decision, hits: u64, shadow: bool) {
        self.envoy
            .count(decision, hits, shadow, self.near_limit_ratio);
        self.total.inc();
        if !decision.allowed && shadow {
            self.shadow_mode.inc();
        } else if !decision.allowed {
            self.over_limit.inc();
        } else if decision.remaining as f64
            <= decision.limit as f64 * (1.0 - f64::from(self.near_limit_ratio))
        {
            self.near_limit.inc();
        } else {
            self.within_limit.inc();
        }
    }
}

/// What becomes of envoyproxy/ratelimit's statistics in `/metrics`.
#[derive(Clone, Debug)]
pub struct EnvoyStatsOptions {
    /// The names they are written under (`--prometheus-mapper`).
    pub mapping: Arc<PrometheusMapping>,
    /// Not written at all (`--disable-stats`).
    pub disabled: bool,
    /// The most `detailed_metric` series one rule holds (`--max-detailed-series`).
    pub max_detailed_series: usize,
}

impl Default for EnvoyStatsOptions {
    fn default() -> Self {
        EnvoyStatsOptions {
            mapping: PrometheusMapping::envoy_default(false),
            disabled: false,
            max_detailed_series: DEFAULT_MAX_DETAILED_SERIES,
        }
    }
}

/// Everything the service counts.
pub(crate) struct Metrics {
    registry: Registry,
    rule_hits: Family<RuleLabels, Counter>,
    usage_units: Family<UsageLabels, Counter>,
    request_id_conflicts: Family<ConflictLabels, Counter>,
    /// One counter per entry of [`DECIDERS`].
    decided_by: Vec<Counter>,
    full_decisions: Family<FullLabels, Counter>,
    evictions: Family<EvictionLabels, Counter>,
    check_duration: Histogram,
    config_loads: Counter,
    config_errors: Counter,
    connections: ConnectionMetrics,
    xds: XdsMetrics,
    envoy: EnvoyMetrics,
    envoy_stats: EnvoyStatsOptions,
    near_limit_ratio: f32,
    /// The counters of `detailed_metric` rules' values, bounded per rule: a decision
    /// finds them with one read lock instead of building every label again.
    detailed: DetailedSeries,
    /// Decisions of a `detailed_metric` rule counted in the rule's own series, their value
    /// being past the cap or too long for one of its own.
    detailed_overflow: Family<PathLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(
            DEFAULT_NEAR_LIMIT_RATIO,
            EnvoyStatsOptions::default(),
            sluicegate::MemoryBudget::unlimited().part(METRIC_SERIES_PART),
        )
    }
}

impl Metrics {
    /// The service's metrics, a hit near its limit past `near_limit_ratio` of it, envoy's
    /// statistics written as `envoy_stats` says, `detailed_metric` series counted in
    /// `memory`.
    pub(crate) fn new(
        near_limit_ratio: f32,
        envoy_stats: EnvoyStatsOptions,
        memory: sluicegate::BudgetPart,
    ) -> Self {
        let mut registry = Registry::default();
        let rule_hits = Family::<RuleLabels, Counter>::default();
        registry.register(
            "sluicegate_rule_hits",
            "Decisions per rule, by result",
            rule_hits.clone(),
        );
        let usage_units = Family::<UsageLabels, Counter>::default();
        registry.register(
            "sluicegate_usage_units",
            "Units carried by report, settle and refund calls, per domain and mode (a \
             retry's again; a settle's are the request's real cost)",
            usage_units.clone(),
        );
        let request_id_conflicts = Family::<ConflictLabels, Counter>::default();
        registry.register(
            "sluicegate_request_id_conflicts",
            "Requests refused because their request id was used before for another request \
             (another mode or cost), per rule that remembered it",
            request_id_conflicts.clone(),
        );
        let decisions = Family::<DecidedByLabels, Counter>::default();
        registry.register(
            "sluicegate_decisions",
            "Checks, by who decided them",
            decisions.clone(),
        );
        let decided_by = DECIDERS
            .iter()
            .map(|by| {
                decisions.get_or_create_owned(&DecidedByLabels {
                    decided_by: by.name(),
                })
            })
            .collect();
        let full_decisions = Family::<FullLabels, Counter>::default();
        registry.register(
            "sluicegate_full_decisions",
            "Checks of a rule whose new key found no room (memory budget, key cap or the \
             rule's share), by the --on-full policy that decided them",
            full_decisions.clone(),
        );
        let evictions = Family::<EvictionLabels, Counter>::default();
        registry.register(
            "sluicegate_evictions",
            "Idle keys evicted to make room for new keys of a rule (--on-full evict-idle)",
            evictions.clone(),
        );
        let check_duration = Histogram::new(LATENCY_BUCKETS);
        registry.register(
            "sluicegate_check_duration_seconds",
            "Time to decide a check (store call included)",
            check_duration.clone(),
        );
        let config_loads = Counter::default();
        registry.register(
            "sluicegate_config_loads",
            "Configurations loaded",
            config_loads.clone(),
        );
        let config_errors = Counter::default();
        registry.register(
            "sluicegate_config_errors",
            "Configurations rejected",
            config_errors.clone(),
        );
        let detailed_overflow = Family::<PathLabels, Counter>::default();
        registry.register(
            "sluicegate_detailed_metric_overflow",
            "Decisions of a detailed_metric rule counted in the rule's own series: their \
             value had no series of its own (the rule held --max-detailed-series, or the \
             value's key was too long)",
            detailed_overflow.clone(),
        );
        let connections = ConnectionMetrics::register(&mut registry);
        let xds = XdsMetrics::register(&mut registry);
        let detailed = DetailedSeries::new(envoy_stats.max_detailed_series, memory);
        Metrics {
            registry,
            rule_hits,
            usage_units,
            request_id_conflicts,
            decided_by,
            full_decisions,
            evictions,
            check_duration,
            config_loads,
            config_errors,
            connections,
            xds,
            envoy: EnvoyMetrics::new(envoy_stats.mapping.response_time_thresholds()),
            envoy_stats,
            near_limit_ratio,
            detailed,
            detailed_overflow,
        }
    }

    /// Counts the `units` of one descriptor's report, settle or refund in `domain`. They
    /// are no hits: a hit is a unit a check asks for, which may be refused.
    pub(crate) fn usage(&self, domain: &str, mode: Charge, units: u64) {
        self.usage_units
            .get_or_create(&UsageLabels {
                domain: domain.to_owned(),
                mode: mode.name(),
            })
            .inc_by(units);
    }

    /// Counts a request refused because its id was used before for another request, by the
    /// rule whose state remembered it; the rule's count so far, this one included.
    pub(crate) fn request_id_conflict(&self, rule: &str) -> u64 {
        self.request_id_conflicts
            .get_or_create(&ConflictLabels {
                rule: rule.to_owned(),
            })
            .inc()
            + 1
    }

    /// The counters a decision of the `detailed_metric` rule at `path`, whose window is
    /// `window_us`, counts in at `now_us` for the value of stat key `key`: the value's
    /// own (what [`Metrics::rule_metrics`] makes of `key`), made on first use while the
    /// rule holds fewer than its cap, or else the rule's own, the overflow counted.
    pub(crate) fn detailed_rule_metrics(
        &self,
        path: &str,
        key: &str,
        window_us: u64,
        now_us: u64,
    ) -> RuleMetrics {
        match self
            .detailed
            .slot(path, key, window_us, now_us, |k| self.rule_metrics(k))
        {
            Slot::Own(metrics) => metrics,
            Slot::Overflow(metrics) => {
                self.detailed_overflow
                    .get_or_create(&PathLabels {
                        rule: path.to_owned(),
                    })
                    .inc();
                metrics
            }
        }
    }

    /// Drops the `detailed_metric` series idle at `now_us` (not counted in for their
    /// rule's window, nor for five minutes), from `/metrics` and statsd alike; a stat
    /// key that is also a configured rule's path (`configured`) keeps that rule's series.
    pub(crate) fn expire_detailed(&self, now_us: u64, configured: impl Fn(&str) -> bool) {
        self.detailed.expire(now_us, |key| {
            self.envoy.forget(key);
            if !configured(key) {
                for result in RESULTS {
                    self.rule_hits.remove(&RuleLabels {
                        rule: key.to_owned(),
                        result,
                    });
                }
            }
        });
    }

    /// The counters of the rule at `path` (or, for a `detailed_metric` rule, of one of
    /// its values): created on first use, shared afterwards.
    pub(crate) fn rule_metrics(&self, path: &str) -> RuleMetrics {
        let counter = |result| {
            self.rule_hits.get_or_create_owned(&RuleLabels {
                rule: path.to_owned(),
                result,
            })
        };
        let [total, over_limit, near_limit, within_limit, shadow_mode] = RESULTS.map(counter);
        RuleMetrics {
            envoy: self.envoy.counters(path),
            near_limit_ratio: self.near_limit_ratio,
            total,
            over_limit,
            near_limit,
            within_limit,
            shadow_mode,
        }
    }

    /// The counters of every limit of `config`, looked up once so that decisions need no
    /// lookup in the family's map.
    pub(crate) fn rules_of(&self, config: &Config) -> HashMap<String, RuleMetrics> {
        config
            .limits()
            .into_iter()
            .map(|l| (l.path.clone(), self.rule_metrics(&l.path)))
            .collect()
    }

    /// Counts one rule's decision (the slow path, through the family's map).
    #[cfg(test)]
    fn rule(&self, path: &str, decision: &Decision, shadow: bool) {
        self.rule_metrics(path).count(decision, 1, shadow);
    }

    /// Configurations loaded, and configurations rejected, so far.
    pub(crate) fn config_counts(&self) -> (u64, u64) {
        (self.config_loads.get(), self.config_errors.get())
    }

    /// Counts who decided a check of `limits`, how long the limiter took, and, when the
    /// store was full, the policy that decided and the keys it evicted, under each rule of
    /// the check.
    pub(crate) fn check(&self, limits: &[Limit<'_>], outcome: &Outcome, took: Duration) {
        if let Some(i) = decider_index(outcome.decided_by) {
            self.decided_by[i].inc();
        }
        if let DecidedBy::Full(policy) = outcome.decided_by {
            for limit in limits {
                self.full_decisions
                    .get_or_create(&FullLabels {
                        rule: limit.rule.name().to_owned(),
                        policy: policy.name(),
                    })
                    .inc();
            }
        }
        if outcome.evictions > 0 {
            for limit in limits {
                self.evictions
                    .get_or_create(&EvictionLabels {
                        rule: limit.rule.name().to_owned(),
                    })
                    .inc_by(outcome.evictions);
            }
        }
        self.check_duration.observe(took.as_secs_f64());
    }

    /// What the listeners count.
    pub(crate) fn connections(&self) -> &ConnectionMetrics {
        &self.connections
    }

    /// What the xDS configuration source counts.
    pub(crate) fn xds(&self) -> &XdsMetrics {
        &self.xds
    }

    /// Counts a `ShouldRateLimit` call over gRPC.
    pub(crate) fn grpc_call(&self) {
        self.envoy.grpc_call();
    }

    /// Counts a `ShouldRateLimit` call answered after `took`, failed with `error` if it
    /// failed.
    pub(crate) fn grpc_answered(&self, took: Duration, error: Option<CallError>) {
        self.envoy.grpc_answered(took, error);
    }

    /// A sink sending envoy's statistics to `options`' statsd server from now on, each time
    /// it is flushed.
    pub(crate) fn statsd_sink(&self, options: &StatsdOptions) -> anyhow::Result<StatsdSink> {
        StatsdSink::new(options, &self.envoy)
    }

    /// Sends what changed since the last flush to `sink`.
    pub(crate) fn flush_statsd(&self, sink: &mut StatsdSink) {
        sink.flush(&self.envoy.counter_stats(&self.service_counts()));
    }

    fn service_counts(&self) -> ServiceCounts {
        ServiceCounts {
            config_loads: self.config_loads.get(),
            config_errors: self.config_errors.get(),
        }
    }

    /// Counts a configuration put in force.
    pub(crate) fn config_loaded(&self) {
        self.config_loads.inc();
    }

    /// Counts a configuration that did not load.
    pub(crate) fn config_rejected(&self) {
        self.config_errors.inc();
    }

    /// The text exposition, with the limiter's own counters read now.
    pub(crate) fn render(&self, limiter: &Limiter<AnyStore>) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        let _ = prometheus_text::encode(&mut out, &limiter_registry(limiter));
        if !self.envoy_stats.disabled {
            let counters = self.envoy.counter_stats(&self.service_counts());
            let times = self.envoy.response_times();
            self.envoy_stats.mapping.render(&counters, times, &mut out);
        }
        out
    }
}

/// The limiter's counters as they are now, as a registry of constants.
fn limiter_registry(limiter: &Limiter<AnyStore>) -> Registry {
    let mut registry = Registry::default();
    let stats = limiter.stats();
    let mut counter = |name: &str, help: &str, value: u64| {
        registry.register(name, help, ConstCounter::new(value));
    };
    counter(
        "sluicegate_store_errors",
        "Checks the store failed (errors, timeouts, open breaker)",
        stats.store_errors,
    );
    counter(
        "sluicegate_negative_cache_hits",
        "Refusals answered by the negative cache",
        stats.negative_cache_hits,
    );
    counter(
        "sluicegate_fallback_decisions",
        "Checks decided by a store-failure policy",
        stats.fallback_decisions,
    );
    if let AnyStore::Redis(redis) = limiter.store() {
        let sent = redis.script_calls();
        counter(
            "sluicegate_redis_script_calls",
            "Check-script calls sent to Redis",
            sent.calls,
        );
        counter(
            "sluicegate_redis_script_checks",
            "Checks those calls carried: under load several share a call",
            sent.checks,
        );
        counter(
            "sluicegate_redis_not_replicated",
            "Checks that admitted and failed because no replica acknowledged their write in \
             time (--store-durability replicated)",
            sent.not_replicated,
        );
        let evicting = Family::<PolicyLabels, Gauge>::default();
        for node in redis.eviction().nodes {
            let policy = node.policy.clone().unwrap_or_else(|_| "unknown".to_owned());
            evicting
                .get_or_create(&PolicyLabels { policy })
                .set(i64::from(node.at_risk()));
        }
        let replicas = Family::<NodeLabels, Gauge>::default();
        let min_replicas_to_write = Family::<NodeLabels, Gauge>::default();
        for node in redis.replication().nodes {
            let labels = NodeLabels { node: node.node };
            if let Ok(connected) = node.replicas {
                replicas
                    .get_or_create(&labels)
                    .set(i64::try_from(connected).unwrap_or(i64::MAX));
            }
            if let Ok(guard) = node.min_replicas {
                min_replicas_to_write
                    .get_or_create(&labels)
                    .set(i64::try_from(guard.to_write).unwrap_or(i64::MAX));
            }
        }
        registry.register(
            "sluicegate_redis_replicas",
            "Replicas connected to each Redis server (cluster master), as last read",
            replicas,
        );
        registry.register(
            "sluicegate_redis_min_replicas_to_write",
            "Each Redis server's min-replicas-to-write: 0 lets a master cut off from its \
             replicas accept admissions that a failover loses",
            min_replicas_to_write,
        );
        registry.register(
            "sluicegate_redis_evicting",
            "Redis servers by maxmemory-policy: 1 where it may evict keys and reset limits \
             (any policy but noeviction, or unknown: it could not be read)",
            evicting,
        );
        let lost = Family::<LossLabels, Counter>::default();
        for loss in redis.lost_state().losses {
            lost.get_or_create(&LossLabels {
                node: loss.node,
                reason: loss.reason.label(),
            })
            .inc_by(loss.count);
        }
        registry.register(
            "sluicegate_store_state_lost",
            "Times a Redis node was found to have lost state sluicegate wrote, by node and \
             reason (restarted, flushed, failed_over): the limits of its keys \
             started over",
            lost,
        );
    }
    let memory = limiter.memory();
    let parts = Family::<PartLabels, Gauge>::default();
    for (part, bytes) in memory.parts() {
        parts
            .get_or_create(&PartLabels { part })
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    registry.register(
        "sluicegate_memory_bytes",
        "Bytes counted against the memory budget, by the part that holds them",
        parts,
    );
    registry.register(
        "sluicegate_memory_budget_bytes",
        "The memory budget (--max-memory)",
        ConstGauge::new(i64::try_from(memory.limit()).unwrap_or(i64::MAX)),
    );
    let breaker: i64 = match limiter.breaker_state() {
        BreakerState::Closed => 0,
        BreakerState::Open => 1,
        BreakerState::HalfOpen => 2,
    };
    registry.register(
        "sluicegate_breaker_state",
        "The store's circuit breakers, one per node: 0 every node's closed, 1 some node's \
         open (its keys fall back), 2 some node's half-open and none open",
        ConstGauge::new(breaker),
    );
    let transitions = Family::<BreakerLabels, Counter>::default();
    for (to, changes) in limiter.breaker_transitions().all() {
        transitions
            .get_or_create(&BreakerLabels { to: to.name() })
            .inc_by(changes);
    }
    registry.register(
        "sluicegate_breaker_transitions",
        "Circuit breaker state changes, summed over the store's nodes, by the state entered",
        transitions,
    );
    let node_states = Family::<NodeStateLabels, Gauge>::default();
    let node_transitions = Family::<NodeTransitionLabels, Counter>::default();
    for node in limiter.node_breakers() {
        for state in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            node_states
                .get_or_create(&NodeStateLabels {
                    node: node.name.to_owned(),
                    state: state.name(),
                })
                .set(i64::from(node.state == state));
        }
        for (to, changes) in node.transitions.all() {
            node_transitions
                .get_or_create(&NodeTransitionLabels {
                    node: node.name.to_owned(),
                    to: to.name(),
                })
                .inc_by(changes);
        }
    }
    registry.register(
        "sluicegate_store_node_state",
        "Each store node's circuit breaker (a server; a master of a cluster): 1 for the \
         state it is in",
        node_states,
    );
    registry.register(
        "sluicegate_store_node_transitions",
        "Each store node's circuit breaker state changes, by the state entered",
        node_transitions,
    );
    register_write_backs(&mut registry, limiter);
    registry
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteBackLabels {
    outcome: &'static str,
}

/// What the limiter owes the store (units the `local` fallback admitted, counts a store
/// lost) and what became of its write-backs.
fn register_write_backs(registry: &mut Registry, limiter: &Limiter<AnyStore>) {
    let stats = limiter.stats();
    let write_backs = Family::<WriteBackLabels, Counter>::default();
    for (outcome, count) in [
        ("written", stats.write_backs_written),
        ("failed", stats.write_backs_failed),
        ("expired", stats.write_backs_expired),
        ("dropped", stats.write_backs_dropped),
    ] {
        write_backs
            .get_or_create(&WriteBackLabels { outcome })
            .inc_by(count);
    }
    registry.register(
        "sluicegate_fallback_write_backs",
        "Write-backs to the store of units owed per key: written, failed (still owed), \
         expired (their window over first), dropped (refused by the store)",
        write_backs,
    );
    let (keys, units) = limiter.owed();
    registry.register(
        "sluicegate_fallback_owed_keys",
        "Keys owing the store units not yet written back",
        ConstGauge::new(i64::try_from(keys).unwrap_or(i64::MAX)),
    );
    registry.register(
        "sluicegate_fallback_owed_units",
        "Units owed to the store, not yet written back",
        ConstGauge::new(i64::try_from(units).unwrap_or(i64::MAX)),
    );
    registry.register(
        "sluicegate_fallback_unowed_units",
        "Units the local fallback admitted with no room left to owe them: never written back",
        ConstCounter::new(stats.unowed_units),
    );
    registry.register(
        "sluicegate_store_reset_keys",
        "Keys found in a store that lost their state, whose last count was owed to it again \
         (--on-store-reset conservative)",
        ConstCounter::new(stats.store_reset_keys),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluicegate::RetryAfter;

    fn decision(allowed: bool, remaining: u64) -> Decision {
        Decision::new(
            allowed,
            10,
            remaining,
            RetryAfter::After(Duration::ZERO),
            Duration::ZERO,
            Duration::ZERO,
        )
    }

    #[test]
    fn every_decider_counts_in_its_own_place() {
        for (i, by) in DECIDERS.iter().enumerate() {
            assert_eq!(decider_index(*by), Some(i), "{}", by.name());
        }
    }

    #[test]
    fn renders_counters_histogram_and_escapes_labels() {
        let metrics = Metrics::default();
        metrics.rule("d.user", &decision(true, 9), false);
        metrics.rule("d.user", &decision(true, 1), false);
        metrics.rule("d.user", &decision(false, 0), false);
        metrics.rule("d.user", &decision(false, 0), true);
        metrics.rule("d.\"odd\"", &decision(true, 5), false);
        metrics.check(
            &[],
            &Outcome::single(decision(true, 1)),
            Duration::from_micros(300),
        );
        let limiter = Limiter::new(AnyStore::Memory(Default::default()));
        let text = metrics.render(&limiter);
        for line in [
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"total\"} 4",
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"shadow_mode\"} 1",
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"over_limit\"} 1",
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"near_limit\"} 1",
            "sluicegate_rule_hits_total{rule=\"d.user\",result=\"within_limit\"} 1",
            "sluicegate_rule_hits_total{rule=\"d.\\\"odd\\\"\",result=\"total\"} 1",
            "sluicegate_decisions_total{decided_by=\"store\"} 1",
            "sluicegate_check_duration_seconds_bucket{le=\"0.00025\"} 0",
            "sluicegate_check_duration_seconds_bucket{le=\"0.0005\"} 1",
            "sluicegate_check_duration_seconds_count 1",
            "sluicegate_breaker_state 0",
            "sluicegate_breaker_transitions_total{to=\"open\"} 0",
            "sluicegate_breaker_transitions_total{to=\"half_open\"} 0",
            "sluicegate_breaker_transitions_total{to=\"closed\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // Script calls are a Redis store's.
        assert!(!text.contains("sluicegate_redis_script"), "{text}");
    }

    /// Each node of the store that had a check shows its breaker's state (1 for the state
    /// it is in, 0 for the others) and its changes.
    #[tokio::test]
    async fn every_store_node_shows_its_breakers_state() {
        let metrics = Metrics::default();
        let limiter = Limiter::new(AnyStore::Memory(Default::default()));
        let rule = sluicegate::Rule::new(
            "r",
            &sluicegate::RuleSpec::new(
                sluicegate::Algorithm::FixedWindow,
                10,
                Duration::from_secs(1),
            ),
        )
        .unwrap();
        limiter.check(&rule, "k", 1).await.unwrap();
        let text = metrics.render(&limiter);
        for line in [
            "sluicegate_store_node_state{node=\"memory\",state=\"closed\"} 1",
            "sluicegate_store_node_state{node=\"memory\",state=\"open\"} 0",
            "sluicegate_store_node_state{node=\"memory\",state=\"half_open\"} 0",
            "sluicegate_store_node_transitions_total{node=\"memory\",to=\"open\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
