//! The Redis store: one Lua script decides each check (`lua/`), Redis `TIME` as the
//! clock, on a single server or a Redis Cluster. The checks in flight together share script
//! calls (see `batcher`; on a cluster, those of one node); each is still decided alone and
//! atomically.
//!
//! Keys: `{prefix}{TAG}:{kind}:{rule identity length}:{rule identity}:{key}`. `TAG` is a
//! hash of the user's key alone, so every rule's state for one identity lives in one hash
//! slot (a check of several rules on one key is one atomic script, on a cluster too; so is
//! a check of several keys whose slots share a node, routed to it), and no character of a
//! key — braces included — can steer it into another slot; the rest is length-prefixed, so
//! two different (rule, key) pairs never share a Redis key. `kind` is `s` for the state,
//! `i` for request ids, `r` for leaky-bucket release times. Every name is built in `keys`
//! ([`redis_key`]).

mod batcher;
mod cluster;
mod connect;
mod error;
mod eviction;
pub(crate) mod keys;
mod lost_state;
mod periodic;
mod replaceable;
mod replication;
mod script;
mod scripting;
mod sentinel;
mod slots;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use eviction::{Eviction, NodePolicy};
pub use lost_state::{LossReason, LostState, StateLoss, WatchedNode};
pub use replication::{MinReplicas, NodeReplication, Replication};
pub use script::ScriptCalls;
#[cfg(feature = "internals")]
pub use script::ScriptTime;
pub use scripting::Scripting;

use super::any::TlsClientIdentity;
use super::check::{
    Check, DEFAULT_EVICTION_CHECK_INTERVAL, DEFAULT_EXPIRATION_JITTER_MAX,
    DEFAULT_LOST_STATE_CHECK_INTERVAL, DEFAULT_REDIS_PREFIX, DEFAULT_REDIS_TIMEOUT, NodeId, Nodes,
    Outcome, Store,
};
use super::durability::Durability;
use super::error::StoreError;
use super::url::{RedisUrl, StoreUrl, Target};
use crate::rule::Rule;
use cluster::RunScript;
use connect::Connection;
use error::CallError;
use eviction::EvictionWatch;
use keys::{KeyKind, redis_key};
use lost_state::LostStateWatch;
use script::{CallCounters, Mode, Row, ScriptCheck, ScriptRow};
use scripting::CheckScript;

/// Settings of a [`RedisStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisStoreConfig {
    /// A Redis [`StoreUrl`]: `redis://[user:password@]host:port[/db]`, `rediss://…` (TLS),
    /// `redis+unix:///path/to.sock`, `redis-cluster://[user:password@]host:port,…`
    /// (seed nodes; `rediss-cluster://` for TLS), or
    /// `redis+sentinel://[user:password@]host:port,…/master-name` (`rediss+sentinel://`).
    pub url: String,
    /// Prepended to every key, so several deployments can share one Redis.
    pub prefix: String,
    /// How long one check may take, connection included, before it fails.
    pub timeout: Duration,
    /// For TLS: the PEM certificate(s) of the authority that signed the server's
    /// certificate, when it is not in the system's trust store.
    pub tls_ca: Option<Vec<u8>>,
    /// For TLS: the certificate this client presents, for a server that asks for one.
    pub tls_client: Option<TlsClientIdentity>,
    /// How often the servers' `maxmemory-policy` is read again after connecting
    /// ([`RedisStore::eviction`]); zero reads it at connect only.
    pub eviction_check_interval: Duration,
    /// How often each server is checked for state it lost ([`RedisStore::lost_state`]);
    /// zero never checks (and writes no epoch marker).
    pub lost_state_check_interval: Duration,
    /// How the check script is run: as a Redis Function where the server has them.
    pub scripting: Scripting,
    /// An envoy counter ([`Rule::with_envoy_counter`]) lives for its window plus a jitter
    /// below this many whole seconds (envoy's `EXPIRATION_JITTER_MAX_SECONDS`), so that
    /// the counters of one window do not all expire at once.
    pub expiration_jitter_max: Duration,
    /// Whether a check that recorded units answers only once a replica has them
    /// ([`Durability::Replicated`]: a `WAIT` follows its call).
    pub durability: Durability,
}

