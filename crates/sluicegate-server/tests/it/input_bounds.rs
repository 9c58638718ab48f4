//! Input bounds no tighter than Envoy's, over real sockets: a descriptor value of up to
//! 64 KiB (Envoy forwards headers of up to 60 KiB; a JWT claim is a few KiB) is decided,
//! one byte more is refused naming the field, and a whole gRPC request is bounded by the
//! 4 MiB message size envoyproxy/ratelimit's grpc-go server also keeps.

use crate::server;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use server::Server;

/// The longest key or value accepted by default.
const MAX_ENTRY_BYTES: usize = 64 * 1024;

/// Envoy's JSON check of domain `example` with one `user` descriptor of this value.
fn json_check(value: &str) -> String {
    format!(
        r#"{{"domain":"example","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}]}}"#
    )
}

#[test]
fn a_value_of_64_kib_is_decided_and_one_byte_more_names_the_field() {
    let server = Server::start(&[]);
    // A forwarded JWT: 8 KiB.
    for len in [8 * 1024, MAX_ENTRY_BYTES] {
        let (status, body) = server.request("POST", "/json", &json_check(&"j".repeat(len)));
        assert_eq!(status, 200, "{len}: {body}");
        assert!(body.contains(r#""overallCode":"OK""#), "{len}: {body}");
    }
    let (status, body) = server.request(
        "POST",
        "/json",
        &json_check(&"j".repeat(MAX_ENTRY_BYTES + 1)),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("descriptors[0].entries[0].value: 65537 bytes, at most 65536 allowed"),
        "{body}"
    );
    // The flag (and its environment twin) moves the bound.
    assert!(server.stop().success());
    let server = Server::start(&["--max-entry-bytes", "100"]);
    let (status, body) = server.request("POST", "/json", &json_check(&"j".repeat(101)));
    assert_eq!(status, 400, "{body}");
    assert!(server.stop().success());
}

/// `count` descriptors of domain `example`, each one `user` entry of `len` bytes.
fn grpc_request(count: usize, len: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "example".into(),
        descriptors: (0..count)
            .map(|i| RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: format!("{i:04}{}", "v".repeat(len - 4)),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_request_of_values_up_to_4_mib_is_decided_and_a_larger_one_refused() {
    let server = Server::start(&[]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .expect("connect over gRPC");
    // 60 values of 64 KiB: 3.75 MiB, within the message size.
    let answer = client
        .should_rate_limit(grpc_request(60, MAX_ENTRY_BYTES))
        .await
        .expect("decided")
        .into_inner();
    assert_eq!(answer.overall_code, i32::from(Code::Ok));
    assert_eq!(answer.statuses.len(), 60);
    // 64 of them, and their framing: over 4 MiB, refused by the transport, decided never.
    let refused = client
        .should_rate_limit(grpc_request(64, MAX_ENTRY_BYTES))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    assert!(
        refused.message().contains("4194304"),
        "{}",
        refused.message()
    );
    assert!(server.stop().success());
}
