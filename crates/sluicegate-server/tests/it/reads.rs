//! Who may read what the service saw (`/v1/top`, `/v1/overview`, `/ui`, `/v1/explain`),
//! over real sockets: this host without a read token, the bearer of `--read-token-file`'s
//! token with one, anyone on the debug listener; `sluicegate explain` sends the token.
//!
//! A peer that is not loopback cannot be had here (a test talks to 127.0.0.1 only): its
//! refusal is tested through the router with the peer address the server hands every
//! request (src/http/reads.rs); here, the same address comes from the real socket.

use crate::server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use server::{Server, request_to};

const RULES: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
";

const CHECK: &str =
    r#"{"domain": "d", "descriptors": [{"entries": [{"key": "user", "value": "ann"}]}]}"#;

/// The reads that show request values, and their bodies.
const GUARDED: [(&str, &str, &str); 4] = [
    ("GET", "/v1/top", ""),
    ("GET", "/v1/overview", ""),
    ("GET", "/ui", ""),
    ("POST", "/v1/explain", CHECK),
];

/// A file of this test's own named `name`, holding `text`.
fn file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("sluicegate-reads-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn serve(run: &str, flags: &[&str]) -> Server {
    let config = file(&format!("{run}.yaml"), RULES);
    let config = config.to_str().unwrap();
    Server::start(&[&["--config", config], flags].concat())
}

fn explain(target: &str, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluicegate"));
    command
        .args(["explain", "--target", target, "--domain", "d"])
        .args(["--descriptor", "user=ann"])
        .args(args)
        .env_remove("SLUICEGATE_READ_TOKEN_FILE");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

#[test]
fn without_a_token_this_host_reads_them() {
    let server = serve("local", &[]);
    // A refusal, so the top offenders name someone.
    server.request("POST", "/v1/check", CHECK);
    server.request("POST", "/v1/check", CHECK);
    for (method, path, body) in GUARDED {
        let (status, text) = server.request(method, path, body);
        assert_eq!(status, 200, "{path}: {text}");
    }
    let (_, top) = server.request("GET", "/v1/top", "");
    assert!(top.contains("user=ann"), "{top}");
    let out = explain(&server.address, &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn with_a_read_token_the_main_listener_asks_for_it_and_the_debug_listener_does_not() {
    let token = file("token", "s3cret\n");
    let server = serve(
        "token",
        &[
            "--read-token-file",
            token.to_str().unwrap(),
            "--debug-listen",
            "127.0.0.1:0",
        ],
    );
    let debug = server.debug_address.clone().unwrap();
    server.request("POST", "/v1/check", CHECK);
    for (method, path, body) in GUARDED {
        let (status, text) = server.request(method, path, body);
        assert_eq!(status, 403, "{path}: {text}");
        let error: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            error["error"].as_str().unwrap().contains("--debug-listen"),
            "{text}"
        );
        let wrong = [("authorization", "Bearer s3cre")];
        assert_eq!(
            server.request_with_headers(method, path, body, &wrong).0,
            403
        );
        // The file's final newline is no part of the token.
        let right = [("authorization", "Bearer s3cret")];
        assert_eq!(
            server.request_with_headers(method, path, body, &right).0,
            200,
            "{path}"
        );
        let (status, text) = request_to(&debug, method, path, body, &[]).unwrap();
        assert_eq!(status, 200, "debug {path}: {text}");
    }
    // The configuration, the probes and the metrics stay open.
    for path in ["/v1/rules", "/healthz", "/metrics"] {
        assert_eq!(server.request("GET", path, "").0, 200, "{path}");
    }
    // sluicegate explain: refused without the token (exit 2, no answer), answered with
    // it, by flag or env (exit 1: ann's one unit is used).
    let out = explain(&server.address, &[], &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("403"),
        "{out:?}"
    );
    let out = explain(
        &server.address,
        &["--read-token-file", token.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = explain(
        &server.address,
        &[],
        &[("SLUICEGATE_READ_TOKEN_FILE", &token)],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn a_token_file_that_holds_no_token_stops_the_start() {
    let empty = file("empty", " \n");
    let missing = std::env::temp_dir().join("sluicegate-reads-no-such-token");
    for path in [empty.as_path(), missing.as_path()] {
        let config = file("start.yaml", RULES);
        let error = Server::try_start(&[
            "--config",
            config.to_str().unwrap(),
            "--read-token-file",
            path.to_str().unwrap(),
        ])
        .err()
        .unwrap_or_else(|| panic!("{} was accepted", path.display()));
        assert!(error.contains("--read-token-file"), "{error}");
    }
}

/// What `/v1/top` holds of a 60 KB value: its first bytes and a digest, at most 256 bytes,
/// so two such values that differ only at the end stay apart.
#[test]
fn a_long_value_is_shown_as_its_first_bytes_and_a_digest() {
    let server = serve("long", &[]);
    let value = |last: char| format!("{}{last}", "v".repeat(60_000));
    for last in ['a', 'b'] {
        let check = serde_json::json!({
            "domain": "d",
            "descriptors": [{"entries": [{"key": "user", "value": value(last)}]}],
        });
        for _ in 0..2 {
            let (status, text) = server.request("POST", "/v1/check", &check.to_string());
            assert_eq!(status, 200, "{text}");
        }
    }
    let (status, top) = server.request("GET", "/v1/top", "");
    assert_eq!(status, 200, "{top}");
    let top: serde_json::Value = serde_json::from_str(&top).unwrap();
    let shown: Vec<&str> = top[0]["offenders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["descriptor"].as_str().unwrap())
        .collect();
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert_ne!(shown[0], shown[1]);
    for descriptor in shown {
        assert!(descriptor.len() <= 256, "{descriptor}");
        assert!(descriptor.starts_with("user=vvv"), "{descriptor}");
        assert!(
            descriptor.contains("…[60006 bytes, sha256:"),
            "{descriptor}"
        );
    }
}
