//! Reaching Redis: a single server through a connection manager — named directly, or found
//! through Sentinel — or a Redis Cluster through the cluster client, the checks batched on
//! either; TLS with rustls.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::io::tcp::TcpSettings;
use redis::{
    ClientTlsConfig, ConnectionAddr, FromRedisValue, IntoConnectionInfo, RedisError,
    TlsCertificates, Value,
};

use super::batcher::{Batcher, Target, call_hold};
use super::error::{CallError, bounded};
use super::replaceable::{Replaceable, Verify};
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
                let seeds = seed_addresses(nodes);
                let first = slots::read(
                    &mut connection.clone(),
                    connect_timeout,
                    &SlotMap::unknown(),
                    &seeds,
                )
                .await;
                let slots = Arc::new(Slots::start(first, connection.clone(), timeout, seeds));
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
            manager.follow(sentinels, master_name, connect_timeout);
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
            manager.verify_with(verifier);
        }
    }
}

/// `command` on the one server, or on every master of a cluster: each node's reply or
/// error, by node.
pub(super) async fn on_each_node(
    connection: &Connection,
    server: &str,
    command: &redis::Cmd,
    timeout: Duration,
) -> Vec<(String, Result<Value, String>)> {
    let failed = |e: CallError| e.into_store_error(server, timeout, None).to_string();
    match connection {
        Connection::Single { .. } => {
            let reply = connection.query::<Value>(command, timeout).await;
            vec![(server.to_owned(), reply.map_err(failed))]
        }
        Connection::Cluster {
            client: cluster, ..
        } => {
            let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            let reply = bounded(
                timeout,
                cluster.clone().route_command(command.clone(), routing),
            )
            .await;
            match reply {
                Ok(Value::Map(by_node)) => by_node
                    .into_iter()
                    .map(|(node, reply)| {
                        let node = String::from_redis_value(node)
                            .unwrap_or_else(|_| "(unnamed node)".to_owned());
                        let reply = match reply {
                            Value::ServerError(e) => Err(RedisError::from(e).to_string()),
                            reply => Ok(reply),
                        };
                        (node, reply)
                    })
                    .collect(),
                Ok(other) => vec![(server.to_owned(), Ok(other))],
                Err(e) => vec![(server.to_owned(), Err(failed(e)))],
            }
        }
    }
}

/// The host and port of each of a cluster's seed nodes (their URLs, which the cluster
/// client has read already).
fn seed_addresses(nodes: &[String]) -> Arc<[(String, u16)]> {
    nodes
        .iter()
        .filter_map(
            |node| match node.as_str().into_connection_info().ok()?.addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    Some((host.clone(), *port))
                }
                _ => None,
            },
        )
        .collect()
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

/// rustls needs a process-wide cryptography provider; ring is the one this build carries.
/// Installing fails only if one is installed already, which is as good.
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
    });
}
