//! An axum app behind sluicegate's tower middleware.
//!
//! Run with: `cargo run -p axum-app-example` (then `curl -i localhost:3000/`), or with
//! `SLUICEGATE_STORE=redis://127.0.0.1:6379 cargo run -p axum-app-example` to share the
//! limits between instances through Redis; `LISTEN=127.0.0.1:3001` (or `0.0.0.0:3000`)
//! listens elsewhere.
//!
//! - `GET /` — 5 requests per 10 s per client address (exact sliding window);
//! - `GET /api/{item}` — also 100 per minute per `x-api-key` and route;
//! - `GET /slow` — shaped, not refused: 2 per second, a queue of 5, and no per-client
//!   limit in front, so the queue is what you see: 8 at once (`seq 8 | xargs -P8 -I{}
//!   curl -s -w ' %{http_code} %{time_total}s\n' localhost:3000/slow`) are answered
//!   half a second apart, and the two the queue has no room for are refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::HeaderName;
use axum::routing::get;
use sluicegate::{Algorithm, AnyStore, Limiter, Rule, RuleSpec, StoreOptions};
use sluicegate_tower::{KeyExtractor, RateLimitLayer};

fn rule(name: &str, algorithm: Algorithm, limit: u64, window: Duration) -> Result<Rule, String> {
    let mut spec = RuleSpec::new(algorithm, limit, window);
    if algorithm == Algorithm::LeakyBucket {
        spec.queue = Some(5);
    }
    Rule::new(name, &spec).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let url = std::env::var("SLUICEGATE_STORE").unwrap_or_else(|_| "memory".into());
    let store = AnyStore::open(StoreOptions::new(&url))
        .await
        .map_err(|e| e.to_string())?;
    let limiter = Arc::new(Limiter::new(store));

    let per_client = RateLimitLayer::new(Arc::clone(&limiter))
        .limit(
            rule(
                "per-client",
                Algorithm::SlidingLog,
                5,
                Duration::from_secs(10),
            )?,
            KeyExtractor::peer_ip(),
        )
        .legacy_headers(true);
    let per_key = RateLimitLayer::new(Arc::clone(&limiter)).limit(
        rule(
            "per-api-key",
            Algorithm::SlidingCounter,
            100,
            Duration::from_secs(60),
        )?,
        KeyExtractor::header(HeaderName::from_static("x-api-key")),
    );
    let shaped = RateLimitLayer::new(limiter).limit(
        rule("shaped", Algorithm::LeakyBucket, 2, Duration::from_secs(1))?,
        KeyExtractor::global(),
    );

    let per_client_routes = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route(
            "/api/{item}",
            get(|| async { "an item\n" }).route_layer(per_key),
        )
        .layer(per_client);
    // Beside the per-client routes rather than under their layer, whose 5 per 10 s would
    // refuse a burst before its queue could be seen.
    let app = per_client_routes.route(
        "/slow",
        get(|| async { "worth the wait\n" }).route_layer(shaped),
    );

    let address = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .map_err(|e| format!("cannot listen on {address}: {e}"))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    // The bound address, so that LISTEN=127.0.0.1:0 tells which port it got.
    println!("listening on http://{address} ({url} store)");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .map_err(|e| e.to_string())
}
