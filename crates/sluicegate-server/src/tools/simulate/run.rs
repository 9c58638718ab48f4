//! One algorithm's run of a simulation: its store, and the units it recorded per key
//! within the last W, kept beside the store by the trace's own modes (what `max in any W`
//! and the chart measure), with what it tells of debt.

use std::collections::{HashSet, VecDeque};

use anyhow::Result;
use sluicegate::internals::saturating_micros;
use sluicegate::{Charge, Decision, Limit, MemoryStore, Rule};

use super::HashMap;
use crate::tools::replay::{ReplayLine, trace_store};

/// What one algorithm did with the trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct AlgorithmReport {
    pub(super) allowed: u64,
    pub(super) wrongly_allowed: u64,
    pub(super) wrongly_rejected: u64,
    /// The most units recorded for one key in any window `(t − W, t]`.
    pub(super) max_in_window: u64,
    /// Keys holding state at once, at the peak.
    pub(super) peak_keys: u64,
    /// Units recorded within the last W, all keys together, at the peak.
    pub(super) peak_live_units: u64,
    /// Checks refused because a report or settle had left their key spent (it answered that
    /// one more unit did not fit), before the key admitted again.
    pub(super) refused_in_debt: u64,
    /// The longest wait a report or settle left its key, in µs: until one unit fits again.
    pub(super) longest_debt: u64,
}

/// Whose request ids a mode's ids are: a check's and a reserve's are the same admissions'
/// (docs/SPEC.md, "Usage"), a report, settle and refund each keep their own.
fn id_space(charge: Charge) -> &'static str {
    if charge.may_refuse() {
        Charge::Check.name()
    } else {
        charge.name()
    }
}

/// One algorithm's run.
pub(super) struct Run {
    pub(super) rule: Rule,
    store: MemoryStore,
    pub(super) report: AlgorithmReport,
    /// Units recorded within the last W, oldest first: (time, key id, units).
    recent: VecDeque<(u64, u32, u64)>,
    /// Units per key within the last W.
    live: HashMap<u32, u64>,
    live_units: u64,
    /// Per chart bucket, the most units one key held within its window.
    pub(super) window_peaks: Vec<u64>,
    /// The units of each reservation this run admitted, by key and request id, until settled.
    reservations: HashMap<(u32, String), u64>,
    /// (key, mode, request id) of what recorded with an id: a second line like it is a
    /// retry, which the store answers without recording (ids are taken as remembered for
    /// the whole trace, which holds while retries come within W).
    recorded_ids: HashSet<(u32, &'static str, String)>,
    /// Keys a report or settle left spent, until they admit again.
    spent: HashSet<u32>,
    /// (key, request id) of the requests this run refused: the request never ran, so its
    /// report or settle, if the trace has one, is not charged.
    refused_ids: HashSet<(u32, String)>,
}

impl Run {
    pub(super) fn new(rule: Rule) -> Self {
        Run {
            rule,
            store: trace_store(),
            report: AlgorithmReport::default(),
            recent: VecDeque::new(),
            live: HashMap::default(),
            live_units: 0,
            window_peaks: Vec::new(),
            reservations: HashMap::default(),
            recorded_ids: HashSet::new(),
            spent: HashSet::new(),
            refused_ids: HashSet::new(),
        }
    }

    /// Whether `line` (of key id `key`) is the report or settle of a request this run
    /// refused: not sent, not counted.
    pub(super) fn never_ran(&mut self, line: &ReplayLine<'_>, key: u32) -> bool {
        matches!(line.charge, Charge::Report | Charge::Settle)
            && line
                .request_id
                .is_some_and(|id| self.refused_ids.remove(&(key, id.to_owned())))
    }

    /// Decides `line` on this run's store.
    pub(super) fn decide(&self, line: &ReplayLine<'_>) -> Result<Decision> {
        let limits = [Limit {
            rule: &self.rule,
            key: line.key,
        }];
        Ok(self.store.check_now(&line.check(&limits))?.decision)
    }

    /// Forgets the units that have left the window `(t − window, t]`.
    pub(super) fn expire(&mut self, t: u64, window: u64) {
        while let Some(&(at, old_key, old_units)) = self.recent.front() {
            if at + window > t {
                break;
            }
            self.recent.pop_front();
            self.forget(old_key, old_units);
        }
    }

