//! The accept loop of one listener. Connections beyond `--max-connections` (over every
//! listener), or beyond their client's `--max-connections-per-address`, are closed at
//! once and counted, so accepting never stalls; running out of
//! descriptors is logged (once a second at most) and waited out instead of spun on; on
//! stop, the listener closes and the connections drain until the shutdown deadline.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::connection::{Connections, stopped};
use super::slots::Slots;
use crate::metrics::Refused;

/// Descriptors kept for everything but client connections: the store's connections, the
/// configuration files, the runtime's own.
const RESERVED_DESCRIPTORS: u64 = 64;

/// The first and the longest wait after an accept error.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Raises the soft descriptor limit to the hard one and says how many connections it
/// leaves room for (`None`: no limit known).
pub(super) fn descriptor_budget() -> Option<usize> {
    #[cfg(unix)]
    {
        let soft = match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(soft) => soft,
            Err(e) => {
                tracing::warn!(error = %e, "cannot raise the descriptor limit");
                rlimit::getrlimit(rlimit::Resource::NOFILE).ok()?.0
            }
        };
        let room = soft
            .saturating_sub(RESERVED_DESCRIPTORS)
            .max(soft / 2)
            .max(1);
        Some(usize::try_from(room).unwrap_or(usize::MAX))
    }
    #[cfg(not(unix))]
    None
}

/// Accepts on `listener` until `stopping`, serving each connection with `router`; then
/// drains the connections until `shutdown_timeout` has passed and cuts the rest.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    connections: Arc<Connections>,
    slots: Arc<Slots>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut open = JoinSet::new();
    let mut refused_log = LogEvery::second();
    let mut client_refused_log = LogEvery::second();
    let mut error_log = LogEvery::second();
    let mut backoff = FIRST_BACKOFF;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    backoff = FIRST_BACKOFF;
                    let slot = match slots.take(peer.ip()) {
                        Ok(slot) => slot,
                        Err(why) => {
                            connections.service.metrics().connections().refused(why);
                            drop(stream);
                            match why {
                                Refused::Total => if let Some(also) = refused_log.ready() {
                                    tracing::warn!(
                                        max_connections = slots.max_connections(),
                                        refused_since_last_log = also,
                                        "connection refused: --max-connections are open"
                                    );
                                },
                                Refused::ClientShare => if let Some(also) = client_refused_log.ready() {
                                    tracing::warn!(
                                        client = %super::slots::client_of(peer.ip()),
                                        max_connections_per_address = slots.per_client(),
                                        refused_since_last_log = also,
                                        "connection refused: its address holds --max-connections-per-address"
                                    );
                                },
                            }
                            continue;
                        }
                    };
                    // Small answers go out at once rather than after Nagle's delay.
                    let _ = stream.set_nodelay(true);
                    let counted = connections.service.metrics().connections().accepted();
                    let connections = Arc::clone(&connections);
                    let router = router.clone();
                    let stopping = stopping.clone();
                    open.spawn(async move {
                        connections.serve(stream, router, stopping, counted).await;
                        drop(slot);
                    });
                }
                Err(e) if is_per_connection(&e) => {}
                Err(e) => {
                    if let Some(also) = error_log.ready() {
                        tracing::error!(
                            error = %e,
                            errors_since_last_log = also,
                            descriptors_exhausted = is_descriptor_exhaustion(&e),
                            "cannot accept connections; waiting {backoff:?}"
                        );
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            },
            Some(_) = open.join_next() => {}
            () = stopped(&mut stopping) => break,
        }
    }
    drop(listener);
    let deadline = Instant::now() + connections.options.shutdown_timeout;
    let drained = tokio::time::timeout_at(deadline, async {
        while open.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = open.len(),
            "shutdown timeout: cutting the connections still open"
        );
        open.shutdown().await;
    }
}

/// An error of one connection that went away before it was accepted: accept again.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// EMFILE or ENFILE: no descriptor for the connection, of the process or of the system.
fn is_descriptor_exhaustion(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// Lets a repeated log line through once a period, counting the ones held back.
struct LogEvery {
    period: Duration,
    last: Option<Instant>,
    held_back: u64,
}

impl LogEvery {
    fn second() -> Self {
        LogEvery {
            period: Duration::from_secs(1),
            last: None,
            held_back: 0,
        }
    }

    /// `Some(how many were held back since the last)` when this one may be logged.
    fn ready(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|last| now < last + self.period) {
            self.held_back += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held_back))
    }
}
