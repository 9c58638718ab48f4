//! Which node of a Redis Cluster serves each hash slot, as last read (`CLUSTER SLOTS`): what
//! the batcher groups a cluster's checks by, and what the limiter keeps each node's failure
//! state by. It may be out of date; a node refuses what it does not hold, and the checks it
//! refused are sent again on their own.
//!
//! Each master is numbered by its address, and a number keeps naming that address in every
//! later reading: after a failover the slots of the old master point to the number of the
//! replica that took them over, whose breaker is its own, so checks of those slots go there
//! as soon as the map is read again — never held by the old master's breaker.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tokio::sync::mpsc;

use super::error::bounded;
use crate::store::check::NodeId;

/// Hash slots of a Redis Cluster.
pub(super) const SLOTS: usize = 16384;

/// The shortest time between two readings of the slot map. While a node fails, every check
/// of its slots asks for a reading (see [`Slots::refresh_soon`]): at this pace that costs
/// one `CLUSTER SLOTS` per tenth of a second, and a failover the cluster has finished is
/// seen at most this long (plus the reading's round trip) after its promotion.
pub(super) const REFRESH_GAP: Duration = Duration::from_millis(100);

/// Each slot's node, as a number, and each node's address.
pub(super) struct SlotMap {
    nodes: Vec<Option<u16>>,
    /// Every master's address ever read, by its number: carried from one reading to the
    /// next, so that a number always names one address.
    addresses: Vec<(String, u16)>,
    /// Whether the node of that number serves a slot in this reading.
    serving: Vec<bool>,
    /// Whether some slot has no node in this reading.
    gaps: bool,
    /// The ports of the masters named by no host in this reading and left unknown: each the
    /// node that answered (see [`from_reply`](Self::from_reply)).
    unnamed: Vec<u16>,
}

impl SlotMap {
    /// A map that knows no slot: every check is grouped by its own keys.
    pub(super) fn unknown() -> SlotMap {
        SlotMap {
            nodes: vec![None; SLOTS],
            addresses: Vec::new(),
            serving: Vec::new(),
            gaps: true,
            unnamed: Vec::new(),
        }
    }

