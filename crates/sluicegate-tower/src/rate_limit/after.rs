//! The charge after the response: a report or a settle of what the response cost, beside
//! the response rather than in front of it, tried again with the same request id when the
//! store fails, each attempt bounded; tracked, so that a shutdown can wait for it.

use std::sync::Arc;
use std::time::Duration;

use sluicegate::{Charge, Check, Store, StoreError};

use super::settings::Settings;
use super::usage::Usage;

/// What the request-time check did, for the charge after the response.
pub(crate) struct Pending {
    /// The limits' keys, in the rules' order.
    pub(crate) keys: Vec<String>,
    pub(crate) request_id: String,
    /// What the response's cost is charged as: `Settle` against the estimate the request
    /// reserved, or `Report` after a peek.
    pub(crate) charge: Charge,
}

/// The wait before the first retry; each further retry waits twice the one before.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Charges `cost` for `pending` on its own tracked task: a settle after a reservation, a
/// report after a peek (none for 0 units, which would record nothing). Never fails: a
/// store error or an attempt that takes too long is retried with the same request id (and
/// the same cost, so a retry is never a conflicting reuse) up to the usage's attempts, then
/// counted and logged; an invalid check, or a request id found in use for another request,
/// is given up at once.
pub(crate) fn charge<S: Store + 'static>(
    settings: Arc<Settings<S>>,
    usage: Usage,
    pending: Pending,
    cost: u64,
) {
    if pending.charge == Charge::Report && cost == 0 {
        usage.stats.count_nothing_to_charge();
        return;
    }
    let in_flight = usage.in_flight.clone();
    let stats = Arc::clone(&usage.stats);
    let request_id = pending.request_id.clone();
    in_flight.spawn(
        async move { attempt(&settings, &usage, &pending, cost).await },
        move || {
            stats.count_failed();
            tracing::error!(%request_id, cost,
                "rate limit usage: the charge after the response was still pending at \
                 shutdown; its units are not recorded");
        },
    );
}

/// Tries the charge until it is recorded, fails for good, or runs out of attempts.
async fn attempt<S: Store>(settings: &Settings<S>, usage: &Usage, pending: &Pending, cost: u64) {
    let limits = settings.limits(&pending.keys);
    let check = Check {
        request_id: Some(&pending.request_id),
        charge: pending.charge,
        ..Check::new(&limits, cost)
    };
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=usage.attempts {
        let error = match tokio::time::timeout(
            usage.attempt_timeout,
            settings.limiter.decide(&check),
        )
        .await
        {
            Ok(Ok(_)) => {
                usage.stats.count_recorded();
                return;
            }
            Ok(Err(error)) => error,
            Err(_) => StoreError::Timeout {
                server: "after-charge".into(),
                key: None,
                after: usage.attempt_timeout,
            },
        };
        // No store decides an invalid check, however often it is asked; nor a charge whose
        // id is remembered for another cost (every attempt sends the same cost, so that is
        // another request's id): neither is retried.
        let retry = attempt < usage.attempts
            && !matches!(
                error,
                StoreError::InvalidCheck(_) | StoreError::RequestIdConflict(_)
            );
        if retry {
            usage.stats.count_retry();
            tracing::warn!(%error, attempt, request_id = %pending.request_id, cost,
                "rate limit usage: the charge after the response failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        } else {
            usage.stats.count_failed();
            tracing::error!(%error, attempts = attempt, request_id = %pending.request_id,
                cost, mode = check.charge.name(),
                "rate limit usage: the charge after the response failed; its units are not recorded");
            return;
        }
    }
}
