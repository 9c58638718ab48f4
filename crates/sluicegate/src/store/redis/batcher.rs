//! Checks in flight together share script calls: on one server, any checks; on a Redis
//! Cluster, the checks of the same keys.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::connect::Replaceable;
use super::error::{CallError, bounded};
use super::script::{CallCounters, ScriptCheck, ScriptRow, split_answers};
use super::scripting::CheckScript;

/// Most checks that are waiting together go to Redis together, in one script call (at most
/// [`MAX_BATCH`]): a call's fixed costs (the command, the script's setup, `TIME`) are paid
/// once for all, which is what lets one Redis decide more checks a second. A check never
/// waits for others to join: while fewer than [`BATCHES_IN_FLIGHT`] calls are in flight it
/// leaves at once, alone if it is alone; checks only gather while the calls in flight are
/// out. Each check in a call is decided as if it were alone, in order.
///
/// On a Redis Cluster a call's keys must all live in one hash slot, so only checks of the
/// same keys (one identity's, the same rules) share a call: the hot keys, where calls
/// pile up. Every key of a call is declared: the cluster
/// client sends it to the node that owns the slot and follows `MOVED` and `ASK`, and the
/// node refuses the whole call before running anything if it does not own every key
/// (docs/SPEC.md, Redis Cluster: shared calls and moving slots).
#[derive(Clone)]
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Queued>,
}

/// How long a script call keeps its place on the connection while Redis does not answer.
/// Longer than a check's own timeout on purpose: while Redis is stalled, the calls in flight
/// keep their places, so the checks queued behind them time out in the queue and are never
/// sent (their callers were told the store failed; sent later, they could still take units).
/// Bounded, so that a call lost with its connection frees its place; a call that reaches
/// it has heard nothing from Redis for that long, and the connection is replaced.
pub(super) fn call_hold(check_timeout: Duration) -> Duration {
    (check_timeout * 10).max(Duration::from_secs(1))
}

/// Checks per script call, at most.
const MAX_BATCH: usize = 64;
/// Script calls in flight on a single server's connection at once.
const BATCHES_IN_FLIGHT: usize = 4;
/// Script calls in flight on a cluster at once: more than on one server, as checks of
/// different keys cannot share a call there.
const CLUSTER_BATCHES_IN_FLIGHT: usize = 16;

/// Where a batcher sends its calls.
#[derive(Clone)]
pub(super) enum Target {
    Server(Replaceable),
    Cluster(ClusterConnection),
}

impl Target {
    fn batches_in_flight(&self) -> usize {
        match self {
            Target::Server(_) => BATCHES_IN_FLIGHT,
            Target::Cluster(_) => CLUSTER_BATCHES_IN_FLIGHT,
        }
    }

    /// `calls` split into the groups that may share a call, each in queue order: all of
    /// them on one server; on a cluster, the checks of the very same keys. A call whose
    /// keys are all one check's is refused or redirected (`MOVED`, `ASK`, `TRYAGAIN` while
    /// its slot migrates) exactly when that check alone would be: checks of several
    /// identities of one slot could meet `TRYAGAIN` where each alone would not, some of
    /// their keys moved, some not yet.
    fn split<T>(&self, calls: Vec<T>, call: impl Fn(&T) -> &ScriptCheck) -> Vec<Vec<T>> {
        match self {
            Target::Server(_) => vec![calls],
            Target::Cluster(_) => {
                let mut groups: Vec<Vec<T>> = Vec::new();
                for queued in calls {
                    let keys = call(&queued).keys();
                    match groups
                        .iter_mut()
                        .find(|group| call(&group[0]).keys() == keys)
                    {
                        Some(group) => group.push(queued),
                        None => groups.push(vec![queued]),
                    }
                }
                groups
            }
        }
    }

    /// Sends one call carrying `calls`, bounded by `hold`; replaces a single server's
    /// connection when Redis stayed silent for the whole hold.
    async fn send(
        &self,
        script: &CheckScript,
        calls: &[ScriptCheck],
        hold: Duration,
    ) -> Result<redis::Value, CallError> {
        match self {
            Target::Server(connection) => {
                let reply = bounded(hold, script.call(&mut connection.current(), calls)).await;
                // Our bound or the manager's own response timeout, both the hold.
                let silent = match &reply {
                    Err(CallError::Timeout) => true,
                    Err(CallError::Redis(e)) => e.is_timeout(),
                    _ => false,
                };
                if silent {
                    connection.replace_silent();
                }
                reply
            }
            Target::Cluster(connection) => {
                bounded(hold, async {
                    let mut connection = connection.clone();
                    match script.call(&mut connection, calls).await {
                        Err(e) => match script.call_asked(&mut connection, &e, calls).await {
                            Some(reply) => reply,
                            None => Err(e),
                        },
                        reply => reply,
                    }
                })
                .await
            }
        }
    }
}

struct Queued {
    call: ScriptCheck,
    answer: oneshot::Sender<Result<Vec<ScriptRow>, CallError>>,
}

impl Batcher {
    /// Starts the task that sends queued checks; it ends when every store clone is gone.
    /// A call that has no answer within `hold` gives its place up (see [`call_hold`]).
    pub(super) fn start(
        target: Target,
        script: Arc<CheckScript>,
        counters: Arc<CallCounters>,
        hold: Duration,
    ) -> Batcher {
        let (queue, mut waiting) = mpsc::unbounded_channel::<Queued>();
        tokio::spawn(async move {
            let in_flight = Arc::new(Semaphore::new(target.batches_in_flight()));
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
                let mut permit = Some(permit);
                for group in target.split(batch, |queued| &queued.call) {
                    let permit = match permit.take() {
                        Some(permit) => permit,
                        None => match Arc::clone(&in_flight).acquire_owned().await {
                            Ok(permit) => permit,
                            Err(_) => return,
                        },
                    };
                    let (target, script, counters) =
                        (target.clone(), Arc::clone(&script), Arc::clone(&counters));
                    tokio::spawn(async move {
                        send_group(&target, &script, &counters, group, hold, permit).await;
                    });
                }
            }
        });
        Batcher { queue }
    }

    /// Queues `call` and waits, at most `timeout`, for its rows.
    pub(super) async fn call(
        &self,
        call: ScriptCheck,
        timeout: Duration,
    ) -> Result<Vec<ScriptRow>, CallError> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Queued { call, answer })
            .map_err(|_| CallError::Closed)?;
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(CallError::Closed),
            Err(_) => Err(CallError::Timeout),
        }
    }
}

/// Sends `group` as one call and answers each of its checks.
async fn send_group(
    target: &Target,
    script: &CheckScript,
    counters: &CallCounters,
    group: Vec<Queued>,
    hold: Duration,
    permit: OwnedSemaphorePermit,
) {
    let (calls, answers): (Vec<ScriptCheck>, Vec<_>) =
        group.into_iter().map(|q| (q.call, q.answer)).unzip();
    counters.count(calls.len());
    let reply = target.send(script, &calls, hold).await;
    let replies = reply.and_then(|reply| split_answers(reply, &calls));
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
}
