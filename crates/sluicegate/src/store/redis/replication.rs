//! How each server the store decides on replicates: how many replicas it has online
//! (`INFO replication`'s `slaveN:` lines) and whether it stops accepting writes when
//! too few are (`min-replicas-to-write`, `min-replicas-max-lag`). Redis replicates
//! asynchronously: a master cut off from its replicas keeps accepting admissions unless
//! `min-replicas-to-write` stops it, and a replica promoted in its place has not seen
//! them. Read with the eviction policy, at connect and then every so often, off the
//! decision path; on a cluster, on every master.

use std::collections::HashMap;
use std::time::Duration;

use redis::{FromRedisValue, RedisError, Value};

use super::connect::{Connection, on_each_node};
use crate::store::Durability;

/// A master's `min-replicas-to-write` and `min-replicas-max-lag`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinReplicas {
    /// Replicas that must be connected, lagging at most `max_lag`, for the master to
    /// accept writes; 0: it accepts them without any.
    pub to_write: u64,
    /// How long since a replica's last acknowledgement (whole seconds) beyond which it
    /// does not count.
    pub max_lag: Duration,
}

/// One server's replication, as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReplication {
    /// The server: the store's URL without credentials, or a cluster master's address.
    pub node: String,
    /// Replicas online (connected and in sync) on it, or why `INFO replication` did not
    /// tell.
    pub replicas: Result<u64, String>,
    /// Its write guard, or why `CONFIG GET min-replicas-*` did not tell.
    pub min_replicas: Result<MinReplicas, String>,
}

/// What the store last read of its servers' replication.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replication {
    /// Every server the store decides on (each master of a cluster).
    pub nodes: Vec<NodeReplication>,
}

/// The settings that stop a master cut off from its replicas from accepting writes.
const WRITE_GUARD: &str = "min-replicas-to-write 1 with min-replicas-max-lag 10";

impl Replication {
    /// Under [`Durability::Replicated`], the servers with no replica online, named:
    /// every check there that records units fails. `None` under [`Durability::Async`],
    /// or when every server has one (or could not be asked: its checks tell).
    pub fn warning(&self, durability: Durability) -> Option<String> {
        if durability != Durability::Replicated {
            return None;
        }
        let alone: Vec<&str> = self
            .nodes
            .iter()
            .filter(|node| node.replicas == Ok(0))
            .map(|node| node.node.as_str())
            .collect();
        (!alone.is_empty()).then(|| {
            format!(
                "store durability replicated: redis at {} has no replica online, so every \
                 check there that admits fails as not replicated",
                alone.join(", ")
            )
        })
    }

    /// The servers that accept writes with no replica connected (`min-replicas-to-write`
    /// 0), named with the settings that stop them: what a master cut off from its
    /// cluster admits is lost when its replica takes over. `None` when every server
    /// refuses them.
    pub fn advice(&self) -> Option<String> {
        let unguarded: Vec<&str> = self
            .nodes
            .iter()
            .filter(|node| matches!(node.min_replicas, Ok(MinReplicas { to_write: 0, .. })))
            .map(|node| node.node.as_str())
            .collect();
        (!unguarded.is_empty()).then(|| {
            format!(
                "redis at {} accepts writes with no replica connected \
                 (min-replicas-to-write 0): a master cut off from its replicas keeps \
                 admitting, and a failover loses those admissions; {WRITE_GUARD} on each \
                 master makes it refuse them instead",
                unguarded.join(", ")
            )
        })
    }

    /// One line for the log: each server's replicas and write guard.
    pub fn summary(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|node| {
                let replicas = match &node.replicas {
                    Ok(n) => format!("{n} replicas online"),
                    Err(why) => format!("replicas unknown ({why})"),
                };
                let guard = match &node.min_replicas {
                    Ok(m) => format!(
                        "min-replicas-to-write {}, min-replicas-max-lag {}",
                        m.to_write,
                        m.max_lag.as_secs()
                    ),
                    Err(why) => format!("min-replicas-to-write unknown ({why})"),
                };
                format!("redis at {}: {replicas}, {guard}", node.node)
            })
            .collect();
        nodes.join("; ")
    }
}

