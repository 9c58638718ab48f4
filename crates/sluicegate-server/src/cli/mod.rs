//! The command line: `sluicegate <command>`, its arguments, and the tools it runs.

mod serve;

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use sluicegate::duration::parse_duration;
use sluicegate::{Algorithm, AnyStore, LogLayout, Rule, RuleSpec, StoreOptions};

use self::serve::ServeArgs;
use crate::tools::trace_file::{TraceFile, TraceFormat};
use crate::tools::{bench, clf, load, plan, replay, simulate, trace};

#[derive(Parser)]
#[command(
    name = "sluicegate",
    version,
    about = "Exact sliding-window rate limiting"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the rate-limit service (HTTP JSON API), in memory by default.
    Serve(ServeArgs),
    /// Decide SPEC.md's replay CSV from stdin with the caller's timestamps; one decision
    /// line per input line on stdout.
    Replay(ReplayArgs),
    /// Measure decisions per second and latency against a store.
    Bench(BenchArgs),
    /// Replay a trace through every algorithm and compare each with the exact sliding log.
    Simulate(SimulateArgs),
    /// Write a synthetic trace in SPEC.md's replay CSV.
    Trace(TraceArgs),
    /// The Redis memory each algorithm and layout needs for a workload.
    Plan(PlanArgs),
    /// Drive a running service over HTTP or gRPC: decisions per second and latency.
    Load(LoadArgs),
}

#[derive(Args)]
struct LoadArgs {
    /// The service's address, host:port.
    #[arg(long)]
    target: String,
    #[arg(long, value_enum, default_value = "http")]
    protocol: load::Protocol,
    /// The descriptors' domain.
    #[arg(long, default_value = "example")]
    domain: String,
    /// The descriptors' key; values are load-0 … load-(N−1).
    #[arg(long, default_value = "user")]
    key: String,
    /// Distinct descriptor values, picked at random.
    #[arg(long, default_value_t = 1000)]
    values: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    #[command(flatten)]
    pace: PaceArgs,
}

/// How long and how fast `bench` and `load` drive, and how they report.
#[derive(Args)]
struct PaceArgs {
    /// How long to run, e.g. 10s.
    #[arg(long, default_value = "10s")]
    duration: String,
    /// A fixed total rate of calls per second instead of as fast as possible.
    #[arg(long)]
    rate: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

impl PaceArgs {
    /// The drive over `keys` distinct keys (given by the flag `keys_flag`) from
    /// `concurrency` tasks, checked before any work starts.
    fn drive(&self, keys: usize, keys_flag: &str, concurrency: usize) -> Result<bench::Drive> {
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
        Ok(bench::Drive {
            keys,
            concurrency,
            duration: Duration::from_micros(duration),
            rate: self.rate,
        })
    }
}

#[derive(Args)]
struct SimulateArgs {
    /// The trace file.
    #[arg(long)]
    trace: PathBuf,
    #[arg(long, value_enum, default_value = "csv")]
    format: TraceFormat,
    /// With --format clf: which field is the key.
    #[arg(long, value_enum, default_value = "host")]
    key_field: clf::KeyField,
    #[command(flatten)]
    shape: RuleShape,
    /// Write an SVG chart of admitted requests over time here.
    #[arg(long)]
    chart: Option<PathBuf>,
}

#[derive(Args)]
struct TraceArgs {
    #[arg(long, value_enum)]
    pattern: trace::Pattern,
    /// Mean requests per second, all keys together.
    #[arg(long)]
    rate: f64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100)]
    keys: u64,
    /// How long the trace lasts, e.g. 10m.
    #[arg(long)]
    duration: String,
    /// The window a boundary attack aims at.
    #[arg(long, default_value = "1m")]
    window: String,
    /// Seed of the random sequence: the same seed gives the same trace.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
