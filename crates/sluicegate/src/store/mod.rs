//! Stores keep the state of every (rule, key) and decide checks atomically. Every store
//! gives the same decisions for the same checks (docs/SPEC.md); tests hold them to it.

mod any;
pub(crate) mod check;
mod durability;
pub(crate) mod error;
pub(crate) mod key;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;
mod url;

pub use any::{AnyStore, StoreOptions, TlsClientIdentity};
pub use durability::Durability;
pub use memory::{MemoryStore, MemoryStoreConfig};
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreConfig};
pub use url::{StoreUrl, StoreUrlError};

pub use check::{Charge, Check, DecidedBy, Limit, NodeId, Nodes, Outcome, RequestUse, Store};
pub use error::{RequestIdConflict, StoreError};
