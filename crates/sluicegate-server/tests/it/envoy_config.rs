//! envoyproxy/ratelimit's configurations, served: its example directory, its integration
//! tests' runtime directory and public real-world configurations (Istio's sample,
//! Contour's example) load unchanged through `sluicegate serve --config` and decide as
//! they say; `share_threshold` shares a counter among the values of a wildcard; the
//! directory flags. The fixtures' origins are in `tests/fixtures/envoy/SOURCES.md`.

use crate::server;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use server::Server;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoy")
        .join(name)
        .display()
        .to_string()
}

/// A fresh directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-envoy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `/v1/check` of one descriptor of `domain`: whether it was allowed, and the body.
fn check(server: &Server, domain: &str, pairs: &[(&str, &str)]) -> (bool, String) {
    let entries: Vec<String> = pairs
        .iter()
        .map(|(key, value)| format!(r#"{{"key":"{key}","value":"{value}"}}"#))
        .collect();
    let body = format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{}]}}]}}"#,
        entries.join(",")
    );
    let (status, answer) = server.request("POST", "/v1/check", &body);
    assert_eq!(status, 200, "{body}: {answer}");
    (answer.starts_with(r#"{"allowed":true"#), answer)
}

/// Allowed `n` times in a row, then refused.
fn allows_exactly(server: &Server, domain: &str, pairs: &[(&str, &str)], n: usize) {
    for i in 0..n {
        let (allowed, body) = check(server, domain, pairs);
        assert!(allowed, "request {} of {pairs:?}: {body}", i + 1);
    }
    let (allowed, body) = check(server, domain, pairs);
    assert!(!allowed, "request {} of {pairs:?}: {body}", n + 1);
}

/// envoyproxy/ratelimit's `examples/ratelimit/config/` (its `example.yaml` uses
/// `quota_mode`, `metadata`, `replaces`, `detailed_metric`, `shadow_mode`, a block and
/// `unlimited`), as its docker-compose example mounts it.
#[test]
fn envoys_example_directory_loads_unchanged() {
    // Sliding windows (the default), so that no window ends between two requests.
    let server = Server::start(&["--config", &fixture("examples")]);
    let (allowed, body) = check(&server, "mongo_cps", &[("database", "users")]);
    assert!(allowed && body.contains(r#""limit":500"#), "{body}");
    allows_exactly(&server, "rl", &[("foo", "f"), ("bar", "bkthomps")], 1);
    allows_exactly(&server, "rl", &[("service", "service_2")], 2);
    let (allowed, body) = check(&server, "rl", &[("foo", "f"), ("bar", "banned")]);
    assert!(!allowed, "a block: {body}");
    // A block keeps its unit, which the listing shows.
    let (_, rules) = server.request("GET", "/v1/rules", "");
    assert!(
        rules.contains(r#"{"path":"rl.foo.bar_banned","algorithm":null,"limit":0,"capacity":null,"window_us":60000000}"#),
        "{rules}"
    );
    for _ in 0..5 {
        assert!(check(&server, "rl", &[("qux", "q")]).0, "unlimited");
        assert!(
            check(&server, "rl", &[("foo", "f"), ("baz", "shady")]).0,
            "shadow mode"
        );
    }
    assert!(server.stop().success());
}

/// envoyproxy/ratelimit's integration tests' runtime directory (`test/integration/runtime/
/// current/ratelimit`, a subdirectory of YAML and a file beside it), with
/// `share_threshold`: the values `files/*` matches share one counter of 10 an hour; those
/// of a wildcard without it count apart.
#[test]
fn envoys_runtime_directory_loads_and_shares_thresholds() {
    let server = Server::start(&["--config", &fixture("runtime/ratelimit")]);
    for i in 0..10 {
        let (allowed, body) = check(
            &server,
            "share-threshold-test",
            &[("files", &format!("files/{i}.pdf"))],
        );
        assert!(allowed, "{i}: {body}");
    }
    let (allowed, body) = check(
        &server,
        "share-threshold-test",
        &[("files", "files/other.pdf")],
    );
    assert!(
        !allowed,
        "the eleventh value shares the limit of 10: {body}"
    );
    for i in 0..11 {
        let value = format!("files_no_share/{i}.pdf");
        assert!(
            check(
                &server,
                "share-threshold-test",
                &[("files_no_share", &value)]
            )
            .0
        );
    }
    allows_exactly(
        &server,
        "share-threshold-test",
        &[("files_no_share", "files_no_share/0.pdf")],
        9,
    );
    allows_exactly(&server, "basic", &[("one_per_minute", "x")], 1);
    let (allowed, body) = check(&server, "reload", &[("block", "x")]);
    assert!(!allowed, "{body}");
    assert!(server.stop().success());
}

/// Istio's sample (`samples/ratelimit/rate-limit-service.yaml`) and Contour's example
/// (`examples/ratelimit/`) rate limit service configurations.
#[test]
fn istio_and_contour_configurations_load_unchanged() {
    let istio = Server::start(&["--config", &fixture("istio/config.yaml")]);
    allows_exactly(&istio, "echo-ratelimit", &[("PATH", "/")], 1);
    assert!(check(&istio, "echo-ratelimit", &[("PATH", "/other")]).0);
    assert!(istio.stop().success());
    let contour = Server::start(&["--config", &fixture("contour")]);
    allows_exactly(&contour, "contour", &[("generic_key", "foo")], 1);
    allows_exactly(&contour, "contour", &[("remote_address", "10.0.0.1")], 3);
    assert!(check(&contour, "contour", &[("remote_address", "10.0.0.2")]).0);
    assert!(contour.stop().success());
}

/// A `*` anywhere in a value, several of them; of two wildcards that match, the first
/// declared wins (as envoyproxy/ratelimit, not the longest), and an exact value before both.
#[test]
fn wildcards_anywhere_in_a_value() {
    let dir = scratch("wildcards");
    let file = dir.join("d.yaml");
    std::fs::write(
        &file,
        "domain: d
descriptors:
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/v1/*/x*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /api/v0/action
    rate_limit: {unit: minute, requests_per_unit: 4}
",
    )
    .unwrap();
    let server = Server::start(&["--config", &file.display().to_string()]);
    // Each value its own counter: a wildcard without share_threshold counts apart.
    allows_exactly(&server, "d", &[("path", "/api/v1/action")], 1);
    allows_exactly(&server, "d", &[("path", "/api/v2/action")], 1);
    allows_exactly(&server, "d", &[("path", "/api/v1/list")], 2);
    allows_exactly(&server, "d", &[("path", "/api/v0/action")], 4);
    // /api/* is declared before /api/v1/*/x*, and matches too.
    allows_exactly(&server, "d", &[("path", "/api/v1/a/xy")], 2);
    assert!(server.stop().success());
}

/// `--config-ignore-dotfiles false` reads dot files too; `--merge-domain-config` merges a
/// domain split over two files.
#[test]
fn the_directory_flags() {
    let dir = scratch("flags");
    let rule = |key: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
        )
    };
    std::fs::write(dir.join("a.yaml"), rule("a")).unwrap();
    std::fs::create_dir_all(dir.join(".old")).unwrap();
    std::fs::write(dir.join(".old/a.yaml"), rule("old")).unwrap();
    let path = dir.display().to_string();
    let server = Server::start(&["--config", &path]);
    assert!(check(&server, "d", &[("a", "x")]).0);
    assert!(check(&server, "d", &[("old", "x")]).0, "no limit: skipped");
    assert!(check(&server, "d", &[("old", "x")]).0);
    assert!(server.stop().success());
    let server = Server::start(&[
        "--config",
        &path,
        "--config-ignore-dotfiles",
        "false",
        "--merge-domain-config",
    ]);
    allows_exactly(&server, "d", &[("old", "x")], 1);
    allows_exactly(&server, "d", &[("a", "x")], 1);
    assert!(server.stop().success());
}

/// The env twin of `--merge-domain-config`: the binary refuses a domain split over two
/// files without it, and serves it with `SLUICEGATE_MERGE_DOMAIN_CONFIG=true`.
#[test]
fn merging_domains_by_environment() {
    let dir = scratch("merge-env");
    for key in ["a", "b"] {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
        );
        std::fs::write(dir.join(format!("{key}.yaml")), text).unwrap();
    }
    let serve = |merge: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&dir)
            .env("SLUICEGATE_MERGE_DOMAIN_CONFIG", merge)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Up when it logs its address; else its stderr ends when it exits.
        let mut said = String::new();
        for line in BufReader::new(child.stderr.take().unwrap())
            .lines()
            .map_while(Result::ok)
        {
            said.push_str(&line);
            said.push('\n');
            if line.contains("address=") {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        said
    };
    let refused = serve("false");
    assert!(
        refused.contains(r#"domain: "d" is already defined in"#),
        "{refused}"
    );
    let started = serve("true");
    assert!(started.contains("address="), "{started}");
}
