//! Why a request would be allowed or refused, without deciding it: each descriptor's match
//! (or why it has none), each matched rule's state read with a peek, and whether the
//! request's cost would be admitted.
//!
//! A peek (a check of cost 0) answers as a check of cost 1 at the same instant and records
//! nothing, on every store (docs/SPEC.md, "A check and its cost"). Each rule is peeked
//! alone, so that its numbers are its own and not held back by another rule. A request of
//! cost 0 under envoy's counting is itself a peek with refusals charged, which is decided
//! for no units: its verdict is read with such a peek.

use sluicegate::{Charge, Check, Limit, Outcome, Rule};

use super::{DecideError, Service, apply_replaces, counted_keys, descriptor_text, matched};
use crate::compat::Counting;
use crate::config::{ConfiguredLimit, Entry};

/// What one request descriptor matched.
pub(crate) enum Match {
    /// A limited rule: its state is read.
    Rule(Rule),
    /// An `unlimited` rule: never refuses, asks no store.
    Unlimited,
    /// A block (`requests_per_unit: 0`): refuses every request, asks no store.
    Block,
    /// It matched the limit at `path`, which another matched limit `replaces`.
    Replaced {
        /// The replaced limit's path.
        path: String,
        /// The path of the limit that replaces it.
        by: String,
    },
    /// Nothing matched; the words say where matching stopped.
    Nothing(String),
}

/// One descriptor, explained.
pub(crate) struct DescriptorExplained {
    /// Its entries as `key=value,…`.
    pub(crate) entries: String,
    /// The matched limit's path, when one applies.
    pub(crate) path: Option<String>,
    /// The matched limit's `name`, when it has one.
    pub(crate) name: Option<String>,
    pub(crate) matched: Match,
    /// The limit is in shadow mode: it would be decided and counted, never enforced.
    pub(crate) shadow: bool,
    /// The units asked of its limit: the request's cost, or the costs of every descriptor
    /// on the same rule and key as the service's counting combines them.
    pub(crate) units: u64,
    /// The rule's state now, a peek's answer; `None` unless a limited rule matched.
    pub(crate) state: Option<Outcome>,
    /// This descriptor's limit would refuse the request (shadow ones included, which
    /// would be counted as refusals but not enforced).
    pub(crate) would_refuse: bool,
}

/// A request, explained.
pub(crate) struct Explained {
    pub(crate) descriptors: Vec<DescriptorExplained>,
    /// The request would be admitted.
    pub(crate) allowed: bool,
    /// How the service counts a request's descriptors (`--compat`).
    pub(crate) counting: Counting,
}

/// Units a check at the instant of `state`'s peek could take: the peek answers as a cost
/// of 1, so an allowed one leaves `remaining` after that unit.
pub(crate) fn available(state: &Outcome) -> u64 {
    state.decision.remaining + u64::from(state.decision.allowed)
}

