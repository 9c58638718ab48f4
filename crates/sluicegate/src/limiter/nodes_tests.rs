//! Failure state per node through the limiter, on a manual clock: a store whose keys live
//! on numbered nodes, any of which can be taken down, say that the cluster is down, or
//! hand its keys to another node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::*;
use crate::clock::ManualClock;
use crate::rule::{Algorithm, RuleSpec};
use crate::store::MemoryStoreConfig;

const S: u64 = 1_000_000;

/// How a node answers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Health {
    Up,
    /// Unreachable: every check fails as an unreachable Redis's would.
    Down,
    /// It answers at once that the cluster is down.
    ClusterDown,
}

/// An in-memory store whose keys starting with `a` live on the node numbered by
/// `a_node` (1 at first) and every other key on node 2; each node answers by its health.
#[derive(Debug)]
struct NodeStore {
    inner: MemoryStore,
    a_node: AtomicU16,
    health: Mutex<Vec<Health>>,
    /// Checks that reached the store.
    calls: AtomicU64,
    /// Checks the limiter answered without calling a node, as it told the store.
    refused: AtomicU64,
}

impl NodeStore {
    fn node_of(&self, key: &str) -> NodeId {
        if key.starts_with('a') {
            NodeId(self.a_node.load(Ordering::SeqCst))
        } else {
            NodeId(2)
        }
    }

    fn set(&self, node: u16, health: Health) {
        self.health.lock()[usize::from(node)] = health;
    }
}

impl Store for NodeStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        for limit in check.limits {
            let node = self.node_of(limit.key);
            let server = format!("127.0.0.1:700{}", node.0);
            match self.health.lock()[usize::from(node.0)] {
                Health::Up => {}
                Health::Down => {
                    return Err(StoreError::Unavailable {
                        server,
                        message: "connection refused".into(),
                    });
                }
                Health::ClusterDown => {
                    return Err(StoreError::ClusterDown {
                        server,
                        message: "CLUSTERDOWN The cluster is down".into(),
                    });
                }
            }
        }
        self.inner.check_now(check)
    }

    fn nodes(&self, check: &Check<'_>) -> Nodes {
        let mut nodes: Vec<NodeId> = check.limits.iter().map(|l| self.node_of(l.key)).collect();
        nodes.sort();
        nodes.dedup();
        match nodes.as_slice() {
            [one] => Nodes::One(*one),
            _ => Nodes::Several(nodes),
        }
    }

    /// Node 2, and whichever of nodes 1 and 3 serves the `a` keys now.
    fn node_name(&self, node: NodeId) -> Option<String> {
        let serving = node == NodeId(2) || node.0 == self.a_node.load(Ordering::SeqCst);
        serving.then(|| format!("127.0.0.1:700{}", node.0))
    }

    fn node_refused(&self, _node: NodeId) {
        self.refused.fetch_add(1, Ordering::SeqCst);
    }
}

/// A limiter (failures answered `deny`, a breaker opening after 4 calls) and its store on
/// one manual clock.
fn limiter() -> (Limiter<NodeStore>, ManualClock) {
    let clock = ManualClock::new(Duration::from_micros(1_700_000_040 * S));
    let store = NodeStore {
        inner: MemoryStore::new(MemoryStoreConfig::default(), Arc::new(clock.clone())),
        a_node: AtomicU16::new(1),
        health: Mutex::new(vec![Health::Up; 4]),
        calls: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    };
    let config = LimiterConfig {
        on_store_error: FailurePolicy::Deny,
        breaker: BreakerConfig {
            min_calls: 4,
            cool_down: Duration::from_secs(1),
            ..BreakerConfig::default()
        },
        ..LimiterConfig::default()
    };
    (
        Limiter::with_clock(store, config, Arc::new(clock.clone())),
        clock,
    )
}

fn rule() -> Rule {
    Rule::new(
        "r",
        &RuleSpec::new(Algorithm::SlidingLog, 1_000, Duration::from_micros(60 * S)),
    )
    .unwrap()
}

async fn decide(limiter: &Limiter<NodeStore>, rule: &Rule, keys: &[&str]) -> DecidedBy {
    let limits: Vec<Limit<'_>> = keys.iter().map(|key| Limit { rule, key }).collect();
    limiter
        .decide(&Check::new(&limits, 1))
        .await
        .unwrap()
        .decided_by
}

fn state_of(limiter: &Limiter<NodeStore>, node: u16) -> Option<BreakerState> {
    limiter
        .node_breakers()
        .iter()
        .find(|b| b.node == NodeId(node))
        .map(|b| b.state)
}

