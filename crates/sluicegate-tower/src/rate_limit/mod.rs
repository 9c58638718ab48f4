//! The rate-limit middleware: [`RateLimitLayer`] (a small `Clone` settings value) and the
//! [`RateLimit`] service it wraps around an inner service, tower's own shape.

mod key;
mod layer;
mod response;
mod service;

pub use key::{IpNet, KeyExtractor, MissingKey};
pub use layer::RateLimitLayer;
pub use service::RateLimit;
