//! `sluicegate replay` run as a process: a trace on standard input, its report.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// `sluicegate replay ARGS` with `input` on standard input, waited for.
pub(crate) fn replay(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .arg("replay")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}
