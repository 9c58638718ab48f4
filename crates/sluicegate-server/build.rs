//! Links the `sluicegate` binary with the functions that starting and answering run placed
//! together, in the order `symbol-order.txt` lists them (written by `scripts/symbol-order`).
//! The kernel maps a binary's code in around each page the process touches, 64 KiB at a
//! time: spread over 10 MiB of code, the 2 MB of functions a start runs kept nearly all of
//! it resident (docs/BENCHMARKS.md, "The service's memory and allocations").
//!
//! Only LLD reads the list, and rustc links with it by default on x86_64-unknown-linux-gnu
//! from Rust 1.90. Any other target, toolchain or configured linker links the binary as
//! before, its code in the compiler's order. Functions the list names that a build does not
//! hold (its names carry hashes of the compiler's and dependencies' versions) are skipped.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest_dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let list = PathBuf::from(manifest_dir).join("symbol-order.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let optimised = env::var("OPT_LEVEL").is_ok_and(|level| level != "0");
    // The linker's arguments are passed through the C compiler, which splits them at commas.
    let path = list.to_string_lossy();
    if optimised && list.is_file() && !path.contains(',') && links_with_lld() {
        println!("cargo:rustc-link-arg-bin=sluicegate=-Wl,--symbol-ordering-file={path}");
        println!("cargo:rustc-link-arg-bin=sluicegate=-Wl,--no-warn-symbol-ordering");
    }
}

/// Whether rustc links this build with its own LLD: its default on x86_64-unknown-linux-gnu
/// since 1.90, unless a linker, a linker flavour or `-fuse-ld` is configured.
fn links_with_lld() -> bool {
    if env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu")
        || env::var_os("RUSTC_LINKER").is_some()
    {
        return false;
    }
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags.split('\x1f').any(|flag| {
        ["linker", "link-self-contained", "fuse-ld"]
            .iter()
            .any(|setting| flag.contains(setting))
    }) {
        return false;
    }
    rustc_minor_version().is_some_and(|minor| minor >= 90)
}

/// The minor version of the rustc cargo builds with (`release: 1.95.0` in `rustc -vV`).
fn rustc_minor_version() -> Option<u32> {
    let rustc = env::var_os("RUSTC")?;
    let output = Command::new(rustc).arg("-vV").output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let release = text
        .lines()
        .find_map(|line| line.strip_prefix("release: "))?;
    let mut numbers = release.split('.');
    match (numbers.next(), numbers.next()) {
        (Some("1"), Some(minor)) => minor.parse().ok(),
        _ => None,
    }
}
