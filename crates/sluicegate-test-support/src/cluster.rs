//! A Redis Cluster of real servers, created with `redis-cli --cluster create` (or, of one
//! node, by giving it every slot).

use std::process::Command;
use std::time::Duration;

use redis::{Value, cmd};

use crate::poll::poll_until;
use crate::server::{HOW_TO_GET_REDIS, RedisServer};

/// A Redis Cluster: its masters first, then their replicas, all on loopback ports.
pub struct RedisCluster {
    /// Every node, in the order `redis-cli --cluster create` was given them.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` masters with `replicas` replicas each; a node that stops answering is
    /// failed over after one second. Returns once every node reports `cluster_state:ok`
    /// and the cluster has that shape.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| cluster_node())
            .collect();
        create_cluster(&nodes, replicas);
        RedisCluster::formed(nodes, masters)
    }

    /// A cluster of one master serving every slot, with no replica. Having met no other
    /// node, it knows no address of its own: `CLUSTER SLOTS` names its host as an empty
    /// string, which Redis documents as "the node that answered".
    pub fn start_one_node() -> RedisCluster {
        let node = cluster_node();
        node.query::<()>(cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(0).arg(16383))
            .expect("CLUSTER ADDSLOTSRANGE (Redis 7.0 or later)");
        let cluster = RedisCluster::formed(vec![node], 1);
        let slots: Vec<(i64, i64, Vec<Value>)> = cluster.nodes[0]
            .query(cmd("CLUSTER").arg("SLOTS"))
            .expect("CLUSTER SLOTS");
        let named = slots.first().and_then(|(_, _, master)| master.first());
        assert_eq!(
            named,
            Some(&Value::BulkString(Vec::new())),
            "a cluster of one node names itself by an empty host: {slots:?}"
        );
        cluster
    }

    /// Waits for every node to report `cluster_state:ok`, then checks that `masters` nodes
    /// own the slots and every other node replicates: `cluster_state:ok` holds with
    /// slotless masters too, and a failover test would then kill a master that has no
    /// replica, and fail for a reason it does not name.
    fn formed(nodes: Vec<RedisServer>, masters: usize) -> RedisCluster {
        let ready = poll_until(Duration::from_secs(30), || {
            nodes.iter().all(|node| {
                node.query::<String>(cmd("CLUSTER").arg("INFO"))
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            })
        });
        assert!(ready, "the cluster did not become ready");
        let views: Vec<OwnView> = nodes.iter().map(own_view).collect();
        let owners = views.iter().filter(|view| view.owns_slots).count();
        assert_eq!(owners, masters, "{owners} nodes own slots, not {masters}");
        let unpaired: Vec<u16> = nodes
            .iter()
            .zip(&views)
            .filter(|(_, view)| !view.owns_slots && !view.replica)
            .map(|(node, _)| node.port)
            .collect();
        assert!(
            unpaired.is_empty(),
            "nodes with no slots that replicate no master: {unpaired:?}"
        );
        RedisCluster { nodes }
    }

    /// `redis-cluster://127.0.0.1:P1,127.0.0.1:P2,…` naming every node.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("redis-cluster://{}", hosts.join(","))
    }

    /// The nodes that are masters now.
    pub fn current_masters(&self) -> Vec<&RedisServer> {
        self.nodes.iter().filter(|node| node.is_master()).collect()
    }

    /// The nodes replicating `master` now.
    pub fn replicas_of(&self, master: &RedisServer) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|node| node.master_port() == Some(master.port))
            .collect()
    }

    /// Sets `cluster-require-full-coverage` on every node: with `false`, the masters serve
    /// the slots they hold while other slots have no master (during a failover), instead
    /// of answering CLUSTERDOWN for every slot.
    pub fn require_full_coverage(&self, full_coverage: bool) {
        for node in &self.nodes {
            node.query::<()>(
                cmd("CONFIG")
                    .arg("SET")
                    .arg("cluster-require-full-coverage")
                    .arg(if full_coverage { "yes" } else { "no" }),
            )
            .expect("CONFIG SET cluster-require-full-coverage");
        }
    }

    /// Waits until every replica of `master` has every write `master` took so far (`WAIT`
    /// for them all): a replica of a new cluster is synced in the background, its first
    /// full copy seconds after the cluster is up, and a master shut down before that takes
    /// its data with it. Panics past `timeout`.
    pub fn await_replicas_of(&self, master: &RedisServer, timeout: Duration) {
        let replicas = self.replicas_of(master).len();
        let synced = poll_until(timeout, || {
            // Each WAIT ends within its own timeout, well under the connection's.
            master
                .query::<usize>(cmd("WAIT").arg(replicas).arg(200))
                .is_ok_and(|acknowledged| acknowledged == replicas)
        });
        assert!(
            synced,
            "the {replicas} replicas of {} did not acknowledge its writes within {timeout:?}",
            master.port
        );
    }

    /// The master serving `slot` now, by `CLUSTER SLOTS` of a node that answers.
    pub fn master_of(&self, slot: u16) -> &RedisServer {
        self.serving(slot).expect("every slot is served")
    }

    /// The master serving `slot` now, by `CLUSTER SLOTS` of the first node that answers:
    /// ranges `[start, end, [host, port, …], …]`. None while that node names no master for
    /// it: in a failover a node may answer so for a moment, and a test polling for the
    /// promotion reads that as not promoted yet.
    pub fn serving(&self, slot: u16) -> Option<&RedisServer> {
        let reply: Vec<Vec<redis::Value>> = self
            .nodes
            .iter()
            .find_map(|node| node.query(cmd("CLUSTER").arg("SLOTS")).ok())
            .expect("a node answers CLUSTER SLOTS");
        let port = reply.iter().find_map(|range| {
            let start: u16 = redis::from_redis_value_ref(&range[0]).ok()?;
            let end: u16 = redis::from_redis_value_ref(&range[1]).ok()?;
            let master: Vec<redis::Value> = redis::from_redis_value_ref(&range[2]).ok()?;
            let port: u16 = redis::from_redis_value_ref(&master[1]).ok()?;
            (start..=end).contains(&slot).then_some(port)
        })?;
        let master = self.nodes.iter().find(|node| node.port == port);
        Some(master.expect("the master is a node of the cluster"))
    }

    /// Moves `slot` from master `source` to master `target`, as a reshard does: `CLUSTER
    /// SETSLOT … IMPORTING` on the target and `MIGRATING` on the source, `MIGRATE` key by key
    /// (calling `between_keys` before each, so that whatever runs meanwhile meets every
    /// stage), then `SETSLOT … NODE` on the target, the source and the other masters, in
    /// that order.
    pub fn move_slot(
        &self,
        slot: u16,
        source: &RedisServer,
        target: &RedisServer,
        mut between_keys: impl FnMut(),
    ) {
        let (source_id, target_id) = (node_id(source), node_id(target));
        let setslot = |node: &RedisServer, how: &str, id: &str| {
            node.query::<()>(cmd("CLUSTER").arg("SETSLOT").arg(slot).arg(how).arg(id))
                .unwrap_or_else(|e| panic!("SETSLOT {how} on {}: {e}", node.port));
        };
        setslot(target, "IMPORTING", &source_id);
        setslot(source, "MIGRATING", &target_id);
        loop {
            let moving: Vec<String> = source
                .query(cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(1))
                .expect("CLUSTER GETKEYSINSLOT");
            if moving.is_empty() {
                break;
            }
            between_keys();
            source
                .query_within::<()>(
                    cmd("MIGRATE")
                        .arg("127.0.0.1")
                        .arg(target.port)
                        .arg("")
                        .arg(0)
                        .arg(MIGRATE_TIMEOUT.as_millis() as u64)
                        .arg("KEYS")
                        .arg(&moving),
                    // Past MIGRATE's own timeout, so that a slow MIGRATE fails as Redis says,
                    // never while the server may still finish it.
                    MIGRATE_TIMEOUT * 2,
                )
                .expect("MIGRATE");
        }
        // The target first, then the source: between the source's SETSLOT and the target's,
        // the source would send a command for the slot to the target (MOVED), and the
        // target, still importing, back to the source, until a client's retries ran out.
        setslot(target, "NODE", &target_id);
        setslot(source, "NODE", &target_id);
        for master in self.current_masters() {
            if master.port != source.port && master.port != target.port {
                setslot(master, "NODE", &target_id);
            }
        }
    }
}

