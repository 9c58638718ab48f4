//! The YAML as written: serde's view of a descriptor file, each `rate_limit` validated
//! as it is read so that an error carries its line.

use serde::Deserialize;
use sluicegate::duration::parse_duration;
use sluicegate::{Algorithm, FailurePolicy, LogLayout, Rule, RuleSpec};

/// The algorithm of a `rate_limit` that names none, unless the server is told another
/// (`--default-algorithm`; `fixed-window` reproduces envoyproxy/ratelimit exactly).
pub(crate) const DEFAULT_ALGORITHM: Algorithm = Algorithm::SlidingLog;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) domain: String,
    #[serde(default)]
    pub(super) descriptors: DescriptorList,
}

#[derive(Deserialize, Default)]
pub(super) struct DescriptorList(pub(super) Vec<RawDescriptor>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDescriptor {
    pub(super) key: String,
    pub(super) value: Option<String>,
    pub(super) rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    pub(super) descriptors: DescriptorList,
    #[serde(default)]
    pub(super) shadow_mode: bool,
    #[serde(default)]
    pub(super) detailed_metric: bool,
}

/// A `rate_limit`, validated as it is read so that errors carry the line.
#[derive(Deserialize)]
#[serde(try_from = "RateLimitFields")]
pub(super) struct RawRateLimit {
    /// `None` for `unlimited: true` and `requests_per_unit: 0`.
    pub(super) spec: Option<RuleSpec>,
    /// Whether `algorithm` was written; if not, the server's default applies.
    pub(super) algorithm_given: bool,
    pub(super) blocked: bool,
    /// A block's `unit` in µs, when it names one: what its answers report.
    pub(super) block_window: Option<u64>,
    pub(super) name: Option<String>,
    pub(super) replaces: Vec<String>,
    pub(super) on_store_error: Option<FailurePolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Replace {
    name: String,
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
    #[serde(default)]
    replaces: Vec<Replace>,
}

impl TryFrom<RateLimitFields> for RawRateLimit {
    type Error = String;

    fn try_from(f: RateLimitFields) -> Result<Self, String> {
        if f.unlimited {
            let extra = [
                ("unit", f.unit.is_some()),
                ("requests_per_unit", f.requests_per_unit.is_some()),
                ("algorithm", f.algorithm.is_some()),
                ("window", f.window.is_some()),
                ("burst", f.burst.is_some()),
                ("buckets", f.buckets.is_some()),
                ("queue", f.queue.is_some()),
                ("layout", f.layout.is_some()),
                ("on_store_error", f.on_store_error.is_some()),
            ];
            if let Some((field, _)) = extra.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "rate_limit.{field}: an unlimited rate_limit takes no {field}"
                ));
            }
            return Ok(RawRateLimit {
                spec: None,
                algorithm_given: false,
                blocked: false,
                block_window: None,
                name: f.name,
                replaces: f.replaces.into_iter().map(|r| r.name).collect(),
                on_store_error: None,
            });
        }
        // envoyproxy/ratelimit: zero requests per unit refuses everything (a block list).
        if f.requests_per_unit == Some(0) {
            return Ok(RawRateLimit {
                spec: None,
                algorithm_given: false,
                blocked: true,
                block_window: f.unit.as_deref().map(unit_micros).transpose()?,
                name: f.name,
                replaces: f.replaces.into_iter().map(|r| r.name).collect(),
                on_store_error: None,
            });
        }
        let limit = f
            .requests_per_unit
            .ok_or("rate_limit.requests_per_unit: required (or set unlimited: true)")?;
        let window = match (f.unit, f.window) {
            (Some(_), Some(_)) => {
                return Err("rate_limit.window: give either unit or window, not both".into());
            }
            (None, None) => return Err("rate_limit.unit: required (or give a window)".into()),
            (Some(unit), None) => unit_micros(&unit)?,
            (None, Some(window)) => {
                parse_duration(&window).map_err(|e| format!("rate_limit.window: {e}"))?
            }
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
            ..RuleSpec::new(algorithm, limit, window)
        };
        // Built once here for its errors, which then carry this mapping's line; the tree
        // builds the named rule again. A rule without an algorithm is checked there, under
        // the server's default (its error names the descriptor path, not the line).
        if algorithm_given {
            Rule::new("check", &spec).map_err(|e| format!("rate_limit.{e}"))?;
        }
        Ok(RawRateLimit {
            spec: Some(spec),
            algorithm_given,
            blocked: false,
            block_window: None,
            name: f.name,
            replaces: f.replaces.into_iter().map(|r| r.name).collect(),
            on_store_error,
        })
    }
}

fn unit_micros(unit: &str) -> Result<u64, String> {
    let seconds = match unit.to_ascii_lowercase().as_str() {
        "second" => 1,
        "minute" => 60,
        "hour" => 3_600,
        "day" => 86_400,
        _ => {
            return Err(format!(
                "rate_limit.unit: unknown unit {unit:?}; expected second, minute, hour or day \
                 (or give a window such as 90s)"
            ));
        }
    };
    Ok(seconds * 1_000_000)
}
