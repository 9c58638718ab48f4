//! Reloads in the model's traces (docs/SPEC.md, "Changing a rule's numbers"): new numbers
//! for a rule, and which state a rule shares by the SPEC.

use std::time::Duration;

use proptest::prelude::*;
use sluicegate::internals::saturating_micros;
use sluicegate::{Algorithm, LogLayout, Rule, RuleSpec};

/// What docs/SPEC.md says a rule's state is shared by, besides its name: the algorithm and
/// the numbers without which the state cannot be read.
pub(crate) fn shared_by(rule: &Rule) -> String {
    let spec = rule.spec();
    match spec.algorithm {
        Algorithm::SlidingLog if spec.layout == Some(LogLayout::Compact) => {
            format!("log compact {:?}", spec.window)
        }
        Algorithm::SlidingLog => format!("log zset {:?}", spec.window),
        Algorithm::SlidingCounter => format!("counter {:?} {}", spec.window, rule.buckets()),
        Algorithm::FixedWindow => format!("fixed {:?}", spec.window),
        Algorithm::TokenBucket => "token".into(),
        Algorithm::LeakyBucket => "leaky".into(),
    }
}

/// New numbers for a rule: its name and algorithm stay.
#[derive(Clone, Debug)]
pub(crate) struct Reload {
    limit: u64,
    /// The burst of a token bucket (at least 1), the queue of a leaky bucket.
    size: u64,
    /// A new window, or the same.
    window: Option<u64>,
}

/// `spec` with the numbers of `reload`, within every bound.
pub(crate) fn reloaded(spec: &RuleSpec, reload: &Reload) -> RuleSpec {
    let window = reload
        .window
        .map(Duration::from_micros)
        .unwrap_or(spec.window);
    let mut new = RuleSpec {
        limit: reload.limit,
        window,
        ..spec.clone()
    };
    match spec.algorithm {
        Algorithm::SlidingCounter
            if spec
                .buckets
                .is_some_and(|n| !saturating_micros(window).is_multiple_of(n)) =>
        {
            new.buckets = Some(1);
        }
        Algorithm::TokenBucket => new.burst = Some(reload.size.max(1)),
        Algorithm::LeakyBucket => new.queue = Some(reload.size),
        _ => {}
    }
    new
}

pub(crate) fn reload_strategy() -> impl Strategy<Value = Option<Reload>> {
    let window = prop_oneof![
        3 => Just(None),
        1 => prop::sample::select(vec![10u64, 12, 30, 60, 100, 120]).prop_map(Some),
    ];
    let reload = (1u64..=6, 0u64..=6, window).prop_map(|(limit, size, window)| Reload {
        limit,
        size,
        window,
    });
    prop_oneof![14 => Just(None), 1 => reload.prop_map(Some)]
}
