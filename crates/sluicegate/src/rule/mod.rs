//! Rules: an algorithm with its parameters, every bound of docs/SPEC.md checked once, when the
//! rule is built, so that no check can later meet arithmetic it cannot do exactly.

mod lease;
mod spec;

pub use lease::Lease;
pub use spec::{Algorithm, LogLayout, RuleError, RuleSpec};

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::duration::format_duration;
use crate::micros::whole_micros;
use crate::policy::FailurePolicy;

/// Every number a Redis script computes must stay below this (Lua numbers are doubles).
pub(crate) const EXACT_LIMIT: u64 = 1 << 53;

/// The largest timestamp (µs since the epoch) a check may carry: the year 2112. Together
/// with [`MAX_SPAN`] it keeps `t + span` below [`EXACT_LIMIT`].
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub const MAX_TIME: u64 = 1 << 52;

/// The largest span of time (µs) a rule may add to a timestamp: about 142 years.
pub(crate) const MAX_SPAN: u64 = (1 << 53) - (1 << 52);

/// The most units a `zset` sliding-log may hold at once.
pub(crate) const MAX_ZSET_LOG_LIMIT: u64 = 999_999_999;

/// The most units a `compact` sliding-log may hold at once: 8 bytes a unit and a 24-byte
/// header within Redis' 512 MiB string, a bound with room to spare, as an entry takes at
/// most 7 bytes.
pub(crate) const MAX_COMPACT_LOG_LIMIT: u64 = (512 * 1024 * 1024 - 24) / 8;

/// The sliding-counter default number of sub-buckets (docs/SPEC.md).
pub(crate) const DEFAULT_BUCKETS: u64 = 10;

/// A validated rule. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    inner: Arc<RuleInner>,
}

#[derive(Debug, PartialEq, Eq)]
struct RuleInner {
    name: Box<str>,
    /// What the name is unique within, when rules of several owners share a store (the
    /// service's domains); part of the identity, not of the name.
    scope: Option<Box<str>>,
    identity: Box<str>,
    /// A hash of `identity`, so stores need not hash the whole string on every check.
    fingerprint: u64,
    /// What the rule's share of a store is counted under (see [`Rule::owner`]).
    owner: u64,
    algorithm: Algorithm,
    limit: u64,
    window: u64,
    buckets: u64,
    capacity: u64,
    emission_interval: u64,
    layout: LogLayout,
    /// A fixed window whose Redis state is envoyproxy/ratelimit's counter (see
    /// [`Rule::with_envoy_counter`]).
    envoy_counter: bool,
    /// What the limiter does with this rule when the store fails (not part of identity:
    /// it changes no state).
    on_store_error: Option<FailurePolicy>,
    /// Units an instance takes at once and spends locally (see [`Rule::with_lease`]).
    lease: Option<Lease>,
}

