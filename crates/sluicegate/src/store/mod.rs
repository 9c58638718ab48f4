//! Stores keep the state of every (rule, key) and decide checks atomically. Every store
//! gives the same decisions for the same checks (docs/SPEC.md); tests hold them to it.

mod any;
pub(crate) mod check;
mod durability;
pub(crate) mod error;
mod key;
mod memory;
#[cfg(feature = "redis")]
pub mod redis;
mod url;

pub use any::{AnyStore, StoreOptions, TlsClientIdentity};
pub use durability::Durability;
pub use memory::{FULL_RETRY_AFTER, MemoryStore, MemoryStoreConfig, STORE_PART, SWEEP_INTERVAL};
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreConfig, ScriptCalls};
pub use url::{StoreUrl, StoreUrlError};

pub use check::{
    Charge, Check, DecidedBy, Limit, MAX_REQUEST_ID_BYTES, NodeId, Nodes, Outcome, RequestUse,
    Store,
};
pub use error::{RequestIdConflict, StoreError};
pub use key::{DIGEST_MARKER, DIGESTED_KEY_BYTES, MAX_STORED_KEY_BYTES, stored_key};
