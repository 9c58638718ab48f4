//! What a check gets when the store cannot decide it. Below the limiter, the rules and
//! the stores: a rule carries its own policy and an outcome names the one that decided it,
//! while only the limiter applies them.

use std::fmt;
use std::str::FromStr;

/// A policy for store failures, server-wide or per rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Answer with the store's error: neither allowed nor refused (the default).
    #[default]
    Error,
    /// Fail open: allow.
    Allow,
    /// Fail closed: refuse.
    Deny,
    /// Decide with an in-memory limiter whose limit is L divided by the number of
    /// instances sharing the store, rounded up.
    Local,
}

impl FailurePolicy {
    /// The name used on the command line and in configuration.
    pub const fn name(self) -> &'static str {
        match self {
            FailurePolicy::Error => "error",
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
            FailurePolicy::Local => "local",
        }
    }

    /// How strongly a policy refuses, to settle a check whose rules disagree.
    pub(crate) fn strictness(self) -> u8 {
        match self {
            FailurePolicy::Allow => 0,
            FailurePolicy::Local => 1,
            FailurePolicy::Deny => 2,
            FailurePolicy::Error => 3,
        }
    }
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FailurePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            FailurePolicy::Error,
            FailurePolicy::Allow,
            FailurePolicy::Deny,
            FailurePolicy::Local,
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| format!("unknown policy {s:?}; expected error, allow, deny or local"))
    }
}

/// What the limiter does with a key whose state the store has lost (a restart without
/// persistence, a failover that lost writes, a flush), as
/// [`Store::lost_state_generation`](crate::Store::lost_state_generation) tells it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnStoreReset {
    /// Nothing: the key starts again from what the store holds now, possibly empty, and
    /// may admit up to L more in the window it lost.
    Admit,
    /// The instance writes back the units it last saw the store count for the key in the
    /// window (what it would start a `local` fallback from) before the store may admit
    /// the key again: no key passes L through the loss of what this instance saw, at the
    /// price of counting units again that other instances also write back (the default).
    #[default]
    Conservative,
}

impl OnStoreReset {
    /// The name used on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            OnStoreReset::Admit => "admit",
            OnStoreReset::Conservative => "conservative",
        }
    }
}

impl fmt::Display for OnStoreReset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OnStoreReset {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [OnStoreReset::Admit, OnStoreReset::Conservative]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!("unknown store-reset policy {s:?}; expected admit or conservative")
            })
    }
}
