//! The names envoy's statistics take in `/metrics`: a mapping in statsd_exporter's format,
//! as envoyproxy/ratelimit's Prometheus sink reads it (src/stats/prom/prometheus_sink.go):
//! its own default (`envoy_mapping.yaml`), or the file PROMETHEUS_MAPPER_YAML names
//! (`--prometheus-mapper`).
//!
//! The part of the format honoured is what a mapping of these statistics can ask: `match`
//! (glob, or `match_type: regex`), `name` and `labels` with `$n` captures, `help`,
//! `match_metric_type`, `action: drop`, and for the response time a histogram (`timer_type`
//! or `observer_type: histogram`, `scale`, `histogram_options.buckets`). As in
//! statsd_exporter, glob mappings are tried first, then regular expressions, each in file
//! order, and the first that matches decides; a statistic none matches keeps its statsd
//! name with every character but letters, digits and `_` made `_`. Anything else — a
//! summary, a TTL, defaults, an unknown field, a glob that matches no statistic the
//! service exports — stops the start with the file and the mapping named.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde::Deserialize;

use super::envoy::{CounterStat, EXPORTED, RESPONSE_TIME, ResponseTimes, StatKind};

/// envoyproxy/ratelimit's default mapping.
const ENVOY_MAPPING: &str = include_str!("envoy_mapping.yaml");

/// statsd_exporter's histogram buckets when a mapping names none (Prometheus' defaults).
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A mapping file, checked and compiled.
#[derive(Debug)]
pub struct PrometheusMapping {
    /// Glob mappings, then regular expressions, each in file order.
    mappings: Vec<Mapping>,
    /// What becomes of the response time: fixed at load, so the histogram's buckets are.
    response_time: Mapped,
}

#[derive(Debug)]
struct Mapping {
    matcher: Regex,
    kind: Option<StatKind>,
    action: Action,
    help: Option<String>,
}

#[derive(Clone, Debug)]
enum Action {
    Drop,
    Map {
        name: String,
        labels: Vec<(String, String)>,
        histogram: Option<Histogram>,
    },
}

/// How a timer's samples are written.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Histogram {
    scale: f64,
    buckets: Vec<f64>,
}

/// What a mapping makes of one statistic.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Mapped {
    /// Not written.
    Dropped,
    /// Written as this series; a timer as this histogram, or, with none, as a summary of
    /// its sum and count.
    Series {
        name: String,
        labels: Vec<(String, String)>,
        help: Option<String>,
        histogram: Option<Histogram>,
    },
}

/// A mapping file as statsd_exporter's YAML has it; fields this reader does not know are
/// refused by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    mappings: Vec<RawMapping>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMapping {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    help: Option<String>,
    #[serde(default)]
    match_type: Option<String>,
    #[serde(default)]
    match_metric_type: Option<String>,
    #[serde(default)]
    timer_type: Option<String>,
    #[serde(default)]
    observer_type: Option<String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    scale: Option<f64>,
    #[serde(default)]
    histogram_options: Option<RawHistogramOptions>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHistogramOptions {
    buckets: Vec<f64>,
}

/// envoy's default mapping, and the same without the response time's scale
/// (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS); each built when first asked for, as a
/// process uses one of them and each holds its compiled expressions (about 0.5 MB).
static ENVOY_DEFAULTS: [LazyLock<Arc<PrometheusMapping>>; 2] = [
    LazyLock::new(|| envoy_default_from(ENVOY_MAPPING)),
    LazyLock::new(|| envoy_default_from(&ENVOY_MAPPING.replacen("    scale: 0.001\n", "", 1))),
];

fn envoy_default_from(text: &str) -> Arc<PrometheusMapping> {
    Arc::new(
        PrometheusMapping::parse(text)
            .unwrap_or_else(|e| panic!("envoy_mapping.yaml does not load: {e}")),
    )
}