impl RedisStoreConfig {
    /// Defaults for `url`: prefix `sluicegate:`, a 250 ms timeout, the eviction policy
    /// read every minute, lost state checked every second, [`Durability::Async`].
    pub fn new(url: &str) -> Self {
        RedisStoreConfig {
            url: url.to_owned(),
            prefix: DEFAULT_REDIS_PREFIX.to_owned(),
            timeout: DEFAULT_REDIS_TIMEOUT,
            tls_ca: None,
            tls_client: None,
            eviction_check_interval: DEFAULT_EVICTION_CHECK_INTERVAL,
            lost_state_check_interval: DEFAULT_LOST_STATE_CHECK_INTERVAL,
            scripting: Scripting::Auto,
            expiration_jitter_max: DEFAULT_EXPIRATION_JITTER_MAX,
            durability: Durability::Async,
        }
    }
}

/// The Redis and Redis Cluster store.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    script: Arc<CheckScript>,
    calls: Arc<CallCounters>,
    prefix: String,
    /// Whole seconds: see [`RedisStoreConfig::expiration_jitter_max`].
    expiration_jitter_max: u64,
    timeout: Duration,
    /// Where it connects, without credentials: named in every error.
    server: String,
    eviction: Arc<EvictionWatch>,
    lost_state: Arc<LostStateWatch>,
    durability: Durability,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("server", &self.server)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects (within the configured timeout, at least one second for a first
    /// connection), checks that the server answers, reads its eviction policy (logging a
    /// warning when it may delete our keys; see [`RedisStore::eviction`]) and its
    /// replication ([`RedisStore::replication`]), and writes the epoch markers lost state
    /// is checked by (see [`RedisStore::lost_state`]). Under [`Durability::Replicated`],
    /// refuses a server (a cluster master) that has no replica online.
    pub async fn connect(config: RedisStoreConfig) -> Result<RedisStore, StoreError> {
        let unavailable =
            |server: String, message: String| StoreError::Unavailable { server, message };
        let url = StoreUrl::parse(&config.url)
            .map_err(|e| unavailable(e.url().to_owned(), e.to_string()))?;
        match url.target() {
            Target::Redis(redis) => RedisStore::open(redis, config).await,
            Target::Memory => Err(unavailable(
                url.to_string(),
                "the in-memory store is not a Redis URL".to_owned(),
            )),
        }
    }

    /// [`RedisStore::connect`], to `config`'s URL already parsed (`url`).
    pub(crate) async fn open(
        url: &RedisUrl,
        config: RedisStoreConfig,
    ) -> Result<RedisStore, StoreError> {
        let RedisStoreConfig {
            prefix,
            timeout,
            tls_ca,
            tls_client,
            eviction_check_interval,
            lost_state_check_interval,
            scripting,
            expiration_jitter_max,
            durability,
            ..
        } = config;
        let script = Arc::new(CheckScript::new());
        let calls = Arc::new(CallCounters::default());
        let tls = connect::TlsFiles {
            ca: tls_ca.as_deref(),
            client: tls_client.as_ref(),
        };
        let replica_wait = (durability == Durability::Replicated).then(|| replica_wait(timeout));
        let connection = Connection::open(url, timeout, tls, &script, &calls, replica_wait).await?;
        let server = url.shown.clone();
        ping(&connection, &server, timeout).await?;
        connection
            .prepare(&script, scripting, timeout.max(Duration::from_secs(1)))
            .await
            .map_err(|e| e.into_store_error(&server, timeout, None))?;
        // Off the decision path: as long as a first connection may take.
        let eviction = EvictionWatch::start(
            connection.clone(),
            server.clone(),
            timeout.max(Duration::from_secs(1)),
            eviction_check_interval,
            durability,
        )
        .await;
        if let Some(warning) = eviction.replication().warning(durability) {
            return Err(StoreError::Unavailable {
                server,
                message: format!("{warning}: a replica must be online at start"),
            });
        }
        let lost_state = LostStateWatch::start(
            connection.clone(),
            server.clone(),
            prefix.clone(),
            timeout.max(Duration::from_secs(1)),
            lost_state_check_interval,
        )
        .await;
        Ok(RedisStore {
            connection,
            script,
            calls,
            prefix,
            expiration_jitter_max: expiration_jitter_max.as_secs(),
            timeout,
            server,
            eviction: Arc::new(eviction),
            lost_state: Arc::new(lost_state),
            durability,
        })
    }

    /// The servers' `maxmemory-policy` as last read (at connect, then every
    /// `eviction_check_interval`): under any policy but `noeviction`, Redis at
    /// `maxmemory` deletes keys, and a limit whose state it deletes starts over.
    pub fn eviction(&self) -> Eviction {
        self.eviction.latest()
    }

    /// The servers' replicas and write guard as last read (with the eviction policy): see
    /// [`Replication`].
    pub fn replication(&self) -> Replication {
        self.eviction.replication()
    }

    /// Whether checks wait for a replica: see [`Durability`].
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// What the store found of state Redis lost since it connected (see
    /// [`Store::lost_state_generation`]): checked at connect, then every
    /// `lost_state_check_interval`, and a single server also on each new connection
    /// before a check is sent on it.
    pub fn lost_state(&self) -> LostState {
        self.lost_state.latest()
    }

    /// Whether the server answers, within the timeout; on a cluster, whether at least one
    /// master does. A cluster that lost a master still decides the keys of the others
    /// (those of the failing master are answered by their policy, at once while its
    /// breaker is open), so it is not unready for that: a probe that took every instance
    /// out of service would fail every key instead.
    pub async fn ping(&self) -> Result<(), StoreError> {
        ping(&self.connection, &self.server, self.timeout).await
    }

    /// Sends one command within the timeout.
    async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, CallError> {
        self.connection.query(command, self.timeout).await
    }

    /// Redis' own measure (`MEMORY USAGE`) of the state `rule` holds for `key`, in bytes;
    /// `None` when there is none.
    pub async fn memory_usage(&self, rule: &Rule, key: &str) -> Result<Option<u64>, StoreError> {
        let state_key = self.state_key(rule, key);
        self.query::<Option<u64>>(redis::cmd("MEMORY").arg("USAGE").arg(&state_key))
            .await
            .map_err(|e| self.error(e, Some(&state_key)))
    }

    /// Deletes every key of `rule` for `key` (state, request ids, release times; an envoy
    /// counter's of the current window).
    pub async fn forget(&self, rule: &Rule, key: &str) -> Result<(), StoreError> {
        let state_key = self.state_key(rule, key);
        let others = KeyKind::ALL[1..]
            .iter()
            .map(|&kind| redis_key(&self.prefix, kind, rule, key));
        for redis_key in std::iter::once(state_key).chain(others) {
            self.query::<u64>(redis::cmd("DEL").arg(&redis_key))
                .await
                .map_err(|e| self.error(e, Some(&redis_key)))?;
        }
        Ok(())
    }

    /// How many script calls this store (and its clones) made, and how many checks they
    /// carried: checks in flight together share a call (on a cluster, those of one node).
    pub fn script_calls(&self) -> ScriptCalls {
        self.calls.read()
    }

    /// Redis' own account (`INFO commandstats`) of the script calls it ran, on the server
    /// or on every master of a cluster: with [`RedisStore::script_calls`] before and after,
    /// what a decision costs Redis.
    #[cfg(feature = "internals")]
    pub async fn script_time(&self) -> Result<ScriptTime, StoreError> {
        let reply: redis::Value = self
            .query(redis::cmd("INFO").arg("commandstats"))
            .await
            .map_err(|e| self.error(e, None))?;
        let mut time = ScriptTime::default();
        add_commandstats(&mut time, &reply);
        Ok(time)
    }

    /// Whether checks are sent as a Redis Function (`FCALL`), rather than by `EVALSHA`:
    /// see [`Scripting`].
    pub fn uses_functions(&self) -> bool {
        self.script.uses_functions()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key holding the state of `rule` for `key` (an envoy counter's: of the
    /// window this instance's wall clock is in).
    pub fn state_key(&self, rule: &Rule, key: &str) -> String {
        keys::state_key(&self.prefix, rule, key, keys::wall_clock_micros())
    }

    /// `check`'s keys and arguments for the script, in `mode`.
    fn script_check(&self, check: &Check<'_>, mode: Mode<'_>) -> ScriptCheck {
        ScriptCheck::new(&self.prefix, self.expiration_jitter_max, check, mode)
    }

    fn error(&self, error: CallError, key: Option<&str>) -> StoreError {
        error.into_store_error(&self.server, self.timeout, key)
    }

    /// Sends one check to the script, through the batcher, and returns its rows.
    async fn call_script(&self, call: ScriptCheck) -> Result<Vec<ScriptRow>, CallError> {
        match &self.connection {
            Connection::Single { batcher, .. } | Connection::Cluster { batcher, .. } => {
                batcher.call(call, self.timeout).await
            }
        }
    }

    /// Finds which of a check's keys holds a value of a type the script cannot read.
    async fn wrong_type_key(&self, check: &Check<'_>) -> Option<String> {
        let at = check.at_micros().unwrap_or_else(keys::wall_clock_micros);
        for limit in check.limits {
            for kind in KeyKind::ALL {
                let key = match kind {
                    KeyKind::State => keys::state_key(&self.prefix, limit.rule, limit.key, at),
                    _ => redis_key(&self.prefix, kind, limit.rule, limit.key),
                };
                let found = self.query::<String>(redis::cmd("TYPE").arg(&key)).await;
                if let Ok(found) = found
                    && found != "none"
                    && found != kind.redis_type(limit.rule)
                {
                    return Some(key);
                }
            }
        }
        None
    }
}

/// How long Redis waits for a replica to acknowledge a check's writes under
/// [`Durability::Replicated`]: half the check's `timeout`, so that the answer "not
/// replicated" reaches the check while it still waits, with the other half for the call.
fn replica_wait(timeout: Duration) -> Duration {
    timeout / 2
}

/// Adds the `INFO` texts in `reply`: one server's, or on a cluster one per master (a map
/// of address to text).
#[cfg(feature = "internals")]
fn add_commandstats(time: &mut ScriptTime, reply: &redis::Value) {
    match reply {
        redis::Value::BulkString(text) => time.add_commandstats(&String::from_utf8_lossy(text)),
        redis::Value::VerbatimString { text, .. } => time.add_commandstats(text),
        redis::Value::Map(pairs) => {
            for (_, value) in pairs {
                add_commandstats(time, value);
            }
        }
        _ => {}
    }
}

/// Whether `server` answers on `connection` within `timeout`: on a cluster, at least one
/// of its masters (the cluster client sends a PING to every master and, unrouted, would
/// want every one of them to answer).
async fn ping(connection: &Connection, server: &str, timeout: Duration) -> Result<(), StoreError> {
    let answer = match connection {
        Connection::Single { .. } => connection
            .query::<String>(&redis::cmd("PING"), timeout)
            .await
            .map(drop),
        Connection::Cluster { client, .. } => {
            use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
            let routing = RoutingInfo::MultiNode((
                MultipleNodeRoutingInfo::AllMasters,
                Some(ResponsePolicy::OneSucceeded),
            ));
            error::bounded(
                timeout,
                client.clone().route_command(redis::cmd("PING"), routing),
            )
            .await
            .map(drop)
        }
    };
    answer.map_err(|e| e.into_store_error(server, timeout, None))
}

impl RedisStore {
    /// `check`'s rows from the script's `reply`, or the error that stopped it, naming the
    /// key at fault.
    async fn rows(
        &self,
        check: &Check<'_>,
        reply: Result<Vec<ScriptRow>, CallError>,
    ) -> Result<Vec<Row>, StoreError> {
        match reply {
            Ok(rows) => Ok(rows
                .into_iter()
                .zip(check.limits)
                .map(|(row, limit)| Row::new(row, limit.rule.capacity()))
                .collect()),
            Err(CallError::Check(message))
                if let Some((index, remembered)) = script::request_id_conflict(&message)
                    && index < check.limits.len() =>
            {
                Err(check.request_id_conflict(index, remembered))
            }
            Err(e) if e.is_wrong_type() => {
                let culprit = self.wrong_type_key(check).await;
                Err(self.error(e, culprit.as_deref()))
            }
            Err(e) => {
                let first = check.limits[0];
                let at = check.at_micros().unwrap_or_else(keys::wall_clock_micros);
                let key = keys::state_key(&self.prefix, first.rule, first.key, at);
                Err(self.error(e, Some(&key)))
            }
        }
    }

    /// A check of several cluster slots as one call, when they are all on one node (by the
    /// slot map) and calls can be routed: as atomic as on a single server. `None` when it
    /// could not be one call (nothing ran): it is then run slot by slot.
    async fn run_on_one_node(&self, check: &Check<'_>) -> Result<Option<Vec<Row>>, StoreError> {
        if !self.script.routes() {
            return Ok(None);
        }
        let reply = self
            .call_script(self.script_check(check, Mode::Check))
            .await;
        match reply {
            Err(CallError::NotOnOneNode) => Ok(None),
            reply => self.rows(check, reply).await.map(Some),
        }
    }
}

impl RunScript for RedisStore {
    async fn run(&self, check: &Check<'_>, mode: Mode<'_>) -> Result<Vec<Row>, StoreError> {
        let reply = self.call_script(self.script_check(check, mode)).await;
        self.rows(check, reply).await
    }
}

impl Store for RedisStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        check.validate()?;
        // An envoy counter's key names its window: the time is fixed once, so that a
        // check run slot by slot, and its give-back, name the same keys.
        let pinned;
        let check =
            if check.at_micros().is_none() && check.limits.iter().any(|l| l.rule.envoy_counter()) {
                pinned = Check {
                    at: Some(Duration::from_micros(keys::wall_clock_micros())),
                    ..*check
                };
                &pinned
            } else {
                check
            };
        if let Connection::Cluster { .. } = self.connection {
            let groups = cluster::slot_groups(&self.prefix, check);
            if groups.len() > 1 {
                let rows = match self.run_on_one_node(check).await? {
                    Some(rows) => rows.into_iter().map(|row| row.decision).collect(),
                    None => cluster::check_across_slots(self, check, &groups).await?,
                };
                return Ok(Outcome::from_limits(rows));
            }
        }
        let rows = self.run(check, Mode::Check).await?;
        Ok(Outcome::from_limits(
            rows.into_iter().map(|row| row.decision).collect(),
        ))
    }

    /// One atomic read on a single server; on a cluster, one per limit, of its slot's
    /// count (bumped for every slot of a master found to have lost state).
    fn lost_state_generation(&self, check: &Check<'_>) -> u64 {
        self.lost_state.generation(&self.prefix, check)
    }

    /// While its state is checked (a nonzero `lost_state_check_interval`).
    fn may_lose_state(&self) -> bool {
        self.lost_state.is_watching()
    }

    /// One server (or Sentinel's master, wherever it is) is one node; on a cluster, the
    /// masters serving the check's slots by the slot map as last read.
    fn nodes(&self, check: &Check<'_>) -> Nodes {
        let Connection::Cluster { slots, .. } = &self.connection else {
            return Nodes::One(NodeId::FIRST);
        };
        let map = slots.current();
        let at = || check.at_micros().unwrap_or_else(keys::wall_clock_micros);
        let node_of = |limit: &crate::store::check::Limit<'_>| {
            let at = if limit.rule.envoy_counter() { at() } else { 0 };
            map.node_id(keys::state_slot(&self.prefix, limit.rule, limit.key, at))
        };
        let mut limits = check.limits.iter();
        let Some(first) = limits.next().map(node_of) else {
            return Nodes::One(NodeId::FIRST);
        };
        let mut several: Vec<NodeId> = Vec::new();
        for node in limits.map(node_of) {
            if node != first && !several.contains(&node) {
                if several.is_empty() {
                    several.push(first);
                }
                several.push(node);
            }
        }
        if several.is_empty() {
            Nodes::One(first)
        } else {
            Nodes::Several(several)
        }
    }

    /// A single server by the store's URL (credentials left out); a master of a cluster
    /// by `host:port` while it serves a slot, and the cluster's URL for [`NodeId::FIRST`]
    /// while the map has slots it does not tell.
    fn node_name(&self, node: NodeId) -> Option<String> {
        match &self.connection {
            Connection::Cluster { slots, .. } if node != NodeId::FIRST => {
                slots.current().node_name(node)
            }
            Connection::Cluster { slots, .. } => {
                slots.current().has_gaps().then(|| self.server.clone())
            }
            Connection::Single { .. } => (node == NodeId::FIRST).then(|| self.server.clone()),
        }
    }

    /// On a cluster, the slot map is read again soon: the node may be failing over.
    fn node_refused(&self, _node: NodeId) {
        if let Connection::Cluster { slots, .. } = &self.connection {
            slots.refresh_soon();
        }
    }
}
