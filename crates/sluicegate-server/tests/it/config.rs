//! The configuration as the service reads it: what it refuses at start, what a reload
//! notices, and the YAML node budget.

use crate::server;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use server::Server;

/// A fresh directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Domain `d`: each user `limit` per hour.
fn user_config(limit: u32) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit:\n      window: 1h\n      requests_per_unit: {limit}\n"
    )
}

const CHECK: &str = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;

/// `sluicegate serve ARGS` must refuse to start: it exits unsuccessfully within 60 s (a
/// server that starts instead is killed and fails the test). Its stderr.
fn serve_refuses(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve {args:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "serve {args:?} exited 0");
    String::from_utf8(out.stderr).unwrap()
}

fn path_arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A directory without a file (dot files are skipped) would answer every check with an unknown
/// domain: it is refused at start, naming the directory.
#[test]
fn an_empty_directory_is_refused_at_start() {
    let dir = scratch("empty-dir");
    std::fs::write(dir.join(".notes"), "not a configuration").unwrap();
    let stderr = serve_refuses(&["--config", path_arg(&dir)]);
    assert!(
        stderr.contains(&format!(
            "{}: the directory holds no configuration",
            dir.display()
        )),
        "{stderr}"
    );
}

/// On reload, a directory emptied is rejected like a broken file: counted, and the
/// previous configuration keeps serving.
#[test]
fn a_directory_emptied_keeps_the_previous_configuration() {
    let dir = scratch("emptied-dir");
    let file = dir.join("d.yaml");
    std::fs::write(&file, user_config(1)).unwrap();
    let server = Server::start(&["--config", path_arg(&dir), "--reload-interval", "20ms"]);
    assert!(
        server
            .request("POST", "/v1/check", CHECK)
            .1
            .starts_with(r#"{"allowed":true"#)
    );
    std::fs::remove_file(&file).unwrap();
    server.wait_for_metric("sluicegate_config_errors_total", 1);
    let (status, body) = server.request("POST", "/v1/check", CHECK);
    assert_eq!(status, 200, "the domain is still known: {body}");
    assert!(
        body.starts_with(r#"{"allowed":false"#),
        "the old limit of 1 holds: {body}"
    );
    assert_eq!(server.metric("sluicegate_config_loads_total"), 1);
    assert!(server.stop().success());
}

/// An edit that keeps the file's length and modification time is still an edit: the
/// reload compares contents.
#[test]
fn an_edit_keeping_size_and_mtime_is_reloaded() {
    let dir = scratch("same-size-edit");
    let file = dir.join("d.yaml");
    std::fs::write(&file, user_config(1)).unwrap();
    let server = Server::start(&["--config", path_arg(&file), "--reload-interval", "20ms"]);
    let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
    let edited = user_config(2);
    assert_eq!(edited.len(), user_config(1).len());
    std::fs::write(&file, edited).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    assert_eq!(
        std::fs::metadata(&file).unwrap().modified().unwrap(),
        modified
    );
    server.wait_for_metric("sluicegate_config_loads_total", 2);
    let (_, rules) = server.request("GET", "/v1/rules", "");
    assert!(rules.contains(r#""limit":2"#), "{rules}");
    assert!(server.stop().success());
}

/// `count` descriptors of one rule each: 11 YAML nodes apiece, 5 around them.
fn many_descriptors(count: usize) -> String {
    let mut text = String::from("domain: d\ndescriptors:\n");
    for i in 0..count {
        text.push_str(&format!(
            "  - key: user\n    value: u{i}\n    rate_limit: {{unit: second, requests_per_unit: 5}}\n"
        ));
    }
    text
}

/// 23,000 descriptors are 253,005 nodes, over the default budget of 250,000: refused,
/// naming the file and the flag that raises the budget; loaded with a larger one.
#[test]
fn a_file_over_the_node_budget_is_refused_unless_the_budget_is_raised() {
    let dir = scratch("node-budget");
    let file = dir.join("big.yaml");
    std::fs::write(&file, many_descriptors(23_000)).unwrap();
    let stderr = serve_refuses(&["--config", path_arg(&file)]);
    assert!(
        stderr.contains(&format!("{}: more than 250000 YAML nodes", file.display()))
            && stderr.contains("--max-config-nodes"),
        "{stderr}"
    );
    let server = Server::start(&["--config", path_arg(&file), "--max-config-nodes", "300000"]);
    let last = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"u22999"}]}]}"#;
    let (status, body) = server.request("POST", "/v1/check", last);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""rule":"d.user_u22999""#), "{body}");
    assert!(server.stop().success());
}

/// Domain `d` with one rule whose value is `length` bytes of `v`.
fn long_value_config(length: usize) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit:\n      window: 1h\n      requests_per_unit: 1\n  - key: token\n    value: {}\n    rate_limit: {{unit: second, requests_per_unit: 5}}\n",
        "v".repeat(length)
    )
}

