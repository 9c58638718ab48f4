//! `sluicegate load`: its flags.

use anyhow::Result;
use clap::Args;

use super::args::PaceArgs;
use super::runtime::runtime;
use crate::tools::load;

#[derive(Args)]
pub(super) struct LoadArgs {
    /// The service's address, host:port.
    #[arg(long)]
    target: String,
    #[arg(long, value_enum, default_value = "http")]
    protocol: load::Protocol,
    /// The descriptors' domain.
    #[arg(long, default_value = "example")]
    domain: String,
    /// The descriptors' key; values are load-0 … load-(N−1).
    #[arg(long, default_value = "user")]
    key: String,
    /// Distinct descriptor values, picked at random.
    #[arg(long, default_value_t = 1000)]
    values: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    #[command(flatten)]
    pace: PaceArgs,
}

pub(super) fn run(args: LoadArgs) -> Result<()> {
    let drive = args.pace.drive(args.values, "--values", args.concurrency)?;
    let target = load::Target {
        address: args.target,
        protocol: args.protocol,
        domain: args.domain,
        key: args.key,
    };
    let report = runtime()?.block_on(load::run(target, drive))?;
    report.print(args.pace.json)?;
    report.verdict()
}
