//! What Envoy reads in an answer, over real gRPC with envoy-types' stubs: the headers it
//! adds to the client's response (none unless asked), and each descriptor's status.

use crate::server;

use std::path::PathBuf;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use server::Server;

/// Domain `d`: `a` 10 a minute, `b` 3 an hour.
const CONFIG: &str = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 3}
";

/// `config` in a file of this test's own.
fn config_file(name: &str, config: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("config.yaml");
    std::fs::write(&file, config).unwrap();
    file
}

/// One descriptor per key, each with the value `v`.
fn request(keys: &[&str]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".to_owned(),
        descriptors: keys
            .iter()
            .map(|key| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*key).to_owned(),
                    value: "v".to_owned(),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn call(server: &Server, keys: &[&str]) -> RateLimitResponse {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .expect("connect over gRPC");
    client
        .should_rate_limit(request(keys))
        .await
        .unwrap()
        .into_inner()
}

fn headers(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

/// Starts a server on `config` with `flags`.
fn serve(name: &str, config: &str, flags: &[&str]) -> Server {
    let file = config_file(name, config);
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend_from_slice(flags);
    Server::start(&args)
}

/// Without --response-headers nothing of the configuration reaches the client: no rule
/// names, no numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_headers_by_default() {
    let server = serve("no-headers", CONFIG, &[]);
    for _ in 0..4 {
        let response = call(&server, &["a", "b"]).await;
        assert_eq!(headers(&response), [], "{response:?}");
    }
}

/// envoyproxy/ratelimit's three headers come from one descriptor: the one with the least
/// remaining while all pass, the one over its limit once one is
/// (envoyproxy/ratelimit@f2fb157 src/service/ratelimit.go:206-264).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_headers_come_from_the_descriptor_closest_to_its_limit() {
    let server = serve("envoy-headers", CONFIG, &["--response-headers", "envoy"]);
    let first = headers(&call(&server, &["a", "b"]).await);
    let names: Vec<&str> = first.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
    );
    // b has 2 of 3 left, a 9 of 10: b speaks.
    assert_eq!(first[0].1, "3");
    assert_eq!(first[1].1, "2");
    let reset: u64 = first[2].1.parse().unwrap();
    assert!((1..=3600).contains(&reset), "{first:?}");
    call(&server, &["a", "b"]).await;
    call(&server, &["a", "b"]).await;
    let over = call(&server, &["a", "b"]).await;
    assert_eq!(over.overall_code, i32::from(Code::OverLimit));
    let over = headers(&over);
    assert_eq!(
        (over[0].1.as_str(), over[1].1.as_str()),
        ("3", "0"),
        "{over:?}"
    );
    // a alone: its own numbers.
    let alone = headers(&call(&server, &["a"]).await);
    assert_eq!(alone[0].1, "10", "{alone:?}");
}

/// The three names are the operator's (envoy's LIMIT_*_HEADER), the X-RateLimit-* names
/// among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_header_names_can_be_changed() {
    let server = serve(
        "header-names",
        CONFIG,
        &[
            "--response-headers",
            "envoy",
            "--limit-header",
            "X-Limit",
            "--remaining-header",
            "X-Left",
            "--reset-header",
            "X-Reset",
        ],
    );
    let names: Vec<String> = headers(&call(&server, &["a"]).await)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(names, ["X-Limit", "X-Left", "X-Reset"]);
    let x_ratelimit = serve(
        "x-ratelimit-names",
        CONFIG,
        &[
            "--response-headers",
            "envoy",
            "--limit-header",
            "X-RateLimit-Limit",
            "--remaining-header",
            "X-RateLimit-Remaining",
            "--reset-header",
            "X-RateLimit-Reset",
        ],
    );
    let x_ratelimit = headers(&call(&x_ratelimit, &["a"]).await);
    assert_eq!(
        x_ratelimit[..2],
        [
            ("X-RateLimit-Limit".to_owned(), "10".to_owned()),
            ("X-RateLimit-Remaining".to_owned(), "9".to_owned())
        ]
    );
    assert_eq!(x_ratelimit[2].0, "X-RateLimit-Reset");
}

