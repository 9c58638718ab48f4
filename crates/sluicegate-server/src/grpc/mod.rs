//! Envoy's rate-limit service, v3, over gRPC: `envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`, answered by the one mapping of [`crate::envoy`].
//!
//! Served here rather than through envoy-types' generated server for one reason: that
//! server decodes with tonic's prost codec, which answers a body that is no
//! `RateLimitRequest` with INTERNAL, as if the fault were the server's. It is the
//! client's, so it answers INVALID_ARGUMENT saying what was wrong, as all bad input does;
//! a body whose gRPC framing is broken likewise ([`frames`]).

mod frames;
mod health;

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::codegen::{Body, BoxFuture, Bytes, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::envoy;
use crate::metrics::CallError;
use crate::service::{DecideError, Service};
use crate::telemetry::Telemetry;

/// The one method's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

mod reflection;

/// The gRPC services — the RLS, the health protocol and server reflection — as a router,
/// to serve on its own or beside the HTTP API. Any other path is the caller's to answer
/// (its fallback). The services share one `Routes`: two tonic routers merged would each
/// bring a fallback. `ShouldRateLimit` calls are traced to `telemetry`.
pub(crate) fn router(service: Arc<Service>, telemetry: Telemetry) -> axum::Router {
    let health = health::server(Arc::clone(&service));
    let rls = RlsServer { service, telemetry };
    reflection::add_to(tonic::service::Routes::new(rls).add_service(health)).into_axum_router()
}

/// The answer to a gRPC call of a method no service here has.
pub(crate) fn unimplemented(path: &str) -> http::Response<tonic::body::Body> {
    Status::unimplemented(format!("no method {path}")).into_http()
}

/// The answer to a gRPC call on a listener without gRPC: gRPC has a TLS listener of its
/// own (`--grpc-tls-cert`), and is not served in plaintext beside it.
pub(crate) fn served_elsewhere() -> http::Response<tonic::body::Body> {
    Status::permission_denied(
        "gRPC is served over TLS on the gRPC port (--grpc-listen) only, not on this port",
    )
    .into_http()
}

/// The RLS service over the shared service: routes `ShouldRateLimit`, refuses any other
/// method as UNIMPLEMENTED.
#[derive(Clone)]
struct RlsServer {
    service: Arc<Service>,
    telemetry: Telemetry,
}

impl NamedService for RlsServer {
    const NAME: &'static str = SERVICE_NAME;
}

impl<B> tonic::codegen::Service<http::Request<B>> for RlsServer
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let answer = unimplemented(request.uri().path());
            return Box::pin(async move { Ok(answer) });
        }
        let method = ShouldRateLimit {
            service: Arc::clone(&self.service),
            telemetry: self.telemetry.clone(),
        };
        let request = request.map(frames::CheckedFrames::new);
        Box::pin(async move { Ok(Grpc::new(RequestCodec).unary(method, request).await) })
    }
}

/// `ShouldRateLimit` itself.
struct ShouldRateLimit {
    service: Arc<Service>,
    telemetry: Telemetry,
}

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let service = Arc::clone(&self.service);
        service.metrics().grpc_call();
        // The span is named as OpenTelemetry names RPC spans: the path without its slash.
        let span = self.telemetry.check_span(
            SHOULD_RATE_LIMIT.trim_start_matches('/'),
            request.metadata().as_ref(),
        );
        let started = std::time::Instant::now();
        Box::pin(async move {
            let answer = envoy::should_rate_limit(&service, request.get_ref(), span).await;
            let failed = answer.as_ref().err().map(|e| match e {
                DecideError::Store(_) => CallError::Store,
                DecideError::RequestIdConflict(_)
                | DecideError::Invalid(_)
                | DecideError::UnknownDomain(_)
                | DecideError::NoConfiguration => CallError::Service,
            });
            service.metrics().grpc_answered(started.elapsed(), failed);
            answer.map(Response::new).map_err(|e| match e {
                DecideError::Invalid(message) | DecideError::UnknownDomain(message) => {
                    Status::invalid_argument(message)
                }
                // Answered OVER_LIMIT by `envoy::should_rate_limit`; should one surface, it is
                // the caller's fault.
                DecideError::RequestIdConflict(conflict) => {
                    Status::failed_precondition(conflict.to_string())
                }
                DecideError::Store(e) => Status::unavailable(e.to_string()),
                DecideError::NoConfiguration => Status::unavailable(DecideError::NO_CONFIGURATION),
            })
        })
    }
}

/// tonic's prost codec, with a body that does not decode answered as the client's error.
#[derive(Clone, Copy)]
struct RequestCodec;

type RlsCodec = ProstCodec<RateLimitResponse, RateLimitRequest>;

/// The buffer tonic allocates per call for the request and again for the answer, where its
/// default is 8 KiB: an RLS message is tens of bytes (a domain, a few short entries), and
/// two 8 KiB blocks per call are past the allocator's per-thread caches, which made them
/// a measurable share of a call's CPU. A larger message grows its buffer as it needs.
const CALL_BUFFER_BYTES: usize = 1024;

/// tonic's default yield threshold, which only streaming calls reach.
const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(CALL_BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
}

impl Codec for RequestCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = ProstEncoder<RateLimitResponse>;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        RlsCodec::raw_encoder(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(RlsCodec::raw_decoder(buffer_settings()))
    }
}

/// prost's decoder, its errors (INTERNAL) turned into INVALID_ARGUMENT.
struct RequestDecoder(ProstDecoder<RateLimitRequest>);

impl Decoder for RequestDecoder {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<RateLimitRequest>, Status> {
        self.0.decode(buf).map_err(|e| {
            Status::invalid_argument(format!("not a RateLimitRequest: {}", e.message()))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
