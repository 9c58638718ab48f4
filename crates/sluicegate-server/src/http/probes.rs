//! What monitoring calls: `GET /healthz`, `GET /readyz`, `GET /metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use sluicegate::AnyStore;

use crate::service::Service;

/// Up while the process is.
pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready when the store answers. A Redis that may evict keys is named in the body, and
/// with `--require-noeviction` makes the service not ready.
pub(super) async fn readyz(State(service): State<Arc<Service>>) -> Response {
    let store = service.limiter().store();
    if let Err(e) = store.ready().await {
        let body = format!("not ready: {e}\n");
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    let eviction_risk = match store {
        AnyStore::Redis(redis) => redis.eviction().warning(),
        AnyStore::Memory(_) => None,
    };
    match eviction_risk {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(risk) if service.options().require_noeviction => {
            let body = format!("not ready (--require-noeviction): {risk}\n");
            (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
        }
        Some(risk) => (StatusCode::OK, format!("ready\nwarning: {risk}\n")).into_response(),
    }
}

/// Prometheus' text exposition.
pub(super) async fn metrics(State(service): State<Arc<Service>>) -> Response {
    let text = service.metrics().render(service.limiter());
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}
