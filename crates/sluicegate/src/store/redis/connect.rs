//! Reaching Redis: a single server through a connection manager — named directly, or found
//! through Sentinel — or a Redis Cluster through the cluster client, the checks batched on
//! either; TLS with rustls.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::sentinel::SentinelClient;
use redis::{ClientTlsConfig, IntoConnectionInfo, TlsCertificates};

use super::batcher::{Batcher, Target, call_hold};
use super::error::{CallError, bounded};
use super::script::CallCounters;
use super::scripting::{CheckScript, Scripting};
use super::sentinel;
use super::slots::{self, SlotMap, Slots};
use crate::store::any::TlsClientIdentity;
use crate::store::error::StoreError;
use crate::store::url::{RedisUrl, Topology};

/// What the store sends its commands and script calls on.
#[derive(Clone)]
pub(super) enum Connection {
    Single {
        manager: Replaceable,
        batcher: Batcher,
    },
    Cluster {
        client: ClusterConnection,
        batcher: Batcher,
        /// Which master serves each slot, as last read.
        slots: Arc<Slots>,
    },
}

impl Connection {
    /// Connects to `url` within `timeout`, at least one second for a first connection.
    /// `tls` says what TLS trusts and presents. Checks go through a batcher that runs
    /// `script`, counts its calls in `calls`, and follows each call that may record units
    /// with a `WAIT` of `replica_wait`, if any (see [`Batcher::start`]).
    pub(super) async fn open(
        url: &RedisUrl,
        timeout: Duration,
        tls: TlsFiles<'_>,
        script: &Arc<CheckScript>,
        calls: &Arc<CallCounters>,
        replica_wait: Option<Duration>,
    ) -> Result<Connection, StoreError> {
        let unavailable = |message: String| StoreError::Unavailable {
            server: url.shown.clone(),
            message,
        };
        let connect_timeout = timeout.max(Duration::from_secs(1));
        let certificates = || TlsCertificates {
            client_tls: tls.client.map(|identity| ClientTlsConfig {
                client_cert: identity.cert.clone(),
                client_key: identity.key.clone(),
            }),
            root_cert: tls.ca.map(<[u8]>::to_vec),
        };
        if url.tls {
            install_crypto_provider();
        }
        let with_ca = url.tls && (tls.ca.is_some() || tls.client.is_some());
        let mut sentinels = None;
        let client = match &url.topology {
            Topology::Server(server) => server_client(server, with_ca.then(certificates))
                .map_err(|e| unavailable(e.to_string()))?,
            Topology::Sentinel(names) => {
                let mut client = sentinel::sentinels(
                    names,
                    url.tls,
                    with_ca.then(certificates).as_ref(),
                    &tcp_settings(),
                )
                .map_err(|e| unavailable(e.to_string()))?;
                let master = sentinel::master(&mut client, &names.master_name, connect_timeout)
                    .await
                    .map_err(unavailable)?;
                sentinels = Some((client, names.master_name.clone()));
                master
            }
            Topology::Cluster(nodes) => {
                let (retries, max_wait_ms) = cluster_retries(timeout);
                let mut builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .tcp_settings(tcp_settings())
                    .connection_timeout(connect_timeout)
                    .response_timeout(timeout)
                    .retries(retries)
                    .min_retry_wait(1)
                    .max_retry_wait(max_wait_ms)
                    .retry_wait_formula(1, 2);
                if with_ca {
                    builder = builder.certs(certificates());
                }
                let client = builder.build().map_err(|e| unavailable(e.to_string()))?;
                let connection =
                    tokio::time::timeout(connect_timeout, client.get_async_connection())
                        .await
                        .map_err(|_| unavailable(format!("no answer within {connect_timeout:?}")))?
                        .map_err(|e| unavailable(e.to_string()))?;
                // Read now, so that checks are told apart by node from the first; if it
                // cannot be, it is read again in the background.
                let first = slots::read(
                    &mut connection.clone(),
                    connect_timeout,
                    &SlotMap::unknown(),
                )
                .await;
                let slots = Arc::new(Slots::start(first, connection.clone(), timeout));
                return Ok(Connection::Cluster {
                    slots: Arc::clone(&slots),
                    batcher: Batcher::start(
                        Target::cluster(connection.clone(), slots),
                        Arc::clone(script),
                        Arc::clone(calls),
                        call_hold(timeout),
                        replica_wait,
                    ),
                    client: connection,
                });
            }
        };
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(call_hold(timeout)))
            .set_number_of_retries(1);
        let manager = Replaceable::connect(client, manager_config, connect_timeout)
            .await
            .map_err(unavailable)?;
        if let Some((sentinels, master_name)) = sentinels {
            tokio::spawn(ReplaceableInner::follow(
                sentinels,
                master_name,
                Arc::downgrade(&manager.0),
                connect_timeout,
            ));
        }
        Ok(Connection::Single {
            batcher: Batcher::start(
                Target::Server(manager.clone()),
                Arc::clone(script),
                Arc::clone(calls),
                call_hold(timeout),
                replica_wait,
            ),
            manager,
        })
    }

    /// Chooses how `script` is called on this connection (see [`CheckScript::prepare`]),
    /// within `timeout`.
    pub(super) async fn prepare(
        &self,
        script: &CheckScript,
        scripting: Scripting,
        timeout: Duration,
    ) -> Result<(), CallError> {
        match self {
            Connection::Single { manager, .. } => {
                bounded(timeout, script.prepare(&mut manager.current(), scripting)).await
            }
            Connection::Cluster { client, .. } => {
                bounded(timeout, script.prepare(&mut client.clone(), scripting)).await
            }
        }
    }

    /// Sends one command, on whichever kind of connection, within `timeout`.
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        command: &redis::Cmd,
        timeout: Duration,
    ) -> Result<T, CallError> {
        match self {
            Connection::Single { manager, .. } => {
                let reply = bounded(timeout, command.query_async(&mut manager.current())).await;
                manager.note(&reply);
                reply
            }
            Connection::Cluster { client, .. } => {
                bounded(timeout, command.query_async(&mut client.clone())).await
            }
        }
    }

    /// Has `verifier` read a single server before the first check on each new connection
    /// to it (see [`Replaceable::for_check`]); held weakly, so that it ends with its owner.
    /// A cluster's node connections are the cluster client's own, made and replaced out of
    /// sight: there, the verifier's periodic reads alone see a node's new process.
    pub(super) fn verify_new_connections(&self, verifier: Weak<dyn Verify>) {
        if let Connection::Single { manager, .. } = self {
            *manager.0.verifier.lock() = Some(verifier);
        }
    }
}

