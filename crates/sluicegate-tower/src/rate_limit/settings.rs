//! What a layer and every service it makes share: the limiter, the limits with their keys,
//! and how to answer. Below both, so that the layer builds it and the service reads it.

use std::sync::Arc;

use http::HeaderValue;
use http::request::Parts;
use sluicegate::{Limit, Limiter, Rule};

use super::key::{KeyExtractor, MissingKey};
use super::response::policy_header;
use super::usage::Usage;

pub(crate) struct Settings<S> {
    pub(crate) limiter: Arc<Limiter<S>>,
    /// One rule per limit, in the order given; `keys[i]` takes the key of `rules[i]`.
    pub(crate) rules: Vec<Rule>,
    keys: Vec<KeyExtractor>,
    /// `RateLimit-Policy` for all the rules, made once rather than per response.
    pub(crate) policy: Option<HeaderValue>,
    pub(crate) legacy_headers: bool,
    /// Charge what the response cost after it, instead of one unit before.
    pub(crate) usage: Option<Usage>,
}

// By hand: a derive would ask for `S: Clone`, and only the `Arc` around the limiter is cloned.
impl<S> Clone for Settings<S> {
    fn clone(&self) -> Self {
        Settings {
            limiter: Arc::clone(&self.limiter),
            rules: self.rules.clone(),
            keys: self.keys.clone(),
            policy: self.policy.clone(),
            legacy_headers: self.legacy_headers,
            usage: self.usage.clone(),
        }
    }
}

impl<S> Settings<S> {
    /// No limits yet.
    pub(crate) fn new(limiter: Arc<Limiter<S>>) -> Self {
        Settings {
            limiter,
            rules: Vec::new(),
            keys: Vec::new(),
            policy: None,
            legacy_headers: false,
            usage: None,
        }
    }

    pub(crate) fn add_limit(&mut self, rule: Rule, key: KeyExtractor) {
        self.rules.push(rule);
        self.keys.push(key);
        self.policy = policy_header(&self.rules);
    }

    /// Every limit's key for this request.
    pub(crate) fn keys(&self, parts: &Parts) -> Result<Vec<String>, MissingKey> {
        self.keys.iter().map(|k| k.extract(parts)).collect()
    }

    /// The limits of a request whose keys are `keys` (from [`Settings::keys`]).
    pub(crate) fn limits<'a>(&'a self, keys: &'a [String]) -> Vec<Limit<'a>> {
        self.rules
            .iter()
            .zip(keys)
            .map(|(rule, key)| Limit { rule, key })
            .collect()
    }
}
