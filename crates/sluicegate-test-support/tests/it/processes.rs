//! The support crate's own promises: servers answer, stop and restart, die with their
//! handle, and a Sentinel deployment knows its master.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sluicegate_test_support::{RedisSentinel, RedisServer, cmd};

#[test]
fn a_server_answers_stops_and_restarts_on_its_port() {
    let server = RedisServer::start(&[]);
    server.query::<()>(cmd("SET").arg("k").arg("v")).unwrap();
    assert_eq!(server.query::<String>(cmd("GET").arg("k")).unwrap(), "v");
    server.shutdown();
    assert!(server.query::<()>(&cmd("PING")).is_err());
    let restarted = RedisServer::start_at(server.port, &[]);
    // Nothing was saved: the restarted server starts empty.
    assert_eq!(restarted.query::<u64>(&cmd("DBSIZE")).unwrap(), 0);
}

#[test]
fn a_dropped_server_is_killed() {
    let server = RedisServer::start(&[]);
    let port = server.port;
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "redis-server on {port} outlived its handle"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every sentinel names the master; and each would retry a failover it lost the election
/// for within 20 s (twice its failover timeout), not the default six minutes: three
/// sentinels that see the master down at once can split their votes one each, and a test
/// waiting out the retry must not outwait its own bound.
#[test]
fn every_sentinel_names_the_master_and_retries_a_lost_election_within_20_s() {
    let deployment = RedisSentinel::start(3);
    for sentinel in &deployment.sentinels {
        let master: (String, u16) = sentinel
            .query(
                cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(RedisSentinel::MASTER_NAME),
            )
            .unwrap();
        assert_eq!(master, ("127.0.0.1".to_owned(), deployment.master.port));
        let state: HashMap<String, String> = sentinel
            .query(
                cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(RedisSentinel::MASTER_NAME),
            )
            .unwrap();
        assert_eq!(state["failover-timeout"], "10000", "{state:?}");
    }
    assert!(!deployment.replica.is_master());
}
