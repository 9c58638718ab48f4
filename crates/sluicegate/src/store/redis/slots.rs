//! Which node of a Redis Cluster serves each hash slot, as last read (`CLUSTER SLOTS`): what
//! the batcher groups a cluster's checks by. It may be out of date; a node refuses what it
//! does not hold, and the checks it refused are sent again on their own.

use redis::Value;

/// Hash slots of a Redis Cluster.
pub(super) const SLOTS: usize = 16384;

/// Each slot's node, as a number, and each node's address.
pub(super) struct SlotMap {
    nodes: Vec<Option<u16>>,
    addresses: Vec<(String, u16)>,
}

impl SlotMap {
    /// A map that knows no slot: every check is grouped by its own keys.
    pub(super) fn unknown() -> SlotMap {
        SlotMap {
            nodes: vec![None; SLOTS],
            addresses: Vec::new(),
        }
    }

    /// The map `CLUSTER SLOTS` answered: ranges `[start, end, [host, port, …], replicas…]`.
    /// `None` when the reply is not of that shape.
    pub(super) fn from_reply(reply: &Value) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = SlotMap::unknown();
        let mut addresses: Vec<(String, u16)> = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
                (master.first(), master.get(1))
            else {
                return None;
            };
            let address = (
                String::from_utf8(host.clone()).ok()?,
                u16::try_from(*port).ok()?,
            );
            let node = match addresses.iter().position(|known| *known == address) {
                Some(i) => i,
                None => {
                    addresses.push(address);
                    addresses.len() - 1
                }
            };
            let node = u16::try_from(node).ok()?;
            let start = usize::try_from(*start).ok()?;
            let end = usize::try_from(*end).ok()?.min(SLOTS - 1);
            for slot in start..=end {
                map.nodes[slot] = Some(node);
            }
        }
        map.addresses = addresses;
        Some(map)
    }

    /// The host and port of `node`.
    pub(super) fn address(&self, node: u16) -> Option<(&str, u16)> {
        self.addresses
            .get(usize::from(node))
            .map(|(host, port)| (host.as_str(), *port))
    }

    /// Every node that serves a slot: its number and its host and port.
    pub(super) fn nodes(&self) -> impl Iterator<Item = (u16, (&str, u16))> {
        self.addresses
            .iter()
            .enumerate()
            .filter_map(|(i, (host, port))| Some((u16::try_from(i).ok()?, (host.as_str(), *port))))
    }

    /// The slots `node` serves.
    pub(super) fn slots_of(&self, node: u16) -> impl Iterator<Item = u16> + '_ {
        (0..SLOTS as u16).filter(move |&slot| self.node_of(slot) == Some(node))
    }

    /// The node serving `slot`, if known.
    pub(super) fn node_of(&self, slot: u16) -> Option<u16> {
        self.nodes.get(usize::from(slot)).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn ranges_name_their_nodes() {
        let reply = Value::Array(vec![
            range(0, 99, "10.0.0.1", 6379),
            range(100, 16383, "10.0.0.2", 6379),
            range(50, 50, "10.0.0.1", 6379),
        ]);
        let map = SlotMap::from_reply(&reply).unwrap();
        assert_eq!(map.node_of(0), map.node_of(99));
        assert_ne!(map.node_of(99), map.node_of(100));
        assert_eq!(map.node_of(16383), map.node_of(100));
        assert_eq!(
            map.address(map.node_of(0).unwrap()),
            Some(("10.0.0.1", 6379))
        );
        assert_eq!(
            map.address(map.node_of(100).unwrap()),
            Some(("10.0.0.2", 6379))
        );
        assert!(SlotMap::from_reply(&Value::Int(1)).is_none());
        assert_eq!(SlotMap::unknown().node_of(7), None);
    }
}
