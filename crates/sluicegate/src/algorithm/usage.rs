//! The three modes that are never refused — report, settle, refund (docs/SPEC.md, "Usage:
//! reports, reservations, settlements and refunds"): each records what it says in one state,
//! the limit notwithstanding, and answers the standing right after.

use super::request_ids::{Namespace, Remembered, RequestUse, Reservation};
use super::{Charge, Plan, RuleState, StateKind};
use crate::decision::Decision;
use crate::rule::Rule;

/// What a report, settle or refund does to one state: a settle is one of the three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// Records units whatever the limit says (into debt if need be).
    Report(u64),
    /// Gives back up to this many units held, newest first.
    Refund(u64),
    /// Gives back up to this many of a reservation's own units, from where it put them.
    GiveBack(u64, Reservation),
}

/// Whether a check in a never-refused mode writes a state that does not exist yet: a
/// report or a settle (which, without a state, has no reservation: a report) of at least
/// one unit. A refund never creates one.
pub(crate) fn creates_entry(charge: Charge, cost: u64) -> bool {
    matches!(charge, Charge::Report | Charge::Settle) && cost > 0
}

impl RuleState {
    /// Decides a `report`, `settle` or `refund` (`charge`) of `cost` in this state at `t`
    /// (clamped, as every check is) and answers the standing after it. A retried id of the
    /// same mode records nothing.
    pub(crate) fn record_usage(
        &mut self,
        rule: &Rule,
        t: u64,
        cost: u64,
        request_id: Option<&str>,
        charge: Charge,
    ) -> Decision {
        debug_assert!(!charge.may_refuse(), "{charge:?} is decided by evaluate");
        let now = t.max(self.latest);
        let namespace = Namespace::of(charge);
        let repeat = request_id.is_some_and(|id| self.request_ids.holds(namespace, id, now));
        let recorded = !repeat && {
            let change = match charge {
                Charge::Refund => Change::Refund(cost),
                Charge::Settle => {
                    match request_id.and_then(|id| self.request_ids.take_reservation(id, now)) {
                        Some(r) if cost < r.units => Change::GiveBack(r.units - cost, r),
                        Some(r) => Change::Report(cost - r.units),
                        None => Change::Report(cost),
                    }
                }
                _ => Change::Report(cost),
            };
            // A settle remembers its id even when it records nothing: its reservation is
            // used up, and a retry must not report the whole cost.
            self.change(rule, now, change) || charge == Charge::Settle
        };
        let standing = self.standing(rule, now);
        if let Some(id) = request_id.filter(|_| recorded && cost > 0) {
            self.request_ids.remember(
                now,
                Remembered {
                    request_id: id.into(),
                    namespace,
                    used: RequestUse::new(charge, cost),
                    reservation: None,
                    expires_at: now + rule.window_micros(),
                    release_at: now,
                },
            );
        }
        standing
    }

    /// What one unit would be answered at `now`, recording nothing: `allowed` when it fits,
    /// else the refusal of one unit.
    fn standing(&self, rule: &Rule, now: u64) -> Decision {
        self.unrecorded(rule, &self.evaluate(rule, now, 1, None, Charge::Check))
    }

    /// Applies `change` at `now`; whether it changed anything. A refund or give-back that
    /// finds nothing live to give back changes nothing at all, not even the expired units
    /// it would otherwise drop (docs/SPEC.md, "Refund").
    fn change(&mut self, rule: &Rule, now: u64, change: Change) -> bool {
        let plan = self.plan(rule, now);
        let changed = match change {
            Change::Report(0) | Change::Refund(0) | Change::GiveBack(0, _) => false,
            Change::Report(units) => {
                let units = match (&self.kind, plan) {
                    (StateKind::Counter(s), Plan::Counter(p)) => units.min(s.report_room(rule, p)),
                    _ => units,
                };
                if units > 0 {
                    self.record(rule, plan, now, units);
                }
                units > 0
            }
            Change::Refund(units) => match (&mut self.kind, plan) {
                (StateKind::Log(s), Plan::Log(p)) => s.refund(p, units),
                (StateKind::Fixed(s), Plan::Fixed(p)) => s.refund(p, None, units),
                (StateKind::Counter(s), Plan::Counter(p)) => s.refund(rule, p, None, units),
                (StateKind::Gcra(s), Plan::Gcra(p)) => s.refund(rule, p, now, None, units),
                _ => unreachable!("a plan is only ever passed back to the state that made it"),
            },
            Change::GiveBack(units, reservation) => match (&mut self.kind, plan) {
                (StateKind::Log(s), Plan::Log(p)) => {
                    s.give_back(rule, p, now, reservation.at, units, reservation.units)
                }
                (StateKind::Fixed(s), Plan::Fixed(p)) => {
                    s.refund(p, Some(reservation.at / rule.window_micros()), units)
                }
                (StateKind::Counter(s), Plan::Counter(p)) => {
                    s.refund(rule, p, Some(reservation.at), units)
                }
                (StateKind::Gcra(s), Plan::Gcra(p)) => {
                    s.refund(rule, p, now, Some(reservation.tat), units)
                }
                _ => unreachable!("a plan is only ever passed back to the state that made it"),
            },
        };
        if changed && let StateKind::Log(s) = &self.kind {
            // The log's `latest` is its newest entry: giving that back takes it back.
            self.latest = s.newest().unwrap_or(0);
        }
        changed
    }
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "give_back_tests.rs"]
mod give_back_tests;
