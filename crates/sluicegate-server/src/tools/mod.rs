//! The tools of the command line: replay, bench, load, simulate, trace, plan, and what
//! they share (trace files and access logs, Redis memory estimates, the chart). They know
//! nothing of the command line: `cli` turns flags into their inputs.

pub(crate) mod bench;
mod chart;
pub(crate) mod clf;
pub(crate) mod load;
pub(crate) mod plan;
mod redis_memory;
pub(crate) mod replay;
pub(crate) mod simulate;
pub(crate) mod trace;
pub(crate) mod trace_file;
