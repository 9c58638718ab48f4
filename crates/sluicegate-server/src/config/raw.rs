//! The YAML as written: serde's view of a descriptor file, each `rate_limit` validated
//! as it is read so that an error carries its line.
//!
//! The fields and their rules are envoyproxy/ratelimit's (`src/config/config_impl.go`):
//! what it loads loads here, what it refuses is refused, plus sluicegate's algorithm
//! fields on `rate_limit`.

use std::time::Duration;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;
use sluicegate::internals::parse_duration;
use sluicegate::{Algorithm, FailurePolicy, LogLayout, Rule, RuleError, RuleSpec};

/// The algorithm of a `rate_limit` that names none, unless the server is told another
/// (`--default-algorithm`; `fixed-window` reproduces envoyproxy/ratelimit exactly).
pub(crate) const DEFAULT_ALGORITHM: Algorithm = Algorithm::SlidingLog;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) domain: String,
    /// Envoy Gateway names each configuration it writes (after its domain);
    /// envoyproxy/ratelimit accepts a `name` anywhere and reads none at the top, nor does
    /// sluicegate.
    #[serde(default, rename = "name")]
    _name: Option<String>,
    #[serde(default)]
    pub(super) descriptors: DescriptorList,
}

/// A `descriptors` list; `descriptors:` with nothing after it is an empty one.
#[derive(Default)]
pub(super) struct DescriptorList(pub(super) Vec<RawDescriptor>);

