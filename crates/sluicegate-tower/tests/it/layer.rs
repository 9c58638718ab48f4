//! The middleware around real axum routers: `oneshot` requests, and one real server.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::BodyExt;
use sluicegate::{
    Algorithm, Limiter, ManualClock, MemoryStore, MemoryStoreConfig, RedisStore, RedisStoreConfig,
    Rule, RuleSpec, Store,
};
use sluicegate_tower::{KeyExtractor, RateLimitLayer};
use tower::ServiceExt;

const S: u64 = 1_000_000;

fn limiter(config: MemoryStoreConfig) -> Arc<Limiter<MemoryStore>> {
    // At the start of a minute, so fixed windows have their whole length ahead.
    let clock = ManualClock::new(Duration::from_micros(999_960 * S));
    Arc::new(Limiter::new(MemoryStore::new(config, Arc::new(clock))))
}

fn rule(name: &str, spec: RuleSpec) -> Rule {
    Rule::new(name, &spec).unwrap()
}

fn app<S: Store + 'static>(layer: RateLimitLayer<S>) -> Router {
    Router::new()
        .route("/users/{id}", get(|| async { "hello" }))
        .layer(layer)
}

fn from(peer: &str) -> Request<Body> {
    let mut request = Request::get("/users/7").body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    request
}

async fn send(app: &Router, request: Request<Body>) -> Response<Body> {
    app.clone().oneshot(request).await.unwrap()
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn allowed_and_refused_responses_carry_their_headers() {
    let per_ip = rule(
        "per-ip",
        RuleSpec::new(Algorithm::SlidingLog, 2, Duration::from_micros(90 * S)),
    );
    let layer = RateLimitLayer::new(limiter(MemoryStoreConfig::default()))
        .limit(per_ip, KeyExtractor::peer_ip())
        .legacy_headers(true);
    let app = app(layer);

    let first = send(&app, from("192.0.2.1:4000")).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "ratelimit"), "\"per-ip\";r=1;t=90");
    assert_eq!(header(&first, "ratelimit-policy"), "\"per-ip\";q=2;w=90");
    assert_eq!(header(&first, "x-ratelimit-remaining"), "1");
    send(&app, from("192.0.2.1:4001")).await;

    let refused = send(&app, from("192.0.2.1:4002")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), "90");
    assert_eq!(header(&refused, "ratelimit"), "\"per-ip\";r=0;t=90");
    assert_eq!(header(&refused, "x-ratelimit-limit"), "2");
    assert_eq!(header(&refused, "content-type"), "application/problem+json");
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated_policies"], serde_json::json!(["per-ip"]));
    assert_eq!(problem["retry_after"], 90);

    // Another client has its own window.
    assert_eq!(
        send(&app, from("192.0.2.2:4000")).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn retry_after_rounds_up_and_is_never_zero() {
    // One per 10 ms: a refusal's wait is under a second, and still says 1.
    let fast = rule(
        "fast",
        RuleSpec::new(Algorithm::TokenBucket, 100, Duration::from_micros(S)),
    );
    let layer = RateLimitLayer::new(limiter(MemoryStoreConfig::default()))
        .limit(fast, KeyExtractor::global());
    let app = app(layer);
    let mut refused = None;
    for _ in 0..200 {
        let response = send(&app, from("192.0.2.1:1")).await;
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(response);
            break;
        }
    }
    let refused = refused.expect("the burst runs out");
    assert_eq!(header(&refused, "retry-after"), "1");
}

