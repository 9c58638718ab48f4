//! Whether Redis may evict sluicegate's keys. A server at `maxmemory` under any policy but
//! `noeviction` deletes keys to make room — `volatile-*` ones too, since every key of
//! ours has a TTL — and a limit whose state is deleted starts over: it admits up to L
//! again, and every answer still says the store decided. Nothing on the decision path can
//! see it happen, so the policy is read at connect and then every so often, off the
//! decision path: `CONFIG GET maxmemory-policy`, or `INFO memory` where CONFIG is renamed
//! or refused (managed Redis); on a cluster, on every master.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{FromRedisValue, RedisError, Value};

use super::connect::{Connection, on_each_node};
use super::periodic::Periodic;
use super::replication::{self, Replication};
use crate::store::Durability;

/// The one policy under which Redis never deletes a key to make room.
pub(crate) const NO_EVICTION: &str = "noeviction";

/// One server's `maxmemory-policy`, or why it could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePolicy {
    /// The server: the store's URL without credentials, or a cluster master's address.
    pub node: String,
    /// Its policy, or why neither `CONFIG GET` nor `INFO memory` told it.
    pub policy: Result<String, String>,
}

impl NodePolicy {
    /// The policy may delete our keys: anything but `noeviction`, and a policy that could
    /// not be read (it may be anything).
    pub fn at_risk(&self) -> bool {
        self.policy.as_deref() != Ok(NO_EVICTION)
    }
}

/// What the store last read of its servers' eviction policies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eviction {
    /// Every server the store decides on (each master of a cluster).
    pub nodes: Vec<NodePolicy>,
}

impl Eviction {
    /// Why the limits are at risk, naming each server that may evict and its policy;
    /// `None` when every server runs `noeviction`.
    pub fn warning(&self) -> Option<String> {
        let at_risk: Vec<String> = self
            .nodes
            .iter()
            .filter(|node| node.at_risk())
            .map(|node| match &node.policy {
                Ok(policy) => format!("redis at {} has maxmemory-policy {policy}", node.node),
                Err(why) => format!(
                    "cannot read the maxmemory-policy of redis at {}: {why}",
                    node.node
                ),
            })
            .collect();
        (!at_risk.is_empty()).then(|| {
            format!(
                "{}: at maxmemory Redis deletes keys to make room, and a limit whose state \
                 it deletes starts over, admitting more than its limit (set \
                 maxmemory-policy noeviction)",
                at_risk.join("; ")
            )
        })
    }
}

/// Keeps [`Eviction`] fresh: read at connect, then every `interval` on a task of its own,
/// which ends when this is dropped (with the last clone of the store). [`Replication`] is
/// read along with it.
pub(super) struct EvictionWatch {
    latest: Arc<Mutex<Eviction>>,
    replication: Arc<Mutex<Replication>>,
    _task: Periodic,
}

impl EvictionWatch {
    /// Reads the policies now (logging a warning if they put the limits at risk), then
    /// again every `interval` (never again if it is zero), each read within `timeout`;
    /// the replication too, logged as it matters under `durability`.
    pub(super) async fn start(
        connection: Connection,
        server: String,
        timeout: Duration,
        interval: Duration,
        durability: Durability,
    ) -> EvictionWatch {
        let first = read(&connection, &server, timeout).await;
        log_change(None, &first);
        let latest = Arc::new(Mutex::new(first));
        let first = replication::read(&connection, &server, timeout).await;
        replication::log_change(None, &first, durability);
        let replication = Arc::new(Mutex::new(first));
        let task = Periodic::start(interval, {
            let latest = Arc::clone(&latest);
            let replication = Arc::clone(&replication);
            move || {
                let (connection, server) = (connection.clone(), server.clone());
                let (latest, replication) = (Arc::clone(&latest), Arc::clone(&replication));
                async move {
                    let now = read(&connection, &server, timeout).await;
                    let before = std::mem::replace(&mut *latest.lock(), now.clone());
                    log_change(Some(&before), &now);
                    let now = replication::read(&connection, &server, timeout).await;
                    let before = std::mem::replace(&mut *replication.lock(), now.clone());
                    replication::log_change(Some(&before), &now, durability);
                }
            }
        });
        EvictionWatch {
            latest,
            replication,
            _task: task,
        }
    }

    /// The policies as last read.
    pub(super) fn latest(&self) -> Eviction {
        self.latest.lock().clone()
    }

