//! How the check script reaches a server: as a Redis Function (`FCALL`, Redis ≥ 7.0) of a
//! library loaded once, so that its helpers are made once rather than on every call; or,
//! where a server has no functions, as a script by its SHA1 (`EVALSHA`). Both run the same
//! Lua (`lua/`, joined in `script`). A server that lost the library or the script (a
//! restart, a failover to a node without it, `FUNCTION FLUSH`, `SCRIPT FLUSH`) says so
//! without running anything, and the call is loaded and sent again, once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::script::{ScriptCheck, command, library_source, routed_command};

/// How a [`RedisStore`](super::RedisStore) runs its script.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scripting {
    /// As a function (`FCALL`) where the server has functions (Redis ≥ 7.0), else by
    /// `EVALSHA`.
    #[default]
    Auto,
    /// Always by `EVALSHA`, as on a server without functions.
    Eval,
}

/// The check script, as a function library and as a script, and which of the two is in use.
pub(super) struct CheckScript {
    /// The library's source, headed with its name.
    library: String,
    /// The function's name: the library's, which carries the hash of the code, so that two
    /// versions of sluicegate sharing a Redis each call their own.
    function: String,
    /// The function that takes its keys in its arguments (`check_routed`), registered with
    /// `allow-cross-slot-keys`: on a Redis Cluster, one call reaches the keys of several
    /// slots of the node it is routed to.
    routed_function: String,
    /// The script's source for `EVAL`, and its SHA1.
    eval: String,
    sha1: String,
    /// Calls go as `FCALL` (else as `EVALSHA`).
    functions: AtomicBool,
}

/// What the script answers when `FCALL` names a function the server does not have.
const FUNCTION_NOT_FOUND: &str = "Function not found";
/// What a server without functions answers to `FUNCTION` and `FCALL`.
const UNKNOWN_COMMAND: &str = "unknown command";

impl CheckScript {
    pub(super) fn new() -> CheckScript {
        let source = library_source();
        let eval = format!("{source}return check(KEYS, ARGV)\n");
        let sha1 = redis::Script::new(&eval).get_hash().to_owned();
        let function = format!("sluicegate_{}", &sha1[..16]);
        let routed_function = format!("{function}_routed");
        let library = format!(
            "#!lua name={function}\n{source}\
             redis.register_function{{function_name = '{function}', callback = check}}\n\
             redis.register_function{{function_name = '{routed_function}', \
             callback = check_routed, flags = {{'allow-cross-slot-keys'}}}}\n"
        );
        CheckScript {
            library,
            function,
            routed_function,
            eval,
            sha1,
            functions: AtomicBool::new(false),
        }
    }

    /// Whether calls go as `FCALL`.
    pub(super) fn uses_functions(&self) -> bool {
        self.functions.load(Ordering::Relaxed)
    }

    /// Chooses how to call, once connected: with [`Scripting::Auto`], loads the library
    /// (on every master of a cluster), and uses `EVALSHA` if the server refuses it (Redis
    /// 6 has no `FUNCTION`; an ACL may deny it). Fails only when the server did not
    /// answer.
    pub(super) async fn prepare(
        &self,
        connection: &mut impl ConnectionLike,
        scripting: Scripting,
    ) -> RedisResult<()> {
        if scripting == Scripting::Eval {
            return Ok(());
        }
        match self.load_library(connection).await {
            Ok(()) => {
                self.functions.store(true, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::Server(_)) => {
                tracing::info!(
                    "redis did not load the check as a function ({e}); checks are sent \
                     with EVALSHA"
                );
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn load_library(&self, connection: &mut impl ConnectionLike) -> RedisResult<()> {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.library)
            .query_async::<String>(connection)
            .await
            .map(drop)
    }

    /// Sends one call carrying `checks` and returns the script's reply; with `replica_wait`,
    /// a `WAIT` for one replica follows it on the same connection (see [`Replied`]). When
    /// the server has lost the library (or the script), loads it and sends the call again,
    /// once; when it no longer has functions at all (replaced by an older Redis), goes on
    /// with `EVALSHA`.
    pub(super) async fn call(
        &self,
        connection: &mut impl ConnectionLike,
        checks: &[ScriptCheck],
        replica_wait: Option<Duration>,
    ) -> RedisResult<Replied> {
        if self.uses_functions() {
            let call = || command("FCALL", &self.function, checks);
            match send(connection, call(), replica_wait).await {
                Err(e) if has_detail(&e, FUNCTION_NOT_FOUND) => {
                    self.load_library(connection).await?;
                    return send(connection, call(), replica_wait).await;
                }
                Err(e) if has_detail(&e, UNKNOWN_COMMAND) => {
                    tracing::warn!("redis no longer has functions; checks go on with EVALSHA");
                    self.functions.store(false, Ordering::Relaxed);
                }
                reply => return reply,
            }
        }
        let call = || command("EVALSHA", &self.sha1, checks);
        match send(connection, call(), replica_wait).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(&self.eval)
                    .query_async::<String>(connection)
                    .await?;
                send(connection, call(), replica_wait).await
            }
            reply => reply,
        }
    }

    /// Whether calls can be routed (several slots' checks in one call): with functions.
    pub(super) fn routes(&self) -> bool {
        self.uses_functions()
    }

    /// Sends one call carrying `checks`, of several slots, to the cluster node at `host`
    /// and `port`, as `check_routed` with no key declared: Redis then checks each key as
    /// the script reaches it, and a check with a key the node does not hold (its slot
    /// moved, or is migrating and the key has gone) fails before it writes, alone. No key
    /// is declared, so that no redirection (`ASK`, whose `ASKING` would let the importing
    /// node take every key of the slot, present or not) is ever followed for the call.
    /// With `replica_wait`, a `WAIT` follows the call, as in [`CheckScript::call`].
    pub(super) async fn call_routed(
        &self,
        cluster: &mut ClusterConnection,
        checks: &[ScriptCheck],
        (host, port): (&str, u16),
        replica_wait: Option<Duration>,
    ) -> RedisResult<Replied> {
        match self
            .send_routed(cluster, checks, (host, port), replica_wait)
            .await
        {
            Err(e) if has_detail(&e, FUNCTION_NOT_FOUND) => {
                self.load_library(cluster).await?;
                self.send_routed(cluster, checks, (host, port), replica_wait)
                    .await
            }
            reply => reply,
        }
    }

    /// Sends [`CheckScript::call_routed`]'s call once, and its `WAIT` in the same write.
    async fn send_routed(
        &self,
        cluster: &mut ClusterConnection,
        checks: &[ScriptCheck],
        (host, port): (&str, u16),
        replica_wait: Option<Duration>,
    ) -> RedisResult<Replied> {
        let route = SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port,
        };
        let call = routed_command(&self.routed_function, checks);
        if replica_wait.is_none() {
            let reply = cluster
                .route_command(call, RoutingInfo::SingleNode(route))
                .await?;
            return Ok(Replied {
                reply,
                acknowledged: None,
            });
        }
        let mut pipeline = redis::pipe();
        pipeline.add_command(call);
        add_wait(&mut pipeline, replica_wait);
        replied(cluster.route_pipeline(pipeline, 0, 2, route).await?)
    }
}

