//! `sluicegate`: the rate-limit service and its tools.

mod bench;
mod clf;
mod config;
mod decide;
mod grpc;
mod http;
mod load;
mod metrics;
mod plan;
mod replay;
mod simulate;
mod trace;

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sluicegate::duration::parse_duration;
use sluicegate::{
    Algorithm, AnyStore, Limiter, LogLayout, ManualClock, MemoryStore, MemoryStoreConfig, Rule,
    RuleSpec, StoreOptions,
};

use crate::config::Config;

/// The example configuration `serve` uses when no `--config` is given (examples/).
const EXAMPLE_CONFIG: &str = include_str!("../../../examples/sluicegate.yaml");

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
    fn drive(
        &self,
        keys: usize,
        keys_flag: &str,
        concurrency: usize,
    ) -> Result<bench::Drive, String> {
        let duration = parse_duration(&self.duration).map_err(|e| format!("--duration: {e}"))?;
        if keys == 0 || concurrency == 0 {
            return Err(format!("{keys_flag} and --concurrency must be at least 1"));
        }
        if self
            .rate
            .is_some_and(|rate| !(rate.is_finite() && rate > 0.0))
        {
            return Err("--rate must be a positive number of calls per second".into());
        }
        Ok(bench::Drive {
            keys,
            concurrency,
            duration: Duration::from_micros(duration),
            rate: self.rate,
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TraceFormat {
    /// SPEC.md's replay CSV: time_us,key,cost[,request_id].
    Csv,
    /// Common or Combined Log Format access logs.
    Clf,
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
    fn options(&self, default_prefix: &str) -> Result<StoreOptions, String> {
        let mut options = StoreOptions::new(&self.store);
        options.prefix = self
            .prefix
            .clone()
            .unwrap_or_else(|| default_prefix.to_owned());
        let timeout =
            parse_duration(&self.store_timeout).map_err(|e| format!("--store-timeout: {e}"))?;
        options.timeout = Duration::from_micros(timeout);
        options.tls_ca = self
            .store_tls_ca
            .as_ref()
            .map(|path| {
                std::fs::read(path)
                    .map_err(|e| format!("--store-tls-ca: cannot read {}: {e}", path.display()))
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

#[derive(Args)]
struct ServeArgs {
    /// Descriptor configuration (YAML). Without it, the example rules of
    /// examples/sluicegate.yaml are served.
    #[arg(long, env = "SLUICEGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "SLUICEGATE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    store: StoreArgs,
    /// When the store fails: error (answer 503), allow, deny, or local (an in-memory
    /// limiter allowing L / --instances). Rules may set their own (on_store_error).
    #[arg(long, env = "SLUICEGATE_ON_STORE_ERROR", default_value = "error")]
    on_store_error: sluicegate::FailurePolicy,
    /// How many instances share the store (for the local fallback).
    #[arg(long, env = "SLUICEGATE_INSTANCES", default_value_t = 1)]
    instances: u32,
    /// Consecutive store failures that open the circuit breaker (0: never).
    #[arg(long, env = "SLUICEGATE_BREAKER_FAILURES", default_value_t = 5)]
    breaker_failures: u32,
    /// How long an open breaker waits before probing the store again.
    #[arg(long, env = "SLUICEGATE_BREAKER_COOL_DOWN", default_value = "1s")]
    breaker_cool_down: String,
    /// Do not answer repeated refusals locally (the negative cache is on for Redis).
    #[arg(long, env = "SLUICEGATE_NO_NEGATIVE_CACHE")]
    no_negative_cache: bool,
    /// The algorithm of rules that name none: sliding-log (exact), or fixed-window to
    /// decide exactly as envoyproxy/ratelimit does.
    #[arg(
        long,
        env = "SLUICEGATE_DEFAULT_ALGORITHM",
        default_value = "sliding-log"
    )]
    default_algorithm: Algorithm,
    /// Also serve gRPC alone on this address (it is always served on --listen too).
    #[arg(long, env = "SLUICEGATE_GRPC_LISTEN")]
    grpc_listen: Option<SocketAddr>,
    /// Add the legacy X-RateLimit-Limit, -Remaining and -Reset to gRPC answers.
    #[arg(long, env = "SLUICEGATE_LEGACY_HEADERS")]
    legacy_headers: bool,
    /// The longest descriptor key or value accepted, in bytes (longer: 400).
    #[arg(long, env = "SLUICEGATE_MAX_ENTRY_BYTES", default_value_t = decide::DEFAULT_MAX_ENTRY_BYTES)]
    max_entry_bytes: usize,
    /// Enables POST /v1/reset for requests bearing this token.
    #[arg(long, env = "SLUICEGATE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// How often to look for edits of the --config files (SIGHUP reloads at once).
    #[arg(long, env = "SLUICEGATE_RELOAD_INTERVAL", default_value = "1s")]
    reload_interval: String,
}

impl ServeArgs {
    fn limiter_config(&self) -> Result<sluicegate::LimiterConfig, String> {
        let cool_down = parse_duration(&self.breaker_cool_down)
            .map_err(|e| format!("--breaker-cool-down: {e}"))?;
        let remote = self.store.store != "memory";
        Ok(sluicegate::LimiterConfig {
            on_store_error: self.on_store_error,
            instances: self.instances.max(1),
            breaker_failures: self.breaker_failures,
            breaker_cool_down: Duration::from_micros(cool_down),
            negative_cache_entries: if remote && !self.no_negative_cache {
                100_000
            } else {
                0
            },
        })
    }
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
    fn spec(&self, algorithm: Algorithm) -> Result<RuleSpec, String> {
        let window = parse_duration(&self.window).map_err(|e| format!("--window: {e}"))?;
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
    fn rule(&self) -> Result<Rule, String> {
        let algorithm: Algorithm = self.algorithm.parse().map_err(|e| format!("--{e}"))?;
        let layout = self
            .layout
            .as_deref()
            .map(str::parse::<LogLayout>)
            .transpose()
            .map_err(|e| format!("--{e}"))?;
        let spec = RuleSpec {
            layout,
            ..self.shape.spec(algorithm)?
        };
        Rule::new("cli", &spec).map_err(|e| format!("--{e}"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Replay(args) => run_replay(&args),
        Command::Bench(args) => run_bench(&args),
        Command::Simulate(args) => run_simulate(&args),
        Command::Trace(args) => run_trace(&args),
        Command::Plan(args) => run_plan(&args),
        Command::Load(args) => run_load(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sluicegate: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

fn run_replay(args: &ReplayArgs) -> Result<(), String> {
    let rule = args.rule.rule()?;
    runtime()?.block_on(async {
        let store = if args.store.store == "memory" {
            // Time comes from the input; the clock is never read. Every key of the trace
            // may be live at once, so the cap is the trace's size, not a server's.
            AnyStore::Memory(MemoryStore::new(
                MemoryStoreConfig {
                    max_keys: usize::MAX,
                    ..MemoryStoreConfig::default()
                },
                Arc::new(ManualClock::new(0)),
            ))
        } else {
            // A prefix of its own per run, so a replay never meets another's state.
            let unique = format!(
                "sluicegate:replay:{}-{}:",
                std::process::id(),
                sluicegate::Clock::now_micros(&sluicegate::SystemClock::new())
            );
            AnyStore::open(args.store.options(&unique)?)
                .await
                .map_err(|e| e.to_string())?
        };
        let output = io::BufWriter::new(io::stdout().lock());
        replay::replay(&store, &rule, io::stdin().lock(), output)
            .await
            .map_err(|e| e.to_string())
    })
}

fn run_bench(args: &BenchArgs) -> Result<(), String> {
    let rule = args.rule.rule()?;
    let drive = args.pace.drive(args.keys, "--keys", args.concurrency)?;
    runtime()?.block_on(async {
        let unique = format!("sluicegate:bench:{}:", std::process::id());
        let store = AnyStore::open(args.store.options(&unique)?)
            .await
            .map_err(|e| e.to_string())?;
        let plan = bench::BenchPlan {
            store_name: args.store.store.clone(),
            drive,
            negative_cache: args.negative_cache,
        };
        bench::run(store, rule, plan).await.print(args.pace.json)
    })
}

fn run_trace(args: &TraceArgs) -> Result<(), String> {
    let duration = parse_duration(&args.duration).map_err(|e| format!("--duration: {e}"))?;
    let window = parse_duration(&args.window).map_err(|e| format!("--window: {e}"))?;
    if !(args.rate.is_finite() && args.rate > 0.0) || args.keys == 0 || window == 0 {
        return Err("--rate, --keys and --window must be positive".into());
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
    trace::write_trace(&spec, &mut out)
        .and_then(|_| io::Write::flush(&mut out))
        .map_err(|e| e.to_string())
}

fn run_simulate(args: &SimulateArgs) -> Result<(), String> {
    use std::io::BufRead;
    let spec = args.shape.spec(Algorithm::SlidingLog)?;
    let window = spec.window;
    let path = &args.trace;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let reader = io::BufReader::with_capacity(1 << 20, file);
    let span = trace_span(path, args.format, args.key_field).unwrap_or(window * 10);
    let mut sim = simulate::Simulation::new(&spec, span)?;
    let progress = io::IsTerminal::is_terminal(&io::stderr());
    let started = std::time::Instant::now();
    let (mut read, mut malformed, mut first_error) = (0u64, 0u64, None);
    for (index, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        read += line.len() as u64 + 1;
        if progress && index % (1 << 20) == 0 && size > 0 {
            eprint!(
                "\r{} lines, {:.0}%",
                index,
                100.0 * read as f64 / size as f64
            );
        }
        let text = line.trim_end_matches('\r');
        if text.trim().is_empty() || text.trim_start().starts_with('#') {
            continue;
        }
        let decided = match args.format {
            TraceFormat::Csv => {
                replay::parse_line(text).map(|l| sim.request(l.time, l.key, l.cost))
            }
            TraceFormat::Clf => {
                clf::parse_line(text, args.key_field).map(|(t, key)| sim.request(t, &key, 1))
            }
        };
        match decided {
            Ok(result) => result?,
            Err(e) => {
                malformed += 1;
                first_error.get_or_insert(format!("line {}: {e}", index + 1));
            }
        }
    }
    if progress {
        eprintln!();
    }
    println!(
        "{} requests, {} keys, limit {} per {}, in {:.1} s",
        sim.requests,
        sim.key_count(),
        args.shape.limit,
        args.shape.window,
        started.elapsed().as_secs_f64()
    );
    if malformed > 0 {
        println!(
            "{malformed} malformed lines skipped (first: {})",
            first_error.unwrap_or_default()
        );
    }
    print!("{}", simulate::table(&sim, args.shape.limit));
    if let Some(chart) = &args.chart {
        std::fs::write(chart, sim.chart()).map_err(|e| format!("{}: {e}", chart.display()))?;
        println!("chart written to {}", chart.display());
    }
    Ok(())
}

/// The time between a trace's first and last lines (for the chart's scale), reading only
/// the file's two ends.
fn trace_span(path: &Path, format: TraceFormat, key_field: clf::KeyField) -> Option<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let time = |line: &str| match format {
        TraceFormat::Csv => replay::parse_line(line).ok().map(|l| l.time),
        TraceFormat::Clf => clf::parse_line(line, key_field).ok().map(|(t, _)| t),
    };
    let text = std::fs::File::open(path).ok()?;
    let mut head = String::new();
    text.take(1 << 16).read_to_string(&mut head).ok()?;
    let first = head.lines().find_map(time)?;
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(1 << 16)))
        .ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    let tail = String::from_utf8_lossy(&tail);
    let last = tail.lines().rev().find_map(time)?;
    last.checked_sub(first).filter(|span| *span > 0)
}

fn run_load(args: LoadArgs) -> Result<(), String> {
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

fn run_plan(args: &PlanArgs) -> Result<(), String> {
    let window = parse_duration(&args.window).map_err(|e| format!("--window: {e}"))?;
    if !(args.qps.is_finite() && args.qps > 0.0) || args.keys == 0 {
        return Err("--qps and --keys must be positive".into());
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
        Some(url) => Some(runtime()?.block_on(async {
            let mut config = sluicegate::RedisStoreConfig::new(url);
            config.prefix = format!("sluicegate:plan:{}:", std::process::id());
            config.timeout = Duration::from_secs(5);
            let store = sluicegate::RedisStore::connect(config)
                .await
                .map_err(|e| e.to_string())?;
            let mut bytes = Vec::new();
            for row in &rows {
                bytes.push(plan::measure(&store, row).await?);
            }
            Ok::<_, String>(bytes)
        })?),
    };
    print!("{}", plan::table(&workload, &rows, measured.as_deref()));
    Ok(())
}

fn load_config(path: Option<&Path>, default: Algorithm) -> Result<Config, String> {
    match path {
        Some(path) => Config::load(path, default),
        None => Config::parse(
            Path::new("examples/sluicegate.yaml"),
            EXAMPLE_CONFIG,
            default,
        ),
    }
    .map_err(|e| e.to_string())
}

fn serve(args: ServeArgs) -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // The files as they were before loading, so an edit made meanwhile is reloaded too.
    let loaded_files = args.config.as_deref().map(config::fingerprint);
    let config = load_config(args.config.as_deref(), args.default_algorithm)?;
    runtime()?.block_on(async {
        let store = AnyStore::open(args.store.options("sluicegate:")?)
            .await
            .map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
        let limiter = Arc::new(Limiter::with_config(store, args.limiter_config()?));
        if limiter.store().memory().is_some() {
            let sweeper = Arc::clone(&limiter);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    sweeper.store().memory().map(MemoryStore::sweep);
                }
            });
        }
        let metrics = Arc::new(metrics::Metrics::default());
        metrics
            .config_loads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let live = Arc::new(config::LiveConfig::new(config));
        if let Some(path) = args.config.clone() {
            let interval = parse_duration(&args.reload_interval)
                .map_err(|e| format!("--reload-interval: {e}"))?;
            let interval = Duration::from_micros(interval.max(1_000));
            // Listen for SIGHUP now, before the server says it is up: a SIGHUP that came
            // before the handler would end the process.
            #[cfg(unix)]
            let hangup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            #[cfg(not(unix))]
            let hangup = None;
            tokio::spawn(reload_on_change(
                path,
                loaded_files.unwrap_or_default(),
                args.default_algorithm,
                Arc::clone(&live),
                Arc::clone(&metrics),
                interval,
                hangup,
            ));
        }
        let state = http::AppState {
            config: live,
            limiter,
            metrics,
            admin_token: args.admin_token.as_deref().map(Arc::from),
            legacy_headers: args.legacy_headers,
            max_entry_bytes: args.max_entry_bytes,
        };
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(
            address = %local,
            config = %args.config.as_deref().unwrap_or(Path::new("examples/sluicegate.yaml")).display(),
            store = %args.store.store,
            "sluicegate listening"
        );
        // One signal stops every listener.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop.send(true);
        });
        let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let grpc_only = match args.grpc_listen {
            Some(address) => {
                let listener = tokio::net::TcpListener::bind(address)
                    .await
                    .map_err(|e| format!("cannot listen on {address}: {e}"))?;
                let local = listener.local_addr().map_err(|e| e.to_string())?;
                tracing::info!(grpc_address = %local, "gRPC also on its own port");
                let router = grpc::router(state.clone());
                Some(tokio::spawn(
                    axum::serve(listener, router)
                        .with_graceful_shutdown(until_stopped(stopped.clone()))
                        .into_future(),
                ))
            }
            None => None,
        };
        axum::serve(listener, http::app(state))
            .with_graceful_shutdown(until_stopped(stopped))
            .await
            .map_err(|e| format!("server failed: {e}"))?;
        if let Some(grpc) = grpc_only {
            grpc.await
                .map_err(|e| format!("gRPC server failed: {e}"))?
                .map_err(|e| format!("gRPC server failed: {e}"))?;
        }
        Ok(())
    })
}

#[cfg(unix)]
type Hangup = tokio::signal::unix::Signal;
/// No SIGHUP off Unix.
#[cfg(not(unix))]
type Hangup = NoSignal;

#[cfg(not(unix))]
struct NoSignal;

#[cfg(not(unix))]
impl NoSignal {
    async fn recv(&mut self) -> Option<()> {
        std::future::pending().await
    }
}

/// Reloads the configuration when its files change or on SIGHUP. A configuration that
/// does not load keeps the previous one serving; the error is logged and counted.
async fn reload_on_change(
    path: PathBuf,
    mut seen: Vec<config::FileStamp>,
    default: Algorithm,
    live: Arc<config::LiveConfig>,
    metrics: Arc<metrics::Metrics>,
    interval: Duration,
    mut hangup: Option<Hangup>,
) {
    use std::sync::atomic::Ordering;
    let mut tick = tokio::time::interval(interval);
    loop {
        let signalled = async {
            match hangup.as_mut() {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        };
        let forced = tokio::select! {
            _ = tick.tick() => false,
            _ = signalled => true,
        };
        let now = config::fingerprint(&path);
        if !forced && now == seen {
            continue;
        }
        seen = now;
        match Config::load(&path, default) {
            Ok(config) => {
                live.replace(config);
                metrics.config_loads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(config = %path.display(), "configuration reloaded");
            }
            Err(e) => {
                metrics.config_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "configuration rejected; the previous one keeps serving");
            }
        }
    }
}

/// Resolves on SIGINT or SIGTERM: stop accepting, let requests in flight finish.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