#[tokio::test]
async fn forwarding_headers_count_only_from_trusted_proxies() {
    let per_ip = rule(
        "per-ip",
        RuleSpec::new(Algorithm::FixedWindow, 1, Duration::from_micros(60 * S)),
    );
    let layer = RateLimitLayer::new(limiter(MemoryStoreConfig::default())).limit(
        per_ip,
        KeyExtractor::peer_ip().trust_proxies(["10.0.0.0/8".parse().unwrap()]),
    );
    let app = app(layer);
    let spoofed = |peer: &str, claimed: &str| {
        let mut request = from(peer);
        request
            .headers_mut()
            .insert("x-forwarded-for", claimed.parse().unwrap());
        request
    };
    // An untrusted client claiming new addresses is still itself: its second request is
    // refused whatever it claims.
    assert_eq!(
        send(&app, spoofed("203.0.113.5:1", "1.1.1.1"))
            .await
            .status(),
        StatusCode::OK
    );
    let again = send(&app, spoofed("203.0.113.5:2", "2.2.2.2")).await;
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    // Behind the trusted proxy, each forwarded client counts on its own.
    assert_eq!(
        send(&app, spoofed("10.1.1.1:1", "198.51.100.1"))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, spoofed("10.1.1.1:2", "198.51.100.2"))
            .await
            .status(),
        StatusCode::OK
    );
    let repeat = send(&app, spoofed("10.1.1.1:3", "198.51.100.1")).await;
    assert_eq!(repeat.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_rules_shape_instead_of_refusing() {
    // 10 per second with a queue of 2: one request per 100 ms gets through.
    let shaping = rule(
        "shape",
        RuleSpec {
            queue: Some(2),
            ..RuleSpec::new(Algorithm::LeakyBucket, 10, Duration::from_micros(S))
        },
    );
    let layer = RateLimitLayer::new(limiter(MemoryStoreConfig::default()))
        .limit(shaping, KeyExtractor::global());
    let reached = Arc::new(std::sync::Mutex::new(Vec::new()));
    let start = tokio::time::Instant::now();
    let log = Arc::clone(&reached);
    let app = Router::new()
        .route(
            "/users/{id}",
            get(move || {
                let log = Arc::clone(&log);
                async move {
                    log.lock().unwrap().push(start.elapsed());
                    "ok"
                }
            }),
        )
        .layer(layer);
    let requests = (0..4).map(|_| app.clone().oneshot(from("192.0.2.1:1")));
    let statuses: Vec<StatusCode> = futures_join(requests).await;
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let mut times = reached.lock().unwrap().clone();
    times.sort();
    assert_eq!(
        times,
        [
            Duration::ZERO,
            Duration::from_millis(100),
            Duration::from_millis(200)
        ]
    );
}

/// Runs the requests concurrently (on the paused clock they wait side by side).
async fn futures_join<F, E>(requests: impl Iterator<Item = F>) -> Vec<StatusCode>
where
    F: std::future::Future<Output = Result<Response<Body>, E>> + Send + 'static,
    E: std::fmt::Debug + Send + 'static,
{
    let handles: Vec<_> = requests.map(tokio::spawn).collect();
    let mut statuses = Vec::new();
    for handle in handles {
        statuses.push(handle.await.unwrap().unwrap().status());
    }
    statuses
}

#[tokio::test]
async fn several_rules_per_route_and_missing_keys() {
    let per_user = rule(
        "per-user",
        RuleSpec::new(Algorithm::SlidingLog, 1, Duration::from_micros(60 * S)),
    );
    let per_route = rule(
        "per-route",
        RuleSpec::new(Algorithm::SlidingLog, 100, Duration::from_micros(60 * S)),
    );
    let layer = RateLimitLayer::new(limiter(MemoryStoreConfig::default()))
        .limit(
            per_user,
            KeyExtractor::header(HeaderName::from_static("x-api-key")),
        )
        .limit(per_route, KeyExtractor::route());
    let app = app(layer);
    let with_key = |key: &str| {
        let mut request = from("192.0.2.1:1");
        request
            .headers_mut()
            .insert("x-api-key", key.parse().unwrap());
        request
    };
    let ok = send(&app, with_key("alice")).await;
    assert_eq!(
        header(&ok, "ratelimit-policy"),
        "\"per-user\";q=1;w=60, \"per-route\";q=100;w=60"
    );
    // The binding limit is the user's, with nothing left.
    assert_eq!(header(&ok, "ratelimit"), "\"per-user\";r=0;t=60");
    let refused = send(&app, with_key("alice")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let missing = send(&app, from("192.0.2.1:1")).await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    let body = missing.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["detail"], "header x-api-key is required");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_decide_answers_503() {
    // A real redis-server, gone once the store has connected to it.
    let server = sluicegate_test_support::RedisServer::start(&[]);
    let port = server.port;
    let store = RedisStore::connect(RedisStoreConfig::new(&server.url()))
        .await
        .unwrap();
    drop(server);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server still up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let per_ip = rule(
        "per-ip",
        RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_micros(60 * S)),
    );
    let layer =
        RateLimitLayer::new(Arc::new(Limiter::new(store))).limit(per_ip, KeyExtractor::peer_ip());
    let response = send(&app(layer), from("192.0.2.1:1")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// A full store is not an outage: a new key without room is refused as a rate limit (429
/// with a Retry-After of one second), not answered 503.
#[tokio::test]
async fn a_full_store_answers_429() {
    let full = MemoryStoreConfig {
        max_keys: 0,
        ..MemoryStoreConfig::default()
    };
    let per_ip = rule(
        "per-ip",
        RuleSpec::new(Algorithm::SlidingLog, 5, Duration::from_micros(60 * S)),
    );
    let layer = RateLimitLayer::new(limiter(full)).limit(per_ip, KeyExtractor::peer_ip());
    let response = send(&app(layer), from("192.0.2.1:1")).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&response, "retry-after"), "1");
}

#[tokio::test]
async fn grpc_calls_get_resource_exhausted() {
    let once = rule(
        "once",
        RuleSpec::new(Algorithm::FixedWindow, 1, Duration::from_micros(60 * S)),
    );
    let layer = RateLimitLayer::new(limiter(MemoryStoreConfig::default()))
        .limit(once, KeyExtractor::global());
    let app = app(layer);
    let grpc = || {
        let mut request = from("192.0.2.1:1");
        request
            .headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        request
    };
    send(&app, grpc()).await;
    let refused = send(&app, grpc()).await;
    assert_eq!(refused.status(), StatusCode::OK);
    assert_eq!(header(&refused, "grpc-status"), "8");
    assert_eq!(header(&refused, "retry-after"), "60");
    assert!(header(&refused, "grpc-message").contains("retry in 60 s"));
}

/// `GET /users/1` over a connection of its own, with `headers` (each ending in CRLF)
/// after the usual ones: the response's status code, as text.
fn status_over_socket(address: SocketAddr, headers: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET /users/1 HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n{headers}\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response[9..12].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_limits_a_real_client() {
    let per_ip = rule(
        "per-ip",
        RuleSpec::new(Algorithm::SlidingLog, 2, Duration::from_micros(60 * S)),
    );
    let layer =
        RateLimitLayer::new(Arc::new(Limiter::in_memory())).limit(per_ip, KeyExtractor::peer_ip());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let service = app(layer).into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });
    let statuses = tokio::task::spawn_blocking(move || {
        (0..3)
            .map(|_| status_over_socket(address, ""))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(statuses, ["200", "200", "429"]);
}

/// A client behind a proxy that appends `X-Forwarded-For` (as nginx and AWS ALB do) sends
/// a fresh `Forwarded: for=…` and a forged `X-Forwarded-For` entry with every request,
/// over real sockets: it is still one client, allowed its 3 and refused the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_behind_an_appending_proxy_cannot_pick_its_address() {
    let per_ip = rule(
        "per-ip",
        RuleSpec::new(Algorithm::FixedWindow, 3, Duration::from_micros(3600 * S)),
    );
    // The test's own socket plays the proxy, on loopback.
    let extractor = KeyExtractor::peer_ip().trust_proxies(["127.0.0.1".parse().unwrap()]);
    let layer = RateLimitLayer::new(limiter(MemoryStoreConfig::default())).limit(per_ip, extractor);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let service = app(layer).into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });
    let statuses = tokio::task::spawn_blocking(move || {
        (0..10u32)
            .map(|i| {
                // What the client made up this time, different on every request.
                let made_up = {
                    let n = i.wrapping_mul(2_654_435_761) ^ 0x5bd1_e995;
                    std::net::Ipv4Addr::from(n)
                };
                status_over_socket(
                    address,
                    &format!(
                        "Forwarded: for={made_up}\r\n\
                         X-Forwarded-For: {made_up}, 198.51.100.7\r\n"
                    ),
                )
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let allowed = statuses.iter().filter(|s| *s == "200").count();
    assert_eq!(allowed, 3, "{statuses:?}");
    assert!(statuses[3..].iter().all(|s| s == "429"), "{statuses:?}");
}

/// A real tonic client calling a real tonic service (gRPC health) through the layer,
/// over HTTP/2 on a loopback socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_client_is_refused_with_resource_exhausted() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let (_reporter, health) = tonic_health::server::health_reporter();
    let once = rule(
        "once",
        RuleSpec::new(Algorithm::FixedWindow, 1, Duration::from_micros(3600 * S)),
    );
    let layer = RateLimitLayer::new(limiter(MemoryStoreConfig::default()))
        .limit(once, KeyExtractor::peer_ip());
    let app = tonic::service::Routes::new(health)
        .into_axum_router()
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let request = || HealthCheckRequest {
        service: String::new(),
    };
    client
        .check(request())
        .await
        .expect("the first call passes");
    let refused = client.check(request()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("retry in"),
        "{}",
        refused.message()
    );
    let retry_after = refused
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(retry_after.parse::<u64>().unwrap() >= 1);
}
