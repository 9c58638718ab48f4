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
use sluicegate::internals::saturating_micros;
use sluicegate::{Decision, Rule, headers};

use crate::compat::Compat;
use crate::config::Entry;
use crate::limit_override::LimitOverride;
use crate::service::{
    DecideError, Decided, DescriptorOutcome, EnvoyHeaderNames, Modes, ResponseHeaders, Service,
    ServiceOptions,
};
use crate::telemetry::CheckSpan;

/// Decides one `RateLimitRequest` (how its descriptors count: `--compat`), what it came
/// to recorded in `span`.
pub(crate) async fn should_rate_limit(
    service: &Service,
    request: &RateLimitRequest,
    span: CheckSpan,
) -> Result<RateLimitResponse, DecideError> {
    let decided = decide(service, request).await;
    span.end(&request.domain, decided.as_ref());
    match decided {
        // A request id reused for another request is refused as over the limit: an error
        // status is what Envoy lets through by default (`failure_mode_deny: false`), and
        // the reuse would be a way around the limit.
        Err(DecideError::RequestIdConflict(_)) => Ok(conflict_response(request)),
        decided => Ok(response(&decided?, service.options())),
    }
}

/// The answer to a request whose id was used before for another request: OVER_LIMIT, and
/// every descriptor with it, nothing remaining.
fn conflict_response(request: &RateLimitRequest) -> RateLimitResponse {
    let over = || DescriptorStatus {
        code: Code::OverLimit.into(),
        ..DescriptorStatus::default()
    };
    RateLimitResponse {
        overall_code: Code::OverLimit.into(),
        statuses: request.descriptors.iter().map(|_| over()).collect(),
        ..RateLimitResponse::default()
    }
}

/// What the service decided for `request`.
async fn decide(service: &Service, request: &RateLimitRequest) -> Result<Decided, DecideError> {
    // envoyproxy/ratelimit fails the call ("rate limit domain must not be empty",
    // envoyproxy/ratelimit@f2fb157 src/service/ratelimit.go:189); here it is bad input.
    if request.domain.is_empty() {
        return Err(DecideError::Invalid("domain: must not be empty".into()));
    }
    let asked = descriptors_of(request)?;
    // An unknown domain is OK with no limit: envoyproxy/ratelimit finds no limit for any
    // descriptor of it (envoyproxy/ratelimit@f2fb157 src/config/config_impl.go:451-457).
    match service
        .decide(
            &request.domain,
            &asked.entries,
            &asked.costs,
            &asked.overrides,
            Modes::EnvoyEntries {
                reports: &asked.reports,
            },
        )
        .await
    {
        Err(DecideError::UnknownDomain(_)) => Ok(Decided::unlimited(asked.entries.len())),
        decided => decided,
    }
}

/// A request's descriptors, field by field, in request order.
struct Asked {
    entries: Vec<Vec<Entry>>,
    /// The hits each adds. Envoy: a descriptor's own `hits_addend` when set, else the
    /// request's, where 0 (unset) means 1 (envoyproxy/ratelimit@f2fb157
    /// src/utils/utilities.go:75-90); 0 only looks.
    costs: Vec<u64>,
    /// Whether each descriptor sets its own `hits_addend` above 0: on a usage rule, a
    /// report (docs/SPEC.md, "Modes").
    reports: Vec<bool>,
    /// Each descriptor's `limit`, numbers sent in place of the configured ones.
    overrides: Vec<Option<LimitOverride>>,
}