    /// Keeps the books for `line` (of key id `key`), which the store answered `decision`
    /// (after [`Run::expire`] to its time); returns what `key` now holds within its window.
    pub(super) fn account(&mut self, line: &ReplayLine<'_>, key: u32, decision: &Decision) -> u64 {
        let retry = line.request_id.is_some_and(|id| {
            self.recorded_ids
                .contains(&(key, id_space(line.charge), id.to_owned()))
        });
        if retry {
            return self.held(key);
        }
        let recorded = match line.charge {
            Charge::Report => {
                self.record(line.time, key, line.cost);
                self.note_standing(key, decision);
                line.cost > 0
            }
            Charge::Settle => {
                let id = line.request_id.unwrap_or_default();
                let reserved = self.reservations.remove(&(key, id.to_owned())).unwrap_or(0);
                if line.cost >= reserved {
                    self.record(line.time, key, line.cost - reserved);
                } else {
                    self.give_back(key, reserved - line.cost);
                }
                self.note_standing(key, decision);
                true
            }
            Charge::Refund => {
                self.give_back(key, line.cost);
                self.note_standing(key, decision);
                line.cost > 0
            }
            // A check, or a reserve: may be refused.
            _ => {
                if decision.allowed {
                    self.spent.remove(&key);
                    if line.charge == Charge::Reserve
                        && let Some(id) = line.request_id
                    {
                        self.reservations.insert((key, id.to_owned()), line.cost);
                    }
                    self.record(line.time, key, line.cost);
                    line.cost > 0
                } else {
                    if self.spent.contains(&key) {
                        self.report.refused_in_debt += 1;
                    }
                    if let Some(id) = line.request_id {
                        self.refused_ids.insert((key, id.to_owned()));
                    }
                    false
                }
            }
        };
        if recorded && let Some(id) = line.request_id {
            self.recorded_ids
                .insert((key, id_space(line.charge), id.to_owned()));
        }
        self.held(key)
    }

    /// After a report, settle or refund: whether it left the key spent, and for how long.
    fn note_standing(&mut self, key: u32, standing: &Decision) {
        if standing.allowed {
            self.spent.remove(&key);
        } else {
            self.spent.insert(key);
            // A standing answer's wait is never `never` (docs/SPEC.md, "Usage").
            let wait = standing
                .retry_after()
                .duration()
                .map_or(0, saturating_micros);
            self.report.longest_debt = self.report.longest_debt.max(wait);
        }
    }

    /// Records `units` for `key` at `t`.
    fn record(&mut self, t: u64, key: u32, units: u64) {
        if units == 0 {
            return;
        }
        self.recent.push_back((t, key, units));
        self.live_units += units;
        let count = self.live.entry(key).or_default();
        *count += units;
        let count = *count;
        let report = &mut self.report;
        report.max_in_window = report.max_in_window.max(count);
        report.peak_keys = report.peak_keys.max(self.live.len() as u64);
        report.peak_live_units = report.peak_live_units.max(self.live_units);
    }

    /// Takes back up to `units` of what `key` holds within the window, newest first.
    fn give_back(&mut self, key: u32, units: u64) {
        let mut left = units;
        for entry in self.recent.iter_mut().rev() {
            if left == 0 {
                break;
            }
            if entry.1 == key {
                let taken = entry.2.min(left);
                entry.2 -= taken;
                left -= taken;
            }
        }
        self.recent.retain(|entry| entry.2 > 0);
        self.forget(key, units - left);
    }

    /// Takes `units` off `key`'s and the run's counts.
    fn forget(&mut self, key: u32, units: u64) {
        self.live_units -= units;
        if let Some(count) = self.live.get_mut(&key) {
            *count -= units;
            if *count == 0 {
                self.live.remove(&key);
            }
        }
    }

    fn held(&self, key: u32) -> u64 {
        self.live.get(&key).copied().unwrap_or(0)
    }

    /// The most any key holds within its window now.
    pub(super) fn busiest(&self) -> u64 {
        self.live.values().copied().max().unwrap_or(0)
    }
}
