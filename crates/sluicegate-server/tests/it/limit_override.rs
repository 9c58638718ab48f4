//! The descriptor `limit` override (numbers Envoy sends from dynamic metadata), over real
//! gRPC with Envoy's generated stubs, on the memory store and Redis, as envoyproxy/ratelimit
//! reads it (envoyproxy/ratelimit@f2fb157 src/config/config_impl.go:459-475,
//! test/config/config_test.go:256-333).

use sluicegate_test_support as support;

use crate::server;

use server::Server;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use tonic::transport::Channel;

/// `a`: 2 a day; nothing else is configured.
const CONFIG: &str = "domain: overrides
descriptors:
  - key: a
    rate_limit:
      unit: day
      requests_per_unit: 2
";

fn request(key: &str, limit: Option<(u32, i32)>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "overrides".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: "v".into(),
            }],
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit,
            }),
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

async fn status(
    client: &mut RateLimitServiceClient<Channel>,
    key: &str,
    limit: Option<(u32, i32)>,
) -> DescriptorStatus {
    let response = client
        .should_rate_limit(request(key, limit))
        .await
        .unwrap_or_else(|e| panic!("{key} {limit:?}: {e}"))
        .into_inner();
    response.statuses[0].clone()
}

const DAY: i32 = RateLimitUnit::Day as i32;

async fn overrides(args: &[&str]) {
    let path = std::env::temp_dir().join(format!(
        "sluicegate-override-{}-{}.yaml",
        args.len(),
        std::process::id()
    ));
    std::fs::write(&path, CONFIG).unwrap();
    let mut all = vec!["--config", path.to_str().unwrap()];
    all.extend(args);
    let server = Server::start(&all);
    let mut c = RateLimitServiceClient::connect(format!("http://{}", server.address))
        .await
        .unwrap();

    // The configured rule's state, the override's numbers: 3 a day instead of 2. An
    // override's limit has no name in the answer, as envoy builds it with ""
    // (envoyproxy/ratelimit@f2fb157 src/config/config_impl.go:463-473).
    for remaining in [2, 1, 0] {
        let s = status(&mut c, "a", Some((3, DAY))).await;
        assert_eq!((s.code, s.limit_remaining), (Code::Ok.into(), remaining));
        let limit = s.current_limit.unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("", 3, DAY)
        );
    }
    assert_eq!(
        status(&mut c, "a", Some((3, DAY))).await.code,
        i32::from(Code::OverLimit)
    );

    // No rule needed: 1 a day, unnamed in the answer too.
    let first = status(&mut c, "unconfigured", Some((1, DAY))).await;
    assert_eq!(first.code, i32::from(Code::Ok));
    let limit = first.current_limit.unwrap();
    assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("", 1));
    assert_eq!(
        status(&mut c, "unconfigured", Some((1, DAY))).await.code,
        i32::from(Code::OverLimit)
    );
    // Without an override the descriptor matches nothing: no limit.
    assert!(
        status(&mut c, "unconfigured", None)
            .await
            .current_limit
            .is_none()
    );

    // 0 per unit refuses, as a configured one does.
    assert_eq!(
        status(&mut c, "zero", Some((0, DAY))).await.code,
        i32::from(Code::OverLimit)
    );

    // A unit that is none is the caller's error, said so.
    let err = c
        .should_rate_limit(request("a", Some((5, 0))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("descriptors[0].limit.unit"),
        "{}",
        err.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_on_the_memory_store_in_both_modes() {
    overrides(&[]).await;
    overrides(&["--compat", "envoy"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_on_redis_in_both_modes() {
    let url = support::standalone().url();
    let prefix = format!("override-{}:", std::process::id());
    overrides(&["--store", &url, "--prefix", &prefix]).await;
    let prefix = format!("override-envoy-{}:", std::process::id());
    overrides(&["--store", &url, "--prefix", &prefix, "--compat", "envoy"]).await;
}
