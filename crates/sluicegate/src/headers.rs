//! The IETF rate-limit header fields (draft-ietf-httpapi-ratelimit-headers), as text, for
//! every front end that answers HTTP: `RateLimit-Policy` and `RateLimit`, Structured
//! Fields syntax.

use std::time::Duration;

use crate::decision::{Decision, RetryAfter};
use crate::rule::Rule;

/// Whole seconds, rounded up: what a header field that counts in seconds says of a time.
pub fn seconds_up(time: Duration) -> u64 {
    time.as_secs() + u64::from(time.subsec_nanos() > 0)
}

/// `Retry-After` of a refusal, in whole seconds rounded up and never 0 (a client told to
/// retry after 0 s would retry at once and be refused again); `None` when it can never
/// pass.
pub fn retry_after_seconds(retry: RetryAfter) -> Option<u64> {
    match retry {
        RetryAfter::After(wait) => Some(seconds_up(wait).max(1)),
        RetryAfter::Never => None,
    }
}

/// A Structured Fields string: printable ASCII with `"` and `\` escaped; anything else in
/// a rule's name becomes `_`.
pub fn structured_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

/// `RateLimit-Policy`: every rule, `"name";q=quota;w=window seconds`.
pub fn ratelimit_policy<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> String {
    rules
        .into_iter()
        .map(|rule| {
            format!(
                "{};q={};w={}",
                structured_string(rule.name()),
                rule.capacity(),
                seconds_up(rule.window())
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `RateLimit`: the binding rule's `"name";r=remaining;t=seconds until reset`.
pub fn ratelimit(rule: &Rule, decision: &Decision) -> String {
    format!(
        "{};r={};t={}",
        structured_string(rule.name()),
        decision.remaining,
        seconds_up(decision.reset_after())
    )
}

/// Which of a check's limits the combined decision reports (least remaining, then the
/// smallest limit): the one `RateLimit` names.
pub fn binding_index(combined: &Decision, limits: &[Decision]) -> usize {
    limits
        .iter()
        .position(|d| (d.remaining, d.limit) == (combined.remaining, combined.limit))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::RetryAfter;
    use crate::rule::{Algorithm, RuleSpec};

    #[test]
    fn fields_follow_the_draft_syntax() {
        assert_eq!(structured_string("per-ip"), "\"per-ip\"");
        assert_eq!(structured_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(structured_string("ключ"), "\"____\"");
        let rule = Rule::new(
            "per-ip",
            &RuleSpec::new(
                Algorithm::SlidingLog,
                100,
                Duration::from_micros(90_000_001),
            ),
        )
        .unwrap();
        assert_eq!(ratelimit_policy([&rule]), "\"per-ip\";q=100;w=91");
        let d = Decision {
            allowed: true,
            limit: 100,
            remaining: 7,
            retry_after: RetryAfter::micros(0),
            reset_after: 1,
            delay: 0,
        };
        assert_eq!(ratelimit(&rule, &d), "\"per-ip\";r=7;t=1");
        assert_eq!(seconds_up(Duration::from_micros(1_000_001)), 2);
    }
}
