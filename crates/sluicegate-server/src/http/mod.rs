//! The HTTP JSON API — `POST /v1/check`, `POST /json`, `POST /v1/reset`, `GET /v1/rules`, `GET /v1/top`, `GET /v1/overview`, `GET /ui`,
//! `GET /healthz`, `GET /readyz`, `GET /metrics` — and the gRPC rate-limit service beside
//! it on the same port.

mod admin;
mod body;
mod check;
mod envoy_json;
mod error;
mod probes;
mod top;
mod ui;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

pub(crate) use self::error::ApiError;
use crate::service::Service;

/// The service's routes: the HTTP API, and Envoy's gRPC rate-limit service on the same
/// port (gRPC needs HTTP/2, which the server speaks alongside HTTP/1.1).
pub(crate) fn app(service: Arc<Service>) -> Router {
    let grpc = crate::grpc::router(Arc::clone(&service));
    Router::new()
        .route("/v1/check", post(check::check))
        .route("/json", post(envoy_json::envoy_json))
        .route("/v1/reset", post(admin::reset))
        .route("/v1/rules", get(admin::rules))
        .route("/v1/top", get(top::top))
        .route("/v1/overview", get(ui::overview))
        .route("/ui", get(ui::page))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics))
        .with_state(service)
        .layer(axum::extract::DefaultBodyLimit::max(body::MAX_BODY_BYTES))
        .merge(grpc)
}

#[cfg(test)]
mod tests;
