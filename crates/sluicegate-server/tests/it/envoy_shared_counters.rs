//! A mixed fleet shares one counter: under `--compat envoy` on Redis (a server and a
//! three-master cluster), a fixed window counts in envoyproxy/ratelimit's own key with its
//! arithmetic — `INCRBY` by the hits, then `EXPIRE` the unit plus a jitter — so that envoy's
//! instances and these count together during a rolling replacement. Over real gRPC (tonic
//! with Envoy's generated stubs); envoy's side is played with the redis crate, writing and
//! reading its keys as its Redis client does.
//!
//! The key names are envoy's tests': envoyproxy/ratelimit@f2fb157
//! test/redis/fixed_cache_impl_test.go:70-71 (`domain_key_value_1234`, EXPIRE 1),
//! :87-89 (`domain_key2_value2_subkey2_subvalue2_1200`, EXPIRE 60),
//! test/limiter/base_limiter_test.go:39-56 (`prefix:domain_key_value_1234`), :59-79
//! (`domain_files_files/*_1234` under share_threshold), and src/limiter/cache_key.go:62-81
//! (an empty value written as nothing between its two `_`).
//!
//! The rules are per hour (but one per minute), so that a window boundary falls inside a
//! test rarely; a run that failed across one is played again (three tries at most).

use std::panic::{AssertUnwindSafe, resume_unwind};
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::FutureExt;

use sluicegate::internals::hash_slot;
use sluicegate_test_support::{self as support, RedisServer, cmd};

use crate::server;

use server::Server;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

const HOUR: u64 = 3600;

/// `key`: 5 an hour; `key2`/`subkey2`: 10 a minute; `files/*` (share_threshold) and the
/// key-only `empty`: 10 an hour; `free`: unlimited.
fn config(domain: &str) -> String {
    format!(
        "domain: {domain}
descriptors:
  - key: key
    rate_limit: {{unit: hour, requests_per_unit: 5}}
  - key: key2
    value: value2
    descriptors:
      - key: subkey2
        rate_limit: {{unit: minute, requests_per_unit: 10}}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {{unit: hour, requests_per_unit: 10}}
  - key: empty
    rate_limit: {{unit: hour, requests_per_unit: 10}}
  - key: free
    rate_limit: {{unlimited: true}}
"
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Redis {
    Standalone,
    Cluster,
}

impl Redis {
    fn url(self) -> String {
        match self {
            Redis::Standalone => support::standalone().url(),
            Redis::Cluster => support::cluster().url(),
        }
    }

    /// The server that holds `key`.
    fn server_of(self, key: &str) -> &'static RedisServer {
        match self {
            Redis::Standalone => support::standalone(),
            Redis::Cluster => support::cluster().master_of(hash_slot(key)),
        }
    }

    /// envoy's side: a count it left at `key`, with the TTL its EXPIRE gives.
    fn set(self, key: &str, count: u64, ttl: u64) {
        let _: () = self
            .server_of(key)
            .query(cmd("SET").arg(key).arg(count).arg("EX").arg(ttl))
            .unwrap();
    }

    /// envoy's side: the count at `key` (`None`: no key) and its TTL in seconds.
    fn get(self, key: &str) -> (Option<u64>, i64) {
        let server = self.server_of(key);
        let count: Option<u64> = server.query(cmd("GET").arg(key)).unwrap();
        let ttl: i64 = server.query(cmd("TTL").arg(key)).unwrap();
        (count, ttl)
    }
}

/// The wall clock in whole seconds, as envoy's `UnixNow`.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// envoy's window start: `(now / divider) * divider` (src/limiter/cache_key.go:81-82).
fn window_start(now: u64, unit: u64) -> u64 {
    now / unit * unit
}

/// A server under `--compat envoy` on `redis` for `domain`, with `args`.
fn start(redis: Redis, domain: &str, args: &[&str]) -> Server {
    let path = std::env::temp_dir().join(format!(
        "sluicegate-shared-{domain}-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, config(domain)).unwrap();
    let url = redis.url();
    let mut all = vec![
        "--compat",
        "envoy",
        "--config",
        path.to_str().unwrap(),
        "--store",
        &url,
    ];
    all.extend(args);
    Server::start(&all)
}

async fn client(server: &Server) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .expect("connect over gRPC")
}

/// One request of one descriptor of `entries`, `hits` hits; its code and remaining.
async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    entries: &[(&str, &str)],
    hits: u32,
) -> (Code, u32) {
    ask_with(client, domain, entries, hits, None).await
}

/// [`ask`], the descriptor carrying a `limit` override.
async fn ask_with(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    entries: &[(&str, &str)],
    hits: u32,
    limit: Option<RateLimitOverride>,
) -> (Code, u32) {
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|&(key, value)| Entry {
                        key: key.into(),
                        value: value.into(),
                    })
                    .collect(),
                limit,
                ..RateLimitDescriptor::default()
            }],
            hits_addend: hits,
        })
        .await
        .unwrap()
        .into_inner();
    let status = &response.statuses[0];
    (status.code(), status.limit_remaining)
}

