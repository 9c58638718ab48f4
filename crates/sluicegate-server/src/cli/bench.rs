//! `sluicegate bench`: its flags, and the store it measures.

use anyhow::Result;
use clap::Args;
use sluicegate::AnyStore;

use super::args::{PaceArgs, PrecheckArgs, RuleArgs, StoreArgs};
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
    #[command(flatten)]
    precheck: PrecheckArgs,
    /// How many instances the bench plays one of (for --local-precheck).
    #[arg(long, env = "SLUICEGATE_INSTANCES", default_value_t = 1)]
    instances: u32,
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
            local_precheck: args.precheck.local_precheck,
            instances: args.instances.max(1),
        };
        let report = bench::run(store, rule, plan).await;
        report.print(args.pace.json)?;
        report.verdict()
    })
}
