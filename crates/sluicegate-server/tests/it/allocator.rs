//! The binary allocates with mimalloc (src/main.rs): asked to be verbose through its own
//! environment variable, mimalloc says so on standard error as the process starts; the
//! system's allocator ignores the variable.

use std::process::Command;

#[test]
fn the_binary_runs_on_mimalloc() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .arg("--version")
        .env("MIMALLOC_VERBOSE", "1")
        .output()
        .expect("run sluicegate --version");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("mimalloc: process init"),
        "no word from mimalloc on standard error: {stderr:?}"
    );
}
