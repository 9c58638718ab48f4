//! `sluicegate simulate`: its flags.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use sluicegate::Algorithm;

use super::args::RuleShape;
use crate::tools::clf::KeyField;
use crate::tools::simulate;
use crate::tools::trace_file::{TraceFile, TraceFormat};

#[derive(Args)]
pub(super) struct SimulateArgs {
    /// The trace file.
    #[arg(long)]
    trace: PathBuf,
    #[arg(long, value_enum, default_value = "csv")]
    format: TraceFormat,
    /// With --format clf: which field is the key.
    #[arg(long, value_enum, default_value = "host")]
    key_field: KeyField,
    #[command(flatten)]
    shape: RuleShape,
    /// Write an SVG chart here: per algorithm, the most units one key had admitted within
    /// a window over time, against the limit and the exact log; the offered load apart.
    #[arg(long)]
    chart: Option<PathBuf>,
}

pub(super) fn run(args: &SimulateArgs) -> Result<()> {
    let spec = args.shape.spec(Algorithm::SlidingLog);
    let trace = TraceFile::open(&args.trace, args.format, args.key_field)?;
    simulate::run(
        trace,
        &spec,
        args.shape.window.as_written(),
        args.chart.as_deref(),
    )
}
