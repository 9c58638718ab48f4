#![doc = include_str!("../README.md")]
// Built without Redis, the README's links to the Redis store have nothing to lead to.
#![cfg_attr(not(feature = "redis"), allow(rustdoc::broken_intra_doc_links))]

pub(crate) mod algorithm;
mod budget;
mod clock;
mod decision;
mod duration;
pub mod headers;
#[cfg(feature = "internals")]
pub mod internals;
mod limiter;
mod micros;
mod policy;
#[cfg(test)]
mod public_api_tests;

/// docs/library.md's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct LibraryMd;
mod rule;
mod store;

pub use budget::{BudgetError, BudgetPart, MemoryBudget, OnFull};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, RetryAfter};
pub use limiter::{
    BreakerConfig, BreakerState, BreakerTransitions, Limiter, LimiterConfig, LimiterStats,
    NodeBreaker,
};
pub use policy::{FailurePolicy, OnStoreReset};
pub use rule::{Algorithm, Lease, LogLayout, Rule, RuleError, RuleSpec};
pub use store::{
    AnyStore, Charge, Check, DecidedBy, Durability, Limit, MemoryStore, MemoryStoreConfig, NodeId,
    Nodes, Outcome, RequestIdConflict, RequestUse, Store, StoreError, StoreOptions, StoreUrl,
    StoreUrlError, TlsClientIdentity,
};
#[cfg(feature = "redis")]
pub use store::{RedisStore, RedisStoreConfig};

/// What a [`RedisStore`] reports of its servers, and how it runs its script.
#[cfg(feature = "redis")]
pub mod redis {
    pub use crate::store::redis::{
        Eviction, LossReason, LostState, MinReplicas, NodePolicy, NodeReplication, Replication,
        ScriptCalls, Scripting, StateLoss, WatchedNode,
    };
}
