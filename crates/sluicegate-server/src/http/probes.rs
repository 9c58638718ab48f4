//! What monitoring calls: `GET /healthz`, `GET /readyz`, `GET /metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::service::Service;

/// Up while the process is.
pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready when the store answers.
pub(super) async fn readyz(State(service): State<Arc<Service>>) -> Response {
    match service.limiter().store().ready().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(e) => {
            let body = format!("not ready: {e}\n");
            (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
        }
    }
}

/// Prometheus' text exposition.
pub(super) async fn metrics(State(service): State<Arc<Service>>) -> Response {
    let text = service.metrics().render(service.limiter());
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}
