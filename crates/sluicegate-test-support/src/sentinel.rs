//! A Sentinel deployment of real servers: one master, one replica, and sentinels watching
//! them (each a redis-server in sentinel mode).

use std::time::Duration;

use redis::{Value, cmd};

use crate::poll::poll_until;
use crate::server::RedisServer;

/// One master, its replica, and the sentinels that monitor them as
/// [`MASTER_NAME`](Self::MASTER_NAME), all on loopback ports.
pub struct RedisSentinel {
    /// The master the sentinels were told to monitor.
    pub master: RedisServer,
    /// A replica of the master: the one a failover promotes.
    pub replica: RedisServer,
    /// The sentinels; query them with `SENTINEL …` commands.
    pub sentinels: Vec<RedisServer>,
}

impl RedisSentinel {
    /// The name the sentinels know the master by.
    pub const MASTER_NAME: &'static str = "sluicegate";

    /// Starts the master, the replica and `sentinels` sentinels (`sentinels` ≥ 1), with a
    /// majority of them as the quorum; a master that stops answering for one second is
    /// down. Returns once the replica is in sync and every sentinel knows the master, the
    /// replica and the other sentinels — the state a failover needs.
    pub fn start(sentinels: usize) -> RedisSentinel {
        assert!(sentinels >= 1, "a deployment needs a sentinel");
        let master = RedisServer::start(&[]);
        let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
        let in_sync = poll_until(Duration::from_secs(10), || {
            replica
                .query::<String>(cmd("INFO").arg("replication"))
                .is_ok_and(|info| info.contains("master_link_status:up"))
        });
        assert!(in_sync, "the replica on {} did not sync", replica.port);

        let name = RedisSentinel::MASTER_NAME;
        let quorum = sentinels / 2 + 1;
        let config = format!(
            "sentinel monitor {name} 127.0.0.1 {} {quorum}\n\
             sentinel down-after-milliseconds {name} 1000\n",
            master.port
        );
        let sentinels: Vec<RedisServer> = (0..sentinels)
            .map(|_| RedisServer::start_configured(&config, &["--sentinel"]))
            .collect();
        // Sentinels learn of the replica from the master's INFO and of each other from
        // hello messages on the master, every few seconds.
        let count = |sentinel: &RedisServer, what: &str| {
            sentinel
                .query::<Vec<Value>>(cmd("SENTINEL").arg(what).arg(name))
                .map_or(0, |found| found.len())
        };
        let acquainted = poll_until(Duration::from_secs(30), || {
            sentinels.iter().all(|sentinel| {
                count(sentinel, "replicas") == 1
                    && count(sentinel, "sentinels") == sentinels.len() - 1
            })
        });
        assert!(
            acquainted,
            "the sentinels did not discover the replica and each other"
        );
        RedisSentinel {
            master,
            replica,
            sentinels,
        }
    }
}