/// How long `MIGRATE` may wait for the target node (its own timeout).
const MIGRATE_TIMEOUT: Duration = Duration::from_secs(5);

/// The node id of `server` (`CLUSTER MYID`).
fn node_id(server: &RedisServer) -> String {
    server
        .query::<String>(cmd("CLUSTER").arg("MYID"))
        .expect("CLUSTER MYID")
}

/// A redis-server in cluster mode, failed over after one second of silence.
fn cluster_node() -> RedisServer {
    RedisServer::start_cluster_node(&["--cluster-node-timeout", "1000"])
}

/// What a node says of itself in `CLUSTER NODES`.
struct OwnView {
    /// It replicates a master.
    replica: bool,
    /// It serves slots.
    owns_slots: bool,
}

fn own_view(node: &RedisServer) -> OwnView {
    let nodes: String = node
        .query(cmd("CLUSTER").arg("NODES"))
        .expect("CLUSTER NODES");
    // `<id> <address> <flags> <master> <ping> <pong> <epoch> <link> <slot>…`
    let fields: Vec<&str> = nodes
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .find(|fields| fields.get(2).is_some_and(|flags| flags.contains("myself")))
        .unwrap_or_else(|| panic!("node {} does not list itself: {nodes}", node.port));
    OwnView {
        replica: fields[2].contains("slave"),
        owns_slots: fields.len() > 8,
    }
}

