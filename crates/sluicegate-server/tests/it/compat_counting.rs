//! How a request's descriptors are counted, sluicegate's way and envoy's way
//! (`--compat envoy`, with and without `--stop-increment-when-over-limit`), over real gRPC
//! (tonic with Envoy's generated stubs, and Python's grpcio), on the memory store and Redis.
//!
//! The rules are per day, so that no window boundary falls inside a test but once a day.

use std::process::Command;
use std::time::{Duration, Instant};

use sluicegate_test_support as support;
use sluicegate_test_support::{FaultProxy, RedisServer};

use crate::python;
use crate::server;

use python::run_python;
use server::Server;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

/// `a`: 2 a day, `b`, `c` and `d`: 5 a day.
const CONFIG: &str = "domain: counting
descriptors:
  - key: a
    rate_limit:
      unit: day
      requests_per_unit: 2
  - key: b
    rate_limit:
      unit: day
      requests_per_unit: 5
  - key: c
    rate_limit:
      unit: day
      requests_per_unit: 5
  - key: d
    rate_limit:
      unit: day
      requests_per_unit: 5
";

/// A server on `store` with `args`, its configuration written for `test`.
fn start(test: &str, store: Store, args: &[&str]) -> Server {
    let path = std::env::temp_dir().join(format!(
        "sluicegate-compat-{test}-{:?}-{}.yaml",
        store,
        std::process::id()
    ));
    std::fs::write(&path, CONFIG).unwrap();
    let prefix = format!("compat-{test}-{}:", std::process::id());
    let mut all = vec!["--config", path.to_str().unwrap()];
    let url;
    if store == Store::Redis {
        url = support::standalone().url();
        all.extend(["--store", &url, "--prefix", &prefix]);
    }
    all.extend(args);
    Server::start(&all)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    Memory,
    Redis,
}

async fn client(server: &Server) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .expect("connect over gRPC")
}