/// IETF headers are sluicegate's option: the policy of every limit and the binding one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ietf_headers_when_asked() {
    let server = serve("ietf-headers", CONFIG, &["--response-headers", "ietf"]);
    let got = headers(&call(&server, &["a", "b"]).await);
    assert!(
        got.iter()
            .any(|(k, v)| k == "RateLimit-Policy" && v.contains("q=3;w=3600")),
        "{got:?}"
    );
    assert!(got.iter().any(|(k, _)| k == "RateLimit"), "{got:?}");
}

/// `a` and `b` as [`CONFIG`], a named limit, a block with a unit, and a fixed window.
const ANSWERS: &str = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: named
    rate_limit: {name: my-limit, unit: second, requests_per_unit: 2}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: fixed
    rate_limit: {algorithm: fixed-window, unit: minute, requests_per_unit: 5}
";

/// `keys` as [`request`] asks, each hit `hits` times.
async fn call_hits(server: &Server, keys: &[&str], hits: u32) -> RateLimitResponse {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .unwrap();
    let request = RateLimitRequest {
        hits_addend: hits,
        ..request(keys)
    };
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

/// envoyproxy/ratelimit's answers (src/limiter/base_limiter.go:122-200): nothing remains
/// of a limit refused, every limited status says when it resets, a block reports its
/// limit of 0 in its unit, and a limit's name is the configuration's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_as_envoy_reads_them() {
    let server = serve("answers", ANSWERS, &[]);
    let ok = call(&server, &["a", "named"]).await;
    let a = ok.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(a.name, "", "no name configured: {ok:?}");
    assert_eq!(
        ok.statuses[1].current_limit.as_ref().unwrap().name,
        "my-limit"
    );
    // 2 of b's 3 taken; asking for 2 more is refused with 1 still there: envoy says 0.
    call_hits(&server, &["b"], 2).await;
    let over = call_hits(&server, &["b"], 2).await;
    assert_eq!(over.statuses[0].code, i32::from(Code::OverLimit));
    assert_eq!(over.statuses[0].limit_remaining, 0, "{over:?}");
    assert!(over.statuses[0].duration_until_reset.is_some(), "{over:?}");
    let blocked = call(&server, &["blocked"]).await;
    let status = &blocked.statuses[0];
    assert_eq!(status.code, i32::from(Code::OverLimit));
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (0, Unit::Minute as i32)
    );
    let reset = status
        .duration_until_reset
        .as_ref()
        .expect("a block resets");
    assert!((0..=60).contains(&reset.seconds), "{reset:?}");
    assert!(reset.seconds > 0 || reset.nanos > 0, "{reset:?}");
}

/// In compat mode the reset is whole seconds, as envoyproxy/ratelimit counts it; in
/// sluicegate's own, to the µs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_are_whole_seconds_in_compat_mode() {
    let envoy = serve("compat-durations", ANSWERS, &["--compat", "envoy"]);
    let own = serve("own-durations", ANSWERS, &[]);
    for (server, whole) in [(&envoy, true), (&own, false)] {
        // Apart: a block refuses a request without asking the store for the others.
        for key in ["fixed", "blocked"] {
            let answer = call(server, &[key]).await;
            let reset = answer.statuses[0].duration_until_reset.as_ref().unwrap();
            assert!((0..=60).contains(&reset.seconds), "{answer:?}");
            // A fixed window's reset falls on a whole second once in a million.
            assert_eq!(reset.nanos == 0, whole, "{answer:?}");
        }
    }
}

/// `--shadow-mode` (envoy's SHADOW_MODE): an answer over the limit is OK all the same,
/// its statuses still saying which limit was over (src/service/ratelimit.go:266-270).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_shadow_mode_lets_everything_through() {
    let server = serve("global-shadow", CONFIG, &["--shadow-mode"]);
    let over = call_hits(&server, &["b"], 4).await;
    assert_eq!(over.overall_code, i32::from(Code::Ok), "{over:?}");
    assert_eq!(
        over.statuses[0].code,
        i32::from(Code::OverLimit),
        "{over:?}"
    );
    let without = serve("no-global-shadow", CONFIG, &[]);
    let refused = call_hits(&without, &["b"], 4).await;
    assert_eq!(refused.overall_code, i32::from(Code::OverLimit));
}
