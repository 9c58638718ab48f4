//! `serve`'s log flags: the format of every line, the level, and how many refusals get a
//! line of their own.

use std::io;

use clap::{Args, ValueEnum};

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// `key=value` fields after the message, for people.
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`), for collectors.
    Json,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct LogArgs {
    /// How log lines are written: text, or json (one object per line).
    #[arg(
        long,
        env = "SLUICEGATE_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    /// The least severe level logged (error, warn, info, debug, trace), or a filter such
    /// as `info,sluicegate_server=debug`; RUST_LOG, when set, wins.
    #[arg(long, env = "SLUICEGATE_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// The share of refusals that get a log line of their own (target
    /// `sluicegate::refusal`: domain, rule, descriptor, cost, limit, retry_after_us),
    /// from 0 (none) to 1 (every one); exactly that share, one in every 1/share.
    #[arg(long, env = "SLUICEGATE_LOG_REFUSALS", default_value = "0", value_parser = parse_share)]
    pub(crate) log_refusals: f64,
}

impl LogArgs {
    /// Installs the process's log writer, on standard error.
    pub(crate) fn init(&self) -> anyhow::Result<()> {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .or_else(|_| tracing_subscriber::EnvFilter::try_new(&self.log_level))
            .map_err(|e| anyhow::anyhow!("--log-level {:?}: {e}", self.log_level))?;
        let builder = tracing_subscriber::fmt()
            .with_writer(io::stderr)
            .with_env_filter(filter);
        match self.log_format {
            LogFormat::Text => builder
                .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
                .init(),
            LogFormat::Json => builder.json().with_ansi(false).init(),
        }
        Ok(())
    }
}

/// clap's value parser for --log-refusals: a share in [0, 1].
fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!(
            "{text:?} is not a share from 0 to 1, such as 0.01 (one refusal in a hundred)"
        )),
    }
}
