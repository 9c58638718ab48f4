//! The charge after the response: a report or a settle of what the response cost, beside
//! the response rather than in front of it, tried again with the same request id when the
//! store fails.

use std::sync::Arc;
use std::time::Duration;

use sluicegate::{Charge, Check, Store};

use super::settings::Settings;
use super::usage::Usage;

/// What the request-time check did, for the charge after the response.
pub(crate) struct Pending {
    /// The limits' keys, in the rules' order.
    pub(crate) keys: Vec<String>,
    pub(crate) request_id: String,
    /// `Charge::Reserved` when the request reserved its estimate, else it peeked.
    pub(crate) reserved: bool,
}

/// The wait before the first retry; each further retry waits twice the one before.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Charges `cost` for `pending` on its own task: a settle after a reservation, a report
/// after a peek (none for 0 units, which would record nothing). Never fails: a store error
/// is retried with the same request id up to the usage's attempts, then counted and logged.
pub(crate) fn charge<S: Store + 'static>(
    settings: Arc<Settings<S>>,
    usage: Usage,
    pending: Pending,
    cost: u64,
) {
    if !pending.reserved && cost == 0 {
        usage.counters().count_charged();
        return;
    }
    tokio::spawn(async move {
        let limits = settings.limits(&pending.keys);
        let check = Check {
            request_id: Some(&pending.request_id),
            charge: if pending.reserved {
                Charge::Settled
            } else {
                Charge::Reported
            },
            ..Check::new(&limits, cost)
        };
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1..=usage.attempts_allowed() {
            match settings.limiter.decide(&check).await {
                Ok(_) => {
                    usage.counters().count_charged();
                    return;
                }
                Err(error) if attempt < usage.attempts_allowed() => {
                    usage.counters().count_retry();
                    tracing::warn!(%error, attempt, request_id = %pending.request_id, cost,
                        "rate limit usage: the charge after the response failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(error) => {
                    usage.counters().count_failed();
                    tracing::error!(%error, attempts = attempt, request_id = %pending.request_id,
                        cost, mode = check.charge.name(),
                        "rate limit usage: the charge after the response failed; its units are not recorded");
                }
            }
        }
    });
}