/// A file over the default --max-config-bytes (16 MiB) is refused at start with an error
/// naming the file, its size and the bound, before it is read: the file here is sparse,
/// 17 MiB of nothing, and the error quotes none of it.
#[test]
fn a_file_over_the_byte_bound_is_refused_at_start() {
    let dir = scratch("byte-bound-start");
    let file = dir.join("huge.yaml");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(17 << 20)
        .unwrap();
    let stderr = serve_refuses(&["--config", path_arg(&file)]);
    assert!(
        stderr.contains(&format!(
            "{}: 17825792 bytes, more than --max-config-bytes (16777216)",
            file.display()
        )) && stderr.contains("SLUICEGATE_MAX_CONFIG_BYTES"),
        "{stderr}"
    );
    assert!(stderr.len() < 4096, "{} bytes of errors", stderr.len());
}

/// The files of a directory count together: two of 3 KB each under a bound of 4 KB are
/// refused, naming the second, the one that crosses it; either alone loads.
#[test]
fn the_files_of_a_directory_count_together() {
    let dir = scratch("byte-bound-dir");
    let first = long_value_config(3000);
    std::fs::write(dir.join("a.yaml"), &first).unwrap();
    std::fs::write(
        dir.join("b.yaml"),
        long_value_config(3000).replace("domain: d", "domain: e"),
    )
    .unwrap();
    let stderr = serve_refuses(&["--config", path_arg(&dir), "--max-config-bytes", "4096"]);
    assert!(
        stderr.contains(&format!(
            "{}: {} bytes, after {} bytes of the files before it: more than --max-config-bytes (4096)",
            dir.join("b.yaml").display(),
            first.len(),
            first.len()
        )),
        "{stderr}"
    );
    let server = Server::start(&[
        "--config",
        path_arg(&dir.join("a.yaml")),
        "--max-config-bytes",
        "4096",
    ]);
    assert!(server.stop().success());
}

/// A reload of a file grown over --max-config-bytes is rejected: counted, logged with the
/// file and the bound, and the rules in force keep answering. No log line quotes the file,
/// and a reload of a rule with a value 200 KB long (under the bound) lists it cut short.
#[test]
fn a_reload_over_the_byte_bound_keeps_the_rules_in_force() {
    let dir = scratch("byte-bound-reload");
    let file = dir.join("d.yaml");
    std::fs::write(&file, user_config(1)).unwrap();
    let server = Server::binary(&[
        "--config",
        path_arg(&file),
        "--reload-interval",
        "20ms",
        "--max-config-bytes",
        "300000",
        // Values this long are refused by default: no request could carry them.
        "--max-entry-bytes",
        "300000",
    ]);
    assert!(
        server
            .request("POST", "/v1/check", CHECK)
            .1
            .starts_with(r#"{"allowed":true"#)
    );
    std::fs::write(&file, long_value_config(400_000)).unwrap();
    server.wait_for_metric("sluicegate_config_errors_total", 1);
    let rejected = server.wait_for_log(|line| line.contains("configuration rejected"));
    assert!(
        rejected.contains(&format!("{}: ", file.display()))
            && rejected.contains("bytes, more than --max-config-bytes (300000)"),
        "{rejected}"
    );
    let (status, body) = server.request("POST", "/v1/check", CHECK);
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with(r#"{"allowed":false"#),
        "the limit of 1 holds: {body}"
    );

    std::fs::write(&file, long_value_config(200_000)).unwrap();
    server.wait_for_metric("sluicegate_config_loads_total", 2);
    let reloaded = server.wait_for_log(|line| line.contains("configuration reloaded"));
    assert!(reloaded.contains("more bytes)"), "{reloaded}");
    let longest = server.logs().iter().map(String::len).max().unwrap();
    assert!(longest < 4096, "a log line of {longest} bytes");
}

/// A rule with `lease: 4`: the first three checks go to the store one by one, the key not
/// hot yet; the fourth takes 4 units, and the next three are answered from them
/// (`decided_by: lease`). D is a day, so that an edge of a span of D falls inside the test
/// but once a day. A lease larger than the limit stops the start, naming the file, the line and the
/// field.
#[test]
fn a_leased_rule_answers_from_its_lease_and_a_lease_past_the_limit_stops_the_start() {
    let dir = scratch("lease");
    let file = dir.join("limits.yaml");
    let config = |lease: u32| {
        format!(
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{algorithm: fixed-window, window: 1d, requests_per_unit: 10, lease: {lease}, lease_for: 1d}}\n"
        )
    };
    std::fs::write(&file, config(4)).unwrap();
    let server = Server::start(&["--config", path_arg(&file)]);
    let decided: Vec<String> = (0..7)
        .map(|_| {
            let (status, body) = server.request("POST", "/v1/check", CHECK);
            assert_eq!(status, 200, "{body}");
            let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(answer["allowed"], true, "{body}");
            answer["decided_by"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        decided,
        [
            "store", "store", "store", "store", "lease", "lease", "lease"
        ]
    );
    assert_eq!(
        server.metric("sluicegate_decisions_total{decided_by=\"lease\"}"),
        3
    );
    drop(server);

    std::fs::write(&file, config(11)).unwrap();
    let stderr = serve_refuses(&["--config", path_arg(&file)]);
    assert!(
        stderr.contains("limits.yaml: line 4")
            && stderr.contains("rate_limit.lease: lease 11 exceeds the rule's capacity 10"),
        "{stderr}"
    );
}
