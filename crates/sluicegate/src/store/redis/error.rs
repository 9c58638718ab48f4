//! Why a Redis call failed, and how that becomes a [`StoreError`] naming the server and,
//! where there is one, the key.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::error::StoreError;

/// A Redis call that did not answer with the script's rows.
#[derive(Clone)]
pub(super) enum CallError {
    Redis(RedisError),
    Timeout,
    /// Redis refused a command of this check (the script caught it, so the other checks
    /// sent in the same call went on).
    Check(String),
    /// The batching task is gone (its runtime shut down).
    Closed,
    /// A check of several Redis Cluster slots that cannot be one call: its slots are not
    /// all on one node (by the slot map as last read, or the node turned it away before it
    /// wrote), or calls cannot be routed. Nothing ran; the store runs it slot by slot.
    NotOnOneNode,
    /// The check recorded units, and fewer replicas than needed acknowledged the write
    /// within `within` (`WAIT`, sent right after the call).
    NotReplicated {
        acknowledged: u64,
        within: Duration,
    },
}

/// `call`, or a timeout error once `timeout` has passed.
pub(super) async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(CallError::Redis(e)),
        Err(_) => Err(CallError::Timeout),
    }
}

/// What Redis' error says when a key holds another type than the command needs.
const WRONG_TYPE: &str = "WRONGTYPE";

impl CallError {
    pub(super) fn is_wrong_type(&self) -> bool {
        match self {
            CallError::Redis(e) => e.to_string().contains(WRONG_TYPE),
            CallError::Check(message) => message.contains(WRONG_TYPE),
            CallError::Timeout
            | CallError::Closed
            | CallError::NotOnOneNode
            | CallError::NotReplicated { .. } => false,
        }
    }

    /// Whether Redis stayed silent for the whole call: our bound ended it, or the client's
    /// own response timeout did (the same setting; either may fire first).
    pub(super) fn is_timeout(&self) -> bool {
        match self {
            CallError::Timeout => true,
            CallError::Redis(e) => e.is_timeout(),
            CallError::Check(_)
            | CallError::Closed
            | CallError::NotOnOneNode
            | CallError::NotReplicated { .. } => false,
        }
    }

    /// Whether the node answered that the cluster is down: `CLUSTERDOWN` for the command,
    /// or, for a script already running, Redis 7's "Script attempted to execute a command
    /// while the cluster is down" (and "… while the cluster is down and readonly").
    fn is_cluster_down(&self) -> bool {
        match self {
            CallError::Redis(e) => e.kind() == ErrorKind::Server(ServerErrorKind::ClusterDown),
            CallError::Check(message) => {
                message.starts_with("CLUSTERDOWN") || message.contains("the cluster is down")
            }
            CallError::Timeout
            | CallError::Closed
            | CallError::NotOnOneNode
            | CallError::NotReplicated { .. } => false,
        }
    }

    /// Whether a whole call failed before Redis ran any of it: the node could not be
    /// reached (refused, or the client no longer knows it), or it turned the command away
    /// unrun — a replica refuses a writing function (`READONLY`), a node that has lost its
    /// quorum, is loading or waits for its master refuses every command, and a redirection
    /// sends it elsewhere. A timeout or a connection lost mid-call is none of these: the
    /// call may have run.
    pub(super) fn never_ran(&self) -> bool {
        let CallError::Redis(e) = self else {
            return false;
        };
        e.is_connection_refusal()
            || matches!(
                e.kind(),
                ErrorKind::ClusterConnectionNotFound
                    | ErrorKind::Server(
                        ServerErrorKind::ReadOnly
                            | ServerErrorKind::ClusterDown
                            | ServerErrorKind::MasterDown
                            | ServerErrorKind::BusyLoading
                            | ServerErrorKind::Moved
                            | ServerErrorKind::Ask
                            | ServerErrorKind::TryAgain
                    )
            )
    }

    /// Whether the call's connection broke (a reset, a close, a refusal): the connection
    /// manager then connects anew, maybe to another process at the same address.
    pub(super) fn broke_connection(&self) -> bool {
        match self {
            CallError::Redis(e) => e.is_io_error() || e.is_unrecoverable_error(),
            CallError::Timeout
            | CallError::Closed
            | CallError::Check(_)
            | CallError::NotOnOneNode
            | CallError::NotReplicated { .. } => false,
        }
    }

    /// Whether the server answered, if only with an error reply.
    pub(super) fn server_answered(&self) -> bool {
        match self {
            CallError::Redis(e) => matches!(e.kind(), ErrorKind::Server(_)),
            CallError::Check(_) | CallError::NotReplicated { .. } => true,
            CallError::Timeout | CallError::Closed | CallError::NotOnOneNode => false,
        }
    }

