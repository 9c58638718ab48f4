//! `POST /v1/check`: sluicegate's own JSON API.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sluicegate::internals::{saturating_micros, signed_micros};
use sluicegate::{Charge, Decision};

use super::body::Body;
use super::error::ApiError;
use super::span::HttpSpan;
use crate::config::Entry;
use crate::service::{Modes, Service};

/// A `/v1/check` body (and `/v1/reset`'s, which names limits the same way).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CheckRequest {
    pub(super) domain: String,
    descriptors: Vec<RequestDescriptor>,
    #[serde(default = "one")]
    pub(super) cost: u64,
    request_id: Option<String>,
    /// `check` (the default), `reserve`, `report`, `settle` or `refund`.
    mode: Option<String>,
}

impl CheckRequest {
    pub(super) fn descriptors(&self) -> Vec<Vec<Entry>> {
        self.descriptors.iter().map(|d| d.entries.clone()).collect()
    }

    /// The mode and request id every descriptor is decided in; an unknown mode is bad
    /// input that names the field.
    fn modes(&self) -> Result<Modes<'_>, ApiError> {
        let charge = match self.mode.as_deref() {
            None => Charge::Check,
            Some(name) => Charge::from_name(name).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "mode: unknown mode {name:?}; expected {}",
                    Charge::NAMES
                ))
            })?,
        };
        Ok(Modes::Given {
            charge,
            request_id: self.request_id.as_deref(),
        })
    }
}

fn one() -> u64 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestDescriptor {
    entries: Vec<Entry>,
}

/// A decision as JSON. `retry_after_us` is -1 for never, as in the replay format.
#[derive(Serialize, Debug, PartialEq)]
struct DecisionBody {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after_us: i64,
    reset_after_us: u64,
    delay_us: u64,
}

impl From<Decision> for DecisionBody {
    fn from(d: Decision) -> Self {
        DecisionBody {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_us: signed_micros(d.retry_after()),
            reset_after_us: saturating_micros(d.reset_after()),
            delay_us: saturating_micros(d.delay()),
        }
    }
}

/// Each request descriptor's own answer, in request order.
#[derive(Serialize)]
struct DescriptorBody {
    /// The matched configuration path, or null when nothing matched.
    rule: Option<String>,
    /// The rule's decision; null when no rule or an `unlimited` one matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    decision: Option<DecisionBody>,
    /// The rule is in shadow mode: its decision is reported, never enforced.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadow_mode: bool,
}

#[derive(Serialize)]
struct CheckResponse {
    allowed: bool,
    /// `store`, `lease`, `negative-cache`, or the fallback policy that decided.
    decided_by: &'static str,
    /// The combined decision; null when no descriptor matched a limited rule.
    decision: Option<DecisionBody>,
    descriptors: Vec<DescriptorBody>,
}

pub(super) async fn check(
    State(service): State<Arc<Service>>,
    HttpSpan(span): HttpSpan,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let request: CheckRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid check request: {e}")))?;
    let modes = request.modes()?;
    let descriptors = request.descriptors();
    let decided = service
        .decide(
            &request.domain,
            &descriptors,
            &vec![request.cost; descriptors.len()],
            &[],
            modes,
        )
        .await;
    span.end(&request.domain, decided.as_ref());
    let decided = decided?;
    let descriptors = decided
        .descriptors
        .iter()
        .map(|d| DescriptorBody {
            rule: d.path.clone(),
            decision: d.decision.map(Into::into),
            shadow_mode: d.shadow,
        })
        .collect();
    let decided_by = decided
        .outcome
        .as_ref()
        .map_or("store", |o| o.decided_by.name());
    let response = CheckResponse {
        allowed: decided.allowed(),
        decided_by,
        decision: decided.outcome.map(|o| o.decision.into()),
        descriptors,
    };
    let mut response = axum::Json(response).into_response();
    response.headers_mut().insert(
        "x-sluicegate-decided-by",
        axum::http::HeaderValue::from_static(decided_by),
    );
    Ok(response)
}
