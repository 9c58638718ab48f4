//! `sluicegate`: the rate-limit service and its tools.

mod config;
mod http;
mod replay;

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sluicegate::duration::parse_duration;
use sluicegate::{Algorithm, Limiter, Rule, RuleSpec};

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
    /// Run the rate-limit service (HTTP JSON API) on the in-memory store.
    Serve(ServeArgs),
    /// Decide SPEC.md's replay CSV from stdin with the caller's timestamps; one decision
    /// line per input line on stdout.
    Replay(RuleArgs),
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
}

/// One rule, from the command line.
#[derive(Args)]
struct RuleArgs {
    /// sliding-log, sliding-counter, fixed-window, token-bucket or leaky-bucket.
    #[arg(long)]
    algorithm: String,
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

impl RuleArgs {
    fn rule(&self) -> Result<Rule, String> {
        let algorithm: Algorithm = self.algorithm.parse().map_err(|e| format!("--{e}"))?;
        let window = parse_duration(&self.window).map_err(|e| format!("--window: {e}"))?;
        let spec = RuleSpec {
            buckets: self.buckets,
            burst: self.burst,
            queue: self.queue,
            ..RuleSpec::new(algorithm, self.limit, window)
        };
        Rule::new("cli", &spec).map_err(|e| format!("--{e}"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Replay(args) => args.rule().and_then(|rule| {
            replay::replay(
                &rule,
                io::stdin().lock(),
                io::BufWriter::new(io::stdout().lock()),
            )
            .map_err(|e| e.to_string())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sluicegate: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(path: Option<&Path>) -> Result<Config, String> {
    match path {
        Some(path) => Config::load(path),
        None => Config::parse(Path::new("examples/sluicegate.yaml"), EXAMPLE_CONFIG),
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
    let config = load_config(args.config.as_deref())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
        let limiter = Arc::new(Limiter::in_memory());
        let sweeper = Arc::clone(&limiter);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                sweeper.store().sweep();
            }
        });
        let state = http::AppState {
            config: Arc::new(config),
            limiter,
        };
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(
            address = %local,
            config = %args.config.as_deref().unwrap_or(Path::new("examples/sluicegate.yaml")).display(),
            store = "memory",
            "sluicegate listening"
        );
        axum::serve(listener, http::app(state))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .map_err(|e| format!("server failed: {e}"))
    })
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
