//! The case files of the conformance suite (`cases/*.yaml`) and the list of cases that
//! fail today (`expected_failures.yaml`), as serde reads them. The Python runner reads the
//! same files; README.md of this directory describes the format.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// This directory: the case files, the fixtures they name, the README.
pub(crate) fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/envoy_conformance")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    cases: Vec<Case>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct Case {
    pub id: String,
    /// `envoyproxy/ratelimit@f2fb157 path:line[-line]`, or another project's file for the
    /// public configurations of `real_world.yaml`.
    pub source: String,
    /// One line: what the case shows.
    pub about: String,
    /// Where sluicegate's answer is expected instead of envoy's, why.
    #[serde(default)]
    pub deviation: Option<String>,
    pub config: ConfigSource,
    /// Extra `serve` flags; the mode's own (`--compat envoy`) are added by the runner.
    #[serde(default)]
    pub flags: Vec<String>,
    #[serde(default = "both_modes")]
    pub modes: Vec<Mode>,
    /// The answers depend on envoy's counting (refused hits counted, descriptors counted
    /// independently): in default mode they are expected to differ.
    #[serde(default)]
    pub counting: bool,
    /// For a configuration alone: whether it loads. A case with steps must load.
    #[serde(default)]
    pub load: Load,
    #[serde(default)]
    pub steps: Vec<Step>,
}

fn both_modes() -> Vec<Mode> {
    vec![Mode::Envoy, Mode::Default]
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    /// `serve --compat envoy`.
    Envoy,
    /// sluicegate's own semantics.
    Default,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Envoy => "envoy",
            Mode::Default => "default",
        }
    }

    pub(crate) fn flags(self) -> &'static [&'static str] {
        match self {
            Mode::Envoy => &["--compat", "envoy"],
            Mode::Default => &[],
        }
    }
}

/// A fixture path (a file or a directory) relative to this directory, several fixture
/// files (copied into one directory), or a configuration written inline.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
pub(crate) enum ConfigSource {
    Path(String),
    Files(Vec<String>),
    Inline { yaml: String },
}