impl PrometheusMapping {
    /// envoyproxy/ratelimit's default mapping; with `response_time_ms`, its response time
    /// in milliseconds rather than seconds, as its PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS
    /// has it.
    pub fn envoy_default(response_time_ms: bool) -> Arc<PrometheusMapping> {
        Arc::clone(&ENVOY_DEFAULTS[usize::from(response_time_ms)])
    }

    /// The mapping in the file at `path`. A file that is not there is no mapping at all —
    /// every statistic keeps its statsd name — as envoyproxy/ratelimit reads it (its sink
    /// ignores the error), so a deployment whose ConfigMap is optional and absent starts;
    /// it is logged. A file that does not read as a mapping the service can honour is an
    /// error naming it.
    pub fn load(path: &Path) -> anyhow::Result<Arc<PrometheusMapping>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(
                    file = %path.display(),
                    "--prometheus-mapper: no such file; envoy's statistics keep their statsd \
                     names in /metrics, as envoyproxy/ratelimit writes them without a mapping"
                );
                return Ok(Arc::new(
                    PrometheusMapping::parse("mappings: []").map_err(anyhow::Error::msg)?,
                ));
            }
            Err(e) => anyhow::bail!("--prometheus-mapper {}: {e}", path.display()),
        };
        PrometheusMapping::parse(&text)
            .map(Arc::new)
            .map_err(|e| anyhow::anyhow!("--prometheus-mapper {}: {e}", path.display()))
    }

    /// The mapping `text` holds.
    fn parse(text: &str) -> Result<PrometheusMapping, String> {
        let raw: RawFile = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let mut globs = Vec::new();
        let mut regexes = Vec::new();
        for (i, raw) in raw.mappings.into_iter().enumerate() {
            let pattern = raw.pattern.clone();
            let (mapping, glob) = Mapping::build(raw)
                .map_err(|e| format!("mapping {} (match {pattern:?}): {e}", i + 1))?;
            if glob { &mut globs } else { &mut regexes }.push(mapping);
        }
        globs.append(&mut regexes);
        let mut mapping = PrometheusMapping {
            mappings: globs,
            response_time: Mapped::Dropped,
        };
        mapping.response_time = mapping.map(RESPONSE_TIME, StatKind::Observer);
        Ok(mapping)
    }

    /// What becomes of the statistic `name` of kind `kind`.
    pub(crate) fn map(&self, name: &str, kind: StatKind) -> Mapped {
        for mapping in &self.mappings {
            if mapping.kind.is_some_and(|k| k != kind) {
                continue;
            }
            let Some(captures) = mapping.matcher.captures(name) else {
                continue;
            };
            return match &mapping.action {
                Action::Drop => Mapped::Dropped,
                Action::Map {
                    name,
                    labels,
                    histogram,
                } => {
                    let expand = |template: &str| {
                        let mut out = String::new();
                        captures.expand(template, &mut out);
                        out
                    };
                    Mapped::Series {
                        name: escape_name(&expand(name), true),
                        labels: labels.iter().map(|(k, v)| (k.clone(), expand(v))).collect(),
                        help: mapping.help.clone(),
                        histogram: histogram.clone(),
                    }
                }
            };
        }
        Mapped::Series {
            name: escape_name(name, false),
            labels: Vec::new(),
            help: None,
            histogram: None,
        }
    }

    /// The whole milliseconds the response-time histogram's buckets fall on: a time of
    /// `t` ms is in a bucket of upper bound `b` when `t × scale ≤ b`.
    pub(crate) fn response_time_thresholds(&self) -> Vec<u64> {
        match &self.response_time {
            Mapped::Series {
                histogram: Some(h), ..
            } => h
                .buckets
                .iter()
                .filter_map(|&b| threshold(b, h.scale))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// `counters` and the response times in Prometheus' text format, under the names and
    /// labels this mapping gives them; counters it maps to one series are added up.
    pub(crate) fn render(&self, counters: &[CounterStat], times: &ResponseTimes, out: &mut String) {
        let mut families: BTreeMap<String, (String, BTreeMap<String, u64>)> = BTreeMap::new();
        for stat in counters {
            let Mapped::Series {
                name, labels, help, ..
            } = self.map(&stat.name, StatKind::Counter)
            else {
                continue;
            };
            let family = families.entry(name).or_insert_with(|| {
                (
                    help.unwrap_or_else(|| format!("{}.", stat.help)),
                    BTreeMap::new(),
                )
            });
            *family.1.entry(label_text(&labels, None)).or_default() += stat.value;
        }
        for (name, (help, series)) in &families {
            let help = escape_help(help);
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in series {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        }
        let Mapped::Series {
            name,
            labels,
            help,
            histogram,
        } = &self.response_time
        else {
            return;
        };
        let help = escape_help(help.as_deref().unwrap_or("ShouldRateLimit response times."));
        let count = times.count();
        match histogram {
            Some(h) => {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
                for &bound in &h.buckets {
                    let within = threshold(bound, h.scale).map_or(0, |t| times.at_most(t));
                    let le = label_text(labels, Some(&bound.to_string()));
                    let _ = writeln!(out, "{name}_bucket{le} {within}");
                }
                let le = label_text(labels, Some("+Inf"));
                let _ = writeln!(out, "{name}_bucket{le} {count}");
                let sum = times.sum_ms() as f64 * h.scale;
                let labels = label_text(labels, None);
                let _ = writeln!(
                    out,
                    "{name}_sum{labels} {sum}\n{name}_count{labels} {count}"
                );
            }
            None => {
                let labels = label_text(labels, None);
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} summary\n{name}_sum{labels} {}\n\
                     {name}_count{labels} {count}",
                    times.sum_ms()
                );
            }
        }
    }
}

