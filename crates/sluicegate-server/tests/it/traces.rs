//! OpenTelemetry traces (`--otlp-endpoint`): each check's span reaches a real OTLP
//! receiver started here (gRPC, or HTTP with protobuf bodies), with its attributes, joined
//! to the caller's trace when the request carries W3C trace context — over HTTP and gRPC,
//! on memory and on Redis; envoy's tracing environment under `--compat envoy`; sampling.

use sluicegate_test_support as support;

use crate::{hex, server};

use server::Server;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// The caller's trace and span, as a W3C `traceparent` names them.
const HTTP_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const HTTP_PARENT: &str = "00f067aa0ba902b7";
const GRPC_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const GRPC_PARENT: &str = "b7ad6b7169203331";

/// What the receiver was sent: every span of every export, the resources' service
/// names, and their attributes.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    services: Vec<String>,
    resources: Vec<Vec<KeyValue>>,
}

/// An OTLP trace receiver, as a collector serves it: over gRPC, or over HTTP
/// ([`start_http_receiver`]).
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Received>>);

impl Receiver {
    fn record(&self, request: ExportTraceServiceRequest) {
        let mut received = self.0.lock().unwrap();
        for resource_spans in request.resource_spans {
            if let Some(resource) = &resource_spans.resource {
                if let Some(Value::StringValue(name)) =
                    attribute(&resource.attributes, "service.name")
                {
                    received.services.push(name.clone());
                }
                received.resources.push(resource.attributes.clone());
            }
            for scope in resource_spans.scope_spans {
                received.spans.extend(scope.spans);
            }
        }
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.record(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The receiver on a free loopback port, on a runtime of its own: its address, and the
/// runtime that keeps it serving.
fn start_receiver(receiver: Receiver) -> (String, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let router = tonic::service::Routes::new(TraceServiceServer::new(receiver)).into_axum_router();
    runtime.spawn(async move { axum::serve(listener, router).await });
    (address, runtime)
}

/// The receiver over OTLP/HTTP (protobuf bodies POSTed to `/v1/traces`) on a free
/// loopback port, as [`start_receiver`].
fn start_http_receiver(receiver: Receiver) -> (String, tokio::runtime::Runtime) {
    use prost::Message as _;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let export = move |body: axum::body::Bytes| async move {
        match ExportTraceServiceRequest::decode(body) {
            Ok(request) => {
                receiver.record(request);
                let answer = ExportTraceServiceResponse::default().encode_to_vec();
                (
                    axum::http::StatusCode::OK,
                    [("content-type", "application/x-protobuf")],
                    answer,
                )
            }
            Err(e) => (
                axum::http::StatusCode::BAD_REQUEST,
                [("content-type", "text/plain")],
                e.to_string().into_bytes(),
            ),
        }
    };
    let router = axum::Router::new().route("/v1/traces", axum::routing::post(export));
    runtime.spawn(async move { axum::serve(listener, router).await });
    (address, runtime)
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text<'a>(span: &'a Span, key: &str) -> &'a str {
    match attribute(&span.attributes, key) {
        Some(Value::StringValue(s)) => s,
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

fn rules(span: &Span) -> Vec<&str> {
    match attribute(&span.attributes, "sluicegate.rules") {
        Some(Value::ArrayValue(array)) => array
            .values
            .iter()
            .map(|v| match &v.value {
                Some(Value::StringValue(s)) => s.as_str(),
                other => panic!("a rule that is no string: {other:?}"),
            })
            .collect(),
        other => panic!("{}: sluicegate.rules is {other:?}", span.name),
    }
}

fn store_time_us(span: &Span) -> f64 {
    match attribute(&span.attributes, "sluicegate.store_time_us") {
        Some(Value::DoubleValue(us)) => *us,
        other => panic!("{}: sluicegate.store_time_us is {other:?}", span.name),
    }
}

fn grpc_request(user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "example".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_owned(),
                value: user.to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// One ShouldRateLimit call carrying the gRPC caller's trace context in its metadata.
fn should_rate_limit_in_trace(address: &str, user: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{address}"))
            .await
            .expect("connect over gRPC");
        let mut request = tonic::Request::new(grpc_request(user));
        let metadata = request.metadata_mut();
        metadata.insert(
            "traceparent",
            format!("00-{GRPC_TRACE}-{GRPC_PARENT}-01").parse().unwrap(),
        );
        metadata.insert("tracestate", "vendor=grpc".parse().unwrap());
        client
            .should_rate_limit(request)
            .await
            .expect("ShouldRateLimit");
    });
}

fn check_body(user: &str) -> String {
    format!(
        r#"{{"domain":"example","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    )
}

/// Nine checks over every front end, then the server stopped (which sends the last
/// batch): one span each at the receiver, with what each check came to.
fn spans_of_checks(store_args: &[&str], least_store_us: f64) {
    let receiver = Receiver::default();
    let (collector, _receiving) = start_receiver(receiver.clone());
    let endpoint = format!("http://{collector}");
    let mut args = vec!["--otlp-endpoint", endpoint.as_str()];
    args.extend_from_slice(store_args);
    let server = Server::start(&args);

    // HTTP /v1/check in the caller's trace, five times: the example rules give a user
    // 5 per 10 s, so the sixth (no trace context) is over the limit.
    let traceparent = format!("00-{HTTP_TRACE}-{HTTP_PARENT}-01");
    for _ in 0..5 {
        let (status, body) = server.request_with_headers(
            "POST",
            "/v1/check",
            &check_body("alice"),
            &[("traceparent", &traceparent)],
        );
        assert!(
            status == 200 && body.contains(r#""allowed":true"#),
            "{body}"
        );
    }
    let (status, body) = server.request("POST", "/v1/check", &check_body("alice"));
    assert!(
        status == 200 && body.contains(r#""allowed":false"#),
        "{body}"
    );
    // envoy's JSON, and a domain no rule serves (an error span).
    let (status, body) = server.request(
        "POST",
        "/json",
        r#"{"domain":"example","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.request(
        "POST",
        "/v1/check",
        r#"{"domain":"nowhere","descriptors":[{"entries":[{"key":"user","value":"x"}]}]}"#,
    );
    assert_eq!(status, 400, "{body}");
    should_rate_limit_in_trace(&server.address, "carol");
    assert!(server.stop().success());

    // Stopping sent the last batch; the wait is a bound, not a pace.
    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.0.lock().unwrap().spans.len() < 9 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let Received {
        spans, services, ..
    } = std::mem::take(&mut *receiver.0.lock().unwrap());
    assert_eq!(spans.len(), 9, "one span per check: {spans:#?}");
    assert!(services.iter().all(|s| s == "sluicegate"), "{services:?}");

    let checks: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "POST /v1/check")
        .collect();
    assert_eq!(checks.len(), 7, "{spans:#?}");
    let in_trace: Vec<&&Span> = checks
        .iter()
        .filter(|s| hex(&s.trace_id) == HTTP_TRACE)
        .collect();
    assert_eq!(
        in_trace.len(),
        5,
        "the five checks that named a trace join it"
    );
    for span in &in_trace {
        assert_eq!(hex(&span.parent_span_id), HTTP_PARENT);
        assert_eq!(text(span, "sluicegate.domain"), "example");
        assert_eq!(rules(span), ["example.user"]);
        assert_eq!(text(span, "sluicegate.decision"), "allowed");
        assert_eq!(text(span, "sluicegate.decided_by"), "store");
        assert!(
            store_time_us(span) > least_store_us,
            "the store was asked: {span:?}"
        );
    }
    let over: Vec<&&Span> = checks
        .iter()
        .filter(|s| attribute(&s.attributes, "sluicegate.decision").is_some())
        .filter(|s| text(s, "sluicegate.decision") == "over_limit")
        .collect();
    assert_eq!(over.len(), 1, "{checks:#?}");
    assert!(
        over[0].parent_span_id.is_empty(),
        "no trace context: a root span"
    );
    assert_ne!(hex(&over[0].trace_id), HTTP_TRACE);

    let unknown: Vec<&&Span> = checks
        .iter()
        .filter(|s| attribute(&s.attributes, "sluicegate.decision").is_none())
        .collect();
    assert_eq!(unknown.len(), 1, "{checks:#?}");
    assert_eq!(text(unknown[0], "sluicegate.domain"), "nowhere");
    let status = unknown[0].status.as_ref().expect("an error status");
    assert!(status.message.contains("nowhere"), "{status:?}");

    let json = spans
        .iter()
        .find(|s| s.name == "POST /json")
        .expect("a /json span");
    assert_eq!(rules(json), ["example.user"]);
    assert_eq!(text(json, "sluicegate.decision"), "allowed");

    let grpc = spans
        .iter()
        .find(|s| s.name == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .expect("a gRPC span");
    assert_eq!(hex(&grpc.trace_id), GRPC_TRACE);
    assert_eq!(hex(&grpc.parent_span_id), GRPC_PARENT);
    assert_eq!(grpc.trace_state, "vendor=grpc");
    assert_eq!(rules(grpc), ["example.user"]);
    assert_eq!(text(grpc, "sluicegate.decision"), "allowed");
    assert_eq!(text(grpc, "sluicegate.decided_by"), "store");
}

#[test]
fn check_spans_reach_the_collector_on_memory() {
    spans_of_checks(&[], 0.0);
}

#[test]
fn check_spans_reach_the_collector_on_redis() {
    let redis = support::RedisServer::start(&[]);
    // A round trip to redis-server over loopback takes tens of µs at the least.
    spans_of_checks(&["--store", &redis.url()], 10.0);
}

/// An endpoint that is no URL stops the start, naming the flag and the value.
#[test]
fn an_endpoint_that_is_no_url_is_refused() {
    let error = Server::try_start(&["--otlp-endpoint", "not a url"])
        .err()
        .expect("the start fails");
    assert!(error.contains("--otlp-endpoint not a url: "), "{error}");
    // TLS to a collector is not done here: refused rather than failing every export.
    let error = Server::try_start(&["--otlp-endpoint", "https://localhost:4318"])
        .err()
        .expect("the start fails");
    assert!(error.contains("only http:// collectors"), "{error}");
}

/// The env twin, and spans sent while the service runs: the batch's schedule is the
/// SDK's `OTEL_BSP_SCHEDULE_DELAY` (100 ms here, 5 s by default), so the span arrives
/// with the binary still serving, not only when it stops.
#[test]
fn spans_are_sent_while_serving() {
    let receiver = Receiver::default();
    let (collector, _receiving) = start_receiver(receiver.clone());
    let server = Server::binary_with_env(
        &[],
        &[
            (
                "SLUICEGATE_OTLP_ENDPOINT".to_owned(),
                format!("http://{collector}"),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
        ],
    );
    let (status, body) = server.request("POST", "/v1/check", &check_body("dave"));
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.0.lock().unwrap().spans.is_empty() {
        assert!(Instant::now() < deadline, "no span within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let spans = std::mem::take(&mut receiver.0.lock().unwrap().spans);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0].name, "POST /v1/check");
    assert_eq!(rules(&spans[0]), ["example.user"]);
    assert!(server.stop().success());
}

/// A collector that is not there: every check is answered as without traces, the failed
/// export is logged (the operator's clue), and the service still stops cleanly, within
/// the exporter's bounded last flush.
#[test]
fn a_collector_that_is_down_costs_the_checks_nothing() {
    let endpoint = format!("http://127.0.0.1:{}", support::free_port());
    let server = Server::binary_with_env(
        &["--otlp-endpoint", &endpoint],
        &[("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned())],
    );
    for _ in 0..5 {
        let (status, body) = server.request("POST", "/v1/check", &check_body("erin"));
        assert!(
            status == 200 && body.contains(r#""allowed":true"#),
            "{body}"
        );
    }
    let (status, body) = server.request("POST", "/v1/check", &check_body("erin"));
    assert!(
        status == 200 && body.contains(r#""allowed":false"#),
        "{body}"
    );
    let logged = server.wait_for_log(|line| line.contains("BatchSpanProcessor.ExportError"));
    assert!(logged.contains("Connection refused"), "{logged}");
    let stopping = Instant::now();
    assert!(server.stop().success());
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "{:?}",
        stopping.elapsed()
    );
}

/// envoy's tracing environment on the real binary (`--compat envoy`): TRACING_ENABLED,
/// the default protocol (OTLP/HTTP, protobuf) to OTEL_EXPORTER_OTLP_ENDPOINT, and the
/// service's name, namespace and instance id on the spans' resource.
#[test]
fn envoys_tracing_environment_reaches_an_otlp_http_collector() {
    let receiver = Receiver::default();
    let (collector, _receiving) = start_http_receiver(receiver.clone());
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/sluicegate.yaml"
    );
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let endpoint = format!("http://{collector}");
    let server = Server::binary_with_env(
        &[
            "--compat",
            "envoy",
            "--store",
            "memory",
            "--config",
            config,
            "--grpc-listen",
            "127.0.0.1:0",
            "--debug-listen",
            "127.0.0.1:0",
        ],
        &env(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("TRACING_SERVICE_NAMESPACE", "gateway"),
            ("TRACING_SERVICE_INSTANCE_ID", "ratelimit-pod-1"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ]),
    );
    let (status, body) = server.request("POST", "/v1/check", &check_body("frank"));
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.0.lock().unwrap().spans.is_empty() {
        assert!(
            Instant::now() < deadline,
            "no span within 20 s: {:#?}",
            server.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server.stop().success());
    let received = std::mem::take(&mut *receiver.0.lock().unwrap());
    assert_eq!(received.spans[0].name, "POST /v1/check");
    assert_eq!(received.services, ["RateLimit"]);
    let resource = &received.resources[0];
    for (key, expected) in [
        ("service.namespace", "gateway"),
        ("service.instance.id", "ratelimit-pod-1"),
    ] {
        match attribute(resource, key) {
            Some(Value::StringValue(value)) => assert_eq!(value, expected, "{key}"),
            other => panic!("{key} is {other:?}"),
        }
    }
}

/// --otlp-sampling-ratio 0: a trace begun here is not sampled, while a check whose caller's
/// trace context says sampled is (the sampler follows the parent).
#[test]
fn the_sampling_ratio_applies_to_traces_begun_here() {
    let receiver = Receiver::default();
    let (collector, _receiving) = start_receiver(receiver.clone());
    let endpoint = format!("http://{collector}");
    let server = Server::start(&["--otlp-endpoint", &endpoint, "--otlp-sampling-ratio", "0"]);
    let traceparent = format!("00-{HTTP_TRACE}-{HTTP_PARENT}-01");
    for _ in 0..3 {
        let (status, body) = server.request("POST", "/v1/check", &check_body("gina"));
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = server.request_with_headers(
        "POST",
        "/v1/check",
        &check_body("gina"),
        &[("traceparent", &traceparent)],
    );
    assert_eq!(status, 200, "{body}");
    assert!(server.stop().success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.0.lock().unwrap().spans.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let spans = std::mem::take(&mut receiver.0.lock().unwrap().spans);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(hex(&spans[0].trace_id), HTTP_TRACE);
}
