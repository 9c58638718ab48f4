//! Usage-based limits through the service's front ends (docs/SPEC.md, "Usage" and "Envoy
//! compatibility: counting"): a token-limited route driven the way Envoy drives it over
//! gRPC (tonic with Envoy's generated stubs, and Python's grpcio), on the memory store,
//! Redis and a Redis Cluster, by default and with `--compat envoy`; and `/v1/check`'s
//! modes over real HTTP.
//!
//! The rules are per day, so that no window boundary falls inside a test but once a day.

use sluicegate_test_support as support;

use crate::python;
use crate::server;

use python::run_python;
use server::Server;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// `model`: 1000 tokens a day, a usage rule; `route`: 100 requests a day; `api`: a fixed
/// window of 100 a day, for the HTTP modes.
const CONFIG: &str = "domain: llm
descriptors:
  - key: model
    rate_limit:
      unit: day
      requests_per_unit: 1000
      usage: true
  - key: route
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: api
    rate_limit:
      algorithm: fixed-window
      unit: day
      requests_per_unit: 100
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    Memory,
    Redis,
    Cluster,
}

/// A server on `store` with `args`, its configuration and key prefix its own.
fn start(test: &str, store: Store, args: &[&str]) -> Server {
    let path = std::env::temp_dir().join(format!(
        "sluicegate-usage-{test}-{store:?}-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, CONFIG).unwrap();
    let prefix = format!("usage-{test}-{}:", std::process::id());
    let mut all = vec!["--config", path.to_str().unwrap()];
    let url = match store {
        Store::Memory => None,
        Store::Redis => Some(support::standalone().url()),
        Store::Cluster => Some(support::cluster().url()),
    };
    if let Some(url) = &url {
        all.extend(["--store", url, "--prefix", &prefix]);
    }
    all.extend(args);
    Server::start(&all)
}

async fn client(server: &Server) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .expect("connect over gRPC")
}

/// A descriptor of `entries` (`key=value,…`) at `hits`.
fn descriptor(entries: &str, hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .split(',')
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap();
                Entry {
                    key: key.into(),
                    value: value.into(),
                }
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

/// The overall code, and each descriptor's code and remaining, `'O'`k / `'X'` over.
type Summary = (char, Vec<(char, u32)>);

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: &[(&str, Option<u64>)],
) -> Result<Summary, tonic::Status> {
    let request = RateLimitRequest {
        domain: "llm".into(),
        descriptors: descriptors
            .iter()
            .map(|&(entries, hits)| descriptor(entries, hits))
            .collect(),
        hits_addend: 0,
    };
    let response = client.should_rate_limit(request).await?.into_inner();
    let code = |c: i32| if c == i32::from(Code::Ok) { 'O' } else { 'X' };
    Ok((
        code(response.overall_code),
        response
            .statuses
            .iter()
            .map(|s| (code(s.code), s.limit_remaining))
            .collect(),
    ))
}

async fn one(client: &mut RateLimitServiceClient<Channel>, entries: &str, hits: u64) -> Summary {
    ask(client, &[(entries, Some(hits))])
        .await
        .unwrap_or_else(|e| panic!("{entries} *{hits}: {e}"))
}

/// The tokens of `model=<model>` still free, on a server started with `args`: a
/// request-time call (hits 0) is a peek, which answers as one unit, so one more than it
/// leaves; under `--compat envoy` it answers for none, as envoy adds 0 (a fixed window).
async fn free(client: &mut RateLimitServiceClient<Channel>, model: &str, args: &[&str]) -> u32 {
    let (_, statuses) = one(client, &format!("model={model}"), 0).await;
    let envoy = args.windows(2).any(|w| w == ["--compat", "envoy"]);
    statuses[0].1 + u32::from(statuses[0].0 == 'O' && !envoy)
}

/// Token counts of eight responses (one of them empty): 486 in all.
const TOKENS: [u64; 8] = [37, 5, 120, 0, 64, 9, 250, 1];

/// Envoy's own `apply_on_stream_done` flow: at request time the descriptor at hits 0 (a
/// check, refused once the key is spent), at stream done the same descriptor with the
/// request id and the response's tokens (a report). Each call is sent twice, as a retry
/// would: no token is lost, none counted twice.
async fn stream_done_reports(store: Store, args: &[&str]) {
    let server = start("report", store, args);
    let mut c = client(&server).await;
    for (k, &tokens) in TOKENS.iter().enumerate() {
        for _ in 0..2 {
            assert_eq!(one(&mut c, "model=m1", 0).await.0, 'O');
        }
        for _ in 0..2 {
            let (code, statuses) = one(&mut c, &format!("model=m1,request_id=r{k}"), tokens).await;
            assert_eq!(code, 'O');
            assert_eq!(statuses[0].0, 'O');
        }
    }
    assert_eq!(free(&mut c, "m1", args).await, 1000 - 486);
    // Without a request id (Envoy Gateway's descriptors carry none) it is a report too.
    assert_eq!(one(&mut c, "model=m1", 14).await, ('O', vec![('O', 500)]));

    // A response of more tokens than are left puts the key into debt: answered OK (a
    // report is never refused), nothing remaining; the next request is refused. (No
    // request id again: a check of 600 would have been refused, the tokens lost.)
    assert_eq!(one(&mut c, "model=m1", 600).await, ('O', vec![('O', 0)]));
    assert_eq!(one(&mut c, "model=m1", 0).await, ('X', vec![('X', 0)]));
    assert_eq!(free(&mut c, "m1", args).await, 0);
}

/// The reserve/settle variant: at request time the estimate is reserved under the
/// request id (`usage: reserve`), at stream done the real cost settles it (`usage:
/// settle`), both retried; what stays is the sum of the real costs.
async fn reserve_then_settle(store: Store, args: &[&str]) {
    let server = start("settle", store, args);
    let mut c = client(&server).await;
    let requests: [(u64, u64); 4] = [(100, 37), (50, 80), (200, 200), (10, 3)];
    for (k, &(estimate, real)) in requests.iter().enumerate() {
        let id = format!("request_id=s{k}");
        for _ in 0..2 {
            let reserve = one(&mut c, &format!("model=m2,{id},usage=reserve"), estimate).await;
            assert_eq!(reserve.0, 'O', "reserve {k}");
        }
        for _ in 0..2 {
            let settle = one(&mut c, &format!("model=m2,usage=settle,{id}"), real).await;
            assert_eq!(settle.0, 'O', "settle {k}");
        }
    }
    let real: u64 = requests.iter().map(|r| r.1).sum();
    assert_eq!(u64::from(free(&mut c, "m2", args).await), 1000 - real);
    // A reserve of more than is free is refused and holds nothing.
    let refused = one(&mut c, "model=m2,request_id=s9,usage=reserve", 1000).await;
    assert_eq!(refused.0, 'X');
    assert_eq!(u64::from(free(&mut c, "m2", args).await), 1000 - real);
}

/// A request that cost nothing settles at 0: its whole reservation is refunded, once,
/// however often the settle is retried.
async fn a_retried_settle_of_nothing_refunds_once(store: Store) {
    let server = start("settle-0", store, &[]);
    let mut c = client(&server).await;
    one(&mut c, "model=m6,request_id=before", 100).await;
    for _ in 0..2 {
        one(&mut c, "model=m6,request_id=z,usage=reserve", 30).await;
    }
    assert_eq!(free(&mut c, "m6", &[]).await, 870);
    for _ in 0..3 {
        one(&mut c, "model=m6,request_id=z,usage=settle", 0).await;
        assert_eq!(free(&mut c, "m6", &[]).await, 900);
    }
}

#[tokio::test]
async fn a_retried_settle_of_nothing_refunds_once_on_memory() {
    a_retried_settle_of_nothing_refunds_once(Store::Memory).await;
}

#[tokio::test]
async fn a_retried_settle_of_nothing_refunds_once_on_redis() {
    a_retried_settle_of_nothing_refunds_once(Store::Redis).await;
}

#[tokio::test]
async fn envoy_stream_done_reports_on_memory() {
    stream_done_reports(Store::Memory, &[]).await;
}

#[tokio::test]
async fn envoy_stream_done_reports_on_redis() {
    stream_done_reports(Store::Redis, &[]).await;
}

#[tokio::test]
async fn envoy_stream_done_reports_on_a_cluster() {
    stream_done_reports(Store::Cluster, &[]).await;
}

#[tokio::test]
async fn envoy_stream_done_reports_under_compat_envoy() {
    stream_done_reports(Store::Memory, &["--compat", "envoy"]).await;
    stream_done_reports(Store::Redis, &["--compat", "envoy"]).await;
}

#[tokio::test]
async fn envoy_reserve_then_settle_on_memory() {
    reserve_then_settle(Store::Memory, &[]).await;
}

#[tokio::test]
async fn envoy_reserve_then_settle_on_redis() {
    reserve_then_settle(Store::Redis, &[]).await;
}

#[tokio::test]
async fn envoy_reserve_then_settle_on_a_cluster() {
    reserve_then_settle(Store::Cluster, &[]).await;
}

#[tokio::test]
async fn envoy_reserve_then_settle_under_compat_envoy() {
    reserve_then_settle(Store::Memory, &["--compat", "envoy"]).await;
    reserve_then_settle(Store::Redis, &["--compat", "envoy"]).await;
}

/// A request-time call mixing a request count (a check) and a token reservation is one
/// check: when the reservation does not fit, the request is not counted either.
#[tokio::test]
async fn a_check_and_a_reserve_are_all_or_nothing() {
    let server = start("mixed", Store::Memory, &[]);
    let mut c = client(&server).await;
    let too_many = [
        ("route=chat", Some(1)),
        ("model=m3,request_id=x1,usage=reserve", Some(1001)),
    ];
    assert_eq!(ask(&mut c, &too_many).await.unwrap().0, 'X');
    let fits = [
        ("route=chat", Some(1)),
        ("model=m3,request_id=x2,usage=reserve", Some(400)),
    ];
    assert_eq!(
        ask(&mut c, &fits).await.unwrap(),
        ('O', vec![('O', 99), ('O', 600)])
    );
    // A report beside a check is a check of its own: it counts even when the check is
    // refused, and a spent standing does not refuse the request.
    let spent = [
        ("route=chat", Some(100)),
        ("model=m3,request_id=x3", Some(900)),
    ];
    assert_eq!(
        ask(&mut c, &spent).await.unwrap(),
        ('X', vec![('X', 0), ('O', 0)])
    );
    // Two ids in one check are ambiguous: refused as bad input.
    let two_ids = [
        ("model=m5,request_id=a", Some(0)),
        ("model=m3,request_id=b,usage=reserve", Some(1)),
    ];
    let error = ask(&mut c, &two_ids).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(error.message().contains("one id"), "{}", error.message());
}

/// Bad usage entries name what is wrong and change nothing; entries named `usage` on a
/// rule that is no usage rule are part of its key as ever.
#[tokio::test]
async fn bad_usage_entries_are_invalid_arguments() {
    let server = start("bad", Store::Memory, &[]);
    let mut c = client(&server).await;
    for (entries, wanted) in [
        (
            "model=m4,request_id=r,usage=spend",
            "descriptors[0].entries[2].value: unknown usage mode \"spend\"",
        ),
        (
            "model=m4,usage=reserve",
            "descriptors[0]: a reserve needs a request_id entry",
        ),
        (
            "model=m4,usage=settle",
            "descriptors[0]: a settle needs a request_id entry",
        ),
    ] {
        let error = ask(&mut c, &[(entries, Some(5))]).await.unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument, "{entries}");
        assert!(error.message().contains(wanted), "{}", error.message());
    }
    assert_eq!(free(&mut c, "m4", &[]).await, 1000);
    // `route` is no usage rule: `route=chat,usage=report` is a key it has no rule for.
    assert_eq!(
        one(&mut c, "route=chat,usage=report", 5).await,
        ('O', vec![('O', 0)])
    );
    assert_eq!(one(&mut c, "route=chat", 0).await, ('O', vec![('O', 99)]));
}

