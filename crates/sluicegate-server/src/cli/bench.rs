//! `sluicegate bench`: its flags, and the store it measures.

use anyhow::Result;
use clap::Args;
use sluicegate::AnyStore;

use super::args::{PaceArgs, RuleArgs, StoreArgs};
use super::runtime::runtime;
use crate::tools::bench;

#[derive(Args)]
pub(super) struct BenchArgs {
    #[command(flatten)]
    rule: RuleArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// Distinct keys, picked at random.
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    /// Checks in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[command(flatten)]
    pace: PaceArgs,
    /// Answer repeated refusals locally, without a store call.
    #[arg(long)]
    negative_cache: bool,
}

pub(super) fn run(args: &BenchArgs) -> Result<()> {
    let rule = args.rule.rule()?;
    let drive = args
        .pace
        .drive(args.keys, "--keys", args.concurrency, None)?;
    runtime()?.block_on(async {
        let unique = format!("sluicegate:bench:{}:", std::process::id());
        let store = AnyStore::open(args.store.options(&unique)?).await?;
        let plan = bench::BenchPlan {
            store_name: args.store.store.clone(),
            drive,
            negative_cache: args.negative_cache,
        };
        let report = bench::run(store, rule, plan).await;
        report.print(args.pace.json)?;
        report.verdict()
    })
}
