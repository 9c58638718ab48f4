//! Real Redis for sluicegate's tests: standalone servers, a Redis Cluster and a Sentinel
//! deployment, started by the tests themselves on free loopback ports; and a
//! [`FaultProxy`] to put latency, stalls, dropped, reset and half-closed connections
//! between a client and them.
//!
//! Every process runs under a small shell that kills it when its [`RedisServer`] is dropped
//! or the test process exits (the shell waits on a pipe from the test process; either way
//! closes it), so nothing outlives the test run. Tests talk to the servers with the `redis`
//! crate's client: [`RedisServer::query`] with a [`cmd`].
//!
//! ```no_run
//! use sluicegate_test_support::{cmd, standalone};
//!
//! let server = standalone();
//! let keys: u64 = server.query(&cmd("DBSIZE")).unwrap();
//! println!("{} holds {keys} keys", server.url());
//! ```
//!
//! redis-server and redis-cli must be on the PATH (`scripts/test` installs them), and
//! openssl for [`certificates`].

pub mod certificates;
mod cluster;
mod poll;
mod proxy;
mod sentinel;
mod server;
#[cfg(target_os = "linux")]
mod sockets;

use std::sync::OnceLock;

pub use cluster::RedisCluster;
pub use proxy::{Direction, FaultProxy};
pub use redis::{Cmd, cmd};
pub use sentinel::{RedisSentinel, SentinelOptions};
pub use server::{RedisServer, free_port};
#[cfg(target_os = "linux")]
pub use sockets::{OwnSocket, own_tcp_sockets};

/// A standalone server shared by every test of one test binary.
pub fn standalone() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start(&[]))
}

/// A three-master Redis Cluster (no replicas) shared by every test of one test binary.
pub fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}
