//! Whether Redis still holds what sluicegate wrote. A server restarted without persistence,
//! a `FLUSHALL`, or a failover to a replica that had not received the last writes all
//! leave Redis answering as if nothing had happened: every limit whose state went with
//! them starts over, and every answer still says the store decided. So each node (the
//! server, or each master of a cluster) is read at connect and then every check interval,
//! off the decision path — and a single server also on each new connection, before any
//! check is sent on it (`replaceable::Replaceable::for_check`): a restart always breaks the
//! connection, a Sentinel failover moves to a new one, so their losses are known before
//! the new process decides a check whose answer would replace what the limiter last knew:
//!
//! - an epoch marker: a key holding a random value that sluicegate writes once per node
//!   (on a cluster, in a slot that master serves; re-chosen when its slots move). Missing,
//!   or holding another value (another instance found it missing and wrote a new one),
//!   means the node lost what was written before: by a restart (a new `run_id`), a
//!   failover (a promoted replica of the master last read) or a flush (the same process).
//! - `INFO server` and `INFO replication`: a new `run_id` means a new process. With the
//!   marker there, it restarted with its data (an information, not a loss) — unless it is
//!   a promoted replica of the master last read (its `master_replid2` is that master's
//!   replication id) whose `second_repl_offset` is below the offset last read on that
//!   master: the bytes in between were acknowledged by the old master and never reached
//!   the new one.
//!
//! What this cannot see: writes made after the last read of a master that are lost in a
//! failover while the marker survives (the offset last read is older than them); a loss
//! before the first read; a restart from a snapshot taken after the marker was written but
//! before later writes, when the server keeps no replication offset to compare.
//!
//! What it sees only at the next period, the checks before it decided from what is left:
//! a flush (`FLUSHALL`, `FLUSHDB`: the connection stays), and every loss on a cluster,
//! whose node connections the cluster client makes and replaces out of the store's sight
//! (a call that met a broken one is sent again on the new one, without an error).
//!
//! A loss is logged at warn naming the node and the reason, counted by node and reason
//! ([`LostState`]), and bumps the generation [`RedisStore::lost_state_generation`] answers
//! for the node's keys.
//!
//! [`RedisStore::lost_state_generation`]: super::RedisStore

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::connect::Connection;
use super::error::{CallError, bounded};
use super::keys::{self, hash_slot, marker_key, wall_clock_micros};
use super::periodic::Periodic;
use super::replaceable::Verify;
use super::slots::{self, SLOTS, SlotMap};
use crate::store::check::Check;

/// Why a node's state is known lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LossReason {
    /// A new process without the data: restarted without persistence (or from a snapshot
    /// older than the marker).
    Restarted,
    /// The same process, its data gone: `FLUSHALL`, `FLUSHDB`, or the marker deleted.
    Flushed,
    /// A replica took over without every write the old master had acknowledged.
    FailedOver,
}

impl LossReason {
    /// The reason as a metric label: `restarted`, `flushed`, `failed_over`.
    pub fn label(self) -> &'static str {
        match self {
            LossReason::Restarted => "restarted",
            LossReason::Flushed => "flushed",
            LossReason::FailedOver => "failed_over",
        }
    }
}

/// The losses of one node for one reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateLoss {
    /// The server: the store's URL without credentials, or a cluster master's address.
    pub node: String,
    /// Why.
    pub reason: LossReason,
    /// How many times.
    pub count: u64,
    /// What was seen the last time.
    pub detail: String,
    /// When it was seen the last time, on this instance's wall clock.
    pub at: SystemTime,
}

/// A node as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchedNode {
    /// The server: the store's URL without credentials, or a cluster master's address.
    pub node: String,
    /// Its `run_id`.
    pub run_id: String,
    /// Its `master_repl_offset`.
    pub repl_offset: u64,
}

/// What the store has found of lost state since it connected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LostState {
    /// Every loss, by node and reason.
    pub losses: Vec<StateLoss>,
    /// Every node, as last read.
    pub nodes: Vec<WatchedNode>,
}

