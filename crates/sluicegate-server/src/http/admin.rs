//! What operators call: `POST /v1/reset` (behind the admin token) and `GET /v1/rules`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sluicegate::Rule;
use sluicegate::internals::saturating_micros;

use super::body::Body;
use super::check::CheckRequest;
use super::error::ApiError;
use crate::service::Service;

/// `POST /v1/reset`: forget the state of every limit a request's descriptors match, as
/// if they had never been used. Admin only: needs `Authorization: Bearer <token>` with
/// the token given to `--admin-token`; without one configured the endpoint is off.
pub(super) async fn reset(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let Some(token) = service.options().admin_token.as_deref() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "reset is off: start the server with --admin-token to enable it",
        ));
    };
    let presented = super::reads::bearer(&headers);
    if !presented.is_some_and(|p| constant_time_eq(p.as_bytes(), token.as_bytes())) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "reset needs Authorization: Bearer <admin token>",
        ));
    }
    let request: CheckRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid reset request: {e}")))?;
    let forgotten = service
        .forget(&request.domain, &request.descriptors())
        .await?;
    Ok(axum::Json(serde_json::json!({ "reset": forgotten })).into_response())
}

/// Compares secrets in time that does not depend on where they differ.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Serialize)]
pub(super) struct RuleBody {
    path: String,
    /// Null for an unlimited rule and a block.
    algorithm: Option<String>,
    /// L: units per window.
    limit: Option<u64>,
    /// The most units one check can take (a token bucket's burst, a leaky bucket's
    /// queue + 1; L otherwise): the `limit` its decisions report.
    capacity: Option<u64>,
    window_us: Option<u64>,
}

/// The header of `GET /v1/rules` that names the configuration's version (1 at start,
/// one more per reload or xDS push).
const CONFIG_VERSION_HEADER: &str = "sluicegate-config-version";

/// The header of `GET /v1/rules` that names an xDS configuration's `version_info`.
const XDS_VERSION_HEADER: &str = "sluicegate-xds-version";

/// `GET /v1/rules`: the loaded rules; their version in headers.
pub(super) async fn rules(State(service): State<Arc<Service>>) -> Response {
    let live = service.live();
    let mut headers = HeaderMap::new();
    headers.insert(CONFIG_VERSION_HEADER, live.version.into());
    // A version_info that is no header value (bytes outside visible ASCII) is left out.
    if let Some(version) = live
        .source_version
        .as_deref()
        .and_then(|v| v.parse::<axum::http::HeaderValue>().ok())
    {
        headers.insert(XDS_VERSION_HEADER, version);
    }
    let rules = live
        .config
        .limits()
        .into_iter()
        .map(|l| RuleBody {
            path: l.path.clone(),
            algorithm: l.rule.as_ref().map(|r| r.algorithm().to_string()),
            // A block: no request per window.
            limit: l
                .rule
                .as_ref()
                .map(Rule::limit)
                .or(l.blocked().then_some(0)),
            capacity: l.rule.as_ref().map(Rule::capacity),
            window_us: l
                .rule
                .as_ref()
                .map(|rule| saturating_micros(rule.window()))
                .or(l.block_window),
        })
        .collect::<Vec<RuleBody>>();
    (headers, axum::Json(rules)).into_response()
}