    /// The map `CLUSTER SLOTS` answered: ranges `[start, end, [host, port, …], replicas…]`,
    /// its masters numbered as in `known`, a new address after them. `None` when the reply
    /// is not of that shape.
    ///
    /// A master may be named by no host, which Redis' documentation of the command reads as
    /// the host of the node that answered: an empty one from a node that knows no address of
    /// its own (it has met no other: a cluster of one node), a null one from every node of a
    /// cluster whose `cluster-preferred-endpoint-type` is `unknown-endpoint`; the cluster
    /// client reads a wildcard (`0.0.0.0`, `::`) alike. That host is `answering` when the
    /// reading was sent to a known address; with none, the master's slots are left unknown
    /// and its port kept. A host `?` (announced by hostname, with none configured) is no
    /// node: its slots are unknown too. Checks of unknown slots are grouped by their own
    /// keys and routed by the cluster client.
    pub(super) fn from_reply(
        reply: &Value,
        known: &SlotMap,
        answering: Option<&str>,
    ) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = SlotMap::unknown();
        let mut addresses = known.addresses.clone();
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let (Some(host), Some(Value::Int(port))) = (master.first(), master.get(1)) else {
                return None;
            };
            let port = u16::try_from(*port).ok()?;
            let named = match host {
                Value::BulkString(host) => {
                    Some(std::str::from_utf8(host).ok()?).filter(|host| !answers_for(host))
                }
                Value::Nil => None,
                _ => return None,
            };
            if named == Some("?") {
                continue;
            }
            let host = match (named, answering) {
                (Some(host), _) | (None, Some(host)) => host.to_owned(),
                (None, None) => {
                    map.unnamed.push(port);
                    continue;
                }
            };
            let address = (host, port);
            let node = match addresses.iter().position(|known| *known == address) {
                Some(i) => i,
                None => {
                    addresses.push(address);
                    addresses.len() - 1
                }
            };
            // Numbers up to u16::MAX - 1, so that every one has a NodeId after FIRST.
            let node = u16::try_from(node).ok().filter(|&n| n < u16::MAX)?;
            let start = usize::try_from(*start).ok()?;
            let end = usize::try_from(*end).ok()?.min(SLOTS - 1);
            for slot in start..=end {
                map.nodes[slot] = Some(node);
            }
        }
        map.serving = vec![false; addresses.len()];
        for node in map.nodes.iter().flatten() {
            map.serving[usize::from(*node)] = true;
        }
        map.gaps = map.nodes.iter().any(Option::is_none);
        map.addresses = addresses;
        Some(map)
    }

    /// The host and port of `node`.
    pub(super) fn address(&self, node: u16) -> Option<(&str, u16)> {
        self.addresses
            .get(usize::from(node))
            .map(|(host, port)| (host.as_str(), *port))
    }

    /// Every node that serves a slot: its number and its host and port.
    pub(super) fn nodes(&self) -> impl Iterator<Item = (u16, (&str, u16))> {
        self.addresses
            .iter()
            .enumerate()
            .filter_map(|(i, (host, port))| Some((u16::try_from(i).ok()?, (host.as_str(), *port))))
    }

    /// The slots `node` serves.
    pub(super) fn slots_of(&self, node: u16) -> impl Iterator<Item = u16> + '_ {
        (0..SLOTS as u16).filter(move |&slot| self.node_of(slot) == Some(node))
    }

    /// The node serving `slot`, if known.
    pub(super) fn node_of(&self, slot: u16) -> Option<u16> {
        self.nodes.get(usize::from(slot)).copied().flatten()
    }

    /// The store's number of the node serving `slot`: [`NodeId::FIRST`] where the map does
    /// not tell, each master's own number after it.
    pub(super) fn node_id(&self, slot: u16) -> NodeId {
        self.node_of(slot)
            .map_or(NodeId::FIRST, |node| NodeId(node + 1))
    }

    /// `host:port` of the node the store numbers `node`, while it serves a slot. `None`
    /// for one that no longer does (a master that failed over, come back as a replica),
    /// and for [`NodeId::FIRST`], which the caller names while some slot has no node.
    pub(super) fn node_name(&self, node: NodeId) -> Option<String> {
        let index = node.0.checked_sub(1)?;
        if !self
            .serving
            .get(usize::from(index))
            .copied()
            .unwrap_or(false)
        {
            return None;
        }
        self.address(index)
            .map(|(host, port)| format!("{host}:{port}"))
    }

    /// Whether some slot has no node: checks of it go to [`NodeId::FIRST`].
    pub(super) fn has_gaps(&self) -> bool {
        self.gaps
    }

    /// The seeds that could name a master this reading named by no host: those on its port.
    fn seeds_to_name<'s>(
        &self,
        seeds: &'s [(String, u16)],
    ) -> impl Iterator<Item = &'s (String, u16)> {
        seeds.iter().filter(|(_, port)| self.unnamed.contains(port))
    }

    /// Whether a seed could name a master this reading left unknown: the map is read again
    /// after [`REFRESH_GAP`], as a reading that failed is.
    fn wants_a_seed(&self, seeds: &[(String, u16)]) -> bool {
        self.seeds_to_name(seeds).next().is_some()
    }
}

/// The slot map in force, read by every check without a lock, and read again from the
/// cluster when asked, at most once per [`REFRESH_GAP`].
pub(super) struct Slots {
    map: Arc<ArcSwap<SlotMap>>,
    /// The host and port of each node the store was given to connect to.
    seeds: Arc<[(String, u16)]>,
    /// Room for one: a request while one waits already is the same request.
    wanted: mpsc::Sender<()>,
}

impl Slots {
    /// Starts with `first` (the map read at connect, if it could be) and a task that reads
    /// the map again from `connection` when asked (at once when `first` is unknown or wants
    /// a seed to name a master), each reading bounded by `timeout`, as [`read`] does with
    /// `seeds`; the task ends when these slots are dropped.
    pub(super) fn start(
        first: Option<SlotMap>,
        connection: ClusterConnection,
        timeout: Duration,
        seeds: Arc<[(String, u16)]>,
    ) -> Slots {
        let unread = first.as_ref().is_none_or(|map| map.wants_a_seed(&seeds));
        let map = Arc::new(ArcSwap::from_pointee(
            first.unwrap_or_else(SlotMap::unknown),
        ));
        let (wanted, asked) = mpsc::channel(1);
        tokio::spawn(keep_fresh(
            Arc::clone(&map),
            asked,
            connection,
            timeout,
            Arc::clone(&seeds),
            unread,
        ));
        Slots { map, seeds, wanted }
    }