const DENIED: DecidedBy = DecidedBy::Fallback(FailurePolicy::Deny);

/// Node 1 fails: its breaker opens, and its keys are answered by their policy without a
/// call; node 2's keys are decided by the store throughout, its breaker closed. A check
/// of both nodes' keys is refused while node 1's is open.
#[tokio::test]
async fn a_failing_node_opens_its_own_breaker_only() {
    let (limiter, clock) = limiter();
    let rule = rule();
    assert_eq!(decide(&limiter, &rule, &["a1"]).await, DecidedBy::Store);
    limiter.store().set(1, Health::Down);
    for i in 0..4 {
        assert_eq!(decide(&limiter, &rule, &["a1"]).await, DENIED);
        assert_eq!(
            decide(&limiter, &rule, &[&format!("b{i}")]).await,
            DecidedBy::Store
        );
    }
    assert_eq!(state_of(&limiter, 1), Some(BreakerState::Open));
    assert_eq!(state_of(&limiter, 2), Some(BreakerState::Closed));
    assert_eq!(
        limiter.breaker_state(),
        BreakerState::Open,
        "some node is open"
    );

    let calls = limiter.store().calls.load(Ordering::SeqCst);
    let refused = limiter.store().refused.load(Ordering::SeqCst);
    clock.advance(Duration::from_micros(S / 2));
    assert_eq!(decide(&limiter, &rule, &["a2"]).await, DENIED);
    assert_eq!(decide(&limiter, &rule, &["a2", "b1"]).await, DENIED);
    assert_eq!(
        limiter.store().calls.load(Ordering::SeqCst),
        calls,
        "the open node's checks are answered unsent"
    );
    assert_eq!(limiter.store().refused.load(Ordering::SeqCst), refused + 2);
    assert_eq!(decide(&limiter, &rule, &["b1"]).await, DecidedBy::Store);

    let names: Vec<&str> = limiter.node_breakers().iter().map(|b| b.name).collect();
    assert_eq!(names, ["127.0.0.1:7001", "127.0.0.1:7002"]);
    assert_eq!(limiter.breaker_transitions().to(BreakerState::Open), 1);

    // Back after the cool-down: one probe closes it.
    limiter.store().set(1, Health::Up);
    clock.advance(Duration::from_micros(S / 2));
    assert_eq!(decide(&limiter, &rule, &["a1"]).await, DecidedBy::Store);
    assert_eq!(state_of(&limiter, 1), Some(BreakerState::Closed));
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
}

/// Node 1's keys move to node 3 (its replica promoted, the slot map read again): they are
/// decided there at once, not held by node 1's breaker for its cool-down. Node 1, which
/// serves nothing now, is left out of what the breakers show: the whole store's is closed.
#[tokio::test]
async fn keys_that_moved_to_a_healthy_node_are_decided_there_at_once() {
    let (limiter, _clock) = limiter();
    let rule = rule();
    limiter.store().set(1, Health::Down);
    for _ in 0..4 {
        assert_eq!(decide(&limiter, &rule, &["a1"]).await, DENIED);
    }
    assert_eq!(state_of(&limiter, 1), Some(BreakerState::Open));
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    limiter.store().a_node.store(3, Ordering::SeqCst);
    assert_eq!(decide(&limiter, &rule, &["a1"]).await, DecidedBy::Store);
    assert_eq!(state_of(&limiter, 1), None, "node 1 serves nothing");
    assert_eq!(state_of(&limiter, 3), Some(BreakerState::Closed));
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    assert_eq!(limiter.breaker_transitions().to(BreakerState::Open), 1);
}

/// A node that answers at once that the cluster is down fails those checks (their policy
/// answers), but never opens its breaker: once the cluster is ok, its very next check is
/// decided by the store.
#[tokio::test]
async fn a_cluster_that_is_down_does_not_open_the_breakers_of_nodes_that_answer() {
    let (limiter, _clock) = limiter();
    let rule = rule();
    limiter.store().set(2, Health::ClusterDown);
    for i in 0..50 {
        assert_eq!(decide(&limiter, &rule, &[&format!("b{i}")]).await, DENIED);
    }
    assert_eq!(state_of(&limiter, 2), Some(BreakerState::Closed));
    assert_eq!(limiter.breaker_transitions().to(BreakerState::Open), 0);
    limiter.store().set(2, Health::Up);
    assert_eq!(decide(&limiter, &rule, &["b1"]).await, DecidedBy::Store);
}
