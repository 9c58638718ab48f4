//! The Redis store: one Lua script decides each check (`lua/`), Redis `TIME` as the
//! clock, on a single server or a Redis Cluster. On a single server the checks in flight
//! together share script calls (see `Batcher`); each is still decided alone and atomically.
//!
//! Keys: `{prefix}{TAG}:{kind}:{rule identity length}:{rule identity}:{key}`. `TAG` is a
//! hash of the user's key alone, so every rule's state for one identity lives in one hash
//! slot (a check of several rules on one key is one atomic script, on a cluster too), and
//! no character of a key — braces included — can steer it into another slot; the rest is
//! length-prefixed, so two different (rule, key) pairs never share a Redis key. `kind` is
//! `s` for the state, `i` for request ids, `r` for leaky-bucket release times.

mod keys;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, TlsCertificates};
use tokio::sync::{Semaphore, mpsc, oneshot};

pub use keys::{hash_slot, identity_slot, redis_key};

use super::{Check, Limit, Outcome, Store, StoreError};
use crate::decision::{Decision, RetryAfter};
use crate::rule::{Algorithm, LogLayout, Rule};

/// The check script, joined from its pieces in this order (each uses only the ones before
/// it); see the header of `prelude.lua` for the arguments.
const CHECK_SCRIPT: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/sliding_counter.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/main.lua"),
);

/// The codes of the script's arguments and reply: they must match the constants of the
/// same names in `lua/prelude.lua` (which has no `DRY`: any mode other than `CHECK` and
/// `UNDO` is a dry run there).
mod code {
    pub(super) const SLIDING_LOG: u64 = 1;
    pub(super) const SLIDING_COUNTER: u64 = 2;
    pub(super) const FIXED_WINDOW: u64 = 3;
    pub(super) const TOKEN_BUCKET: u64 = 4;
    pub(super) const LEAKY_BUCKET: u64 = 5;

    /// A sliding log's layout.
    pub(super) const ZSET: u64 = 0;
    pub(super) const COMPACT: u64 = 1;

    /// Modes.
    pub(super) const CHECK: &str = "check";
    pub(super) const DRY: &str = "dry";
    pub(super) const UNDO: &str = "undo";

    /// Bits of a rule's status.
    pub(super) const ALLOWS: i64 = 1;
    pub(super) const RECORDED: i64 = 2;

    /// What an undo answers.
    pub(super) const GIVEN_BACK: i64 = 1;
}

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
    Single {
        manager: ConnectionManager,
        batcher: Batcher,
    },
    Cluster(ClusterConnection),
}

