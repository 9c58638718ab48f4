//! A single server's connection, replaced when Redis goes silent on it or (behind
//! Sentinel) when the master moves, and verified before the first check on each new one.
//! Below both `connect` (which opens it) and `batcher` (which sends checks on it).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelClient;

use super::error::CallError;
use super::sentinel;

/// Reads a server for what it lost (see `lost_state`) on a new connection, before any
/// check is sent on it.
pub(super) trait Verify: Send + Sync {
    /// Reads the server; an error when it did not answer.
    fn verify(&self) -> Pin<Box<dyn Future<Output = Result<(), CallError>> + Send + '_>>;
}

/// A single server's connection manager, replaced by a new connection when Redis stays
/// silent on it for a script call's whole hold. The manager reconnects by itself when its
/// connection breaks (a reset, a close), but not when it merely goes quiet: a peer gone
/// without a FIN or RST, or a middlebox that forgot the flow, would otherwise fail every
/// check for as long as TCP takes to notice (hours). Behind Sentinel, it also moves to the
/// master the sentinels name. Only the batcher's task and the occasional command take the
/// lock, each to clone the manager.
///
/// A new connection may reach another process than the last one did: one restarted
/// without its data, or (behind Sentinel) a promoted replica. Checks decided there before
/// the loss is known would be decided from empty state, and their answers would replace
/// what the limiter last knew of their keys. So whenever a connection is new — replaced
/// here, or reconnected by the manager after a call found it broken — the next check waits
/// until the server has been verified ([`Replaceable::for_check`]); a healthy connection's
/// checks only compare two counters.
#[derive(Clone)]
pub(super) struct Replaceable(Arc<ReplaceableInner>);

struct ReplaceableInner {
    current: Mutex<ConnectionManager>,
    /// What a new connection is made from: the server's client (behind Sentinel, the
    /// master's, as last named).
    client: Mutex<redis::Client>,
    config: ConnectionManagerConfig,
    connect_timeout: Duration,
    /// A new connection is being made.
    replacing: AtomicBool,
    /// How many times the connection was (or may have been) replaced: the server behind
    /// it is verified when this equals `verified_through`.
    changes: AtomicU64,
    /// `changes` as it was when the last verification that succeeded began.
    verified_through: AtomicU64,
    /// What verifies the server; none when lost state is not checked.
    verifier: Mutex<Option<Weak<dyn Verify>>>,
    /// One verification at a time: the checks that wait for it share its outcome.
    verifying: tokio::sync::Mutex<()>,
}

impl Replaceable {
    /// Connects to `client`'s server within `connect_timeout`, through a manager that
    /// `config` sets up.
    pub(super) async fn connect(
        client: redis::Client,
        config: ConnectionManagerConfig,
        connect_timeout: Duration,
    ) -> Result<Replaceable, String> {
        let manager = Replaceable::new_manager(&client, &config, connect_timeout).await?;
        Ok(Replaceable(Arc::new(ReplaceableInner {
            current: Mutex::new(manager),
            client: Mutex::new(client),
            config,
            connect_timeout,
            replacing: AtomicBool::new(false),
            changes: AtomicU64::new(0),
            verified_through: AtomicU64::new(0),
            verifier: Mutex::new(None),
            verifying: tokio::sync::Mutex::new(()),
        })))
    }

    async fn new_manager(
        client: &redis::Client,
        config: &ConnectionManagerConfig,
        connect_timeout: Duration,
    ) -> Result<ConnectionManager, String> {
        tokio::time::timeout(
            connect_timeout,
            client.get_connection_manager_with_config(config.clone()),
        )
        .await
        .map_err(|_| format!("no answer within {connect_timeout:?}"))?
        .map_err(|e| e.to_string())
    }

    /// Follows `master_name`'s master as `sentinels` name it, in the background, until the
    /// connection is dropped (see [`ReplaceableInner::follow`]).
    pub(super) fn follow(
        &self,
        sentinels: SentinelClient,
        master_name: String,
        connect_timeout: Duration,
    ) {
        tokio::spawn(ReplaceableInner::follow(
            sentinels,
            master_name,
            Arc::downgrade(&self.0),
            connect_timeout,
        ));
    }

    /// Has `verifier` read the server before the first check on each new connection (see
    /// [`Replaceable::for_check`]); held weakly, so that it ends with its owner.
    pub(super) fn verify_with(&self, verifier: Weak<dyn Verify>) {
        *self.0.verifier.lock() = Some(verifier);
    }

