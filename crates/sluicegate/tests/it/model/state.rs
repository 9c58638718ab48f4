//! The model's state of one (rule, key) and docs/SPEC.md's formulas on it, written out
//! literally: sliding-log expands units into timestamps, sliding-counter's `retry_after` is
//! found by trying every µs, GCRA's TAT is refolded from the history of what was recorded
//! and given back.

use std::time::Duration;

use sluicegate::internals::saturating_micros;
use sluicegate::{Algorithm, Charge, Decision, RetryAfter, Rule};

/// The most backlog a GCRA report may leave: 2^51 µs.
const MAX_BACKLOG: u64 = 1 << 51;

#[derive(Clone, Debug, Default)]
pub(crate) struct ModelKey {
    /// (time, units) recorded and not given back, in time order (expired ones included:
    /// every formula looks only at what is live at its instant).
    pub(crate) entries: Vec<(u64, u64)>,
    /// Every GCRA change in order: (time, units, what was done, T, capacity in force).
    pub(crate) history: Vec<(u64, u64, GcraChange, u64, u64)>,
    pub(crate) latest: u64,
    pub(crate) ids: Vec<ModelId>,
    /// Whether the store holds an entry for this state: once anything was recorded (the
    /// traces never reach a sweep). A refund never creates one, so on a state not stored it
    /// remembers no id either.
    pub(crate) stored: bool,
}

