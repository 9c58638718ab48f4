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

/// The service runs with transparent huge pages off (src/main.rs), so that its memory
/// grows 4 KiB at a time: with them, every 2 MiB of mimalloc's arena the service touches
/// is resident whole, and the idle service held twice the memory. The kernel reports the
/// switch in /proc/PID/status, and the huge pages held in smaps_rollup.
#[cfg(target_os = "linux")]
#[test]
fn the_service_holds_no_transparent_huge_pages() {
    let server = crate::server::Server::binary(&[]);
    let proc_file = |name: &str| {
        std::fs::read_to_string(format!("/proc/{}/{name}", server.pid()))
            .unwrap_or_else(|e| panic!("/proc/PID/{name}: {e}"))
    };
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(|value| value.trim().to_owned())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    assert_eq!(field(&proc_file("status"), "THP_enabled"), "0");
    assert_eq!(field(&proc_file("smaps_rollup"), "AnonHugePages"), "0 kB");
}
