//! Each descriptor's mode (docs/SPEC.md, "Usage"): the one `/v1/check` names for all, or,
//! on Envoy's protocol, what a descriptor reaching a `usage: true` rule says in its last
//! entries (`request_id`, `usage`), which are then no part of its key.

use sluicegate::{Charge, Check};

use super::answer::DecideError;
use crate::config::{ConfiguredLimit, Entry};

/// The entry keys Envoy's actions add to a descriptor of a usage rule.
const REQUEST_ID_KEY: &str = "request_id";
const USAGE_KEY: &str = "usage";

/// Where a request's modes come from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Modes<'a> {
    /// One mode and request id for every descriptor (`/v1/check`).
    Given {
        charge: Charge,
        request_id: Option<&'a str>,
    },
    /// Envoy's protocol: a descriptor reaching a usage rule says its own mode in a
    /// `usage` entry, else it is a report when it sets its own `hits_addend` above 0
    /// (`reports[i]`: Envoy's stream-done call always does) and a check otherwise; any
    /// other descriptor is a check.
    EnvoyEntries { reports: &'a [bool] },
}

impl Modes<'static> {
    /// Every descriptor a plain check, without a request id.
    #[cfg(test)]
    pub(crate) const CHECK: Modes<'static> = Modes::Given {
        charge: Charge::Check,
        request_id: None,
    };
}

/// One descriptor's mode and request id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mode<'a> {
    pub(crate) charge: Charge,
    pub(crate) request_id: Option<&'a str>,
}

/// What a descriptor's trailing `request_id` and `usage` entries say (each at most once,
/// in either order).
#[derive(Debug, PartialEq, Eq)]
struct UsageEntries<'d> {
    /// The entries before them: the descriptor's key.
    kept: &'d [Entry],
    request_id: Option<&'d str>,
    /// The `usage` entry's index and value.
    usage: Option<(usize, &'d str)>,
}

/// The descriptor's trailing usage entries; `None` when it ends with neither (or is
/// nothing else).
fn usage_entries(entries: &[Entry]) -> Option<UsageEntries<'_>> {
    let (mut request_id, mut usage) = (None, None);
    let mut kept = entries.len();
    while kept > 1 {
        let entry = &entries[kept - 1];
        match entry.key.as_str() {
            REQUEST_ID_KEY if request_id.is_none() => request_id = Some(entry.value.as_str()),
            USAGE_KEY if usage.is_none() => usage = Some((kept - 1, entry.value.as_str())),
            _ => break,
        }
        kept -= 1;
    }
    (kept < entries.len()).then(|| UsageEntries {
        kept: &entries[..kept],
        request_id,
        usage,
    })
}

/// What is wrong with where `entries` put their `request_id` and `usage` entries, if
/// anything: each may come once, after the descriptor's own entries.
fn misshapen(entries: &[Entry]) -> Option<String> {
    let is_usage_key = |e: &Entry| e.key == REQUEST_ID_KEY || e.key == USAGE_KEY;
    for (j, entry) in entries.iter().enumerate() {
        if !is_usage_key(entry) {
            continue;
        }
        if entries[..j].iter().any(|e| e.key == entry.key) {
            return Some(format!("entries[{j}]: a second {} entry", entry.key));
        }
        if entries[j + 1..].iter().any(|e| !is_usage_key(e)) {
            return Some(format!(
                "entries[{j}]: the {} entry must come after the descriptor's own entries",
                entry.key
            ));
        }
    }
    None
}

/// Whether `entries`, their `request_id` and `usage` entries taken out, reach a usage rule.
fn reaches_usage_rule<'c>(
    entries: &[Entry],
    find: impl Fn(&[Entry]) -> Option<&'c ConfiguredLimit>,
) -> bool {
    let own: Vec<Entry> = entries
        .iter()
        .filter(|e| e.key != REQUEST_ID_KEY && e.key != USAGE_KEY)
        .cloned()
        .collect();
    !own.is_empty() && find(&own).is_some_and(|l| l.usage)
}

