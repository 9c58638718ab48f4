//! One rate-limit request, whatever protocol brought it: a domain and descriptors in, the
//! matched rules' decisions out. HTTP and gRPC both call [`decide`].

use sluicegate::{Check, Decision, Limit, Outcome, Rule, StoreError};

use crate::config::{Entry, UnknownDomain};
use crate::http::AppState;

/// What became of each request descriptor.
pub(crate) struct DescriptorOutcome {
    /// The matched configuration path; `None` when nothing matched.
    pub(crate) path: Option<String>,
    /// The matched rule, `None` for `unlimited` (or no match).
    pub(crate) rule: Option<Rule>,
    /// The rule's decision; `None` when no limited rule matched.
    pub(crate) decision: Option<Decision>,
}

/// The answer to one request.
pub(crate) struct Decided {
    pub(crate) descriptors: Vec<DescriptorOutcome>,
    /// `None` when no descriptor matched a limited rule.
    pub(crate) outcome: Option<Outcome>,
}

impl Decided {
    pub(crate) fn allowed(&self) -> bool {
        self.outcome.as_ref().is_none_or(|o| o.decision.allowed)
    }
}

/// Why a request could not be decided.
pub(crate) enum DecideError {
    /// The request is malformed: say what is wrong.
    Invalid(String),
    /// The store could not decide and no policy decided for it.
    Store(StoreError),
}

impl From<StoreError> for DecideError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidCheck(message) => DecideError::Invalid(message),
            other => DecideError::Store(other),
        }
    }
}

/// The identity of a request descriptor within its rule: every entry, length-prefixed, so
/// that no two different descriptors encode alike whatever characters they hold.
pub(crate) fn descriptor_key(entries: &[Entry]) -> String {
    let mut key = String::new();
    for entry in entries {
        for part in [&entry.key, &entry.value] {
            key.push_str(&part.len().to_string());
            key.push(':');
            key.push_str(part);
        }
    }
    key
}

/// The most descriptors one request may carry.
pub(crate) const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry.
pub(crate) const MAX_ENTRIES: usize = 16;
/// The longest key or value of an entry, in bytes.
pub(crate) const MAX_ENTRY_BYTES: usize = 1024;

/// Matches every descriptor and decides all the limited ones in one check, all-or-nothing.
/// Two descriptors that land on the same rule and key share one limit and one answer.
pub(crate) async fn decide(
    state: &AppState,
    domain: &str,
    descriptors: &[Vec<Entry>],
    cost: u64,
    request_id: Option<&str>,
) -> Result<Decided, DecideError> {
    if descriptors.is_empty() {
        return Err(DecideError::Invalid(
            "descriptors: at least one is required".into(),
        ));
    }
    if descriptors.len() > MAX_DESCRIPTORS {
        return Err(DecideError::Invalid(format!(
            "descriptors: {} given, at most {MAX_DESCRIPTORS} allowed",
            descriptors.len()
        )));
    }
    for (i, entries) in descriptors.iter().enumerate() {
        if entries.is_empty() || entries.len() > MAX_ENTRIES {
            return Err(DecideError::Invalid(format!(
                "descriptors[{i}].entries: 1 to {MAX_ENTRIES} entries are required, {} given",
                entries.len()
            )));
        }
        for (j, entry) in entries.iter().enumerate() {
            for (field, text) in [("key", &entry.key), ("value", &entry.value)] {
                if text.len() > MAX_ENTRY_BYTES {
                    return Err(DecideError::Invalid(format!(
                        "descriptors[{i}].entries[{j}].{field}: {} bytes, at most \
                         {MAX_ENTRY_BYTES} allowed",
                        text.len()
                    )));
                }
            }
        }
    }
    let config = state.config.current();
    let mut matched: Vec<(Option<String>, Option<Rule>)> = Vec::new();
    for entries in descriptors {
        let limit = config.find(domain, entries).map_err(|UnknownDomain| {
            DecideError::Invalid(format!("domain: unknown domain {domain:?}"))
        })?;
        matched.push(limit.map_or((None, None), |l| (Some(l.path.clone()), l.rule.clone())));
    }
    let keys: Vec<String> = descriptors.iter().map(|d| descriptor_key(d)).collect();
    let mut limits: Vec<Limit<'_>> = Vec::new();
    let mut limit_of: Vec<Option<usize>> = Vec::new();
    for ((_, rule), key) in matched.iter().zip(&keys) {
        let slot = rule.as_ref().map(|rule| {
            limits
                .iter()
                .position(|l| l.key == key && l.rule.same_identity(rule))
                .unwrap_or_else(|| {
                    limits.push(Limit { rule, key });
                    limits.len() - 1
                })
        });
        limit_of.push(slot);
    }
    let outcome = if limits.is_empty() {
        None
    } else {
        let check = Check {
            request_id,
            ..Check::new(&limits, cost)
        };
        let started = std::time::Instant::now();
        let outcome = state.limiter.decide(&check).await?;
        state.metrics.check(outcome.decided_by, started.elapsed());
        Some(outcome)
    };
    let descriptors = matched
        .into_iter()
        .zip(&limit_of)
        .map(|((path, rule), slot)| {
            let decision = slot.zip(outcome.as_ref()).map(|(i, o)| o.limits()[i]);
            if let (Some(path), Some(decision)) = (&path, &decision) {
                state.metrics.rule(path, decision);
            }
            DescriptorOutcome {
                path,
                rule,
                decision,
            }
        })
        .collect();
    Ok(Decided {
        descriptors,
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_keys_do_not_collide() {
        let e = |k: &str, v: &str| Entry {
            key: k.into(),
            value: v.into(),
        };
        let pairs = [
            vec![e("a", "b:c")],
            vec![e("a:b", "c")],
            vec![e("a", "b"), e("c", "")],
            vec![e("a", "b1:c0:")],
        ];
        let keys: Vec<String> = pairs.iter().map(|p| descriptor_key(p)).collect();
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
