//! Checks in flight together share script calls: on one server, any checks; on a Redis
//! Cluster, the checks of one node.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::error::{CallError, bounded};
use super::keys::hash_slot;
use super::replaceable::Replaceable;
use super::script::{CallCounters, ScriptCheck, ScriptRow, recorded, split_answers};
use super::scripting::{CheckScript, Replied};
use super::slots::{SlotMap, Slots};

/// Most checks that are waiting together go to Redis together, in one script call (at most
/// [`MAX_BATCH`]): a call's fixed costs (the command, the script's setup, `TIME`) are paid
/// once for all, which is what lets one Redis decide more checks a second. A check never
/// waits for others to join: while fewer than [`BATCHES_IN_FLIGHT`] calls are in flight it
/// leaves at once, alone if it is alone; checks only gather while the calls in flight are
/// out. Nor does a check wait a turn of the runtime for the checks arriving with it: at
/// 3,000 checks a second that made calls carry 2.5 checks instead of 1.9, and Redis spent
/// no less time per decision. Each check in a call is decided as if it were alone, in order.
///
/// On a Redis Cluster, each node's checks are gathered and bounded apart, as a single
/// server's, by the slot map as last read ([`sort_by_node`], [`Target::split`]);
/// docs/SPEC.md, "Redis Cluster: shared calls and moving slots".
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
/// Script calls in flight at once on a single server's connection, or to one node of a
/// cluster. Two: while Redis runs one, the next is on its way or gathering checks, so Redis
/// has the next call queued; more calls in flight only split the same checks into smaller
/// calls, each paying the fixed costs again (a lone check of a hot key costs Redis as many
/// instructions as five more checks of it in the same call). Under load, two carry a
/// service's checks in about 0.6× the calls four take, at less Redis time per decision
/// (docs/BENCHMARKS.md).
const BATCHES_IN_FLIGHT: usize = 2;
/// Script calls in flight at once on a cluster for the checks that no one node serves by
/// the slot map: more than to one node, as only checks of the very same keys share a call
/// there.
const CLUSTER_BATCHES_IN_FLIGHT: usize = 16;

/// Where a batcher sends its calls.
#[derive(Clone)]
pub(super) enum Target {
    Server(Replaceable),
    Cluster {
        connection: ClusterConnection,
        /// The slot map, read again when a call fails.
        slots: Arc<Slots>,
    },
}

/// Checks that go in one call, and how.
struct Group<T> {
    members: Vec<T>,
    /// Checks of several slots of one node: the node's address, where the call is sent
    /// with every key an argument (`check_routed`).
    routed_to: Option<(String, u16)>,
}

/// What a check of a cluster is grouped by.
#[derive(Clone, Copy, PartialEq)]
enum Lane {
    /// The node all its slots are on, by the slot map.
    Node(u16),
    /// Its own keys, all of one slot: where the map does not tell, for an undo, and
    /// without functions.
    Keys,
    /// Nowhere: its keys are of several slots, which are not all on one node by the map
    /// (or calls cannot be routed). It is turned away unsent, to be run slot by slot.
    Nowhere,
}

impl Lane {
    fn of(check: &ScriptCheck, slots: &SlotMap, routes: bool) -> Lane {
        let keys = check.keys();
        match node_of(keys, slots) {
            Some(node) if routes && !check.is_undo() => Lane::Node(node),
            _ if spans_slots(keys) => Lane::Nowhere,
            _ => Lane::Keys,
        }
    }
}

/// The node that serves the slots of all of `keys`, by the map, if one does.
fn node_of(keys: &[String], slots: &SlotMap) -> Option<u16> {
    let mut nodes = keys.iter().map(|key| slots.node_of(hash_slot(key)));
    let node = nodes.next()??;
    nodes.all(|other| other == Some(node)).then_some(node)
}

/// Whether `keys` are of several hash slots.
fn spans_slots(keys: &[String]) -> bool {
    let mut key_slots = keys.iter().map(|key| hash_slot(key));
    key_slots
        .next()
        .is_some_and(|first| key_slots.any(|slot| slot != first))
}

impl Target {
    pub(super) fn cluster(connection: ClusterConnection, slots: Arc<Slots>) -> Target {
        Target::Cluster { connection, slots }
    }

