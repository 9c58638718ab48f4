//! A check whose limits live in several Redis Cluster hash slots that could not be one
//! routed call (not all on one node, no functions, or turned away by the node: see the
//! store's `check`): one script per slot, and a give-back when a later slot refuses (none
//! for the modes that are never refused).

use super::keys::state_slot;
use super::script::{Mode, Row};
use crate::decision::Decision;
use crate::store::check::{Check, Limit};
use crate::store::error::StoreError;

/// Runs the script for one check, in one mode: what a check across slots is made of.
pub(super) trait RunScript: Sync {
    /// Each limit's answer (none for an undo).
    fn run(
        &self,
        check: &Check<'_>,
        mode: Mode<'_>,
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;
}

/// The check's limits (their keys under `prefix`) grouped by hash slot, in the order each
/// slot first appears.
pub(super) fn slot_groups(prefix: &str, check: &Check<'_>) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, limit) in check.limits.iter().enumerate() {
        // The store sets `at` on a check of an envoy counter, the one slot it names.
        let slot = state_slot(
            prefix,
            limit.rule,
            limit.key,
            check.at_micros().unwrap_or(0),
        );
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// A check whose limits live in several Redis Cluster hash slots cannot be one script.
/// docs/SPEC.md: apply the slots' groups in order, each atomic in itself; when a group
/// refuses, give back what the earlier groups took, and answer every group as the
/// refused check it became. Between a group's admission and its give-back, another
/// client may see those units taken: the only departure from atomicity. If the give-back
/// itself fails, the units stay taken (the limit errs on the side of refusing). A report,
/// settle or refund is never refused (docs/SPEC.md, "Usage"): each slot's script is the
/// whole of it there, and nothing is ever given back; with a request id, every slot is
/// first asked whether the id is a conflicting reuse there.
pub(super) async fn check_across_slots(
    store: &impl RunScript,
    check: &Check<'_>,
    groups: &[Vec<usize>],
) -> Result<Vec<Decision>, StoreError> {
    // A report, settle or refund that reuses its request id for another request records
    // nothing in any slot: every slot is asked first, in order, recording nothing, so a
    // conflict anywhere stops it before any slot does its part.
    if !check.charge.may_refuse() && check.request_id.is_some() {
        for group in groups {
            let part = Part::of(check, group);
            store.run(&part.of_check(check), Mode::Dry).await?;
        }
    }
    let mut decisions: Vec<Option<Decision>> = vec![None; check.limits.len()];
    let mut taken: Vec<(Part<'_>, Vec<Row>)> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let part = Part::of(check, group);
        let rows = match store.run(&part.of_check(check), Mode::Check).await {
            Ok(rows) => rows,
            Err(e) => {
                give_back(store, check, &taken).await;
                return Err(e);
            }
        };
        for (&i, row) in group.iter().zip(&rows) {
            decisions[i] = Some(row.decision);
        }
        if !check.charge.may_refuse() {
            continue;
        }
        if rows.iter().all(|row| row.decision.allowed) {
            taken.push((part, rows));
            continue;
        }
        // Refused: give back, then answer the other groups without recording.
        give_back(store, check, &taken).await;
        for (h, other) in groups.iter().enumerate() {
            if h == g {
                continue;
            }
            let part = Part::of(check, other);
            for (&i, row) in other
                .iter()
                .zip(store.run(&part.of_check(check), Mode::Dry).await?)
            {
                decisions[i] = Some(row.decision);
            }
        }
        break;
    }
    Ok(decisions
        .into_iter()
        .map(|d| d.expect("every limit was answered"))
        .collect())
}

/// The limits of a check that a group numbers, in its order, with their costs.
struct Part<'a> {
    limits: Vec<Limit<'a>>,
    costs: Vec<u64>,
}

impl<'a> Part<'a> {
    fn of(check: &Check<'a>, group: &[usize]) -> Self {
        Part {
            limits: group.iter().map(|&i| check.limits[i]).collect(),
            costs: check.costs_of(group.iter().copied()),
        }
    }

    /// `check` narrowed to this part.
    fn of_check<'b>(&'b self, check: &Check<'a>) -> Check<'b> {
        Check {
            limits: &self.limits,
            costs: &self.costs,
            ..*check
        }
    }
}

/// Gives back, newest first, what earlier groups of a check recorded.
async fn give_back(store: &impl RunScript, check: &Check<'_>, taken: &[(Part<'_>, Vec<Row>)]) {
    for (part, rows) in taken.iter().rev() {
        if rows.iter().all(|row| row.recorded_at.is_none()) {
            continue;
        }
        if let Err(e) = store.run(&part.of_check(check), Mode::Undo(rows)).await {
            tracing::warn!(error = %e, "could not give back a refused check's units");
        }
    }
}
