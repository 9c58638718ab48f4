//! gRPC's health protocol, `grpc.health.v1.Health`, for the names envoyproxy/ratelimit
//! serves it under: `ratelimit` (envoyproxy/ratelimit@f2fb157 src/server/server_impl.go:293)
//! and the server as a whole, `""`. Both are the service's [`readiness`], asked when a
//! probe asks — nothing pings the store on its own — and, for a `Watch`, every
//! [`WATCH_INTERVAL`] while the watcher stays, a message sent on each change.

use std::sync::Arc;
use std::time::Duration;

use tonic::codegen::BoxStream;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::readiness::readiness;
use crate::service::Service;

/// The service names whose status is the service's readiness.
const NAMES: [&str; 2] = ["", "ratelimit"];

/// How often a `Watch` asks readiness again.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The health service over `service`, for tonic's router.
pub(super) fn server(service: Arc<Service>) -> HealthServer<ServiceHealth> {
    HealthServer::new(ServiceHealth(service))
}

/// `grpc.health.v1.Health` answered from the service's readiness.
pub(super) struct ServiceHealth(Arc<Service>);

/// The status of `name`, or NOT_FOUND for a service this server does not have (as the
/// protocol asks).
async fn status(service: &Service, name: &str) -> Result<HealthCheckResponse, Status> {
    if !NAMES.contains(&name) {
        return Err(Status::not_found(format!("no service {name:?}")));
    }
    let status = if readiness(service).await.is_ready() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    Ok(HealthCheckResponse {
        status: status.into(),
    })
}

#[tonic::async_trait]
impl Health for ServiceHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        status(&self.0, &request.get_ref().service)
            .await
            .map(Response::new)
    }

    type WatchStream = BoxStream<HealthCheckResponse>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let name = request.into_inner().service;
        let first = status(&self.0, &name).await?;
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        let service = Arc::clone(&self.0);
        tokio::spawn(async move {
            let mut last = first.status;
            if sender.send(Ok(first)).await.is_err() {
                return;
            }
            let mut tick = tokio::time::interval(WATCH_INTERVAL);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = sender.closed() => return,
                }
                let Ok(now) = status(&service, &name).await else {
                    return;
                };
                if now.status != last {
                    last = now.status;
                    if sender.send(Ok(now)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}