    /// `calls` split into the groups that may share a call, each in queue order, and those
    /// turned away unsent: all of them go in one call on one server. On a cluster, with
    /// functions, the checks of one node by `slots` go in one routed call (see
    /// [`routed_command`](super::script::routed_command)) — unless they are all of the same
    /// keys of one slot, which go declared; a check of several slots goes there too, when
    /// the map puts them all on one node, and is turned away otherwise (a declared call
    /// of several slots is refused with `CROSSSLOT`). Without functions, or where the map
    /// does not tell, only checks of the very same keys share a (declared) call. A
    /// declared call whose keys are all one check's is refused or redirected (`MOVED`,
    /// `ASK`, `TRYAGAIN` while its slot migrates) exactly when that check alone would be.
    fn split<T>(
        &self,
        calls: Vec<T>,
        call: impl Fn(&T) -> &ScriptCheck,
        slots: &SlotMap,
        routes: bool,
    ) -> (Vec<Group<T>>, Vec<T>) {
        if let Target::Server(_) = self {
            let group = Group {
                members: calls,
                routed_to: None,
            };
            return (vec![group], Vec::new());
        }
        let mut lanes: Vec<(Lane, Vec<T>)> = Vec::new();
        let mut turned_away = Vec::new();
        for queued in calls {
            let check = call(&queued);
            let lane = Lane::of(check, slots, routes);
            if lane == Lane::Nowhere {
                turned_away.push(queued);
                continue;
            }
            let found = lanes.iter_mut().find(|(group_lane, members)| {
                *group_lane == lane
                    && (lane != Lane::Keys || call(&members[0]).keys() == check.keys())
            });
            match found {
                Some((_, members)) => members.push(queued),
                None => lanes.push((lane, vec![queued])),
            }
        }
        let groups = lanes
            .into_iter()
            .map(|(lane, members)| {
                // A node's checks go routed unless they are all of one slot's same keys.
                let keys = call(&members[0]).keys();
                let routed_to = match lane {
                    Lane::Node(node)
                        if spans_slots(keys)
                            || members.iter().any(|other| call(other).keys() != keys) =>
                    {
                        slots
                            .address(node)
                            .map(|(host, port)| (host.to_owned(), port))
                    }
                    _ => None,
                };
                Group { members, routed_to }
            })
            .collect();
        (groups, turned_away)
    }

    /// Waits, at most `hold`, until a single server behind a new connection has been
    /// verified (see [`Replaceable::for_check`]); at once on a cluster.
    async fn verified(&self, hold: Duration) -> Result<(), CallError> {
        match self {
            Target::Server(connection) => connection.for_check(hold).await.map(drop),
            Target::Cluster { .. } => Ok(()),
        }
    }