/// `Retry-After` (`--response-headers ietf`) goes with a refusal only: not with a report
/// that spends the key, but with the check refused after it.
#[tokio::test]
async fn retry_after_only_for_a_refusal() {
    let server = start("headers", Store::Memory, &["--response-headers", "ietf"]);
    let mut c = client(&server).await;
    let retry_after = |descriptor: RateLimitDescriptor| {
        let mut c = c.clone();
        async move {
            let request = RateLimitRequest {
                domain: "llm".into(),
                descriptors: vec![descriptor],
                hits_addend: 0,
            };
            let response = c.should_rate_limit(request).await.unwrap().into_inner();
            let headers = response.response_headers_to_add;
            (
                response.overall_code == i32::from(Code::Ok),
                headers.iter().any(|h| h.key == "Retry-After"),
            )
        }
    };
    let report = descriptor("model=h,request_id=h1", Some(1500));
    assert_eq!(retry_after(report).await, (true, false));
    assert_eq!(
        retry_after(descriptor("model=h", Some(0))).await,
        (false, true)
    );
    assert_eq!(one(&mut c, "model=h", 0).await.0, 'X');
}

/// Python's grpcio with Envoy's generated stubs drives the same flow.
#[test]
fn envoy_stream_done_reports_from_python_grpcio() {
    let server = start("python", Store::Memory, &[]);
    let call =
        |descriptor: &str| run_python("rls_counting.py", &[&server.address, "llm", descriptor]);
    assert_eq!(call("model=py*0"), "OK\nOK 999\n");
    for _ in 0..2 {
        assert_eq!(call("model=py,request_id=p1*300"), "OK\nOK 700\n");
    }
    assert_eq!(
        call("model=py,request_id=p2,usage=report*800"),
        "OK\nOK 0\n"
    );
    assert_eq!(call("model=py*0"), "OVER_LIMIT\nOVER_LIMIT 0\n");
}

