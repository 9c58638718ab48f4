//! envoyproxy/ratelimit's protocol, mapped once: a `RateLimitRequest` in, a
//! `RateLimitResponse` out. gRPC serves the messages as they are; `POST /json` reads and
//! writes the same messages in proto3's JSON mapping ([`json`]).

pub(crate) mod json;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluicegate::{Decision, Rule, headers};

use crate::config::Entry;
use crate::limit_override::LimitOverride;
use crate::service::{DecideError, Decided, DescriptorOutcome, Service};

/// Decides one `RateLimitRequest` (how its descriptors count: `--compat`).
pub(crate) async fn should_rate_limit(
    service: &Service,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, DecideError> {
    // envoyproxy/ratelimit fails the call ("rate limit domain must not be empty",
    // envoyproxy/ratelimit@f2fb157 src/service/ratelimit.go); here it is bad input, named.
    if request.domain.is_empty() {
        return Err(DecideError::Invalid("domain: must not be empty".into()));
    }
    let asked = descriptors_of(request)?;
    // An unknown domain is OK with no limit: envoyproxy/ratelimit finds no limit for any
    // descriptor of it (envoyproxy/ratelimit@f2fb157 src/config/config_impl.go:451-457).
    let decided = match service
        .decide(
            &request.domain,
            &asked.entries,
            &asked.costs,
            &asked.overrides,
            None,
        )
        .await
    {
        Err(DecideError::UnknownDomain(_)) => Decided::unlimited(asked.entries.len()),
        decided => decided?,
    };
    Ok(response(&decided, service.options().legacy_headers))
}

/// A request's descriptors, field by field, in request order.
struct Asked {
    entries: Vec<Vec<Entry>>,
    /// The hits each adds. Envoy: a descriptor's own `hits_addend` when set, else the
    /// request's, where 0 (unset) means 1 (envoyproxy/ratelimit@f2fb157
    /// src/utils/utilities.go:75-90); 0 only looks.
    costs: Vec<u64>,
    /// Each descriptor's `limit`, numbers sent in place of the configured ones.
    overrides: Vec<Option<LimitOverride>>,
}

fn descriptors_of(request: &RateLimitRequest) -> Result<Asked, DecideError> {
    let request_cost = u64::from(request.hits_addend.max(1));
    let count = request.descriptors.len();
    let mut asked = Asked {
        entries: Vec::with_capacity(count),
        costs: Vec::with_capacity(count),
        overrides: Vec::with_capacity(count),
    };
    for (i, d) in request.descriptors.iter().enumerate() {
        asked
            .costs
            .push(d.hits_addend.map_or(request_cost, |h| h.value));
        let limit = d
            .limit
            .as_ref()
            .map(|l| LimitOverride::new(l.requests_per_unit, l.unit))
            .transpose()
            .map_err(|e| DecideError::Invalid(format!("descriptors[{i}].{e}")))?;
        asked.overrides.push(limit);
        asked.entries.push(
            d.entries
                .iter()
                .map(|e| Entry {
                    key: e.key.clone(),
                    value: e.value.clone(),
                })
                .collect(),
        );
    }
    Ok(asked)
}

/// The answer: a status per descriptor, in request order, and the headers Envoy adds.
fn response(decided: &Decided, legacy_headers: bool) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(!decided.allowed()).into(),
        statuses: decided.descriptors.iter().map(status).collect(),
        response_headers_to_add: response_headers(decided, legacy_headers),
        ..RateLimitResponse::default()
    }
}

fn code(over_limit: bool) -> Code {
    if over_limit {
        Code::OverLimit
    } else {
        Code::Ok
    }
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

fn proto_duration(micros: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(micros / 1_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from(micros % 1_000_000 * 1_000).unwrap_or(0),
    }
}

/// A count as Envoy's `uint32` fields carry it.
fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
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
    DescriptorStatus {
        code: code(!d.allowed && !descriptor.shadow).into(),
        current_limit: Some(RateLimit {
            name: rule.name().to_owned(),
            // The rate, L per W: a token bucket's burst (the decision's `limit`) is not it.
            requests_per_unit: clamp_u32(rule.limit()),
            unit: unit_of(rule.window()).into(),
        }),
        limit_remaining: clamp_u32(d.remaining),
        duration_until_reset: Some(proto_duration(d.reset_after)),
        ..DescriptorStatus::default()
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

/// `RateLimit`, `RateLimit-Policy` (and the legacy `X-RateLimit-*` when asked),
/// `Retry-After` on a refusal, and who decided; none when no enforced limit was checked.
fn response_headers(decided: &Decided, legacy_headers: bool) -> Vec<HeaderValue> {
    let Some(outcome) = &decided.outcome else {
        return Vec::new();
    };
    let limited: Vec<(&Rule, Decision)> = decided
        .descriptors
        .iter()
        .filter(|d| !d.shadow)
        .filter_map(|d| d.rule.as_ref().zip(d.decision))
        .collect();
    let decisions: Vec<Decision> = limited.iter().map(|(_, d)| *d).collect();
    let binding = limited[headers::binding_index(&outcome.decision, &decisions)].0;
    let decision = outcome.decision;
    let mut out = vec![
        header(
            "RateLimit-Policy",
            headers::ratelimit_policy(limited.iter().map(|(r, _)| *r)),
        ),
        header("RateLimit", headers::ratelimit(binding, &decision)),
    ];
    if legacy_headers {
        let reset = headers::seconds_up(decision.reset_after).to_string();
        out.push(header("X-RateLimit-Limit", decision.limit.to_string()));
        out.push(header(
            "X-RateLimit-Remaining",
            decision.remaining.to_string(),
        ));
        out.push(header("X-RateLimit-Reset", reset));
    }
    if let Some(seconds) = headers::retry_after_seconds(decision.retry_after)
        && !decision.allowed
    {
        out.push(header("Retry-After", seconds.to_string()));
    }
    out.push(header(
        "x-sluicegate-decided-by",
        outcome.decided_by.name().to_owned(),
    ));
    out
}
