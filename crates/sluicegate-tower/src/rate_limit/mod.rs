//! The rate-limit middleware: [`RateLimitLayer`] (a small `Clone` settings value) and the
//! [`RateLimit`] service it wraps around an inner service, tower's own shape.
//!
//! The modules, each using only those below it: `layer` (builds settings, makes
//! services), `service` (decides and answers), `after` (the charge after the response),
//! `settings` (what they share), `usage` (what a response cost and how it is charged),
//! `in_flight` (the charges after responses still running), `response` (headers and
//! refusals), `key` (where keys come from), `peer` (the client's address behind trusted
//! proxies).

mod after;
mod in_flight;
mod key;
mod layer;
#[cfg(feature = "axum")]
mod peer;
mod response;
mod service;
mod settings;
mod usage;

pub use key::{KeyExtractor, MissingKey};
pub use layer::RateLimitLayer;
#[cfg(feature = "axum")]
pub use peer::{ForwardedHeader, IpNet};
pub use service::RateLimit;
pub use usage::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_ATTEMPTS, Estimate, ResponseCost, Usage, UsageStats,
};
