//! `sluicegate trace`: its flags.

use std::io;

use anyhow::{Result, bail};
use clap::Args;

use super::args::{DurationArg, parse_duration_arg};
use crate::tools::trace;

#[derive(Args)]
pub(super) struct TraceArgs {
    #[arg(long, value_enum)]
    pattern: trace::Pattern,
    /// Mean requests per second, all keys together.
    #[arg(long)]
    rate: f64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100)]
    keys: u64,
    /// How long the trace lasts, e.g. 10m.
    #[arg(long, value_parser = parse_duration_arg)]
    duration: DurationArg,
    /// The window a boundary attack aims at.
    #[arg(long, default_value = "1m", value_parser = parse_duration_arg)]
    window: DurationArg,
    /// Seed of the random sequence: the same seed gives the same trace.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Mean units a request uses, known only after it (an LLM answer's tokens): each
    /// request becomes a peek and a report of what it used (exponential around the mean).
    #[arg(long, env = "SLUICEGATE_TRACE_USAGE")]
    usage: Option<f64>,
}

pub(super) fn run(args: &TraceArgs) -> Result<()> {
    let window = args.window.micros();
    if !(args.rate.is_finite() && args.rate > 0.0) || args.keys == 0 || window == 0 {
        bail!("--rate, --keys and --window must be positive");
    }
    if args
        .usage
        .is_some_and(|mean| !(mean.is_finite() && mean >= 1.0))
    {
        bail!("--usage must be a number of units, at least 1");
    }
    let spec = trace::TraceSpec {
        pattern: args.pattern,
        rate: args.rate,
        keys: args.keys,
        duration: args.duration.micros(),
        window,
        seed: args.seed,
        start: 1_700_000_000_000_000,
        usage: args.usage,
    };
    let mut out = io::BufWriter::new(io::stdout().lock());
    trace::write_trace(&spec, &mut out)?;
    io::Write::flush(&mut out)?;
    Ok(())
}