fn descriptors_of(request: &RateLimitRequest) -> Result<Asked, DecideError> {
    let request_cost = u64::from(request.hits_addend.max(1));
    let count = request.descriptors.len();
    let mut asked = Asked {
        entries: Vec::with_capacity(count),
        costs: Vec::with_capacity(count),
        reports: Vec::with_capacity(count),
        overrides: Vec::with_capacity(count),
    };
    for (i, d) in request.descriptors.iter().enumerate() {
        asked
            .costs
            .push(d.hits_addend.map_or(request_cost, |h| h.value));
        asked
            .reports
            .push(d.hits_addend.is_some_and(|h| h.value > 0));
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
fn response(decided: &Decided, options: &ServiceOptions) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = decided
        .descriptors
        .iter()
        .map(|d| status(d, options.compat))
        .collect();
    let response_headers_to_add = match options.response_headers {
        ResponseHeaders::None => Vec::new(),
        ResponseHeaders::Envoy => envoy_headers(&statuses, &options.envoy_header_names),
        ResponseHeaders::Ietf => ietf_headers(decided),
    };
    RateLimitResponse {
        // Global shadow mode: the statuses say what was over, the answer lets it through
        // (envoyproxy/ratelimit@f2fb157 src/service/ratelimit.go:266-270). A spent
        // standing after a report is no refusal.
        overall_code: code(decided.refused() && !options.shadow_mode).into(),
        statuses,
        response_headers_to_add,
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

/// The unit Envoy shows for a window, when it is exactly one (a month is 30 days and a
/// year 365, as envoyproxy/ratelimit counts them); `Unknown` otherwise (a window of 90 s
/// has none).
fn unit_of(window: u64) -> Unit {
    match window {
        1_000_000 => Unit::Second,
        60_000_000 => Unit::Minute,
        3_600_000_000 => Unit::Hour,
        86_400_000_000 => Unit::Day,
        604_800_000_000 => Unit::Week,
        2_592_000_000_000 => Unit::Month,
        31_536_000_000_000 => Unit::Year,
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

/// A descriptor's status, as envoyproxy/ratelimit gives it: a limited one always has its
/// limit and the time until it resets; nothing remains of a limit refused (in shadow mode
/// too, though let through); `name` is the configuration's, empty when it names none.
fn status(descriptor: &DescriptorOutcome, compat: Compat) -> DescriptorStatus {
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
    let (requests_per_unit, window) = match &descriptor.rule {
        // The rate, L per W: a token bucket's burst (the decision's `limit`) is not it.
        Some(rule) => (
            clamp_u32(rule.limit()),
            Some(saturating_micros(rule.window())),
        ),
        // A block: a limit of 0, in the unit it names.
        None => (0, descriptor.block_window),
    };
    DescriptorStatus {
        // Shadow mode: counted, reported, never enforced; a report, settle or refund is
        // never refused (its `limit_remaining` 0 says the key is spent).
        code: code(!d.allowed && !descriptor.shadow && descriptor.charge.may_refuse()).into(),
        current_limit: Some(RateLimit {
            name: descriptor.name.clone().unwrap_or_default(),
            requests_per_unit,
            unit: window.map_or(Unit::Unknown, unit_of).into(),
        }),
        limit_remaining: if d.allowed { clamp_u32(d.remaining) } else { 0 },
        duration_until_reset: Some(match compat {
            // envoyproxy/ratelimit counts whole seconds (utils.CalculateReset).
            Compat::Envoy => proto_duration(headers::seconds_up(d.reset_after()) * 1_000_000),
            Compat::None => proto_duration(saturating_micros(d.reset_after())),
        }),
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

/// envoyproxy/ratelimit's three headers, all from one status: the last one over its
/// limit, else the first with the least remaining; none when no status has a limit
/// (envoyproxy/ratelimit@f2fb157 src/service/ratelimit.go:206-264). The reset is whole
/// seconds, rounded up.
fn envoy_headers(statuses: &[DescriptorStatus], names: &EnvoyHeaderNames) -> Vec<HeaderValue> {
    let mut closest: Option<(&DescriptorStatus, &RateLimit)> = None;
    let mut least_remaining = u32::MAX;
    for status in statuses {
        let Some(limit) = &status.current_limit else {
            continue;
        };
        if status.code == i32::from(Code::OverLimit) {
            closest = Some((status, limit));
            least_remaining = 0;
        } else if status.limit_remaining < least_remaining {
            closest = Some((status, limit));
            least_remaining = status.limit_remaining;
        }
    }
    let Some((status, limit)) = closest else {
        return Vec::new();
    };
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
    vec![
        header(&names.limit, limit.requests_per_unit.to_string()),
        header(&names.remaining, status.limit_remaining.to_string()),
        header(&names.reset, reset.to_string()),
    ]
}

/// `RateLimit`, `RateLimit-Policy`, `Retry-After` on a refusal, and who decided; none
/// when no enforced limit was checked.
fn ietf_headers(decided: &Decided) -> Vec<HeaderValue> {
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
    if let Some(seconds) = headers::retry_after_seconds(decision.retry_after())
        && decided.refused()
    {
        out.push(header("Retry-After", seconds.to_string()));
    }
    out.push(header(
        "x-sluicegate-decided-by",
        outcome.decided_by.name().to_owned(),
    ));
    out
}
