//! `sluicegate replay`: its flags, and which store the replay decides in.

use std::io;

use anyhow::Result;
use clap::Args;
use sluicegate::AnyStore;

use super::args::{RuleArgs, StoreArgs};
use super::runtime::runtime;
use crate::tools::replay;

#[derive(Args)]
pub(super) struct ReplayArgs {
    #[command(flatten)]
    rule: RuleArgs,
    #[command(flatten)]
    store: StoreArgs,
}

pub(super) fn run(args: &ReplayArgs) -> Result<()> {
    let rule = args.rule.rule()?;
    runtime()?.block_on(async {
        let store = if args.store.is_memory() {
            AnyStore::Memory(replay::trace_store())
        } else {
            // A prefix of its own per run, so a replay never meets another's state.
            let unique = format!(
                "sluicegate:replay:{}-{}:",
                std::process::id(),
                sluicegate::internals::saturating_micros(sluicegate::Clock::now(
                    &sluicegate::SystemClock::new()
                ))
            );
            AnyStore::open(args.store.options(&unique)?).await?
        };
        let output = io::BufWriter::new(io::stdout().lock());
        replay::replay(&store, &rule, io::stdin().lock(), output).await
    })
}