/// Plays `run`, given the start of the window of `unit` seconds it begins in; plays it
/// again (three tries at most) when it failed across a boundary of that window, where the
/// keys it named for the window it started in no longer hold its counts. A run that
/// failed within its window fails the test; one that passed is not played again, as
/// some of its keys (those of a longer window) keep what it counted.
async fn within_one_window(unit: u64, mut run: impl AsyncFnMut(u64)) {
    for _ in 0..3 {
        let start = window_start(unix_now(), unit);
        let Err(failure) = AssertUnwindSafe(run(start)).catch_unwind().await else {
            return;
        };
        if window_start(unix_now(), unit) == start {
            resume_unwind(failure);
        }
    }
    panic!("three runs in a row failed across a window boundary");
}

/// A count envoy left is honoured: at its limit, the next check is over, and counts as
/// envoy's does (INCRBY, then compare: src/redis/fixed_cache_impl.go:166-220).
async fn a_count_envoy_left_is_honoured(redis: Redis) {
    let domain = format!("left-{redis:?}-{}", std::process::id());
    let server = start(redis, &domain, &["--prefix", "prefix:"]);
    let mut client = client(&server).await;
    within_one_window(HOUR, async |start| {
        let user = format!("u{start}");
        let name = format!("prefix:{domain}_key_{user}_{start}");
        redis.set(&name, 5, HOUR);
        assert_eq!(
            ask(&mut client, &domain, &[("key", &user)], 1).await,
            (Code::OverLimit, 0)
        );
        assert_eq!(redis.get(&name).0, Some(6));
        // One below its limit, one more fits.
        let other = format!("v{start}");
        let name = format!("prefix:{domain}_key_{other}_{start}");
        redis.set(&name, 4, HOUR);
        assert_eq!(
            ask(&mut client, &domain, &[("key", &other)], 1).await,
            (Code::Ok, 0)
        );
        assert_eq!(redis.get(&name).0, Some(5));
    })
    .await;
}

/// What sluicegate counts is in envoy's key: its name, the hits, and a TTL of the unit
/// plus a jitter below `--expiration-jitter-max`, set on every increment
/// (src/redis/fixed_cache_impl.go:31-34, 166-171).
async fn counts_in_envoys_keys(redis: Redis) {
    let domain = format!("keys-{redis:?}-{}", std::process::id());
    // No --prefix: envoy's CACHE_KEY_PREFIX default, none.
    let server = start(redis, &domain, &["--expiration-jitter-max", "20s"]);
    let mut client = client(&server).await;
    let ttl_ok = |ttl: i64, unit: u64| (unit as i64 - 1..unit as i64 + 20).contains(&ttl);
    within_one_window(60, async |minute| {
        let hour = window_start(minute, HOUR);
        let user = format!("u{minute}");
        assert_eq!(
            ask(&mut client, &domain, &[("key", &user)], 2).await,
            (Code::Ok, 3)
        );
        assert_eq!(
            ask(&mut client, &domain, &[("key", &user)], 1).await,
            (Code::Ok, 2)
        );
        let (count, ttl) = redis.get(&format!("{domain}_key_{user}_{hour}"));
        assert_eq!(count, Some(3));
        assert!(ttl_ok(ttl, HOUR), "TTL {ttl}");

        let sub = format!("s{minute}");
        ask(
            &mut client,
            &domain,
            &[("key2", "value2"), ("subkey2", &sub)],
            1,
        )
        .await;
        let (count, ttl) = redis.get(&format!("{domain}_key2_value2_subkey2_{sub}_{minute}"));
        assert_eq!(count, Some(1));
        assert!(ttl_ok(ttl, 60), "TTL {ttl}");

        // share_threshold: the wildcard in place of the value.
        ask(
            &mut client,
            &domain,
            &[("files", &format!("files/a{minute}"))],
            1,
        )
        .await;
        ask(&mut client, &domain, &[("files", "files/b.csv")], 1).await;
        assert_eq!(
            redis.get(&format!("{domain}_files_files/*_{hour}")).0,
            Some(2)
        );

        // An empty value: nothing between its two `_`.
        ask(&mut client, &domain, &[("empty", "")], 1).await;
        assert_eq!(redis.get(&format!("{domain}_empty__{hour}")).0, Some(1));

        // A limit override counts in the descriptor's key, as the configured limit does
        // (cache_key.go names no limit in it): 100 an hour, on the 3 counted above.
        let hundred = RateLimitOverride {
            requests_per_unit: 100,
            unit: 3,
        };
        assert_eq!(
            ask_with(&mut client, &domain, &[("key", &user)], 1, Some(hundred)).await,
            (Code::Ok, 96)
        );
        assert_eq!(redis.get(&format!("{domain}_key_{user}_{hour}")).0, Some(4));
        // An unlimited descriptor has no key.
        assert_eq!(
            ask(&mut client, &domain, &[("free", "x")], 1).await.0,
            Code::Ok
        );
        assert_eq!(redis.get(&format!("{domain}_free_x_{hour}")).0, None);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_envoy_left_is_honoured_on_a_server() {
    a_count_envoy_left_is_honoured(Redis::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_envoy_left_is_honoured_on_a_cluster() {
    a_count_envoy_left_is_honoured(Redis::Cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_in_envoys_keys_on_a_server() {
    counts_in_envoys_keys(Redis::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_in_envoys_keys_on_a_cluster() {
    counts_in_envoys_keys(Redis::Cluster).await;
}

#[test]
fn a_jitter_of_part_of_a_second_stops_the_start() {
    let error = Server::try_start(&["--compat", "envoy", "--expiration-jitter-max", "1500ms"])
        .err()
        .expect("refused");
    assert!(error.contains("--expiration-jitter-max 1500ms"), "{error}");
}