    /// The error as the store reports it: from `server` (its URL without credentials),
    /// whose calls may take `timeout`, about `key`.
    pub(super) fn into_store_error(
        self,
        server: &str,
        timeout: Duration,
        key: Option<&str>,
    ) -> StoreError {
        let server = server.to_owned();
        let key = key.map(str::to_owned);
        if self.is_wrong_type() {
            return StoreError::WrongType {
                server,
                key: key.unwrap_or_default(),
            };
        }
        if self.is_cluster_down() {
            let message = match self {
                CallError::Redis(e) => e.to_string(),
                CallError::Check(message) => message,
                _ => String::new(),
            };
            return StoreError::ClusterDown { server, message };
        }
        match self {
            // As `is_timeout` says: either bound; either way the call was sent and may
            // have run.
            CallError::Timeout => StoreError::Timeout {
                server,
                key,
                after: timeout,
            },
            CallError::Redis(e) if e.is_timeout() => StoreError::Timeout {
                server,
                key,
                after: timeout,
            },
            CallError::Redis(e) => match e.kind() {
                ErrorKind::Server(ServerErrorKind::CrossSlot) => StoreError::InvalidCheck(format!(
                    "the limits of this check live in different Redis Cluster hash slots: {e}"
                )),
                // The cluster client follows redirections itself: one that reaches us is
                // one it could not follow, to a node that does not answer (a master that
                // failed, which the other nodes still name until it is marked failed).
                // Nothing ran; the node is unreachable, and its breaker should know.
                ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
                    StoreError::Unavailable {
                        server,
                        message: format!(
                            "the cluster redirects to a node that does not answer: {e}"
                        ),
                    }
                }
                ErrorKind::Server(_) | ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
                    StoreError::Script {
                        server,
                        key,
                        message: e.to_string(),
                    }
                }
                _ => StoreError::Unavailable {
                    server,
                    message: e.to_string(),
                },
            },
            CallError::Check(message) => StoreError::Script {
                server,
                key,
                message,
            },
            CallError::NotReplicated {
                acknowledged,
                within,
            } => StoreError::NotReplicated {
                server,
                key,
                acknowledged,
                within,
            },
            CallError::Closed => StoreError::Unavailable {
                server,
                message: "the connection's batching task has stopped".to_owned(),
            },
            // The store runs such a check slot by slot instead; should one ever surface, it
            // is the store's failure, not the caller's, so the failure policies apply.
            CallError::NotOnOneNode => StoreError::Unavailable {
                server,
                message: "a check of several Redis Cluster hash slots could not be sent as one \
                          call, and was not run slot by slot instead"
                    .to_owned(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that says the cluster is down — refusing the command, or refusing a key to a
    /// script already running — is reported as the cluster being down, not as a failed
    /// script.
    #[test]
    fn a_cluster_that_is_down_is_reported_as_such() {
        let server = "redis-cluster://127.0.0.1:7000";
        let timeout = Duration::from_millis(100);
        let refused = CallError::Redis(RedisError::from((
            ErrorKind::Server(ServerErrorKind::ClusterDown),
            "The cluster is down",
        )));
        let in_script = CallError::Check(
            "ERR Script attempted to execute a command while the cluster is down".to_owned(),
        );
        for call in [refused, in_script] {
            let error = call.into_store_error(server, timeout, Some("rl:{00ab}:s"));
            assert!(
                matches!(&error, StoreError::ClusterDown { server: s, .. } if s == server),
                "{error:?}"
            );
            assert_eq!(error.kind(), "cluster_down");
            assert!(error.to_string().contains("cluster"), "{error}");
        }
        let script = CallError::Check("ERR user_script:1: bad argument".to_owned())
            .into_store_error(server, timeout, None);
        assert_eq!(script.kind(), "script");
    }

    /// A redirection the cluster client could not follow (it named a master that failed)
    /// is that node being unreachable: its breaker counts it, where a script error would
    /// leave every check of its slots waiting out its retries.
    #[test]
    fn a_redirection_that_reaches_the_store_is_reported_as_unavailable() {
        let server = "redis-cluster://127.0.0.1:7000";
        for kind in [ServerErrorKind::Moved, ServerErrorKind::Ask] {
            let error = CallError::Redis(RedisError::from((
                ErrorKind::Server(kind),
                "An error was signalled by the server",
                "3753 127.0.0.1:7002".to_owned(),
            )))
            .into_store_error(server, Duration::from_millis(100), None);
            assert!(
                matches!(&error, StoreError::Unavailable { server: s, message }
                    if s == server && message.contains("does not answer")),
                "{error:?}"
            );
        }
    }

    /// A call the client's own response timeout ended is reported as a timeout, as one our
    /// bound ended: the two bounds are one setting, and either may fire first.
    #[test]
    fn the_clients_own_timeout_is_reported_as_a_timeout() {
        let server = "redis-cluster://127.0.0.1:7000";
        let timeout = Duration::from_millis(500);
        for call in [
            CallError::Timeout,
            CallError::Redis(RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            ))),
        ] {
            let error = call.into_store_error(server, timeout, Some("rl:{00ab}:s"));
            assert!(
                matches!(&error, StoreError::Timeout { server: s, after, .. }
                    if s == server && *after == timeout),
                "{error:?}"
            );
        }
    }

    /// A check of several nodes' slots that escaped the slot-by-slot path is the store's
    /// failure: the limiter's failure policies and breaker see it, as for any outage.
    #[test]
    fn a_check_not_on_one_node_is_reported_as_unavailable() {
        let error = CallError::NotOnOneNode.into_store_error(
            "redis-cluster://127.0.0.1:7000",
            Duration::from_millis(100),
            Some("rl:{00ab}:user"),
        );
        assert!(
            matches!(&error, StoreError::Unavailable { server, .. } if server == "redis-cluster://127.0.0.1:7000"),
            "{error:?}"
        );
    }
}
