//! envoyproxy/ratelimit's statistics over statsd (`--statsd`), received on a real UDP
//! socket after real gRPC calls: its names (src/stats/manager_impl.go,
//! src/metrics/metrics.go), counters sent as their change since the last flush (gostats),
//! EXTRA_TAGS in the name or as DogStatsD tags; and the statsd_exporter mapping that names
//! them in `/metrics` (`--prometheus-mapper`, PROMETHEUS_MAPPER_YAML).

use crate::server;

use std::collections::HashMap;
use std::net::UdpSocket;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use server::Server;

const CONFIG: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
";

/// How long the service has to send what a test waits for.
const PATIENCE: Duration = Duration::from_secs(20);

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn config(name: &str) -> String {
    let file = dir(name).join("config.yaml");
    std::fs::write(&file, CONFIG).unwrap();
    file.to_str().unwrap().to_owned()
}

/// `times` calls of `hits` hits each on the `user` limit.
async fn hit(server: &Server, hits: u32, times: usize) {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .unwrap();
    for _ in 0..times {
        let request = RateLimitRequest {
            domain: "d".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".to_owned(),
                    value: "u".to_owned(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: hits,
        };
        client.should_rate_limit(request).await.unwrap();
    }
}

/// A statsd server: a UDP socket on loopback, and every line it received.
struct Statsd {
    socket: UdpSocket,
    lines: Vec<String>,
}

impl Statsd {
    fn new() -> Statsd {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        Statsd {
            socket,
            lines: Vec::new(),
        }
    }

    fn address(&self) -> String {
        self.socket.local_addr().unwrap().to_string()
    }

    /// Receives until `done` holds of what came so far; panics past [`PATIENCE`].
    fn until(&mut self, done: impl Fn(&Statsd) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        let mut packet = [0u8; 65_536];
        tokio::task::block_in_place(|| {
            while !done(self) {
                assert!(
                    Instant::now() < deadline,
                    "not received in time; got {:#?}",
                    self.lines
                );
                if let Ok(n) = self.socket.recv(&mut packet) {
                    let text = std::str::from_utf8(&packet[..n]).unwrap();
                    self.lines
                        .extend(text.lines().filter(|l| !l.is_empty()).map(str::to_owned));
                }
            }
        });
    }

    /// Every counter's changes received, added up, by the name sent (tags included).
    fn counters(&self) -> HashMap<String, u64> {
        let mut sums = HashMap::new();
        for line in &self.lines {
            let (name, rest) = line.split_once(':').unwrap();
            if let Some(value) = rest.split('|').next().filter(|_| rest.contains("|c")) {
                *sums.entry(name.to_owned()).or_default() += value.parse::<u64>().unwrap();
            }
        }
        sums
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters().get(name).copied().unwrap_or(0)
    }
}

/// Counters arrive under envoy's names as their changes since the last flush, never as a
/// zero change; each response time as it was measured. The counts are envoy's for the same
/// hits: past floor(limit × NEAR_LIMIT_RATIO) a hit is near, past the limit over, and a
/// refused call's hits below the limit near too (envoyproxy/ratelimit@f2fb157
/// test/redis/fixed_cache_impl_test.go:293-360, TestNearLimit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statsd_gets_envoys_counters_as_changes() {
    let mut statsd = Statsd::new();
    let server = Server::start(&[
        "--config",
        &config("statsd-counters"),
        "--statsd",
        &statsd.address(),
        "--statsd-flush-interval",
        "20ms",
    ]);
    let stat = |name: &str| format!("ratelimit.service.rate_limit.d.user.{name}");
    // 9 of 10, one by one: the 9th is past the near threshold of 8.
    hit(&server, 1, 9).await;
    // Read once all of the last call's counts are sent: a flush may fall between them.
    statsd.until(|s| {
        s.counter(&stat("total_hits")) == 9
            && s.counter(&stat("within_limit")) == 9
            && s.counter(&stat("near_limit")) == 1
            && s.counter("ratelimit_server.ShouldRateLimit.total_requests") == 9
    });
    assert_eq!(statsd.counter(&stat("over_limit")), 0);
    assert_eq!(statsd.counter("ratelimit.service.config_load_success"), 1);
    let before = statsd.lines.len();
    // 2 more with one left: refused, one over, one more near.
    hit(&server, 2, 1).await;
    statsd.until(|s| {
        s.counter(&stat("total_hits")) == 11
            && s.counter(&stat("near_limit")) == 2
            && s.counter(&stat("over_limit")) == 1
    });
    assert_eq!(statsd.counter(&stat("within_limit")), 9);
    // What came after the first flushes is the change, not the total.
    let total_hits = format!("{}:", stat("total_hits"));
    let later: Vec<&String> = statsd.lines[before..]
        .iter()
        .filter(|l| l.starts_with(&total_hits))
        .collect();
    assert_eq!(later, [&format!("{total_hits}2|c")]);
    for line in &statsd.lines {
        assert!(!line.contains(":0|c"), "a zero change was sent: {line}");
    }
    // One response time per call, in milliseconds.
    statsd.until(|s| {
        s.lines
            .iter()
            .filter(|l| l.starts_with("ratelimit_server.ShouldRateLimit.response_time:"))
            .count()
            == 10
    });
    assert!(statsd.lines.iter().any(|l| l.ends_with("|ms")));
}

