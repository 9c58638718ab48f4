//! Counting a request's matched limits: sluicegate's one all-or-nothing check (and envoy's
//! stop-increment, the same check charging refusals), or envoy's check per descriptor.

use std::time::Duration;

use sluicegate::internals::saturating_micros;
use sluicegate::{Charge, Check, DecidedBy, Decision, Limit, Outcome, RetryAfter};

use super::Service;
use super::answer::DecideError;
use super::usage::Mode;
use crate::compat::Counting;
use crate::config::ConfiguredLimit;

/// What the counting of a request comes to: each descriptor's decision, the outcome, and
/// whether that outcome may refuse (a check's) or is a standing (reports' and the like).
type Counted = (Vec<Option<Decision>>, Option<Outcome>, bool);

/// The descriptors one check decides, and its mode.
struct Group<'a> {
    mode: Mode<'a>,
    members: Vec<usize>,
}

impl Service {
    /// A block's decision now: over the limit, and it will never pass. It resets when its
    /// unit's window, aligned to the epoch as a fixed window's, ends (as
    /// envoyproxy/ratelimit reports it), when it names a unit.
    pub(super) fn block(&self, limit: &ConfiguredLimit) -> Decision {
        let now = saturating_micros(self.limiter.clock().now());
        let reset = limit.block_window.map_or(0, |window| window - now % window);
        Decision::new(
            false,
            0,
            0,
            RetryAfter::Never,
            Duration::from_micros(reset),
            Duration::ZERO,
        )
    }

