//! The configuration as the service reads it: what it refuses at start, what a reload
//! notices, and the YAML node budget.

mod server;

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
