//! Rules cut to one instance's share of a store: the limit (and burst, queue) times a
//! factor, divided by the number of instances, rounded up — what the `local` fallback
//! (factor 1) and the local pre-check (factor ≥ 1) decide with. Each rule's share is made
//! once and kept, by rule identity, in shards: no lock is shared by every check.

use hashbrown::HashTable;

use super::room::Sharded;
use crate::rule::Rule;

/// A rule as it was cut (to tell a reload's new numbers from it), and its share.
type CachedShare = (Rule, Rule);

#[derive(Debug)]
pub(crate) struct Shares {
    /// The factor, in thousandths.
    per_mille: u64,
    instances: u64,
    /// Appended to a rule's name to name its share.
    suffix: &'static str,
    /// By rule identity, hashed by its fingerprint: (the original, its share). The
    /// original tells a rule whose numbers a reload changed (same identity) from the one
    /// cached.
    shards: Sharded<HashTable<CachedShare>>,
}

impl Shares {
    /// Shares of `per_mille` / 1000 × L / `instances`, named `{rule}{suffix}`.
    pub(crate) fn new(per_mille: u64, instances: u32, suffix: &'static str) -> Self {
        Shares {
            per_mille,
            instances: u64::from(instances.max(1)),
            suffix,
            shards: Sharded::new(),
        }
    }

    fn share(&self, n: u64) -> u64 {
        let share = (u128::from(n) * u128::from(self.per_mille))
            .div_ceil(1000 * u128::from(self.instances));
        u64::try_from(share).unwrap_or(u64::MAX)
    }

    /// `rule` cut to this instance's share.
    pub(crate) fn of(&self, rule: &Rule) -> Rule {
        let fingerprint = rule.fingerprint();
        let mut cache = self.shards.shard(fingerprint).lock();
        let cached = cache.find_entry(fingerprint, |(original, _)| {
            original.identity() == rule.identity()
        });
        if let Ok(entry) = &cached
            && entry.get().0.same_rule(rule)
        {
            return entry.get().1.clone();
        }
        // A reload changed the rule's numbers: its old share goes.
        if let Ok(entry) = cached {
            entry.remove();
        }
        let mut spec = rule.spec();
        spec.limit = self.share(spec.limit).max(1);
        spec.burst = spec.burst.map(|b| self.share(b).max(1));
        spec.queue = spec.queue.map(|q| self.share(q));
        // A share that breaks a bound of its own (one grown past a maximum) is the rule
        // itself. In the original's scope: two domains' rules of one name stay apart.
        let share = Rule::new(&format!("{}{}", rule.name(), self.suffix), &spec)
            .map(|share| match rule.scope() {
                Some(scope) => share.in_scope(scope),
                None => share,
            })
            .unwrap_or_else(|_| rule.clone());
        cache.insert_unique(
            fingerprint,
            (rule.clone(), share.clone()),
            |(original, _)| original.fingerprint(),
        );
        share
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{Algorithm, RuleSpec};
    use std::time::Duration;

    fn rule(limit: u64) -> Rule {
        Rule::new(
            "api",
            &RuleSpec::new(Algorithm::FixedWindow, limit, Duration::from_secs(1)),
        )
        .unwrap()
        .in_scope("shop")
    }

    #[test]
    fn a_share_is_cut_once_and_again_when_the_numbers_change() {
        let shares = Shares::new(1200, 2, "@test");
        let first = shares.of(&rule(100));
        assert_eq!(first.limit(), 60);
        assert_eq!(first.name(), "api@test");
        assert_eq!(first.scope(), Some("shop"));
        assert!(shares.of(&rule(100)).same_rule(&first));
        // A reload: same identity, new numbers — a new share, and only one kept.
        assert_eq!(shares.of(&rule(10)).limit(), 6);
        assert_eq!(shares.of(&rule(100)).limit(), 60);
        let held: usize = shares.shards.iter().map(|shard| shard.lock().len()).sum();
        assert_eq!(held, 1);
    }
}
