//! The service: decide, then call the inner service, wait, or answer for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum_core::body::Body;
use http::{Request, Response, StatusCode};
use sluicegate::{Charge, Check, Store};
use tower::Service;

use super::after::{self, Pending};
use super::response::{add_headers, is_grpc, problem, rejection};
use super::settings::Settings;
use super::usage::Usage;

/// The middleware around `Inner`; made by [`RateLimitLayer`](crate::RateLimitLayer).
pub struct RateLimit<Inner, S> {
    inner: Inner,
    settings: Arc<Settings<S>>,
}

impl<Inner, S> RateLimit<Inner, S> {
    pub(crate) fn new(inner: Inner, settings: Arc<Settings<S>>) -> Self {
        RateLimit { inner, settings }
    }
}

impl<Inner: Clone, S> Clone for RateLimit<Inner, S> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<Inner, S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<Inner, S>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    S: Store + 'static,
{
    type Response = Response<Body>;
    type Error = Inner::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Inner::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let settings = Arc::clone(&self.settings);
        // The clone that was driven to readiness serves this request (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let grpc = is_grpc(&parts.headers);
            let keys = match settings.keys(&parts) {
                Ok(keys) => keys,
                Err(missing) => {
                    let title = "Rate limit key missing";
                    return Ok(problem(missing.status, title, &missing.detail, grpc));
                }
            };
            if settings.rules.is_empty() {
                let response = inner.call(Request::from_parts(parts, body)).await?;
                return Ok(response.map(Body::new));
            }
            let limits = settings.limits(&keys);
            // With usage: a peek or a reservation under an id of the layer's making, the
            // cost charged after the response; otherwise one unit, now.
            let request_id = settings.usage.as_ref().map(Usage::next_request_id);
            let (charge, cost) = match &settings.usage {
                Some(usage) => usage.request_charge(&parts),
                None => (Charge::Check, 1),
            };
            let check = Check {
                charge,
                request_id: request_id.as_deref().filter(|_| charge == Charge::Reserve),
                ..Check::new(&limits, cost)
            };
            let outcome = match settings.limiter.decide(&check).await {
                Ok(outcome) => outcome,
                Err(error) => {
                    // Not allowed and not refused: the store could not decide. Say so
                    // without leaking its internals; the log has them.
                    tracing::warn!(%error, "rate limit store error");
                    let detail = "the rate limiter could not decide this request";
                    let status = StatusCode::SERVICE_UNAVAILABLE;
                    return Ok(problem(status, "Rate limiter unavailable", detail, grpc));
                }
            };
            let mut response = if outcome.decision.allowed {
                if outcome.decision.delay() > Duration::ZERO {
                    // Leaky-bucket shaping: wait on the timer, holding no thread.
                    tokio::time::sleep(outcome.decision.delay()).await;
                }
                let mut response = inner.call(Request::from_parts(parts, body)).await?;
                if let (Some(usage), Some(request_id)) = (&settings.usage, request_id) {
                    // The head is back: its cost is known now, whatever the body streams.
                    let used = usage.response_cost(&mut response, cost);
                    let pending = Pending {
                        keys,
                        request_id,
                        charge: if charge == Charge::Reserve {
                            Charge::Settle
                        } else {
                            Charge::Report
                        },
                    };
                    after::charge(Arc::clone(&settings), usage.clone(), pending, used);
                }
                response.map(Body::new)
            } else {
                rejection(&settings.rules, &outcome, grpc)
            };
            add_headers(
                response.headers_mut(),
                &settings.rules,
                &outcome,
                settings.policy.as_ref(),
                settings.legacy_headers,
            );
            Ok(response)
        })
    }
}
