//! Checks in flight together on one server share script calls.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};

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
/// Script calls in flight on the connection at once.
const BATCHES_IN_FLIGHT: usize = 4;

struct Queued {
    call: ScriptCheck,
    answer: oneshot::Sender<Result<Vec<ScriptRow>, CallError>>,
}

impl Batcher {
    /// Starts the task that sends queued checks; it ends when every store clone is gone.
    /// A call that has no answer within `hold` gives its place up (see [`call_hold`]).
    pub(super) fn start(
        connection: Replaceable,
        script: Arc<CheckScript>,
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
                let (connection, script) = (connection.clone(), Arc::clone(&script));
                tokio::spawn(async move {
                    let (calls, answers): (Vec<ScriptCheck>, Vec<_>) =
                        batch.into_iter().map(|q| (q.call, q.answer)).unzip();
                    let replies =
                        bounded(hold, script.call(&mut connection.current(), &calls)).await;
                    // Our bound or the manager's own response timeout, both the hold.
                    let silent = match &replies {
                        Err(CallError::Timeout) => true,
                        Err(CallError::Redis(e)) => e.is_timeout(),
                        _ => false,
                    };
                    if silent {
                        connection.replace_silent();
                    }
                    let replies = replies.and_then(|reply| split_answers(reply, &calls));
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
