//! `sluicegate load`: a load generator for a running service, over HTTP (`POST /v1/check`)
//! or gRPC (Envoy's `ShouldRateLimit`), from a process of its own.
//!
//! Each task sends one request at a time. Over HTTP every task has a connection of its
//! own; over gRPC the tasks share a few HTTP/2 connections, as a few Envoys would. With
//! `requests_per_connection`, every task has a connection of its own on both protocols
//! and replaces it by a new one after that many requests: connection churn, for soaks.

use std::future::Future;
use std::num::NonZeroU64;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use axum::body::Bytes;
use axum::http::header::{CONTENT_TYPE, HOST};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use super::bench::{BenchReport, Caller, Drive, FailureKind, drive};

/// HTTP/2 connections the gRPC load shares among its tasks (at most one per task) when
/// connections are not churned.
const GRPC_CONNECTIONS: usize = 8;

/// The protocols a service speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Protocol {
    /// `POST /v1/check` over HTTP/1.1, one connection per task, kept alive.
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
    /// Requests a task sends on one connection before it opens a new one; `None` for as
    /// many as the run sends.
    pub(crate) requests_per_connection: Option<NonZeroU64>,
}

/// Drives `target` as `load` says.
pub(crate) async fn run(target: Target, load: Drive) -> Result<BenchReport> {
    let values: Vec<String> = (0..load.keys).map(|i| format!("load-{i}")).collect();
    let churn = target.requests_per_connection;
    let driven = match target.protocol {
        Protocol::Http => {
            let bodies: Arc<Vec<Bytes>> = Arc::new(
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
            drive(&load, |_| HttpCaller {
                address: target.address.clone(),
                bodies: Arc::clone(&bodies),
                connection: Renewing::new(None, churn),
            })
            .await
        }
        Protocol::Grpc => {
            let endpoint = Endpoint::from_shared(format!("http://{}", target.address))
                .map_err(|e| anyhow!("--target {}: {e}", target.address))?;
            // Connected before the run, so that an unreachable service is one clear
            // error: shared by the tasks, or one per task when each renews its own.
            let connections = match churn {
                Some(_) => load.concurrency,
                None => load.concurrency.clamp(1, GRPC_CONNECTIONS),
            };
            let mut clients = Vec::with_capacity(connections);
            for _ in 0..connections {
                let channel = endpoint
                    .connect()
                    .await
                    // Only the error's own words: its chain of causes repeats itself.
                    .map_err(|e| anyhow!("cannot connect to {}: {e}", target.address))?;
                clients.push(RateLimitServiceClient::new(channel));
            }
            let requests: Arc<Vec<RateLimitRequest>> = Arc::new(
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
            drive(&load, |task| GrpcCaller {
                endpoint: endpoint.clone(),
                requests: Arc::clone(&requests),
                connection: Renewing::new(Some(clients[task % clients.len()].clone()), churn),
            })
            .await
        }
    };
    // What was asked, in the report's header: protocol, domain and descriptor.
    let workload = format!(
        "{} {} {}=load-0…load-{}",
        format!("{:?}", target.protocol).to_lowercase(),
        target.domain,
        target.key,
        load.keys - 1
    );
    Ok(driven.report(target.address, workload, &load, None))
}

/// A task's connection, replaced by a new one after `limit` requests (never without a
/// limit), or after it broke.
struct Renewing<C> {
    current: Option<C>,
    /// Requests sent on `current`.
    used: u64,
    limit: Option<NonZeroU64>,
}

impl<C> Renewing<C> {
    fn new(current: Option<C>, limit: Option<NonZeroU64>) -> Self {
        Renewing {
            current,
            used: 0,
            limit,
        }
    }

    /// The connection for one more request: the current one while it has requests left,
    /// else a new one from `open`.
    async fn next<F, O>(&mut self, open: F) -> Result<&mut C, FailureKind>
    where
        F: FnOnce() -> O,
        O: Future<Output = Result<C, FailureKind>>,
    {
        if self.limit.is_some_and(|limit| self.used >= limit.get()) {
            // Closed before the next one opens: a task holds one connection at a time.
            self.current = None;
        }
        let connection = match self.current.take() {
            Some(connection) => connection,
            None => {
                self.used = 0;
                open().await?
            }
        };
        self.used += 1;
        Ok(self.current.insert(connection))
    }

    /// Forgets the current connection (it broke): the next request opens a new one.
    fn discard(&mut self) {
        self.current = None;
    }
}

/// One task's `POST /v1/check`s, on an HTTP/1.1 connection of its own.
struct HttpCaller {
    address: String,
    /// The request body of each descriptor value.
    bodies: Arc<Vec<Bytes>>,
    connection: Renewing<SendRequest<Full<Bytes>>>,
}

/// A new HTTP/1.1 connection to `address`, driven by a task of its own until its sender
/// is dropped, which closes it.
async fn connect_http(address: &str) -> Result<SendRequest<Full<Bytes>>, FailureKind> {
    let failed = |_| FailureKind::Borrowed("http_connection");
    let stream = TcpStream::connect(address).await.map_err(failed)?;
    // Each request is a small write waiting for its answer: not a case for Nagle.
    stream.set_nodelay(true).map_err(failed)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| FailureKind::Borrowed("http_connection"))?;
    tokio::spawn(connection);
    Ok(sender)
}

impl Caller for HttpCaller {
    async fn call(&mut self, key: usize) -> Result<bool, FailureKind> {
        let request = axum::http::Request::post("/v1/check")
            .header(HOST, &self.address)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(self.bodies[key].clone()))
            .map_err(|_| FailureKind::Borrowed("http_request"))?;
        let address = &self.address;
        let sender = self.connection.next(|| connect_http(address)).await?;
        let sent = match sender.ready().await {
            Ok(()) => sender.send_request(request).await,
            Err(e) => Err(e),
        };
        let response = sent.map_err(|_| {
            self.connection.discard();
            FailureKind::Borrowed("http_connection")
        })?;
        let status = response.status();
        // Read to its end whatever the status: a connection is reused only then.
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|_| {
                self.connection.discard();
                FailureKind::Borrowed("http_body")
            })?
            .to_bytes();
        if !status.is_success() {
            return Err(FailureKind::Owned(format!("http_{}", status.as_u16())));
        }
        Ok(body.starts_with(br#"{"allowed":true"#))
    }
}

/// One task's `ShouldRateLimit`s, on a shared HTTP/2 connection or, when it renews
/// them, on connections of its own.
struct GrpcCaller {
    endpoint: Endpoint,
    /// The request of each descriptor value.
    requests: Arc<Vec<RateLimitRequest>>,
    connection: Renewing<RateLimitServiceClient<Channel>>,
}

impl Caller for GrpcCaller {
    async fn call(&mut self, key: usize) -> Result<bool, FailureKind> {
        let endpoint = &self.endpoint;
        let client = self
            .connection
            .next(|| async {
                let channel = endpoint
                    .connect()
                    .await
                    .map_err(|_| FailureKind::Borrowed("grpc_connect"))?;
                Ok(RateLimitServiceClient::new(channel))
            })
            .await?;
        let response = client
            .should_rate_limit(self.requests[key].clone())
            .await
            .map_err(|status| FailureKind::Owned(format!("grpc_{:?}", status.code())))?;
        Ok(response.into_inner().overall_code == i32::from(Code::Ok))
    }
}
