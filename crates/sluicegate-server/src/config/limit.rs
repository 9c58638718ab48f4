//! What a match yields: a configured limit, and the request entries matched against it.

use serde::Deserialize;
use sluicegate::Rule;

/// A `rate_limit` of the configuration.
#[derive(Debug)]
pub(crate) struct ConfiguredLimit {
    /// `None` for `unlimited: true` and for `requests_per_unit: 0`.
    pub(crate) rule: Option<Rule>,
    /// `requests_per_unit: 0`: every request over the limit (a block list).
    pub(crate) blocked: bool,
    /// A block's `unit` in µs, when it names one.
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
}

/// One entry of a request descriptor.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Entry {
    pub(crate) key: String,
    pub(crate) value: String,
}
