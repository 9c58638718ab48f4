//! The arguments several commands share: where state lives, a rule, how hard to drive,
//! and the value parser of every duration flag.

use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;
use sluicegate::internals::{DurationError, parse_duration};
use sluicegate::{
    Algorithm, Durability, LogLayout, Rule, RuleSpec, StoreOptions, StoreUrl, StoreUrlError,
    TlsClientIdentity,
};

use crate::tools::bench::Drive;

/// The secret in the file `path` names, for `flag`: its text without the surrounding
/// whitespace (an editor's final newline). A file that cannot be read, or holds no
/// token, is an error naming the flag.
pub(crate) fn read_token_file(path: &std::path::Path, flag: &str) -> Result<std::sync::Arc<str>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{flag} {}: cannot read the token", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        bail!("{flag} {}: the file holds no token", path.display());
    }
    Ok(token.into())
}

/// A duration flag's value, read by [`parse_duration_arg`]: whole µs, and the text as the
/// user wrote it (a report echoes the user's own words back).
#[derive(Clone, Debug)]
pub(crate) struct DurationArg {
    micros: u64,
    written: String,
}

impl DurationArg {
    /// The duration in µs, the unit of every time in docs/SPEC.md.
    pub(crate) fn micros(&self) -> u64 {
        self.micros
    }

    /// The duration, for timeouts and timers.
    pub(crate) fn duration(&self) -> Duration {
        Duration::from_micros(self.micros)
    }

    /// The flag's text, as given.
    pub(crate) fn as_written(&self) -> &str {
        &self.written
    }
}

/// The local pre-check (two-tier limiting): `--local-precheck [FACTOR]`, shared by the
/// commands that run a limiter.
#[derive(Args)]
pub(crate) struct PrecheckArgs {
    /// Refuse on this instance alone what it would send the store past FACTOR × L /
    /// --instances of a rule (1.2 when given without a value; off by default). Saves round
    /// trips of clients far over their limit, but refuses what the limit would admit when
    /// traffic is spread unevenly over the instances.
    #[arg(
        long,
        env = "SLUICEGATE_LOCAL_PRECHECK",
        value_name = "FACTOR",
        num_args = 0..=1,
        default_missing_value = "1.2",
        value_parser = parse_precheck_factor
    )]
    pub(crate) local_precheck: Option<f64>,
}

/// A pre-check factor: a number of at least 1 (below 1 it would refuse evenly spread
/// traffic the limit admits).
fn parse_precheck_factor(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(factor) if factor.is_finite() && (1.0..=1000.0).contains(&factor) => Ok(factor),
        _ => Err(format!(
            "{text:?} is not a factor from 1 to 1000, such as 1.2"
        )),
    }
}

/// clap's value parser for duration flags (`value_parser = parse_duration_arg`): the
/// value arrives parsed, and a bad one is reported by clap, naming the flag.
pub(crate) fn parse_duration_arg(text: &str) -> Result<DurationArg, DurationError> {
    Ok(DurationArg {
        micros: parse_duration(text)?,
        written: text.to_owned(),
    })
}

/// Where state lives.
#[derive(Args)]
pub(crate) struct StoreArgs {
    /// memory, redis://host:port, rediss://host:port (TLS), redis+unix:///path,
    /// redis-cluster://host:port,host:port, rediss-cluster://…, or
    /// redis+sentinel://host:port,host:port/master-name (rediss+sentinel://… for TLS).
    #[arg(long, env = "SLUICEGATE_STORE", default_value = "memory", value_parser = parse_store_url)]
    pub(crate) store: String,
    /// Prefix of every Redis key [default: sluicegate:; none with serve --compat envoy, as
    /// envoy's CACHE_KEY_PREFIX].
    #[arg(long, env = "SLUICEGATE_PREFIX")]
    prefix: Option<String>,
    /// Per-call Redis timeout. The default is the library's (a test holds them equal).
    #[arg(long, env = "SLUICEGATE_STORE_TIMEOUT", default_value = "250ms", value_parser = parse_duration_arg)]
    store_timeout: DurationArg,
    /// PEM file of the authority that signed a TLS Redis server's certificate, when it is
    /// not in the system's trust store.
    #[arg(long, env = "SLUICEGATE_STORE_TLS_CA")]
    store_tls_ca: Option<PathBuf>,
    /// PEM certificate presented to a TLS Redis that asks clients for one
    /// (`tls-auth-clients`).
    #[arg(long, env = "SLUICEGATE_STORE_TLS_CERT", requires = "store_tls_key")]
    store_tls_cert: Option<PathBuf>,
    /// The --store-tls-cert certificate's private key (PEM).
    #[arg(long, env = "SLUICEGATE_STORE_TLS_KEY", requires = "store_tls_cert")]
    store_tls_key: Option<PathBuf>,
    /// How often Redis' maxmemory-policy is read again after connecting (0s: at connect
    /// only); any policy but noeviction is warned about.
    #[arg(long, env = "SLUICEGATE_EVICTION_CHECK_INTERVAL", default_value = "60s", value_parser = parse_duration_arg)]
    eviction_check_interval: DurationArg,
    /// How often each Redis node is checked for state it lost (a restart without
    /// persistence, a flush, a failover that lost writes: an epoch marker, run_id and
    /// replication offsets); a loss is logged, counted and shown in /readyz. 0s: never
    /// (no epoch marker is written).
    #[arg(long, env = "SLUICEGATE_LOST_STATE_CHECK_INTERVAL", default_value = "1s", value_parser = parse_duration_arg)]
    lost_state_check_interval: DurationArg,
    /// async, or replicated: a check that admitted answers only once a Redis replica
    /// acknowledged it (WAIT 1, within half --store-timeout), else it fails and
    /// --on-store-error answers. Needs a replica of every master.
    #[arg(long, env = "SLUICEGATE_STORE_DURABILITY", default_value = "async")]
    store_durability: Durability,
}

