//! What the model records: admissions, and docs/SPEC.md's "Usage" — reports into debt with
//! their caps, refunds newest first, settles giving back their reservation's own units from
//! where it put them, the standing answer and each mode's request ids — written from the
//! SPEC, not from the store.

use sluicegate::internals::saturating_micros;
use sluicegate::{Algorithm, Charge, Check, Decision, Rule};

use super::state::{Fit, GcraChange, ModelId, ModelKey, gcra_now, model_evaluate};

/// Records `units` at `now`, as an admission does: what no longer counts is dropped (the
/// SPEC's "the expired entries are dropped"), and so are the ids that have expired. Once a
/// refund moves a sliding log's `latest` back, a check stamped before `now` can tell.
pub(crate) fn record(rule: &Rule, key: &mut ModelKey, now: u64, units: u64) {
    key.entries.retain(|e| holds(rule, e.0, now));
    forget_expired_ids(key, now);
    key.stored = true;
    key.entries.push((now, units));
    key.history.push((
        now,
        units,
        GcraChange::Record,
        saturating_micros(rule.emission_interval()),
        rule.capacity(),
    ));
    key.latest = now;
}

/// A state forgets the ids that have expired whenever it is written.
pub(crate) fn forget_expired_ids(key: &mut ModelKey, now: u64) {
    key.ids.retain(|i| i.expires > now);
}

/// Whether an entry at `s` still holds units that count at `now`: live in the log, in a
/// bucket that still weighs, in the current window.
fn holds(rule: &Rule, s: u64, now: u64) -> bool {
    let window = saturating_micros(rule.window());
    match rule.algorithm() {
        Algorithm::SlidingLog => s + window > now,
        Algorithm::SlidingCounter => {
            let w = window / rule.buckets();
            s / w + rule.buckets() >= now / w
        }
        Algorithm::FixedWindow => s / window == now / window,
        Algorithm::TokenBucket | Algorithm::LeakyBucket => false,
    }
}

fn held(rule: &Rule, key: &ModelKey, now: u64) -> u64 {
    key.entries
        .iter()
        .filter(|&&(s, _)| holds(rule, s, now))
        .map(|&(_, u)| u)
        .sum()
}

/// A report of `units`: recorded whatever the limit says, with each algorithm's cap;
/// whether anything was recorded.
fn report(rule: &Rule, key: &mut ModelKey, now: u64, units: u64) -> bool {
    let units = match rule.algorithm() {
        Algorithm::SlidingCounter => {
            let w = saturating_micros(rule.window()) / rule.buckets();
            units.min(((Check::MAX_COST) / w).saturating_sub(held(rule, key, now)))
        }
        Algorithm::FixedWindow => units.min(Check::MAX_COST - held(rule, key, now)),
        // The GCRA cap is in the refold; the log's below.
        _ => units,
    };
    if units == 0 {
        return false;
    }
    record(rule, key, now, units);
    if rule.algorithm() == Algorithm::SlidingLog {
        // Only the newest L live units are kept.
        let mut excess = held(rule, key, now).saturating_sub(rule.limit());
        for entry in key
            .entries
            .iter_mut()
            .filter(|e| e.0 + saturating_micros(rule.window()) > now)
        {
            let dropped = entry.1.min(excess);
            entry.1 -= dropped;
            excess -= dropped;
        }
        key.entries.retain(|e| e.1 > 0);
    }
    true
}

