//! The client's waits on tokio's paused clock, against a management server in memory:
//! each connection a duplex pipe, so that no real I/O lets the clock run ahead.

use std::sync::Mutex;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use futures_util::{Stream, StreamExt as _};
use prost::Message as _;
use sluicegate::{AnyStore, Limiter};
use tokio::time::Instant;
use tonic::codegen::tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::config::{Config, DEFAULT_ALGORITHM};
use crate::service::ServiceOptions;

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

/// A management server that pushes `v1` on the first stream, ends that stream once it is
/// ACKed, and ends every later stream at its first request.
#[derive(Clone)]
struct Flaky {
    /// Every request, with when it came and on which stream (from 1).
    seen: Arc<Mutex<Vec<(Instant, usize, DiscoveryRequest)>>>,
    /// How many requests `seen` holds, to wait on.
    count: Arc<watch::Sender<usize>>,
    streams: Arc<Mutex<usize>>,
}

impl Flaky {
    fn new() -> Self {
        Flaky {
            seen: Arc::default(),
            count: Arc::new(watch::Sender::new(0)),
            streams: Arc::default(),
        }
    }

    /// Waits (the paused clock advancing meanwhile) until `n` requests came.
    async fn until_seen(&self, n: usize) {
        let mut count = self.count.subscribe();
        count.wait_for(|count| *count >= n).await.unwrap();
    }
}

fn v1() -> Any {
    let config = RateLimitConfig {
        name: "gateway".into(),
        domain: "gateway".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: 5,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    };
    Any {
        type_url: resource::type_url(),
        value: config.encode_to_vec(),
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Flaky {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let stream = {
            let mut streams = self.streams.lock().unwrap();
            *streams += 1;
            *streams
        };
        let (responses, outbound) = mpsc::unbounded_channel();
        let seen = Arc::clone(&self.seen);
        let count = Arc::clone(&self.count);
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            while let Ok(Some(request)) = inbound.message().await {
                let acked = !request.response_nonce.is_empty();
                seen.lock().unwrap().push((Instant::now(), stream, request));
                count.send_modify(|count| *count += 1);
                let answer = if stream == 1 && !acked {
                    Ok(DiscoveryResponse {
                        version_info: "v1".into(),
                        resources: vec![v1()],
                        type_url: resource::type_url(),
                        nonce: "n1".into(),
                        ..DiscoveryResponse::default()
                    })
                } else {
                    Err(Status::unavailable("going away"))
                };
                let _ = responses.send(answer);
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            outbound,
        ))))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// Reaches `server` through a fresh in-memory pipe, after `failures` refused attempts;
/// every attempt's time goes into `attempts`.
fn dial(server: Flaky, failures: usize, attempts: Arc<Mutex<Vec<Instant>>>) -> Dial {
    Box::new(move || {
        let server = server.clone();
        let attempts = Arc::clone(&attempts);
        Box::pin(async move {
            let attempt = {
                let mut attempts = attempts.lock().unwrap();
                attempts.push(Instant::now());
                attempts.len()
            };
            anyhow::ensure!(attempt > failures, "connection refused");
            let (near, far) = tokio::io::duplex(64 * 1024);
            let incoming = futures_util::stream::iter([Ok::<_, std::io::Error>(far)])
                .chain(futures_util::stream::pending());
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(AggregatedDiscoveryServiceServer::new(server))
                    .serve_with_incoming(incoming),
            );
            let near = Arc::new(Mutex::new(Some(near)));
            let connector = tower::service_fn(move |_| {
                let near = near.lock().unwrap().take();
                async move {
                    near.map(hyper_util::rt::TokioIo::new)
                        .ok_or_else(|| std::io::Error::other("one connection per pipe"))
                }
            });
            Ok(Endpoint::from_static("http://in-memory")
                .connect_with_connector(connector)
                .await?)
        })
    })
}

fn options(backoff: BackoffOptions) -> XdsOptions {
    XdsOptions {
        server: "in-memory:1".into(),
        node_id: "node".into(),
        node_metadata: Vec::new(),
        headers: Vec::new(),
        tls: None,
        retry_interval: Duration::from_secs(3),
        backoff,
        max_message_bytes: None,
        start_without_config: true,
    }
}

fn service() -> Arc<Service> {
    let limiter = Arc::new(Limiter::new(AnyStore::Memory(Default::default())));
    Arc::new(Service::new(
        Config::default(),
        limiter,
        ServiceOptions::default(),
    ))
}

/// A draw in the middle: the retry interval unspread.
fn middle() -> Random {
    Box::new(|| 0.5)
}

#[tokio::test(start_paused = true)]
async fn a_broken_stream_is_followed_by_the_backoff_and_the_last_acked_version() {
    let server = Flaky::new();
    let attempts = Arc::default();
    let backoff = BackoffOptions {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(6),
        factor: 2.0,
        jitter: false,
    };
    let service = service();
    let (client, mut loaded) = Client::new(
        options(backoff),
        LoadOptions::new(DEFAULT_ALGORITHM),
        Arc::clone(&service),
        dial(server.clone(), 0, Arc::clone(&attempts)),
        middle,
    );
    let start = Instant::now();
    tokio::spawn(client.run());
    loaded.wait_for(|loaded| *loaded).await.unwrap();
    assert_eq!(service.live().source_version.as_deref(), Some("v1"));
    // The first request, the ACK, then one request on each of five more streams.
    server.until_seen(7).await;
    let seen = server.seen.lock().unwrap();
    let requests: Vec<(u64, usize, &str, &str)> = seen
        .iter()
        .map(|(at, stream, r)| {
            let at = (*at - start).as_millis() as u64;
            (
                at,
                *stream,
                r.version_info.as_str(),
                r.response_nonce.as_str(),
            )
        })
        .collect();
    assert_eq!(
        requests,
        [
            (0, 1, "", ""),
            (0, 1, "v1", "n1"),
            // Waits of 1, 2, 4, then the 6 s max; every new stream says v1 is in force.
            (1_000, 2, "v1", ""),
            (3_000, 3, "v1", ""),
            (7_000, 4, "v1", ""),
            (13_000, 5, "v1", ""),
            (19_000, 6, "v1", ""),
        ]
    );
    // The configuration in force stayed through every break.
    assert_eq!(service.live().source_version.as_deref(), Some("v1"));
    assert_eq!(service.live().config.limits().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_server_that_cannot_be_reached_is_tried_every_retry_interval() {
    let server = Flaky::new();
    let attempts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (client, mut loaded) = Client::new(
        options(BackoffOptions::default()),
        LoadOptions::new(DEFAULT_ALGORITHM),
        service(),
        dial(server.clone(), 3, Arc::clone(&attempts)),
        middle,
    );
    let start = Instant::now();
    tokio::spawn(client.run());
    loaded.wait_for(|loaded| *loaded).await.unwrap();
    let attempts: Vec<u64> = attempts
        .lock()
        .unwrap()
        .iter()
        .map(|at| (*at - start).as_secs())
        .collect();
    // Three refused, 3 s apart (the draw in the middle spreads nothing), then through.
    assert_eq!(attempts, [0, 3, 6, 9]);
}
