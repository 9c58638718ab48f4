//! `sluicegate load`: its flags.

use std::num::NonZeroU64;

use anyhow::Result;
use clap::Args;

use super::args::PaceArgs;
use super::runtime::runtime_without_lifo_slot;
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
    /// The descriptors' key; values are load-0 … load-(N−1). The default workload, the
    /// example rules' remote_address (100 per minute, fixed window) over 200,000 values,
    /// keeps every value under its limit up to ~300,000 requests/s: it measures
    /// admissions, the decisions that write to the store.
    #[arg(long, default_value = "remote_address")]
    key: String,
    /// Distinct descriptor values, picked at random.
    #[arg(long, default_value_t = 200_000)]
    values: usize,
    /// Requests in flight at once: one per task, each task on its own connection over
    /// HTTP, the tasks sharing up to 8 connections over gRPC.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Stop after this many requests (answered or not); without --duration, the run
    /// lasts until they are sent.
    #[arg(long, env = "SLUICEGATE_LOAD_REQUESTS")]
    requests: Option<NonZeroU64>,
    /// Each task opens a new connection after this many requests on one, closing the old
    /// one (over gRPC each task then has connections of its own) [default: unlimited].
    #[arg(long, env = "SLUICEGATE_LOAD_REQUESTS_PER_CONNECTION")]
    requests_per_connection: Option<NonZeroU64>,
    #[command(flatten)]
    pace: PaceArgs,
}

pub(super) fn run(args: LoadArgs) -> Result<()> {
    let drive = args
        .pace
        .drive(args.values, "--values", args.concurrency, args.requests)?;
    let target = load::Target {
        address: args.target,
        protocol: args.protocol,
        domain: args.domain,
        key: args.key,
        requests_per_connection: args.requests_per_connection,
    };
    let report = runtime_without_lifo_slot()?.block_on(load::run(target, drive))?;
    report.print(args.pace.json)?;
    report.verdict()
}