/// The Redis and Redis Cluster store.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    script: Arc<Script>,
    calls: Arc<CallCounters>,
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
        let script = Arc::new(Script::new(CHECK_SCRIPT));
        let calls = Arc::new(CallCounters::default());
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
                .set_response_timeout(Some(call_hold(config.timeout)))
                .set_number_of_retries(1);
            let manager = tokio::time::timeout(
                connect_timeout,
                client.get_connection_manager_with_config(manager_config),
            )
            .await
            .map_err(|_| unavailable(format!("no answer within {connect_timeout:?}")))?
            .map_err(|e| unavailable(e.to_string()))?;
            Connection::Single {
                batcher: Batcher::start(
                    manager.clone(),
                    Arc::clone(&script),
                    Arc::clone(&calls),
                    call_hold(config.timeout),
                ),
                manager,
            }
        };
        let store = RedisStore {
            connection,
            script,
            calls,
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
            Connection::Single { manager, .. } => {
                self.bounded(command.query_async(&mut manager.clone()))
                    .await
            }
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

    /// How many script calls this store (and its clones) made, and how many checks they
    /// carried: on a single server, checks in flight together share a call.
    pub fn script_calls(&self) -> ScriptCalls {
        ScriptCalls {
            calls: self.calls.calls.load(Ordering::Relaxed),
            checks: self.calls.checks.load(Ordering::Relaxed),
        }
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
        bounded(self.timeout, call).await
    }

    fn error(&self, error: CallError, key: Option<&str>) -> StoreError {
        let server = self.server.clone();
        let key = key.map(str::to_owned);
        if error.is_wrong_type() {
            return StoreError::WrongType {
                server,
                key: key.unwrap_or_default(),
            };
        }
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
            CallError::Closed => StoreError::Unavailable {
                server,
                message: "the connection's batching task has stopped".to_owned(),
            },
        }
    }

    /// Runs the script for `check`, in `mode`, and returns each limit's answer (none for
    /// an undo).
    async fn run(&self, check: &Check<'_>, mode: Mode<'_>) -> Result<Vec<Row>, StoreError> {
        match self.call_script(self.encode(check, mode)).await {
            Ok(rows) => Ok(rows
                .into_iter()
                .zip(check.limits)
                .map(|(row, limit)| Row::new(row, limit.rule.capacity()))
                .collect()),
            Err(e) if e.is_wrong_type() => {
                let culprit = self.wrong_type_key(check).await;
                Err(self.error(e, culprit.as_deref()))
            }
            Err(e) => {
                let first = check.limits[0];
                Err(self.error(e, Some(&self.state_key(first.rule, first.key))))
            }
        }
    }

    /// The script's keys and arguments for one check (see the script's header).
    fn encode(&self, check: &Check<'_>, mode: Mode<'_>) -> ScriptCheck {
        let with_request_id = check.request_id.is_some();
        let mut keys = Vec::with_capacity(if with_request_id { 3 } else { 1 } * check.limits.len());
        let mut rules = Vec::with_capacity(check.limits.len());
        for (i, limit) in check.limits.iter().enumerate() {
            let rule = limit.rule;
            keys.push(redis_key(&self.prefix, 's', rule, limit.key));
            if with_request_id {
                keys.push(redis_key(&self.prefix, 'i', rule, limit.key));
                keys.push(redis_key(&self.prefix, 'r', rule, limit.key));
            }
            let recorded_at = match mode {
                Mode::Undo(rows) => rows[i].recorded_at,
                Mode::Check | Mode::Dry => None,
            };
            rules.push((rule_spec(rule), recorded_at));
        }
        ScriptCheck {
            keys,
            at: check.at,
            cost: check.cost,
            request_id: check.request_id.map(str::to_owned),
            mode: mode.name(),
            rules,
        }
    }

    /// Sends one check to the script and returns its rows: on a single server through the
    /// batcher, on a cluster alone (a call's keys must share a slot there).
    async fn call_script(&self, call: ScriptCheck) -> Result<Vec<ScriptRow>, CallError> {
        match &self.connection {
            Connection::Single { batcher, .. } => {
                let (answer, answered) = oneshot::channel();
                batcher
                    .queue
                    .send(Queued { call, answer })
                    .map_err(|_| CallError::Closed)?;
                match tokio::time::timeout(self.timeout, answered).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(_)) => Err(CallError::Closed),
                    Err(_) => Err(CallError::Timeout),
                }
            }
            Connection::Cluster(c) => {
                let calls = std::slice::from_ref(&call);
                self.calls.count(1);
                let invocation = invocation(&self.script, calls);
                let reply = self
                    .bounded(invocation.invoke_async(&mut c.clone()))
                    .await?;
                let mut answers = split_answers(reply, calls)?;
                answers.pop().expect("one answer for one check")
            }
        }
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

#[derive(Clone)]
enum CallError {
    Redis(RedisError),
    Timeout,
    /// Redis refused a command of this check (the script caught it, so the other checks
    /// sent in the same call went on).
    Check(String),
    /// The batching task is gone (its runtime shut down).
    Closed,
}

/// `call`, or a timeout error once `timeout` has passed.
async fn bounded<T>(
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
    fn is_wrong_type(&self) -> bool {
        match self {
            CallError::Redis(e) => e.to_string().contains(WRONG_TYPE),
            CallError::Check(message) => message.contains(WRONG_TYPE),
            CallError::Timeout | CallError::Closed => false,
        }
    }
}

/// One check's keys and arguments for the script.
struct ScriptCheck {
    keys: Vec<String>,
    /// Client time, if the check carries one.
    at: Option<u64>,
    cost: u64,
    request_id: Option<String>,
    mode: &'static str,
    /// Per limit, its rule's description and, for an undo, when it recorded units.
    rules: Vec<(RuleSpec, Option<u64>)>,
}

/// A rule as the script reads it: algorithm, limit, window, buckets, capacity, emission
/// interval, layout.
type RuleSpec = [u64; 7];

fn rule_spec(rule: &Rule) -> RuleSpec {
    [
        algorithm_code(rule.algorithm()),
        rule.limit(),
        rule.window(),
        rule.buckets(),
        rule.capacity(),
        rule.emission_interval(),
        match rule.layout() {
            LogLayout::Zset => code::ZSET,
            LogLayout::Compact => code::COMPACT,
        },
    ]
}

/// One limit's answer from the script: status (1 allows, +2 recorded), remaining,
/// retry_after (-1 never), reset_after, delay, time decided at.
type ScriptRow = [i64; ROW_FIELDS];
const ROW_FIELDS: usize = 6;

