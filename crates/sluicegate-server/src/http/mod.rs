//! The HTTP JSON API — `POST /v1/check`, `POST /v1/explain`, `POST /json`, `POST /v1/reset`, `GET /v1/rules`,
//! `GET /v1/top`, `GET /v1/overview`, `GET /ui`, `GET /healthz`, `GET /readyz`,
//! `GET /healthcheck`, `GET /metrics` — and the gRPC services beside it on the same port.
//! A path none of them has answers 404 (a gRPC call UNIMPLEMENTED), so a mistyped probe
//! fails rather than passes.

mod admin;
mod body;
mod check;
mod envoy_json;
mod error;
mod explain;
mod probes;
mod reads;
mod span;
mod top;
mod ui;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

pub(crate) use self::error::ApiError;
use crate::service::Service;
use crate::telemetry::Telemetry;

/// The service's routes: the HTTP API, and the gRPC services on the same port (gRPC
/// needs HTTP/2, which the server speaks alongside HTTP/1.1) unless `with_grpc` is false:
/// then gRPC is served only on a TLS listener of its own, and a gRPC call here answers
/// PERMISSION_DENIED saying so, rather than be served in plaintext past that TLS (and its
/// client certificates). Checks are traced to `telemetry`.
pub(crate) fn app(service: Arc<Service>, telemetry: Telemetry, with_grpc: bool) -> Router {
    let grpc = crate::grpc::router(Arc::clone(&service), telemetry.clone());
    let api = Router::new()
        .route("/v1/check", post(check::check))
        .route("/json", post(envoy_json::envoy_json))
        .route("/v1/reset", post(admin::reset))
        .merge(monitoring())
        .merge(
            value_reads().route_layer(axum::middleware::from_fn_with_state(
                Arc::clone(&service),
                reads::guard,
            )),
        )
        .with_state(service)
        .layer(axum::extract::DefaultBodyLimit::max(body::MAX_BODY_BYTES));
    let api = span::traced(api, telemetry);
    if with_grpc {
        api.merge(grpc).fallback(unknown_path)
    } else {
        api.fallback(grpc_elsewhere)
    }
}

/// The gRPC services alone, for a listener of their own.
pub(crate) fn grpc_only(service: Arc<Service>, telemetry: Telemetry) -> Router {
    crate::grpc::router(service, telemetry).fallback(unknown_path)
}

/// What an operator's listener serves (envoyproxy/ratelimit's debug port): the probes,
/// the metrics, the loaded rules, and what shows request values (the live page, the top
/// offenders, explain) to anyone who reaches it; nothing that decides or forgets.
pub(crate) fn debug(service: Arc<Service>) -> Router {
    monitoring()
        .merge(value_reads())
        .with_state(service)
        .layer(axum::extract::DefaultBodyLimit::max(body::MAX_BODY_BYTES))
        .fallback(unknown_path)
}

/// `/metrics` alone, for a scraper's own listener.
pub(crate) fn metrics_only(service: Arc<Service>) -> Router {
    Router::new()
        .route("/metrics", get(probes::metrics))
        .with_state(service)
        .fallback(unknown_path)
}

/// The routes every HTTP listener but the gRPC and metrics ones has, open to all: the
/// rules are the configuration, no request's values.
fn monitoring() -> Router<Arc<Service>> {
    Router::new()
        .route("/v1/rules", get(admin::rules))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/healthcheck", get(probes::healthcheck))
        .route("/metrics", get(probes::metrics))
}

/// The routes that show request values: guarded on the main listener ([`reads::guard`]),
/// open on the debug listener.
fn value_reads() -> Router<Arc<Service>> {
    Router::new()
        .route("/v1/top", get(top::top))
        .route("/v1/overview", get(ui::overview))
        .route("/ui", get(ui::page))
        .route("/v1/explain", post(explain::explain))
}

/// The request is a gRPC call.
fn is_grpc(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// A listener without gRPC: a gRPC call is told where it is served; anything else is an
/// unknown path.
async fn grpc_elsewhere(request: Request) -> Response {
    if is_grpc(&request) {
        return crate::grpc::served_elsewhere().into_response();
    }
    unknown_path(request).await
}

/// No route has this path: 404 with the API's error body, or UNIMPLEMENTED to a gRPC
/// client (which reads the status from the trailers, not the HTTP status).
async fn unknown_path(request: Request) -> Response {
    let grpc = is_grpc(&request);
    let path = request.uri().path();
    if grpc {
        return crate::grpc::unimplemented(path).into_response();
    }
    ApiError::new(StatusCode::NOT_FOUND, format!("no such path: {path}")).into_response()
}

#[cfg(test)]
pub(super) mod tests;

#[cfg(test)]
mod detailed_metric_tests;
