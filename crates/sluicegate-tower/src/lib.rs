//! Tower middleware for sluicegate: rate-limit any Rust HTTP (axum, hyper) or gRPC
//! (tonic) service in a few lines.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use sluicegate::{Algorithm, Limiter, Rule, RuleSpec};
//! use sluicegate_tower::{KeyExtractor, RateLimitLayer};
//!
//! # #[cfg(feature = "axum")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let per_ip = Rule::new("per-ip", &RuleSpec::new(Algorithm::SlidingLog, 100, Duration::from_secs(60)))?;
//! let layer = RateLimitLayer::new(Arc::new(Limiter::in_memory()))
//!     .limit(per_ip, KeyExtractor::peer_ip());
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! A refused request gets `429 Too Many Requests` with `Retry-After` (whole seconds,
//! rounded up, never 0), `RateLimit` and `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-
//! headers), optionally `X-RateLimit-*`, and an `application/problem+json` body (RFC 9457)
//! naming the violated policies; a gRPC call gets status `RESOURCE_EXHAUSTED` with the
//! same retry information. Allowed responses carry `RateLimit` too. A leaky-bucket rule
//! shapes instead: the request waits its `delay` on the timer before reaching the inner
//! service. A key that cannot be extracted answers the status its extractor documents
//! ([`KeyExtractor`]); a store that cannot decide answers 503.
//!
//! By default each request costs one unit. For costs known only from the response (an LLM
//! answer's tokens), [`RateLimitLayer::charge_after`] with a [`Usage`] peeks or reserves
//! an estimate at request time and charges what the response says it cost after it.
//!
//! The `axum` feature (on by default) adds the keys only axum records:
//! `KeyExtractor::peer_ip` (with `trust_proxies`, `trusted_hops` and `forwarded_header`,
//! `IpNet` for the proxies' networks, `ForwardedHeader` for the header they write) and
//! `KeyExtractor::route`. Without it the layer wraps any tower service (tonic,
//! hyper) and pulls in no web framework.

mod rate_limit;

/// The workspace README's Rust blocks, compiled (and run, unless marked `no_run`) as this
/// crate's doctests so that they keep compiling as printed. Only under `cfg(doctest)`, so
/// the crate's documentation does not carry the README.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// docs/usage.md's Rust block (the layer charging after the response), compiled as a
/// doctest as the README's are.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../../docs/usage.md")]
pub struct UsageDoctests;

pub use rate_limit::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_ATTEMPTS, Estimate, KeyExtractor, MissingKey, RateLimit,
    RateLimitLayer, ResponseCost, Usage, UsageStats,
};
#[cfg(feature = "axum")]
pub use rate_limit::{ForwardedHeader, IpNet};
