//! When a store's answer counts as given: as soon as the server that decided it has it, or
//! only once a replica has it too.

use std::fmt;
use std::str::FromStr;

/// How durable an admission must be before a check answers. Redis replicates
/// asynchronously: a master that fails before its replica has an admission loses it when
/// the replica takes over, and the units it took are granted again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// A check answers once the server that decided it recorded it.
    #[default]
    Async,
    /// A check that recorded units answers only once at least one replica of the server
    /// that decided it acknowledged the write (Redis `WAIT 1`, within half the store's
    /// timeout); otherwise it fails as [`StoreError::NotReplicated`], which the failure
    /// policies answer. Needs a Redis with replicas: the in-memory store, or a Redis whose
    /// masters have none connected at connect, is refused.
    ///
    /// [`StoreError::NotReplicated`]: crate::StoreError::NotReplicated
    Replicated,
}

impl Durability {
    /// The name used on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Durability::Async => "async",
            Durability::Replicated => "replicated",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Durability::Async, Durability::Replicated]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown store durability {s:?}; expected async or replicated"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back() {
        for durability in [Durability::Async, Durability::Replicated] {
            assert_eq!(durability.name().parse::<Durability>(), Ok(durability));
        }
        assert!(
            "sync"
                .parse::<Durability>()
                .unwrap_err()
                .contains("async or replicated")
        );
    }
}
