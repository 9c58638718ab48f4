#![doc = include_str!("../README.md")]

pub(crate) mod algorithm;
mod clock;
mod decision;
pub mod duration;
pub mod headers;
mod limiter;
mod policy;
mod rule;
pub mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, RetryAfter};
pub use limiter::{BreakerState, Limiter, LimiterConfig, LimiterStats};
pub use policy::FailurePolicy;
pub use rule::{
    Algorithm, DEFAULT_BUCKETS, EXACT_LIMIT, LogLayout, MAX_COMPACT_LOG_LIMIT, MAX_SPAN, MAX_TIME,
    MAX_ZSET_LOG_LIMIT, Rule, RuleError, RuleSpec,
};
pub use store::{
    AnyStore, Check, DecidedBy, Limit, MemoryStore, MemoryStoreConfig, Outcome, RedisStore,
    RedisStoreConfig, Store, StoreError, StoreOptions,
};