impl LostState {
    /// Which nodes lost state and why; `None` when none has. The service still decides:
    /// the limits of those nodes' keys started over once, and are exact again since.
    pub fn warning(&self) -> Option<String> {
        let named: Vec<String> = self
            .losses
            .iter()
            .map(|loss| {
                format!(
                    "redis at {} lost state sluicegate wrote ({}, {} time{}; last: {})",
                    loss.node,
                    loss.reason.label(),
                    loss.count,
                    if loss.count == 1 { "" } else { "s" },
                    loss.detail
                )
            })
            .collect();
        (!named.is_empty()).then(|| {
            format!(
                "{}: the limits of its keys started over, admitting up to their limit again \
                 (still deciding)",
                named.join("; ")
            )
        })
    }
}

/// One node's identity, from `INFO server` and `INFO replication`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    run_id: String,
    replid: String,
    replid2: String,
    offset: u64,
    second_offset: u64,
}

impl Identity {
    fn parse(text: &str) -> Option<Identity> {
        let field = |name: &str| {
            text.lines().find_map(|line| {
                line.strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .map(str::trim)
            })
        };
        let number = |name: &str| field(name).and_then(|value| value.parse::<i64>().ok());
        Some(Identity {
            run_id: field("run_id")?.to_owned(),
            replid: field("master_replid")?.to_owned(),
            replid2: field("master_replid2").unwrap_or_default().to_owned(),
            offset: u64::try_from(number("master_repl_offset")?).unwrap_or(0),
            // -1 when the node was never promoted.
            second_offset: number("second_repl_offset")
                .and_then(|offset| u64::try_from(offset).ok())
                .unwrap_or(0),
        })
    }
}

/// What the watch remembers of a node: by its marker key, which a replica that takes over
/// keeps (it serves the same slots).
struct Node {
    marker: String,
    /// The marker's value as last read or written; `None` until it is.
    epoch: Option<String>,
    seen: Option<Identity>,
    name: String,
}

/// What a check of the watch read of the marker.
enum Marker {
    Present,
    Missing,
    Other(String),
}

/// Each key's count of losses: one for a single server, one per hash slot on a cluster.
enum Generations {
    One(AtomicU64),
    PerSlot(Box<[AtomicU64]>),
}

/// The part the store's checks read, and the watch's task writes.
struct Shared {
    generations: Generations,
    report: Mutex<LostState>,
}

/// Reads every node at connect, then every `interval` on a task of its own, which ends
/// when this is dropped (with the last clone of the store).
pub(super) struct LostStateWatch {
    shared: Arc<Shared>,
    _task: Periodic,
    /// What reads a single server on each new connection before a check is sent on it;
    /// the connection holds it weakly.
    verifier: Option<Arc<dyn Verify>>,
}

/// What a read needs.
#[derive(Clone)]
struct Reader {
    connection: Connection,
    server: String,
    prefix: String,
    timeout: Duration,
    shared: Arc<Shared>,
    nodes: Arc<tokio::sync::Mutex<Vec<Node>>>,
}

impl LostStateWatch {
    /// Reads now (writing the markers), then every `interval`, each command within
    /// `timeout`. With a zero interval it never reads, and writes no marker: a check at
    /// connect alone would see no loss.
    pub(super) async fn start(
        connection: Connection,
        server: String,
        prefix: String,
        timeout: Duration,
        interval: Duration,
    ) -> LostStateWatch {
        let generations = match connection {
            Connection::Single { .. } => Generations::One(AtomicU64::new(0)),
            Connection::Cluster { .. } => {
                Generations::PerSlot((0..SLOTS).map(|_| AtomicU64::new(0)).collect())
            }
        };
        let shared = Arc::new(Shared {
            generations,
            report: Mutex::new(LostState::default()),
        });
        let reader = Reader {
            connection,
            server,
            prefix,
            timeout,
            shared: Arc::clone(&shared),
            nodes: Arc::default(),
        };
        let verifier = (!interval.is_zero()).then(|| {
            let verifier: Arc<dyn Verify> = Arc::new(reader.clone());
            reader
                .connection
                .verify_new_connections(Arc::downgrade(&verifier));
            verifier
        });
        if !interval.is_zero() {
            // A server that does not answer now is read again at the next period.
            let _unanswered = reader.read().await;
        }
        let task = Periodic::start(interval, move || {
            let reader = reader.clone();
            async move {
                let _unanswered = reader.read().await;
            }
        });
        LostStateWatch {
            shared,
            _task: task,
            verifier,
        }
    }

