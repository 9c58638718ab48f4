//! Links the `sluicegate` binary with the functions that starting and answering run placed
//! together, first in its code, in the order `symbol-order.txt` lists them (written by
//! `scripts/symbol-order`). The kernel maps a binary's code in around each page the process
//! touches, 64 KiB at a time: in the compiler's order the 3.3 MiB of functions a start and
//! the first answers run lie all over 10 MiB of code, and kept most of it resident
//! (docs/BENCHMARKS.md, "The service's memory and allocations").
//!
//! Only some linkers read the list (LLD, rustc's own linker on x86_64-unknown-linux-gnu
//! from Rust 1.90 on rustup's toolchains), and GNU ld stops at it. So the build first
//! links an empty program with the same compiler, target, flags and linker arguments, and
//! passes them to the binary only if that links: any other linker links the binary as
//! before, its code in the compiler's order. Functions the list names that a build does not
//! hold are skipped: their names carry hashes of the compiler's version and of the packages'
//! versions, features and profile, and tests/it/deploy.rs holds the list to the Dockerfile's
//! compiler and to this workspace's version, lock file and manifests.

use std::{
    env,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

fn main() {
    let manifest_dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let list = PathBuf::from(manifest_dir).join("symbol-order.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    // A linker configured for the target by the environment: cargo reruns this on a change of
    // the flags or the compiler, not of the linker. (One set in a config file is seen by the
    // build script itself when the target is the host: it is relinked, and reruns.)
    if let Ok(target) = env::var("TARGET") {
        let linker = target.to_uppercase().replace(['-', '.'], "_");
        println!("cargo:rerun-if-env-changed=CARGO_TARGET_{linker}_LINKER");
    }
    let optimised = env::var("OPT_LEVEL").is_ok_and(|level| level != "0");
    if !optimised || !list.is_file() {
        return;
    }
    // The linker's arguments are passed through the C compiler, which splits them at commas.
    let Some(path) = list.to_str().filter(|path| !path.contains(',')) else {
        return;
    };
    let arguments = [
        format!("-Wl,--symbol-ordering-file={path}"),
        "-Wl,--no-warn-symbol-ordering".to_owned(),
    ];
    if links_with(&arguments) {
        for argument in arguments {
            println!("cargo:rustc-link-arg-bin=sluicegate={argument}");
        }
    }
}

/// Whether an empty program links with the linker `arguments`, built as this package's
/// binary is: the same rustc, target, flags and configured linker.
fn links_with(arguments: &[String]) -> bool {
    let (Some(rustc), Some(target), Some(out_dir)) = (
        env::var_os("RUSTC"),
        env::var_os("TARGET"),
        env::var_os("OUT_DIR"),
    ) else {
        return false;
    };
    let out_dir = Path::new(&out_dir);
    let source = out_dir.join("symbol_order_probe.rs");
    if fs::write(&source, "fn main() {}\n").is_err() {
        return false;
    }
    let mut command = Command::new(rustc);
    // Lints in the flags (`-D missing_docs`) would refuse the empty program, not the linker.
    command
        .arg("--target")
        .arg(target)
        .arg("--edition=2021")
        .arg("--cap-lints=allow")
        .arg("-o")
        .arg(out_dir.join("symbol_order_probe"))
        .arg(&source);
    // In cargo's order: the configured linker, then the flags (a `-C linker` among them wins).
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        let mut setting = OsString::from("linker=");
        setting.push(linker);
        command.arg("-C").arg(setting);
    }
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    command.args(flags.split('\x1f').filter(|flag| !flag.is_empty()));
    for argument in arguments {
        command.arg(format!("-Clink-arg={argument}"));
    }
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