/// EXTRA_TAGS ride in the name as gostats writes them: sorted, `.__key=value`, a value's
/// `.`, `:` and `|` made `_`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_tags_ride_in_the_name() {
    let mut statsd = Statsd::new();
    let server = Server::start(&[
        "--config",
        &config("statsd-tags"),
        "--statsd",
        &statsd.address(),
        "--statsd-flush-interval",
        "20ms",
        "--statsd-tags",
        "zone:eu.west,app:rl",
    ]);
    hit(&server, 1, 1).await;
    let name = "ratelimit.service.rate_limit.d.user.total_hits.__app=rl.__zone=eu_west";
    statsd.until(|s| s.counter(name) == 1);
    statsd.until(|s| {
        s.counter("ratelimit_server.ShouldRateLimit.total_requests.__app=rl.__zone=eu_west") == 1
    });
}

/// With --statsd-dogstatsd the tags go as DogStatsD's, as envoy's godogstats sink sends
/// them (src/godogstats/dogstatsd_sink.go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dogstatsd_tags() {
    let mut statsd = Statsd::new();
    let server = Server::start(&[
        "--config",
        &config("statsd-dog"),
        "--statsd",
        &statsd.address(),
        "--statsd-flush-interval",
        "20ms",
        "--statsd-dogstatsd",
        "--statsd-tags",
        "zone:eu,app:rl",
    ]);
    hit(&server, 3, 1).await;
    statsd.until(|s| {
        s.lines
            .iter()
            .any(|l| l == "ratelimit.service.rate_limit.d.user.total_hits:3|c|#app:rl,zone:eu")
    });
    statsd.until(|s| {
        s.lines.iter().any(|l| {
            l.starts_with("ratelimit_server.ShouldRateLimit.response_time:")
                && l.ends_with("|ms|#app:rl,zone:eu")
        })
    });
}

/// A statsd address nothing listens on costs the service nothing: every call is answered,
/// and the flushes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statsd_server_that_is_not_there_costs_nothing() {
    let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
    let address = closed.local_addr().unwrap().to_string();
    drop(closed);
    let server = Server::start(&[
        "--config",
        &config("statsd-closed"),
        "--statsd",
        &address,
        "--statsd-flush-interval",
        "1ms",
    ]);
    hit(&server, 1, 200).await;
    let (status, text) = tokio::task::block_in_place(|| server.request("GET", "/metrics", ""));
    assert_eq!(status, 200);
    assert!(
        text.contains("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 200\n"),
        "{text}"
    );
}

fn metrics(server: &Server) -> String {
    tokio::task::block_in_place(|| server.request("GET", "/metrics", "")).1
}

/// A mapping file renames envoy's series in /metrics; what it drops is not written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_file_renames_the_series() {
    let mapping = dir("mapper").join("conf.yaml");
    std::fs::write(
        &mapping,
        r#"mappings:
  - match: "ratelimit.service.rate_limit.*.*.*"
    name: "rl_$3"
    labels: {domain: "$1", descriptor: "$2"}
  - match: "ratelimit.service.config_load_*"
    action: drop
  - match: "ratelimit_server.*.response_time"
    name: "rls_response_time_ms"
    timer_type: histogram
    histogram_options: {buckets: [1, 1000]}
"#,
    )
    .unwrap();
    let server = Server::start(&[
        "--config",
        &config("mapper"),
        "--prometheus-mapper",
        mapping.to_str().unwrap(),
    ]);
    hit(&server, 1, 3).await;
    let text = metrics(&server);
    assert!(
        text.contains("rl_total_hits{descriptor=\"user\",domain=\"d\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("rls_response_time_ms_bucket{le=\"1000\"} 3\n"),
        "{text}"
    );
    assert!(text.contains("rls_response_time_ms_count 3\n"), "{text}");
    assert!(
        !text.contains("ratelimit_service_rate_limit_total_hits"),
        "{text}"
    );
    assert!(!text.contains("ratelimit_service_config_load"), "{text}");
    // Not taken by a mapping: its statsd name, escaped.
    assert!(
        text.contains("ratelimit_server_ShouldRateLimit_total_requests 3\n"),
        "{text}"
    );
}

