//! Why a store could not decide.

use std::fmt;

/// Why a store could not decide. Never a decision: callers choose what to do (fail open,
/// fail closed, decide locally) and say so.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The check itself is malformed.
    InvalidCheck(String),
    /// The in-memory store holds `max_keys` live keys and this check would add one more.
    KeyCapacity {
        /// The configured cap.
        max_keys: usize,
    },
    /// The server could not be reached, or the cluster is down.
    Unavailable {
        /// The server (its URL without credentials).
        server: String,
        /// What went wrong.
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

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::InvalidCheck(message) => write!(f, "invalid check: {message}"),
            StoreError::KeyCapacity { max_keys } => write!(
                f,
                "in-memory store is full: {max_keys} keys are live; a new key is not admitted \
                 until one expires (raise max_keys to hold more)"
            ),
            StoreError::Unavailable { server, message } => {
                write!(f, "redis at {server} is unavailable: {message}")
            }
            StoreError::Timeout { server, key, after } => write!(
                f,
                "redis at {server} did not answer within {after:?}{}",
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
