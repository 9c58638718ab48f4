#![doc = include_str!("../README.md")]
// Built without Redis, the README's links to the Redis store have nothing to lead to.
#![cfg_attr(not(feature = "redis"), allow(rustdoc::broken_intra_doc_links))]

pub(crate) mod algorithm;
mod budget;
mod clock;
mod decision;
pub mod duration;
pub mod headers;
mod limiter;
mod policy;
mod rule;
pub mod store;

pub use budget::{BudgetError, BudgetPart, DEFAULT_RULE_SHARE, MemoryBudget, OnFull};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, RetryAfter};
pub use limiter::{
    BreakerConfig, BreakerState, BreakerTransitions, FALLBACK_PART, Limiter, LimiterConfig,
    LimiterStats, NEGATIVE_CACHE_PART, NodeBreaker,
};
pub use policy::{FailurePolicy, OnStoreReset};
pub use rule::{
    Algorithm, DEFAULT_BUCKETS, EXACT_LIMIT, LogLayout, MAX_COMPACT_LOG_LIMIT, MAX_SPAN, MAX_TIME,
    MAX_ZSET_LOG_LIMIT, Rule, RuleError, RuleSpec,
};
pub use store::{
    AnyStore, Charge, Check, DecidedBy, Durability, FULL_RETRY_AFTER, Limit, MemoryStore,
    MemoryStoreConfig, NodeId, Nodes, Outcome, RequestIdConflict, RequestUse, STORE_PART, Store,
    StoreError, StoreOptions, StoreUrl, StoreUrlError, TlsClientIdentity,
};
#[cfg(feature = "redis")]
pub use store::{RedisStore, RedisStoreConfig};