/// One script call carrying `checks`, in order. Each distinct rule is described once, and
/// so is each distinct shape of check (what it asks, but for its keys): checks of the same
/// rules and cost, without request ids or times of their own, cost one argument each, and
/// none when every check of the call has one shape.
fn invocation<'s>(script: &'s Script, checks: &[ScriptCheck]) -> redis::ScriptInvocation<'s> {
    let mut specs: Vec<RuleSpec> = Vec::new();
    let mut shapes: Vec<&ScriptCheck> = Vec::new();
    let mut shape_numbers = Vec::with_capacity(checks.len());
    for check in checks {
        for (spec, _) in &check.rules {
            if !specs.contains(spec) {
                specs.push(*spec);
            }
        }
        let number = match shapes.iter().position(|shape| shape.same_shape(check)) {
            Some(i) => i + 1,
            None => {
                shapes.push(check);
                shapes.len()
            }
        };
        shape_numbers.push(number);
    }
    let mut invocation = script.prepare_invoke();
    invocation.arg(specs.len());
    for spec in &specs {
        invocation.arg(&spec[..]);
    }
    let shapes_count = shapes.len();
    invocation.arg(shapes_count);
    for shape in shapes {
        match shape.at {
            Some(at) => invocation.arg(at),
            None => invocation.arg(""),
        };
        invocation
            .arg(shape.cost)
            .arg(shape.request_id.as_deref().unwrap_or(""))
            .arg(shape.mode)
            .arg(shape.rules.len());
        for (spec, recorded_at) in &shape.rules {
            let number = 1 + specs
                .iter()
                .position(|known| known == spec)
                .expect("every rule of every check was collected");
            invocation.arg(number);
            if shape.mode == code::UNDO {
                match recorded_at {
                    Some(at) => invocation.arg(at),
                    None => invocation.arg(""),
                };
            }
        }
    }
    invocation.arg(checks.len());
    if shapes_count > 1 {
        invocation.arg(shape_numbers);
    }
    for check in checks {
        for key in &check.keys {
            invocation.key(key);
        }
    }
    invocation
}

impl ScriptCheck {
    /// Whether the script would read `other` exactly as this check, but for the keys.
    fn same_shape(&self, other: &ScriptCheck) -> bool {
        self.at == other.at
            && self.cost == other.cost
            && self.request_id == other.request_id
            && self.mode == other.mode
            && self.rules == other.rules
    }
}

/// The script's reply to a call carrying `checks`, split per check: its rows (none for an
/// undo), or the error that stopped it.
fn split_answers(
    reply: redis::Value,
    checks: &[ScriptCheck],
) -> Result<Vec<Result<Vec<ScriptRow>, CallError>>, CallError> {
    let malformed = |what: &str| CallError::Check(format!("malformed script reply: {what}"));
    let redis::Value::Array(values) = reply else {
        return Err(malformed("not an array"));
    };
    let mut values = values.into_iter();
    let mut answers = Vec::with_capacity(checks.len());
    for check in checks {
        let answer = match values.next() {
            Some(redis::Value::BulkString(text)) => Err(CallError::Check(
                String::from_utf8_lossy(&text).into_owned(),
            )),
            Some(redis::Value::Int(code::GIVEN_BACK)) if check.mode == code::UNDO => Ok(Vec::new()),
            Some(redis::Value::Int(first)) if check.mode != code::UNDO => {
                let mut fields = vec![first];
                while fields.len() < ROW_FIELDS * check.rules.len() {
                    match values.next() {
                        Some(redis::Value::Int(field)) => fields.push(field),
                        _ => return Err(malformed("short row")),
                    }
                }
                Ok(fields
                    .chunks_exact(ROW_FIELDS)
                    .map(|row| row.try_into().expect("chunks of a row's length"))
                    .collect())
            }
            _ => return Err(malformed("unexpected value")),
        };
        answers.push(answer);
    }
    if values.next().is_some() {
        return Err(malformed("more values than checks"));
    }
    Ok(answers)
}

/// Most checks that are waiting together go to Redis together, in one script call (at most
/// [`MAX_BATCH`]): a call's fixed costs (the command, the script's setup, `TIME`) are paid
/// once for all, which is what lets one Redis decide more checks a second. A check never
/// waits for others to join: while fewer than [`BATCHES_IN_FLIGHT`] calls are in flight it
/// leaves at once, alone if it is alone; checks only gather while the calls in flight are
/// out. Each check in a call is decided as if it were alone, in order.
#[derive(Clone)]
struct Batcher {
    queue: mpsc::UnboundedSender<Queued>,
}

/// Script calls made and checks carried, counted as they are sent.
#[derive(Default)]
struct CallCounters {
    calls: AtomicU64,
    checks: AtomicU64,
}

