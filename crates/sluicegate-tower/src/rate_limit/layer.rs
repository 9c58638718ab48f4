//! The layer: which limits apply, with which keys, and how to answer.

use std::sync::Arc;

use http::HeaderValue;
use http::request::Parts;
use sluicegate::{Limiter, MemoryStore, Rule, Store};
use tower::Layer;

use super::key::{KeyExtractor, MissingKey};
use super::response::policy_header;
use super::service::RateLimit;

/// Rate-limits every request of the service it wraps: each request takes one unit from
/// every limit (rule and key) at once, all-or-nothing. Cheap to clone; every clone, and
/// every service it makes, shares one [`Limiter`].
pub struct RateLimitLayer<S = MemoryStore> {
    pub(crate) settings: Arc<Settings<S>>,
}

impl<S> Clone for RateLimitLayer<S> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            settings: Arc::clone(&self.settings),
        }
    }
}

pub(crate) struct Settings<S> {
    pub(crate) limiter: Arc<Limiter<S>>,
    pub(crate) rules: Vec<Rule>,
    pub(crate) keys: Vec<KeyExtractor>,
    pub(crate) policy: Option<HeaderValue>,
    pub(crate) legacy_headers: bool,
}

impl<S> Settings<S> {
    /// Every limit's key for this request.
    pub(crate) fn keys(&self, parts: &Parts) -> Result<Vec<String>, MissingKey> {
        self.keys.iter().map(|k| k.extract(parts)).collect()
    }
}

impl<S: Store> RateLimitLayer<S> {
    /// A layer with no limits yet, deciding with `limiter`.
    pub fn new(limiter: Arc<Limiter<S>>) -> Self {
        RateLimitLayer {
            settings: Arc::new(Settings {
                limiter,
                rules: Vec::new(),
                keys: Vec::new(),
                policy: None,
                legacy_headers: false,
            }),
        }
    }

    /// Adds a limit: `rule`, per key that `key` takes from the request.
    pub fn limit(self, rule: Rule, key: KeyExtractor) -> Self {
        self.edit(|s| {
            s.rules.push(rule);
            s.keys.push(key);
            s.policy = policy_header(&s.rules);
        })
    }

    /// Also sends `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    pub fn legacy_headers(self, on: bool) -> Self {
        self.edit(|s| s.legacy_headers = on)
    }

    fn edit(self, change: impl FnOnce(&mut Settings<S>)) -> Self {
        let mut settings = Settings {
            limiter: Arc::clone(&self.settings.limiter),
            rules: self.settings.rules.clone(),
            keys: self.settings.keys.clone(),
            policy: self.settings.policy.clone(),
            legacy_headers: self.settings.legacy_headers,
        };
        change(&mut settings);
        RateLimitLayer {
            settings: Arc::new(settings),
        }
    }
}

impl<S, Inner> Layer<Inner> for RateLimitLayer<S> {
    type Service = RateLimit<Inner, S>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimit {
            inner,
            settings: Arc::clone(&self.settings),
        }
    }
}
