//! The configuration over xDS (`--config-xds`), end to end: a management server written
//! here on tonic's ADS server pushes `RateLimitConfig` resources to the service running
//! in-process, and Envoy's gRPC RateLimitService answers by them. The management server
//! keeps one snapshot, sent whole on every new stream and again whenever it changes, as
//! go-control-plane's snapshot cache does for a state-of-the-world client.
//!
//! The limits counted to a refusal are per day: the service runs `--compat envoy`, whose
//! fixed windows would split a run crossing a minute's or an hour's edge.

use crate::server;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as RequestDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use futures_util::{Stream, StreamExt as _};
use prost::{Message as _, Name as _};
use server::Server;
use sluicegate_test_support::{certificates::Authority, free_port};
use tokio::sync::watch;
use tonic::codegen::tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// How long an expected event may take before the test fails (a bound, not a pace).
const PATIENCE: Duration = Duration::from_secs(20);

/// What the management server saw of one request: the message, the stream it came on
/// (counted from 1 per server start) and the stream's `x-token` metadata.
#[derive(Debug)]
struct Seen {
    request: DiscoveryRequest,
    stream: usize,
    token: Option<String>,
}

/// The snapshot a management server serves: a version and its resources.
type Snapshot = Option<(String, Vec<Any>)>;

#[derive(Clone)]
struct Ads {
    snapshot: watch::Sender<Snapshot>,
    seen: std::sync::mpsc::Sender<Seen>,
    streams: Arc<std::sync::atomic::AtomicUsize>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let stream = 1 + self
            .streams
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let token = request
            .metadata()
            .get("x-token")
            .map(|v| v.to_str().unwrap().to_owned());
        let mut inbound = request.into_inner();
        let seen = self.seen.clone();
        // The first request is read before any response is sent, as a management server
        // answers requests: a client that resets the stream on the response (one over
        // its message limit) can then not discard a request nobody has read yet.
        if let Ok(Some(request)) = inbound.message().await {
            let _ = seen.send(Seen {
                request,
                stream,
                token: token.clone(),
            });
        }
        tokio::spawn(async move {
            while let Ok(Some(request)) = inbound.message().await {
                let _ = seen.send(Seen {
                    request,
                    stream,
                    token: token.clone(),
                });
            }
        });
        // The snapshot now, then each new one; the nonce tells the pushes apart.
        let snapshots = self.snapshot.subscribe();
        let responses = futures_util::stream::unfold(
            (snapshots, true, 0u32),
            move |(mut snapshots, first, nonce)| async move {
                if !first {
                    snapshots.changed().await.ok()?;
                }
                loop {
                    let snapshot = snapshots.borrow_and_update().clone();
                    if let Some((version, resources)) = snapshot {
                        let response = DiscoveryResponse {
                            version_info: version,
                            resources,
                            type_url: RateLimitConfig::type_url(),
                            nonce: format!("{stream}-{nonce}"),
                            ..DiscoveryResponse::default()
                        };
                        return Some((Ok(response), (snapshots, false, nonce + 1)));
                    }
                    snapshots.changed().await.ok()?;
                }
            },
        );
        Ok(Response::new(Box::pin(responses)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// A management server on a runtime of its own, so that stopping it drops every stream
/// and connection at once, as a crash would.
struct ManagementServer {
    runtime: Option<tokio::runtime::Runtime>,
    address: SocketAddr,
    ads: Ads,
    seen: std::sync::mpsc::Receiver<Seen>,
    /// One message per connection accepted (before any TLS handshake).
    accepted: std::sync::mpsc::Receiver<()>,
}

impl ManagementServer {
    /// Serves `snapshot` on `address` (port 0: any), in plaintext.
    fn start(address: SocketAddr, snapshot: Snapshot) -> ManagementServer {
        ManagementServer::start_with(address, snapshot, None)
    }

    /// Serves `snapshot` on `address`, over TLS with `tls`.
    fn start_with(
        address: SocketAddr,
        snapshot: Snapshot,
        tls: Option<ServerTlsConfig>,
    ) -> ManagementServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(address))
            .expect("bind the management server");
        let address = listener.local_addr().unwrap();
        let (seen_tx, seen) = std::sync::mpsc::channel();
        let ads = Ads {
            snapshot: watch::Sender::new(snapshot),
            seen: seen_tx,
            streams: Arc::default(),
        };
        let service = AggregatedDiscoveryServiceServer::new(ads.clone());
        let (accepted_tx, accepted) = std::sync::mpsc::channel();
        let incoming = TcpListenerStream::new(listener).inspect(move |_| {
            let _ = accepted_tx.send(());
        });
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).expect("the server's TLS");
        }
        runtime.spawn(builder.add_service(service).serve_with_incoming(incoming));
        ManagementServer {
            runtime: Some(runtime),
            address,
            ads,
            seen,
            accepted,
        }
    }

    fn push(&self, version: &str, resources: &[RateLimitConfig]) {
        let resources = resources
            .iter()
            .map(|r| Any {
                type_url: RateLimitConfig::type_url(),
                value: r.encode_to_vec(),
            })
            .collect();
        self.ads
            .snapshot
            .send_replace(Some((version.to_owned(), resources)));
    }

    /// The next request the server receives.
    fn next(&mut self) -> Seen {
        self.seen
            .recv_timeout(PATIENCE)
            .expect("a request from the client in time")
    }

    /// Waits until `n` more connections were accepted, and says how many requests came
    /// meanwhile: none where every handshake failed.
    fn requests_over_connections(&mut self, n: usize) -> usize {
        for _ in 0..n {
            self.accepted
                .recv_timeout(PATIENCE)
                .expect("a connection from the client in time");
        }
        self.seen.try_iter().count()
    }

    /// Stops it: every connection dropped, the port closed.
    fn stop(mut self) -> SocketAddr {
        self.runtime
            .take()
            .unwrap()
            .shutdown_timeout(Duration::from_secs(1));
        self.address
    }
}