fn check(server: &Server, body: Value) -> (u16, Value) {
    let (status, text) = server.request("POST", "/v1/check", &body.to_string());
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

fn api(mode: Option<&str>, cost: u64, request_id: Option<&str>) -> Value {
    let mut body = json!({
        "domain": "llm",
        "descriptors": [{"entries": [{"key": "api", "value": "k"}]}],
        "cost": cost,
    });
    if let Some(mode) = mode {
        body["mode"] = mode.into();
    }
    if let Some(id) = request_id {
        body["request_id"] = id.into();
    }
    body
}

/// `(allowed, remaining)` of a `/v1/check` answer, which must be a 200.
fn standing(server: &Server, body: Value) -> (bool, u64) {
    let (status, answer) = check(server, body);
    assert_eq!(status, 200, "{answer}");
    let remaining = answer["decision"]["remaining"].as_u64().unwrap();
    (answer["allowed"].as_bool().unwrap(), remaining)
}

/// `/v1/check`'s modes, as docs/SPEC.md's fixed-window example runs them, then into debt
/// and out by a refund; every answer a 200, `allowed` saying whether the key is spent.
#[test]
fn http_modes_report_reserve_settle_and_refund() {
    let server = start("http", Store::Memory, &[]);
    let s = |mode, cost, id| standing(&server, api(mode, cost, id));
    assert_eq!(s(Some("reserve"), 30, Some("r1")), (true, 70));
    assert_eq!(s(Some("settle"), 45, Some("r1")), (true, 55));
    assert_eq!(s(Some("settle"), 45, Some("r1")), (true, 55));
    assert_eq!(s(Some("report"), 100, None), (false, 0));
    assert_eq!(s(None, 1, None), (false, 0));
    assert_eq!(s(Some("check"), 1, None), (false, 0));
    assert_eq!(s(Some("refund"), 60, Some("f1")), (true, 15));
    assert_eq!(s(Some("refund"), 60, Some("f1")), (true, 15));
    assert_eq!(
        server.metric(r#"sluicegate_usage_units_total{domain="llm",mode="report"}"#),
        100
    );
    // Envoy's hit counters count what checks asked: the reserve's 30 and the two refused
    // checks' units, none of the reports', settles' or refunds'.
    let envoy = |name: &str| server.metric(&format!("{name}{{domain=\"llm\",key1=\"api\"}}"));
    assert_eq!(envoy("ratelimit_service_rate_limit_total_hits"), 32);
    assert_eq!(envoy("ratelimit_service_rate_limit_over_limit"), 2);
    // Units the calls carried: the retry's again, though it recorded nothing.
    assert_eq!(
        server.metric(r#"sluicegate_usage_units_total{domain="llm",mode="refund"}"#),
        120
    );
}

/// An unknown mode, or a reserve or settle without a request id, is a 400 naming the
/// field, and changes nothing.
#[test]
fn http_bad_modes_are_400s_that_change_nothing() {
    let server = start("http-bad", Store::Memory, &[]);
    for (body, wanted) in [
        (api(Some("spend"), 5, None), "mode: unknown mode \"spend\""),
        (api(Some("reserve"), 5, None), "request_id: a reserve needs"),
        (api(Some("settle"), 5, None), "request_id: a settle needs"),
        (api(Some("REPORT"), 5, None), "mode: unknown mode"),
    ] {
        let (status, answer) = check(&server, body);
        assert_eq!(status, 400, "{answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains(wanted), "{error}");
    }
    assert_eq!(standing(&server, api(None, 0, None)), (true, 99));
}

/// Envoy's `/json` shares the gRPC mapping: a 429 only for a refused check, a report
/// into debt a 200.
#[test]
fn envoys_json_endpoint_answers_a_report_200_and_the_spent_check_429() {
    let server = start("json", Store::Memory, &[]);
    let call = |entries: Value, hits: u64| {
        let body =
            json!({"domain": "llm", "descriptors": [{"entries": entries, "hitsAddend": hits}]});
        server.request("POST", "/json", &body.to_string()).0
    };
    let model = json!([{"key": "model", "value": "j"}]);
    let report = json!([{"key": "model", "value": "j"}, {"key": "request_id", "value": "j1"}]);
    assert_eq!(call(model.clone(), 0), 200);
    assert_eq!(call(report, 1500), 200);
    assert_eq!(call(model, 0), 429);
}

/// `/v1/explain` reads a usage rule in debt like any other.
#[test]
fn explain_reads_a_usage_rule_in_debt() {
    let server = start("explain", Store::Memory, &[]);
    let report = json!({
        "domain": "llm",
        "descriptors": [{"entries": [{"key": "model", "value": "e"}]}],
        "cost": 1200,
        "mode": "report",
    });
    assert_eq!(check(&server, report.clone()).0, 200);
    let (status, text) = server.request("POST", "/v1/explain", &report.to_string());
    assert_eq!(status, 200, "{text}");
    let explained: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(explained["allowed"], false);
    let state = &explained["descriptors"][0]["state"];
    assert_eq!(
        (state["in_use"].as_u64(), state["available"].as_u64()),
        (Some(1000), Some(0))
    );
}

/// A request id reused for another request over `/v1/check` (on the memory store and on
/// Redis): 409 Conflict naming the id, the rule and both uses, nothing recorded, counted;
/// the retry of what the id was used for is still a repeat.
#[test]
fn http_request_id_reused_for_another_cost_is_a_409() {
    for store in [Store::Memory, Store::Redis] {
        let server = start("http-conflict", store, &[]);
        assert_eq!(standing(&server, api(None, 1, Some("R1"))), (true, 99));
        for cost in [5, 1_000_000] {
            let (status, answer) = check(&server, api(None, cost, Some("R1")));
            assert_eq!(status, 409, "{store:?}: {answer}");
            assert_eq!(answer["request_id"], "R1");
            assert_eq!(answer["remembered"], json!({"mode": "check", "cost": 1}));
            assert_eq!(answer["asked"], json!({"mode": "check", "cost": cost}));
            let error = answer["error"].as_str().unwrap();
            assert!(error.contains("\"R1\""), "{error}");
        }
        let (status, answer) = check(&server, api(Some("reserve"), 1, Some("R1")));
        assert_eq!(status, 409, "{store:?}: {answer}");
        assert_eq!(answer["asked"], json!({"mode": "reserve", "cost": 1}));
        let rule = answer["rule"].as_str().unwrap().to_owned();
        // Nothing recorded: the retry is a repeat, and a peek finds one unit taken.
        assert_eq!(standing(&server, api(None, 1, Some("R1"))), (true, 99));
        assert_eq!(standing(&server, api(None, 0, None)), (true, 98));
        assert_eq!(
            server.metric(&format!(
                "sluicegate_request_id_conflicts_total{{rule=\"{rule}\"}}"
            )),
            3
        );
    }
}

/// A request id reused for another request over gRPC, on Envoy's usage rules: answered
/// OVER_LIMIT (an error status is what Envoy lets through by default), nothing recorded,
/// on the memory store, Redis and a cluster; the retry of the same report is still OK and
/// counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_request_id_reused_for_another_cost_is_over_limit() {
    for store in [Store::Memory, Store::Redis, Store::Cluster] {
        let server = start("grpc-conflict", store, &[]);
        let mut c = client(&server).await;
        let report = "model=m7,request_id=g1";
        assert_eq!(one(&mut c, report, 300).await, ('O', vec![('O', 700)]));
        for hits in [5, 1_000_000] {
            assert_eq!(
                one(&mut c, report, hits).await,
                ('X', vec![('X', 0)]),
                "{store:?}"
            );
        }
        assert_eq!(one(&mut c, report, 300).await, ('O', vec![('O', 700)]));
        assert_eq!(free(&mut c, "m7", &[]).await, 700);
        // A reserve of 10, then the same id reserving 20: over the limit, nothing taken.
        let reserve = "model=m7,request_id=g2,usage=reserve";
        assert_eq!(one(&mut c, reserve, 10).await, ('O', vec![('O', 690)]));
        assert_eq!(one(&mut c, reserve, 20).await, ('X', vec![('X', 0)]));
        assert_eq!(free(&mut c, "m7", &[]).await, 690);
    }
}