/// Whether `node` knows `count` nodes, itself included, each by its own id and address:
/// none still in the handshake that precedes it.
fn knows(node: &RedisServer, count: usize) -> bool {
    node.query::<String>(cmd("CLUSTER").arg("NODES"))
        .is_ok_and(|nodes| {
            nodes.lines().count() == count
                && !nodes.contains("handshake")
                && !nodes.contains("noaddr")
        })
}

/// How long `redis-cli --cluster create` may take: it assigns the slots, then waits, with
/// no bound of its own, for every node to have met every other.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `redis-cli --cluster create` on `nodes`. On a loaded machine a node may miss the
/// others' gossip and redis-cli wait for the join for ever (seen: nodes knowing one or two
/// of three after nine minutes): past [`CREATE_TIMEOUT`] it is stopped, and the nodes are
/// joined as [`join_after_a_stalled_create`] does.
fn create_cluster(nodes: &[RedisServer], replicas: usize) {
    // In the first node's directory, which goes with the node.
    let log = nodes[0].directory().join("cluster-create.log");
    let out = std::fs::File::create(&log).expect("a log for redis-cli");
    let mut create = Command::new("redis-cli");
    create.arg("--cluster").arg("create");
    for node in nodes {
        create.arg(format!("127.0.0.1:{}", node.port));
    }
    let mut child = create
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .stdout(out.try_clone().expect("the log, twice"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("redis-cli: {e}. {HOW_TO_GET_REDIS}"));
    let mut status = None;
    let finished = poll_until(CREATE_TIMEOUT, || {
        status = child.try_wait().expect("redis-cli's status");
        status.is_some()
    });
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    if finished {
        let status = status.expect("a finished redis-cli has a status");
        assert!(
            status.success(),
            "redis-cli --cluster create failed: {}",
            said()
        );
        return;
    }
    let _ = child.kill();
    let _ = child.wait();
    eprintln!(
        "redis-cli --cluster create still waiting after {CREATE_TIMEOUT:?}; the nodes meet again ({})",
        said().trim()
    );
    join_after_a_stalled_create(nodes);
}

/// Finishes what a `redis-cli --cluster create` stopped in its join wait left: it had
/// assigned the slots, but not yet told the replicas whom to replicate. Every node is told
/// to meet the first again; once every node knows every other (a node can replicate only
/// a master it knows), each node that owns no slot replicates a master, the masters taken
/// in turn.
fn join_after_a_stalled_create(nodes: &[RedisServer]) {
    let bus = nodes[0]
        .cluster_bus()
        .expect("a cluster node has a bus port");
    for node in &nodes[1..] {
        node.query::<()>(
            cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(nodes[0].port)
                .arg(bus),
        )
        .expect("CLUSTER MEET");
    }
    let met = poll_until(CREATE_TIMEOUT, || {
        nodes.iter().all(|node| knows(node, nodes.len()))
    });
    assert!(
        met,
        "the cluster's nodes did not all meet within {CREATE_TIMEOUT:?}"
    );
    let (masters, spares): (Vec<&RedisServer>, Vec<&RedisServer>) =
        nodes.iter().partition(|node| own_view(node).owns_slots);
    assert!(!masters.is_empty(), "no node owns a slot");
    for (spare, master) in spares.iter().zip(masters.iter().cycle()) {
        spare
            .query::<()>(cmd("CLUSTER").arg("REPLICATE").arg(node_id(master)))
            .unwrap_or_else(|e| panic!("{} REPLICATE {}: {e}", spare.port, master.port));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two masters with a replica each, left as a `redis-cli --cluster create` stopped in
    /// its join wait leaves them: the slots assigned, nothing else. The join gives each
    /// master its replica.
    #[test]
    fn a_stalled_create_still_gives_every_master_a_replica() {
        let nodes: Vec<RedisServer> = (0..4).map(|_| cluster_node()).collect();
        for (node, (first, last)) in nodes.iter().zip([(0, 8191), (8192, 16383)]) {
            node.query::<()>(cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(first).arg(last))
                .expect("CLUSTER ADDSLOTSRANGE");
        }
        join_after_a_stalled_create(&nodes);
        let cluster = RedisCluster::formed(nodes, 2);
        assert_eq!(cluster.current_masters().len(), 2);
    }
}
