//! The support crate's own promises: servers answer, stop and restart, die with their
//! handle or their process and leave no directory behind, and a Sentinel deployment knows
//! its master.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sluicegate_test_support::{RedisSentinel, RedisServer, cmd};

#[test]
fn a_server_answers_stops_and_restarts_on_its_port() {
    let server = RedisServer::start(&[]);
    server.query::<()>(cmd("SET").arg("k").arg("v")).unwrap();
    assert_eq!(server.query::<String>(cmd("GET").arg("k")).unwrap(), "v");
    server.shutdown();
    assert!(server.query::<()>(&cmd("PING")).is_err());
    let restarted = server.restart(&[]);
    // Nothing was saved: the restarted server starts empty.
    assert_eq!(restarted.query::<u64>(&cmd("DBSIZE")).unwrap(), 0);
}

#[test]
fn a_restarted_server_finds_what_it_saved_and_its_directory_goes_with_it() {
    let server = RedisServer::start(&[]);
    server.query::<()>(cmd("SET").arg("k").arg("v")).unwrap();
    server.query::<()>(&cmd("SAVE")).unwrap();
    server.shutdown();
    let restarted = server.restart(&[]);
    assert_eq!(restarted.query::<String>(cmd("GET").arg("k")).unwrap(), "v");
    let directory = restarted.directory();
    drop(restarted);
    assert!(
        !directory.exists(),
        "{} outlived its server",
        directory.display()
    );
}

/// Whether process `pid` exists (a zombie too: until its parent reaps it).
fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_dropped_server_is_killed_and_its_directory_removed() {
    let server = RedisServer::start(&[]);
    let pid = server.pid();
    let directory = server.directory();
    assert!(directory.join("log").exists());
    drop(server);
    assert!(
        !process_exists(pid),
        "redis-server {pid} outlived its handle"
    );
    assert!(
        !directory.exists(),
        "{} outlived its server",
        directory.display()
    );
}

/// Set for the process that [`a_server_never_dropped_goes_with_its_process`] starts, to
/// have the test leave a server behind there.
const LEAVE_A_SERVER: &str = "SLUICEGATE_TEST_LEAVE_A_SERVER";

/// A server that is never dropped (one in a `static`) is killed, and its directory removed,
/// once its test process exits: this test runs itself again in a process of its own, which
/// starts a server, says which and where, and exits without dropping it.
#[test]
fn a_server_never_dropped_goes_with_its_process() {
    if std::env::var_os(LEAVE_A_SERVER).is_some() {
        let server = RedisServer::start(&[]);
        println!(
            "{LEAVE_A_SERVER} {} {}",
            server.pid(),
            server.directory().display()
        );
        std::mem::forget(server);
        return;
    }
    let run = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "processes::a_server_never_dropped_goes_with_its_process",
            "--nocapture",
        ])
        .env(LEAVE_A_SERVER, "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{said}");
    // libtest may print the test's name on the same line, before it.
    let (pid, directory) = said
        .lines()
        .find_map(|line| line.split_once(LEAVE_A_SERVER)?.1.trim().split_once(' '))
        .unwrap_or_else(|| panic!("the process left no server: {said}"));
    let pid: u32 = pid.parse().unwrap();
    let directory = Path::new(directory);
    // Its shell cleans up once the process is gone, on its own time.
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_exists(pid) || directory.exists() {
        assert!(
            Instant::now() < deadline,
            "redis-server {pid} or {} outlived its process",
            directory.display()
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
