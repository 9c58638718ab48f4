//! The connection slots of every listener: `--max-connections` over all of them, and of
//! those at most `--max-connections-per-address` from one client, so that one client
//! holding idle connections cannot lock every other client out.
//!
//! A client is an IPv4 address, or an IPv6 /64: one host is commonly given a whole /64
//! and picks addresses in it at will (privacy addresses), so counting IPv6 addresses one
//! by one would be no bound. An IPv4-mapped IPv6 address (a dual-stack listener's IPv4
//! peer) counts as its IPv4 address.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Refused;

/// By default one client may hold a quarter of `--max-connections`: far more than one
/// Envoy keeps to a rate-limit service (a few HTTP/2 connections per worker thread), so
/// every Envoy of a fleet fits, while three quarters stay for the other clients when one
/// holds its whole share.
const DEFAULT_SHARE_DIVISOR: usize = 4;

/// The connection slots every listener takes from.
pub(super) struct Slots {
    total: Arc<Semaphore>,
    max_connections: usize,
    per_client: usize,
    /// Connections open per client; a client with none has no entry, so this holds at
    /// most `max_connections` entries.
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl Slots {
    /// `max_connections` slots; `per_client` of them at most for one client (`None`: a
    /// quarter of `max_connections`, at least one).
    pub(super) fn new(max_connections: usize, per_client: Option<usize>) -> Arc<Self> {
        let max_connections = max_connections.max(1);
        let per_client = per_client
            .unwrap_or_else(|| max_connections.div_ceil(DEFAULT_SHARE_DIVISOR))
            .clamp(1, max_connections);
        Arc::new(Slots {
            total: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            per_client,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// `--max-connections` as in force.
    pub(super) fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// `--max-connections-per-address` as in force.
    pub(super) fn per_client(&self) -> usize {
        self.per_client
    }

    /// A slot for a connection from `peer`, held until dropped; a refusal takes nothing.
    /// The total is looked at first: when every slot is taken, that is the reason.
    pub(super) fn take(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Refused> {
        let permit = Arc::clone(&self.total)
            .try_acquire_owned()
            .map_err(|_| Refused::Total)?;
        let client = client_of(peer);
        let mut open = self.open.lock();
        let held = open.entry(client).or_insert(0);
        if *held >= self.per_client {
            return Err(Refused::ClientShare);
        }
        *held += 1;
        drop(open);
        Ok(Slot {
            _permit: permit,
            _client: ClientSlot {
                slots: Arc::clone(self),
                client,
            },
        })
    }
}

/// One connection's slot, given back when dropped.
pub(super) struct Slot {
    _permit: OwnedSemaphorePermit,
    _client: ClientSlot,
}

/// One connection counted against its client's share until dropped.
struct ClientSlot {
    slots: Arc<Slots>,
    client: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock();
        if let Some(held) = open.get_mut(&self.client) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.client);
            }
        }
    }
}

/// The client `peer` is counted as: its IPv4 address, or its IPv6 /64.
pub(crate) fn client_of(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ipv6_clients_are_their_64_and_mapped_ipv4_is_ipv4() {
        assert_eq!(client_of(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            client_of(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")),
            ip("2001:db8:1:2::")
        );
        assert_ne!(client_of(ip("2001:db8:1:3::1")), ip("2001:db8:1:2::"));
        assert_eq!(client_of(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(client_of(ip("192.0.2.7")), ip("192.0.2.7"));
    }

    #[test]
    fn one_64_holds_its_share_and_another_client_is_served() {
        let slots = Slots::new(8, Some(2));
        let held: Vec<Slot> = ["2001:db8::1", "2001:db8::2"]
            .map(|peer| slots.take(ip(peer)).unwrap())
            .into();
        assert_eq!(
            slots.take(ip("2001:db8::ffff")).err(),
            Some(Refused::ClientShare)
        );
        let other = slots.take(ip("2001:db8:0:1::1")).unwrap();
        drop(held);
        assert!(slots.take(ip("2001:db8::3")).is_ok());
        drop(other);
        assert!(
            slots.open.lock().is_empty(),
            "a client with none is forgotten"
        );
    }

    #[test]
    fn at_the_total_a_refusal_takes_nothing_from_the_client() {
        let slots = Slots::new(2, Some(2));
        let _a = slots.take(ip("192.0.2.1")).unwrap();
        let _b = slots.take(ip("192.0.2.2")).unwrap();
        assert_eq!(slots.take(ip("192.0.2.3")).err(), Some(Refused::Total));
        assert_eq!(slots.open.lock().get(&ip("192.0.2.3")), None);
        assert_eq!(slots.open.lock().get(&ip("192.0.2.1")), Some(&1));
    }

    #[test]
    fn the_default_share_is_a_quarter_of_the_total() {
        assert_eq!(Slots::new(10_000, None).per_client(), 2_500);
        assert_eq!(Slots::new(960, None).per_client(), 240);
        assert_eq!(Slots::new(3, None).per_client(), 1);
        assert_eq!(Slots::new(4, Some(usize::MAX)).per_client(), 4);
    }
}
