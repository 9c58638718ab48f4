//! Envoy's rate-limit service, v3: `envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`, served on the same port as the HTTP API.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluicegate::{Decision, Rule, headers};
use tonic::{Request, Response, Status};

use crate::config::Entry;
use crate::decide::{DecideError, DescriptorOutcome, decide};
use crate::http::AppState;

/// The RLS service over the shared state.
pub(crate) struct Rls {
    state: AppState,
}

/// The gRPC service as a router, to serve on its own or beside the HTTP API.
pub(crate) fn router(state: AppState) -> axum::Router {
    tonic::service::Routes::new(RateLimitServiceServer::new(Rls { state })).into_axum_router()
}

/// The unit Envoy shows for a window, when it is exactly one; `Unknown` otherwise (a
/// window of 90 s has none).
fn unit_of(window: u64) -> Unit {
    match window {
        1_000_000 => Unit::Second,
        60_000_000 => Unit::Minute,
        3_600_000_000 => Unit::Hour,
        86_400_000_000 => Unit::Day,
        _ => Unit::Unknown,
    }
}

/// The unit's name in proto3's JSON mapping, for `/json`.
pub(crate) fn unit_name(window: u64) -> &'static str {
    unit_of(window).as_str_name()
}

fn proto_duration(micros: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(micros / 1_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from(micros % 1_000_000 * 1_000).unwrap_or(0),
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

fn status(descriptor: &DescriptorOutcome) -> DescriptorStatus {
    if descriptor.unlimited {
        // As envoyproxy/ratelimit answers an unlimited descriptor.
        return DescriptorStatus {
            code: Code::Ok.into(),
            limit_remaining: u32::MAX,
            ..DescriptorStatus::default()
        };
    }
    let Some(d) = descriptor.decision.as_ref() else {
        return DescriptorStatus {
            code: Code::Ok.into(),
            ..DescriptorStatus::default()
        };
    };
    let Some(rule) = descriptor.rule.as_ref() else {
        // A block: over the limit, with a limit of 0.
        return DescriptorStatus {
            code: Code::OverLimit.into(),
            current_limit: Some(RateLimit {
                name: descriptor.path.clone().unwrap_or_default(),
                requests_per_unit: 0,
                unit: Unit::Unknown.into(),
            }),
            ..DescriptorStatus::default()
        };
    };
    // Shadow mode: counted, reported, never enforced.
    let over = !d.allowed && !descriptor.shadow;
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok }.into(),
        current_limit: Some(RateLimit {
            name: rule.name().to_owned(),
            requests_per_unit: u32::try_from(d.limit).unwrap_or(u32::MAX),
            unit: unit_of(rule.window()).into(),
        }),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(proto_duration(d.reset_after)),
        ..DescriptorStatus::default()
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        // Envoy: an unset hits_addend means 1. One check has one cost, so descriptors
        // asking for different ones cannot be decided together.
        let request_cost = u64::from(request.hits_addend.max(1));
        let mut cost = None;
        let mut descriptors = Vec::with_capacity(request.descriptors.len());
        for (i, d) in request.descriptors.iter().enumerate() {
            let own = d.hits_addend.map_or(request_cost, |h| h.value);
            if *cost.get_or_insert(own) != own {
                return Err(Status::invalid_argument(format!(
                    "descriptors[{i}].hits_addend: every descriptor of one request must add \
                     the same number of hits"
                )));
            }
            if d.limit.is_some() {
                return Err(Status::invalid_argument(format!(
                    "descriptors[{i}].limit: per-request limit overrides are not supported; \
                     configure the rule instead"
                )));
            }
            let entries: Vec<Entry> = d
                .entries
                .iter()
                .map(|e| Entry {
                    key: e.key.clone(),
                    value: e.value.clone(),
                })
                .collect();
            descriptors.push(entries);
        }
        let decided = decide(
            &self.state,
            &request.domain,
            &descriptors,
            cost.unwrap_or(request_cost),
            None,
        )
        .await
        .map_err(|e| match e {
            DecideError::Invalid(message) => Status::invalid_argument(message),
            DecideError::Store(e) => Status::unavailable(e.to_string()),
        })?;
        let statuses: Vec<DescriptorStatus> = decided.descriptors.iter().map(status).collect();
        let mut response_headers = Vec::new();
        if let Some(outcome) = &decided.outcome {
            let limited: Vec<(&Rule, Decision)> = decided
                .descriptors
                .iter()
                .filter(|d| !d.shadow)
                .filter_map(|d| d.rule.as_ref().zip(d.decision))
                .collect();
            let decisions: Vec<Decision> = limited.iter().map(|(_, d)| *d).collect();
            let binding = limited[headers::binding_index(&outcome.decision, &decisions)].0;
            response_headers.push(header(
                "RateLimit-Policy",
                headers::ratelimit_policy(limited.iter().map(|(r, _)| *r)),
            ));
            let decision = outcome.decision;
            response_headers.push(header("RateLimit", headers::ratelimit(binding, &decision)));
            if self.state.legacy_headers {
                let reset = headers::seconds_up(decision.reset_after).to_string();
                response_headers.push(header("X-RateLimit-Limit", decision.limit.to_string()));
                response_headers.push(header(
                    "X-RateLimit-Remaining",
                    decision.remaining.to_string(),
                ));
                response_headers.push(header("X-RateLimit-Reset", reset));
            }
            if let sluicegate::RetryAfter::Micros(us) = outcome.decision.retry_after
                && !outcome.decision.allowed
            {
                response_headers.push(header(
                    "Retry-After",
                    headers::seconds_up(us).max(1).to_string(),
                ));
            }
            response_headers.push(header(
                "x-sluicegate-decided-by",
                outcome.decided_by.name().to_owned(),
            ));
        }
        Ok(Response::new(RateLimitResponse {
            overall_code: if decided.allowed() {
                Code::Ok
            } else {
                Code::OverLimit
            }
            .into(),
            statuses,
            response_headers_to_add: response_headers,
            ..RateLimitResponse::default()
        }))
    }
}
