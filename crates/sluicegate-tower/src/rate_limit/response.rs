//! What a rate-limited service answers: the IETF `RateLimit` and `RateLimit-Policy`
//! fields (draft-ietf-httpapi-ratelimit-headers, Structured Fields syntax), the legacy
//! `X-RateLimit-*` trio, `Retry-After`, and an RFC 9457 problem body.

use axum_core::body::Body;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use sluicegate::headers;
use sluicegate::{Outcome, Rule};

/// `RateLimit-Policy` for every limit of the route.
pub(crate) fn policy_header(rules: &[Rule]) -> Option<HeaderValue> {
    HeaderValue::from_str(&headers::ratelimit_policy(rules)).ok()
}

/// Adds `RateLimit` (and `RateLimit-Policy`, and the legacy trio when asked) for `outcome`.
pub(crate) fn add_headers(
    map: &mut HeaderMap,
    rules: &[Rule],
    outcome: &Outcome,
    policy: Option<&HeaderValue>,
    legacy: bool,
) {
    let decision = outcome.decision;
    let rule = &rules[headers::binding_index(&decision, outcome.limits())];
    let reset = headers::seconds_up(decision.reset_after());
    if let Ok(value) = HeaderValue::from_str(&headers::ratelimit(rule, &decision)) {
        map.insert("ratelimit", value);
    }
    if let Some(policy) = policy {
        map.insert("ratelimit-policy", policy.clone());
    }
    if legacy {
        map.insert("x-ratelimit-limit", decision.limit.into());
        map.insert("x-ratelimit-remaining", decision.remaining.into());
        map.insert("x-ratelimit-reset", reset.into());
    }
}

/// Whether the request is a gRPC call, which must be refused the gRPC way.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The refusal: 429 with `Retry-After` and a problem body naming the violated policies,
/// or, for gRPC, status RESOURCE_EXHAUSTED with the same retry information.
pub(crate) fn rejection(rules: &[Rule], outcome: &Outcome, grpc: bool) -> Response<Body> {
    let violated: Vec<&str> = rules
        .iter()
        .zip(outcome.limits())
        .filter(|(_, d)| !d.allowed)
        .map(|(rule, _)| rule.name())
        .collect();
    let retry_seconds = headers::retry_after_seconds(outcome.decision.retry_after());
    let detail = match retry_seconds {
        Some(s) => format!(
            "rate limit {} exceeded; retry in {s} s",
            violated.join(", ")
        ),
        None => format!(
            "rate limit {} exceeded; this request costs more than the limit allows",
            violated.join(", ")
        ),
    };
    let mut response = if grpc {
        grpc_status(GRPC_RESOURCE_EXHAUSTED, &detail)
    } else {
        let body = serde_json::json!({
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": detail,
            "violated_policies": violated,
            "retry_after": retry_seconds,
        });
        let mut response = Response::new(Body::from(body.to_string()));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    };
    if let Some(seconds) = retry_seconds {
        response.headers_mut().insert(RETRY_AFTER, seconds.into());
    }
    response
}

/// A problem response for something other than a refusal (a key that cannot be extracted,
/// a store that cannot decide).
pub(crate) fn problem(status: StatusCode, title: &str, detail: &str, grpc: bool) -> Response<Body> {
    if grpc {
        let code = match status {
            StatusCode::BAD_REQUEST => "3",          // INVALID_ARGUMENT
            StatusCode::UNAUTHORIZED => "16",        // UNAUTHENTICATED
            StatusCode::SERVICE_UNAVAILABLE => "14", // UNAVAILABLE
            _ => "13",                               // INTERNAL
        };
        return grpc_status(code, detail);
    }
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

const GRPC_RESOURCE_EXHAUSTED: &str = "8";

/// A trailers-only gRPC answer: HTTP 200 whose headers carry the gRPC status and message.
fn grpc_status(code: &'static str, message: &str) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static(code));
    if let Ok(message) = HeaderValue::from_str(&grpc_percent_encode(message)) {
        headers.insert("grpc-message", message);
    }
    response
}

/// gRPC's grpc-message encoding: percent-encode what is not printable ASCII, and `%`.
fn grpc_percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (b' '..=b'~').contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_percent_encode("50% off é"), "50%25 off %C3%A9");
    }
}