    /// sluicegate's counting (and envoy's with `--stop-increment-when-over-limit`) of a
    /// request whose descriptors may be in several modes: those that may refuse (`check`,
    /// `reserve`) are one check, all-or-nothing, a `reserve` if any of them is one, under
    /// their one request id; the reports, settles and refunds one check per mode and
    /// request id. The outcome is the refusable check's if it has one, else the standing
    /// the others' checks combine to.
    pub(super) async fn decide_grouped(
        &self,
        matched: &[Option<&ConfiguredLimit>],
        keys: &[String],
        costs: &[u64],
        modes: &[Mode<'_>],
        blocked: bool,
        counting: Counting,
    ) -> Result<Counted, DecideError> {
        let groups = groups(modes, counting)?;
        if let [only] = groups.as_slice() {
            let (decisions, outcome) = self
                .decide_together(
                    matched,
                    keys,
                    costs,
                    only.mode.request_id,
                    blocked,
                    only.mode.charge,
                )
                .await?;
            return Ok((decisions, outcome, only.mode.charge.may_refuse()));
        }
        let mut decisions = vec![None; matched.len()];
        let mut refusable = None;
        let mut standing = Vec::new();
        for group in &groups {
            let mut members = vec![None; matched.len()];
            for &i in &group.members {
                members[i] = matched[i];
            }
            let may_refuse = group.mode.charge.may_refuse();
            let (decided, outcome) = self
                .decide_together(
                    &members,
                    keys,
                    costs,
                    group.mode.request_id,
                    blocked && may_refuse,
                    group.mode.charge,
                )
                .await?;
            for &i in &group.members {
                decisions[i] = decided[i];
            }
            match outcome {
                Some(outcome) if may_refuse => refusable = Some(outcome),
                Some(outcome) => standing.push(outcome.decision),
                None => {}
            }
        }
        Ok(match refusable {
            Some(outcome) => (decisions, Some(outcome), true),
            None => (
                decisions,
                Decision::combine(&standing).map(Outcome::single),
                false,
            ),
        })
    }

    /// sluicegate's counting (and envoy's with `--stop-increment-when-over-limit`): the
    /// enforced limits in one check, under `charge`; shadow ones in another, so that they
    /// can never refuse or hold back the others. Two descriptors that land on the same
    /// rule and key share one limit and one answer (their costs: below). A block refuses
    /// the request without
    /// asking the store. Each descriptor's decision, and the enforced limits' outcome.
    pub(super) async fn decide_together(
        &self,
        matched: &[Option<&ConfiguredLimit>],
        keys: &[String],
        costs: &[u64],
        request_id: Option<&str>,
        blocked: bool,
        charge: Charge,
    ) -> Result<(Vec<Option<Decision>>, Option<Outcome>), DecideError> {
        // Each limit at its own cost: two descriptors on one rule and key are one limit,
        // at the larger of their costs when the check may refuse (one request asks for
        // it twice); at their sum under envoy's counting, as envoy counts each, and in
        // a report or refund, whose units all happened (two settles of one key under one
        // id were refused before: `usage::validate`).
        let mut enforced: Vec<(Limit<'_>, u64)> = Vec::new();
        let mut shadow: Vec<(Limit<'_>, u64)> = Vec::new();
        let mut slot_of: Vec<Option<(bool, usize)>> = Vec::new();
        for ((limit, key), &cost) in matched.iter().zip(keys).zip(costs) {
            let slot = limit.and_then(|l| {
                let rule = l.rule.as_ref()?;
                let list = if l.shadow_mode {
                    &mut shadow
                } else {
                    &mut enforced
                };
                let index = match list
                    .iter()
                    .position(|(x, _)| x.key == key && x.rule.same_identity(rule))
                {
                    Some(i) => {
                        list[i].1 =
                            if charge == Charge::CheckChargingRefusals || !charge.may_refuse() {
                                list[i].1.saturating_add(cost)
                            } else {
                                list[i].1.max(cost)
                            };
                        i
                    }
                    None => {
                        list.push((Limit { rule, key }, cost));
                        list.len() - 1
                    }
                };
                Some((l.shadow_mode, index))
            });
            slot_of.push(slot);
        }
        // Both checks in flight at once: the store may share one round trip between them.
        let enforced_check = async {
            if enforced.is_empty() || blocked {
                Ok(None)
            } else {
                self.run_costed(&enforced, request_id, charge)
                    .await
                    .map(Some)
            }
        };
        // Boxed: held inline, a shadow check's future would double the size of every
        // request's future (copied and allocated per call), for the few that have one.
        let shadow_check = async {
            if shadow.is_empty() {
                Ok(None)
            } else {
                Box::pin(self.run_costed(&shadow, request_id, charge))
                    .await
                    .map(Some)
            }
        };
        let (outcome, shadow_outcome) = tokio::try_join!(enforced_check, shadow_check)?;
        let decisions = slot_of
            .iter()
            .map(|slot| match slot {
                Some((false, i)) => outcome.as_ref().map(|o| o.limits()[*i]),
                Some((true, i)) => shadow_outcome.as_ref().map(|o| o.limits()[*i]),
                None => None,
            })
            .collect();
        Ok((decisions, outcome))
    }

    /// envoy's counting: each limited descriptor a check of its own, at its own cost, in
    /// its own mode (a check's refusal charged). Descriptors of the same limit (rule and
    /// key) are checked one after another in request order, as envoy's pipeline applies
    /// them; the others are independent, so every such lane is in flight at once and the
    /// store may decide them in one round trip (envoy's pipeline sends a request's
    /// increments together). The outcome combines the enforced ones that may refuse, else
    /// the standings (docs/SPEC.md, "Several rules in one check", for the fields).
    pub(super) async fn decide_each(
        &self,
        matched: &[Option<&ConfiguredLimit>],
        keys: &[String],
        costs: &[u64],
        modes: &[Mode<'_>],
    ) -> Result<Counted, DecideError> {
        let rule_of = |i: usize| matched[i].and_then(|l| l.rule.as_ref());
        let mut lanes: Vec<Vec<usize>> = Vec::new();
        for i in 0..matched.len() {
            let Some(rule) = rule_of(i) else { continue };
            let same_limit = |lane: &&mut Vec<usize>| {
                keys[lane[0]] == keys[i] && rule_of(lane[0]).is_some_and(|r| r.same_identity(rule))
            };
            match lanes.iter_mut().find(same_limit) {
                Some(lane) => lane.push(i),
                None => lanes.push(vec![i]),
            }
        }
        let check = |i: usize| async move {
            let rule = rule_of(i).expect("a lane holds limited descriptors only");
            let charge = match modes[i].charge {
                Charge::Check => Charge::CheckChargingRefusals,
                other => other,
            };
            let limits = [Limit {
                rule,
                key: &keys[i],
            }];
            let outcome = self
                .run(&limits, costs[i], &[], modes[i].request_id, charge)
                .await?;
            Ok::<_, DecideError>((charge, outcome))
        };
        let lanes_checked = lanes.iter().map(|lane| async move {
            let mut checked = Vec::with_capacity(lane.len());
            for &i in lane {
                checked.push((i, check(i).await?));
            }
            Ok::<_, DecideError>(checked)
        });
        let mut answers: Vec<Option<(Charge, Outcome)>> = matched.iter().map(|_| None).collect();
        for lane in futures_util::future::join_all(lanes_checked).await {
            for (i, answer) in lane? {
                answers[i] = Some(answer);
            }
        }
        let mut decisions = Vec::with_capacity(matched.len());
        let (mut enforced, mut standing) = (Vec::new(), Vec::new());
        let mut decided_by = DecidedBy::Store;
        for (limit, answer) in matched.iter().zip(answers) {
            let (Some(limit), Some((charge, outcome))) = (limit, answer) else {
                decisions.push(None);
                continue;
            };
            if !limit.shadow_mode {
                if charge.may_refuse() {
                    enforced.push(outcome.decision);
                } else {
                    standing.push(outcome.decision);
                }
                if outcome.decided_by != DecidedBy::Store {
                    decided_by = outcome.decided_by;
                }
            }
            decisions.push(Some(outcome.decision));
        }
        let refusable = !enforced.is_empty() || standing.is_empty();
        let combined = if refusable { &enforced } else { &standing };
        let outcome = Decision::combine(combined).map(|decision| {
            let mut outcome = Outcome::single(decision);
            outcome.decided_by = decided_by;
            outcome
        });
        Ok((decisions, outcome, refusable))
    }

    /// One check of `limits`, each at its own cost.
    async fn run_costed(
        &self,
        limits: &[(Limit<'_>, u64)],
        request_id: Option<&str>,
        charge: Charge,
    ) -> Result<Outcome, DecideError> {
        let (limits, costs): (Vec<Limit<'_>>, Vec<u64>) = limits.iter().copied().unzip();
        // One cost for all, the common case, keeps the check's cheaper shape.
        let uniform = costs.iter().all(|&c| c == costs[0]);
        self.run(
            &limits,
            costs[0],
            if uniform { &[] } else { &costs },
            request_id,
            charge,
        )
        .await
    }

    /// One check of `limits`, timed and counted.
    async fn run(
        &self,
        limits: &[Limit<'_>],
        cost: u64,
        costs: &[u64],
        request_id: Option<&str>,
        charge: Charge,
    ) -> Result<Outcome, DecideError> {
        let check = Check {
            costs,
            request_id,
            charge,
            ..Check::new(limits, cost)
        };
        let started = std::time::Instant::now();
        let outcome = self.limiter.decide(&check).await?;
        self.metrics.check(limits, &outcome, started.elapsed());
        Ok(outcome)
    }
}

/// The checks a request's descriptors make under sluicegate's counting (or envoy's
/// stop-increment, whose checks charge refusals): first the one of every descriptor that
/// may refuse, then one per other mode and request id, in request order.
fn groups<'a>(modes: &[Mode<'a>], counting: Counting) -> Result<Vec<Group<'a>>, DecideError> {
    let check = if counting == Counting::StopIncrementWhenOverLimit {
        Charge::CheckChargingRefusals
    } else {
        Charge::Check
    };
    let mut refusable = Group {
        mode: Mode {
            charge: check,
            request_id: None,
        },
        members: Vec::new(),
    };
    let mut others: Vec<Group<'a>> = Vec::new();
    // The first descriptor with a request id, and the id: every other must be the same.
    let mut first_id: Option<(usize, &'a str)> = None;
    for (i, mode) in modes.iter().enumerate() {
        if !mode.charge.may_refuse() {
            match others.iter_mut().find(|g| g.mode == *mode) {
                Some(group) => group.members.push(i),
                None => others.push(Group {
                    mode: *mode,
                    members: vec![i],
                }),
            }
            continue;
        }
        if mode.charge == Charge::Reserve {
            refusable.mode.charge = Charge::Reserve;
        }
        if let Some(id) = mode.request_id {
            match first_id {
                Some((j, other)) if other != id => {
                    return Err(DecideError::Invalid(format!(
                        "descriptors[{i}]: request id {id:?} is not descriptors[{j}]'s \
                         {other:?}; a request's check and reserve descriptors are one \
                         check, under one id"
                    )));
                }
                Some(_) => {}
                None => first_id = Some((i, id)),
            }
        }
        refusable.members.push(i);
    }
    refusable.mode.request_id = first_id.map(|(_, id)| id);
    let mut groups = Vec::with_capacity(others.len() + 1);
    if !refusable.members.is_empty() {
        groups.push(refusable);
    }
    groups.extend(others);
    Ok(groups)
}