    /// The host and port of each node the store was given to connect to.
    pub(super) fn seeds(&self) -> &[(String, u16)] {
        &self.seeds
    }

    /// The map in force.
    pub(super) fn current(&self) -> arc_swap::Guard<Arc<SlotMap>> {
        self.map.load()
    }

    /// Asks for the map to be read again soon: it may be out of date (a node failed, or
    /// refused a key it no longer holds). Requests coalesce; no more than one reading per
    /// [`REFRESH_GAP`].
    pub(super) fn refresh_soon(&self) {
        let _already_asked = self.wanted.try_send(());
    }
}

/// Reads the slot map when `asked` (or first, if `unread`), installs what it read in
/// `map`, and waits [`REFRESH_GAP`] before the next reading; a reading that failed, or that
/// left a master a seed could name unknown, is tried again after that gap, unasked.
async fn keep_fresh(
    map: Arc<ArcSwap<SlotMap>>,
    mut asked: mpsc::Receiver<()>,
    mut connection: ClusterConnection,
    timeout: Duration,
    seeds: Arc<[(String, u16)]>,
    mut unread: bool,
) {
    loop {
        if !unread && asked.recv().await.is_none() {
            return;
        }
        if asked.is_closed() {
            return;
        }
        let reading = read(&mut connection, timeout, &map.load(), &seeds).await;
        unread = match reading {
            Some(read) => {
                let again = read.wants_a_seed(&seeds);
                map.store(Arc::new(read));
                again
            }
            None => true,
        };
        tokio::time::sleep(REFRESH_GAP).await;
    }
}

/// The slot map as `CLUSTER SLOTS` (from any node) says it now, numbered as `known`;
/// `None` when no answer came within `timeout`, or not one of that shape. A reading that
/// names a master by no host (the node that answered) is read again from the seeds on that
/// master's port, in turn until one answers, its host then the seed's; if none answers,
/// or no seed is on that port, its slots stay unknown. Only those seeds: the cluster client
/// routes to an address only while it holds a connection there, which it keeps for the
/// nodes a reading names (for a master named by no host, the address it asked at with the
/// master's port), and any other address makes it connect to every node anew.
pub(super) async fn read(
    connection: &mut ClusterConnection,
    timeout: Duration,
    known: &SlotMap,
    seeds: &[(String, u16)],
) -> Option<SlotMap> {
    let from_any = bounded(timeout, cluster_slots().query_async::<Value>(connection))
        .await
        .ok()
        .and_then(|reply| SlotMap::from_reply(&reply, known, None))?;
    for (host, port) in from_any.seeds_to_name(seeds) {
        let route = SingleNodeRoutingInfo::ByAddress {
            host: host.clone(),
            port: *port,
        };
        let from_seed = bounded(
            timeout,
            connection.route_command(cluster_slots(), RoutingInfo::SingleNode(route)),
        )
        .await
        .ok()
        .and_then(|reply| SlotMap::from_reply(&reply, known, Some(host)));
        if let Some(map) = from_seed {
            return Some(map);
        }
    }
    Some(from_any)
}

/// Hosts that name no node but the one that answered, as the cluster client reads them.
fn answers_for(host: &str) -> bool {
    host.is_empty() || host == "0.0.0.0" || host == "::"
}

