//! A Redis Cluster of real servers, created with `redis-cli --cluster create`.

use std::process::Command;
use std::time::Duration;

use redis::cmd;

use crate::poll::poll_until;
use crate::server::{HOW_TO_GET_REDIS, RedisServer};

/// A Redis Cluster: its masters first, then their replicas, all on loopback ports.
pub struct RedisCluster {
    /// Every node, in the order `redis-cli --cluster create` was given them.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` masters with `replicas` replicas each; a node that stops answering is
    /// failed over after one second. Returns once every node reports `cluster_state:ok`.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                RedisServer::start(&["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("redis-cli: {e}. {HOW_TO_GET_REDIS}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let ready = poll_until(Duration::from_secs(30), || {
            nodes.iter().all(|node| {
                node.query::<String>(cmd("CLUSTER").arg("INFO"))
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            })
        });
        assert!(ready, "the cluster did not become ready");
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
                .query::<()>(
                    cmd("MIGRATE")
                        .arg("127.0.0.1")
                        .arg(target.port)
                        .arg("")
                        .arg(0)
                        .arg(5000)
                        .arg("KEYS")
                        .arg(&moving),
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

/// The node id of `server` (`CLUSTER MYID`).
fn node_id(server: &RedisServer) -> String {
    server
        .query::<String>(cmd("CLUSTER").arg("MYID"))
        .expect("CLUSTER MYID")
}
