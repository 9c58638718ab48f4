//! `sluicegate plan`: its flags.

use anyhow::{Result, bail};
use clap::Args;

use super::args::{DurationArg, parse_duration_arg};
use super::runtime::runtime;
use crate::tools::plan;

#[derive(Args)]
pub(super) struct PlanArgs {
    /// Requests per second, all keys together.
    #[arg(long)]
    qps: f64,
    /// W, e.g. 1m.
    #[arg(long, value_parser = parse_duration_arg)]
    window: DurationArg,
    /// Distinct keys.
    #[arg(long)]
    keys: u64,
    /// L (default: what a key sends in a window).
    #[arg(long)]
    limit: Option<u64>,
    /// N for sliding-counter.
    #[arg(long, default_value_t = 10)]
    buckets: u64,
    /// Measure on this Redis (keys under a throwaway prefix, deleted afterwards).
    #[arg(long)]
    redis: Option<String>,
}

pub(super) fn run(args: &PlanArgs) -> Result<()> {
    if !(args.qps.is_finite() && args.qps > 0.0) || args.keys == 0 {
        bail!("--qps and --keys must be positive");
    }
    let workload = plan::Workload {
        qps: args.qps,
        window: args.window.micros(),
        keys: args.keys,
        limit: args.limit,
        buckets: args.buckets,
    };
    let rows = workload.rows()?;
    let measured = match &args.redis {
        None => None,
        Some(url) => Some(runtime()?.block_on(plan::measure_on(url, &rows))?),
    };
    print!("{}", plan::table(&workload, &rows, measured.as_deref()));
    Ok(())
}
