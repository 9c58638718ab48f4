//! gRPC's health protocol, `grpc.health.v1.Health`, for the names envoyproxy/ratelimit
//! serves it under: `ratelimit` (envoyproxy/ratelimit@f2fb157 src/server/server_impl.go:293)
//! and the server as a whole, `""`. Both follow [`readiness`], checked every
//! [`HEALTH_INTERVAL`] off the request path, so `Check` and `Watch` answer from memory.

use std::sync::Arc;
use std::time::Duration;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::readiness::readiness;
use crate::service::Service;

/// The service names whose status is the service's readiness.
const NAMES: [&str; 2] = ["", "ratelimit"];

/// How often readiness is asked again.
pub(crate) const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// The statuses every gRPC listener answers from, kept to the service's readiness by a
/// task of their own from now on (ready or not as of now before this returns).
pub(crate) async fn follow_readiness(service: Arc<Service>) -> HealthReporter {
    let reporter = HealthReporter::new();
    let mut reported = status(&service).await;
    set(&reporter, reported).await;
    let following = reporter.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEALTH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            // Watchers hear of changes only.
            let now = status(&service).await;
            if now != reported {
                set(&following, now).await;
                reported = now;
            }
        }
    });
    reporter
}

async fn status(service: &Service) -> ServingStatus {
    if readiness(service).await.is_ready() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

async fn set(reporter: &HealthReporter, status: ServingStatus) {
    for name in NAMES {
        reporter.set_service_status(name, status).await;
    }
}
