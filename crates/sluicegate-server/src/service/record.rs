//! What one descriptor's decision leaves behind: its rule's counters (or the usage units
//! of a report, settle or refund), and, for a refusal, the offenders' tracker and the
//! sampled refusal log.

use sluicegate::internals::{saturating_micros, signed_micros};
use sluicegate::{Charge, Decision};

use super::{Live, Service, descriptor_text, detailed_key};
use crate::config::{ConfiguredLimit, Entry};

/// One descriptor as it was decided.
pub(super) struct DecidedDescriptor<'a> {
    pub(super) limit: Option<&'a ConfiguredLimit>,
    pub(super) decision: Option<&'a Decision>,
    pub(super) entries: &'a [Entry],
    pub(super) cost: u64,
    pub(super) charge: Charge,
}

impl Service {
    /// Records `descriptor`, of `domain`, under the configuration `live`.
    pub(super) fn record(&self, live: &Live, domain: &str, descriptor: DecidedDescriptor<'_>) {
        let DecidedDescriptor {
            limit,
            decision,
            entries,
            cost,
            charge,
        } = descriptor;
        if decision.is_some() && !charge.may_refuse() {
            // Units reported, settled or refunded: no request was decided.
            self.metrics.usage(domain, charge, cost);
        } else if let (Some(l), Some(decision)) = (limit, decision) {
            if l.detailed_metric {
                // Labelled by the request's values: looked up per decision.
                let window_us = l
                    .rule
                    .as_ref()
                    .map_or(0, |rule| saturating_micros(rule.window()));
                self.metrics
                    .detailed_rule_metrics(
                        &l.path,
                        &detailed_key(domain, entries),
                        window_us.max(l.block_window.unwrap_or(0)),
                        self.now_micros(),
                    )
                    .count(decision, cost, l.shadow_mode);
            } else if let Some(counters) = live.rule_metrics.get(&l.path) {
                counters.count(decision, cost, l.shadow_mode);
            } else {
                self.metrics
                    .rule_metrics(&l.path)
                    .count(decision, cost, l.shadow_mode);
            }
            if !decision.allowed
                && !l.shadow_mode
                && let Some(tracker) = live.offenders.get(&l.path)
            {
                // A long descriptor logs (and is tracked) as its first bytes and a digest.
                let text = descriptor_text(entries);
                let descriptor = crate::offenders::shown(&text);
                if self.refusal_log.pick() {
                    tracing::info!(
                        target: "sluicegate::refusal",
                        domain,
                        rule = %l.path,
                        descriptor = %descriptor,
                        cost,
                        limit = decision.limit,
                        retry_after_us = signed_micros(decision.retry_after()),
                        "refused"
                    );
                }
                tracker.record(&descriptor, cost, self.now_micros());
            }
        }
    }
}
