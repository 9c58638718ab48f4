//! Envoy's rate-limit service, v3, over gRPC: `envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`, answered by the one mapping of [`crate::envoy`].

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::envoy;
use crate::service::{DecideError, Service};

/// The RLS service over the shared service.
struct Rls {
    service: Arc<Service>,
}

/// The gRPC service as a router, to serve on its own or beside the HTTP API.
pub(crate) fn router(service: Arc<Service>) -> axum::Router {
    tonic::service::Routes::new(RateLimitServiceServer::new(Rls { service })).into_axum_router()
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        envoy::should_rate_limit(&self.service, request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| match e {
                DecideError::Invalid(message) => Status::invalid_argument(message),
                DecideError::Store(e) => Status::unavailable(e.to_string()),
            })
    }
}
