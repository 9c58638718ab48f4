//! The Redis store: one Lua script per check (`check.lua`), Redis `TIME` as the clock,
//! on a single server or a Redis Cluster.
//!
//! Keys: `{prefix}{TAG}:{kind}:{rule identity length}:{rule identity}:{key}`. `TAG` is a
//! hash of the user's key alone, so every rule's state for one identity lives in one hash
//! slot (a check of several rules on one key is one atomic script, on a cluster too), and
//! no character of a key — braces included — can steer it into another slot; the rest is
//! length-prefixed, so two different (rule, key) pairs never share a Redis key. `kind` is
//! `s` for the state, `i` for request ids, `r` for leaky-bucket release times.

mod keys;

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, TlsCertificates};

pub use keys::{hash_slot, identity_slot, redis_key};

use super::{Check, Limit, Outcome, Store, StoreError};
use crate::decision::{Decision, RetryAfter};
use crate::rule::{Algorithm, LogLayout, Rule};

/// The check script; see its header for the arguments.
const CHECK_SCRIPT: &str = include_str!("check.lua");

/// Settings of a [`RedisStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisStoreConfig {
    /// `redis://[user:password@]host:port[/db]`, `rediss://…` (TLS),
    /// `redis+unix:///path/to.sock`, or `redis-cluster://[user:password@]host:port,…`
    /// (seed nodes; `rediss-cluster://` for TLS).
    pub url: String,
    /// Prepended to every key, so several deployments can share one Redis.
    pub prefix: String,
    /// How long one check may take, connection included, before it fails.
    pub timeout: Duration,
    /// For TLS: the PEM certificate(s) of the authority that signed the server's
    /// certificate, when it is not in the system's trust store.
    pub tls_ca: Option<Vec<u8>>,
}