/// Envoy Gateway's ConfigMap (the file its Deployment names in PROMETHEUS_MAPPER_YAML) is
/// accepted; the series keep envoy's names, the response time in milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_mapping_is_honoured() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/envoy-gateway/deployments/statsd_conf.yaml"
    );
    let server = Server::start(&[
        "--config",
        &config("eg-mapper"),
        "--prometheus-mapper",
        fixture,
    ]);
    hit(&server, 1, 2).await;
    let text = metrics(&server);
    assert!(
        text.contains("ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"user\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"10\"} 2\n"
        ),
        "{text}"
    );
}

/// The file PROMETHEUS_MAPPER_YAML names may be missing (Envoy Gateway mounts its ConfigMap
/// as optional): the service starts and writes every statistic under its statsd name, as
/// envoy's sink does when its mapper does not load (src/stats/prom/prometheus_sink.go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_mapping_file_leaves_statsd_names() {
    let missing = dir("mapper-missing").join("absent.yaml");
    let server = Server::start(&[
        "--config",
        &config("mapper-missing"),
        "--prometheus-mapper",
        missing.to_str().unwrap(),
    ]);
    hit(&server, 1, 1).await;
    let text = metrics(&server);
    assert!(
        text.contains("ratelimit_service_rate_limit_d_user_total_hits 1\n"),
        "{text}"
    );
}

/// A mapping the service cannot honour stops the start, naming the file and the mapping.
#[test]
fn a_bad_mapping_is_refused_at_start() {
    let mapping = dir("mapper-bad").join("conf.yaml");
    std::fs::write(
        &mapping,
        "mappings:\n  - match: \"ratelimit.go.*\"\n    name: go_stats\n",
    )
    .unwrap();
    let path = mapping.to_str().unwrap();
    let error = Server::try_start(&[
        "--config",
        &config("mapper-bad"),
        "--prometheus-mapper",
        path,
    ])
    .err()
    .expect("refused");
    assert!(error.contains(path), "{error}");
    assert!(
        error.contains("mapping 1 (match \"ratelimit.go.*\"): matches none"),
        "{error}"
    );
}

/// --disable-stats: envoy's statistics are not written; sluicegate's own stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_stats_are_not_written() {
    let server = Server::start(&["--config", &config("disabled"), "--disable-stats"]);
    hit(&server, 1, 1).await;
    let text = metrics(&server);
    assert!(!text.contains("ratelimit_service"), "{text}");
    assert!(text.contains("sluicegate_rule_hits_total"), "{text}");
}

/// statsd hears no more `detailed_metric` series than `/metrics` writes: with
/// `--max-detailed-series 3`, 50 values send three series of their own, and the other 47
/// hits under the limit's own name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_metric_series_are_capped_for_statsd_too() {
    let mut statsd = Statsd::new();
    let file = dir("statsd-detailed").join("config.yaml");
    std::fs::write(
        &file,
        "domain: d
descriptors:
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
",
    )
    .unwrap();
    let server = Server::start(&[
        "--config",
        file.to_str().unwrap(),
        // envoy's counting: 50 descriptors in one call.
        "--compat",
        "envoy",
        "--max-detailed-series",
        "3",
        "--statsd",
        &statsd.address(),
        "--statsd-flush-interval",
        "20ms",
    ]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .unwrap();
    let request = RateLimitRequest {
        domain: "d".to_owned(),
        descriptors: (0..50)
            .map(|i| RateLimitDescriptor {
                entries: vec![Entry {
                    key: "client".to_owned(),
                    value: format!("c{i}"),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 1,
    };
    client.should_rate_limit(request).await.unwrap();
    let own = "ratelimit.service.rate_limit.d.client.total_hits";
    let per_value = |s: &Statsd| {
        s.counters()
            .into_iter()
            .filter(|(name, _)| {
                name.starts_with("ratelimit.service.rate_limit.d.client_")
                    && name.ends_with(".total_hits")
            })
            .collect::<HashMap<_, _>>()
    };
    statsd.until(|s| s.counter(own) == 47 && per_value(s).values().sum::<u64>() == 3);
    assert_eq!(per_value(&statsd).len(), 3, "{:#?}", statsd.lines);
}
