//! The descriptor configuration: envoyproxy/ratelimit's YAML format (`domain`, nested
//! `descriptors` with `key`, optional `value` and `rate_limit`), extended with sluicegate's
//! algorithms on `rate_limit`: `algorithm`, `window` (any duration instead of `unit`),
//! `burst`, `buckets`, `queue`, `layout` (zset or compact: a sliding log's Redis layout)
//! and `on_store_error` (error, allow, deny or local: this rule's fallback).
//!
//! Every rule is validated while the file is read, so an error names the file, the line
//! and the field.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluicegate::duration::parse_duration;
use sluicegate::{Algorithm, FailurePolicy, LogLayout, Rule, RuleSpec};

/// The algorithm of a `rate_limit` that names none, unless the server is told another
/// (`--default-algorithm`; `fixed-window` reproduces envoyproxy/ratelimit exactly).
pub(crate) const DEFAULT_ALGORITHM: Algorithm = Algorithm::SlidingLog;

/// A loaded configuration: one descriptor tree per domain.
#[derive(Debug, Default)]
pub(crate) struct Config {
    domains: HashMap<String, DescriptorTree>,
}

/// The children of one level of the tree: matched by key and value first, then by a
/// wildcard value (`prefix*`, the longest prefix first), then by key alone.
#[derive(Debug, Default)]
struct DescriptorTree {
    /// key → value → node.
    by_key_value: HashMap<String, HashMap<String, Node>>,
    /// key → (value prefix, node), longest prefix first.
    by_key_prefix: HashMap<String, Vec<(String, Node)>>,
    by_key: HashMap<String, Node>,
}

#[derive(Debug)]
struct Node {
    limit: Option<ConfiguredLimit>,
    children: DescriptorTree,
}

/// A `rate_limit` of the configuration.
#[derive(Debug)]
pub(crate) struct ConfiguredLimit {
    /// `None` for `unlimited: true` and for `requests_per_unit: 0`.
    pub(crate) rule: Option<Rule>,
    /// `requests_per_unit: 0`: every request over the limit (a block list).
    pub(crate) blocked: bool,
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

impl Config {
    /// Reads one YAML file, or every `.yaml` and `.yml` file of a directory (one domain
    /// each, as envoyproxy/ratelimit reads its runtime directory).
    pub(crate) fn load(path: &Path, default: Algorithm) -> Result<Config, ConfigError> {
        let error = |path: &Path, message: String| ConfigError {
            path: path.to_owned(),
            message,
        };
        let files = Config::files(path).map_err(|e| error(path, format!("cannot read: {e}")))?;
        let mut config = Config::default();
        let mut origin: HashMap<String, PathBuf> = HashMap::new();
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| error(&file, format!("cannot read: {e}")))?;
            for (domain, tree) in Config::parse(&file, &text, default)?.domains {
                if let Some(first) = origin.get(&domain) {
                    return Err(error(
                        &file,
                        format!(
                            "domain: {domain:?} is already defined in {}",
                            first.display()
                        ),
                    ));
                }
                origin.insert(domain.clone(), file.clone());
                config.domains.insert(domain, tree);
            }
        }
        Ok(config)
    }

    /// The files a configuration path stands for, in a stable order.
    pub(crate) fn files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
        if !path.is_dir() {
            return Ok(vec![path.to_owned()]);
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|p| {
                p.is_file()
                    && p.extension().is_some_and(|e| {
                        e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml")
                    })
            })
            .collect();
        files.sort();
        Ok(files)
    }

    /// Parses the YAML `text` of the file at `path` (the path only names it in errors);
    /// a `rate_limit` without an `algorithm` gets `default`.
    pub(crate) fn parse(
        path: &Path,
        text: &str,
        default: Algorithm,
    ) -> Result<Config, ConfigError> {
        let error = |message: String| ConfigError {
            path: path.to_owned(),
            message,
        };
        let file: RawFile = serde_saphyr::from_str(text).map_err(|e| {
            error(
                e.to_string()
                    .replace("<input>", &path.display().to_string()),
            )
        })?;
        if file.domain.is_empty() {
            return Err(error("domain: must not be empty".into()));
        }
        let mut config = Config::default();
        let tree = build_tree(&file.domain, file.descriptors.0, default).map_err(error)?;
        config.domains.insert(file.domain, tree);
        Ok(config)
    }

    /// The limit that applies to one request descriptor, as envoyproxy/ratelimit finds it:
    /// walk the tree entry by entry, preferring an exact `key`+`value` child over a `key`
    /// child; the limit is that of the node reached by the last entry. `Err` for an
    /// unknown domain.
    pub(crate) fn find(
        &self,
        domain: &str,
        entries: &[Entry],
    ) -> Result<Option<&ConfiguredLimit>, UnknownDomain> {
        let mut level = self.domains.get(domain).ok_or(UnknownDomain)?;
        let mut found = None;
        for (i, entry) in entries.iter().enumerate() {
            let exact = level
                .by_key_value
                .get(&entry.key)
                .and_then(|values| values.get(&entry.value));
            let wildcard = || {
                level.by_key_prefix.get(&entry.key).and_then(|nodes| {
                    nodes
                        .iter()
                        .find(|(prefix, _)| entry.value.starts_with(prefix.as_str()))
                        .map(|(_, node)| node)
                })
            };
            let Some(node) = exact
                .or_else(wildcard)
                .or_else(|| level.by_key.get(&entry.key))
            else {
                return Ok(None);
            };
            if i + 1 == entries.len() {
                found = node.limit.as_ref();
            }
            level = &node.children;
        }
        Ok(found)
    }

    /// Every configured limit, for listing.
    pub(crate) fn limits(&self) -> Vec<&ConfiguredLimit> {
        fn walk<'a>(tree: &'a DescriptorTree, out: &mut Vec<&'a ConfiguredLimit>) {
            let exact = tree.by_key_value.values().flat_map(HashMap::values);
            let wildcard = tree.by_key_prefix.values().flatten().map(|(_, node)| node);
            for node in exact.chain(wildcard).chain(tree.by_key.values()) {
                out.extend(node.limit.as_ref());
                walk(&node.children, out);
            }
        }
        let mut out = Vec::new();
        for tree in self.domains.values() {
            walk(tree, &mut out);
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }
}