impl Mapping {
    /// The mapping `raw` asks for, and whether it is a glob; or what the service cannot
    /// honour in it.
    fn build(raw: RawMapping) -> Result<(Mapping, bool), String> {
        let glob = match raw.match_type.as_deref() {
            None | Some("glob") => true,
            Some("regex") => false,
            Some(other) => return Err(format!("match_type {other:?} is neither glob nor regex")),
        };
        let matcher = if glob {
            glob_regex(&raw.pattern)
        } else {
            Regex::new(&raw.pattern).map_err(|e| format!("not a regular expression: {e}"))?
        };
        let kind = match raw.match_metric_type.as_deref() {
            None => None,
            Some("counter") => Some(StatKind::Counter),
            Some("observer" | "timer") => Some(StatKind::Observer),
            Some("gauge") => {
                return Err("match_metric_type gauge: the service exports no gauges".to_owned());
            }
            Some(other) => return Err(format!("match_metric_type {other:?} is unknown")),
        };
        let asks = |shape: &str, k: StatKind| {
            kind.is_none_or(|kind| kind == k) && glob_may_match(&raw.pattern, shape)
        };
        if glob && !EXPORTED.iter().any(|&(shape, k)| asks(shape, k)) {
            return Err(format!(
                "matches none of the statistics the service exports ({})",
                EXPORTED.map(|(shape, _)| shape).join(", ")
            ));
        }
        let observes =
            kind.is_none_or(|k| k == StatKind::Observer) && matcher.is_match(RESPONSE_TIME);
        let action = match raw.action.as_deref() {
            Some("drop") => Action::Drop,
            None | Some("map") => {
                let name = raw
                    .name
                    .ok_or("a mapping that is not dropped needs a name")?;
                if !valid_name(&name, true) {
                    return Err(format!("name {name:?} is not a Prometheus metric name"));
                }
                let labels = raw
                    .labels
                    .into_iter()
                    .map(|(label, value)| {
                        if valid_name(&label, false) && !label.starts_with("__") {
                            Ok((label, value))
                        } else {
                            Err(format!("label {label:?} is not a Prometheus label name"))
                        }
                    })
                    .collect::<Result<_, _>>()?;
                let histogram = histogram(
                    raw.timer_type,
                    raw.observer_type,
                    raw.scale,
                    raw.histogram_options,
                    observes,
                )?;
                Action::Map {
                    name,
                    labels,
                    histogram,
                }
            }
            Some(other) => return Err(format!("action {other:?} is neither map nor drop")),
        };
        let mapping = Mapping {
            matcher,
            kind,
            action,
            help: raw.help,
        };
        Ok((mapping, glob))
    }
}

