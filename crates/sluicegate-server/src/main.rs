//! `sluicegate`: the rate-limit service and its tools.

fn main() -> std::process::ExitCode {
    sluicegate_server::cli::main()
}
