//! `serve`'s log: how much (`--log-level`, or `RUST_LOG` when set, which wins) and in
//! what form (`--log-format`), on stderr.

use std::io;

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;

/// The log's flags.
#[derive(Args)]
pub(crate) struct LogArgs {
    /// The least severe events logged: trace, debug, info, warn or error
    /// (envoyproxy/ratelimit's warning, fatal and panic are read as warn and error).
    /// RUST_LOG, when set, wins.
    #[arg(long, env = "SLUICEGATE_LOG_LEVEL", default_value = "info", value_parser = parse_level)]
    log_level: LevelFilter,
    /// text (for people) or json (one object a line, for collectors).
    #[arg(long, env = "SLUICEGATE_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// The share of refusals that get a log line of their own (target
    /// `sluicegate::refusal`: domain, rule, descriptor, cost, limit, retry_after_us),
    /// from 0 (none) to 1 (every one); exactly that share, one in every 1/share.
    #[arg(long, env = "SLUICEGATE_LOG_REFUSALS", default_value = "0", value_parser = parse_share)]
    pub(crate) log_refusals: f64,
}

/// How each event is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// clap's value parser for --log-level: tracing's levels and logrus' (envoyproxy/ratelimit's
/// LOG_LEVEL), in any case.
fn parse_level(text: &str) -> Result<LevelFilter, String> {
    Ok(match text.to_ascii_lowercase().as_str() {
        "trace" => LevelFilter::TRACE,
        "debug" => LevelFilter::DEBUG,
        "info" => LevelFilter::INFO,
        "warn" | "warning" => LevelFilter::WARN,
        "error" | "fatal" | "panic" => LevelFilter::ERROR,
        _ => {
            return Err(format!(
                "{text:?} is no log level: trace, debug, info, warn or error"
            ));
        }
    })
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

impl LogArgs {
    /// Starts logging for the rest of the process.
    pub(crate) fn init(&self) {
        let filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::default().add_directive(self.log_level.into()));
        let log = tracing_subscriber::fmt()
            .with_writer(io::stderr)
            .with_env_filter(filter);
        match self.log_format {
            LogFormat::Text => log
                .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
                .init(),
            LogFormat::Json => log.json().with_ansi(false).init(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logrus_levels_are_read_in_any_case() {
        assert_eq!(parse_level("WARN"), Ok(LevelFilter::WARN));
        assert_eq!(parse_level("Warning"), Ok(LevelFilter::WARN));
        assert_eq!(parse_level("fatal"), Ok(LevelFilter::ERROR));
        assert_eq!(parse_level("debug"), Ok(LevelFilter::DEBUG));
        assert!(parse_level("loud").unwrap_err().contains("no log level"));
    }

    #[test]
    fn a_refusal_share_is_from_0_to_1() {
        assert_eq!(parse_share("0"), Ok(0.0));
        assert_eq!(parse_share("0.25"), Ok(0.25));
        assert!(parse_share("1.5").is_err());
        assert!(parse_share("-0.1").is_err());
        assert!(parse_share("some").is_err());
    }
}