    /// Whether the nodes are read at all: with a zero interval no loss is ever found.
    pub(super) fn is_watching(&self) -> bool {
        self.verifier.is_some()
    }

    /// What has been found so far.
    pub(super) fn latest(&self) -> LostState {
        self.shared.report.lock().clone()
    }

    /// How many losses the nodes holding `check`'s keys (under `prefix`) have had, summed
    /// over its limits.
    pub(super) fn generation(&self, prefix: &str, check: &Check<'_>) -> u64 {
        match &self.shared.generations {
            Generations::One(generation) => generation.load(Ordering::Relaxed),
            Generations::PerSlot(slots) => check
                .limits
                .iter()
                .map(|limit| {
                    let at = if limit.rule.envoy_counter() {
                        check.at_micros().unwrap_or_else(wall_clock_micros)
                    } else {
                        0
                    };
                    let slot = keys::state_slot(prefix, limit.rule, limit.key, at);
                    slots[usize::from(slot)].load(Ordering::Relaxed)
                })
                .sum(),
        }
    }
}

/// The longest search for a marker tag hashing to a master's slots: with `n` masters a
/// tag lands on a given one about once in `n` tries.
const MAX_TAG: u32 = 1 << 20;

impl Verify for Reader {
    fn verify(&self) -> Pin<Box<dyn Future<Output = Result<(), CallError>> + Send + '_>> {
        Box::pin(self.read())
    }
}