    /// The manager to send on now.
    pub(super) fn current(&self) -> ConnectionManager {
        self.0.current.lock().clone()
    }

    /// Notes a call's `reply`: one that broke the connection leaves the manager connecting
    /// anew, and the server is verified before the next check.
    pub(super) fn note<T>(&self, reply: &Result<T, CallError>) {
        if let Err(e) = reply
            && e.broke_connection()
        {
            self.0.changes.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The manager to send a check on: at once on a connection verified already; on a new
    /// one, once the server behind it has been verified (waiting at most `bound`), so that
    /// the check is decided by a server whose lost state, if any, is known. An error when
    /// the server did not answer the verification: the check is not sent (it would most
    /// likely fail too, and could be decided from state lost unseen).
    pub(super) async fn for_check(&self, bound: Duration) -> Result<ConnectionManager, CallError> {
        loop {
            {
                // Replacing the manager counts a change under this lock.
                let current = self.0.current.lock();
                if self.0.verified() {
                    return Ok(current.clone());
                }
            }
            self.verify(bound).await?;
        }
    }

    /// Verifies the server, unless another check has just done so. Checks stay held while
    /// it runs; a change meanwhile is verified again.
    async fn verify(&self, bound: Duration) -> Result<(), CallError> {
        let _one_at_a_time = self.0.verifying.lock().await;
        let through = self.0.changes.load(Ordering::Acquire);
        if self.0.verified_through.load(Ordering::Acquire) == through {
            return Ok(());
        }
        let verifier = self.0.verifier.lock().as_ref().and_then(Weak::upgrade);
        if let Some(verifier) = verifier {
            match tokio::time::timeout(bound, verifier.verify()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(CallError::Timeout),
            }
        }
        self.0.verified_through.store(through, Ordering::Release);
        Ok(())
    }

    /// Redis has not answered on the current connection for a whole hold: connect anew,
    /// in the background (once at a time), and send on the new connection once it is up.
    /// If it cannot connect, the current one stays, and the next silence tries again.
    pub(super) fn replace_silent(&self) {
        if self.0.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(&self.0);
        tokio::spawn(async move {
            let client = this.client.lock().clone();
            match Replaceable::new_manager(&client, &this.config, this.connect_timeout).await {
                Ok(manager) => {
                    tracing::warn!(
                        "redis did not answer on its connection for a whole call hold; \
                         moved to a new connection"
                    );
                    this.install(manager);
                }
                Err(e) => tracing::warn!(
                    "redis did not answer on its connection for a whole call hold, and a \
                     new connection failed: {e}"
                ),
            }
            this.replacing.store(false, Ordering::Release);
        });
    }
}

impl ReplaceableInner {
    /// Sends on `manager` from now on, once the server behind it has been verified.
    fn install(&self, manager: ConnectionManager) {
        let mut current = self.current.lock();
        *current = manager;
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether the server behind the connection has been verified since it last changed.
    fn verified(&self) -> bool {
        self.verified_through.load(Ordering::Acquire) == self.changes.load(Ordering::Acquire)
    }

    /// Asks `sentinels` every [`sentinel::LOOKUP_EVERY`] which server is `master_name`'s
    /// master, and moves `connection` there when it is another; ends when the connection
    /// is dropped.
    async fn follow(
        mut sentinels: SentinelClient,
        master_name: String,
        connection: Weak<ReplaceableInner>,
        timeout: Duration,
    ) {
        let mut ticks = tokio::time::interval(sentinel::LOOKUP_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let master = sentinel::current_master(&mut sentinels, &master_name, timeout).await;
            let Some(connection) = connection.upgrade() else {
                return;
            };
            match master {
                Ok(master) => connection.move_to(master).await,
                Err(e) => tracing::warn!("cannot find the Redis master: {e}"),
            }
        }
    }

    /// Moves to `master` if it is another server than the current one's; if it cannot
    /// connect there, stays, to try again at the next lookup.
    async fn move_to(&self, master: redis::Client) {
        let address = master.get_connection_info().addr().clone();
        if *self.client.lock().get_connection_info().addr() == address {
            return;
        }
        match Replaceable::new_manager(&master, &self.config, self.connect_timeout).await {
            Ok(manager) => {
                tracing::warn!(master = %address, "the sentinels name a new Redis master; moved to it");
                *self.client.lock() = master;
                self.install(manager);
            }
            Err(e) => tracing::warn!(
                master = %address,
                "the sentinels name a new Redis master, and connecting to it failed: {e}"
            ),
        }
    }
}
