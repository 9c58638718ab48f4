//! What the usage tests share: the stores they reach Redis through (keys of each test's
//! own, functions or EVALSHA, a server or a cluster), and the lines of worked examples with
//! the answers docs/SPEC.md prints for them.

use std::time::Duration;

use sluicegate::store::redis::Scripting;
use sluicegate::{Charge, Decision, RedisStore, RedisStoreConfig, RetryAfter};
use sluicegate_test_support as support;

fn prefix(test: &str) -> String {
    format!("test:usage-{test}:{}:", std::process::id())
}

/// A store on `url`, keys of its own, sending its checks as functions or by EVALSHA.
pub(crate) async fn store_at(url: &str, test: &str, scripting: Scripting) -> RedisStore {
    let mut config = RedisStoreConfig::new(url);
    config.prefix = prefix(test);
    config.timeout = Duration::from_secs(2);
    config.scripting = scripting;
    RedisStore::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect to the test server at {url}: {e}"))
}

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
    let RetryAfter::Micros(retry) = decision.retry_after else {
        panic!("no usage example waits forever: {decision:?}");
    };
    (
        decision.allowed,
        decision.remaining,
        retry,
        decision.reset_after,
        decision.delay,
    )
}