    /// Sends one call carrying `calls`, bounded by `hold`, followed by the `WAIT` of
    /// `replica_wait` when one of them may record units; replaces a single server's
    /// connection when Redis stayed silent for the whole hold.
    async fn send(
        &self,
        script: &CheckScript,
        calls: &[ScriptCheck],
        routed_to: Option<&(String, u16)>,
        hold: Duration,
        replica_wait: Option<Duration>,
    ) -> Result<Replied, CallError> {
        let replica_wait = replica_wait.filter(|_| calls.iter().any(ScriptCheck::may_record));
        match self {
            Target::Server(connection) => {
                let mut manager = connection.for_check(hold).await?;
                let reply = bounded(hold, script.call(&mut manager, calls, replica_wait)).await;
                connection.note(&reply);
                // Our bound or the manager's own response timeout, both the hold.
                if matches!(&reply, Err(e) if e.is_timeout()) {
                    connection.replace_silent();
                }
                reply
            }
            Target::Cluster { connection, .. } => {
                bounded(hold, async {
                    let mut connection = connection.clone();
                    if let Some((host, port)) = routed_to {
                        return script
                            .call_routed(&mut connection, calls, (host, *port), replica_wait)
                            .await;
                    }
                    match script.call(&mut connection, calls, replica_wait).await {
                        Err(e) => match script
                            .call_asked(&mut connection, &e, calls, replica_wait)
                            .await
                        {
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

/// What a batcher's calls are sent with, shared by the tasks that gather and send them.
struct Outlet {
    target: Target,
    script: Arc<CheckScript>,
    counters: Arc<CallCounters>,
    hold: Duration,
    replica_wait: Option<Duration>,
}

impl Batcher {
    /// Starts the task that sends queued checks; it ends when every store clone is gone.
    /// A call that has no answer within `hold` gives its place up (see [`call_hold`]).
    /// With `replica_wait`, a call that may record units is followed by a `WAIT` for one
    /// replica, for that long at most, and each of its checks that recorded units fails
    /// unless one acknowledged ([`CallError::NotReplicated`]).
    pub(super) fn start(
        target: Target,
        script: Arc<CheckScript>,
        counters: Arc<CallCounters>,
        hold: Duration,
        replica_wait: Option<Duration>,
    ) -> Batcher {
        let (queue, waiting) = mpsc::unbounded_channel::<Queued>();
        let slots = match &target {
            Target::Cluster { slots, .. } => Some(Arc::clone(slots)),
            Target::Server(_) => None,
        };
        let outlet = Arc::new(Outlet {
            target,
            script,
            counters,
            hold,
            replica_wait,
        });
        match slots {
            Some(slots) => tokio::spawn(sort_by_node(outlet, slots, waiting)),
            None => tokio::spawn(gather_and_send(outlet, waiting, BATCHES_IN_FLIGHT)),
        };
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

/// Gathers the checks of `waiting` into calls, at most `in_flight` of them out at once, until
/// every sender of `waiting` is gone.
async fn gather_and_send(
    outlet: Arc<Outlet>,
    mut waiting: mpsc::UnboundedReceiver<Queued>,
    in_flight: usize,
) {
    let in_flight = Arc::new(Semaphore::new(in_flight));
    let unknown = Arc::new(SlotMap::unknown());
    loop {
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let mut batch = Vec::with_capacity(MAX_BATCH);
        if waiting.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        // A check whose caller stopped waiting (its timeout passed while calls in flight
        // held Redis up) was answered with an error: sent now, it could still take units
        // nobody will use.
        batch.retain(|queued| !queued.answer.is_closed());
        if batch.is_empty() {
            continue;
        }
        let slots = match &outlet.target {
            Target::Cluster { slots, .. } => slots.current().clone(),
            Target::Server(_) => Arc::clone(&unknown),
        };
        let mut permit = Some(permit);
        let (groups, turned_away) =
            outlet
                .target
                .split(batch, |queued| &queued.call, &slots, outlet.script.routes());
        for queued in turned_away {
            let _caller_gone = queued.answer.send(Err(CallError::NotOnOneNode));
        }
        for group in groups {
            let permit = match permit.take() {
                Some(permit) => permit,
                None => match Arc::clone(&in_flight).acquire_owned().await {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            let outlet = Arc::clone(&outlet);
            tokio::spawn(async move { send_group(&outlet, group, permit).await });
        }
    }
}

/// Hands each check of a cluster to the queue of the node that serves all its slots, by
/// the slot map as it reads on arrival, each node's calls gathered and bounded as a single
/// server's ([`BATCHES_IN_FLIGHT`]): under load a node's calls are as large as one
/// server's, and a node that stalls holds up only its own checks. A check that no one node
/// serves by the map — the map is not read yet, its slots are on several nodes, or calls
/// cannot be routed (no functions), so that only checks of the very same keys share a call
/// — goes to one queue of its own, [`CLUSTER_BATCHES_IN_FLIGHT`] calls at once.
async fn sort_by_node(
    outlet: Arc<Outlet>,
    slots: Arc<Slots>,
    mut waiting: mpsc::UnboundedReceiver<Queued>,
) {
    let queue = |in_flight| {
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(gather_and_send(Arc::clone(&outlet), waiting, in_flight));
        queue
    };
    let unplaced = queue(CLUSTER_BATCHES_IN_FLIGHT);
    let mut nodes: Vec<Option<mpsc::UnboundedSender<Queued>>> = Vec::new();
    let mut arrived = Vec::with_capacity(MAX_BATCH);
    while waiting.recv_many(&mut arrived, MAX_BATCH).await > 0 {
        let map = slots.current();
        let routes = outlet.script.routes();
        for queued in arrived.drain(..) {
            let node = routes
                .then(|| node_of(queued.call.keys(), &map))
                .flatten()
                .map(usize::from);
            let queue = match node {
                Some(node) => {
                    if nodes.len() <= node {
                        nodes.resize_with(node + 1, || None);
                    }
                    nodes[node].get_or_insert_with(|| queue(BATCHES_IN_FLIGHT))
                }
                None => &unplaced,
            };
            // A queue's task lives as long as its sender, held here: it is gone only with
            // the runtime, and the check's caller is then told the store closed.
            let _runtime_gone = queue.send(queued);
        }
    }
}

/// Whether a routed check failed because the node it went to does not hold one of its
/// keys (the slot moved, or is migrating and the key has gone): Redis 7 says "non local
/// key"; a redirection is named for what it is. The check wrote nothing (`check_routed`
/// reads every key before its first write).
fn misrouted(error: &CallError) -> bool {
    match error {
        CallError::Check(message) => {
            message.contains("non local key")
                || message.starts_with("MOVED ")
                || message.starts_with("ASK ")
        }
        _ => false,
    }
}

/// Whether a routed check came back unrun for a reason a declared call, or a call of each
/// of its slots, does not share: the node it went to no longer holds one of its keys, or
/// the whole routed call never ran there (see [`CallError::never_ran`]) — after a
/// failover, the old master refuses connections, then turns writes away as a replica.
fn turned_away_unrun(error: &CallError) -> bool {
    misrouted(error) || error.never_ran()
}

/// Sends `calls` as one call (to `routed_to`, if set): each check's rows or error. With
/// `replica_wait`, a check that recorded units fails when the `WAIT` after the call heard
/// from no replica: it answers only for writes a replica has.
async fn call_and_split(
    target: &Target,
    script: &CheckScript,
    counters: &CallCounters,
    calls: &[ScriptCheck],
    routed_to: Option<&(String, u16)>,
    hold: Duration,
    replica_wait: Option<Duration>,
) -> Result<Vec<Result<Vec<ScriptRow>, CallError>>, CallError> {
    let replied = target
        .send(script, calls, routed_to, hold, replica_wait)
        .await?;
    let mut answers = split_answers(replied.reply, calls)?;
    if let (Some(acknowledged @ 0), Some(within)) = (replied.acknowledged, replica_wait) {
        for answer in &mut answers {
            if answer.as_deref().is_ok_and(recorded) {
                counters.count_not_replicated();
                *answer = Err(CallError::NotReplicated {
                    acknowledged,
                    within,
                });
            }
        }
    }
    Ok(answers)
}

/// Sends `group` as one call and answers each of its checks. A routed check that came back
/// unrun ([`turned_away_unrun`]) is sent again on its own, declared (the cluster client
/// finds its node) — or, when its keys are of several slots, turned away to be run slot
/// by slot — and the slot map is read again, as it is after any failed call on a cluster
/// (a node that fails may be failing over: its slots are soon another's).
async fn send_group(outlet: &Outlet, group: Group<Queued>, permit: OwnedSemaphorePermit) {
    let Outlet {
        target,
        script,
        counters,
        hold,
        replica_wait,
    } = outlet;
    let (hold, replica_wait) = (*hold, *replica_wait);
    if let Err(e) = target.verified(hold).await {
        for queued in group.members {
            let _caller_gone = queued.answer.send(Err(e.clone()));
        }
        return;
    }
    // A check whose caller stopped waiting while the server was verified is not sent, as
    // in the batcher's queue.
    let (calls, answers): (Vec<ScriptCheck>, Vec<_>) = group
        .members
        .into_iter()
        .filter(|q| !q.answer.is_closed())
        .map(|q| (q.call, q.answer))
        .unzip();
    if calls.is_empty() {
        return;
    }
    counters.count(calls.len());
    let routed = group.routed_to.is_some();
    let reply = call_and_split(
        target,
        script,
        counters,
        &calls,
        group.routed_to.as_ref(),
        hold,
        replica_wait,
    )
    .await;
    let (replies, call_failed) = match reply {
        Ok(replies) => (replies, false),
        Err(e) => (vec![Err(e); calls.len()], true),
    };
    let mut resend = Vec::new();
    let mut map_stale = call_failed;
    for ((call, answer), reply) in calls.into_iter().zip(answers).zip(replies) {
        match reply {
            Err(e) if routed && turned_away_unrun(&e) => {
                map_stale = true;
                if spans_slots(call.keys()) {
                    // Declared, a call of several slots is refused: run slot by slot.
                    let _caller_gone = answer.send(Err(CallError::NotOnOneNode));
                } else {
                    resend.push((call, answer));
                }
            }
            reply => {
                let _caller_gone = answer.send(reply);
            }
        }
    }
    if let (true, Target::Cluster { slots, .. }) = (map_stale, target) {
        slots.refresh_soon();
    }
    for (call, answer) in resend {
        if answer.is_closed() {
            continue;
        }
        let calls = std::slice::from_ref(&call);
        counters.count(1);
        let reply = call_and_split(target, script, counters, calls, None, hold, replica_wait).await;
        let mut replies = reply.unwrap_or_else(|e| vec![Err(e)]);
        let _caller_gone = answer.send(replies.pop().expect("one answer for one check"));
    }
    drop(permit);
}
