//! `POST /json`, as envoyproxy/ratelimit answers it: a RateLimitRequest in proto3's JSON
//! mapping in, the RateLimitResponse out, status 429 when over the limit.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use super::body::Body;
use super::error::ApiError;
use super::span::HttpSpan;
use crate::envoy;
use crate::service::Service;

pub(super) async fn envoy_json(
    State(service): State<Arc<Service>>,
    HttpSpan(span): HttpSpan,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let request = envoy::json::request(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    let response = envoy::should_rate_limit(&service, &request, span).await?;
    let status = if response.overall_code == i32::from(Code::OverLimit) {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(envoy::json::response(&response))).into_response())
}
