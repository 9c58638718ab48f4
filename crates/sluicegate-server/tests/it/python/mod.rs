//! Python's grpcio, with Envoy's generated stubs (xds-protos), as a client we did not
//! write: the scripts of this folder, run as processes.

use std::process::Command;

/// Runs `tests/it/python/<script>` with `args` and returns its standard output, which must
/// come from a run that succeeded.
pub(crate) fn run_python(script: &str, args: &[&str]) -> String {
    let path = format!("{}/tests/it/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&path)
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python {script} failed (scripts/test installs grpcio and xds-protos): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