/// A store URL as written, checked by [`StoreUrl`] when the flags are read (kept as text:
/// the store is opened from it, password included).
fn parse_store_url(text: &str) -> Result<String, StoreUrlError> {
    StoreUrl::parse(text).map(|_| text.to_owned())
}

impl StoreArgs {
    /// State lives in this process.
    pub(crate) fn is_memory(&self) -> bool {
        StoreUrl::parse(&self.store).is_ok_and(|url| url.is_memory())
    }

    /// The options to open the store with; Redis keys under `default_prefix` unless
    /// `--prefix` says otherwise.
    pub(crate) fn options(&self, default_prefix: &str) -> Result<StoreOptions> {
        let mut options = StoreOptions::new(&self.store);
        options.prefix = self
            .prefix
            .clone()
            .unwrap_or_else(|| default_prefix.to_owned());
        options.timeout = self.store_timeout.duration();
        options.eviction_check_interval = self.eviction_check_interval.duration();
        options.lost_state_check_interval = self.lost_state_check_interval.duration();
        anyhow::ensure!(
            !(self.is_memory() && self.store_durability == Durability::Replicated),
            "--store-durability replicated needs a Redis store with replicas; the in-memory \
             store has none"
        );
        options.durability = self.store_durability;
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("{flag}: cannot read {}", path.display()))
        };
        options.tls_ca = self
            .store_tls_ca
            .as_ref()
            .map(|path| read("--store-tls-ca", path))
            .transpose()?;
        if let (Some(cert), Some(key)) = (&self.store_tls_cert, &self.store_tls_key) {
            options.tls_client = Some(TlsClientIdentity {
                cert: read("--store-tls-cert", cert)?,
                key: read("--store-tls-key", key)?,
            });
        }
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
    #[arg(long, value_parser = parse_duration_arg)]
    pub(crate) window: DurationArg,
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
    pub(crate) fn spec(&self, algorithm: Algorithm) -> RuleSpec {
        RuleSpec {
            buckets: self.buckets,
            burst: self.burst,
            queue: self.queue,
            ..RuleSpec::new(
                algorithm,
                self.limit,
                Duration::from_micros(self.window.micros()),
            )
        }
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
            ..self.shape.spec(algorithm)
        };
        Rule::new("cli", &spec).map_err(|e| anyhow!("--{e}"))
    }
}

/// How long `bench` and `load` run when nothing else bounds them.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);

/// How long and how fast `bench` and `load` drive, and how they report.
#[derive(Args)]
pub(crate) struct PaceArgs {
    /// How long to run, e.g. 10s [default: 10s; for `load --requests`, until they are
    /// sent].
    #[arg(long, value_parser = parse_duration_arg)]
    duration: Option<DurationArg>,
    /// A fixed total rate of calls per second instead of as fast as possible.
    #[arg(long)]
    rate: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

impl PaceArgs {
    /// The drive over `keys` distinct keys (given by the flag `keys_flag`) from
    /// `concurrency` tasks, stopping after `requests` calls if given (and after
    /// `--duration` if given too), checked before any work starts.
    pub(crate) fn drive(
        &self,
        keys: usize,
        keys_flag: &str,
        concurrency: usize,
        requests: Option<NonZeroU64>,
    ) -> Result<Drive> {
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
            duration: match (&self.duration, requests) {
                (Some(duration), _) => Some(duration.duration()),
                (None, None) => Some(DEFAULT_DURATION),
                (None, Some(_)) => None,
            },
            requests,
            rate: self.rate,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[arg(long, value_parser = parse_duration_arg)]
        window: DurationArg,
    }

    #[test]
    fn durations_arrive_parsed_and_keep_their_text() {
        let flags = Flags::try_parse_from(["test", "--window", "60s"]).unwrap();
        assert_eq!(flags.window.micros(), 60_000_000);
        assert_eq!(flags.window.duration(), Duration::from_secs(60));
        assert_eq!(flags.window.as_written(), "60s");
    }

    #[test]
    fn a_bad_duration_is_reported_by_clap_naming_the_flag() {
        let err = Flags::try_parse_from(["test", "--window", "1x"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("'--window <WINDOW>'"), "{err}");
        assert!(
            err.contains(r#"invalid duration "1x": unknown unit"#),
            "{err}"
        );
    }
}