impl Rule {
    /// Validates `spec` against every bound of docs/SPEC.md. `name` tells rules apart: two rules
    /// with different names never share state, even with the same parameters.
    ///
    /// The window is counted in whole microseconds: a part below one microsecond is
    /// dropped (1.9 µs is 1 µs). A window under 1 µs, or longer than the longest span the
    /// stores count exactly (2^53 - 2^52 µs, about 142 years), is a [`RuleError`] on
    /// `window`.
    pub fn new(name: &str, spec: &RuleSpec) -> Result<Rule, RuleError> {
        let RuleSpec {
            algorithm,
            limit,
            window,
            buckets,
            burst,
            queue,
            layout,
        } = *spec;
        let only_for = |field: &'static str, value: Option<u64>, owner: Algorithm| {
            if value.is_some() && algorithm != owner {
                Err(RuleError::new(
                    field,
                    format!("{field} applies only to {owner}, not to {algorithm}"),
                ))
            } else {
                Ok(())
            }
        };
        only_for("buckets", buckets, Algorithm::SlidingCounter)?;
        only_for("burst", burst, Algorithm::TokenBucket)?;
        only_for("queue", queue, Algorithm::LeakyBucket)?;
        if layout.is_some() && algorithm != Algorithm::SlidingLog {
            return Err(RuleError::new(
                "layout",
                format!("layout applies only to sliding-log, not to {algorithm}"),
            ));
        }
        let layout = layout.unwrap_or_default();
        if algorithm == Algorithm::SlidingLog {
            // One zset member per unit numbers it with at most 9 digits; a compact log is
            // one string of at most 8 bytes per unit, and Redis strings stop at 512 MiB.
            let (most, why) = match layout {
                LogLayout::Zset => (MAX_ZSET_LOG_LIMIT, "a zset sliding-log"),
                LogLayout::Compact => (
                    MAX_COMPACT_LOG_LIMIT,
                    "a compact sliding-log (one Redis string, at most 512 MiB)",
                ),
            };
            if limit > most {
                return Err(RuleError::new(
                    "limit",
                    format!("limit {limit} exceeds {most}, the most entries {why} holds"),
                ));
            }
        }
        if limit == 0 {
            return Err(RuleError::new("limit", "limit must be at least 1"));
        }
        if limit >= EXACT_LIMIT {
            return Err(RuleError::new(
                "limit",
                format!("limit {limit} is not below 2^53"),
            ));
        }
        let Some(window) = whole_micros(window) else {
            return Err(RuleError::new(
                "window",
                format!("window {window:?} exceeds the longest supported span of 2^53 - 2^52 µs"),
            ));
        };
        if window == 0 {
            return Err(RuleError::new("window", "window must be longer than 0"));
        }
        let w = format_duration(window);
        if window > MAX_SPAN {
            return Err(RuleError::new(
                "window",
                format!("window {w} exceeds the longest supported span of 2^53 - 2^52 µs"),
            ));
        }
        let mut bucket_count = 1;
        let mut capacity = limit;
        let mut emission_interval = 0;
        match algorithm {
            Algorithm::SlidingLog | Algorithm::FixedWindow => {}
            Algorithm::SlidingCounter => {
                bucket_count = buckets.unwrap_or(DEFAULT_BUCKETS);
                if bucket_count == 0 {
                    return Err(RuleError::new("buckets", "buckets must be at least 1"));
                }
                if !window.is_multiple_of(bucket_count) {
                    return Err(RuleError::new(
                        "buckets",
                        format!(
                            "window {w} ({window} µs) is not divisible by {bucket_count} buckets"
                        ),
                    ));
                }
                let width = window / bucket_count;
                if limit.checked_mul(width).is_none_or(|p| p >= EXACT_LIMIT) {
                    return Err(RuleError::new(
                        "window",
                        format!(
                            "window {w} with limit {limit} exceeds 2^53 µs·units for \
                             sliding-counter (limit × bucket width must stay below 2^53)"
                        ),
                    ));
                }
                if window + width > MAX_SPAN {
                    return Err(RuleError::new(
                        "window",
                        format!("window {w} plus one bucket exceeds the longest supported span"),
                    ));
                }
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                capacity = match algorithm {
                    Algorithm::TokenBucket => burst.unwrap_or(limit),
                    _ => queue.unwrap_or(0).saturating_add(1),
                };
                if capacity == 0 {
                    return Err(RuleError::new("burst", "burst must be at least 1"));
                }
                emission_interval = window / limit;
                if emission_interval == 0 {
                    return Err(RuleError::new(
                        "limit",
                        format!(
                            "limit {limit} per {w} gives an emission interval below 1 µs \
                             (window / limit must be at least 1 µs)"
                        ),
                    ));
                }
                let field = if algorithm == Algorithm::TokenBucket {
                    "burst"
                } else {
                    "queue"
                };
                // The theoretical arrival time may run up to 2τ ahead of `t` while a
                // check is evaluated (tat ≤ t + τ, plus a cost of at most B·T).
                let fits = emission_interval
                    .checked_mul(capacity)
                    .and_then(|tau| tau.checked_mul(2))
                    .is_some_and(|span| span <= MAX_SPAN);
                if !fits {
                    return Err(RuleError::new(
                        field,
                        format!(
                            "{field} {} at one unit per {} µs exceeds 2^53 µs: 2 × interval × \
                             capacity must stay below 2^53 - 2^52",
                            capacity - u64::from(algorithm == Algorithm::LeakyBucket),
                            emission_interval
                        ),
                    ));
                }
            }
        }
        let mut inner = RuleInner {
            name: name.into(),
            scope: None,
            identity: Box::default(),
            fingerprint: 0,
            owner: 0,
            algorithm,
            limit,
            window,
            buckets: bucket_count,
            capacity,
            emission_interval,
            layout,
            envoy_counter: false,
            on_store_error: None,
            lease: None,
        };
        inner.identify();
        Ok(Rule {
            inner: Arc::new(inner),
        })
    }

    /// This rule within `scope`: the same name and parameters, but state of its own, apart
    /// from the same rule in any other scope or in none. The service scopes each rule by
    /// its place (domain and descriptor path), so that two domains' `per_user` never share a
    /// counter.
    pub fn in_scope(&self, scope: &str) -> Rule {
        self.identified_anew(|inner| inner.scope = Some(scope.into()))
    }

    /// This rule with `change` made to it, identified anew: the state it names is its own.
    fn identified_anew(&self, change: impl FnOnce(&mut RuleInner)) -> Rule {
        let r = &self.inner;
        let mut inner = RuleInner {
            name: r.name.clone(),
            scope: r.scope.clone(),
            identity: Box::default(),
            ..**r
        };
        change(&mut inner);
        inner.identify();
        Rule {
            inner: Arc::new(inner),
        }
    }

    /// The scope given with [`Rule::in_scope`], if any.
    pub fn scope(&self) -> Option<&str> {
        self.inner.scope.as_deref()
    }

    /// The rule's name, as given.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A string that identifies this rule's state: its scope, its name, its algorithm and
    /// the numbers its state cannot be read without (see `identify`). Two rules of one
    /// identity share state even when their other numbers differ: that is how a reload
    /// keeps usage.
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    pub(crate) fn fingerprint(&self) -> u64 {
        self.inner.fingerprint
    }

    /// Who a store's per-rule share counts this rule's entries for: its scope when it has
    /// one (the service gives each configured rule its place, and a limit override the
    /// place of the rule it overrides), else its identity. Not the identity alone: envoy
    /// counters of one window share an identity across every rule, and an override that
    /// matches no rule is named after the request's values, so a flood of them would
    /// otherwise take a fresh share per value.
    pub(crate) fn owner(&self) -> u64 {
        self.inner.owner
    }

    /// Where this rule's shared part lives: the same for every clone of one rule, and no two
    /// rules alive at once share it, so it names a rule in a word an atomic can hold.
    pub(crate) fn address(&self) -> usize {
        Arc::as_ptr(&self.inner).addr()
    }

    /// Whether two rules share state: the same identity, whatever their other numbers.
    pub fn same_identity(&self, other: &Rule) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || self.identity() == other.identity()
    }

    /// Whether two rules decide alike: the same identity and the same numbers. What caches
    /// a decision (the negative cache, the local fallback's rules) compares by this, so a
    /// reload that changes a number is never answered from the old one.
    pub fn same_rule(&self, other: &Rule) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.same_identity(other) && self.spec() == other.spec())
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// L.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// W, the window.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.inner.window)
    }

    /// W in µs.
    pub(crate) fn window_micros(&self) -> u64 {
        self.inner.window
    }

    /// N for sliding-counter; 1 for every other algorithm.
    pub fn buckets(&self) -> u64 {
        self.inner.buckets
    }

    /// The most units a single check can ever take: L, B for token-bucket, Q + 1 for
    /// leaky-bucket. It is also the `limit` a decision reports.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// The GCRA emission interval T = floor(W / L), in whole µs; zero for the window
    /// algorithms.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_micros(self.inner.emission_interval)
    }

    /// T in µs.
    pub(crate) fn emission_interval_micros(&self) -> u64 {
        self.inner.emission_interval
    }

    /// This rule with its own policy for store failures, instead of the limiter's.
    pub fn with_failure_policy(&self, policy: FailurePolicy) -> Rule {
        let r = &self.inner;
        Rule {
            inner: Arc::new(RuleInner {
                name: r.name.clone(),
                scope: r.scope.clone(),
                identity: r.identity.clone(),
                fingerprint: r.fingerprint,
                owner: r.owner,
                on_store_error: Some(policy),
                ..**r
            }),
        }
    }

    /// This fixed window kept in Redis as envoyproxy/ratelimit keeps its counters, so that
    /// its instances and this store's share them: a plain integer at
    /// `{prefix}{key}_{window start in s}`, incremented by each check's hits and given the
    /// window's length (plus the store's jitter) to live (docs/SPEC.md, "Envoy
    /// compatibility: shared counters"). The check's key is then envoy's cache key without
    /// the prefix and the window start. Only a fixed window of whole seconds has such a
    /// counter, and it keeps no request ids. A state of its own: the identity says so.
    pub fn with_envoy_counter(&self) -> Result<Rule, RuleError> {
        let r = &self.inner;
        if r.algorithm != Algorithm::FixedWindow {
            return Err(RuleError::new(
                "algorithm",
                format!(
                    "envoy's counter is a fixed window's, not a {}'s",
                    r.algorithm
                ),
            ));
        }
        if !r.window.is_multiple_of(1_000_000) {
            return Err(RuleError::new(
                "window",
                format!(
                    "window {} is not a whole number of seconds, as envoy's counter's window \
                     start is",
                    format_duration(r.window)
                ),
            ));
        }
        Ok(self.identified_anew(|inner| inner.envoy_counter = true))
    }

    /// Whether this rule's Redis state is envoy's counter ([`Rule::with_envoy_counter`]).
    pub fn envoy_counter(&self) -> bool {
        self.inner.envoy_counter
    }

    /// This rule leased: each instance takes `units` (k) of a key from the store at once
    /// and spends them on its own checks of that key, for at most `spend_within` (D) after
    /// the take was sent (docs/SPEC.md, "Leases"), once the key is hot there (its checks
    /// asked k units in one span of D, the current one or the one before). Never more
    /// than L in any window across instances: a unit is spent up to D after the store
    /// recorded it, so a sliding log is kept over W + D (any W of it then holds at most L,
    /// whenever in D its units were spent), and a token bucket with its burst cut by
    /// ⌈D / T⌉ (any span then holds at most what B allows); its window, or its burst, then
    /// says so, and a sliding log's is a new state (its identity names the window). A fixed
    /// window's units are spent only in the window they were counted in. Applies to
    /// sliding-log, fixed-window and token-bucket; k from 1 to the capacity (after the
    /// cut); D from 1 µs to W, by default min(W / 10, 1 s) for a fixed window, else
    /// min(W / 100, 1 s). A [`RuleError`] on `lease` or `lease_for` otherwise, or when the
    /// rule already has a lease.
    pub fn with_lease(
        &self,
        units: u64,
        spend_within: Option<Duration>,
    ) -> Result<Rule, RuleError> {
        let r = &self.inner;
        if r.lease.is_some() {
            return Err(RuleError::new("lease", "the rule already has a lease"));
        }
        let lease = Lease::new(r.algorithm, r.capacity, r.window, units, spend_within)?;
        let d = lease.spend_within_micros();
        let (mut window, mut capacity) = (r.window, r.capacity);
        match r.algorithm {
            Algorithm::SlidingLog => {
                window += d;
                if window > MAX_SPAN {
                    return Err(RuleError::new(
                        "lease_for",
                        format!(
                            "window {} plus lease_for {} exceeds the longest supported span",
                            format_duration(r.window),
                            format_duration(d)
                        ),
                    ));
                }
            }
            Algorithm::TokenBucket => {
                let cut = d.div_ceil(r.emission_interval);
                capacity = capacity.saturating_sub(cut);
                if capacity < units {
                    return Err(RuleError::new(
                        "lease_for",
                        format!(
                            "lease_for {} takes {cut} of the burst {} (one unit per {} µs): \
                             fewer than the lease's {units} would be left",
                            format_duration(d),
                            r.capacity,
                            r.emission_interval
                        ),
                    ));
                }
            }
            _ => {}
        }
        Ok(self.identified_anew(|inner| {
            inner.window = window;
            inner.capacity = capacity;
            inner.lease = Some(lease);
        }))
    }

    /// The rule's lease, if it has one ([`Rule::with_lease`]).
    pub fn lease(&self) -> Option<Lease> {
        self.inner.lease
    }

    /// The rule's own policy for store failures, if it has one.
    pub fn failure_policy(&self) -> Option<FailurePolicy> {
        self.inner.on_store_error
    }

    /// The Redis layout of a sliding-log rule.
    pub fn layout(&self) -> LogLayout {
        self.inner.layout
    }

    /// The parameters this rule was built from.
    pub fn spec(&self) -> RuleSpec {
        let r = &self.inner;
        let mut spec = RuleSpec::new(r.algorithm, r.limit, Duration::from_micros(r.window));
        match r.algorithm {
            Algorithm::SlidingCounter => spec.buckets = Some(r.buckets),
            Algorithm::TokenBucket => spec.burst = Some(r.capacity),
            Algorithm::LeakyBucket => spec.queue = Some(r.capacity - 1),
            Algorithm::SlidingLog => spec.layout = Some(r.layout),
            Algorithm::FixedWindow => {}
        }
        spec
    }
}

