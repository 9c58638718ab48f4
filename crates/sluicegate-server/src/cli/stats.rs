//! `serve`'s flags for envoyproxy/ratelimit's statistics: the statsd sink, and the mapping
//! that names them in `/metrics`.

use std::path::PathBuf;

use clap::Args;

use super::args::{DurationArg, parse_duration_arg};
use crate::metrics::{
    DEFAULT_MAX_DETAILED_SERIES, EnvoyStatsOptions, PrometheusMapping, StatsdOptions, StatsdTags,
};

/// The flags of envoy's statistics.
#[derive(Args)]
pub(super) struct StatsArgs {
    /// Send envoyproxy/ratelimit's statistics, under its names, over UDP in statsd's line
    /// protocol to this HOST:PORT (envoy's USE_STATSD, STATSD_HOST, STATSD_PORT); nothing
    /// is sent without it.
    #[arg(long, env = "SLUICEGATE_STATSD", value_name = "HOST:PORT", value_parser = parse_statsd_address)]
    statsd: Option<String>,
    /// Tags on every statistic sent, K:V,K2:V2 (envoy's EXTRA_TAGS): in the name as
    /// `.__K=V`, or as DogStatsD tags with --statsd-dogstatsd.
    #[arg(
        long,
        env = "SLUICEGATE_STATSD_TAGS",
        value_name = "K:V,…",
        requires = "statsd"
    )]
    statsd_tags: Option<StatsdTags>,
    /// Send the tags as DogStatsD's `|#K:V` (envoy's USE_DOG_STATSD).
    #[arg(long, env = "SLUICEGATE_STATSD_DOGSTATSD", requires = "statsd")]
    statsd_dogstatsd: bool,
    /// How often counters are sent to --statsd, each as its change since the last time
    /// (envoy's STATS_FLUSH_INTERVAL); /metrics is always current.
    #[arg(long, env = "SLUICEGATE_STATSD_FLUSH_INTERVAL", default_value = "10s", value_parser = parse_duration_arg)]
    statsd_flush_interval: DurationArg,
    /// Neither send envoy's statistics nor write them in /metrics (envoy's DISABLE_STATS);
    /// sluicegate's own metrics stay.
    #[arg(long, env = "SLUICEGATE_DISABLE_STATS")]
    disable_stats: bool,
    /// A statsd_exporter mapping file naming envoy's statistics in /metrics, in place of
    /// envoy's default mapping (envoy's PROMETHEUS_MAPPER_YAML). A file that is not there
    /// leaves every statistic its statsd name, as envoy does; one the service cannot honour
    /// stops the start.
    #[arg(long, env = "SLUICEGATE_PROMETHEUS_MAPPER", value_name = "PATH")]
    prometheus_mapper: Option<PathBuf>,
    /// With envoy's default mapping, the response time histogram in milliseconds rather
    /// than seconds (envoy's PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS).
    #[arg(
        long,
        env = "SLUICEGATE_PROMETHEUS_RESPONSE_TIME_MS",
        conflicts_with = "prometheus_mapper"
    )]
    prometheus_response_time_ms: bool,
    /// The most series a detailed_metric rule holds, one per request value; values past
    /// it (and values whose stat key is over 256 bytes) are counted in the rule's own
    /// series and in sluicegate_detailed_metric_overflow_total. A value's series not
    /// counted in for its rule's window (and five minutes at least) is dropped. 0: every
    /// value in the rule's own series.
    #[arg(long, env = "SLUICEGATE_MAX_DETAILED_SERIES", default_value_t = DEFAULT_MAX_DETAILED_SERIES)]
    max_detailed_series: usize,
}

impl StatsArgs {
    /// What becomes of envoy's statistics in `/metrics`, and the statsd server they go to.
    pub(super) fn options(&self) -> anyhow::Result<(EnvoyStatsOptions, Option<StatsdOptions>)> {
        anyhow::ensure!(
            !self.statsd_flush_interval.duration().is_zero(),
            "--statsd-flush-interval must be longer than zero"
        );
        let mapping = match &self.prometheus_mapper {
            Some(path) => PrometheusMapping::load(path)?,
            None => PrometheusMapping::envoy_default(self.prometheus_response_time_ms),
        };
        let statsd = match &self.statsd {
            Some(address) if self.disable_stats => {
                tracing::info!(statsd = %address, "--disable-stats: nothing is sent to --statsd");
                None
            }
            Some(address) => Some(StatsdOptions {
                address: address.clone(),
                tags: self.statsd_tags.clone().unwrap_or_default(),
                dogstatsd: self.statsd_dogstatsd,
                flush_interval: self.statsd_flush_interval.duration(),
            }),
            None => None,
        };
        let envoy = EnvoyStatsOptions {
            mapping,
            disabled: self.disable_stats,
            max_detailed_series: self.max_detailed_series,
        };
        Ok((envoy, statsd))
    }
}

/// clap's value parser for --statsd: a host and a port.
fn parse_statsd_address(text: &str) -> Result<String, String> {
    match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(text.to_owned())
        }
        _ => Err(format!("{text:?} is not HOST:PORT")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statsd_address_is_a_host_and_a_port() {
        assert!(parse_statsd_address("localhost:8125").is_ok());
        assert!(parse_statsd_address("[::1]:8125").is_ok());
        for bad in ["localhost", ":8125", "host:port", "host:70000"] {
            assert!(parse_statsd_address(bad).is_err(), "{bad}");
        }
    }
}
