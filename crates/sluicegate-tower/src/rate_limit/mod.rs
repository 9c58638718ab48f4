//! The rate-limit middleware: [`RateLimitLayer`] (a small `Clone` settings value) and the
//! [`RateLimit`] service it wraps around an inner service, tower's own shape.
//!
//! The layers, each using only those below it: `layer` (builds settings, makes services),
//! `service` (decides and answers), `settings` (what both share), `response` (headers and
//! refusals), `key` (where keys come from).

mod key;
mod layer;
mod response;
mod service;
mod settings;

pub use key::{IpNet, KeyExtractor, MissingKey};
pub use layer::RateLimitLayer;
pub use service::RateLimit;