/// A request's descriptors resolved, in request order.
pub(crate) struct Resolved<'d> {
    /// The entries each is matched and counted by.
    pub(crate) entries: Vec<&'d [Entry]>,
    pub(crate) modes: Vec<Mode<'d>>,
}

/// Resolves each descriptor: the entries it is matched and counted by, and its mode; a
/// descriptor that reaches a usage rule once its mode entries are taken off matches that
/// rule (in `matched`). `find` matches entries to a limit.
pub(crate) fn resolve<'d, 'c>(
    modes: Modes<'d>,
    descriptors: &'d [Vec<Entry>],
    matched: &mut [Option<&'c ConfiguredLimit>],
    find: impl Fn(&[Entry]) -> Option<&'c ConfiguredLimit>,
) -> Result<Resolved<'d>, DecideError> {
    let mut entries = Vec::with_capacity(descriptors.len());
    let mut resolved = Vec::with_capacity(descriptors.len());
    for (i, descriptor) in descriptors.iter().enumerate() {
        let (used, mode) = match modes {
            Modes::Given { charge, request_id } => {
                (descriptor.as_slice(), Mode { charge, request_id })
            }
            Modes::EnvoyEntries { reports } => {
                let split = usage_entries(descriptor)
                    .and_then(|u| find(u.kept).filter(|l| l.usage).map(|l| (u, l)));
                let (used, usage, request_id) = match split {
                    Some((u, limit)) => {
                        matched[i] = Some(limit);
                        (u.kept, u.usage, u.request_id)
                    }
                    None => {
                        if matched[i].is_none()
                            && let Some(wrong) = misshapen(descriptor)
                            && reaches_usage_rule(descriptor, &find)
                        {
                            return Err(DecideError::Invalid(format!("descriptors[{i}].{wrong}")));
                        }
                        (descriptor.as_slice(), None, None)
                    }
                };
                let charge = match usage {
                    Some((j, name)) => Charge::from_name(name).ok_or_else(|| {
                        DecideError::Invalid(format!(
                            "descriptors[{i}].entries[{j}].value: unknown usage mode \
                             {name:?}; expected {}",
                            Charge::NAMES
                        ))
                    })?,
                    // Envoy's stream-done call carries the tokens in the descriptor's own
                    // hits; a request-time call sets 0 or leaves them to the request's.
                    None if reports[i] && matched[i].is_some_and(|l| l.usage) => Charge::Report,
                    None => Charge::Check,
                };
                (used, Mode { charge, request_id })
            }
        };
        if mode.charge.needs_request_id() && mode.request_id.is_none() {
            return Err(DecideError::Invalid(match modes {
                Modes::Given { .. } => {
                    format!("request_id: a {} needs a request id", mode.charge.name())
                }
                Modes::EnvoyEntries { .. } => format!(
                    "descriptors[{i}]: a {} needs a request_id entry",
                    mode.charge.name()
                ),
            }));
        }
        entries.push(used);
        resolved.push(mode);
    }
    Ok(Resolved {
        entries,
        modes: resolved,
    })
}

