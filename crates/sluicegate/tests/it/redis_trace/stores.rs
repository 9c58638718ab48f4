//! How the Redis tests reach Redis: a store with keys of its own (named by the test and
//! this process, so no test meets another's state), a patient timeout (long enough for a
//! cluster's slot to move under its checks on a loaded machine), and its checks sent as
//! functions or by EVALSHA.

use std::time::Duration;

use sluicegate::redis::Scripting;
use sluicegate::{RedisStore, RedisStoreConfig};

/// The key prefix of test `test`.
pub(crate) fn prefix(test: &str) -> String {
    format!("test:{test}:{}:", std::process::id())
}

/// A store on `url`, keys of its own, sending its checks as functions or by EVALSHA.
pub(crate) async fn store_at(url: &str, test: &str, scripting: Scripting) -> RedisStore {
    let mut config = RedisStoreConfig::new(url);
    config.prefix = prefix(test);
    config.timeout = Duration::from_secs(5);
    config.scripting = scripting;
    RedisStore::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect to the test server at {url}: {e}"))
}