impl CheckScript {
    /// Sends a call that a cluster node answered with `ASK` (its slot is migrating and
    /// some of the call's keys are on the node importing it) to that node, as `ASKING`
    /// and the call in one pipeline. The cluster client follows `ASK` itself, but sends
    /// its `ASKING` apart from the command: on a connection shared with other calls,
    /// another call can come between and spend it, the node then answers `MOVED` back,
    /// and the call goes round until its retries run out. Written together, the two reach
    /// the node back to back (and the `WAIT` of `replica_wait` right after them). `None`
    /// when `error` is not an `ASK`.
    pub(super) async fn call_asked(
        &self,
        cluster: &mut ClusterConnection,
        error: &RedisError,
        checks: &[ScriptCheck],
        replica_wait: Option<Duration>,
    ) -> Option<RedisResult<Replied>> {
        if error.kind() != ErrorKind::Server(ServerErrorKind::Ask) {
            return None;
        }
        let (address, _slot) = error.redirect_node()?;
        let (host, port) = address.rsplit_once(':')?;
        let port = port.parse().ok()?;
        let call = if self.uses_functions() {
            command("FCALL", &self.function, checks)
        } else {
            command("EVALSHA", &self.sha1, checks)
        };
        let mut pipeline = redis::pipe();
        pipeline.cmd("ASKING").add_command(call);
        add_wait(&mut pipeline, replica_wait);
        let route = SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port,
        };
        let count = 1 + usize::from(replica_wait.is_some());
        Some(
            cluster
                .route_pipeline(pipeline, 1, count, route)
                .await
                .and_then(replied),
        )
    }
}

/// A script call's reply and, when a `WAIT` followed it on the same connection, how many
/// replicas acknowledged every write made on that connection up to the call's: the call's
/// writes included, since the two were sent back to back.
pub(super) struct Replied {
    pub(super) reply: Value,
    pub(super) acknowledged: Option<u64>,
}

/// Sends `call`, and the `WAIT` of `replica_wait` in the same write when there is one.
async fn send(
    connection: &mut impl ConnectionLike,
    call: redis::Cmd,
    replica_wait: Option<Duration>,
) -> RedisResult<Replied> {
    let Some(wait) = replica_wait else {
        let reply = call.query_async(connection).await?;
        return Ok(Replied {
            reply,
            acknowledged: None,
        });
    };
    let mut pipeline = redis::pipe();
    pipeline.add_command(call);
    add_wait(&mut pipeline, Some(wait));
    replied(connection.req_packed_commands(&pipeline, 0, 2).await?)
}

/// Adds `WAIT 1 {milliseconds}` for `replica_wait`, if any: at least one millisecond, as
/// `WAIT` with 0 would block until a replica answers, however long that takes.
fn add_wait(pipeline: &mut redis::Pipeline, replica_wait: Option<Duration>) {
    if let Some(wait) = replica_wait {
        let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        pipeline.cmd("WAIT").arg(1).arg(millis);
    }
}

/// A call's reply, then `WAIT`'s if there is one, from a pipeline's replies: an error of
/// either is the call's error, the call's first.
fn replied(replies: Vec<Value>) -> RedisResult<Replied> {
    let mut replies = replies.into_iter();
    let reply = match replies.next() {
        Some(Value::ServerError(e)) => return Err(e.into()),
        Some(reply) => reply,
        None => return Err(RedisError::from((ErrorKind::Client, "no reply to a call"))),
    };
    let acknowledged = match replies.next() {
        None => None,
        Some(Value::Int(acknowledged)) => Some(u64::try_from(acknowledged).unwrap_or(0)),
        Some(Value::ServerError(e)) => return Err(e.into()),
        Some(_) => {
            return Err(RedisError::from((
                ErrorKind::Client,
                "WAIT answered something other than a number",
            )));
        }
    };
    Ok(Replied {
        reply,
        acknowledged,
    })
}

/// Whether `error` is a plain `ERR` whose text contains `text`.
fn has_detail(error: &RedisError, text: &str) -> bool {
    error.code() == Some("ERR") && error.detail().is_some_and(|detail| detail.contains(text))
}