impl RedisStoreConfig {
    /// Defaults for `url`: prefix `sluicegate:`, a 50 ms timeout.
    pub fn new(url: &str) -> Self {
        RedisStoreConfig {
            url: url.to_owned(),
            prefix: "sluicegate:".to_owned(),
            timeout: Duration::from_millis(50),
            tls_ca: None,
        }
    }
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The Redis and Redis Cluster store.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    script: Script,
    prefix: String,
    timeout: Duration,
    /// Where it connects, without credentials: named in every error.
    server: String,
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
    /// connection) and checks that the server answers.
    pub async fn connect(config: RedisStoreConfig) -> Result<RedisStore, StoreError> {
        let server = redact(&config.url);
        let unavailable = |message: String| StoreError::Unavailable {
            server: server.clone(),
            message,
        };
        let connect_timeout = config.timeout.max(Duration::from_secs(1));
        let certificates = || TlsCertificates {
            client_tls: None,
            root_cert: config.tls_ca.clone(),
        };
        let cluster = [
            ("redis-cluster://", "redis://"),
            ("rediss-cluster://", "rediss://"),
        ]
        .into_iter()
        .find_map(|(scheme, node)| Some((config.url.strip_prefix(scheme)?, node)));
        let tls = config.url.starts_with("rediss");
        if tls {
            install_crypto_provider();
        }
        let connection = if let Some((seeds, node_scheme)) = cluster {
            let (credentials, hosts) = match seeds.rsplit_once('@') {
                Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
                None => (String::new(), seeds),
            };
            let nodes: Vec<String> = hosts
                .split(',')
                .map(|host| format!("{node_scheme}{credentials}{}", host.trim()))
                .collect();
            let mut builder = ClusterClientBuilder::new(nodes)
                .connection_timeout(connect_timeout)
                .response_timeout(config.timeout);
            if tls && config.tls_ca.is_some() {
                builder = builder.certs(certificates());
            }
            let client = builder.build().map_err(|e| unavailable(e.to_string()))?;
            let connection = tokio::time::timeout(connect_timeout, client.get_async_connection())
                .await
                .map_err(|_| unavailable(format!("no answer within {connect_timeout:?}")))?
                .map_err(|e| unavailable(e.to_string()))?;
            Connection::Cluster(connection)
        } else {
            let client = if tls && config.tls_ca.is_some() {
                redis::Client::build_with_tls(config.url.as_str(), certificates())
            } else {
                redis::Client::open(config.url.as_str())
            }
            .map_err(|e| unavailable(e.to_string()))?;
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(config.timeout))
                .set_number_of_retries(1);
            let manager = tokio::time::timeout(
                connect_timeout,
                client.get_connection_manager_with_config(manager_config),
            )
            .await
            .map_err(|_| unavailable(format!("no answer within {connect_timeout:?}")))?
            .map_err(|e| unavailable(e.to_string()))?;
            Connection::Single(manager)
        };
        let store = RedisStore {
            connection,
            script: Script::new(CHECK_SCRIPT),
            prefix: config.prefix,
            timeout: config.timeout,
            server,
        };
        store.ping().await?;
        Ok(store)
    }

    /// Whether the server answers, within the timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.query::<String>(&redis::cmd("PING"))
            .await
            .map(drop)
            .map_err(|e| self.error(e, None))
    }

    /// Sends one command, on whichever kind of connection, within the timeout.
    async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, CallError> {
        match &self.connection {
            Connection::Single(c) => self.bounded(command.query_async(&mut c.clone())).await,
            Connection::Cluster(c) => self.bounded(command.query_async(&mut c.clone())).await,
        }
    }

    /// Redis' own measure (`MEMORY USAGE`) of the state `rule` holds for `key`, in bytes;
    /// `None` when there is none.
    pub async fn memory_usage(&self, rule: &Rule, key: &str) -> Result<Option<u64>, StoreError> {
        let state_key = self.state_key(rule, key);
        self.query::<Option<u64>>(redis::cmd("MEMORY").arg("USAGE").arg(&state_key))
            .await
            .map_err(|e| self.error(e, Some(&state_key)))
    }

    /// Deletes every key of `rule` for `key` (state, request ids, release times).
    pub async fn forget(&self, rule: &Rule, key: &str) -> Result<(), StoreError> {
        for kind in ['s', 'i', 'r'] {
            let redis_key = redis_key(&self.prefix, kind, rule, key);
            self.query::<u64>(redis::cmd("DEL").arg(&redis_key))
                .await
                .map_err(|e| self.error(e, Some(&redis_key)))?;
        }
        Ok(())
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key holding the state of `rule` for `key`.
    pub fn state_key(&self, rule: &Rule, key: &str) -> String {
        redis_key(&self.prefix, 's', rule, key)
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(CallError::Redis(e)),
            Err(_) => Err(CallError::Timeout),
        }
    }

    fn error(&self, error: CallError, key: Option<&str>) -> StoreError {
        let server = self.server.clone();
        let key = key.map(str::to_owned);
        match error {
            CallError::Timeout => StoreError::Timeout {
                server,
                key,
                after: self.timeout,
            },
            CallError::Redis(e) => match e.kind() {
                ErrorKind::Server(ServerErrorKind::CrossSlot) => StoreError::InvalidCheck(format!(
                    "the limits of this check live in different Redis Cluster hash slots: {e}"
                )),
                ErrorKind::Server(ServerErrorKind::ClusterDown) => StoreError::Unavailable {
                    server,
                    message: format!("cluster down: {e}"),
                },
                _ if e.to_string().contains("WRONGTYPE") => StoreError::WrongType {
                    server,
                    key: key.unwrap_or_default(),
                },
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
        }
    }

    /// Runs the script once for `check`, in `mode`, and returns each limit's answer.
    async fn run(&self, check: &Check<'_>, mode: Mode<'_>) -> Result<Vec<Row>, StoreError> {
        let mut invocation = self.script.prepare_invoke();
        invocation
            .arg(check.at.map_or(String::new(), |at| at.to_string()))
            .arg(check.cost)
            .arg(check.request_id.unwrap_or(""))
            .arg(mode.name())
            .arg(check.limits.len());
        let mut state_keys = Vec::with_capacity(check.limits.len());
        for (i, limit) in check.limits.iter().enumerate() {
            let rule = limit.rule;
            let state_key = redis_key(&self.prefix, 's', rule, limit.key);
            invocation
                .key(&state_key)
                .key(redis_key(&self.prefix, 'i', rule, limit.key))
                .key(redis_key(&self.prefix, 'r', rule, limit.key));
            state_keys.push(state_key);
            let undo_at = match mode {
                Mode::Undo(rows) => rows[i].recorded_at.map(|at| at.to_string()),
                Mode::Check | Mode::Dry => None,
            };
            invocation
                .arg(algorithm_code(rule.algorithm()))
                .arg(rule.limit())
                .arg(rule.window())
                .arg(rule.buckets())
                .arg(rule.capacity())
                .arg(rule.emission_interval())
                .arg(u8::from(rule.layout() == LogLayout::Compact))
                .arg(undo_at.unwrap_or_default());
        }
        let reply: Result<redis::Value, CallError> = match &self.connection {
            Connection::Single(c) => self.bounded(invocation.invoke_async(&mut c.clone())).await,
            Connection::Cluster(c) => self.bounded(invocation.invoke_async(&mut c.clone())).await,
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(CallError::Redis(e)) if e.to_string().contains("WRONGTYPE") => {
                let culprit = self.wrong_type_key(check).await;
                return Err(self.error(CallError::Redis(e), culprit.as_deref()));
            }
            Err(e) => return Err(self.error(e, state_keys.first().map(String::as_str))),
        };
        if let Mode::Undo(_) = mode {
            return Ok(Vec::new());
        }
        let rows: Vec<[i64; 8]> =
            redis::from_redis_value(reply).map_err(|e| StoreError::Script {
                server: self.server.clone(),
                key: state_keys.first().cloned(),
                message: e.to_string(),
            })?;
        if rows.len() != check.limits.len() {
            return Err(StoreError::Script {
                server: self.server.clone(),
                key: state_keys.first().cloned(),
                message: format!("{} answers for {} limits", rows.len(), check.limits.len()),
            });
        }
        Ok(rows.into_iter().map(Row::from).collect())
    }

    /// A check whose limits live in several Redis Cluster hash slots cannot be one script.
    /// SPEC.md: apply the slots' groups in order, each atomic in itself; when a group
    /// refuses, give back what the earlier groups took, and answer every group as the
    /// refused check it became. Between a group's admission and its give-back, another
    /// client may see those units taken: the only departure from atomicity. If the give-back
    /// itself fails, the units stay taken (the limit errs on the side of refusing).
    async fn check_across_slots(
        &self,
        check: &Check<'_>,
        groups: &[Vec<usize>],
    ) -> Result<Vec<Decision>, StoreError> {
        let mut decisions: Vec<Option<Decision>> = vec![None; check.limits.len()];
        let mut taken: Vec<(Vec<Limit<'_>>, Vec<Row>)> = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            let limits: Vec<Limit<'_>> = group.iter().map(|&i| check.limits[i]).collect();
            let sub = Check {
                limits: &limits,
                ..*check
            };
            let rows = match self.run(&sub, Mode::Check).await {
                Ok(rows) => rows,
                Err(e) => {
                    self.give_back(check, &taken).await;
                    return Err(e);
                }
            };
            let admitted = rows.iter().all(|row| row.decision.allowed);
            for (&i, row) in group.iter().zip(&rows) {
                decisions[i] = Some(row.decision);
            }
            if admitted {
                taken.push((limits, rows));
                continue;
            }
            // Refused: give back, then answer the other groups without recording.
            self.give_back(check, &taken).await;
            for (h, other) in groups.iter().enumerate() {
                if h == g {
                    continue;
                }
                let limits: Vec<Limit<'_>> = other.iter().map(|&i| check.limits[i]).collect();
                let sub = Check {
                    limits: &limits,
                    ..*check
                };
                for (&i, row) in other.iter().zip(self.run(&sub, Mode::Dry).await?) {
                    decisions[i] = Some(row.decision);
                }
            }
            break;
        }
        Ok(decisions
            .into_iter()
            .map(|d| d.expect("every limit was answered"))
            .collect())
    }

    /// Gives back, newest first, what earlier groups of a check recorded.
    async fn give_back(&self, check: &Check<'_>, taken: &[(Vec<Limit<'_>>, Vec<Row>)]) {
        for (limits, rows) in taken.iter().rev() {
            if rows.iter().all(|row| row.recorded_at.is_none()) {
                continue;
            }
            let sub = Check { limits, ..*check };
            if let Err(e) = self.run(&sub, Mode::Undo(rows)).await {
                tracing::warn!(error = %e, "could not give back a refused check's units");
            }
        }
    }

    /// Finds which of a check's keys holds a value of a type the script cannot read.
    async fn wrong_type_key(&self, check: &Check<'_>) -> Option<String> {
        for limit in check.limits {
            for kind in ['s', 'i', 'r'] {
                let key = redis_key(&self.prefix, kind, limit.rule, limit.key);
                let expected: &[&str] = match (kind, limit.rule.algorithm(), limit.rule.layout()) {
                    ('s', Algorithm::SlidingLog, LogLayout::Zset) | ('i', ..) => &["zset"],
                    ('s', Algorithm::SlidingLog, LogLayout::Compact) => &["string"],
                    _ => &["hash"],
                };
                let found = self.query::<String>(redis::cmd("TYPE").arg(&key)).await;
                if let Ok(found) = found
                    && found != "none"
                    && !expected.contains(&found.as_str())
                {
                    return Some(key);
                }
            }
        }
        None
    }
}

