//! What the store reads of its servers off the decision path, again and again: a task that
//! runs a read every interval, and ends when its handle is dropped (with the last clone of
//! the store).

use std::future::Future;
use std::time::Duration;

/// The task of a periodic read; dropping it ends the task.
pub(super) struct Periodic(Option<tokio::task::AbortHandle>);

impl Drop for Periodic {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

impl Periodic {
    /// Runs `read` every `interval`, the first time one interval from now (the caller has
    /// just read at connect); never if `interval` is zero. A read that outlasts the
    /// interval delays the next one rather than bunching them up.
    pub(super) fn start<F, R>(interval: Duration, mut read: F) -> Periodic
    where
        F: FnMut() -> R + Send + 'static,
        R: Future<Output = ()> + Send,
    {
        let task = (!interval.is_zero()).then(|| {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    read().await;
                }
            })
            .abort_handle()
        });
        Periodic(task)
    }
}
