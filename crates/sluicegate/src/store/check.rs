//! What every store is asked and answers: a check of limits, its outcome, who decided
//! it, and the `Store` trait itself.

use std::future::Future;
use std::time::Duration;

use super::error::{RequestIdConflict, StoreError};
pub use crate::algorithm::{Charge, RequestUse};
use crate::budget::OnFull;
use crate::decision::Decision;
use crate::micros::saturating_micros;
use crate::policy::FailurePolicy;
use crate::rule::{EXACT_LIMIT, MAX_TIME, Rule};

/// The longest request id a check may carry, in bytes. Ids are kept for as long as their
/// admission counts, so their size is bounded like everything else a key holds.
pub(crate) const MAX_REQUEST_ID_BYTES: usize = 256;

/// Prepended to every Redis key unless a prefix is configured.
pub(crate) const DEFAULT_REDIS_PREFIX: &str = "sluicegate:";
/// How long one Redis check may take unless configured. Measured on a loaded 2-core
/// machine (`sluicegate bench`, 32 and 256 checks in flight, 12 runs of 10 s): the 99.9th
/// percentile of round trips ranged from 6 ms to 226 ms; at 50 ms, CPU contention alone
/// times out checks, so 250 ms.
pub(crate) const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(250);
/// How long beyond its window an envoy counter may live unless configured: envoy's
/// `EXPIRATION_JITTER_MAX_SECONDS` default (envoyproxy/ratelimit@f2fb157
/// src/settings/settings.go:107).
pub(crate) const DEFAULT_EXPIRATION_JITTER_MAX: Duration = Duration::from_secs(300);
/// How often Redis' `maxmemory-policy` is read again unless configured.
pub(crate) const DEFAULT_EVICTION_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// How often Redis is checked for lost state unless configured: a loss is seen within
/// this long, at the cost of one `INFO` and one `GET` per node each time.
pub(crate) const DEFAULT_LOST_STATE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// One rule applied to one key.
#[derive(Clone, Copy, Debug)]
pub struct Limit<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// The key: any UTF-8; distinct keys never share state.
    pub key: &'a str,
}

/// One check: a cost under one or more limits, all-or-nothing.
#[derive(Clone, Copy, Debug)]
pub struct Check<'a> {
    /// The limits that must all allow.
    pub limits: &'a [Limit<'a>],
    /// Units to take; 0 is a peek that answers as a cost of 1 and records nothing.
    pub cost: u64,
    /// Each limit's own cost, in the limits' order, when they differ; empty (the default):
    /// every limit costs `cost`. Still all-or-nothing: each limit must fit its own cost.
    pub costs: &'a [u64],
    /// A retried request with the same id is not counted twice while its admission counts.
    pub request_id: Option<&'a str>,
    /// The caller's clock (the time since the Unix epoch), for replay, simulation and
    /// tests; `None` uses the store's own clock. Kept in whole microseconds (a part below
    /// one is dropped); a time at or past 2^52 µs after the epoch (the year 2112) makes
    /// the check invalid ([`StoreError::InvalidCheck`]).
    pub at: Option<Duration>,
    /// The mode: by default a check, whose refusal records nothing (docs/SPEC.md, "Usage").
    pub charge: Charge,
}

impl<'a> Check<'a> {
    /// The largest cost a check may have (2^53 - 1): every count stays exact in the
    /// Redis script's doubles.
    pub const MAX_COST: u64 = EXACT_LIMIT - 1;

    /// The longest request id, in bytes.
    pub const MAX_REQUEST_ID_BYTES: usize = MAX_REQUEST_ID_BYTES;

    /// [`Check::at`] in µs; a time past `u64::MAX` µs is `u64::MAX`, which
    /// [`Check::validate`] refuses.
    pub(crate) fn at_micros(&self) -> Option<u64> {
        self.at.map(saturating_micros)
    }

