//! What a match yields: a configured limit, and the request entries matched against it.

use std::borrow::Cow;

use serde::Deserialize;
use sluicegate::Rule;

/// `rule`, counted in envoyproxy/ratelimit's own Redis key when `envoy_counters` says so
/// and the rule can be: a fixed window of whole seconds (every envoy unit is) without
/// `usage` (envoy's counter keeps no request ids). Any other rule keeps its own state,
/// which no envoy instance reads.
pub(crate) fn with_envoy_counter(rule: Rule, envoy_counters: bool, usage: bool) -> Rule {
    if envoy_counters && !usage {
        rule.with_envoy_counter().unwrap_or(rule)
    } else {
        rule
    }
}

/// A `rate_limit` of the configuration.
#[derive(Debug)]
pub(crate) struct ConfiguredLimit {
    /// `None` for `unlimited: true` and for a block.
    pub(crate) rule: Option<Rule>,
    /// A block's `unit` (or `window`), in µs: the unit its answer names; `None` but for a
    /// block (see [`ConfiguredLimit::blocked`]).
    pub(crate) block_window: Option<u64>,
    /// The descriptor path, `domain.key_value.key`, as envoyproxy/ratelimit names it.
    pub(crate) path: String,
    /// `rate_limit.name`, which `replaces` refers to.
    pub(crate) name: Option<String>,
    /// Names of limits this one replaces when both match one request.
    pub(crate) replaces: Vec<String>,
    /// Counted and reported, never enforced.
    pub(crate) shadow_mode: bool,
    /// Metrics name the request's value rather than the key alone.
    pub(crate) detailed_metric: bool,
    /// `usage: true`: a descriptor reaching it may end with a `request_id` entry and a
    /// `usage` entry naming its mode, neither part of its key (docs/SPEC.md, "Envoy
    /// compatibility: counting").
    pub(crate) usage: bool,
    /// Per level of the path, the wildcard value of a `share_threshold` descriptor there;
    /// empty when no level shares.
    pub(crate) shared_values: Vec<Option<String>>,
}

impl ConfiguredLimit {
    /// A block: every request over the limit (`requests_per_unit: 0`, or a `unit` with no
    /// `requests_per_unit`, as envoyproxy/ratelimit reads them).
    pub(crate) fn blocked(&self) -> bool {
        self.block_window.is_some()
    }

    /// The entries a request's counter is kept under: the request's own, except that an
    /// entry matched by a `share_threshold` wildcard counts under the wildcard, so that
    /// every value it matches shares one counter (as envoyproxy/ratelimit's cache key).
    pub(crate) fn counted_entries<'e>(&self, entries: &'e [Entry]) -> Cow<'e, [Entry]> {
        if self.shared_values.is_empty() {
            return Cow::Borrowed(entries);
        }
        Cow::Owned(
            entries
                .iter()
                .zip(&self.shared_values)
                .map(|(entry, shared)| Entry {
                    key: entry.key.clone(),
                    value: shared.clone().unwrap_or_else(|| entry.value.clone()),
                })
                .collect(),
        )
    }
}

/// One entry of a request descriptor.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Entry {
    pub(crate) key: String,
    pub(crate) value: String,
}
