//! `sluicegate`: the rate-limit service and its tools.

/// mimalloc rather than the system's allocator: every call allocates dozens of small and
/// a few KiB-sized blocks (futures, tasks, buffers) on one worker thread and frees many
/// on another, which glibc's malloc answers with arena locks and consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sluicegate_server::cli::main()
}