enum CallError {
    Redis(RedisError),
    Timeout,
}

/// What the script is asked to do (its ARGV[4]).
#[derive(Clone, Copy)]
enum Mode<'a> {
    /// Decide and record.
    Check,
    /// Answer as a check refused by another rule: record nothing.
    Dry,
    /// Give back what these rows recorded.
    Undo(&'a [Row]),
}

impl Mode<'_> {
    fn name(self) -> &'static str {
        match self {
            Mode::Check => "check",
            Mode::Dry => "dry",
            Mode::Undo(_) => "undo",
        }
    }
}

/// One limit's answer from the script.
#[derive(Clone, Copy, Debug)]
struct Row {
    decision: Decision,
    /// The time the script recorded units at, if it recorded any.
    recorded_at: Option<u64>,
}

impl From<[i64; 8]> for Row {
    fn from(row: [i64; 8]) -> Self {
        let [allows, limit, remaining, retry, reset, delay, at, recorded] = row;
        let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
        Row {
            decision: Decision {
                allowed: allows == 1,
                limit: unsigned(limit),
                remaining: unsigned(remaining),
                retry_after: if retry < 0 {
                    RetryAfter::Never
                } else {
                    RetryAfter::Micros(unsigned(retry))
                },
                reset_after: unsigned(reset),
                delay: unsigned(delay),
            },
            recorded_at: (recorded == 1).then(|| unsigned(at)),
        }
    }
}