/// `CLUSTER SLOTS`.
fn cluster_slots() -> redis::Cmd {
    let mut command = redis::cmd("CLUSTER");
    command.arg("SLOTS");
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn ranges_name_their_nodes() {
        let reply = Value::Array(vec![
            range(0, 99, "10.0.0.1", 6379),
            range(100, 16383, "10.0.0.2", 6379),
            range(50, 50, "10.0.0.1", 6379),
        ]);
        let map = SlotMap::from_reply(&reply, &SlotMap::unknown(), None).unwrap();
        assert_eq!(map.node_of(0), map.node_of(99));
        assert_ne!(map.node_of(99), map.node_of(100));
        assert_eq!(map.node_of(16383), map.node_of(100));
        assert_eq!(
            map.address(map.node_of(0).unwrap()),
            Some(("10.0.0.1", 6379))
        );
        assert_eq!(
            map.address(map.node_of(100).unwrap()),
            Some(("10.0.0.2", 6379))
        );
        assert!(SlotMap::from_reply(&Value::Int(1), &SlotMap::unknown(), None).is_none());
        assert_eq!(SlotMap::unknown().node_of(7), None);
    }

    /// A master named by no host (empty, null or a wildcard) is the node that answered: its
    /// host when the reading went to a known address, else its slots are unknown and its
    /// port kept, which names the seeds that could name it. A host `?` is unknown either way.
    #[test]
    fn a_master_named_by_no_host_is_the_node_that_answered() {
        let unnamed = |host: Value| {
            Value::Array(vec![
                Value::Int(0),
                Value::Int(99),
                Value::Array(vec![host, Value::Int(7000)]),
            ])
        };
        let seeds = [("10.0.0.8".to_owned(), 7001), ("10.0.0.9".to_owned(), 7000)];
        for host in [
            Value::BulkString(Vec::new()),
            Value::Nil,
            Value::BulkString(b"0.0.0.0".to_vec()),
            Value::BulkString(b"::".to_vec()),
        ] {
            let reply = Value::Array(vec![
                unnamed(host.clone()),
                range(100, 16383, "10.0.0.2", 6379),
            ]);
            let map = SlotMap::from_reply(&reply, &SlotMap::unknown(), Some("10.0.0.9")).unwrap();
            assert_eq!(
                map.address(map.node_of(0).unwrap()),
                Some(("10.0.0.9", 7000))
            );
            assert!(!map.has_gaps() && !map.wants_a_seed(&seeds), "{host:?}");
            let map = SlotMap::from_reply(&reply, &SlotMap::unknown(), None).unwrap();
            assert_eq!(map.node_of(0), None, "{host:?}");
            assert!(map.has_gaps(), "{host:?}");
            assert_eq!(
                map.seeds_to_name(&seeds).collect::<Vec<_>>(),
                [&seeds[1]],
                "{host:?}"
            );
            assert!(!map.wants_a_seed(&seeds[..1]), "{host:?}");
            assert_eq!(
                map.address(map.node_of(100).unwrap()),
                Some(("10.0.0.2", 6379))
            );
        }
        let reply = Value::Array(vec![unnamed(Value::BulkString(b"?".to_vec()))]);
        let map = SlotMap::from_reply(&reply, &SlotMap::unknown(), Some("10.0.0.9")).unwrap();
        assert_eq!(map.node_of(0), None);
        let map = SlotMap::from_reply(&reply, &SlotMap::unknown(), None).unwrap();
        assert!(!map.wants_a_seed(&seeds));
    }
}

#[cfg(test)]
mod numbering {
    use super::*;

    fn master(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
            ]),
        ])
    }

    /// After a failover the old master's slots are served by its replica: a number of its
    /// own, while every other master keeps its number, and the old master's number is never
    /// given to another address.
    #[test]
    fn a_number_names_one_address_across_readings() {
        let before = SlotMap::from_reply(
            &Value::Array(vec![master(0, 8191, 7000), master(8192, 16383, 7001)]),
            &SlotMap::unknown(),
            None,
        )
        .unwrap();
        let after = SlotMap::from_reply(
            &Value::Array(vec![master(0, 8191, 7002), master(8192, 16383, 7001)]),
            &before,
            None,
        )
        .unwrap();
        assert_eq!(before.node_id(9000), after.node_id(9000));
        assert_ne!(before.node_id(0), after.node_id(0));
        assert_eq!(
            after.node_name(after.node_id(0)).as_deref(),
            Some("127.0.0.1:7002")
        );
        assert_eq!(
            after.node_name(before.node_id(0)),
            None,
            "7000 serves no slot"
        );
        assert_eq!(
            before.node_name(before.node_id(0)).as_deref(),
            Some("127.0.0.1:7000")
        );
        assert!(!after.has_gaps());
        assert!(SlotMap::unknown().has_gaps());
        assert_eq!(SlotMap::unknown().node_id(5), NodeId::FIRST);
        assert_eq!(after.node_name(NodeId::FIRST), None);
    }
}
