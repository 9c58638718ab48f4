//! envoy's statistics sent to a statsd server (`--statsd`), as envoyproxy/ratelimit's
//! gostats store sends them (src/service_cmd/runner/runner.go): every flush interval, each
//! counter that moved as its change since the last flush (`name:delta|c`), and each
//! response time as it was measured (`ratelimit_server.ShouldRateLimit.response_time:ms|ms`).
//! EXTRA_TAGS ride in the name as gostats writes them (`name.__key=value`), or as DogStatsD
//! tags (`|#key:value`) with `--statsd-dogstatsd`, as envoy's godogstats sink moves them.
//!
//! Over UDP, from the flushing task alone: a socket that never blocks, errors dropped, and
//! the response times queued in a bounded queue that drops when full, so a statsd server
//! that is down or slow costs a decision nothing.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use cadence::{BufferedUdpMetricSink, Counted, Metric, MetricBuilder, StatsdClient, Timed};
use tokio::sync::mpsc;

use super::envoy::{CounterStat, EnvoyMetrics, RESPONSE_TIME};

/// Response times waiting for the next flush, at most; more are dropped.
const QUEUED_TIMES: usize = 65_536;

/// Where and how the statistics are sent.
#[derive(Clone, Debug)]
pub struct StatsdOptions {
    /// `HOST:PORT` of the statsd server (envoy's STATSD_HOST and STATSD_PORT).
    pub address: String,
    /// Tags on every statistic (EXTRA_TAGS).
    pub tags: StatsdTags,
    /// Tags as DogStatsD's `|#key:value` rather than in the name (USE_DOG_STATSD).
    pub dogstatsd: bool,
    /// How often counters are sent (STATS_FLUSH_INTERVAL).
    pub flush_interval: Duration,
}

/// Tags on every statistic sent, written `key:value,key2:value2` as envoy's EXTRA_TAGS:
/// sorted by key, a value's `.`, `:` and `|` made `_`, and pairs with an empty key or value
/// left out, as gostats keeps them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsdTags(Vec<(String, String)>);

impl FromStr for StatsdTags {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut tags = std::collections::BTreeMap::new();
        for pair in text.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once(':')
                .ok_or_else(|| format!("{pair:?} is not key:value"))?;
            if !key.is_empty() && !value.is_empty() {
                tags.insert(key.to_owned(), value.replace(['.', ':', '|'], "_"));
            }
        }
        Ok(StatsdTags(tags.into_iter().collect()))
    }
}

/// The statsd client and what it sent last.
pub(crate) struct StatsdSink {
    client: StatsdClient,
    tags: StatsdTags,
    dogstatsd: bool,
    /// Each counter's value at the last flush: only the counters that flush had, so a
    /// dropped `detailed_metric` series is forgotten here too.
    sent: HashMap<String, u64>,
    times: mpsc::Receiver<u64>,
}

impl StatsdSink {
    /// A sink to `options.address`, which must resolve now; it takes `envoy`'s response
    /// times from now on.
    pub(super) fn new(options: &StatsdOptions, envoy: &EnvoyMetrics) -> anyhow::Result<Self> {
        let address: SocketAddr = options
            .address
            .to_socket_addrs()
            .with_context(|| format!("--statsd {}", options.address))?
            .next()
            .with_context(|| format!("--statsd {}: no address", options.address))?;
        let local: SocketAddr = if address.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(local).context("--statsd: no UDP socket")?;
        socket.set_nonblocking(true)?;
        let sink = BufferedUdpMetricSink::from(address, socket)?;
        let client = StatsdClient::builder("", sink)
            .with_error_handler(|e| tracing::debug!(error = %e, "statsd: not sent"))
            .build();
        let times = envoy
            .response_times()
            .send_to_statsd(QUEUED_TIMES)
            .context("--statsd: the response times already go to a sink")?;
        Ok(StatsdSink {
            client,
            tags: options.tags.clone(),
            dogstatsd: options.dogstatsd,
            sent: HashMap::new(),
            times,
        })
    }

    /// Sends every counter of `counters` that moved since the last flush, by how much,
    /// and the response times measured since.
    pub(super) fn flush(&mut self, counters: &[CounterStat]) {
        let mut last_sent = std::mem::take(&mut self.sent);
        self.sent.reserve(counters.len());
        for stat in counters {
            let (name, last) = last_sent
                .remove_entry(&stat.name)
                .unwrap_or_else(|| (stat.name.clone(), 0));
            let delta = stat.value.saturating_sub(last);
            self.sent.insert(name, stat.value);
            if delta > 0 {
                let name = self.name(&stat.name);
                self.send(self.client.count_with_tags(&name, delta));
            }
        }
        let name = self.name(RESPONSE_TIME);
        while let Ok(ms) = self.times.try_recv() {
            self.send(self.client.time_with_tags(&name, ms));
        }
        let _ = self.client.flush();
    }

    /// `stat`'s name as sent: with the tags in it, unless they go as DogStatsD's.
    fn name(&self, stat: &str) -> String {
        if self.dogstatsd {
            return stat.to_owned();
        }
        let mut name = stat.to_owned();
        for (key, value) in &self.tags.0 {
            name.push_str(&format!(".__{key}={value}"));
        }
        name
    }

    /// Sends one line, with DogStatsD tags if asked; what fails is dropped (the client's
    /// error handler logs it).
    fn send<'m, T: Metric + From<String>>(&'m self, mut line: MetricBuilder<'m, '_, T>) {
        if self.dogstatsd {
            for (key, value) in &self.tags.0 {
                line = line.with_tag(key, value);
            }
        }
        line.send();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gone_from_a_flush_are_forgotten() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let options = StatsdOptions {
            address: receiver.local_addr().unwrap().to_string(),
            tags: StatsdTags::default(),
            dogstatsd: false,
            flush_interval: Duration::from_secs(10),
        };
        let envoy = EnvoyMetrics::new(Vec::new());
        let mut sink = StatsdSink::new(&options, &envoy).unwrap();
        let stat = |name: &str, value| CounterStat {
            name: name.to_owned(),
            help: "",
            value,
        };
        sink.flush(&[stat("a", 1), stat("b", 2)]);
        assert_eq!(sink.sent.len(), 2);
        // b's series was dropped: the sink holds a's name alone.
        sink.flush(&[stat("a", 3)]);
        assert_eq!(sink.sent, HashMap::from([("a".to_owned(), 3)]));
    }

    #[test]
    fn tags_read_as_envoys_extra_tags() {
        let tags: StatsdTags = "zone:eu.west,app:rl,empty:,:x".parse().unwrap();
        assert_eq!(
            tags.0,
            [
                ("app".into(), "rl".into()),
                ("zone".into(), "eu_west".into())
            ]
        );
        assert!("novalue".parse::<StatsdTags>().is_err());
        assert_eq!("".parse::<StatsdTags>().unwrap(), StatsdTags::default());
    }
}