/// The configuration in force, replaced whole when a reload succeeds.
#[derive(Debug)]
pub(crate) struct LiveConfig(std::sync::RwLock<std::sync::Arc<Config>>);

impl LiveConfig {
    pub(crate) fn new(config: Config) -> Self {
        LiveConfig(std::sync::RwLock::new(std::sync::Arc::new(config)))
    }

    /// The configuration now; a reload does not disturb a request holding it.
    pub(crate) fn current(&self) -> std::sync::Arc<Config> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn replace(&self, config: Config) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = std::sync::Arc::new(config);
    }
}

/// One configuration file as it was seen: path, modification time, length.
pub(crate) type FileStamp = (PathBuf, Option<std::time::SystemTime>, u64);

/// What a configuration path's files look like now, to notice edits.
pub(crate) fn fingerprint(path: &Path) -> Vec<FileStamp> {
    Config::files(path)
        .unwrap_or_default()
        .into_iter()
        .map(|file| {
            let meta = std::fs::metadata(&file).ok();
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            let len = meta.map_or(0, |m| m.len());
            (file, modified, len)
        })
        .collect()
}

/// The request named a domain no configuration file declares.
#[derive(Debug)]
pub(crate) struct UnknownDomain;

fn build_tree(
    prefix: &str,
    descriptors: Vec<RawDescriptor>,
    default: Algorithm,
) -> Result<DescriptorTree, String> {
    let mut tree = DescriptorTree::default();
    for raw in descriptors {
        let path = match &raw.value {
            Some(value) => format!("{prefix}.{}_{value}", raw.key),
            None => format!("{prefix}.{}", raw.key),
        };
        let limit = match raw.rate_limit {
            None => None,
            Some(RawRateLimit {
                spec,
                algorithm_given,
                blocked,
                name,
                replaces,
                on_store_error,
            }) => {
                let rule = spec
                    .map(|mut spec| {
                        if !algorithm_given {
                            spec.algorithm = default;
                        }
                        Rule::new(name.as_deref().unwrap_or(&path), &spec)
                            .map_err(|e| format!("{path}: rate_limit.{e}"))
                            .map(|rule| match on_store_error {
                                Some(policy) => rule.with_failure_policy(policy),
                                None => rule,
                            })
                    })
                    .transpose()?;
                Some(ConfiguredLimit {
                    rule,
                    blocked,
                    path: path.clone(),
                    name,
                    replaces,
                    shadow_mode: raw.shadow_mode,
                    detailed_metric: raw.detailed_metric,
                })
            }
        };
        let node = Node {
            limit,
            children: build_tree(&path, raw.descriptors.0, default)?,
        };
        let duplicate = match raw.value {
            Some(value) if value.ends_with('*') => {
                let prefix = value.trim_end_matches('*').to_owned();
                let nodes = tree.by_key_prefix.entry(raw.key).or_default();
                let duplicate = nodes.iter().any(|(p, _)| *p == prefix);
                nodes.push((prefix, node));
                nodes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
                duplicate
            }
            Some(value) => tree
                .by_key_value
                .entry(raw.key)
                .or_default()
                .insert(value, node)
                .is_some(),
            None => tree.by_key.insert(raw.key, node).is_some(),
        };
        if duplicate {
            return Err(format!("{path}: duplicate descriptor (same key and value)"));
        }
    }
    Ok(tree)
}