/// One request of `descriptors`, each `(key, hits_addend)`; `None` takes the request's.
fn request(descriptors: &[(&str, Option<u64>)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "counting".into(),
        descriptors: descriptors
            .iter()
            .map(|&(key, hits)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value: "v".into(),
                }],
                hits_addend: hits.map(|value| UInt64Value { value }),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// The overall code, and each descriptor's code and remaining, as `'O'`k / `'X'` over.
fn summary(response: &RateLimitResponse) -> (char, Vec<(char, u32)>) {
    let code = |c: i32| if c == i32::from(Code::Ok) { 'O' } else { 'X' };
    (
        code(response.overall_code),
        response
            .statuses
            .iter()
            .map(|s| (code(s.code), s.limit_remaining))
            .collect(),
    )
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: &[(&str, Option<u64>)],
) -> (char, Vec<(char, u32)>) {
    let response = client
        .should_rate_limit(request(descriptors))
        .await
        .unwrap_or_else(|e| panic!("{descriptors:?}: {e}"))
        .into_inner();
    summary(&response)
}

const AB: &[(&str, Option<u64>)] = &[("a", None), ("b", None)];

/// sluicegate's counting: a refused request costs nothing, in any descriptor.
async fn all_or_nothing(store: Store) {
    let server = start("none", store, &[]);
    let mut c = client(&server).await;
    assert_eq!(ask(&mut c, AB).await, ('O', vec![('O', 1), ('O', 4)]));
    assert_eq!(ask(&mut c, AB).await, ('O', vec![('O', 0), ('O', 3)]));
    // `a` is over: `b` is held back, its remaining untouched.
    assert_eq!(ask(&mut c, AB).await, ('X', vec![('X', 0), ('O', 3)]));
    assert_eq!(ask(&mut c, &[("b", None)]).await, ('O', vec![('O', 2)]));
    // Listed twice, one limit and one answer.
    assert_eq!(
        ask(&mut c, &[("b", None), ("b", None)]).await,
        ('O', vec![('O', 1), ('O', 1)])
    );
    // A refusal costs nothing: 4 taken, 2 more refused (an over-limit status answers 0
    // remaining, as envoy's), 1 more fits.
    assert_eq!(ask(&mut c, &[("c", Some(4))]).await, ('O', vec![('O', 1)]));
    assert_eq!(ask(&mut c, &[("c", Some(2))]).await, ('X', vec![('X', 0)]));
    assert_eq!(ask(&mut c, &[("c", None)]).await, ('O', vec![('O', 0)]));
    // Each descriptor at its own hits, still all-or-nothing: d takes 2 while b takes its
    // last; then b is over and d, held back, takes nothing.
    assert_eq!(
        ask(&mut c, &[("d", Some(2)), ("b", Some(1))]).await,
        ('O', vec![('O', 3), ('O', 0)])
    );
    assert_eq!(
        ask(&mut c, &[("d", Some(1)), ("b", Some(1))]).await,
        ('X', vec![('O', 3), ('X', 0)])
    );
}

/// envoy's counting: each descriptor counts its hits, refused or not.
async fn each_descriptor(store: Store) {
    let server = start("envoy", store, &["--compat", "envoy"]);
    let mut c = client(&server).await;
    assert_eq!(ask(&mut c, AB).await, ('O', vec![('O', 1), ('O', 4)]));
    assert_eq!(ask(&mut c, AB).await, ('O', vec![('O', 0), ('O', 3)]));
    // `a` is over, and `b` counts all the same.
    assert_eq!(ask(&mut c, AB).await, ('X', vec![('X', 0), ('O', 2)]));
    // Listed twice, counted twice.
    assert_eq!(
        ask(&mut c, &[("b", None), ("b", None)]).await,
        ('O', vec![('O', 1), ('O', 0)])
    );
    // A look at no hits, as envoy adds 0 and compares: at the limit, OK with nothing
    // left; once a refused hit took the count past it, over. It counts nothing.
    assert_eq!(ask(&mut c, &[("b", Some(0))]).await, ('O', vec![('O', 0)]));
    assert_eq!(ask(&mut c, &[("b", Some(0))]).await, ('O', vec![('O', 0)]));
    assert_eq!(ask(&mut c, &[("b", None)]).await, ('X', vec![('X', 0)]));
    assert_eq!(ask(&mut c, &[("b", Some(0))]).await, ('X', vec![('X', 0)]));
    refused_hits_count(&mut c).await;
}

/// envoy's counting of one descriptor, in both envoy modes: 4 taken, 2 more refused but
/// counted, so 1 more is refused too.
async fn refused_hits_count(c: &mut RateLimitServiceClient<Channel>) {
    assert_eq!(ask(c, &[("c", Some(4))]).await, ('O', vec![('O', 1)]));
    assert_eq!(ask(c, &[("c", Some(2))]).await, ('X', vec![('X', 0)]));
    assert_eq!(ask(c, &[("c", None)]).await, ('X', vec![('X', 0)]));
    // The same when the refusal could be foreseen (the negative cache on Redis predicts
    // it from the admission): it is counted too.
    assert_eq!(ask(c, &[("d", Some(4))]).await, ('O', vec![('O', 1)]));
    assert_eq!(ask(c, &[("d", Some(4))]).await, ('X', vec![('X', 0)]));
    assert_eq!(ask(c, &[("d", None)]).await, ('X', vec![('X', 0)]));
}

/// Each descriptor is charged its own `hits_addend` under --compat envoy.
async fn own_hits_each(store: Store) {
    let server = start("hits", store, &["--compat", "envoy"]);
    let mut c = client(&server).await;
    assert_eq!(
        ask(&mut c, &[("a", Some(1)), ("b", Some(3))]).await,
        ('O', vec![('O', 1), ('O', 2)])
    );
}

/// envoy's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: when one descriptor would go over,
/// only those over count.
async fn stop_increment(store: Store) {
    let server = start(
        "stop",
        store,
        &["--compat", "envoy", "--stop-increment-when-over-limit"],
    );
    let mut c = client(&server).await;
    assert_eq!(ask(&mut c, AB).await, ('O', vec![('O', 1), ('O', 4)]));
    assert_eq!(ask(&mut c, AB).await, ('O', vec![('O', 0), ('O', 3)]));
    // `a` goes over and counts; `b` does not count.
    assert_eq!(ask(&mut c, AB).await, ('X', vec![('X', 0), ('O', 3)]));
    assert_eq!(ask(&mut c, &[("b", None)]).await, ('O', vec![('O', 2)]));
    // Listed twice, counted twice (one answer for both).
    assert_eq!(
        ask(&mut c, &[("b", None), ("b", None)]).await,
        ('O', vec![('O', 0), ('O', 0)])
    );
    assert_eq!(ask(&mut c, &[("b", None)]).await.0, 'X');
    refused_hits_count(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_on_the_memory_store() {
    all_or_nothing(Store::Memory).await;
    each_descriptor(Store::Memory).await;
    own_hits_each(Store::Memory).await;
    stop_increment(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_on_redis() {
    all_or_nothing(Store::Redis).await;
    each_descriptor(Store::Redis).await;
    own_hits_each(Store::Redis).await;
    stop_increment(Store::Redis).await;
}

/// envoy's counting checks each descriptor on its own, but not one after another: the
/// checks of a request are in flight together, as envoy's pipeline sends a request's
/// increments together. Told by the round trips a request waits for, with a latency put
/// on the Redis connection that dwarfs everything else: three descriptors checked one
/// after another wait for three round trips (6 × the latency: each way, each call); in
/// flight together, the proxy forwards what has gathered while it waits, so at most 4 ×
/// the latency (the first call alone, then the others together, each way). The bound in
/// between is the property, not a speed: a machine's own delays are milliseconds here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_counting_sends_a_requests_checks_together() {
    const LATENCY: Duration = Duration::from_millis(400);
    let redis = RedisServer::start(&[]);
    let proxy = FaultProxy::start(redis.port);
    let path = std::env::temp_dir().join(format!(
        "sluicegate-compat-together-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, CONFIG).unwrap();
    let url = proxy.url();
    let server = Server::start(&[
        "--config",
        path.to_str().unwrap(),
        "--store",
        &url,
        "--store-timeout",
        "10s",
        "--compat",
        "envoy",
    ]);
    let mut c = client(&server).await;
    let bcd: &[(&str, Option<u64>)] = &[("b", None), ("c", None), ("d", None)];
    // The connection is open and the script loaded before the latency is put on.
    assert_eq!(
        ask(&mut c, bcd).await,
        ('O', vec![('O', 4), ('O', 4), ('O', 4)])
    );
    proxy.set_latency(LATENCY);
    let started = Instant::now();
    assert_eq!(
        ask(&mut c, bcd).await,
        ('O', vec![('O', 3), ('O', 3), ('O', 3)])
    );
    let waited = started.elapsed();
    proxy.set_latency(Duration::ZERO);
    assert!(
        waited < LATENCY * 5,
        "three descriptors waited {waited:?}: one round trip after another (≥ {:?})",
        LATENCY * 6
    );
    // Each descriptor counted once: two of five taken.
    assert_eq!(
        ask(&mut c, bcd).await,
        ('O', vec![('O', 2), ('O', 2), ('O', 2)])
    );
    // Two descriptors of one limit count in request order, as envoy's pipeline applies
    // them: 2 of the 2 left taken, then 1 refused (and charged) — not 1 taken and 2 refused.
    proxy.set_latency(LATENCY);
    assert_eq!(
        ask(&mut c, &[("b", Some(2)), ("b", Some(1))]).await,
        ('X', vec![('O', 0), ('X', 0)])
    );
    proxy.set_latency(Duration::ZERO);
}

/// Without --compat envoy the envoy-only switch is refused, naming what it needs.
#[test]
fn stop_increment_needs_compat_envoy() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--stop-increment-when-over-limit")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs --compat envoy"), "{stderr}");
}

/// Python's grpcio, with Envoy's generated stubs: envoy's counting, descriptor by
/// descriptor, each at its own hits.
#[test]
fn envoy_counting_from_python_grpcio() {
    let server = start("python", Store::Memory, &["--compat", "envoy"]);
    let call = |descriptors: &[&str]| {
        let args: Vec<&str> = [server.address.as_str(), "counting"]
            .into_iter()
            .chain(descriptors.iter().copied())
            .collect();
        run_python("rls_counting.py", &args)
    };
    assert_eq!(
        call(&["a=v*3", "b=v*2"]),
        "OVER_LIMIT\nOVER_LIMIT 0\nOK 3\n"
    );
    assert_eq!(call(&["b=v"]), "OK\nOK 2\n");
}
