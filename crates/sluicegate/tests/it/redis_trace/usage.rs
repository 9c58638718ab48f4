//! What the usage tests share: every way they reach Redis (a server through functions and
//! EVALSHA, a cluster), and the lines of worked examples with the answers docs/SPEC.md
//! prints for them.

use sluicegate::internals::saturating_micros;
use sluicegate::redis::Scripting;
use sluicegate::{Charge, Decision, RedisStore, RetryAfter};
use sluicegate_test_support as support;

use super::stores::store_at;

/// The three ways the tests reach Redis: a server through functions, the same through
/// EVALSHA, and a cluster.
pub(crate) async fn every_store(test: &str) -> Vec<RedisStore> {
    let server = support::standalone().url();
    let functions = store_at(&server, test, Scripting::Auto).await;
    assert!(functions.uses_functions());
    let evalsha = store_at(&server, &format!("{test}-eval"), Scripting::Eval).await;
    assert!(!evalsha.uses_functions());
    let cluster = store_at(&support::cluster().url(), test, Scripting::Auto).await;
    vec![functions, evalsha, cluster]
}

/// One line of a worked example: time, cost, request id, mode.
pub(crate) type Line = (u64, u64, Option<&'static str>, Charge);

/// What docs/SPEC.md prints for it: allowed, remaining, retry_after, reset_after, delay.
pub(crate) type Printed = (bool, u64, u64, u64, u64);

pub(crate) fn printed(decision: &Decision) -> Printed {
    let RetryAfter::After(retry) = decision.retry_after() else {
        panic!("no usage example waits forever: {decision:?}");
    };
    (
        decision.allowed,
        decision.remaining,
        saturating_micros(retry),
        saturating_micros(decision.reset_after()),
        saturating_micros(decision.delay()),
    )
}
