//! The arguments several commands share: where state lives, a rule, how hard to drive.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;
use sluicegate::duration::parse_duration;
use sluicegate::{Algorithm, LogLayout, Rule, RuleSpec, StoreOptions};

use crate::tools::bench::Drive;

/// Where state lives.
#[derive(Args)]
pub(crate) struct StoreArgs {
    /// memory, redis://host:port, rediss://host:port (TLS), redis+unix:///path,
    /// redis-cluster://host:port,host:port or rediss-cluster://….
    #[arg(long, env = "SLUICEGATE_STORE", default_value = "memory")]
    pub(crate) store: String,
    /// Prefix of every Redis key.
    #[arg(long, env = "SLUICEGATE_PREFIX")]
    prefix: Option<String>,
    /// Per-call Redis timeout, e.g. 50ms.
    #[arg(long, env = "SLUICEGATE_STORE_TIMEOUT", default_value = "50ms")]
    store_timeout: String,
    /// PEM file of the authority that signed a TLS Redis server's certificate, when it is
    /// not in the system's trust store.
    #[arg(long, env = "SLUICEGATE_STORE_TLS_CA")]
    store_tls_ca: Option<PathBuf>,
}

impl StoreArgs {
    /// The options to open the store with; Redis keys under `default_prefix` unless
    /// `--prefix` says otherwise.
    pub(crate) fn options(&self, default_prefix: &str) -> Result<StoreOptions> {
        let mut options = StoreOptions::new(&self.store);
        options.prefix = self
            .prefix
            .clone()
            .unwrap_or_else(|| default_prefix.to_owned());
        let timeout = parse_duration(&self.store_timeout).context("--store-timeout")?;
        options.timeout = Duration::from_micros(timeout);
        options.tls_ca = self
            .store_tls_ca
            .as_ref()
            .map(|path| {
                std::fs::read(path)
                    .with_context(|| format!("--store-tls-ca: cannot read {}", path.display()))
            })
            .transpose()?;
        Ok(options)
    }
}

/// A rule's numbers, from the command line.
#[derive(Args)]
pub(crate) struct RuleShape {
    /// L: units per window.
    #[arg(long)]
    pub(crate) limit: u64,
    /// W: a duration such as 500ms, 1s, 90s, 1m, 1h, 1d.
    #[arg(long)]
    pub(crate) window: String,
    /// N: sliding-counter buckets (default 10).
    #[arg(long)]
    buckets: Option<u64>,
    /// B: token-bucket burst (default L).
    #[arg(long)]
    burst: Option<u64>,
    /// Q: leaky-bucket queue (default 0).
    #[arg(long)]
    queue: Option<u64>,
}

impl RuleShape {
    /// The spec of `algorithm` with these numbers.
    pub(crate) fn spec(&self, algorithm: Algorithm) -> Result<RuleSpec> {
        let window = parse_duration(&self.window).context("--window")?;
        Ok(RuleSpec {
            buckets: self.buckets,
            burst: self.burst,
            queue: self.queue,
            ..RuleSpec::new(algorithm, self.limit, window)
        })
    }
}

/// One rule, from the command line.
#[derive(Args)]
pub(crate) struct RuleArgs {
    /// sliding-log, sliding-counter, fixed-window, token-bucket or leaky-bucket.
    #[arg(long)]
    algorithm: String,
    #[command(flatten)]
    shape: RuleShape,
    /// Redis layout of a sliding-log: zset (default) or compact.
    #[arg(long)]
    layout: Option<String>,
}

impl RuleArgs {
    /// The rule, validated; its errors name the flag (`--window: …`).
    pub(crate) fn rule(&self) -> Result<Rule> {
        let algorithm: Algorithm = self.algorithm.parse().map_err(|e| anyhow!("--{e}"))?;
        let layout = self
            .layout
            .as_deref()
            .map(str::parse::<LogLayout>)
            .transpose()
            .map_err(|e| anyhow!("--{e}"))?;
        let spec = RuleSpec {
            layout,
            ..self.shape.spec(algorithm)?
        };
        Rule::new("cli", &spec).map_err(|e| anyhow!("--{e}"))
    }
}

/// How long and how fast `bench` and `load` drive, and how they report.
#[derive(Args)]
pub(crate) struct PaceArgs {
    /// How long to run, e.g. 10s.
    #[arg(long, default_value = "10s")]
    duration: String,
    /// A fixed total rate of calls per second instead of as fast as possible.
    #[arg(long)]
    rate: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

impl PaceArgs {
    /// The drive over `keys` distinct keys (given by the flag `keys_flag`) from
    /// `concurrency` tasks, checked before any work starts.
    pub(crate) fn drive(&self, keys: usize, keys_flag: &str, concurrency: usize) -> Result<Drive> {
        let duration = parse_duration(&self.duration).context("--duration")?;
        if keys == 0 || concurrency == 0 {
            bail!("{keys_flag} and --concurrency must be at least 1");
        }
        if self
            .rate
            .is_some_and(|rate| !(rate.is_finite() && rate > 0.0))
        {
            bail!("--rate must be a positive number of calls per second");
        }
        Ok(Drive {
            keys,
            concurrency,
            duration: Duration::from_micros(duration),
            rate: self.rate,
        })
    }
}