fn limit(key: &str, unit: RateLimitUnit, requests_per_unit: u32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.to_owned(),
        rate_limit: Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..RateLimitPolicy::default()
        }),
        ..RateLimitDescriptor::default()
    }
}

fn resource(descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: "gateway".into(),
        domain: "gateway".into(),
        descriptors,
    }
}

/// How many of `n` checks of `key` the service lets through now.
fn allowed(address: &str, key: &str, n: usize) -> usize {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(checks(address, key, n))
}

/// gRPC health's answer for the `ratelimit` service, by its status's name.
fn grpc_health(address: &str) -> String {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = HealthClient::new(channel);
            let request = HealthCheckRequest {
                service: "ratelimit".into(),
            };
            let status = client.check(request).await.unwrap().into_inner().status;
            ServingStatus::try_from(status)
                .unwrap()
                .as_str_name()
                .to_owned()
        })
}

async fn checks(address: &str, key: &str, n: usize) -> usize {
    let mut ok = 0;
    for answer in answers(address, key, n).await {
        if answer.expect("an answer").overall_code == i32::from(Code::Ok) {
            ok += 1;
        }
    }
    ok
}

/// `n` checks of `key` over gRPC, each answer or the call's error.
async fn answers(address: &str, key: &str, n: usize) -> Vec<Result<RateLimitResponse, Status>> {
    let mut client = RateLimitServiceClient::connect(format!("http://{address}"))
        .await
        .expect("connect over gRPC");
    let mut answers = Vec::with_capacity(n);
    for _ in 0..n {
        let request = RateLimitRequest {
            domain: "gateway".into(),
            descriptors: vec![RequestDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value: "client-1".into(),
                }],
                ..RequestDescriptor::default()
            }],
            hits_addend: 0,
        };
        answers.push(
            client
                .should_rate_limit(request)
                .await
                .map(Response::into_inner),
        );
    }
    answers
}

/// The calls' errors, when every one of `n` checks of `key` fails.
fn failures(address: &str, key: &str, n: usize) -> Vec<Status> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(answers(address, key, n))
        .into_iter()
        .map(|answer| answer.expect_err("no answer before a configuration"))
        .collect()
}

