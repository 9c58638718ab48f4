//! Counting a request's matched limits: sluicegate's one all-or-nothing check (and envoy's
//! stop-increment, the same check charging refusals), or envoy's check per descriptor.

use sluicegate::{Charge, Check, DecidedBy, Decision, Limit, Outcome};

use super::Service;
use super::answer::{BLOCKED, DecideError};
use crate::config::ConfiguredLimit;

impl Service {
    /// A block's decision now: it resets when its unit's window, aligned to the epoch as a
    /// fixed window's, ends (as envoyproxy/ratelimit reports it).
    pub(super) fn block(&self, limit: &ConfiguredLimit) -> Decision {
        let now = self.limiter.clock().now_micros();
        Decision {
            reset_after: limit.block_window.map_or(0, |window| window - now % window),
            ..BLOCKED
        }
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
        // at the larger of their costs; under envoy's counting at their sum, as envoy
        // counts each.
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
                        list[i].1 = if charge == Charge::Attempted {
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
        let shadow_check = async {
            if shadow.is_empty() {
                Ok(None)
            } else {
                self.run_costed(&shadow, request_id, charge).await.map(Some)
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

    /// envoy's counting: each limited descriptor a check of its own, at its own cost, its
    /// refusal charged; in request order, as envoy's pipeline runs. The outcome combines
    /// the enforced ones (docs/SPEC.md, "Several rules in one check", for the fields).
    pub(super) async fn decide_each(
        &self,
        matched: &[Option<&ConfiguredLimit>],
        keys: &[String],
        costs: &[u64],
        request_id: Option<&str>,
    ) -> Result<(Vec<Option<Decision>>, Option<Outcome>), DecideError> {
        let mut decisions = Vec::with_capacity(matched.len());
        let mut enforced = Vec::new();
        let mut decided_by = DecidedBy::Store;
        for ((limit, key), &cost) in matched.iter().zip(keys).zip(costs) {
            let Some((l, rule)) = limit.and_then(|l| Some(l).zip(l.rule.as_ref())) else {
                decisions.push(None);
                continue;
            };
            let outcome = self
                .run(
                    &[Limit { rule, key }],
                    cost,
                    &[],
                    request_id,
                    Charge::Attempted,
                )
                .await?;
            if !l.shadow_mode {
                enforced.push(outcome.decision);
                if outcome.decided_by != DecidedBy::Store {
                    decided_by = outcome.decided_by;
                }
            }
            decisions.push(Some(outcome.decision));
        }
        let outcome = Decision::combine(&enforced).map(|decision| {
            let mut outcome = Outcome::single(decision);
            outcome.decided_by = decided_by;
            outcome
        });
        Ok((decisions, outcome))
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
        self.metrics.check(outcome.decided_by, started.elapsed());
        Ok(outcome)
    }
}