impl Service {
    /// What [`Service::decide`] would answer for `descriptors` at `cost` each, read without
    /// changing any state: no units, no metrics, no offenders.
    pub(crate) async fn explain(
        &self,
        domain: &str,
        descriptors: &[Vec<Entry>],
        cost: u64,
    ) -> Result<Explained, DecideError> {
        self.validate(descriptors)?;
        let live = self.live();
        let config = &live.config;
        let found = matched(&live, domain, descriptors)?;
        let mut limits = found.clone();
        apply_replaces(&mut limits);
        let keys = counted_keys(domain, descriptors, &limits);
        // The units each descriptor's limit is asked for: descriptors on one rule and key
        // are one limit, at the larger cost when all-or-nothing, at their sum when each
        // one counts (decide_together, decide_each); a peek answers as a cost of 1.
        let units: Vec<u64> = limits
            .iter()
            .zip(&keys)
            .map(|(limit, key)| {
                let sharing = limits
                    .iter()
                    .zip(&keys)
                    .filter(|(other, other_key)| *other_key == key && same_limit(limit, other))
                    .count() as u64;
                match self.options.counting {
                    // A peek records nothing: each answers for one unit alone, but for none
                    // under envoy's counting (docs/SPEC.md, "Charging refusals").
                    Counting::AllOrNothing if cost == 0 => 1,
                    Counting::AllOrNothing => cost,
                    Counting::EachDescriptor | Counting::StopIncrementWhenOverLimit => {
                        cost.saturating_mul(sharing.max(1))
                    }
                }
            })
            .collect();

        let mut explained = Vec::with_capacity(descriptors.len());
        for (i, entries) in descriptors.iter().enumerate() {
            let (limit, units) = (limits[i], units[i]);
            let matched = match (found[i], limit) {
                (_, Some(l)) if l.blocked() => Match::Block,
                (
                    _,
                    Some(ConfiguredLimit {
                        rule: Some(rule), ..
                    }),
                ) => Match::Rule(rule.clone()),
                (_, Some(_)) => Match::Unlimited,
                (Some(replaced), None) => Match::Replaced {
                    path: replaced.path.clone(),
                    by: replacer(&limits, replaced),
                },
                (None, None) => Match::Nothing(
                    config
                        .miss(domain, entries)
                        .unwrap_or_else(|_| format!("unknown domain {domain:?}")),
                ),
            };
            let state = match &matched {
                Match::Rule(rule) => Some(self.peek(rule, &keys[i], cost).await?),
                _ => None,
            };
            let would_refuse = match (&matched, &state) {
                (Match::Block, _) => true,
                // Envoy's look at no units: refused only past the limit, which a peek of
                // one unit cannot tell from at it; a peek as envoy's counting makes it can.
                (Match::Rule(rule), Some(_)) if units == 0 => {
                    !self.peek_charged(rule, &keys[i]).await?.decision.allowed
                }
                (_, Some(state)) => units > available(state),
                _ => false,
            };
            explained.push(DescriptorExplained {
                entries: descriptor_text(entries),
                path: limit.map(|l| l.path.clone()),
                name: limit.and_then(|l| l.name.clone()),
                matched,
                shadow: limit.is_some_and(|l| l.shadow_mode),
                units,
                state,
                would_refuse,
            });
        }
        let allowed = !explained.iter().any(|d| d.would_refuse && !d.shadow);
        Ok(Explained {
            descriptors: explained,
            allowed,
            counting: self.options.counting,
        })
    }

    /// One rule's state under `key`, read with a peek that records nothing; a `cost` the
    /// check would reject is rejected alike.
    async fn peek(&self, rule: &Rule, key: &str, cost: u64) -> Result<Outcome, DecideError> {
        let limits = [Limit { rule, key }];
        Check::new(&limits, cost).validate()?;
        Ok(self.limiter.decide(&Check::new(&limits, 0)).await?)
    }

    /// One rule's look under `key` as envoy's counting makes it: a peek with refusals
    /// charged, which records nothing.
    async fn peek_charged(&self, rule: &Rule, key: &str) -> Result<Outcome, DecideError> {
        let limits = [Limit { rule, key }];
        let check = Check {
            charge: Charge::CheckChargingRefusals,
            ..Check::new(&limits, 0)
        };
        Ok(self.limiter.decide(&check).await?)
    }
}

/// Two matches are one limit: the same rule, by identity.
fn same_limit(a: &Option<&ConfiguredLimit>, b: &Option<&ConfiguredLimit>) -> bool {
    match (
        a.and_then(|l| l.rule.as_ref()),
        b.and_then(|l| l.rule.as_ref()),
    ) {
        (Some(a), Some(b)) => a.same_identity(b),
        _ => false,
    }
}

/// The path of the matched limit whose `replaces` names `replaced`.
fn replacer(limits: &[Option<&ConfiguredLimit>], replaced: &ConfiguredLimit) -> String {
    limits
        .iter()
        .flatten()
        .find(|l| {
            replaced
                .name
                .as_ref()
                .is_some_and(|name| l.replaces.contains(name))
        })
        .map_or_else(String::new, |l| l.path.clone())
}

#[cfg(test)]
mod tests;
