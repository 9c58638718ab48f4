//! Failure state per node of the store: a [`Breaker`] for each node the store numbers
//! ([`NodeId`]), made when a check first goes there. A failing node opens its own breaker;
//! checks of keys on other nodes never see it.
//!
//! Lock-free on the way of every check: the breakers sit in a fixed table indexed by the
//! node's number, each made once (`OnceLock`), so finding a node's breaker is an index and
//! an atomic read. The table holds [`MAX_NODES`] breakers; a store that numbers more nodes
//! over its life (a cluster whose masters came and went at new addresses a thousand times)
//! shares the last breaker among the rest.

use std::sync::OnceLock;

use super::breaker::{Breaker, BreakerConfig, BreakerState, BreakerTransitions};
use crate::store::NodeId;

/// Nodes with a breaker of their own.
pub(crate) const MAX_NODES: usize = 1024;

/// The state of several nodes' breakers together: open while any is open (some checks fall
/// back unsent), else half-open while any probes, else closed.
pub(crate) fn worst(states: impl Iterator<Item = BreakerState>) -> BreakerState {
    states
        .max_by_key(|state| match state {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        })
        .unwrap_or(BreakerState::Closed)
}

/// One breaker per node.
#[derive(Debug)]
pub(crate) struct NodeBreakers {
    config: BreakerConfig,
    table: Box<[OnceLock<Box<Breaker>>]>,
}

/// One node's breaker as metrics and the live page show it.
#[derive(Debug)]
pub struct NodeBreaker<'a> {
    /// The node's number in the store.
    pub node: NodeId,
    /// What the store calls the node (`host:port`, or the store's URL for a single server).
    pub name: &'a str,
    /// The breaker's state now (open past its cool-down reads as half-open).
    pub state: BreakerState,
    /// How many times this node's breaker entered each state.
    pub transitions: &'a BreakerTransitions,
}

impl NodeBreakers {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        NodeBreakers {
            config,
            table: (0..MAX_NODES).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The breaker of `node`, made now if it is the node's first check (`name` says what
    /// to call it).
    pub(crate) fn of(&self, node: NodeId, name: impl FnOnce() -> Option<String>) -> &Breaker {
        let index = usize::from(node.0).min(MAX_NODES - 1);
        self.table[index].get_or_init(|| {
            let name = name().unwrap_or_else(|| format!("node {}", node.0));
            Box::new(Breaker::new(self.config, name))
        })
    }

    /// Every node that has had a check, in the order of their numbers.
    pub(crate) fn all(&self, now: u64) -> impl Iterator<Item = NodeBreaker<'_>> {
        self.table.iter().enumerate().filter_map(move |(i, made)| {
            let breaker = made.get()?;
            Some(NodeBreaker {
                node: NodeId(u16::try_from(i).unwrap_or(u16::MAX)),
                name: breaker.node(),
                state: breaker.state(now),
                transitions: breaker.transitions(),
            })
        })
    }

    /// Every node's changes into each state, summed.
    pub(crate) fn transitions(&self) -> BreakerTransitions {
        let sum = BreakerTransitions::default();
        for node in self.all(0) {
            sum.add(node.transitions);
        }
        sum
    }
}
