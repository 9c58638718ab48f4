//! The envoy conformance suite: envoyproxy/ratelimit's own expectations (its integration,
//! limiter, cache and service tests, its README's examples, its example configurations),
//! ported into the case files of `tests/it/envoy_conformance/cases/`, sent through Envoy's
//! generated stubs — tonic's here, Python's grpcio in `tests/it/python/envoy_conformance.py`
//! — to a fresh in-process server per case, on the memory store and on a real Redis, with
//! `--compat envoy` and in sluicegate's default mode.
//!
//! What does not pass yet is listed in `expected_failures.yaml`, each with its reason, and
//! checked both ways: a listed case that passes fails the suite too, so the list only
//! shrinks. A case marked `counting` depends on envoy's counting and is expected to differ
//! in default mode. README.md of that directory lists every case (generated, checked here).
//! `SLUICEGATE_CONFORMANCE_VERBOSE=1` prints why each expected failure fails (with
//! `--nocapture`), to see what a change has left to do.

use sluicegate_test_support as support;

use crate::server;

mod cases;
mod clients;
mod judge;
mod readme;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use cases::{Case, ConfigSource, Expect, Load, Mode};
use clients::{Client, PythonClient, RustClient};
use server::Server;

/// Where a case's server keeps its counters.
enum Store {
    Memory,
    Redis(String),
}

static RUNS: AtomicU64 = AtomicU64::new(0);

/// A number no other run of this process has had: temporary directories, Redis prefixes.
fn next_run() -> u64 {
    RUNS.fetch_add(1, Ordering::Relaxed)
}

impl Store {
    fn args(&self) -> Vec<String> {
        match self {
            Store::Memory => Vec::new(),
            Store::Redis(url) => vec![
                "--store".into(),
                url.clone(),
                "--prefix".into(),
                format!("conformance-{}-{}:", std::process::id(), next_run()),
            ],
        }
    }
}

/// A directory of this run's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let path = std::env::temp_dir().join(format!(
            "sluicegate-conformance-{}-{}",
            std::process::id(),
            next_run()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `--config` path of a case: a fixture as it is, or a directory made for the run.
fn config_path(case: &Case, scratch: &Scratch) -> PathBuf {
    match &case.config {
        ConfigSource::Path(path) => cases::dir().join(path),
        ConfigSource::Files(paths) => {
            for path in paths {
                let from = cases::dir().join(path);
                let name = from.file_name().expect("a fixture file");
                std::fs::copy(&from, scratch.0.join(name))
                    .unwrap_or_else(|e| panic!("{}: {e}", from.display()));
            }
            scratch.0.clone()
        }
        ConfigSource::Inline { yaml } => {
            let path = scratch
                .0
                .join(format!("{}.yaml", case.id.replace('/', "_")));
            std::fs::write(&path, yaml).unwrap();
            path
        }
    }
}