    /// The replication as last read.
    pub(super) fn replication(&self) -> Replication {
        self.replication.lock().clone()
    }
}

/// Logs what changed: a warning when the limits become (or are, at first) at risk, a
/// notice when they no longer are.
fn log_change(before: Option<&Eviction>, now: &Eviction) {
    let was = before.and_then(Eviction::warning);
    match now.warning() {
        Some(warning) if was.as_ref() != Some(&warning) => {
            tracing::warn!("limits at risk of silent reset: {warning}");
        }
        None if was.is_some() => {
            tracing::info!("redis no longer evicts keys: maxmemory-policy {NO_EVICTION}");
        }
        _ => {}
    }
}

/// Every server's policy: `CONFIG GET`, or `INFO memory` for those that refuse it.
async fn read(connection: &Connection, server: &str, timeout: Duration) -> Eviction {
    let mut config = redis::cmd("CONFIG");
    config.arg("GET").arg("maxmemory-policy");
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    let mut nodes = Vec::new();
    let by_config = on_each_node(connection, server, &config, timeout).await;
    let mut refused = Vec::new();
    for (node, reply) in by_config {
        match reply.and_then(|reply| from_config(reply).map_err(|e| e.to_string())) {
            Ok(policy) => nodes.push(NodePolicy {
                node,
                policy: Ok(policy),
            }),
            Err(config_error) => refused.push((node, config_error)),
        }
    }
    if !refused.is_empty() {
        let by_info: HashMap<String, Result<Value, String>> =
            on_each_node(connection, server, &info, timeout)
                .await
                .into_iter()
                .collect();
        for (node, config_error) in refused {
            let policy = match by_info.get(&node) {
                Some(Ok(reply)) => from_info(reply.clone()),
                Some(Err(info_error)) => Err(info_error.clone()),
                None => Err("no answer to INFO memory".to_owned()),
            }
            .map_err(|info_error| {
                format!("CONFIG GET failed ({config_error}), INFO memory too ({info_error})")
            });
            nodes.push(NodePolicy { node, policy });
        }
    }
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    Eviction { nodes }
}

/// The policy in `CONFIG GET maxmemory-policy`'s reply (a map, or RESP2's flat pairs).
fn from_config(reply: Value) -> Result<String, String> {
    if let Value::ServerError(e) = reply {
        return Err(RedisError::from(e).to_string());
    }
    let pairs = HashMap::<String, String>::from_redis_value(reply).map_err(|e| e.to_string())?;
    pairs
        .get("maxmemory-policy")
        .cloned()
        .ok_or_else(|| "CONFIG GET maxmemory-policy answered no value".to_owned())
}

/// The policy in `INFO memory`'s `maxmemory_policy:` line.
fn from_info(reply: Value) -> Result<String, String> {
    let text = String::from_redis_value(reply).map_err(|e| e.to_string())?;
    text.lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(|policy| policy.trim().to_owned())
        .ok_or_else(|| "INFO memory has no maxmemory_policy line".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, policy: Result<&str, &str>) -> NodePolicy {
        NodePolicy {
            node: name.to_owned(),
            policy: policy.map(str::to_owned).map_err(str::to_owned),
        }
    }

    #[test]
    fn every_policy_but_noeviction_is_a_risk_and_is_named() {
        let safe = Eviction {
            nodes: vec![node("a", Ok("noeviction")), node("b", Ok("noeviction"))],
        };
        assert_eq!(safe.warning(), None);
        let mixed = Eviction {
            nodes: vec![
                node("a", Ok("noeviction")),
                node("b", Ok("volatile-ttl")),
                node("c", Err("NOPERM")),
            ],
        };
        let warning = mixed.warning().unwrap();
        assert!(
            warning.contains("redis at b has maxmemory-policy volatile-ttl"),
            "{warning}"
        );
        assert!(
            warning.contains("cannot read the maxmemory-policy of redis at c: NOPERM"),
            "{warning}"
        );
        assert!(!warning.contains("at a"), "{warning}");
    }

    #[test]
    fn the_policy_is_read_from_either_reply() {
        let pairs = Value::Array(vec![
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"allkeys-lru".to_vec()),
        ]);
        assert_eq!(from_config(pairs).unwrap(), "allkeys-lru");
        let info = Value::BulkString(
            b"# Memory\r\nused_memory:1\r\nmaxmemory_policy:volatile-lfu\r\n".to_vec(),
        );
        assert_eq!(from_info(info).unwrap(), "volatile-lfu");
    }
}
