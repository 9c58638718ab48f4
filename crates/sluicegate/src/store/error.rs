//! Why a store could not decide.

use std::fmt;

use crate::algorithm::RequestUse;

/// Why a store could not decide. Never a decision: callers choose what to do (fail open,
/// fail closed, decide locally) and say so.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The check itself is malformed.
    InvalidCheck(String),
    /// The check's request id is remembered from a request of another mode or cost, whose
    /// memory still lasts: a conflicting reuse, not a retry (docs/SPEC.md, "Retries"). The
    /// check is refused whole and records nothing, in every limit.
    RequestIdConflict(RequestIdConflict),
    /// The server could not be reached.
    Unavailable {
        /// The server (its URL without credentials).
        server: String,
        /// What went wrong.
        message: String,
    },
    /// The Redis Cluster is down as the node that answered sees it: `CLUSTERDOWN`, or a
    /// script told that "the cluster is down" (a slot has no master while a failover is
    /// under way, or the node is cut off from the majority). The node answered at once,
    /// and answers again once the cluster is ok.
    ClusterDown {
        /// The server.
        server: String,
        /// The server's message.
        message: String,
    },
    /// The server did not answer within the configured time.
    Timeout {
        /// The server.
        server: String,
        /// The check's first state key.
        key: Option<String>,
        /// The timeout.
        after: std::time::Duration,
    },
    /// The check recorded units, but no replica of the server acknowledged the write
    /// within the time allowed ([`Durability::Replicated`]): a failover could lose it.
    /// The units stay taken on the server.
    ///
    /// [`Durability::Replicated`]: crate::Durability::Replicated
    NotReplicated {
        /// The server.
        server: String,
        /// The check's first state key.
        key: Option<String>,
        /// How many replicas acknowledged the write (fewer than needed).
        acknowledged: u64,
        /// How long the server waited for them.
        within: std::time::Duration,
    },
    /// A key the check needs holds a value of another type (something else wrote it).
    WrongType {
        /// The server.
        server: String,
        /// The key.
        key: String,
    },
    /// The script failed or answered something unexpected.
    Script {
        /// The server.
        server: String,
        /// The check's first state key.
        key: Option<String>,
        /// The server's message.
        message: String,
    },
}

/// A request id reused for another request: what the id was first used for and what the
/// check asked, in the first limit (in the check's order) whose state remembers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestIdConflict {
    /// The request id.
    pub request_id: String,
    /// The name of the rule whose state remembers the id.
    pub rule: String,
    /// What the id was first used for.
    pub remembered: RequestUse,
    /// What this check asked of that rule.
    pub asked: RequestUse,
}

impl fmt::Display for RequestIdConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request id {:?} was used for a {} under rule {:?}, and this is a {}: a retry \
             must ask the same, and another request needs another id",
            self.request_id, self.remembered, self.rule, self.asked
        )
    }
}

/// The server an open circuit breaker's errors name: it refused to call the store at all.
const BREAKER_OPEN: &str = "(circuit breaker open)";

impl StoreError {
    /// The error an open circuit breaker answers with instead of calling the store:
    /// [`StoreError::Unavailable`], saying why in `message`.
    pub(crate) fn breaker_open(message: String) -> StoreError {
        StoreError::Unavailable {
            server: BREAKER_OPEN.to_owned(),
            message,
        }
    }

    /// What kind of failure this is, in snake case, for counting failures by kind:
    /// `timeout`, `breaker_open`, `unavailable`, `cluster_down`, `script`, `wrong_type`,
    /// `invalid_check`, `request_id_conflict`, `not_replicated`. An open breaker's error is an [`StoreError::Unavailable`] to its
    /// callers, but a kind of its own here: no call was made.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::InvalidCheck(_) => "invalid_check",
            StoreError::RequestIdConflict(_) => "request_id_conflict",
            StoreError::Unavailable { server, .. } if server == BREAKER_OPEN => "breaker_open",
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::ClusterDown { .. } => "cluster_down",
            StoreError::Timeout { .. } => "timeout",
            StoreError::NotReplicated { .. } => "not_replicated",
            StoreError::WrongType { .. } => "wrong_type",
            StoreError::Script { .. } => "script",
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::InvalidCheck(message) => write!(f, "invalid check: {message}"),
            StoreError::RequestIdConflict(conflict) => conflict.fmt(f),
            StoreError::Unavailable { server, message } => {
                write!(f, "redis at {server} is unavailable: {message}")
            }
            StoreError::ClusterDown { server, message } => {
                write!(f, "the redis cluster at {server} is down: {message}")
            }
            StoreError::Timeout { server, key, after } => write!(
                f,
                "redis at {server} did not answer within {after:?}{}",
                key.as_ref()
                    .map_or(String::new(), |k| format!(" (key {k})"))
            ),
            StoreError::NotReplicated {
                server,
                key,
                acknowledged,
                within,
            } => write!(
                f,
                "redis at {server}: not replicated within {within:?} ({acknowledged} replicas \
                 acknowledged the check's write, 1 needed){}",
                key.as_ref()
                    .map_or(String::new(), |k| format!(" (key {k})"))
            ),
            StoreError::WrongType { server, key } => write!(
                f,
                "redis at {server}: key {key:?} holds a value of the wrong type; something \
                 other than sluicegate wrote it"
            ),
            StoreError::Script {
                server,
                key,
                message,
            } => write!(
                f,
                "redis at {server}: check script failed{}: {message}",
                key.as_ref()
                    .map_or(String::new(), |k| format!(" on key {k}"))
            ),
        }
    }
}

impl std::error::Error for StoreError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// An open breaker's error is `Unavailable` to callers but a kind of its own when
    /// counted: no call was made.
    #[test]
    fn an_open_breaker_is_a_kind_apart_from_an_unavailable_server() {
        let open = StoreError::breaker_open("next try in 1s".to_owned());
        assert!(matches!(open, StoreError::Unavailable { .. }));
        assert_eq!(open.kind(), "breaker_open");
        let down = StoreError::Unavailable {
            server: "redis://127.0.0.1:6379".to_owned(),
            message: "connection refused".to_owned(),
        };
        assert_eq!(down.kind(), "unavailable");
        let timeout = StoreError::Timeout {
            server: "redis://127.0.0.1:6379".to_owned(),
            key: None,
            after: std::time::Duration::from_millis(50),
        };
        assert_eq!(timeout.kind(), "timeout");
    }
}