/// A mapping's histogram for a timer, or `None` where it maps no timer; what it asks and
/// cannot be written (a summary) is an error.
fn histogram(
    timer_type: Option<String>,
    observer_type: Option<String>,
    scale: Option<f64>,
    options: Option<RawHistogramOptions>,
    observes: bool,
) -> Result<Option<Histogram>, String> {
    let kind = match (timer_type, observer_type) {
        (Some(_), Some(_)) => return Err("timer_type and observer_type both set".to_owned()),
        (kind, None) | (None, kind) => kind,
    };
    if let Some(scale) = scale
        && !(scale.is_finite() && scale > 0.0)
    {
        return Err(format!("scale {scale} is not a number above 0"));
    }
    let buckets = match options {
        Some(options) => {
            let sorted = options.buckets.windows(2).all(|w| w[0] < w[1]);
            if options.buckets.is_empty()
                || !sorted
                || options.buckets.iter().any(|b| !b.is_finite())
            {
                return Err(
                    "histogram_options.buckets must be finite numbers in ascending order"
                        .to_owned(),
                );
            }
            options.buckets
        }
        None => DEFAULT_BUCKETS.to_vec(),
    };
    match kind.as_deref() {
        Some("histogram") if observes => Ok(Some(Histogram {
            scale: scale.unwrap_or(1.0),
            buckets,
        })),
        Some(other) if observes => Err(format!(
            "the response time can be written as a histogram only, not {other:?}: set timer_type: histogram"
        )),
        Some("histogram") => Ok(None),
        None if observes => Err(
            "maps the response time as statsd_exporter's default summary, which the service \
             does not write: set timer_type: histogram"
                .to_owned(),
        ),
        _ => Ok(None),
    }
}

/// The largest whole number of milliseconds `t` with `t × scale ≤ bound`, in the floating
/// point statsd_exporter compares in; `None` if not even 0 is.
fn threshold(bound: f64, scale: f64) -> Option<u64> {
    if bound < 0.0 {
        return None;
    }
    let mut t = (bound / scale).floor().min(u64::MAX as f64) as u64;
    while t > 0 && t as f64 * scale > bound {
        t -= 1;
    }
    while (t + 1) as f64 * scale <= bound && t < u64::MAX {
        t += 1;
    }
    Some(t)
}

/// A glob as a regular expression: `*` is any run of characters without a dot, the rest
/// is literal, and the whole name must match.
fn glob_regex(glob: &str) -> Regex {
    let parts: Vec<String> = glob.split('*').map(regex::escape).collect();
    Regex::new(&format!("^{}$", parts.join("([^.]*)"))).expect("an escaped glob compiles")
}

/// Whether the glob `pattern` matches some name of `shape` (one of [`EXPORTED`]), whose
/// `{key}` stands for two or more dot-separated parts of any text.
fn glob_may_match(pattern: &str, shape: &str) -> bool {
    let parts: Vec<&str> = pattern.split('.').collect();
    let part_matches = |glob: &str, text: &str| glob_regex(glob).is_match(text);
    match shape.split_once("{key}") {
        None => {
            let fixed: Vec<&str> = shape.split('.').collect();
            parts.len() == fixed.len() && parts.iter().zip(&fixed).all(|(g, t)| part_matches(g, t))
        }
        Some((prefix, suffix)) => {
            let prefix: Vec<&str> = prefix.trim_end_matches('.').split('.').collect();
            let suffix: Vec<&str> = suffix.trim_start_matches('.').split('.').collect();
            parts.len() >= prefix.len() + 2 + suffix.len()
                && parts.iter().zip(&prefix).all(|(g, t)| part_matches(g, t))
                && parts
                    .iter()
                    .rev()
                    .zip(suffix.iter().rev())
                    .all(|(g, t)| part_matches(g, t))
        }
    }
}

