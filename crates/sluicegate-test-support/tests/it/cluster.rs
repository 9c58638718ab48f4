//! The support crate's cluster: a slot moves even when its target answers slowly.

use std::process::Command;
use std::time::Duration;

use sluicegate_test_support::{RedisCluster, cmd};

/// A key of the slot `{moving}` names (every key with that tag is in it).
const KEY: &str = "{moving}:key";

/// While the target node is stopped for three seconds (a loaded machine's stall), the
/// `MIGRATE` of the slot's key waits for it — within its own five-second timeout — and the
/// slot moves.
#[test]
fn a_slot_moves_while_its_target_stalls() {
    let cluster = RedisCluster::start(3, 0);
    let slot: u16 = cluster.nodes[0]
        .query(cmd("CLUSTER").arg("KEYSLOT").arg(KEY))
        .expect("CLUSTER KEYSLOT");
    let source = cluster.master_of(slot);
    let target = cluster
        .nodes
        .iter()
        .find(|node| node.port != source.port)
        .expect("another master");
    source
        .query::<()>(cmd("SET").arg(KEY).arg("v"))
        .expect("SET");
    let target_pid = target.pid().to_string();
    let mut stalls = Vec::new();
    cluster.move_slot(slot, source, target, || {
        if stalls.is_empty() {
            let stop = Command::new("kill").args(["-STOP", &target_pid]).status();
            assert!(stop.expect("kill(1)").success());
            let pid = target_pid.clone();
            stalls.push(std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(3));
                Command::new("kill").args(["-CONT", &pid]).status()
            }));
        }
    });
    for stall in stalls {
        assert!(stall.join().unwrap().expect("kill(1)").success());
    }
    assert_eq!(cluster.master_of(slot).port, target.port);
    let moved: String = target
        .query(cmd("GET").arg(KEY))
        .expect("GET on the target");
    assert_eq!(moved, "v");
}