/// A remembered request id.
#[derive(Clone, Debug)]
pub(crate) struct ModelId {
    /// `check` and `reserve` share "admission"; the other modes have their own.
    pub(crate) namespace: &'static str,
    pub(crate) id: String,
    /// What it was used for: the mode's name (`check` for envoy's counting too) and the
    /// cost asked. A later use that asks otherwise is a conflicting reuse.
    pub(crate) used: (&'static str, u64),
    pub(crate) expires: u64,
    pub(crate) release: u64,
    /// A reservation's (r, s, e) — its units, its instant, and the TAT it set (GCRA) — until
    /// a settle uses them; else none.
    pub(crate) reservation: Option<(u64, u64, u64)>,
}

/// A change of a GCRA state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum GcraChange {
    /// TAT = tat + c·T.
    Record,
    /// TAT = max(t, tat − c·T).
    Refund,
    /// A reservation's give-back: TAT = max(t, tat − min(c·T, e − t)), e the TAT it set.
    GiveBack { reserved_tat: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fit {
    Fits,
    Over,
    Never,
    Repeat(u64),
}

pub(crate) struct ModelEval {
    pub(crate) now: u64,
    pub(crate) fit: Fit,
    pub(crate) admitted: Decision,
    pub(crate) refused: Decision,
}

/// docs/SPEC.md's reading of a stored TAT under numbers (T, C), at `now`: the backlog as
/// written when T is the one it was written under (d' = d), else its units rounded up at the
/// new T, at most C of them.
fn gcra_read(tat: u64, written_interval: u64, now: u64, interval: u64, capacity: u64) -> u64 {
    let backlog = tat.saturating_sub(now);
    let read = if backlog == 0 {
        0
    } else if written_interval == interval {
        backlog
    } else {
        backlog.div_ceil(written_interval).min(capacity) * interval
    };
    now + read
}

/// The stored TAT and the T it was written under, refolded from the history (which holds
/// only changes that change something: docs/SPEC.md, "Refund").
fn gcra_tat(key: &ModelKey) -> (u64, u64) {
    key.history
        .iter()
        .fold((0, 0), |(tat, written), &(s, units, change, t, cap)| {
            let read = gcra_read(tat, written, s, t, cap);
            let tat = match change {
                GcraChange::Record => (read + units * t).min(s + MAX_BACKLOG),
                GcraChange::Refund => read.saturating_sub(units * t).max(s),
                GcraChange::GiveBack { reserved_tat } => read
                    .saturating_sub((units * t).min(reserved_tat - s))
                    .max(s),
            };
            (tat, t)
        })
}

/// The GCRA `tat` at `now` under `rule`: max(TAT, t) as read.
pub(crate) fn gcra_now(rule: &Rule, key: &ModelKey, now: u64) -> u64 {
    let (stored, written) = gcra_tat(key);
    gcra_read(
        stored,
        written,
        now,
        saturating_micros(rule.emission_interval()),
        rule.capacity(),
    )
}

fn counter_estimate_w(rule: &Rule, key: &ModelKey, at: u64) -> u64 {
    let n = rule.buckets();
    let w = saturating_micros(rule.window()) / n;
    let b = at / w;
    let r = at - b * w;
    key.entries
        .iter()
        .map(|&(s, units)| {
            let j = s / w;
            if j + n > b && j <= b {
                w * units
            } else if j + n == b {
                units * (w - r)
            } else {
                0
            }
        })
        .sum()
}

fn decision(allowed: bool, limit: u64, remaining: u64, retry: RetryAfter, reset: u64) -> Decision {
    Decision::new(
        allowed,
        limit,
        remaining,
        retry,
        Duration::from_micros(reset),
        Duration::ZERO,
    )
}

/// `d` with a wait of `delay` µs.
pub(crate) fn delayed(d: Decision, delay: u64) -> Decision {
    Decision::new(
        d.allowed,
        d.limit,
        d.remaining,
        d.retry_after(),
        d.reset_after(),
        Duration::from_micros(delay),
    )
}

/// `d` with `retry_after`.
fn retrying(d: Decision, retry_after: RetryAfter) -> Decision {
    Decision::new(
        d.allowed,
        d.limit,
        d.remaining,
        retry_after,
        d.reset_after(),
        d.delay(),
    )
}

pub(crate) fn model_evaluate(
    rule: &Rule,
    key: &ModelKey,
    t: u64,
    cost: u64,
    id: Option<&str>,
    charge: Charge,
) -> ModelEval {
    let now = t.max(key.latest);
    // docs/SPEC.md, "A check and its cost": a peek answers for one unit; under charged
    // refusals for none (envoy adds, then compares), but in a sliding log.
    let counted_after =
        charge == Charge::CheckChargingRefusals && rule.algorithm() != Algorithm::SlidingLog;
    let units = if cost == 0 && !counted_after { 1 } else { cost };
    let l = rule.limit();
    let w_full = saturating_micros(rule.window());
    let (fits, admitted, mut refused, retry_units);
    match rule.algorithm() {
        Algorithm::SlidingLog => {
            let mut live: Vec<u64> = key
                .entries
                .iter()
                .filter(|&&(s, _)| s + w_full > now)
                .flat_map(|&(s, u)| std::iter::repeat_n(s, u as usize))
                .collect();
            live.sort_unstable();
            let n = live.len() as u64;
            fits = n + units <= l;
            admitted = decision(
                true,
                l,
                l.saturating_sub(n + units),
                RetryAfter::After(Duration::ZERO),
                w_full,
            );
            let reset = live.last().map_or(0, |s| s + w_full - now);
            retry_units = if units <= l && !fits {
                let k = (n + units - l) as usize;
                RetryAfter::After(Duration::from_micros(live[k - 1] + w_full - now))
            } else {
                RetryAfter::After(Duration::ZERO)
            };
            refused = decision(false, l, l.saturating_sub(n), retry_units, reset);
        }
        Algorithm::FixedWindow => {
            let k = now / w_full;
            let n: u64 = key
                .entries
                .iter()
                .filter(|&&(s, _)| s / w_full == k)
                .map(|&(_, u)| u)
                .sum();
            fits = n + units <= l;
            let end = (k + 1) * w_full - now;
            admitted = decision(
                true,
                l,
                l.saturating_sub(n + units),
                RetryAfter::After(Duration::ZERO),
                end,
            );
            let reset = if n > 0 { end } else { 0 };
            refused = decision(
                false,
                l,
                l.saturating_sub(n),
                RetryAfter::After(Duration::from_micros(reset)),
                reset,
            );
        }
        Algorithm::SlidingCounter => {
            let n = rule.buckets();
            let w = w_full / n;
            let e = counter_estimate_w(rule, key, now);
            fits = units <= l && e + units * w <= l * w;
            let b = now / w;
            admitted = decision(
                true,
                l,
                (l * w).saturating_sub(e + units * w) / w,
                RetryAfter::After(Duration::ZERO),
                (b + n + 1) * w - now,
            );
            let reset = key
                .entries
                .iter()
                .map(|&(s, _)| ((s / w) + n + 1) * w)
                .filter(|&end| end > now)
                .max()
                .map_or(0, |end| end - now);
            let retry = if units <= l && !fits {
                // Debt drains too: a bucket leaves the estimate within W + w whatever it holds.
                let d = (0..=w_full + w)
                    .find(|d| counter_estimate_w(rule, key, now + d) + units * w <= l * w)
                    .expect("every bucket has left the window by then");
                RetryAfter::After(Duration::from_micros(d))
            } else {
                RetryAfter::After(Duration::ZERO)
            };
            refused = decision(false, l, (l * w).saturating_sub(e) / w, retry, reset);
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let interval = w_full / l;
            let cap = rule.capacity();
            let tau = interval * cap;
            let tat = gcra_now(rule, key, now);
            let new = tat + units * interval;
            fits = units <= cap && new - now <= tau;
            admitted = delayed(
                decision(
                    true,
                    cap,
                    tau.saturating_sub(new - now) / interval,
                    RetryAfter::After(Duration::ZERO),
                    new - now,
                ),
                if rule.algorithm() == Algorithm::LeakyBucket {
                    tat - now
                } else {
                    0
                },
            );
            let retry = if units <= cap && !fits {
                RetryAfter::After(Duration::from_micros(new - tau - now))
            } else {
                RetryAfter::After(Duration::ZERO)
            };
            refused = decision(
                false,
                cap,
                tau.saturating_sub(tat - now) / interval,
                retry,
                tat - now,
            );
        }
    }
    let repeat = id.and_then(|id| {
        key.ids
            .iter()
            .find(|i| i.namespace == "admission" && i.id == id && i.expires > now)
            .map(|i| i.release)
    });
    let fit = match repeat {
        Some(release) => Fit::Repeat(release),
        None if units > rule.capacity() => Fit::Never,
        None if fits => Fit::Fits,
        None => Fit::Over,
    };
    match fit {
        Fit::Never => refused = retrying(refused, RetryAfter::Never),
        Fit::Fits | Fit::Repeat(_) => {
            refused = retrying(refused, RetryAfter::After(Duration::ZERO))
        }
        Fit::Over => {}
    }
    ModelEval {
        now,
        fit,
        admitted,
        refused,
    }
}

pub(crate) fn model_combine(ds: &[Decision]) -> Decision {
    let allowed = ds.iter().all(|d| d.allowed);
    let tightest = ds
        .iter()
        .min_by_key(|d| (d.remaining, d.limit))
        .expect("at least one rule");
    let retry_after = if allowed {
        RetryAfter::After(Duration::ZERO)
    } else {
        ds.iter()
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after())
            .max()
            .expect("a refusing rule")
    };
    Decision::new(
        allowed,
        tightest.limit,
        tightest.remaining,
        retry_after,
        ds.iter()
            .map(Decision::reset_after)
            .max()
            .unwrap_or_default(),
        ds.iter().map(Decision::delay).max().unwrap_or_default(),
    )
}
