//! One client's floods against the real binary under a small memory budget: descriptor
//! values of 60 KB over HTTP and gRPC, and distinct request ids on one key. The process's
//! resident memory grows, at its peak (the kernel's `VmHWM`), by no more than the budget
//! plus a stated overhead over what it held at rest, and every request is answered by a
//! decision.

use crate::server;

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use server::Server;

/// The budget the flood of huge values runs under.
const BUDGET_MIB: u64 = 32;

/// What the process may hold beside the budget while huge values flood it: the requests
/// in flight ([`IN_FLIGHT`] bodies of 240 KiB, a gRPC message of 3.7 MiB decoded beside
/// its bytes) and the allocator's free pages not yet returned.
const OVERHEAD_MIB: u64 = 24;

/// Requests in flight at once, per flood.
const IN_FLIGHT: usize = 8;

/// A value the size Envoy forwards from a header (60 KiB), distinct by `seed`.
fn huge_value(seed: usize) -> String {
    let mut value = format!("{seed:08}-");
    value.push_str(&"v".repeat(60 * 1024 - value.len()));
    value
}

/// A field of the server's `/proc/PID/status` in MiB: `VmRSS` (resident now) or `VmHWM`
/// (resident at its peak so far).
fn rss_mib(server: &Server, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/PID/status"));
    kib / 1024
}

/// Asserts the server's peak resident memory grew by at most `budget + overhead` MiB
/// over `at_rest`.
fn assert_growth_within(server: &Server, at_rest: u64, budget: u64, overhead: u64) {
    let grown = rss_mib(server, "VmHWM").saturating_sub(at_rest);
    eprintln!("resident memory grew by {grown} MiB at its peak over {at_rest} MiB at rest");
    assert!(
        grown <= budget + overhead,
        "resident memory grew by {grown} MiB, over {budget} MiB of budget + {overhead} MiB"
    );
}

/// Sends `bodies` to `path` over HTTP/1.1, [`IN_FLIGHT`] at a time: every status.
async fn post_all(address: &str, path: &str, bodies: Vec<String>) -> Vec<u16> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<axum::body::Bytes>>();
    let uri = format!("http://{address}{path}");
    let limit = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut answers = Vec::new();
    for body in bodies {
        let (client, uri) = (client.clone(), uri.clone());
        let permit = Arc::clone(&limit).acquire_owned().await.unwrap();
        answers.push(tokio::spawn(async move {
            let request = axum::http::Request::post(uri)
                .header("content-type", "application/json")
                .body(Full::new(axum::body::Bytes::from(body)))
                .unwrap();
            let response = client.request(request).await.expect("answered");
            let status = response.status().as_u16();
            response.into_body().collect().await.expect("a whole body");
            drop(permit);
            status
        }));
    }
    let mut statuses = Vec::new();
    for answer in answers {
        statuses.push(answer.await.unwrap());
    }
    statuses
}

/// Serves `warm_up` first, then reads the resident memory: what the process holds at rest
/// once its runtime, connections and buffers have served requests of the flood's shape.
async fn at_rest_after(server: &Server, path: &str, warm_up: Vec<String>) -> u64 {
    let statuses = post_all(&server.address, path, warm_up).await;
    assert!(statuses.iter().all(|&s| s == 200), "warm-up answered");
    rss_mib(server, "VmRSS")
}

/// Envoy's JSON check of four `[api=x, user=…]` descriptors (the example's one-hour
/// rule, whose keys stay for the hour), each user a 60 KiB value never seen before.
fn four_huge_users(request: usize) -> String {
    let descriptors: Vec<String> = (0..4)
        .map(|i| {
            format!(
                r#"{{"entries":[{{"key":"api","value":"x"}},{{"key":"user","value":"{}"}}]}}"#,
                huge_value(request * 4 + i)
            )
        })
        .collect();
    format!(
        r#"{{"domain":"example","descriptors":[{}]}}"#,
        descriptors.join(",")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_of_60_kb_over_http_and_grpc_stay_within_the_budget() {
    let budget = format!("{BUDGET_MIB}MiB");
    let server = Server::binary(&["--max-memory", &budget]);
    // Values no rule matches: answered OK, nothing kept.
    let unmatched = |i: usize| {
        format!(
            r#"{{"domain":"example","descriptors":[{{"entries":[{{"key":"nobody","value":"{}"}}]}}]}}"#,
            huge_value(i)
        )
    };
    let at_rest = at_rest_after(&server, "/json", (0..200).map(unmatched).collect()).await;

    // 3,000 requests of four new 60 KiB users: 12,000 keys, 720 MB of values.
    let statuses = post_all(
        &server.address,
        "/json",
        (0..3_000).map(four_huge_users).collect(),
    )
    .await;
    assert!(statuses.iter().all(|&s| s == 200), "every check decided");

    // 100 gRPC requests of 60 new 60 KiB users: 6,000 keys, 360 MB of values.
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .expect("connect over gRPC");
    for request in 0..100 {
        let descriptors = (0..60)
            .map(|i| RateLimitDescriptor {
                entries: vec![
                    Entry {
                        key: "api".into(),
                        value: "x".into(),
                    },
                    Entry {
                        key: "user".into(),
                        value: huge_value(1_000_000 + request * 60 + i),
                    },
                ],
                ..RateLimitDescriptor::default()
            })
            .collect();
        let answer = client
            .should_rate_limit(RateLimitRequest {
                domain: "example".into(),
                descriptors,
                hits_addend: 0,
            })
            .await;
        assert!(answer.is_ok(), "request {request}: {answer:?}");
    }

    assert_growth_within(&server, at_rest, BUDGET_MIB, OVERHEAD_MIB);
    // Still deciding.
    let statuses = post_all(&server.address, "/json", vec![four_huge_users(9_999)]).await;
    assert_eq!(statuses, [200]);
    assert!(server.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_request_ids_on_one_key_stay_within_the_budget() {
    // Ids of 50,000 reports overflow this fourfold; beside it the process holds only
    // bodies of 400 bytes in flight and the allocator's slack.
    const IDS_BUDGET_MIB: u64 = 4;
    const IDS_OVERHEAD_MIB: u64 = 8;
    let budget = format!("{IDS_BUDGET_MIB}MiB");
    let server = Server::binary(&["--max-memory", &budget]);
    let report = |model: &str, id: &str| {
        format!(
            r#"{{"domain":"example","descriptors":[{{"entries":[{{"key":"model","value":"{model}"}}]}}],"cost":1,"mode":"report","request_id":"{id}"}}"#
        )
    };
    // Reports on another key, one id again and again: a retry keeps nothing more.
    let retry = format!("{:0>256}", "retried");
    let at_rest = at_rest_after(
        &server,
        "/v1/check",
        (0..2_000).map(|_| report("warm", &retry)).collect(),
    )
    .await;
    // 50,000 reports of one token each on one key, each with a new id of 256 bytes (the
    // longest allowed): 12.8 MB of ids alone, 17 MB if they were held unbounded.
    let bodies = (0..50_000)
        .map(|i| report("m", &format!("{i:010}-{}", "r".repeat(245))))
        .collect();
    let statuses = post_all(&server.address, "/v1/check", bodies).await;
    assert!(statuses.iter().all(|&s| s == 200), "every report decided");
    assert_growth_within(&server, at_rest, IDS_BUDGET_MIB, IDS_OVERHEAD_MIB);
    assert!(server.stop().success());
}
