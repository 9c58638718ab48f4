//! `POST /v1/explain`: what `/v1/check` would answer for the same body, and why, read
//! without changing any state (service/explain.rs).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use sluicegate::internals::{saturating_micros, signed_micros};
use sluicegate::{Algorithm, Outcome, RetryAfter, Rule};

use super::body::Body;
use super::check::CheckRequest;
use super::error::ApiError;
use crate::compat::Counting;
use crate::service::Service;
use crate::service::explain::{DescriptorExplained, Match, available};

pub(super) async fn explain(
    State(service): State<Arc<Service>>,
    Body(body): Body,
) -> Result<Json<Value>, ApiError> {
    let request: CheckRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid explain request: {e}")))?;
    let explained = service
        .explain(&request.domain, &request.descriptors(), request.cost)
        .await?;
    let refused_by: Vec<&str> = explained
        .descriptors
        .iter()
        .filter(|d| d.would_refuse && !d.shadow)
        .filter_map(|d| d.path.as_deref())
        .collect();
    let summary = if explained.allowed {
        format!("a cost of {} would be admitted", request.cost)
    } else {
        format!(
            "a cost of {} would be refused by {}",
            request.cost,
            refused_by.join(", ")
        )
    };
    Ok(Json(json!({
        "allowed": explained.allowed,
        "refused_by": refused_by,
        "summary": summary,
        "counting": counting_name(explained.counting),
        "descriptors": explained.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
    })))
}

fn counting_name(counting: Counting) -> &'static str {
    match counting {
        Counting::AllOrNothing => "all-or-nothing",
        Counting::EachDescriptor => "each-descriptor",
        Counting::StopIncrementWhenOverLimit => "stop-increment-when-over-limit",
    }
}

fn descriptor(d: &DescriptorExplained) -> Value {
    let (kind, why) = match &d.matched {
        Match::Rule(_) => ("rule", None),
        Match::Unlimited => (
            "unlimited",
            Some("the rule is unlimited: it never refuses".to_owned()),
        ),
        Match::Block => (
            "block",
            Some("the rule's requests_per_unit is 0: it refuses every request".to_owned()),
        ),
        Match::Replaced { path, by } => (
            "replaced",
            Some(format!(
                "it matched {path}, which {by} replaces for this request"
            )),
        ),
        Match::Nothing(why) => ("none", Some(format!("no rule matched: {why}"))),
    };
    let mut body = json!({
        "entries": d.entries,
        "match": kind,
        "rule": d.path,
        "would_refuse": d.would_refuse,
    });
    let fields = body.as_object_mut().expect("a JSON object");
    if let Some(why) = why {
        fields.insert("why".into(), why.into());
    }
    if let Some(name) = &d.name {
        fields.insert("name".into(), name.clone().into());
    }
    if d.shadow {
        fields.insert("shadow_mode".into(), true.into());
    }
    if let (Match::Rule(rule), Some(state)) = (&d.matched, &d.state) {
        fields.insert("units".into(), d.units.into());
        fields.insert("numbers".into(), numbers(rule));
        fields.insert(
            "state".into(),
            state_body(rule, state, d.units, d.would_refuse),
        );
    }
    body
}

/// The rule's algorithm and parameters, as configured.
fn numbers(rule: &Rule) -> Value {
    let spec = rule.spec();
    let mut numbers = json!({
        "algorithm": spec.algorithm.name(),
        "limit": spec.limit,
        "window_us": saturating_micros(spec.window),
    });
    let fields = numbers.as_object_mut().expect("a JSON object");
    for (name, value) in [
        ("buckets", spec.buckets),
        ("burst", spec.burst),
        ("queue", spec.queue),
    ] {
        if let Some(value) = value {
            fields.insert(name.into(), value.into());
        }
    }
    numbers
}

/// A peek's answer in numbers and words, and whether `units` would be refused.
fn state_body(rule: &Rule, state: &Outcome, units: u64, would_refuse: bool) -> Value {
    let d = state.decision;
    let available = available(state);
    let in_use = d.limit.saturating_sub(available);
    let next_free = match d.retry_after() {
        _ if d.allowed => "a unit is free now".to_owned(),
        RetryAfter::After(wait) => format!(
            "the next unit frees in {}",
            duration(saturating_micros(wait))
        ),
        RetryAfter::Never => "no unit will ever free".to_owned(),
    };
    let verdict = if would_refuse {
        format!("{units} would not fit")
    } else {
        format!("{units} would fit")
    };
    // A peek answers as a cost of 1: when it fits, its reset counts that unit taken.
    let reset = if d.allowed {
        format!(
            "with one more unit, empty again in {}",
            duration(saturating_micros(d.reset_after()))
        )
    } else {
        format!(
            "empty again in {}",
            duration(saturating_micros(d.reset_after()))
        )
    };
    let words = format!(
        "{in_use} of {} in use, {available} available; {next_free}; {reset}; {verdict}",
        d.limit
    );
    let mut body = json!({
        "capacity": d.limit,
        "in_use": in_use,
        "available": available,
        "retry_after_us": if d.allowed { 0 } else { signed_micros(d.retry_after()) },
        "reset_after_us": saturating_micros(d.reset_after()),
        "decided_by": state.decided_by.name(),
        "words": words,
    });
    if rule.algorithm() == Algorithm::SlidingCounter {
        // The stores answer the estimate only through `remaining`.
        body.as_object_mut().expect("a JSON object").insert(
            "estimate".into(),
            json!({
                "shown": "in_use is the estimate rounded up (limit - available); \
                          the stores do not report its parts (the full buckets' sum and the \
                          weighted bucket sliding out)",
                "rounded_up": in_use,
            }),
        );
    }
    body
}

/// µs as people read them: `250ms`, `1.5s`.
fn duration(us: u64) -> String {
    if us < 1_000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        format!("{}ms", us / 1_000)
    } else {
        format!("{:.1}s", us as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests;
