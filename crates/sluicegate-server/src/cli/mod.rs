//! The command line: `sluicegate <command>`. Each command's flags live next to the code
//! that runs it (one file per command); the flags several commands share in `args`.

mod args;
mod bench;
mod check;
mod envoy_env;
mod explain;
#[cfg(test)]
mod flags_doc;
mod load;
mod logging;
mod plan;
mod replay;
mod runtime;
mod serve;
mod simulate;
mod stats;
mod trace;

pub use serve::ServeArgs;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sluicegate",
    version,
    about = "Exact sliding-window rate limiting"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the rate-limit service — the HTTP JSON API and Envoy's gRPC rate-limit service
    /// on one port — in memory by default.
    // Boxed: the service's flags outweigh every other command's.
    Serve(Box<serve::ServeArgs>),
    /// Decide docs/SPEC.md's replay CSV from stdin with the caller's timestamps; one decision
    /// line per input line on stdout.
    Replay(replay::ReplayArgs),
    /// Measure decisions per second and latency against a store.
    Bench(bench::BenchArgs),
    /// Replay a trace through every algorithm and compare each with the exact sliding log.
    Simulate(simulate::SimulateArgs),
    /// Write a synthetic trace in docs/SPEC.md's replay CSV.
    Trace(trace::TraceArgs),
    /// The Redis memory each algorithm and layout needs for a workload.
    Plan(plan::PlanArgs),
    /// Drive a running service over HTTP or gRPC: decisions per second and latency.
    Load(load::LoadArgs),
    /// Ask a running service for one decision, over HTTP or gRPC, and print it. Exit
    /// status as grep's: 0 allowed, 1 over the limit, 2 no decision.
    Check(check::CheckArgs),
    /// Ask a running service why it would allow or refuse a request (POST /v1/explain),
    /// counting nothing, and print the explanation. Exit status as check's: 0 would be
    /// admitted, 1 would be refused, 2 no explanation.
    Explain(explain::ExplainArgs),
}

/// Runs the command line: parses the arguments, runs the command, and says how it ended.
pub fn main() -> ExitCode {
    let argv = as_envoy_ratelimit(std::env::args_os().collect());
    let argv = envoy_env::with_envoy_env(argv, &|name| std::env::var(name).ok());
    let (cli, envoy_warnings) = match argv {
        Ok(envoy) => (Cli::parse_from(envoy.argv), envoy.warnings),
        Err(error) => {
            eprintln!("sluicegate: error: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => serve::serve(*args, &envoy_warnings),
        Command::Replay(args) => replay::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Trace(args) => trace::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Load(args) => load::run(args),
        Command::Check(args) => return verdict(check::run(&args)),
        Command::Explain(args) => return verdict(explain::run(&args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => failed(&error, ExitCode::FAILURE),
    }
}

/// The name envoyproxy/ratelimit's binary goes by. Deployments that run it name the
/// command and cannot change it (Envoy Gateway's rate-limit Deployment runs `/bin/ratelimit`
/// and lets its users swap only the image), so invoked under that name the binary is
/// `sluicegate serve --compat envoy`, its flags taken from envoy's environment.
const ENVOY_RATELIMIT_BINARY: &str = "ratelimit";

/// `argv` as `sluicegate serve --compat envoy ARGS…` when the program was invoked as
/// [`ENVOY_RATELIMIT_BINARY`]; unchanged otherwise.
fn as_envoy_ratelimit(argv: Vec<OsString>) -> Vec<OsString> {
    let invoked_as = argv
        .first()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name);
    if invoked_as != Some(ENVOY_RATELIMIT_BINARY.as_ref()) {
        return argv;
    }
    let mut rest = argv.into_iter();
    let program = rest.next().unwrap_or_default();
    [program, "serve".into(), "--compat".into(), "envoy".into()]
        .into_iter()
        .chain(rest)
        .collect()
}

/// A yes-or-no command's exit status, as grep's: 0 yes, 1 no, 2 no answer.
fn verdict(answer: anyhow::Result<bool>) -> ExitCode {
    match answer {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => failed(&error, ExitCode::from(2)),
    }
}

/// Says why a command failed, and ends with `code`.
fn failed(error: &anyhow::Error, code: ExitCode) -> ExitCode {
    // `:#` writes the whole chain: what was being done, then why it failed.
    eprintln!("sluicegate: error: {error:#}");
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(argv: &[&str]) -> Vec<OsString> {
        argv.iter().map(OsString::from).collect()
    }

    #[test]
    fn invoked_as_envoys_binary_it_serves_with_envoy_compatibility() {
        assert_eq!(
            as_envoy_ratelimit(args(&["/bin/ratelimit"])),
            args(&["/bin/ratelimit", "serve", "--compat", "envoy"])
        );
        assert_eq!(
            as_envoy_ratelimit(args(&["ratelimit", "--log-level", "debug"])),
            args(&[
                "ratelimit",
                "serve",
                "--compat",
                "envoy",
                "--log-level",
                "debug"
            ])
        );
        for other in [
            &["/usr/local/bin/sluicegate", "serve"][..],
            &["/bin/ratelimit-client"],
            &["ratelimit/sluicegate", "check"],
            &[],
        ] {
            assert_eq!(as_envoy_ratelimit(args(other)), args(other));
        }
    }
}
