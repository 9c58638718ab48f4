//! Envoy's rate-limit service over real gRPC: the tonic client, and Python's grpcio to
//! prove the wire is the standard one.

use sluicegate_test_support as support;

use crate::python;
use crate::server;

use python::run_python;
use server::Server;

use std::process::Command;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt32Value;

fn request(domain: &str, pairs: &[(&str, &str)]) -> RateLimitRequest {
    server::rls_request(domain, pairs, 0)
}

/// The example rules give each user 5 per 10 s: five OK, then OVER_LIMIT with its status.
async fn five_then_over_limit(server: &Server) {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .expect("connect over gRPC");
    for remaining in (0..5).rev() {
        let response = client
            .should_rate_limit(request("example", &[("user", "alice")]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.overall_code, i32::from(Code::Ok));
        let status = &response.statuses[0];
        assert_eq!(status.limit_remaining, remaining);
        let limit = status.current_limit.as_ref().unwrap();
        // The example rules name no limit: envoy reports no name then.
        assert_eq!((limit.requests_per_unit, limit.name.as_str()), (5, ""));
    }
    let over = client
        .should_rate_limit(request("example", &[("user", "alice")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(over.overall_code, i32::from(Code::OverLimit));
    assert_eq!(over.statuses[0].code, i32::from(Code::OverLimit));
    let headers: Vec<(String, String)> = over
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert!(
        headers.contains(&(
            "RateLimit-Policy".into(),
            "\"example.user\";q=5;w=10".into()
        )),
        "{headers:?}"
    );
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "RateLimit" && v.starts_with("\"example.user\";r=0;t="))
    );
    assert!(headers.iter().any(|(k, _)| k == "Retry-After"));
    // Nothing matched: OK with no limit. An unknown domain too, as envoyproxy/ratelimit
    // answers it: every descriptor finds no limit.
    let free = client
        .should_rate_limit(request("example", &[("nobody", "x")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(free.overall_code, i32::from(Code::Ok));
    assert!(free.statuses[0].current_limit.is_none());
    let mut unknown = request("nope", &[("user", "x")]);
    unknown
        .descriptors
        .push(request("nope", &[("ip", "y")]).descriptors.remove(0));
    let unknown = client
        .should_rate_limit(unknown)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unknown.overall_code, i32::from(Code::Ok));
    assert_eq!(unknown.statuses.len(), 2);
    for status in &unknown.statuses {
        assert_eq!(status.code, i32::from(Code::Ok));
        assert!(status.current_limit.is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_on_the_memory_store() {
    five_then_over_limit(&Server::start(&["--response-headers", "ietf"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_on_redis() {
    let redis = support::standalone();
    let prefix = format!("grpc-{}:", std::process::id());
    five_then_over_limit(&Server::start(&[
        "--store",
        &redis.url(),
        "--prefix",
        &prefix,
        "--response-headers",
        "ietf",
    ]))
    .await;
}

/// Python's grpcio, with the stubs generated from Envoy's protos, gets the same answers.
#[test]
fn rls_from_python_grpcio() {
    let server = Server::start(&["--response-headers", "ietf"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/python/rls_check.py");
    let call = || run_python("rls_check.py", &[&server.address, "example", "user", "bob"]);
    let garbage = Command::new("python3")
        .args([script, &server.address, "--garbage"])
        .output()
        .expect("python3");
    // The client's fault, said so: not INTERNAL, which would blame the server.
    let status = String::from_utf8(garbage.stdout).unwrap();
    assert!(
        status.starts_with("INVALID_ARGUMENT\nnot a RateLimitRequest: "),
        "garbage got {status:?}: {}",
        String::from_utf8_lossy(&garbage.stderr)
    );
    let answers: Vec<String> = (0..6).map(|_| call()).collect();
    assert!(
        answers[..5].iter().all(|a| a.starts_with("1\n")),
        "{answers:?}"
    );
    assert!(answers[5].starts_with("2\n"), "{answers:?}");
    assert!(
        answers[5].contains("RateLimit-Policy: \"example.user\";q=5;w=10"),
        "{}",
        answers[5]
    );
    // An unknown domain is OK with no limit, and a value of 8 KiB (a forwarded JWT) is
    // decided, from this ecosystem too.
    for (domain, value) in [
        ("nope", "bob".to_owned()),
        ("example", "j".repeat(8 * 1024)),
    ] {
        let out = Command::new("python3")
            .args([script, &server.address, domain, "user", &value])
            .output()
            .expect("python3");
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            stdout.starts_with("1\n"),
            "{domain}: {stdout:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Server reflection: grpcio-reflection's client (what grpcurl does) lists the rate-limit
/// service, resolves its messages through reflection alone and calls it.
#[test]
fn reflection_lists_and_describes_the_rls_service() {
    let server = Server::start(&[]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/python/reflection_call.py"
    );
    let out = Command::new("python3")
        .args([script, &server.address, "example", "user", "carol"])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "reflection client failed (scripts/test installs grpcio-reflection): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = printed.lines().collect();
    assert!(
        lines.contains(&"envoy.service.ratelimit.v3.RateLimitService"),
        "{printed}"
    );
    assert!(lines.contains(&"method ShouldRateLimit"), "{printed}");
    assert_eq!(lines.last(), Some(&"overall_code 1"), "{printed}");
}

/// Bytes that are no RateLimitRequest, and an empty one, are the client's error: each
/// INVALID_ARGUMENT saying what was wrong; another method of the service is UNIMPLEMENTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_and_empty_requests_are_invalid_arguments() {
    let server = Server::start(&[]);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.address))
        .unwrap()
        .connect()
        .await
        .expect("connect over gRPC");
    let grpc = tonic::client::Grpc::new(channel.clone());
    // Field 1 as a varint, where a RateLimitRequest has its domain, a string: the bytes
    // are well-framed gRPC but do not decode.
    let call = |path: &'static str| {
        let mut grpc = grpc.clone();
        async move {
            grpc.ready().await.unwrap();
            grpc.unary::<UInt32Value, RateLimitResponse, _>(
                tonic::Request::new(UInt32Value { value: 7 }),
                tonic::codegen::http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .unwrap_err()
        }
    };
    let garbage = call("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit").await;
    assert_eq!(garbage.code(), tonic::Code::InvalidArgument, "{garbage:?}");
    assert!(
        garbage.message().starts_with("not a RateLimitRequest: ")
            && garbage.message().contains("wire type"),
        "{}",
        garbage.message()
    );
    let other = call("/envoy.service.ratelimit.v3.RateLimitService/Other").await;
    assert_eq!(other.code(), tonic::Code::Unimplemented, "{other:?}");

    // Zero bytes decode as a valid empty message: no domain (the first thing said), no
    // descriptors.
    let mut client = RateLimitServiceClient::new(channel);
    let empty = client
        .should_rate_limit(RateLimitRequest::default())
        .await
        .unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument, "{empty:?}");
    assert!(
        empty.message().contains("domain: must not be empty"),
        "{}",
        empty.message()
    );
}

/// One `ShouldRateLimit` whose body is `body` as it is, gRPC framing and all, over an
/// HTTP/2 connection of its own (`extra` headers added): the grpc-status and grpc-message
/// answered.
async fn raw_call(server: &Server, extra: &[(&str, &str)], body: Vec<u8>) -> (String, String) {
    let tcp = tokio::net::TcpStream::connect(&server.address)
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let mut request = hyper::Request::post(format!(
        "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        server.address
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let request = request
        .body(http_body_util::Full::new(axum::body::Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let collected = http_body_util::BodyExt::collect(body).await.unwrap();
    // A trailers-only answer carries them in its headers.
    let trailers = collected.trailers().cloned().unwrap_or(parts.headers);
    // grpc-message is percent-encoded.
    let field = |name: &str| {
        trailers
            .get(name)
            .map(|v| {
                percent_encoding::percent_decode(v.as_bytes())
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .unwrap_or_default()
    };
    (field("grpc-status"), field("grpc-message"))
}

/// A message: its gRPC prefix (compressed flag, length) and bytes.
fn framed(flag: u8, length: u32, bytes: &[u8]) -> Vec<u8> {
    let mut body = vec![flag];
    body.extend_from_slice(&length.to_be_bytes());
    body.extend_from_slice(bytes);
    body
}

/// Malformed gRPC framing over a raw HTTP/2 connection is answered as the client's fault,
/// never as the server's: a length prefix longer than the body, a body ending inside the
/// prefix, an empty body and a compressed flag other than 0 or 1 are INVALID_ARGUMENT
/// (3), saying what was wrong; a length over the largest message taken (4 MiB) is
/// OUT_OF_RANGE (11). The compressed flag set without a grpc-encoding is INTERNAL (13), as
/// the gRPC compression document requires; with an encoding not supported, UNIMPLEMENTED
/// (12). A well-framed request on the same path is answered OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grpc_frames_are_the_clients_error() {
    let server = Server::start(&[]);
    let good = prost::Message::encode_to_vec(&request("example", &[("user", "frames")]));
    let length = u32::try_from(good.len()).unwrap();
    assert_eq!(
        raw_call(&server, &[], framed(0, length, &good)).await.0,
        "0"
    );
    for (body, status, says) in [
        (
            framed(0, length + 10, &good),
            "3",
            "10 bytes short of the message",
        ),
        (framed(0, 1000, &[]), "3", "1000 bytes short of the message"),
        (vec![0, 0, 0], "3", "3 bytes into a 5-byte message prefix"),
        (Vec::new(), "3", "the body holds no message"),
        (framed(7, length, &good), "3", "compressed flag 7"),
        (framed(0, 5 << 20, &good), "11", "message length too large"),
        (
            framed(1, length, &good),
            "13",
            "compressed-flag but no grpc-encoding",
        ),
    ] {
        let (code, message) = raw_call(&server, &[], body).await;
        assert_eq!(code, status, "{says}: {message}");
        assert!(message.contains(says), "{says}: {message}");
    }
    let (code, message) = raw_call(
        &server,
        &[("grpc-encoding", "gzip")],
        framed(1, length, &good),
    )
    .await;
    assert_eq!(code, "12", "{message}");
}

/// A separate gRPC port serves the same service; envoy's headers under the X-RateLimit-*
/// names when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_separate_grpc_port_and_legacy_headers() {
    let server = Server::start(&[
        "--grpc-listen",
        "127.0.0.1:0",
        "--response-headers",
        "envoy",
        "--limit-header",
        "X-RateLimit-Limit",
        "--remaining-header",
        "X-RateLimit-Remaining",
        "--reset-header",
        "X-RateLimit-Reset",
    ]);
    let grpc = server
        .grpc_address
        .clone()
        .expect("the gRPC address is logged");
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let response = client
        .should_rate_limit(request("example", &[("user", "carol")]))
        .await
        .unwrap()
        .into_inner();
    let headers: Vec<(String, String)> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert!(
        headers.contains(&("X-RateLimit-Limit".into(), "5".into())),
        "{headers:?}"
    );
    assert!(
        headers.contains(&("X-RateLimit-Remaining".into(), "4".into())),
        "{headers:?}"
    );
}

/// `sluicegate load` drives a running service from a process of its own, both protocols.
#[test]
fn the_load_generator_drives_both_protocols() {
    let server = Server::start(&[]);
    for protocol in ["http", "grpc"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args(["load", "--target", &server.address, "--protocol", protocol])
            .args([
                "--key",
                "user",
                "--values",
                "50",
                "--concurrency",
                "4",
                "--duration",
                "500ms",
                "--json",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            report["errors"],
            serde_json::json!({}),
            "{protocol}: {report}"
        );
        assert!(
            report["decisions"].as_u64().unwrap() > 50,
            "{protocol}: {report}"
        );
        // 5 per 10 s for each of 50 users: 250 allowed at most, the rest refused.
        assert!(
            report["allowed"].as_u64().unwrap() <= 250,
            "{protocol}: {report}"
        );
    }
}
