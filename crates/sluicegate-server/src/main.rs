//! `sluicegate`: the rate-limit service and its tools.

/// mimalloc rather than the system's allocator: every call allocates dozens of small and
/// a few KiB-sized blocks (futures, tasks, buffers) on one worker thread and frees many
/// on another, which glibc's malloc answers with arena locks and consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // mimalloc reserves its memory as one 1 GiB arena. Where the kernel hands out
    // transparent huge pages, every 2 MiB of it that the service touches would be resident
    // whole: an idle service held 28 MiB instead of 15. Built without asking for them
    // (Cargo.toml: no_thp) it gets none where the kernel gives them on request only; this
    // turns them off for the process where it gives them to all memory. A kernel that
    // lacks the switch (before 3.15) has none to give either way.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    sluicegate_server::cli::main()
}
