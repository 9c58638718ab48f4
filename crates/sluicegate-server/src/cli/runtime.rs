//! The tokio runtimes the asynchronous commands run in.

use anyhow::{Context as _, Result};
use tokio::runtime::{Builder, Runtime};

/// A multi-threaded runtime with every driver (I/O and time) enabled.
pub(crate) fn runtime() -> Result<Runtime> {
    build(&mut Builder::new_multi_thread())
}

/// The runtime `serve` and `load` run in: [`runtime`]'s, without the LIFO slot.
///
/// With the slot, a task woken by the task running is run next, before every task already
/// waiting. In the service that splits what belongs together. When a Redis call's answers
/// wake the requests it decided, each request's response wakes its HTTP/2 connection,
/// which then runs at once and writes that one response; and a request that queues its
/// check wakes the batcher, which sends it before the other requests ready to run have
/// queued theirs. Without the slot, woken tasks wait their turn: a connection writes the
/// responses of all the requests answered together, and a script call carries the checks
/// of all the requests that were ready. The load generator's requests share HTTP/2
/// connections the same way. (docs/BENCHMARKS.md: 1.05× to 1.23× the decisions per second
/// on Redis without the slot, at less CPU per decision in the service and in Redis, the
/// memory store's about even.)
///
/// The option is one of tokio's unstable ones (`--cfg tokio_unstable`, which
/// .cargo/config.toml sets). A build without it runs with the slot, and says so at start.
pub(crate) fn runtime_without_lifo_slot() -> Result<Runtime> {
    #[cfg(not(tokio_unstable))]
    tracing::warn!(
        "built without --cfg tokio_unstable: running with tokio's LIFO slot, which costs \
         CPU per request on HTTP/2 and on a Redis store (see .cargo/config.toml)"
    );
    build(&mut builder_without_lifo_slot())
}

fn builder_without_lifo_slot() -> Builder {
    // Changed only where tokio's unstable options are open.
    #[cfg_attr(not(tokio_unstable), allow(unused_mut))]
    let mut builder = Builder::new_multi_thread();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder
}

fn build(builder: &mut Builder) -> Result<Runtime> {
    builder
        .enable_all()
        .build()
        .context("cannot start the runtime")
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::runtime::Builder;

    use super::{build, builder_without_lifo_slot};

    /// The order in which three tasks spawned one after another first run, on one worker.
    fn first_runs(builder: &mut Builder) -> Vec<usize> {
        let runtime = build(builder.worker_threads(1)).expect("a runtime");
        runtime.block_on(async {
            let spawning = tokio::spawn(async {
                let order = Arc::new(Mutex::new(Vec::new()));
                let spawned: Vec<_> = (0..3)
                    .map(|task| {
                        let order = Arc::clone(&order);
                        tokio::spawn(async move { order.lock().expect("not poisoned").push(task) })
                    })
                    .collect();
                for task in spawned {
                    task.await.expect("the task ran");
                }
                let order = order.lock().expect("not poisoned");
                order.clone()
            });
            spawning.await.expect("the spawning task ran")
        })
    }

    /// `serve`'s and `load`'s runtime runs woken tasks in the order they were woken. The
    /// workspace's builds make it so (.cargo/config.toml); this fails when that setting is
    /// lost.
    #[test]
    fn without_the_slot_tasks_run_in_the_order_they_were_woken() {
        assert_eq!(first_runs(&mut builder_without_lifo_slot()), [0, 1, 2]);
        // With the LIFO slot, the last one woken runs first.
        assert_eq!(first_runs(&mut Builder::new_multi_thread()), [2, 0, 1]);
    }
}