impl<'de> Deserialize<'de> for DescriptorList {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let list = Option::<Vec<RawDescriptor>>::deserialize(deserializer)?;
        Ok(DescriptorList(list.unwrap_or_default()))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDescriptor {
    /// With its place, which errors about the descriptor as a whole name.
    pub(super) key: Spanned<String>,
    /// `None` when absent, null or empty: envoyproxy/ratelimit treats `value: ""` as no
    /// value (see [`RawDescriptor::value`]).
    value: Option<String>,
    pub(super) rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    pub(super) descriptors: DescriptorList,
    #[serde(default)]
    pub(super) shadow_mode: bool,
    #[serde(default)]
    pub(super) detailed_metric: bool,
    /// The values matched by this wildcard share one counter.
    #[serde(default)]
    pub(super) share_threshold: bool,
    // Accepted so that envoyproxy/ratelimit's files load, and typed so that a wrong one is
    // refused; sluicegate does not act on them yet. `quota_mode` would let a request over
    // the limit through unless every quota-mode descriptor of it is over: not acted on, the
    // limit refuses as any other (stricter, never looser); `metadata`
    // would go into the answer's dynamic metadata (envoy's RESPONSE_DYNAMIC_METADATA);
    // `value_to_metric` would name the request's values in metric names.
    #[serde(default, rename = "quota_mode")]
    _quota_mode: bool,
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: bool,
    #[serde(default, rename = "metadata")]
    _metadata: Option<IgnoredAny>,
}

impl RawDescriptor {
    /// The value to match, if any: an empty one is none, as envoyproxy/ratelimit reads it.
    pub(super) fn value(&self) -> Option<&str> {
        self.value.as_deref().filter(|v| !v.is_empty())
    }
}

/// A `rate_limit`, validated as it is read so that errors carry the line.
#[derive(Deserialize)]
#[serde(try_from = "RateLimitFields")]
pub(super) struct RawRateLimit {
    /// `None` for `unlimited: true` and for a block.
    pub(super) spec: Option<RuleSpec>,
    /// Whether `algorithm` was written; if not, the server's default applies.
    pub(super) algorithm_given: bool,
    /// A block (`requests_per_unit: 0`, or a `unit` without `requests_per_unit`): its
    /// window, in µs.
    pub(super) block_window: Option<u64>,
    pub(super) name: Option<String>,
    pub(super) replaces: Vec<String>,
    pub(super) on_store_error: Option<FailurePolicy>,
    /// `lease: k` and `lease_for`: k units of a key taken from the store at once, spent
    /// within `lease_for` (docs/SPEC.md, "Leases").
    pub(super) lease: Option<(u64, Option<Duration>)>,
    /// `usage: true`: its descriptors may carry a mode and a request id (docs/SPEC.md,
    /// "Envoy compatibility: counting").
    pub(super) usage: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Replace {
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitFields {
    unit: Option<String>,
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    algorithm: Option<String>,
    window: Option<String>,
    burst: Option<u64>,
    buckets: Option<u64>,
    queue: Option<u64>,
    layout: Option<String>,
    on_store_error: Option<String>,
    lease: Option<u64>,
    lease_for: Option<String>,
    #[serde(default)]
    replaces: Vec<Replace>,
    usage: Option<bool>,
}

impl TryFrom<RateLimitFields> for RawRateLimit {
    type Error = String;

    fn try_from(mut f: RateLimitFields) -> Result<Self, String> {
        // An empty name is none: envoyproxy/ratelimit replaces only a limit whose name is
        // not empty (envoyproxy/ratelimit@f2fb157 src/service/ratelimit.go:170), and Envoy
        // Gateway writes `name: ""` on every limit it does not name.
        f.name = f.name.filter(|name| !name.is_empty());
        let replaces = replaces(std::mem::take(&mut f.replaces), f.name.as_deref())?;
        if let Some(n) = f.requests_per_unit.filter(|n| *n > u64::from(u32::MAX)) {
            // envoyproxy/ratelimit reads it as a uint32 and refuses a larger number.
            return Err(format!(
                "rate_limit.requests_per_unit: {n} is more than {}",
                u32::MAX
            ));
        }
        if f.unlimited {
            return unlimited(f, replaces);
        }
        let lease_for = f
            .lease_for
            .as_deref()
            .map(|d| parse_duration(d).map_err(|e| format!("rate_limit.lease_for: {e}")))
            .transpose()?
            .map(Duration::from_micros);
        let lease = match (f.lease, lease_for) {
            (Some(units), spend_within) => Some((units, spend_within)),
            (None, Some(_)) => {
                return Err("rate_limit.lease_for: applies only beside a lease".into());
            }
            (None, None) => None,
        };
        let window = match (&f.unit, &f.window) {
            (Some(_), Some(_)) => {
                return Err("rate_limit.window: give either unit or window, not both".into());
            }
            (None, None) => return Err("rate_limit.unit: required (or give a window)".into()),
            (Some(unit), None) => unit_micros(unit)?,
            (None, Some(window)) => {
                parse_duration(window).map_err(|e| format!("rate_limit.window: {e}"))?
            }
        };
        // envoyproxy/ratelimit: zero requests per unit, or a unit without any, refuses
        // everything (a block list). A `window` is sluicegate's and wants its number.
        let limit = match f.requests_per_unit {
            None if f.window.is_some() => {
                return Err(
                    "rate_limit.requests_per_unit: required beside a window (0 blocks)".into(),
                );
            }
            None | Some(0) if f.usage.is_some() => {
                return Err(
                    "rate_limit.usage: a block (no requests_per_unit) takes no usage".into(),
                );
            }
            None | Some(0) if lease.is_some() => {
                return Err(
                    "rate_limit.lease: a block (no requests_per_unit) takes no lease".into(),
                );
            }
            None | Some(0) => {
                return Ok(RawRateLimit {
                    spec: None,
                    algorithm_given: false,
                    block_window: Some(window),
                    name: f.name,
                    replaces,
                    on_store_error: None,
                    lease: None,
                    usage: false,
                });
            }
            Some(limit) => limit,
        };
        let algorithm_given = f.algorithm.is_some();
        let algorithm = match f.algorithm {
            Some(name) => name
                .parse::<Algorithm>()
                .map_err(|e| format!("rate_limit.{e}"))?,
            None => DEFAULT_ALGORITHM,
        };
        let layout = f
            .layout
            .map(|l| l.parse::<LogLayout>())
            .transpose()
            .map_err(|e| format!("rate_limit.{e}"))?;
        let on_store_error = f
            .on_store_error
            .map(|p| p.parse::<FailurePolicy>())
            .transpose()
            .map_err(|e| format!("rate_limit.on_store_error: {e}"))?;
        let spec = RuleSpec {
            buckets: f.buckets,
            burst: f.burst,
            queue: f.queue,
            layout,
            ..RuleSpec::new(algorithm, limit, Duration::from_micros(window))
        };
        // Built once here for its errors, which then carry this mapping's line; the tree
        // builds the named rule again. A rule without an algorithm is checked there, under
        // the server's default (its error names the descriptor path, not the line).
        if algorithm_given {
            Rule::new("check", &spec)
                .and_then(|rule| with_lease(rule, lease))
                .map_err(|e| format!("rate_limit.{e}"))?;
        }
        Ok(RawRateLimit {
            spec: Some(spec),
            algorithm_given,
            block_window: None,
            name: f.name,
            replaces,
            on_store_error,
            lease,
            usage: f.usage.unwrap_or(false),
        })
    }
}

/// `rule` with the `lease` a `rate_limit` gives it, if any.
pub(super) fn with_lease(
    rule: Rule,
    lease: Option<(u64, Option<Duration>)>,
) -> Result<Rule, RuleError> {
    match lease {
        Some((units, spend_within)) => rule.with_lease(units, spend_within),
        None => Ok(rule),
    }
}

/// `unlimited: true`: no unit (as envoyproxy/ratelimit, which ignores a
/// `requests_per_unit` beside it, and a unit it does not know), and none of sluicegate's
/// algorithm fields.
fn unlimited(f: RateLimitFields, replaces: Vec<String>) -> Result<RawRateLimit, String> {
    if f.unit.as_deref().is_some_and(|u| unit_micros(u).is_ok()) {
        return Err("rate_limit.unit: an unlimited rate_limit takes no unit".into());
    }
    let extra = [
        ("algorithm", f.algorithm.is_some()),
        ("window", f.window.is_some()),
        ("burst", f.burst.is_some()),
        ("buckets", f.buckets.is_some()),
        ("queue", f.queue.is_some()),
        ("layout", f.layout.is_some()),
        ("on_store_error", f.on_store_error.is_some()),
        ("lease", f.lease.is_some()),
        ("lease_for", f.lease_for.is_some()),
        ("usage", f.usage.is_some()),
    ];
    if let Some((field, _)) = extra.iter().find(|(_, set)| *set) {
        return Err(format!(
            "rate_limit.{field}: an unlimited rate_limit takes no {field}"
        ));
    }
    Ok(RawRateLimit {
        spec: None,
        algorithm_given: false,
        block_window: None,
        name: f.name,
        replaces,
        on_store_error: None,
        lease: None,
        usage: false,
    })
}

/// The names a `rate_limit` replaces: none empty, none its own (envoyproxy/ratelimit
/// refuses both).
fn replaces(replaces: Vec<Replace>, own: Option<&str>) -> Result<Vec<String>, String> {
    replaces
        .into_iter()
        .enumerate()
        .map(|(i, r)| match r.name {
            Some(name) if own == Some(name.as_str()) => Err(format!(
                "rate_limit.replaces[{i}].name: {name:?} is this rate_limit's own name"
            )),
            Some(name) if !name.is_empty() => Ok(name),
            _ => Err(format!("rate_limit.replaces[{i}].name: must not be empty")),
        })
        .collect()
}

/// A `unit` in µs, as envoyproxy/ratelimit's `UnitToDivider` (`src/utils/utilities.go`)
/// counts it: a month is 30 days, a year 365; any case.
fn unit_micros(unit: &str) -> Result<u64, String> {
    let seconds = match unit.to_ascii_lowercase().as_str() {
        "second" => 1,
        "minute" => 60,
        "hour" => 3_600,
        "day" => 86_400,
        "week" => 7 * 86_400,
        "month" => 30 * 86_400,
        "year" => 365 * 86_400,
        _ => {
            return Err(format!(
                "rate_limit.unit: unknown unit {unit:?}; expected second, minute, hour, day, \
                 week, month or year (or give a window such as 90s)"
            ));
        }
    };
    Ok(seconds * 1_000_000)
}