/// Reads a server for what it lost (see `lost_state`) on a new connection, before any
/// check is sent on it.
pub(super) trait Verify: Send + Sync {
    /// Reads the server; an error when it did not answer.
    fn verify(&self) -> Pin<Box<dyn Future<Output = Result<(), CallError>> + Send + '_>>;
}

/// How often the cluster client tries a command again, and its longest wait between two
/// tries (ms), for checks that may take `timeout`. Its own defaults wait 1.28 s or more
/// before trying again a command a node answered `CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`
/// or `LOADING`: far past a check's timeout, so a node that answered at once that the
/// cluster is down would look silent, and count against its breaker as a node that does
/// not answer. Here the client keeps its number of tries (16: redirections and new
/// connections to a node that failed over are tried again at once, and use them up), and
/// every wait together stays within half the timeout, so that such an answer comes back
/// as what it is while the check still waits for it.
fn cluster_retries(timeout: Duration) -> (u32, u64) {
    const RETRIES: u32 = 16;
    let max_wait_ms = u64::try_from(timeout.as_millis() / u128::from(2 * RETRIES))
        .unwrap_or(u64::MAX)
        .max(2);
    (RETRIES, max_wait_ms)
}

/// Every Redis connection sends at once: a check is a few hundred bytes, and Nagle's
/// algorithm would hold the next one back until the previous one's ACK.
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// The client of one server named by `url`, checking its certificate against
/// `certificates` when given.
fn server_client(
    url: &str,
    certificates: Option<TlsCertificates>,
) -> redis::RedisResult<redis::Client> {
    let info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
    match certificates {
        Some(certificates) => redis::Client::build_with_tls(info, certificates),
        None => redis::Client::open(info),
    }
}

/// What TLS trusts and presents: the PEM authority a server's certificate is checked
/// against (the system's trust store without it), and the certificate presented to a
/// server that asks for one.
#[derive(Clone, Copy)]
pub(super) struct TlsFiles<'t> {
    pub(super) ca: Option<&'t [u8]>,
    pub(super) client: Option<&'t TlsClientIdentity>,
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
    async fn connect(
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

/// rustls needs a process-wide cryptography provider; ring is the one this build carries.
/// Installing fails only if one is installed already, which is as good.
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
    });
}
