//! Charging after the response (`RateLimitLayer::charge_after`), end to end: a real axum
//! server on a loopback socket, a real HTTP client, the layer deciding on the in-memory
//! store and on a real redis-server. The inner service says what each request cost in a
//! response header, as an LLM proxy passes on its tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::HeaderName;
use sluicegate::{Algorithm, Charge, Check, Limiter, Outcome, Rule, RuleSpec, Store, StoreError};
use sluicegate_tower::{Estimate, KeyExtractor, RateLimitLayer, ResponseCost, Usage};

use crate::common;

use common::*;

/// The costs of the requests the tests send: token counts of all sizes.
const COSTS: [u64; 12] = [1, 7, 40, 3, 120, 0, 55, 9, 2, 310, 18, 64];

async fn reports_count_every_token<S: Store + 'static>(store: S) {
    let limiter = Arc::new(Limiter::new(store));
    let rule = tokens_rule(100_000);
    let usage = Usage::from_header(TOKENS);
    let stats = usage.stats();
    let layer = RateLimitLayer::new(Arc::clone(&limiter))
        .limit(rule.clone(), KeyExtractor::header(API_KEY))
        .charge_after(usage);
    let address = serve(layer).await;
    for cost in COSTS {
        let answer = complete(address, &cost.to_string(), "").await;
        assert_eq!(answer.status, 200);
        assert!(
            !answer.headers.contains_key("x-usage-tokens"),
            "the header is taken out"
        );
    }
    settled(&stats, COSTS.len() as u64).await;
    assert_eq!(
        used(&limiter, &rule, "alice").await,
        COSTS.iter().sum::<u64>()
    );
    assert_eq!(
        (stats.retries(), stats.failed(), stats.missing_costs()),
        (0, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_count_every_token_in_memory() {
    reports_count_every_token(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_count_every_token_on_redis() {
    reports_count_every_token(redis().await).await;
}

/// A store that records the first `lose` after-charges (reports and settles) it is sent
/// and then fails them, as a connection does that drops the reply of a call the server
/// ran: the layer's retry, with the same request id, must not count them twice.
struct LosesReplies<S> {
    store: S,
    lose: AtomicU32,
}

impl<S: Store> Store for LosesReplies<S> {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        let outcome = self.store.check(check).await?;
        let after_charge = matches!(check.charge, Charge::Report | Charge::Settle);
        let lost = after_charge
            && self
                .lose
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
        if lost {
            return Err(StoreError::Timeout {
                server: "test".into(),
                key: None,
                after: Duration::from_millis(250),
            });
        }
        Ok(outcome)
    }
}

async fn lost_replies_are_counted_once<S: Store + 'static>(store: S, usage: Usage) {
    let limiter = Arc::new(Limiter::new(LosesReplies {
        store,
        lose: AtomicU32::new(3),
    }));
    let rule = tokens_rule(100_000);
    let stats = usage.stats();
    let layer = RateLimitLayer::new(Arc::clone(&limiter))
        .limit(rule.clone(), KeyExtractor::header(API_KEY))
        .charge_after(usage);
    let address = serve(layer).await;
    for cost in [40, 7, 300, 12] {
        assert_eq!(complete(address, &cost.to_string(), "").await.status, 200);
    }
    settled(&stats, 4).await;
    assert_eq!(used(&limiter, &rule, "alice").await, 40 + 7 + 300 + 12);
    assert_eq!(
        (stats.recorded(), stats.retries(), stats.failed()),
        (4, 3, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_report_replies_are_counted_once_in_memory() {
    lost_replies_are_counted_once(memory(), Usage::from_header(TOKENS)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_settle_replies_are_counted_once_in_memory() {
    let usage = Usage::from_header(TOKENS).reserve(Estimate::Fixed(20));
    lost_replies_are_counted_once(memory(), usage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_settle_replies_are_counted_once_on_redis() {
    let usage = Usage::from_header(TOKENS).reserve(Estimate::Fixed(20));
    lost_replies_are_counted_once(redis().await, usage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_report_replies_are_counted_once_on_redis() {
    lost_replies_are_counted_once(redis().await, Usage::from_header(TOKENS)).await;
}

/// A store that fails every after-charge: the response is served all the same, and the
/// charge is given up after its attempts, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_that_keeps_failing_is_given_up_not_the_response() {
    let limiter = Arc::new(Limiter::new(LosesReplies {
        store: memory(),
        lose: AtomicU32::new(u32::MAX),
    }));
    let rule = tokens_rule(1_000);
    let usage = Usage::from_header(TOKENS).attempts(2);
    let stats = usage.stats();
    let layer = RateLimitLayer::new(Arc::clone(&limiter))
        .limit(rule.clone(), KeyExtractor::header(API_KEY))
        .charge_after(usage);
    let address = serve(layer).await;
    assert_eq!(complete(address, "30", "").await.status, 200);
    settled(&stats, 1).await;
    assert_eq!(
        (stats.recorded(), stats.retries(), stats.failed()),
        (0, 1, 1)
    );
}

/// A response without a readable cost is charged `when_missing` after a peek, its estimate
/// after a reservation, and counted either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_garbled_costs_are_charged_the_documented_fallback() {
    let limiter = Arc::new(Limiter::new(memory()));
    let rule = tokens_rule(1_000);
    let peeking = Usage::from_header(TOKENS).when_missing(50);
    let reserving = Usage::from_header(TOKENS).reserve(Estimate::Fixed(20));
    let (peek_stats, reserve_stats) = (peeking.stats(), reserving.stats());
    let layer = |usage| {
        RateLimitLayer::new(Arc::clone(&limiter))
            .limit(rule.clone(), KeyExtractor::header(API_KEY))
            .charge_after(usage)
    };
    let (peek, reserve) = (serve(layer(peeking)).await, serve(layer(reserving)).await);
    for tokens in ["none", "garbled", "-3"] {
        assert_eq!(complete(peek, tokens, "").await.status, 200);
        assert_eq!(complete(reserve, tokens, "").await.status, 200);
    }
    settled(&peek_stats, 3).await;
    settled(&reserve_stats, 3).await;
    assert_eq!(peek_stats.missing_costs(), 3);
    assert_eq!(reserve_stats.missing_costs(), 3);
    assert_eq!(used(&limiter, &rule, "alice").await, 3 * 50 + 3 * 20);
}
/// Reserve an estimate (the request's `x-max-tokens`, else 100), settle the real cost:
/// estimates above and below the cost, and the usage is still exactly the costs' sum.
async fn settles_charge_the_real_cost<S: Store + 'static>(store: S) {
    let limiter = Arc::new(Limiter::new(store));
    let rule = tokens_rule(100_000);
    let estimate = Estimate::Header {
        name: HeaderName::from_static("x-max-tokens"),
        default: 100,
    };
    let usage = Usage::from_header(TOKENS).reserve(estimate);
    let stats = usage.stats();
    let layer = RateLimitLayer::new(Arc::clone(&limiter))
        .limit(rule.clone(), KeyExtractor::header(API_KEY))
        .charge_after(usage);
    let address = serve(layer).await;
    for (i, cost) in COSTS.into_iter().enumerate() {
        // Every third request says nothing and is estimated at 100; the others at 50.
        let max_tokens = if i % 3 == 0 {
            ""
        } else {
            "x-max-tokens: 50\r\n"
        };
        let answer = complete(address, &cost.to_string(), max_tokens).await;
        assert_eq!(answer.status, 200);
    }
    settled(&stats, COSTS.len() as u64).await;
    assert_eq!(
        used(&limiter, &rule, "alice").await,
        COSTS.iter().sum::<u64>()
    );
    assert_eq!((stats.retries(), stats.failed()), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_charge_the_real_cost_in_memory() {
    settles_charge_the_real_cost(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_charge_the_real_cost_on_redis() {
    settles_charge_the_real_cost(redis().await).await;
}

/// A response that costs more than the key has left puts it in debt: the next request is
/// refused at its peek, 429 with Retry-After, until the debt has expired.
async fn a_spent_key_is_refused<S: Store + 'static>(store: S) {
    let limiter = Arc::new(Limiter::new(store));
    let rule = Rule::new(
        "tokens",
        &RuleSpec::new(Algorithm::FixedWindow, 100, Duration::from_secs(86_400)),
    )
    .unwrap();
    let usage = Usage::from_header(TOKENS);
    let stats = usage.stats();
    let layer = RateLimitLayer::new(Arc::clone(&limiter))
        .limit(rule.clone(), KeyExtractor::header(API_KEY))
        .charge_after(usage);
    let address = serve(layer).await;
    assert_eq!(complete(address, "60", "").await.status, 200);
    // 40 tokens left; this answer uses 90 of them.
    assert_eq!(complete(address, "90", "").await.status, 200);
    settled(&stats, 2).await;
    let refused = complete(address, "1", "").await;
    assert_eq!(refused.status, 429);
    let retry_after: u64 = refused.headers["retry-after"].parse().unwrap();
    assert!((1..=86_400).contains(&retry_after), "{retry_after}");
    assert_eq!(
        stats.recorded(),
        2,
        "a refused request is charged nothing after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_key_is_refused_in_memory() {
    a_spent_key_is_refused(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_key_is_refused_on_redis() {
    a_spent_key_is_refused(redis().await).await;
}

/// Two instances of a service — each its own layer, limiter and connection — share one
/// Redis: their request ids never meet, so every report of both counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_sharing_redis_lose_no_report() {
    let prefix = fresh_prefix();
    let rule = tokens_rule(100_000);
    let mut instances = Vec::new();
    for _ in 0..2 {
        let limiter = Arc::new(Limiter::new(redis_under(prefix.clone()).await));
        let usage = Usage::from_header(TOKENS);
        let stats = usage.stats();
        let layer = RateLimitLayer::new(Arc::clone(&limiter))
            .limit(rule.clone(), KeyExtractor::header(API_KEY))
            .charge_after(usage);
        instances.push((limiter, stats, serve(layer).await));
    }
    for cost in COSTS {
        for (_, _, address) in &instances {
            assert_eq!(complete(*address, &cost.to_string(), "").await.status, 200);
        }
    }
    for (_, stats, _) in &instances {
        settled(stats, COSTS.len() as u64).await;
    }
    let expected = 2 * COSTS.iter().sum::<u64>();
    assert_eq!(used(&instances[0].0, &rule, "alice").await, expected);
}

/// A body that never ends: the answer of a stream still going.
struct Endless;

impl http_body::Body for Endless {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

/// The cost is read when the response head comes back, from the extension the inner
/// service set: charged while the body is still streaming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_answer_is_charged_when_its_head_comes_back() {
    use tower::ServiceExt;

    let limiter = Arc::new(Limiter::new(memory()));
    let rule = tokens_rule(1_000);
    let usage = Usage::from_extension();
    let stats = usage.stats();
    let layer = RateLimitLayer::new(Arc::clone(&limiter))
        .limit(rule.clone(), KeyExtractor::header(API_KEY))
        .charge_after(usage);
    let app = Router::new()
        .route(
            "/stream",
            get(|| async {
                let mut response = axum::response::Response::new(Body::new(Endless));
                response.extensions_mut().insert(ResponseCost(250));
                response
            }),
        )
        .layer(layer);
    let request = http::Request::get("/stream")
        .header(API_KEY, "alice")
        .body(Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    settled(&stats, 1).await;
    assert_eq!(used(&limiter, &rule, "alice").await, 250);
    drop(response);
}
