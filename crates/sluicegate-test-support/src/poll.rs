//! Waiting on real processes: they start, stop and agree in their own time.

use std::time::{Duration, Instant};

/// Asks `ready` every 20 ms until it answers `true` (then `true`) or `timeout` has passed
/// (then `false`, so the caller can say what did not happen).
pub(crate) fn poll_until(timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
