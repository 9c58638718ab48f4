//! What monitoring calls: `GET /healthz`, `GET /readyz`, envoyproxy/ratelimit's
//! `GET /healthcheck`, `GET /metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::readiness::{Readiness, readiness};
use crate::service::Service;

/// Up while the process is.
pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready when the store answers. A Redis that may evict keys is named in the body, and
/// with `--require-noeviction` makes the service not ready; a Redis node found to have
/// lost state is named in the body, and the service stays ready (it decides).
pub(super) async fn readyz(State(service): State<Arc<Service>>) -> Response {
    match readiness(&service).await {
        Readiness::Ready { warning: None } => (StatusCode::OK, "ready\n").into_response(),
        Readiness::Ready {
            warning: Some(risk),
        } => (StatusCode::OK, format!("ready\nwarning: {risk}\n")).into_response(),
        Readiness::NotReady(why) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response()
        }
    }
}

/// envoyproxy/ratelimit's health check, as its probes expect it: `OK` while ready, and
/// while not a 500 (envoyproxy/ratelimit@f2fb157 src/server/health.go:81-88), here with
/// the reason as the body.
pub(super) async fn healthcheck(State(service): State<Arc<Service>>) -> Response {
    match readiness(&service).await {
        Readiness::Ready { .. } => (StatusCode::OK, "OK").into_response(),
        Readiness::NotReady(why) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")).into_response()
        }
    }
}

/// Prometheus' text exposition.
pub(super) async fn metrics(State(service): State<Arc<Service>>) -> Response {
    let text = service.metrics().render(service.limiter());
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}
