//! The layer: which limits apply, with which keys, and how to answer.

use std::sync::Arc;

use sluicegate::{Limiter, MemoryStore, Rule, Store};
use tower::Layer;

use super::key::KeyExtractor;
use super::service::RateLimit;
use super::settings::Settings;
use super::usage::Usage;

/// Rate-limits every request of the service it wraps: each request takes one unit from
/// every limit (rule and key) at once, all-or-nothing — or, with
/// [`RateLimitLayer::charge_after`], what its response says it cost. Cheap to clone; every clone, and
/// every service it makes, shares one [`Limiter`].
pub struct RateLimitLayer<S = MemoryStore> {
    settings: Arc<Settings<S>>,
}

impl<S> Clone for RateLimitLayer<S> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S: Store> RateLimitLayer<S> {
    /// A layer with no limits yet, deciding with `limiter`.
    pub fn new(limiter: Arc<Limiter<S>>) -> Self {
        RateLimitLayer {
            settings: Arc::new(Settings::new(limiter)),
        }
    }

    /// Adds a limit: `rule`, per key that `key` takes from the request.
    pub fn limit(self, rule: Rule, key: KeyExtractor) -> Self {
        self.edit(|s| s.add_limit(rule, key))
    }

    /// Also sends `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    pub fn legacy_headers(self, on: bool) -> Self {
        self.edit(|s| s.legacy_headers = on)
    }

    /// Charges every limit what the response cost, read as `usage` says, after the response
    /// instead of one unit before it (the LLM proxy's tokens). The request-time check peeks
    /// or reserves an estimate; see [`Usage`]. Limits that count requests belong in a layer
    /// of their own.
    pub fn charge_after(self, usage: Usage) -> Self {
        self.edit(|s| s.usage = Some(usage))
    }

    /// A layer with changed settings; services made before keep the old ones.
    fn edit(self, change: impl FnOnce(&mut Settings<S>)) -> Self {
        let mut settings = Settings::clone(&self.settings);
        change(&mut settings);
        RateLimitLayer {
            settings: Arc::new(settings),
        }
    }
}

impl<S, Inner> Layer<Inner> for RateLimitLayer<S> {
    type Service = RateLimit<Inner, S>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.settings))
    }
}