fn algorithm_code(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::SlidingLog => 1,
        Algorithm::SlidingCounter => 2,
        Algorithm::FixedWindow => 3,
        Algorithm::TokenBucket => 4,
        Algorithm::LeakyBucket => 5,
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

/// The URL without its password, for error messages and logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl Store for RedisStore {
    async fn check(&self, check: &Check<'_>) -> Result<Outcome, StoreError> {
        check.validate()?;
        if let Connection::Cluster(_) = self.connection {
            let groups = slot_groups(check);
            if groups.len() > 1 {
                return self
                    .check_across_slots(check, &groups)
                    .await
                    .map(Outcome::from_limits);
            }
        }
        let rows = self.run(check, Mode::Check).await?;
        Ok(Outcome::from_limits(
            rows.into_iter().map(|row| row.decision).collect(),
        ))
    }
}

/// The check's limits grouped by hash slot, in the order each slot first appears.
fn slot_groups(check: &Check<'_>) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, limit) in check.limits.iter().enumerate() {
        let slot = identity_slot(limit.key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(redact("redis://app:secret@db:6379/0"), "redis://db:6379/0");
        assert_eq!(redact("redis-cluster://a:1,b:2"), "redis-cluster://a:1,b:2");
        assert_eq!(
            redact("redis+unix:///run/redis.sock"),
            "redis+unix:///run/redis.sock"
        );
    }

    #[test]
    fn rows_become_decisions() {
        let row = Row::from([0, 5, 0, -1, 10, 0, 77, 0]);
        assert_eq!(row.decision.retry_after, RetryAfter::Never);
        assert!(!row.decision.allowed);
        assert_eq!(row.recorded_at, None);
        let row = Row::from([1, 5, 4, 0, 10, 3, 77, 1]);
        assert_eq!((row.decision.delay, row.recorded_at), (3, Some(77)));
    }
}
