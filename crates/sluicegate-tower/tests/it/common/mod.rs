//! What the tests of the after-charge share: a token rule, stores, an axum server behind
//! the layer on a loopback socket, a real HTTP client, and bounded waits.
// Each test file uses its own part of these.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::get;
use http::{HeaderName, HeaderValue};
use sluicegate::{
    Algorithm, Check, Limit, Limiter, ManualClock, MemoryStore, MemoryStoreConfig, RedisStore,
    RedisStoreConfig, Rule, RuleSpec, Store,
};
use sluicegate_tower::{RateLimitLayer, UsageStats};

pub(crate) const S: u64 = 1_000_000;
pub(crate) const TOKENS: HeaderName = HeaderName::from_static("x-usage-tokens");
pub(crate) const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// A token limit exact over the test's few seconds: a sliding log of an hour.
pub(crate) fn tokens_rule(limit: u64) -> Rule {
    Rule::new(
        "tokens",
        &RuleSpec::new(
            Algorithm::SlidingLog,
            limit,
            Duration::from_micros(3600 * S),
        ),
    )
    .unwrap()
}

pub(crate) fn memory() -> MemoryStore {
    MemoryStore::new(
        MemoryStoreConfig::default(),
        Arc::new(ManualClock::new(Duration::from_micros(1_000 * S))),
    )
}

/// A prefix per test, so tests sharing the server never share state.
pub(crate) fn fresh_prefix() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "tower-usage:{}:{}:",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A store of its own on the shared redis-server.
pub(crate) async fn redis() -> RedisStore {
    redis_under(fresh_prefix()).await
}

/// A connection of its own to the shared redis-server, its keys under `prefix`.
pub(crate) async fn redis_under(prefix: String) -> RedisStore {
    let server = sluicegate_test_support::standalone();
    RedisStore::connect(RedisStoreConfig {
        prefix,
        ..RedisStoreConfig::new(&server.url())
    })
    .await
    .unwrap()
}

/// Serves `/complete/{tokens}` behind `layer`: the answer says it cost `tokens` (any
/// text, so a garbled count too; `none` for no header at all).
pub(crate) async fn serve<S: Store + 'static>(layer: RateLimitLayer<S>) -> SocketAddr {
    let app = Router::new()
        .route(
            "/complete/{tokens}",
            get(|Path(tokens): Path<String>| async move {
                let mut response = axum::response::Response::new(Body::from("done"));
                if tokens != "none" {
                    let value = HeaderValue::from_str(&tokens).unwrap();
                    response.headers_mut().insert(TOKENS, value);
                }
                response
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

/// One response over a real socket: its status and headers (names lowercase).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: HashMap<String, String>,
}

pub(crate) async fn get_with(address: SocketAddr, path: &str, headers: &str) -> Answer {
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n{headers}\r\n");
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let head = response.split("\r\n\r\n").next().unwrap();
        let mut lines = head.lines();
        let status = lines.next().unwrap()[9..12].parse().unwrap();
        let headers = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
            .collect();
        Answer { status, headers }
    })
    .await
    .unwrap()
}

pub(crate) async fn complete(address: SocketAddr, tokens: &str, extra: &str) -> Answer {
    get_with(
        address,
        &format!("/complete/{tokens}"),
        &format!("x-api-key: alice\r\n{extra}"),
    )
    .await
}

/// Waits (bounded) until `count` after-charges are done: recorded, with nothing to
/// charge, or given up.
pub(crate) async fn settled(stats: &UsageStats, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let done = || stats.recorded() + stats.nothing_to_charge() + stats.failed();
    while done() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} after-charges done",
            done()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The units `key` holds under `rule` while it has room, read with a peek: it takes
/// nothing and answers as a check of one unit would (`remaining` = L − used − 1).
pub(crate) async fn used<S: Store>(limiter: &Limiter<S>, rule: &Rule, key: &str) -> u64 {
    let limits = [Limit { rule, key }];
    let peek = limiter.decide(&Check::new(&limits, 0)).await.unwrap();
    assert!(peek.decision.allowed, "the key is spent");
    rule.capacity() - 1 - peek.decision.remaining
}