/// The service as `args` start it, once it listens (it waits for a first push unless
/// told not to).
fn start_service(args: &[String]) -> Server {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

fn fast_retries(management: SocketAddr) -> Vec<String> {
    [
        "--config-xds",
        &management.to_string(),
        "--config-xds-node-id",
        "ratelimit-1",
        "--config-xds-node-metadata",
        "zone=a,cluster:edge",
        "--config-xds-header",
        "x-token:s3cret",
        "--config-xds-retry-interval",
        "20ms",
        "--config-xds-backoff-initial",
        "20ms",
        "--config-xds-backoff-max",
        "50ms",
        "--compat",
        "envoy",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

#[test]
fn pushes_are_put_in_force_acked_nacked_and_survive_the_server() {
    // A port held for this test, so that nothing else takes it while the server is away.
    let mut management = ManagementServer::start(
        SocketAddr::from(([127, 0, 0, 1], free_port())),
        Some((
            "v1".into(),
            vec![Any {
                type_url: RateLimitConfig::type_url(),
                value: resource(vec![limit("user", RateLimitUnit::Day, 2)]).encode_to_vec(),
            }],
        )),
    );
    let service = start_service(&fast_retries(management.address));

    // The first request: who the client is, the type it wants, nothing ACKed yet.
    let first = management.next();
    assert_eq!(first.stream, 1);
    assert_eq!(first.token.as_deref(), Some("s3cret"));
    let node = first.request.node.as_ref().expect("a node");
    assert_eq!(node.id, "ratelimit-1");
    let metadata = &node.metadata.as_ref().expect("metadata").fields;
    let text = |k: &str| format!("{:?}", metadata[k].kind);
    assert!(text("zone").contains("\"a\"") && text("cluster").contains("\"edge\""));
    assert_eq!(
        first.request.type_url,
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    );
    assert_eq!(
        (
            first.request.version_info.as_str(),
            first.request.response_nonce.as_str()
        ),
        ("", "")
    );
    // v1 in force before the service listened, and ACKed.
    let ack = management.next();
    assert_eq!(
        (
            ack.request.version_info.as_str(),
            ack.request.response_nonce.as_str()
        ),
        ("v1", "1-0")
    );
    assert!(ack.request.error_detail.is_none());
    assert_eq!(allowed(&service.address, "user", 3), 2);

    // v2: a new limit, no restart.
    management.push(
        "v2",
        &[resource(vec![limit("api_key", RateLimitUnit::Day, 1)])],
    );
    let ack = management.next();
    assert_eq!(
        (
            ack.request.version_info.as_str(),
            ack.request.response_nonce.as_str()
        ),
        ("v2", "1-1")
    );
    assert_eq!(allowed(&service.address, "api_key", 2), 1);
    // `user` is no longer configured: unlimited.
    assert_eq!(allowed(&service.address, "user", 3), 3);

    // A bad push: NACKed with the reason and the version in force; v2 keeps answering.
    management.push(
        "v3",
        &[resource(vec![limit("api_key", RateLimitUnit::Unknown, 5)])],
    );
    let nack = management.next();
    assert_eq!(
        (
            nack.request.version_info.as_str(),
            nack.request.response_nonce.as_str()
        ),
        ("v2", "1-2")
    );
    let detail = nack.request.error_detail.expect("a NACK says why");
    assert!(
        detail.message.contains("xDS resource \"gateway\"")
            && detail.message.contains("rate_limit.unit"),
        "{detail:?}"
    );
    assert_eq!(allowed(&service.address, "api_key", 1), 0);
    let (status, rules) = service.request("GET", "/v1/rules", "");
    assert_eq!(status, 200);
    assert!(rules.contains("gateway.api_key"), "{rules}");
    let (_, overview) = service.request("GET", "/v1/overview", "");
    assert!(overview.contains("\"xds_version\":\"v2\""), "{overview}");
    assert_eq!(service.metric("sluicegate_xds_acks_total"), 2);
    assert_eq!(service.metric("sluicegate_xds_nacks_total"), 1);
    assert_eq!(service.metric("sluicegate_xds_connected"), 1);
    assert_eq!(
        service.metric("sluicegate_xds_config_version{version=\"v2\"}"),
        1
    );

    // The management server goes away: v2 keeps answering.
    let address = management.stop();
    assert_eq!(allowed(&service.address, "api_key", 1), 0);
    assert_eq!(allowed(&service.address, "other", 2), 2);

    // It comes back on the same port: the client connects again and says v2 is in force.
    let mut management = ManagementServer::start(address, None);
    let again = management.next();
    assert_eq!(again.stream, 1);
    assert_eq!(
        (
            again.request.version_info.as_str(),
            again.request.response_nonce.as_str()
        ),
        ("v2", "")
    );
    assert_eq!(again.token.as_deref(), Some("s3cret"));
    management.push(
        "v4",
        &[resource(vec![limit("other", RateLimitUnit::Day, 1)])],
    );
    let ack = management.next();
    assert_eq!(ack.request.version_info, "v4");
    assert_eq!(allowed(&service.address, "other", 2), 1);
    assert_eq!(allowed(&service.address, "api_key", 2), 2);

    // A push that raises a limit keeps what was used, as a reload does: two hits counted
    // (envoy counts the refused one too), so one of the three now allowed is left.
    management.push(
        "v5",
        &[resource(vec![limit("other", RateLimitUnit::Day, 3)])],
    );
    assert_eq!(management.next().request.version_info, "v5");
    assert_eq!(allowed(&service.address, "other", 2), 1);
    service.stop();
    management.stop();
}

/// `--start-without-config --healthy-with-config`: serving at once, but deciding nothing
/// before the first push (every check fails UNAVAILABLE, so that Envoy's own failure mode
/// decides, as envoyproxy/ratelimit fails it: envoyproxy/ratelimit@f2fb157
/// src/service/ratelimit.go:118-121), not ready until a push declares a domain, not ready
/// again after an empty one (envoy's FORCE_START_WITHOUT_INITIAL_CONFIG and
/// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
#[test]
fn healthy_only_with_a_configuration() {
    let mut management = ManagementServer::start("127.0.0.1:0".parse().unwrap(), None);
    let mut args = fast_retries(management.address);
    args.extend([
        "--start-without-config".into(),
        "--healthy-with-config".into(),
    ]);
    let service = start_service(&args);
    let first = management.next();
    assert_eq!(first.request.version_info, "");
    let (status, body) = service.request("GET", "/readyz", "");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("--healthy-with-config"), "{body}");
    // envoyproxy/ratelimit answers its /healthcheck 500 when unhealthy.
    assert_eq!(service.request("GET", "/healthcheck", "").0, 500);
    assert_eq!(grpc_health(&service.address), "NOT_SERVING");
    for failure in failures(&service.address, "user", 3) {
        assert_eq!(failure.code(), tonic::Code::Unavailable, "{failure:?}");
        assert!(
            failure.message().contains("no rate limit configuration"),
            "{failure:?}"
        );
    }

    management.push(
        "v1",
        &[resource(vec![limit("user", RateLimitUnit::Day, 1)])],
    );
    assert_eq!(management.next().request.version_info, "v1");
    assert_eq!(service.request("GET", "/readyz", "").0, 200);
    assert_eq!(grpc_health(&service.address), "SERVING");
    assert_eq!(allowed(&service.address, "user", 2), 1);

    // A refused push changes nothing.
    management.push(
        "v2",
        &[resource(vec![limit("user", RateLimitUnit::Unknown, 1)])],
    );
    assert!(management.next().request.error_detail.is_some());
    assert_eq!(service.request("GET", "/readyz", "").0, 200);

    // A push of no resource is a configuration: an empty one, not healthy.
    management.push("v3", &[]);
    assert_eq!(management.next().request.version_info, "v3");
    assert_eq!(service.request("GET", "/readyz", "").0, 503);
    service.stop();
    management.stop();
}

/// Flags that cannot work stop the start with a reason.
#[test]
fn conflicting_and_malformed_flags_are_refused() {
    let refused = |args: &[&str]| match Server::try_start(args) {
        Ok(_) => panic!("{args:?} started"),
        Err(e) => e,
    };
    let why = refused(&[
        "--config-xds",
        "127.0.0.1:1",
        "--config",
        "examples/sluicegate.yaml",
    ]);
    assert!(why.contains("--config"), "{why}");
    let why = refused(&["--config-xds", "no-port"]);
    assert!(why.contains("HOST:PORT"), "{why}");
    let why = refused(&[
        "--config-xds",
        "127.0.0.1:1",
        "--config-xds-header",
        "novalue",
    ]);
    assert!(why.contains("NAME:VALUE"), "{why}");
    let why = refused(&[
        "--config-xds",
        "127.0.0.1:1",
        "--config-xds-node-metadata",
        "k",
    ]);
    assert!(why.contains("neither K=V nor K:V"), "{why}");
    let why = refused(&["--config-xds", "127.0.0.1:1", "--config-xds-ca", "ca.pem"]);
    assert!(why.contains("--config-xds-tls"), "{why}");
    let why = refused(&[
        "--config-xds",
        "127.0.0.1:1",
        "--config-xds-tls",
        "--config-xds-ca",
        "/nonexistent/ca.pem",
    ]);
    assert!(why.contains("/nonexistent/ca.pem"), "{why}");
}

/// A push over mTLS: the client checks the server's certificate against --config-xds-ca
/// (and --config-xds-san when given), and presents its own. A client whose name check
/// fails, or that has no certificate, gets no stream.
#[test]
fn pushes_over_mtls_with_the_server_name_checked() {
    let dir = std::env::temp_dir().join(format!("sluicegate-xds-push-mtls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let authority = Authority::new(&dir, "ca");
    let server_pair = authority.issue("management");
    let client_pair = authority.issue("ratelimit");
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            read(&server_pair.cert),
            read(&server_pair.key),
        ))
        .client_ca_root(Certificate::from_pem(read(&authority.cert())));
    let v1 = resource(vec![limit("user", RateLimitUnit::Day, 1)]);
    let snapshot = Some((
        "v1".to_owned(),
        vec![Any {
            type_url: RateLimitConfig::type_url(),
            value: v1.encode_to_vec(),
        }],
    ));
    let mut management =
        ManagementServer::start_with("127.0.0.1:0".parse().unwrap(), snapshot, Some(tls));
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let mut args = fast_retries(management.address);
    args.extend([
        "--config-xds-tls".to_owned(),
        "--config-xds-ca".to_owned(),
        path(&authority.cert()),
    ]);
    let identity = [
        "--config-xds-client-cert".to_owned(),
        path(&client_pair.cert),
        "--config-xds-client-key".to_owned(),
        path(&client_pair.key),
    ];

    // The certificate names localhost: a SAN of localhost passes.
    let mut good = args.clone();
    good.extend(identity.clone());
    good.extend(["--config-xds-san".to_owned(), "localhost".to_owned()]);
    let service = start_service(&good);
    assert_eq!(management.next().request.version_info, "");
    assert_eq!(management.next().request.version_info, "v1");
    assert_eq!(allowed(&service.address, "user", 2), 1);
    service.stop();
    management.seen.try_iter().for_each(drop);
    management.accepted.try_iter().for_each(drop);

    // A name the certificate does not carry: two attempts, no request.
    let mut wrong_name = args.clone();
    wrong_name.extend(identity);
    wrong_name.extend([
        "--config-xds-san".to_owned(),
        "elsewhere.example".to_owned(),
        "--start-without-config".to_owned(),
    ]);
    let service = start_service(&wrong_name);
    assert_eq!(management.requests_over_connections(2), 0);
    assert_eq!(service.metric("sluicegate_xds_connected"), 0);
    service.stop();

    // No client certificate: the server refuses the handshake.
    args.push("--start-without-config".to_owned());
    let service = start_service(&args);
    assert_eq!(management.requests_over_connections(2), 0);
    service.stop();
    management.stop();
}

/// The real binary, `serve ARGS`, its standard error line by line.
struct Binary {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Binary {
    fn start(args: &[&str]) -> Binary {
        use std::io::{BufRead, BufReader};
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (sender, lines) = std::sync::mpsc::channel();
        // Read to the end, so that the service never writes into a closed pipe.
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        Binary { child, lines }
    }

    /// The next line that contains `wanted`.
    fn line_with(&self, wanted: &str) -> String {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no line with {wanted:?}"));
            if line.contains(wanted) {
                return line;
            }
        }
    }

    /// Waits until a line with each of `wanted` has come, in whatever order: lines that
    /// two tasks log (the xDS client connecting, the server waiting for its first push)
    /// come in no fixed order.
    fn lines_with_each(&self, wanted: &[&str]) {
        let mut missing: Vec<&str> = wanted.to_vec();
        let deadline = std::time::Instant::now() + PATIENCE;
        while !missing.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no line with {missing:?}"));
            missing.retain(|wanted| !line.contains(wanted));
        }
    }

    /// SIGTERM, then its exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "still running");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Binary {
    /// A test that fails leaves no process behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A service that waits for its first push stops on SIGTERM, exit status 0.
#[test]
fn sigterm_stops_a_service_waiting_for_its_first_push() {
    // A management server that never pushes.
    let management = ManagementServer::start("127.0.0.1:0".parse().unwrap(), None);
    let address = management.address.to_string();
    let mut service = Binary::start(&["--config-xds", &address]);
    service.lines_with_each(&["waiting for the first configuration", "xDS: connected"]);
    let status = service.terminate();
    assert!(status.success(), "{status:?}");
    management.stop();
}

/// The log says each connection, ACK (with the version) and NACK (with the version and
/// the reason); a refused first push is no reason to start serving.
#[test]
fn the_log_names_each_ack_and_nack() {
    let bad = resource(vec![limit("user", RateLimitUnit::Unknown, 1)]);
    let snapshot = Some((
        "v1".to_owned(),
        vec![Any {
            type_url: RateLimitConfig::type_url(),
            value: bad.encode_to_vec(),
        }],
    ));
    let management = ManagementServer::start("127.0.0.1:0".parse().unwrap(), snapshot);
    let address = management.address.to_string();
    let mut service = Binary::start(&["--config-xds", &address]);
    let connected = service.line_with("xDS: connected");
    assert!(connected.contains(&address), "{connected}");
    let nack = service.line_with("NACKed");
    assert!(
        nack.contains("version=v1") && nack.contains("rate_limit.unit"),
        "{nack}"
    );
    management.push(
        "v2",
        &[resource(vec![limit("user", RateLimitUnit::Minute, 1)])],
    );
    let ack = service.line_with("ACKed");
    assert!(
        ack.contains("version=v2") && ack.contains("added=gateway.user"),
        "{ack}"
    );
    let listening = service.line_with("sluicegate listening");
    assert!(
        listening.contains(&format!("config=xDS {address}")),
        "{listening}"
    );
    let status = service.terminate();
    assert!(status.success(), "{status:?}");
    management.stop();
}

/// A push larger than --config-xds-max-message-bytes is not taken: the stream breaks and
/// is opened again, nothing is ACKed, nothing put in force (checks still fail as before a
/// first push).
#[test]
fn a_push_over_the_message_limit_is_not_taken() {
    let descriptors = (0..20)
        .map(|i| limit(&format!("key-{i}"), RateLimitUnit::Minute, 1))
        .collect();
    let big = resource(descriptors);
    assert!(big.encoded_len() > 256);
    let snapshot = Some((
        "v1".to_owned(),
        vec![Any {
            type_url: RateLimitConfig::type_url(),
            value: big.encode_to_vec(),
        }],
    ));
    let mut management = ManagementServer::start("127.0.0.1:0".parse().unwrap(), snapshot);
    let mut args = fast_retries(management.address);
    args.extend([
        "--start-without-config".to_owned(),
        "--config-xds-max-message-bytes".to_owned(),
        "256".to_owned(),
    ]);
    let service = start_service(&args);
    let first = management.next();
    assert_eq!((first.stream, first.request.version_info.as_str()), (1, ""));
    let again = management.next();
    assert_eq!(
        (
            again.stream,
            again.request.version_info.as_str(),
            again.request.response_nonce.as_str()
        ),
        (2, "", "")
    );
    assert_eq!(service.metric("sluicegate_xds_acks_total"), 0);
    let unanswered = failures(&service.address, "key-0", 2);
    assert!(
        unanswered
            .iter()
            .all(|failure| failure.code() == tonic::Code::Unavailable),
        "{unanswered:?}"
    );
    service.stop();
    management.stop();
}