    /// A check of `cost` under `limits`, on the store's clock, without a request id.
    pub fn new(limits: &'a [Limit<'a>], cost: u64) -> Self {
        Check {
            limits,
            cost,
            costs: &[],
            request_id: None,
            at: None,
            charge: Charge::Check,
        }
    }

    /// The cost of the limit at `index`.
    pub fn cost_of(&self, index: usize) -> u64 {
        self.costs.get(index).copied().unwrap_or(self.cost)
    }

    /// The error of a conflicting reuse of this check's request id, found in the state of
    /// the limit at `index`, which remembers it as `remembered`.
    pub(crate) fn request_id_conflict(&self, index: usize, remembered: RequestUse) -> StoreError {
        StoreError::RequestIdConflict(RequestIdConflict {
            request_id: self.request_id.unwrap_or_default().to_owned(),
            rule: self.limits[index].rule.name().to_owned(),
            remembered,
            asked: RequestUse::new(self.charge, self.cost_of(index)),
        })
    }

    /// The costs of the limits at `indices`, for a check of those limits alone; empty when
    /// every limit costs `cost`.
    pub(crate) fn costs_of(&self, indices: impl IntoIterator<Item = usize>) -> Vec<u64> {
        if self.costs.is_empty() {
            Vec::new()
        } else {
            indices.into_iter().map(|i| self.costs[i]).collect()
        }
    }

    /// Rejects what no store can decide, before any state is touched.
    // Inlined, with the messages out of line: a memory store's check runs it every time,
    // and called it cost a tenth of a refusal.
    #[inline]
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.limits.is_empty() {
            return invalid(|| "a check needs at least one rule".into());
        }
        if !self.costs.is_empty() && self.costs.len() != self.limits.len() {
            return invalid(|| {
                format!(
                    "{} costs given for {} limits",
                    self.costs.len(),
                    self.limits.len()
                )
            });
        }
        if let Some(cost) = std::iter::once(&self.cost)
            .chain(self.costs)
            .find(|&&c| c >= EXACT_LIMIT)
        {
            return invalid(|| format!("cost {cost} is not below 2^53"));
        }
        if let Some(at) = self.at_micros()
            && at >= MAX_TIME
        {
            return invalid(|| format!("time {at} µs is not below 2^52 µs (the year 2112)"));
        }
        match self.request_id {
            None if self.charge.needs_request_id() => {
                return invalid(|| format!("a {} needs a request id", self.charge.name()));
            }
            Some(id) if id.is_empty() || id.len() > MAX_REQUEST_ID_BYTES => {
                return invalid(|| {
                    format!(
                        "request id must be 1 to {MAX_REQUEST_ID_BYTES} bytes, got {}",
                        id.len()
                    )
                });
            }
            _ => {}
        }
        if let Some(limit) = self.limits.iter().find(|l| l.rule.envoy_counter())
            && (self.request_id.is_some()
                || !matches!(self.charge, Charge::Check | Charge::CheckChargingRefusals))
        {
            return invalid(|| {
                format!(
                    "rule {:?} counts in envoy's counter, which takes checks without a \
                     request id only (this is a {}{})",
                    limit.rule.name(),
                    self.charge.name(),
                    if self.request_id.is_some() {
                        " with a request id"
                    } else {
                        ""
                    }
                )
            });
        }
        for (i, a) in self.limits.iter().enumerate().skip(1) {
            if self.limits[..i]
                .iter()
                .any(|b| a.key == b.key && a.rule.same_identity(b.rule))
            {
                return invalid(|| {
                    format!(
                        "rule {:?} is named twice for key {:?} in one check",
                        a.rule.name(),
                        a.key
                    )
                });
            }
        }
        Ok(())
    }
}

/// A check's validation error, its message made only when there is one.
#[cold]
fn invalid(message: impl FnOnce() -> String) -> Result<(), StoreError> {
    Err(StoreError::InvalidCheck(message()))
}

/// What a check decided: the combined decision, and each limit's own, in the check's order.
///
/// When the check is refused nothing is recorded anywhere; a limit that would have allowed
/// then reports `allowed = true` with its state unchanged, so callers can tell which limits
/// refused (Envoy's per-descriptor statuses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The combined decision (docs/SPEC.md, "Several rules in one check").
    pub decision: Decision,
    /// Each limit's decision when the check named several; empty for one, whose decision
    /// is `decision` (a one-limit check, the common case, allocates nothing).
    several: Vec<Decision>,
    /// Who decided: the store, or the limiter without it.
    pub decided_by: DecidedBy,
    /// Entries the store evicted to make room for this check's new keys (`evict-idle`).
    pub evictions: u64,
}

/// Who decided a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecidedBy {
    /// The store.
    Store,
    /// Units this instance took from the store at once under the rule's lease and spends
    /// locally (docs/SPEC.md, "Leases").
    Lease,
    /// The limiter's negative cache: the store refused the same check moments ago and said
    /// when it could pass; until then the limiter refuses without asking.
    NegativeCache,
    /// The limiter's local pre-check: this instance alone has sent the store more than its
    /// share of the limit (factor × L / instances).
    LocalPrecheck,
    /// The store failed and this policy decided.
    Fallback(FailurePolicy),
    /// The store had no room for a new key of the check (its memory budget, its key cap,
    /// or the rule's share of either) and this policy decided ([`OnFull::EvictIdle`]: it
    /// found nothing it may evict, and refused).
    Full(OnFull),
}