/// Whether `name` is a Prometheus metric name (`metric`) or label name, `$n` and `${n}`
/// capture references allowed.
fn valid_name(name: &str, metric: bool) -> bool {
    let plain = Regex::new(r"\$\{?\d+\}?")
        .expect("a fixed expression")
        .replace_all(name, "x");
    let mut chars = plain.chars();
    let first_ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (metric && c == ':');
    chars.next().is_some_and(first_ok)
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (metric && c == ':'))
}

/// A name as statsd_exporter escapes one no mapping takes: every character but letters,
/// digits and `_` made `_`, and `_` before a leading digit. A mapped name keeps its `:`s,
/// which Prometheus allows and a mapping may ask for.
fn escape_name(name: &str, mapped: bool) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || (mapped && c == ':') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// `{a="1",b="2"}` (and `le` last when given), or nothing without labels.
fn label_text(labels: &[(String, String)], le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// A `# HELP` text as the text format writes it.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A label value as the text format writes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, labels: &[(&str, &str)]) -> Mapped {
        Mapped::Series {
            name: name.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            help: None,
            histogram: None,
        }
    }

    /// envoy's default mapping: a limit of one key part is domain and key1, of two or more
    /// domain, key1 and key2 (deeper parts dropped), the service's own as named there.
    #[test]
    fn envoys_default_names_envoys_statistics() {
        let m = PrometheusMapping::envoy_default(false);
        let counter = |name| m.map(name, StatKind::Counter);
        assert_eq!(
            counter("ratelimit.service.rate_limit.d.key_v.total_hits"),
            series(
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "d"), ("key1", "key_v")]
            )
        );
        assert_eq!(
            counter("ratelimit.service.rate_limit.d.a.b_c.e.near_limit"),
            series(
                "ratelimit_service_rate_limit_near_limit",
                &[("domain", "d"), ("key1", "a"), ("key2", "b_c")]
            )
        );
        assert_eq!(
            counter("ratelimit.service.call.should_rate_limit.redis_error"),
            series(
                "ratelimit_service_should_rate_limit_error",
                &[("err_type", "redis_error")]
            )
        );
        assert_eq!(
            counter("ratelimit_server.ShouldRateLimit.total_requests"),
            series(
                "ratelimit_service_total_requests",
                &[("grpc_method", "ShouldRateLimit")]
            )
        );
        // Seconds by default (scale 0.001): 5 ms is in the 0.005 bucket; in milliseconds,
        // the buckets are milliseconds.
        assert_eq!(m.response_time_thresholds()[..3], [5, 10, 25]);
        let ms = PrometheusMapping::envoy_default(true);
        assert_eq!(ms.response_time_thresholds()[..8], [0, 0, 0, 0, 0, 0, 0, 1]);
    }

    /// A statistic no mapping takes keeps its statsd name, escaped (an empty mapping: the
    /// PROMETHEUS_MAPPER_YAML file missing).
    #[test]
    fn unmapped_statistics_keep_their_statsd_names() {
        let m = PrometheusMapping::parse("mappings: []").unwrap();
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.d.k-v.over_limit",
                StatKind::Counter
            ),
            series("ratelimit_service_rate_limit_d_k_v_over_limit", &[])
        );
    }

    #[test]
    fn envoy_gateways_mapping_is_accepted() {
        let text = include_str!("../../tests/fixtures/envoy-gateway/deployments/statsd_conf.yaml");
        let m = PrometheusMapping::parse(text).unwrap();
        // Without envoy's scale: milliseconds in the `_seconds` histogram, as EG has it.
        assert_eq!(m.response_time_thresholds()[7..], [1, 2, 5, 10]);
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let refused = |yaml: &str| PrometheusMapping::parse(yaml).unwrap_err();
        let m = |rest: &str| {
            format!(
                "mappings:\n  - match: \"ratelimit.service.rate_limit.*.*.total_hits\"\n    name: hits\n{rest}"
            )
        };
        for (yaml, says) in [
            (m("    ttl: 1m\n"), "unknown field `ttl`"),
            (m("    match_type: fuzzy\n"), "match_type \"fuzzy\""),
            (m("    action: keep\n"), "action \"keep\""),
            (m("    match_metric_type: gauge\n"), "exports no gauges"),
            (m("    labels: {\"bad-label\": $1}\n"), "label \"bad-label\""),
            (
                "mappings:\n  - match: ratelimit.redis_pool.*\n    name: pool\n".to_owned(),
                "mapping 1 (match \"ratelimit.redis_pool.*\"): matches none",
            ),
            (
                "mappings:\n  - match: ratelimit_server.*.response_time\n    name: rt\n".to_owned(),
                "default summary",
            ),
            (
                "mappings:\n  - match: ratelimit_server.*.response_time\n    name: rt\n    timer_type: summary\n".to_owned(),
                "histogram only",
            ),
            (
                "mappings:\n  - match: \"(\"\n    match_type: regex\n    name: x\n".to_owned(),
                "not a regular expression",
            ),
            ("defaults: {}\nmappings: []\n".to_owned(), "unknown field `defaults`"),
            (
                "mappings:\n  - match: ratelimit.service.config_load_success\n    name: \"1x\"\n".to_owned(),
                "not a Prometheus metric name",
            ),
        ] {
            let error = refused(&yaml);
            assert!(error.contains(says), "{yaml}: {error}");
        }
    }

    /// Counters mapped to one series are added up; a dropped one is not written; the
    /// histogram's buckets count in scaled units.
    #[test]
    fn renders_mapped_series() {
        let m = PrometheusMapping::parse(
            "mappings:
  - match: ratelimit.service.rate_limit.*.*.*
    name: hits_$3
    labels: {domain: $1}
  - match: ratelimit.service.config_load_error
    action: drop
  - match: ratelimit_server.*.response_time
    name: rt_seconds
    timer_type: histogram
    scale: 0.001
    histogram_options: {buckets: [0.001, 0.01]}
    labels: {method: $1}
",
        )
        .unwrap();
        let stat = |name: &str, value| CounterStat {
            name: name.to_owned(),
            help: "Hits",
            value,
        };
        let metrics = super::super::envoy::EnvoyMetrics::new(m.response_time_thresholds());
        for ms in [0, 1, 3, 20] {
            metrics.grpc_answered(std::time::Duration::from_millis(ms), None);
        }
        let mut out = String::new();
        m.render(
            &[
                stat("ratelimit.service.rate_limit.d.a.total_hits", 2),
                stat("ratelimit.service.rate_limit.d.b.total_hits", 3),
                stat("ratelimit.service.config_load_error", 1),
            ],
            metrics.response_times(),
            &mut out,
        );
        for line in [
            "# TYPE hits_total_hits counter\nhits_total_hits{domain=\"d\"} 5\n",
            "rt_seconds_bucket{method=\"ShouldRateLimit\",le=\"0.001\"} 2\n",
            "rt_seconds_bucket{method=\"ShouldRateLimit\",le=\"0.01\"} 3\n",
            "rt_seconds_bucket{method=\"ShouldRateLimit\",le=\"+Inf\"} 4\n",
            "rt_seconds_count{method=\"ShouldRateLimit\"} 4\n",
        ] {
            assert!(out.contains(line), "{line} not in\n{out}");
        }
        assert!(!out.contains("config_load_error"), "{out}");
    }
}