impl RuleInner {
    /// Sets `identity` and its fingerprint: the rule's place (scope and name) and only
    /// those of its numbers without which its stored state cannot be read exactly
    /// (docs/SPEC.md, "Changing a rule's numbers"), so that a reload that changes any other
    /// number keeps each key's usage:
    ///
    /// - `sliding-log`: the window (the log keeps only one window of entries, so it cannot
    ///   answer for a longer one), and the layout (`cpt3`: the compact string's third
    ///   layout, whose keys no instance of an earlier one reads, as long as `zset` so that
    ///   key names cost the same; it holds any L);
    /// - `sliding-counter`: the window and the buckets (they fix the buckets' edges);
    /// - `fixed-window`: the window (it fixes the windows' edges);
    /// - `token-bucket`, `leaky-bucket`: nothing but the algorithm (the state converts).
    ///
    /// Lengths prefix the scope and the name, so no choice of either can spell another
    /// rule's identity: `{len}:{name}|…`, or `{len}:{scope}/{len}:{name}|…` in a scope.
    ///
    /// An envoy counter's identity is `envoy|w={window}` alone: envoy's counter is its key
    /// and its window, whichever rule counts in it (a limit override, another rule whose
    /// key joins to the same text), so every store keeps one count for them, as envoy does.
    fn identify(&mut self) {
        let mut identity = String::new();
        if self.envoy_counter {
            identity = format!("envoy|w={}", self.window);
        } else {
            if let Some(scope) = &self.scope {
                identity = format!("{}:{scope}/", scope.len());
            }
            identity += &format!("{}:{}|{}", self.name.len(), self.name, self.algorithm);
            match (self.algorithm, self.layout) {
                (Algorithm::SlidingLog, LogLayout::Zset) => {
                    identity += &format!("|w={}|zset", self.window);
                }
                (Algorithm::SlidingLog, LogLayout::Compact) => {
                    identity += &format!("|w={}|cpt3", self.window);
                }
                (Algorithm::SlidingCounter, _) => {
                    identity += &format!("|w={}|n={}", self.window, self.buckets);
                }
                (Algorithm::FixedWindow, _) => identity += &format!("|w={}", self.window),
                (Algorithm::TokenBucket | Algorithm::LeakyBucket, _) => {}
            }
        }
        let mut hasher = std::hash::DefaultHasher::new();
        identity.hash(&mut hasher);
        self.fingerprint = hasher.finish();
        self.owner = match &self.scope {
            Some(scope) => {
                let mut hasher = std::hash::DefaultHasher::new();
                ("scope", scope).hash(&mut hasher);
                hasher.finish()
            }
            None => self.fingerprint,
        };
        self.identity = identity.into_boxed_str();
    }
}

#[cfg(test)]
mod tests;