impl DecidedBy {
    /// `store`, `lease`, `negative-cache`, `local-precheck`, `fallback-allow`, `fallback-deny`,
    /// `fallback-local`, `store-error`, `full-refuse`, `full-allow`, `full-evict-idle`.
    pub fn name(self) -> &'static str {
        match self {
            DecidedBy::Store => "store",
            DecidedBy::Lease => "lease",
            DecidedBy::NegativeCache => "negative-cache",
            DecidedBy::LocalPrecheck => "local-precheck",
            DecidedBy::Fallback(FailurePolicy::Allow) => "fallback-allow",
            DecidedBy::Fallback(FailurePolicy::Deny) => "fallback-deny",
            DecidedBy::Fallback(FailurePolicy::Local) => "fallback-local",
            DecidedBy::Fallback(FailurePolicy::Error) => "store-error",
            DecidedBy::Full(OnFull::Refuse) => "full-refuse",
            DecidedBy::Full(OnFull::Allow) => "full-allow",
            DecidedBy::Full(OnFull::EvictIdle) => "full-evict-idle",
        }
    }
}

impl Outcome {
    /// The outcome of a check of one limit.
    pub fn single(decision: Decision) -> Self {
        Outcome {
            decision,
            several: Vec::new(),
            decided_by: DecidedBy::Store,
            evictions: 0,
        }
    }

    /// Combines the per-limit decisions of a check (at least one).
    pub(crate) fn from_limits(limits: Vec<Decision>) -> Self {
        let decision =
            Decision::combine(&limits).expect("validated checks hold at least one limit");
        if limits.len() == 1 {
            return Outcome::single(decision);
        }
        Outcome {
            decision,
            several: limits,
            decided_by: DecidedBy::Store,
            evictions: 0,
        }
    }

    /// Each limit's decision, in the check's order.
    pub fn limits(&self) -> &[Decision] {
        if self.several.is_empty() {
            std::slice::from_ref(&self.decision)
        } else {
            &self.several
        }
    }
}

/// One node of a store: a server, or a master of a Redis Cluster, by a small number the
/// store gives it. A number always means the same node (its address) for the life of the
/// store, so failure state kept per number stays with the node and never follows the
/// slots it served to another. A store of one server has one node, [`NodeId::FIRST`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u16);

impl NodeId {
    /// The only node of a store of one server; on a cluster, where a check goes while
    /// the slot map does not tell (not read yet, or a slot no master serves).
    pub const FIRST: NodeId = NodeId(0);
}

/// The nodes one check goes to: one, or several for a check of keys on several nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Nodes {
    /// All its keys are on this node.
    One(NodeId),
    /// Its keys are on these nodes, each named once.
    Several(Vec<NodeId>),
}

impl Nodes {
    /// Each node, once.
    pub fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        let (one, several) = match self {
            Nodes::One(node) => (Some(*node), &[][..]),
            Nodes::Several(nodes) => (None, nodes.as_slice()),
        };
        one.into_iter().chain(several.iter().copied())
    }
}

/// A store of rate-limit state.
pub trait Store: Send + Sync {
    /// Decides `check` atomically (docs/SPEC.md). An error means nothing was decided.
    fn check(&self, check: &Check<'_>) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// How many times the servers holding `check`'s keys were found to have lost state
    /// that this store wrote (a restart without persistence, a failover that lost writes,
    /// a flush), summed over them; it only grows. A store that cannot lose its state
    /// answers 0.
    fn lost_state_generation(&self, _check: &Check<'_>) -> u64 {
        0
    }

    /// Whether [`Store::lost_state_generation`] can ever change: only then is every key's
    /// last count worth remembering, to write it back after a loss. The in-memory store
    /// never loses what it wrote.
    fn may_lose_state(&self) -> bool {
        false
    }
    /// The nodes `check` would go to now, by what the store last knew of where keys live:
    /// what the limiter keeps failure state by (a circuit breaker per node). Called on
    /// every check: cheap, no allocation for a check of one node. A store of one server
    /// answers [`NodeId::FIRST`].
    fn nodes(&self, _check: &Check<'_>) -> Nodes {
        Nodes::One(NodeId::FIRST)
    }

    /// What metrics, logs and the live page call `node` (`host:port`); `None` for a node
    /// the store does not send checks to now (unknown, or no longer serving any key: a
    /// master that failed over), whose failure state is then left out of what they show.
    /// A store of one node calls it `store`.
    fn node_name(&self, node: NodeId) -> Option<String> {
        (node == NodeId::FIRST).then(|| "store".to_owned())
    }

    /// Checks of `node` are being answered without calling it (it failed too often). A
    /// store whose keys can move to another node (a cluster's failover, a resharding)
    /// looks again where they live, at a bounded rate, so that checks of keys now served
    /// elsewhere go there at once. Called on every such check: cheap.
    fn node_refused(&self, _node: NodeId) {}
}