#[derive(Deserialize, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub(crate) enum Load {
    #[default]
    Ok,
    /// The start fails with an error containing every one of these strings.
    Rejected(Vec<String>),
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct Step {
    /// Sent this many times; `{i}` in an entry's value is the iteration, from 0.
    #[serde(default = "one")]
    pub repeat: u32,
    pub request: Request,
    pub expect: Expect,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct Request {
    pub domain: String,
    /// As envoyproxy/ratelimit's test helper sends it: 1 unless given.
    #[serde(default = "one")]
    pub hits_addend: u32,
    pub descriptors: Vec<Descriptor>,
}

#[derive(Deserialize, Clone)]
#[serde(untagged)]
pub(crate) enum Descriptor {
    Entries(Vec<(String, String)>),
    Full {
        entries: Vec<(String, String)>,
        #[serde(default)]
        hits_addend: Option<u64>,
        #[serde(default)]
        limit: Option<Limit>,
    },
}

impl Descriptor {
    pub(crate) fn entries(&self) -> &[(String, String)] {
        match self {
            Descriptor::Entries(entries) | Descriptor::Full { entries, .. } => entries,
        }
    }
}

#[derive(Deserialize, Clone)]
#[serde(untagged)]
pub(crate) enum Expect {
    Error {
        /// The gRPC status code's name, `INVALID_ARGUMENT`.
        grpc_error: String,
    },
    Answer {
        overall_code: String,
        /// Not checked when absent (envoy's shell scripts only look at the HTTP status).
        #[serde(default)]
        statuses: Option<Vec<Status>>,
        /// Absent: none may be added (envoy's default).
        #[serde(default)]
        response_headers: Vec<Header>,
    },
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct Status {
    pub code: String,
    /// Absent: the status carries no limit.
    #[serde(default)]
    pub current_limit: Option<Limit>,
    #[serde(default)]
    pub limit_remaining: Remaining,
}

/// A rate limit as a status reports it, or a descriptor's `limit` override.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct Limit {
    #[serde(default)]
    pub name: String,
    pub requests_per_unit: u32,
    /// `SECOND`, `MINUTE`, … as in the proto.
    pub unit: String,
}

#[derive(Deserialize, Clone)]
#[serde(untagged)]
pub(crate) enum Remaining {
    Exact(u32),
    /// `start + i * step` at the step's iteration `i`.
    Countdown {
        start: u32,
        step: i64,
    },
}

impl Default for Remaining {
    fn default() -> Self {
        Remaining::Exact(0)
    }
}

impl Remaining {
    pub(crate) fn at(&self, i: u32) -> i64 {
        match self {
            Remaining::Exact(n) => i64::from(*n),
            Remaining::Countdown { start, step } => i64::from(*start) + i64::from(i) * step,
        }
    }
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct Header {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    /// A whole number within these bounds, inclusive (a reset that depends on the clock).
    #[serde(default)]
    pub between: Option<(u64, u64)>,
}

/// The length in seconds of a unit of the proto, as envoyproxy/ratelimit@f2fb157
/// src/utils/utilities.go:20-38 divides time (a month 30 days, a year 365).
pub(crate) fn unit_seconds(unit: &str) -> Option<u64> {
    match unit {
        "SECOND" => Some(1),
        "MINUTE" => Some(60),
        "HOUR" => Some(3600),
        "DAY" => Some(86_400),
        "WEEK" => Some(7 * 86_400),
        "MONTH" => Some(30 * 86_400),
        "YEAR" => Some(365 * 86_400),
        _ => None,
    }
}

/// The values of every `unit` key in a YAML document, at any depth.
fn units_in(yaml: &str) -> Vec<String> {
    fn walk(value: &serde_json::Value, units: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(fields) => {
                for (key, field) in fields {
                    match (key.as_str(), field) {
                        ("unit", serde_json::Value::String(unit)) => units.push(unit.clone()),
                        _ => walk(field, units),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|item| walk(item, units)),
            _ => {}
        }
    }
    let mut units = Vec::new();
    if let Ok(document) = serde_saphyr::from_str::<serde_json::Value>(yaml) {
        walk(&document, &mut units);
    }
    units
}

impl Case {
    /// The shortest unit the case's answers name, or where they name none (answers that
    /// give only an overall code), its configuration: a run that crosses one of its
    /// boundaries may see a window reset that envoy's test did not expect.
    pub(crate) fn shortest_window_seconds(&self) -> Option<u64> {
        let expected = self.steps.iter().flat_map(|step| match &step.expect {
            Expect::Answer {
                statuses: Some(statuses),
                ..
            } => statuses
                .iter()
                .filter_map(|s| s.current_limit.as_ref())
                .map(|l| l.unit.clone())
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        });
        let shortest = |units: Vec<String>| {
            units
                .iter()
                .filter_map(|unit| unit_seconds(&unit.to_ascii_uppercase()))
                .min()
        };
        shortest(expected.collect()).or_else(|| shortest(self.configured_units()))
    }

    /// Every `unit` the case's configuration files give, as written; none from a file
    /// that does not parse (a case that expects the configuration refused has no steps).
    fn configured_units(&self) -> Vec<String> {
        let files = match &self.config {
            ConfigSource::Inline { yaml } => return units_in(yaml),
            ConfigSource::Files(paths) => paths.iter().map(|p| dir().join(p)).collect(),
            ConfigSource::Path(path) => {
                let path = dir().join(path);
                match std::fs::read_dir(&path) {
                    Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
                    Err(_) => vec![path],
                }
            }
        };
        files
            .iter()
            .filter_map(|file| std::fs::read_to_string(file).ok())
            .flat_map(|text| units_in(&text))
            .collect()
    }

    pub(crate) fn is_load_only(&self) -> bool {
        self.steps.is_empty()
    }
}

/// `owner/repository@commit path:line[-line]`, as `envoyproxy/ratelimit@f2fb157
/// README.md:372-395`.
fn cites_a_file(source: &str) -> bool {
    let Some((repository, place)) = source.split_once(' ') else {
        return false;
    };
    let Some((name, commit)) = repository.split_once('@') else {
        return false;
    };
    let lines = place.rsplit_once(':').map(|(_, lines)| lines);
    name.contains('/')
        && commit.len() >= 7
        && commit.chars().all(|c| c.is_ascii_hexdigit())
        && lines.is_some_and(|l| !l.is_empty() && l.split('-').all(|n| n.parse::<u32>().is_ok()))
}

/// Every case of every case file, in file order, ids checked unique.
pub(crate) fn all() -> Vec<Case> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir().join("cases"))
        .expect("the cases directory")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let file: CaseFile =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        cases.extend(file.cases);
    }
    let mut seen = BTreeSet::new();
    for case in &cases {
        assert!(seen.insert(case.id.clone()), "case {} twice", case.id);
        assert!(
            cites_a_file(&case.source),
            "{}: the source cites owner/repository@commit path:line",
            case.id
        );
        assert!(
            case.load == Load::Ok || case.steps.is_empty(),
            "{}: a rejected configuration has no steps",
            case.id
        );
    }
    cases
}

/// A case that fails today in a mode, and why.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExpectedFailure {
    pub case: String,
    pub mode: Mode,
    pub reason: String,
}

pub(crate) fn expected_failures() -> Vec<ExpectedFailure> {
    let path = dir().join("expected_failures.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let list: Option<Vec<ExpectedFailure>> =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    list.unwrap_or_default()
}