/// A refund of up to `units` of what still counts, newest first (`reservation` = `None`),
/// or a settle's give-back of its reservation's (r, s, e) own units, from where it put
/// them. Whether anything was given back: when nothing was, nothing changes at all.
fn refund(
    rule: &Rule,
    key: &mut ModelKey,
    now: u64,
    units: u64,
    reservation: Option<(u64, u64, u64)>,
) -> bool {
    match rule.algorithm() {
        Algorithm::LeakyBucket => return false,
        Algorithm::TokenBucket => {
            let change = match reservation {
                None => GcraChange::Refund,
                Some((_, _, reserved_tat)) => GcraChange::GiveBack { reserved_tat },
            };
            let pending = reservation.is_none_or(|(_, _, e)| e > now);
            if units == 0 || gcra_now(rule, key, now) == now || !pending {
                return false;
            }
            key.history.push((
                now,
                units,
                change,
                saturating_micros(rule.emission_interval()),
                rule.capacity(),
            ));
            return true;
        }
        _ => {}
    }
    // Which entries the units may come from: any that still counts, or those of the
    // reservation's instant (log), bucket (counter) or window (fixed, if it is current).
    let w = saturating_micros(rule.window()) / rule.buckets();
    let from = |s: u64| match reservation {
        None => true,
        Some((_, at, _)) => match rule.algorithm() {
            Algorithm::SlidingLog => s == at,
            Algorithm::SlidingCounter => s / w == at / w,
            _ => at / saturating_micros(rule.window()) == now / saturating_micros(rule.window()),
        },
    };
    let available: u64 = key
        .entries
        .iter()
        .filter(|e| holds(rule, e.0, now) && from(e.0))
        .map(|e| e.1)
        .sum();
    // A log's reservation whose instant holds fewer than its r entries lost some to a trim
    // or a refund: whose units are left can no longer be told, and none are given back.
    let reduced = match reservation {
        Some((reserved, _, _)) => rule.algorithm() == Algorithm::SlidingLog && available < reserved,
        None => false,
    };
    if units == 0 || available == 0 || reduced {
        return false;
    }
    // The expired entries, the buckets that no longer weigh, are dropped first, as an
    // admission drops them (a check stamped before `now` can tell).
    key.entries.retain(|e| holds(rule, e.0, now));
    let mut left = units;
    for entry in key.entries.iter_mut().rev().filter(|e| from(e.0)) {
        let taken = entry.1.min(left);
        entry.1 -= taken;
        left -= taken;
    }
    key.entries.retain(|e| e.1 > 0);
    if rule.algorithm() == Algorithm::SlidingLog {
        key.latest = key.entries.last().map_or(0, |e| e.0);
    }
    true
}

/// One unit's answer at `now`, recording nothing.
fn standing(rule: &Rule, key: &ModelKey, now: u64) -> Decision {
    let e = model_evaluate(rule, key, now, 1, None, Charge::Check);
    let mut standing = e.refused;
    standing.allowed = e.fit == Fit::Fits;
    standing
}

/// A report, settle or refund of `cost` in one state, at `t`: its standing after.
pub(crate) fn usage(
    rule: &Rule,
    key: &mut ModelKey,
    t: u64,
    cost: u64,
    id: Option<&str>,
    charge: Charge,
) -> Decision {
    let now = t.max(key.latest);
    let namespace = namespace_of(charge);
    let remembered = |key: &ModelKey, namespace: &str, id: &str| {
        key.ids
            .iter()
            .position(|i| i.namespace == namespace && i.id == id && i.expires > now)
    };
    let repeat = id.is_some_and(|id| remembered(key, namespace, id).is_some());
    let recorded = !repeat
        && match charge {
            Charge::Report => report(rule, key, now, cost),
            Charge::Refund => refund(rule, key, now, cost, None),
            _ => {
                let reservation = id
                    .and_then(|id| {
                        key.ids
                            .iter_mut()
                            .find(|i| i.namespace == "admission" && i.id == id && i.expires > now)
                    })
                    .and_then(|r| r.reservation.take());
                match reservation {
                    Some(r) if cost < r.0 => {
                        refund(rule, key, now, r.0 - cost, Some(r));
                    }
                    Some(r) => {
                        report(rule, key, now, cost - r.0);
                    }
                    None => {
                        report(rule, key, now, cost);
                    }
                }
                // A settle is remembered whatever it recorded: its reservation is used up.
                true
            }
        };
    let answer = standing(rule, key, now);
    if let Some(id) = id
        && recorded
        && cost > 0
        && key.stored
    {
        forget_expired_ids(key, now);
        key.ids.push(ModelId {
            namespace,
            id: id.to_owned(),
            used: (charge.name(), cost),
            expires: now + saturating_micros(rule.window()),
            release: now,
            reservation: None,
        });
    }
    answer
}

/// The ids a mode's request id is compared with: `check` and `reserve` share "admission".
pub(crate) fn namespace_of(charge: Charge) -> &'static str {
    match charge {
        Charge::Report => "report",
        Charge::Settle => "settle",
        Charge::Refund => "refund",
        _ => "admission",
    }
}

/// Whether a use of `id` at `t` in mode `charge` for `cost` conflicts with what `key`
/// remembers of it (docs/SPEC.md, "Retries"): the id is live in the mode's namespace, used
/// for another mode or cost.
pub(crate) fn conflicts(key: &ModelKey, t: u64, cost: u64, id: &str, charge: Charge) -> bool {
    let now = t.max(key.latest);
    let namespace = namespace_of(charge);
    key.ids.iter().any(|i| {
        i.namespace == namespace && i.id == id && i.expires > now && i.used != (charge.name(), cost)
    })
}
