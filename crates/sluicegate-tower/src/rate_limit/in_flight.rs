//! The after-charges in flight of one `Usage` and every layer it was given to: tracked,
//! so that a drain can wait for them, and given up together when its time is up. Below
//! both `usage` (which owns them) and `after` (which starts them).

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone, Default)]
pub(crate) struct InFlight {
    tasks: TaskTracker,
    /// Cancelled when a drain's time is up: what is still pending is given up, and so is
    /// any charge made after (a drain that runs out of time is the end).
    give_up: CancellationToken,
    /// The charges given up so.
    given_up: Arc<AtomicU64>,
}

impl InFlight {
    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Runs `charge` on a tracked task of its own, unless a drain gives it up first: then
    /// it is dropped where it stands, counted given up, and `given_up` runs instead. Once
    /// given up, the give-up wins over a charge that could also end.
    pub(crate) fn spawn(
        &self,
        charge: impl Future<Output = ()> + Send + 'static,
        given_up: impl FnOnce() + Send + 'static,
    ) {
        let give_up = self.give_up.clone();
        let count = Arc::clone(&self.given_up);
        self.tasks.spawn(async move {
            let mut cancelled = pin!(give_up.cancelled());
            let mut charge = pin!(charge);
            let charged = poll_fn(|cx| {
                if cancelled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                charge.as_mut().poll(cx).map(|()| true)
            })
            .await;
            if !charged {
                count.fetch_add(1, Ordering::Relaxed);
                given_up();
            }
        });
    }

    /// Waits up to `timeout` for every charge in flight; then gives up the rest (each
    /// counted failed) and returns how many that was.
    pub(crate) async fn drain(&self, timeout: Duration) -> u64 {
        let before = self.given_up.load(Ordering::Relaxed);
        self.tasks.close();
        if tokio::time::timeout(timeout, self.tasks.wait())
            .await
            .is_err()
        {
            self.give_up.cancel();
            // A given-up charge ends at once: its task is waiting on the store or a backoff.
            self.tasks.wait().await;
        }
        // Charges made after the drain are tracked again.
        self.tasks.reopen();
        self.given_up.load(Ordering::Relaxed) - before
    }
}