/// One try of a case: start its server, then load check or steps.
fn attempt(case: &Case, mode: Mode, store: &Store, client: &mut dyn Client) -> Result<(), String> {
    let scratch = Scratch::new();
    let mut args = vec![
        "--config".to_owned(),
        config_path(case, &scratch).display().to_string(),
    ];
    args.extend(mode.flags().iter().map(|f| (*f).to_owned()));
    args.extend(case.flags.iter().cloned());
    args.extend(store.args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match (Server::try_start(&args), &case.load) {
        (Ok(server), Load::Ok) => {
            let result = client.run(case, mode, &server.address);
            drop(server);
            result
        }
        (Ok(_), Load::Rejected(_)) => Err("the configuration loads; envoy rejects it".into()),
        (Err(e), Load::Ok) => Err(format!("serve: {e}")),
        (Err(e), Load::Rejected(words)) => match words.iter().find(|w| !e.contains(w.as_str())) {
            None => Ok(()),
            Some(missing) => Err(format!("rejected without naming {missing:?}: {e}")),
        },
    }
}

fn now_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A case, tried again (three times at most) when it failed while crossing a boundary
/// of its shortest window: envoy's windows are aligned to the clock, and its tests
/// assume a run fits in one. Nothing waits for time to pass.
fn run_case(case: &Case, mode: Mode, store: &Store, client: &mut dyn Client) -> Result<(), String> {
    let shortest_window = case.shortest_window_seconds();
    let mut tries = 0;
    loop {
        tries += 1;
        let started = now_seconds();
        let result = attempt(case, mode, store, client);
        let crossed = shortest_window.is_some_and(|w| started / w != now_seconds() / w);
        if result.is_ok() || !crossed || tries == 3 {
            return result;
        }
    }
}

/// Runs every case with steps through `client`, both modes, and returns what disagrees
/// with `expected_failures.yaml` and the cases' `counting` marks.
fn problems(client: &mut dyn Client, store: &Store, only_load: bool) -> Vec<String> {
    let expected: BTreeMap<(String, Mode), String> = cases::expected_failures()
        .into_iter()
        .map(|f| ((f.case, f.mode), f.reason))
        .collect();
    let mut problems = Vec::new();
    for case in cases::all() {
        if case.is_load_only() != only_load {
            continue;
        }
        for &mode in &case.modes {
            let result = run_case(&case, mode, store, client);
            let listed = expected.get(&(case.id.clone(), mode));
            let differs_by_design = case.counting && mode == Mode::Default;
            let (id, m) = (&case.id, mode.name());
            match (result, listed) {
                (Ok(()), Some(reason)) => problems.push(format!(
                    "{id} [{m}] passes: take it off expected_failures.yaml (listed: {reason})"
                )),
                (Ok(()), None) if differs_by_design => problems.push(format!(
                    "{id} [default] agrees with envoy although marked counting"
                )),
                (Err(e), None) if !differs_by_design => problems.push(format!(
                    "- {{case: {id}, mode: {m}, reason: {}}}",
                    serde_json::Value::String(first_line(&e))
                )),
                (Err(e), _) if std::env::var_os("SLUICEGATE_CONFORMANCE_VERBOSE").is_some() => {
                    eprintln!("{id} [{m}] fails as expected: {e}");
                }
                _ => {}
            }
        }
    }
    problems
}

/// A failure's first line, without this directory's path: short enough to list.
fn first_line(failure: &str) -> String {
    let prefix = format!("{}/", cases::dir().display());
    let line = failure
        .lines()
        .next()
        .unwrap_or_default()
        .replace(&prefix, "");
    line.chars().take(240).collect()
}

fn assert_conforms(client: &mut dyn Client, store: &Store, only_load: bool) {
    let problems = problems(client, store, only_load);
    assert!(
        problems.is_empty(),
        "{} disagreements with the suite's expectations:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn rust_client_memory_store() {
    assert_conforms(&mut RustClient, &Store::Memory, false);
}

#[test]
fn rust_client_redis() {
    let redis = support::standalone();
    assert_conforms(&mut RustClient, &Store::Redis(redis.url()), false);
}

#[test]
fn python_client_memory_store() {
    assert_conforms(&mut PythonClient::start(), &Store::Memory, false);
}

#[test]
fn python_client_redis() {
    let redis = support::standalone();
    assert_conforms(
        &mut PythonClient::start(),
        &Store::Redis(redis.url()),
        false,
    );
}

/// envoyproxy/ratelimit's own configuration files load, and those it rejects are
/// rejected with an error naming the file (no requests: no client needed).
#[test]
fn configurations_load_or_are_rejected_as_envoy_does() {
    assert_conforms(&mut RustClient, &Store::Memory, true);
}

/// Every listed failure names a case and a mode it runs in, and none lists a counting
/// case's default mode (that one is expected to differ anyway).
#[test]
fn expected_failures_name_cases_that_run() {
    let cases: BTreeMap<String, Case> = cases::all()
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect();
    for failure in cases::expected_failures() {
        let case = cases
            .get(&failure.case)
            .unwrap_or_else(|| panic!("expected_failures.yaml: no case {}", failure.case));
        assert!(
            case.modes.contains(&failure.mode),
            "expected_failures.yaml: {} does not run in mode {}",
            failure.case,
            failure.mode.name()
        );
        assert!(
            !(case.counting && failure.mode == Mode::Default),
            "expected_failures.yaml: {} is a counting case, expected to differ in default mode",
            failure.case
        );
    }
}

#[test]
fn the_readme_lists_every_case() {
    readme::check(&cases::all());
}

/// Every case that expects a refusal under envoy's fixed windows knows the shortest one:
/// a run of it that crosses a boundary is played again (run_case), also one whose answers
/// give only an overall code and so name no unit.
#[test]
fn every_refusing_case_knows_its_shortest_window() {
    let refuses = |case: &Case| {
        case.steps.iter().any(|step| {
            matches!(&step.expect, Expect::Answer { overall_code, .. } if overall_code == "OVER_LIMIT")
        })
    };
    let blind: Vec<String> = cases::all()
        .into_iter()
        .filter(|case| case.modes.contains(&Mode::Envoy) && refuses(case))
        .filter(|case| case.shortest_window_seconds().is_none())
        .map(|case| case.id)
        .collect();
    assert!(blind.is_empty(), "{blind:?}");
}