struct PlanArgs {
    /// Requests per second, all keys together.
    #[arg(long)]
    qps: f64,
    /// W, e.g. 1m.
    #[arg(long)]
    window: String,
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

/// Where state lives.
#[derive(Args)]
struct StoreArgs {
    /// memory, redis://host:port, rediss://host:port (TLS), redis+unix:///path,
    /// redis-cluster://host:port,host:port or rediss-cluster://….
    #[arg(long, env = "SLUICEGATE_STORE", default_value = "memory")]
    store: String,
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
    fn options(&self, default_prefix: &str) -> Result<StoreOptions> {
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

#[derive(Args)]
struct ReplayArgs {
    #[command(flatten)]
    rule: RuleArgs,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Args)]
struct BenchArgs {
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

/// A rule's numbers, from the command line.
#[derive(Args)]
struct RuleShape {
    /// L: units per window.
    #[arg(long)]
    limit: u64,
    /// W: a duration such as 500ms, 1s, 90s, 1m, 1h, 1d.
    #[arg(long)]
    window: String,
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
    fn spec(&self, algorithm: Algorithm) -> Result<RuleSpec> {
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
struct RuleArgs {
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
    fn rule(&self) -> Result<Rule> {
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

/// Runs the command line: parses the arguments, runs the command, and says how it ended.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::serve(args).map_err(anyhow::Error::msg),
        Command::Replay(args) => run_replay(&args),
        Command::Bench(args) => run_bench(&args),
        Command::Simulate(args) => run_simulate(&args),
        Command::Trace(args) => run_trace(&args),
        Command::Plan(args) => run_plan(&args),
        Command::Load(args) => run_load(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `:#` writes the whole chain: what was being done, then why it failed.
            eprintln!("sluicegate: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")
}

fn run_replay(args: &ReplayArgs) -> Result<()> {
    let rule = args.rule.rule()?;
    runtime()?.block_on(async {
        let store = if args.store.store == "memory" {
            AnyStore::Memory(replay::trace_store())
        } else {
            // A prefix of its own per run, so a replay never meets another's state.
            let unique = format!(
                "sluicegate:replay:{}-{}:",
                std::process::id(),
                sluicegate::Clock::now_micros(&sluicegate::SystemClock::new())
            );
            AnyStore::open(args.store.options(&unique)?).await?
        };
        let output = io::BufWriter::new(io::stdout().lock());
        replay::replay(&store, &rule, io::stdin().lock(), output).await
    })
}

fn run_bench(args: &BenchArgs) -> Result<()> {
    let rule = args.rule.rule()?;
    let drive = args.pace.drive(args.keys, "--keys", args.concurrency)?;
    runtime()?.block_on(async {
        let unique = format!("sluicegate:bench:{}:", std::process::id());
        let store = AnyStore::open(args.store.options(&unique)?).await?;
        let plan = bench::BenchPlan {
            store_name: args.store.store.clone(),
            drive,
            negative_cache: args.negative_cache,
        };
        bench::run(store, rule, plan).await.print(args.pace.json)
    })
}

fn run_trace(args: &TraceArgs) -> Result<()> {
    let duration = parse_duration(&args.duration).context("--duration")?;
    let window = parse_duration(&args.window).context("--window")?;
    if !(args.rate.is_finite() && args.rate > 0.0) || args.keys == 0 || window == 0 {
        bail!("--rate, --keys and --window must be positive");
    }
    let spec = trace::TraceSpec {
        pattern: args.pattern,
        rate: args.rate,
        keys: args.keys,
        duration,
        window,
        seed: args.seed,
        start: 1_700_000_000_000_000,
    };
    let mut out = io::BufWriter::new(io::stdout().lock());
    trace::write_trace(&spec, &mut out)?;
    io::Write::flush(&mut out)?;
    Ok(())
}

fn run_simulate(args: &SimulateArgs) -> Result<()> {
    let spec = args.shape.spec(Algorithm::SlidingLog)?;
    let trace = TraceFile::open(&args.trace, args.format, args.key_field)?;
    simulate::run(trace, &spec, &args.shape.window, args.chart.as_deref())
}

fn run_load(args: LoadArgs) -> Result<()> {
    let drive = args.pace.drive(args.values, "--values", args.concurrency)?;
    let target = load::Target {
        address: args.target,
        protocol: args.protocol,
        domain: args.domain,
        key: args.key,
    };
    runtime()?
        .block_on(load::run(target, drive))?
        .print(args.pace.json)
}

fn run_plan(args: &PlanArgs) -> Result<()> {
    let window = parse_duration(&args.window).context("--window")?;
    if !(args.qps.is_finite() && args.qps > 0.0) || args.keys == 0 {
        bail!("--qps and --keys must be positive");
    }
    let workload = plan::Workload {
        qps: args.qps,
        window,
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