/// Rejects what a store would refuse in any of the request's checks, and two settles of
/// one key under one id (which of them is what the request cost?), before any check runs:
/// a request mixing checks of several modes loses nothing to a bad part of it. Only the
/// descriptors a rule limits (`limited`) reach a store; `keys` are their counted keys.
/// Under [`Modes::Given`] the cost and id are the request's own, and the error says so as
/// the store would.
pub(crate) fn validate(
    given: Modes<'_>,
    limited: &[Option<&ConfiguredLimit>],
    keys: &[String],
    costs: &[u64],
    modes: &[Mode<'_>],
) -> Result<(), DecideError> {
    let reaching =
        || (0..limited.len()).filter_map(|i| Some((i, limited[i]?.rule.as_ref()?, modes[i])));
    let whose = |i: usize| match given {
        Modes::Given { .. } => String::new(),
        Modes::EnvoyEntries { .. } => format!("descriptors[{i}]: "),
    };
    for (i, _, mode) in reaching() {
        if costs[i] > Check::MAX_COST {
            return Err(DecideError::Invalid(format!(
                "{}cost {} is not below 2^53",
                whose(i),
                costs[i]
            )));
        }
        if let Some(id) = mode.request_id
            && (id.is_empty() || id.len() > Check::MAX_REQUEST_ID_BYTES)
        {
            return Err(DecideError::Invalid(format!(
                "{}request id must be 1 to {} bytes, got {}",
                whose(i),
                Check::MAX_REQUEST_ID_BYTES,
                id.len()
            )));
        }
    }
    // Two descriptors on one rule and key in one mode are one limit, at the sum of their
    // costs where decide_together adds them up: the sum too must be below 2^53, or the
    // store refuses it after the request's other checks were charged.
    let summed: Vec<_> = reaching()
        .filter(|(_, _, mode)| {
            mode.charge == Charge::CheckChargingRefusals || !mode.charge.may_refuse()
        })
        .map(|(i, rule, mode)| (i, rule, mode, limited[i].is_some_and(|l| l.shadow_mode)))
        .collect();
    for (n, &(i, rule, mode, shadow)) in summed.iter().enumerate() {
        let same: Vec<usize> = summed[..=n]
            .iter()
            .filter(|&&(j, other, other_mode, other_shadow)| {
                keys[j] == keys[i]
                    && other.same_identity(rule)
                    && other_mode == mode
                    && other_shadow == shadow
            })
            .map(|&(j, ..)| j)
            .collect();
        let sum = same
            .iter()
            .fold(0u64, |sum, &j| sum.saturating_add(costs[j]));
        if sum > Check::MAX_COST {
            let named: Vec<String> = same.iter().map(|j| format!("descriptors[{j}]")).collect();
            return Err(DecideError::Invalid(format!(
                "{} count on one key: their costs add up to {sum}, not below 2^53",
                named.join(", ")
            )));
        }
    }
    let settles: Vec<_> = reaching()
        .filter(|(_, _, mode)| mode.charge == Charge::Settle)
        .collect();
    for (n, &(i, rule, mode)) in settles.iter().enumerate() {
        if let Some(&(first, ..)) = settles[..n].iter().find(|&&(j, other, other_mode)| {
            keys[j] == keys[i] && other.same_identity(rule) && other_mode == mode
        }) {
            return Err(DecideError::Invalid(format!(
                "descriptors[{i}]: settles the key descriptors[{first}] settles under the \
                 same request id; send one settle of what the request cost"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(key: &str, value: &str) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn trailing_usage_entries_are_split_off_in_either_order() {
        let d = vec![e("model", "m"), e("request_id", "r1"), e("usage", "settle")];
        let u = usage_entries(&d).unwrap();
        assert_eq!(
            (u.kept, u.request_id, u.usage),
            (&d[..1], Some("r1"), Some((2, "settle")))
        );
        let d = vec![
            e("model", "m"),
            e("usage", "reserve"),
            e("request_id", "r1"),
        ];
        let u = usage_entries(&d).unwrap();
        assert_eq!(
            (u.kept, u.request_id, u.usage),
            (&d[..1], Some("r1"), Some((1, "reserve")))
        );
        // A descriptor of nothing else keeps its one entry; a second `usage` is a key.
        assert_eq!(usage_entries(&[e("usage", "x")]), None);
        let d = vec![e("usage", "a"), e("usage", "b")];
        assert_eq!(usage_entries(&d).unwrap().kept, &d[..1]);
        assert_eq!(usage_entries(&[e("model", "m")]), None);
    }
}