/// Logs the replication as read at connect (under `durability`), then what changed:
/// a warning when a server's checks start failing for want of a replica, a notice when
/// they no longer do or when the write guard changes.
pub(super) fn log_change(before: Option<&Replication>, now: &Replication, durability: Durability) {
    if before.is_none() {
        tracing::info!("redis replication: {}", now.summary());
    }
    let was = before.and_then(|before| before.warning(durability));
    match now.warning(durability) {
        Some(warning) if was.as_ref() != Some(&warning) => tracing::warn!("{warning}"),
        None if was.is_some() => {
            tracing::info!("store durability replicated: every redis has a replica again");
        }
        _ => {}
    }
    let advised = before.and_then(Replication::advice);
    if let Some(advice) = now.advice()
        && advised.as_ref() != Some(&advice)
    {
        tracing::info!("{advice}");
    }
}

/// Every server's replicas and write guard.
pub(super) async fn read(connection: &Connection, server: &str, timeout: Duration) -> Replication {
    let mut config = redis::cmd("CONFIG");
    config.arg("GET").arg("min-replicas-*");
    let mut info = redis::cmd("INFO");
    info.arg("replication");
    let mut guards: HashMap<String, Result<Value, String>> =
        on_each_node(connection, server, &config, timeout)
            .await
            .into_iter()
            .collect();
    let mut nodes: Vec<NodeReplication> = on_each_node(connection, server, &info, timeout)
        .await
        .into_iter()
        .map(|(node, info)| {
            let min_replicas = guards
                .remove(&node)
                .unwrap_or_else(|| Err("no answer to CONFIG GET".to_owned()))
                .and_then(from_config);
            NodeReplication {
                node,
                replicas: info.and_then(from_info),
                min_replicas,
            }
        })
        .collect();
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    Replication { nodes }
}

/// The write guard in `CONFIG GET min-replicas-*`'s reply (a map, or RESP2's flat pairs).
fn from_config(reply: Value) -> Result<MinReplicas, String> {
    if let Value::ServerError(e) = reply {
        return Err(RedisError::from(e).to_string());
    }
    let pairs = HashMap::<String, String>::from_redis_value(reply).map_err(|e| e.to_string())?;
    let number = |name: &str| {
        pairs
            .get(name)
            .ok_or_else(|| format!("CONFIG GET answered no {name}"))?
            .parse::<u64>()
            .map_err(|e| format!("{name}: {e}"))
    };
    Ok(MinReplicas {
        to_write: number("min-replicas-to-write")?,
        max_lag: Duration::from_secs(number("min-replicas-max-lag")?),
    })
}

/// The replicas online in `INFO replication`: its `slaveN:` lines with `state=online`.
/// A replica still waiting for or loading its first copy is connected, but acknowledges
/// nothing until it is online.
fn from_info(reply: Value) -> Result<u64, String> {
    let text = String::from_redis_value(reply).map_err(|e| e.to_string())?;
    if !text
        .lines()
        .any(|line| line.starts_with("connected_slaves:"))
    {
        return Err("INFO replication has no connected_slaves line".to_owned());
    }
    let online = text
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, fields)| {
            name.strip_prefix("slave")
                .is_some_and(|n| n.parse::<u32>().is_ok())
                && fields
                    .trim()
                    .split(',')
                    .any(|field| field == "state=online")
        })
        .count();
    Ok(u64::try_from(online).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, replicas: u64, to_write: u64) -> NodeReplication {
        NodeReplication {
            node: name.to_owned(),
            replicas: Ok(replicas),
            min_replicas: Ok(MinReplicas {
                to_write,
                max_lag: Duration::from_secs(10),
            }),
        }
    }

    #[test]
    fn both_replies_are_read() {
        let pairs = Value::Array(
            ["min-replicas-max-lag", "10", "min-replicas-to-write", "1"]
                .map(|s| Value::BulkString(s.as_bytes().to_vec()))
                .to_vec(),
        );
        assert_eq!(
            from_config(pairs),
            Ok(MinReplicas {
                to_write: 1,
                max_lag: Duration::from_secs(10)
            })
        );
        let info = Value::BulkString(
            b"# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
              slave0:ip=127.0.0.1,port=7001,state=online,offset=42,lag=0\r\n\
              slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n"
                .to_vec(),
        );
        assert_eq!(from_info(info), Ok(1));
    }

    #[test]
    fn a_master_without_replicas_is_named_under_replicated_only() {
        let replication = Replication {
            nodes: vec![node("a:1", 1, 1), node("b:2", 0, 0)],
        };
        assert_eq!(replication.warning(Durability::Async), None);
        let warning = replication.warning(Durability::Replicated).unwrap();
        assert!(warning.contains("redis at b:2 has no replica"), "{warning}");
        let advice = replication.advice().unwrap();
        assert!(
            advice.starts_with("redis at b:2 accepts writes"),
            "{advice}"
        );
        assert!(advice.contains("min-replicas-to-write 1"), "{advice}");
    }
}
