//! `sluicegate load`: a load generator for a running service, over HTTP (`POST /v1/check`)
//! or gRPC (Envoy's `ShouldRateLimit`), from a process of its own.

use anyhow::{Result, anyhow};
use axum::body::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::bench::{BenchReport, Drive, FailureKind, drive};

/// HTTP/2 connections the gRPC load opens (at most one per task).
const GRPC_CONNECTIONS: usize = 8;

/// The protocols a service speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Protocol {
    /// `POST /v1/check` over HTTP/1.1, connections kept alive.
    Http,
    /// `ShouldRateLimit` over a few HTTP/2 connections.
    Grpc,
}

/// What to ask for: descriptors `key=<value i>` of `domain`.
pub(crate) struct Target {
    pub(crate) address: String,
    pub(crate) protocol: Protocol,
    pub(crate) domain: String,
    pub(crate) key: String,
}

/// Drives `target` as `load` says.
pub(crate) async fn run(target: Target, load: Drive) -> Result<BenchReport> {
    let values: Vec<String> = (0..load.keys).map(|i| format!("load-{i}")).collect();
    let driven = match target.protocol {
        Protocol::Http => {
            let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let url = format!("http://{}/v1/check", target.address);
            let bodies: std::sync::Arc<Vec<Bytes>> = std::sync::Arc::new(
                values
                    .iter()
                    .map(|value| {
                        let body = serde_json::json!({
                            "domain": target.domain,
                            "descriptors": [{"entries": [{"key": target.key, "value": value}]}],
                        });
                        Bytes::from(body.to_string())
                    })
                    .collect(),
            );
            let call = move |i: usize| {
                let (client, url, bodies) = (client.clone(), url.clone(), bodies.clone());
                async move {
                    let request = axum::http::Request::post(url)
                        .header("content-type", "application/json")
                        .body(Full::new(bodies[i].clone()))
                        .map_err(|_| FailureKind::Borrowed("http_request"))?;
                    let response = client
                        .request(request)
                        .await
                        .map_err(|_| FailureKind::Borrowed("http_connection"))?;
                    let status = response.status();
                    if !status.is_success() {
                        return Err(FailureKind::Owned(format!("http_{}", status.as_u16())));
                    }
                    let body = response
                        .into_body()
                        .collect()
                        .await
                        .map_err(|_| FailureKind::Borrowed("http_body"))?
                        .to_bytes();
                    Ok(body.starts_with(br#"{"allowed":true"#))
                }
            };
            drive(&load, call).await
        }
        Protocol::Grpc => {
            // Several HTTP/2 connections, as several Envoys would open: one connection
            // carries every stream on one TCP socket and one server task.
            let mut clients = Vec::new();
            for _ in 0..load.concurrency.clamp(1, GRPC_CONNECTIONS) {
                let client = RateLimitServiceClient::connect(format!("http://{}", target.address))
                    .await
                    // Only the error's own words: its chain of causes repeats itself.
                    .map_err(|e| anyhow!("cannot connect to {}: {e}", target.address))?;
                clients.push(client);
            }
            let clients = std::sync::Arc::new(clients);
            let requests: std::sync::Arc<Vec<RateLimitRequest>> = std::sync::Arc::new(
                values
                    .iter()
                    .map(|value| RateLimitRequest {
                        domain: target.domain.clone(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: target.key.clone(),
                                value: value.clone(),
                            }],
                            ..RateLimitDescriptor::default()
                        }],
                        hits_addend: 1,
                    })
                    .collect(),
            );
            let call = move |i: usize| {
                let mut client = clients[i % clients.len()].clone();
                let requests = requests.clone();
                async move {
                    let response = client
                        .should_rate_limit(requests[i].clone())
                        .await
                        .map_err(|status| {
                            FailureKind::Owned(format!("grpc_{:?}", status.code()))
                        })?;
                    Ok(response.into_inner().overall_code == i32::from(Code::Ok))
                }
            };
            drive(&load, call).await
        }
    };
    let workload = format!("{:?}", target.protocol).to_lowercase();
    Ok(driven.report(target.address, workload, &load, None))
}