impl Reader {
    /// Reads every node; an error when a single server did not answer (on a cluster, a
    /// node that does not answer is read again at the next period).
    async fn read(&self) -> Result<(), CallError> {
        let mut nodes = self.nodes.lock().await;
        // The nodes of this read: on a cluster, those a master's marker names now.
        let mut read_now = Vec::new();
        match &self.connection {
            Connection::Single { .. } => {
                if nodes.is_empty() {
                    nodes.push(Node {
                        marker: marker_key(&self.prefix, None),
                        epoch: None,
                        seen: None,
                        name: self.server.clone(),
                    });
                }
                let info = self
                    .connection
                    .query::<String>(
                        redis::cmd("INFO").arg("server").arg("replication"),
                        self.timeout,
                    )
                    .await;
                let name = self.server.clone();
                let answered = self.check_node(&mut nodes[0], name, info, &[]).await;
                self.report_nodes(&nodes, &[0]);
                return answered;
            }
            Connection::Cluster { client, slots, .. } => {
                let reading = slots::read(
                    &mut client.clone(),
                    self.timeout,
                    &SlotMap::unknown(),
                    slots.seeds(),
                )
                .await;
                let Some(map) = reading else {
                    tracing::debug!("lost-state check: no slot map from the cluster");
                    return Ok(());
                };
                for (index, (host, port)) in map.nodes() {
                    let Some(tag) = (0..MAX_TAG).find(|&tag| {
                        map.node_of(hash_slot(&marker_key(&self.prefix, Some(tag)))) == Some(index)
                    }) else {
                        continue;
                    };
                    let marker = marker_key(&self.prefix, Some(tag));
                    let name = format!("{host}:{port}");
                    let at = match nodes.iter().position(|node| node.marker == marker) {
                        Some(at) => at,
                        None => {
                            nodes.push(Node {
                                marker,
                                epoch: None,
                                seen: None,
                                name: name.clone(),
                            });
                            nodes.len() - 1
                        }
                    };
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.to_owned(),
                        port,
                    });
                    let mut info = redis::cmd("INFO");
                    info.arg("server").arg("replication");
                    let info = bounded(self.timeout, client.clone().route_command(info, routing))
                        .await
                        .and_then(|reply| {
                            redis::from_redis_value::<String>(reply)
                                .map_err(|e| CallError::Redis(e.into()))
                        });
                    let slots: Vec<u16> = map.slots_of(index).collect();
                    let _unanswered = self.check_node(&mut nodes[at], name, info, &slots).await;
                    read_now.push(at);
                }
            }
        }
        self.report_nodes(&nodes, &read_now);
        Ok(())
    }

    /// Reports the nodes at `read_now` as last read.
    fn report_nodes(&self, nodes: &[Node], read_now: &[usize]) {
        let watched = read_now
            .iter()
            .filter_map(|&at| {
                let node = &nodes[at];
                node.seen.as_ref().map(|seen| WatchedNode {
                    node: node.name.clone(),
                    run_id: seen.run_id.clone(),
                    repl_offset: seen.offset,
                })
            })
            .collect();
        self.shared.report.lock().nodes = watched;
    }

    /// Reads `node`'s marker, compares it and `info` with what was read before, and
    /// reports a loss on `slots` (ignored on a single server); `name` is where the node is
    /// now. A node that does not answer is left as it was, to be read again next time, and
    /// its error returned; one that answers with an error (a command it refuses) cannot be
    /// read better later.
    async fn check_node(
        &self,
        node: &mut Node,
        name: String,
        info: Result<String, CallError>,
        slots: &[u16],
    ) -> Result<(), CallError> {
        let unanswered = |e: CallError| if e.server_answered() { Ok(()) } else { Err(e) };
        let identity = match info {
            Ok(text) => Identity::parse(&text),
            Err(e) => {
                tracing::debug!(node = %name, "lost-state check: INFO failed: {}", self.failed(e.clone()));
                return unanswered(e);
            }
        };
        let Some(identity) = identity else {
            tracing::debug!(node = %name, "lost-state check: INFO lacks run_id or replication");
            return Ok(());
        };
        let marker = match &node.epoch {
            None => None,
            Some(epoch) => match self.get(&node.marker).await {
                Ok(Some(value)) if value == *epoch => Some(Marker::Present),
                Ok(Some(value)) => Some(Marker::Other(value)),
                Ok(None) => Some(Marker::Missing),
                Err(e) => {
                    tracing::debug!(node = %name, "lost-state check: GET failed: {}", self.failed(e.clone()));
                    return unanswered(e);
                }
            },
        };
        let promoted_from =
            |before: &Identity| !identity.replid2.is_empty() && identity.replid2 == before.replid;
        // What was read before, if it was this node: the same address, or the master this
        // one was promoted from. A cluster master whose slots moved may now be named by
        // another's marker, whose last read says nothing of it.
        let before = node
            .seen
            .as_ref()
            .filter(|before| node.name == name || promoted_from(before));
        let lost = match &marker {
            None | Some(Marker::Present) => None,
            Some(Marker::Missing) => Some("the epoch marker is gone".to_owned()),
            Some(Marker::Other(value)) => Some(format!(
                "the epoch marker holds {value}, not {}: another instance found it gone first",
                node.epoch.as_deref().unwrap_or_default()
            )),
        };
        let loss = match (lost, before) {
            (None, Some(before)) if before.run_id != identity.run_id => {
                self.compare_offsets(&name, before, &identity)
            }
            (None, _) => None,
            (Some(marker), Some(before)) if promoted_from(before) => Some((
                LossReason::FailedOver,
                format!(
                    "a replica took over (run_id {} → {}); {marker}",
                    before.run_id, identity.run_id
                ),
            )),
            (Some(marker), Some(before)) if before.run_id != identity.run_id => Some((
                LossReason::Restarted,
                format!(
                    "restarted without its data (run_id {} → {}); {marker}",
                    before.run_id, identity.run_id
                ),
            )),
            (Some(marker), _) => Some((
                LossReason::Flushed,
                format!(
                    "the same process (run_id {}) lost its data (FLUSHALL, FLUSHDB, or the key \
                     deleted); {marker}",
                    identity.run_id
                ),
            )),
        };
        // The epoch to expect next: another instance's new one as it is; none yet, or a
        // missing marker, is written anew.
        match marker {
            Some(Marker::Present) => {}
            Some(Marker::Other(value)) => node.epoch = Some(value),
            Some(Marker::Missing) | None => match self.adopt(&node.marker).await {
                Ok(epoch) => node.epoch = epoch,
                Err(e) => {
                    node.epoch = None;
                    tracing::debug!(node = %name, "lost-state check: writing the marker failed: {}", self.failed(e));
                }
            },
        }
        node.seen = Some(identity);
        node.name = name;
        if let Some((reason, detail)) = loss {
            self.report(&node.name, reason, detail, slots);
        }
        Ok(())
    }

    /// A new process at a node whose marker is there: a loss only if its replication
    /// offsets say it lacks writes the old process had (restored from an older snapshot
    /// of the same replication history, or a replica promoted short of the old master's
    /// offset as last read); otherwise logged at info.
    fn compare_offsets(
        &self,
        name: &str,
        before: &Identity,
        now: &Identity,
    ) -> Option<(LossReason, String)> {
        let change = format!("run_id {} → {}", before.run_id, now.run_id);
        // A promoted replica's second_repl_offset is one past the last byte it had.
        let kept = now.second_offset.saturating_sub(1);
        if now.replid == before.replid && now.offset < before.offset {
            Some((
                LossReason::Restarted,
                format!(
                    "restarted ({change}) from a snapshot at replication offset {}, {} bytes of \
                     replication stream short of the {} last read",
                    now.offset,
                    before.offset - now.offset,
                    before.offset
                ),
            ))
        } else if now.replid2 == before.replid && kept < before.offset {
            Some((
                LossReason::FailedOver,
                format!(
                    "a replica took over ({change}) at replication offset {kept}, {} bytes of \
                     replication stream short of the {} last read on the old master",
                    before.offset - kept,
                    before.offset
                ),
            ))
        } else {
            let how = if now.replid2 == before.replid {
                "a replica took over with every write last read on the old master"
            } else {
                "restarted with its data"
            };
            tracing::info!(
                node = %name,
                "redis is a new process ({change}) holding what sluicegate wrote: {how}"
            );
            None
        }
    }

    fn failed(&self, e: CallError) -> crate::store::error::StoreError {
        e.into_store_error(&self.server, self.timeout, None)
    }

    async fn get(&self, key: &str) -> Result<Option<String>, CallError> {
        self.connection
            .query(redis::cmd("GET").arg(key), self.timeout)
            .await
    }

    /// Writes a new epoch at `key` unless one is there, and returns the one that is.
    async fn adopt(&self, key: &str) -> Result<Option<String>, CallError> {
        let epoch = format!("{:016x}", random());
        self.connection
            .query::<Value>(
                redis::cmd("SET").arg(key).arg(&epoch).arg("NX"),
                self.timeout,
            )
            .await?;
        self.get(key).await
    }

    fn report(&self, node: &str, reason: LossReason, detail: String, slots: &[u16]) {
        tracing::warn!(
            node,
            reason = reason.label(),
            "redis lost state sluicegate wrote: {detail}; the limits of its keys start over"
        );
        match &self.shared.generations {
            Generations::One(generation) => {
                generation.fetch_add(1, Ordering::Relaxed);
            }
            Generations::PerSlot(generations) => {
                for &slot in slots {
                    generations[usize::from(slot)].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let at = UNIX_EPOCH + Duration::from_micros(wall_clock_micros());
        let mut report = self.shared.report.lock();
        match report
            .losses
            .iter_mut()
            .find(|loss| loss.node == node && loss.reason == reason)
        {
            Some(loss) => {
                loss.count += 1;
                loss.detail = detail;
                loss.at = at;
            }
            None => report.losses.push(StateLoss {
                node: node.to_owned(),
                reason,
                count: 1,
                detail,
                at,
            }),
        }
    }
}

/// A random 64-bit value: what an epoch is made of.
fn random() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(u128::from(wall_clock_micros()));
    hasher.write_u32(std::process::id());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_read_from_info() {
        let text = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\n\r\n# Replication\r\n\
                    role:master\r\nmaster_replid:r1\r\nmaster_replid2:r0\r\n\
                    master_repl_offset:1234\r\nsecond_repl_offset:1000\r\n";
        assert_eq!(
            Identity::parse(text),
            Some(Identity {
                run_id: "abc".into(),
                replid: "r1".into(),
                replid2: "r0".into(),
                offset: 1234,
                second_offset: 1000,
            })
        );
        let never_promoted = "run_id:abc\r\nmaster_replid:r1\r\nmaster_replid2:\
                              0000000000000000000000000000000000000000\r\n\
                              master_repl_offset:0\r\nsecond_repl_offset:-1\r\n";
        assert_eq!(Identity::parse(never_promoted).unwrap().second_offset, 0);
        assert_eq!(Identity::parse("run_id:abc\r\n"), None);
    }
}