impl CallCounters {
    fn count(&self, checks: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.checks.fetch_add(checks as u64, Ordering::Relaxed);
    }
}

/// What [`RedisStore::script_calls`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScriptCalls {
    /// Script calls sent.
    pub calls: u64,
    /// Checks they carried.
    pub checks: u64,
}

/// How long a script call keeps its place on the connection while Redis does not answer.
/// Longer than a check's own timeout on purpose: while Redis is stalled, the calls in flight
/// keep their places, so the checks queued behind them time out in the queue and are never
/// sent (their callers were told the store failed; sent later, they could still take units).
/// Bounded, so that a call lost with its connection frees its place.
fn call_hold(check_timeout: Duration) -> Duration {
    (check_timeout * 10).max(Duration::from_secs(1))
}

/// Checks per script call, at most.
const MAX_BATCH: usize = 64;
/// Script calls in flight on the connection at once.
const BATCHES_IN_FLIGHT: usize = 4;

struct Queued {
    call: ScriptCheck,
    answer: oneshot::Sender<Result<Vec<ScriptRow>, CallError>>,
}

impl Batcher {
    /// Starts the task that sends queued checks; it ends when every store clone is gone.
    /// A call that has no answer within `hold` gives its place up (see [`call_hold`]).
    fn start(
        connection: ConnectionManager,
        script: Arc<Script>,
        counters: Arc<CallCounters>,
        hold: Duration,
    ) -> Batcher {
        let (queue, mut waiting) = mpsc::unbounded_channel::<Queued>();
        tokio::spawn(async move {
            let in_flight = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
            loop {
                let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                    return;
                };
                let mut batch = Vec::with_capacity(MAX_BATCH);
                if waiting.recv_many(&mut batch, MAX_BATCH).await == 0 {
                    return;
                }
                // A check whose caller stopped waiting (its timeout passed while calls in
                // flight held Redis up) was answered with an error: sent now, it could still
                // take units nobody will use.
                batch.retain(|queued| !queued.answer.is_closed());
                if batch.is_empty() {
                    continue;
                }
                counters.count(batch.len());
                let (mut connection, script) = (connection.clone(), Arc::clone(&script));
                tokio::spawn(async move {
                    let (calls, answers): (Vec<ScriptCheck>, Vec<_>) =
                        batch.into_iter().map(|q| (q.call, q.answer)).unzip();
                    let invocation = invocation(&script, &calls);
                    let replies = bounded(hold, invocation.invoke_async(&mut connection))
                        .await
                        .and_then(|reply| split_answers(reply, &calls));
                    drop(permit);
                    match replies {
                        Ok(replies) => {
                            for (answer, reply) in answers.into_iter().zip(replies) {
                                let _caller_gone = answer.send(reply);
                            }
                        }
                        Err(e) => {
                            for answer in answers {
                                let _caller_gone = answer.send(Err(e.clone()));
                            }
                        }
                    }
                });
            }
        });
        Batcher { queue }
    }
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
            Mode::Check => code::CHECK,
            Mode::Dry => code::DRY,
            Mode::Undo(_) => code::UNDO,
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

impl Row {
    /// A script row as a decision of a rule whose decisions carry `limit`.
    fn new(row: ScriptRow, limit: u64) -> Self {
        let [status, remaining, retry, reset, delay, at] = row;
        let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
        Row {
            decision: Decision {
                allowed: status & code::ALLOWS != 0,
                limit,
                remaining: unsigned(remaining),
                retry_after: if retry < 0 {
                    RetryAfter::Never
                } else {
                    RetryAfter::Micros(unsigned(retry))
                },
                reset_after: unsigned(reset),
                delay: unsigned(delay),
            },
            recorded_at: (status & code::RECORDED != 0).then(|| unsigned(at)),
        }
    }
}

fn algorithm_code(algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::SlidingLog => code::SLIDING_LOG,
        Algorithm::SlidingCounter => code::SLIDING_COUNTER,
        Algorithm::FixedWindow => code::FIXED_WINDOW,
        Algorithm::TokenBucket => code::TOKEN_BUCKET,
        Algorithm::LeakyBucket => code::LEAKY_BUCKET,
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
        let row = Row::new([0, 0, -1, 10, 0, 77], 5);
        assert_eq!(row.decision.retry_after, RetryAfter::Never);
        assert!(!row.decision.allowed);
        assert_eq!(row.recorded_at, None);
        let row = Row::new([3, 4, 0, 10, 3, 77], 5);
        assert_eq!((row.decision.delay, row.recorded_at), (3, Some(77)));
    }
}
