//! The support crate's own promises: servers answer, stop and restart, die with their
//! handle, and a Sentinel deployment knows its master.

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

#[test]
fn every_sentinel_names_the_master() {
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
    }
    assert!(!deployment.replica.is_master());
}
