//! The tools of the command line: replay, bench, load, simulate, trace, plan.

pub(crate) mod bench;
pub(crate) mod clf;
pub(crate) mod load;
pub(crate) mod plan;
pub(crate) mod replay;
pub(crate) mod simulate;
pub(crate) mod trace;
