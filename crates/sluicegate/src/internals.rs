//! What `sluicegate serve`, its tools and the workspace's tests use of the library's
//! insides, behind the `internals` feature: no part of the library's API, and no
//! promise of stability. A library user never needs it.

pub use crate::decision::signed_micros;
pub use crate::duration::{DurationError, format_duration, parse_duration};
pub use crate::micros::saturating_micros;
pub use crate::rule::MAX_TIME;
pub use crate::store::key::{DIGESTED_KEY_BYTES, MAX_STORED_KEY_BYTES, stored_key};
pub use crate::store::memory::FULL_RETRY_AFTER;
#[cfg(feature = "redis")]
pub use crate::store::redis::ScriptTime;
#[cfg(feature = "redis")]
pub use crate::store::redis::keys::{
    KeyKind, envoy_counter_key, hash_slot, identity_slot, key_pattern, redis_key,
};