/// A configuration that cannot be used: names the file and, where the YAML reader knows
/// them, the line, column and field.
#[derive(Debug)]
pub(crate) struct ConfigError {
    path: PathBuf,
    message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    domain: String,
    #[serde(default)]
    descriptors: DescriptorList,
}

#[derive(Deserialize, Default)]
struct DescriptorList(Vec<RawDescriptor>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: DescriptorList,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
}

/// A `rate_limit`, validated as it is read so that errors carry the line.
#[derive(Deserialize)]
#[serde(try_from = "RateLimitFields")]
struct RawRateLimit {
    /// `None` for `unlimited: true` and `requests_per_unit: 0`.
    spec: Option<RuleSpec>,
    /// Whether `algorithm` was written; if not, the server's default applies.
    algorithm_given: bool,
    blocked: bool,
    name: Option<String>,
    replaces: Vec<String>,
    on_store_error: Option<FailurePolicy>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("limits.yaml"), text, DEFAULT_ALGORITHM)
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
        pairs
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect()
    }

    fn found<'a>(config: &'a Config, pairs: &[(&str, &str)]) -> Option<&'a str> {
        config
            .find("d", &entries(pairs))
            .unwrap()
            .map(|l| l.path.as_str())
    }

    #[test]
    fn most_specific_match_and_nesting() {
        let config = parse(
            "domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: to_cluster
    value: api
    descriptors:
      - key: user
        rate_limit: {window: 90s, requests_per_unit: 5, algorithm: token-bucket, burst: 2}
",
        )
        .unwrap();
        assert_eq!(
            found(&config, &[("remote_address", "10.0.0.1")]),
            Some("d.remote_address_10.0.0.1")
        );
        assert_eq!(
            found(&config, &[("remote_address", "10.0.0.2")]),
            Some("d.remote_address")
        );
        assert_eq!(
            found(&config, &[("to_cluster", "api"), ("user", "bob")]),
            Some("d.to_cluster_api.user")
        );
        // A node without a rate_limit limits nothing; an unknown value matches nothing.
        assert_eq!(found(&config, &[("to_cluster", "api")]), None);
        assert_eq!(
            found(&config, &[("to_cluster", "web"), ("user", "bob")]),
            None
        );
        assert!(config.find("other", &[]).is_err());
        let rule = config
            .find("d", &entries(&[("to_cluster", "api"), ("user", "x")]))
            .unwrap()
            .unwrap()
            .rule
            .clone()
            .unwrap();
        assert_eq!(
            (rule.algorithm(), rule.window(), rule.capacity()),
            (Algorithm::TokenBucket, 90_000_000, 2)
        );
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let cases = [
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n",
                "line 5",
                "rate_limit.unit",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      window: 1d\n      requests_per_unit: 200000000\n      algorithm: sliding-counter\n",
                "line 5",
                "rate_limit.window: window 1d with limit 200000000 exceeds 2^53",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {}\n",
                "line 4",
                "rate_limt",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}\n",
                "line 4",
                "rate_limit.algorithm",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, window: 1s, requests_per_unit: 1}\n",
                "line 4",
                "rate_limit.window",
            ),
        ];
        for (text, line, field) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.starts_with("limits.yaml: "), "{err}");
            assert!(err.contains(line), "{line} in {err}");
            assert!(err.contains(field), "{field} in {err}");
        }
        let dup = parse("domain: d\ndescriptors:\n  - key: a\n  - key: a\n").unwrap_err();
        assert!(
            dup.to_string().contains("d.a: duplicate descriptor"),
            "{dup}"
        );
    }

    #[test]
    fn a_directory_holds_one_domain_per_file() {
        let dir =
            std::env::temp_dir().join(format!("sluicegate-config-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rule =
            "descriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        std::fs::write(dir.join("one.yaml"), format!("domain: one\n{rule}")).unwrap();
        std::fs::write(dir.join("two.yml"), format!("domain: two\n{rule}")).unwrap();
        std::fs::write(dir.join("notes.txt"), "not a config").unwrap();
        let config = Config::load(&dir, DEFAULT_ALGORITHM).unwrap();
        assert!(
            config
                .find("one", &entries(&[("a", "x")]))
                .unwrap()
                .is_some()
        );
        assert!(
            config
                .find("two", &entries(&[("a", "x")]))
                .unwrap()
                .is_some()
        );
        std::fs::write(dir.join("three.yaml"), format!("domain: one\n{rule}")).unwrap();
        let err = Config::load(&dir, DEFAULT_ALGORITHM)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("three.yaml") && err.contains("already defined in"),
            "{err}"
        );
    }

    /// envoyproxy/ratelimit's documented examples (its README, examples 1 to 9) load
    /// unchanged and match as documented.
    #[test]
    fn envoyproxy_ratelimit_examples_match_as_documented() {
        let load = |text: &str| {
            Config::parse(Path::new("example.yaml"), text, Algorithm::FixedWindow).unwrap()
        };
        let path = |config: &Config, domain: &str, pairs: &[(&str, &str)]| {
            config
                .find(domain, &entries(pairs))
                .unwrap()
                .map(|l| l.path.clone())
        };
        // 1: two values of one key.
        let c = load(
            "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n\n  - key: database\n    value: default\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n",
        );
        assert_eq!(
            path(&c, "mongo_cps", &[("database", "users")]).as_deref(),
            Some("mongo_cps.database_users")
        );
        assert_eq!(path(&c, "mongo_cps", &[("database", "other")]), None);
        // 2: nested lists; a key without a value matches any value.
        let c = load(
            "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit:\n          unit: day\n          requests_per_unit: 5\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n",
        );
        assert_eq!(
            path(
                &c,
                "messaging",
                &[("message_type", "marketing"), ("to_number", "2061111111")]
            )
            .as_deref(),
            Some("messaging.message_type_marketing.to_number")
        );
        assert_eq!(
            path(&c, "messaging", &[("to_number", "2061111111")]).as_deref(),
            Some("messaging.to_number")
        );
        assert_eq!(
            path(&c, "messaging", &[("message_type", "marketing")]),
            None
        );
        // 3: key and value is tried before key alone; 0 per unit blocks.
        let c = load(
            "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n\n  # Black list IP\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n",
        );
        let blocked = c
            .find(
                "edge_proxy_per_ip",
                &entries(&[("remote_address", "50.0.0.5")]),
            )
            .unwrap()
            .unwrap();
        assert!(blocked.blocked && blocked.rule.is_none());
        let normal = c
            .find(
                "edge_proxy_per_ip",
                &entries(&[("remote_address", "50.0.0.1")]),
            )
            .unwrap()
            .unwrap();
        assert_eq!(normal.rule.as_ref().unwrap().limit(), 10);
        // 4: the request must reach the level that holds the limit.
        let c = load(
            "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit:\n      requests_per_unit: 300\n      unit: second\n",
        );
        assert_eq!(
            path(&c, "example4", &[("key", "value"), ("subkey", "subvalue")]),
            None
        );
        // 5: unlimited.
        let c = load(
            "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n\n  - key: azure\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n",
        );
        assert!(
            c.find("internal", &entries(&[("ldap", "x")]))
                .unwrap()
                .unwrap()
                .rule
                .is_none()
        );
        // 6: shadow mode.
        let c = load(
            "domain: example6\ndescriptors:\n  - key: service\n    descriptors:\n      - key: user\n        value: user-a\n        rate_limit:\n          requests_per_unit: 10\n          unit: second\n        shadow_mode: true\n      - key: user\n        value: user-b\n        rate_limit:\n          requests_per_unit: 20\n          unit: second\n",
        );
        let a = c
            .find(
                "example6",
                &entries(&[("service", "auth-service"), ("user", "user-a")]),
            )
            .unwrap()
            .unwrap();
        let b = c
            .find(
                "example6",
                &entries(&[("service", "auth-service"), ("user", "user-b")]),
            )
            .unwrap()
            .unwrap();
        assert!(a.shadow_mode && !b.shadow_mode);
        // 7: replaces.
        let c = load(
            "domain: example7\ndescriptors:\n  - key: key_1\n    value: value_1\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          name: specific_limit\n          requests_per_unit: 5\n          unit: second\n  - key: key_2\n    value: value_2\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          replaces:\n            - name: specific_limit\n          requests_per_unit: 10\n          unit: second\n",
        );
        let second = c
            .find(
                "example7",
                &entries(&[("key_2", "value_2"), ("user", "bkthomps")]),
            )
            .unwrap()
            .unwrap();
        assert_eq!(second.replaces, ["specific_limit"]);
        // 8: detailed metrics.
        let c = load(
            "domain: example8\ndescriptors:\n  - key: key1\n    detailed_metric: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n",
        );
        assert!(
            c.find("example8", &entries(&[("key1", "other")]))
                .unwrap()
                .unwrap()
                .detailed_metric
        );
        // 9: a wildcard value.
        let c = load(
            "domain: example9\ndescriptors:\n  - key: key1\n    value: value*\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n",
        );
        assert_eq!(
            path(&c, "example9", &[("key1", "value_2")]).as_deref(),
            Some("example9.key1_value*")
        );
        assert_eq!(path(&c, "example9", &[("key1", "other")]), None);
    }

    #[test]
    fn unlimited_matches_without_a_rule() {
        let config =
            parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n")
                .unwrap();
        let limit = config.find("d", &entries(&[("a", "x")])).unwrap().unwrap();
        assert!(limit.rule.is_none());
        let err = parse(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("rate_limit.unit"), "{err}");
    }
}
