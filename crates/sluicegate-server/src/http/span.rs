//! The check span of an HTTP request: its handler asks for an [`HttpSpan`] and ends it
//! with what it decided ([`crate::telemetry`]).

use std::convert::Infallible;

use axum::extract::{FromRequestParts, MatchedPath};
use axum::http::request::Parts;
use axum::{Extension, Router};

use crate::telemetry::{CheckSpan, Telemetry};

/// `router` with its requests' spans going to `telemetry`. With traces off the router is
/// left as it is: no layer, no per-request work.
pub(super) fn traced(router: Router, telemetry: Telemetry) -> Router {
    if telemetry.is_on() {
        router.layer(Extension(telemetry))
    } else {
        router
    }
}

/// A request's check span, started when its handler is called and named by method and
/// route (`POST /v1/check`); nothing when traces are off.
pub(super) struct HttpSpan(pub(super) CheckSpan);

impl<S: Send + Sync> FromRequestParts<S> for HttpSpan {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        let Some(telemetry) = parts.extensions.get::<Telemetry>() else {
            return Ok(HttpSpan(CheckSpan::off()));
        };
        let route = parts
            .extensions
            .get::<MatchedPath>()
            .map_or(parts.uri.path(), MatchedPath::as_str);
        let name = format!("{} {route}", parts.method);
        Ok(HttpSpan(telemetry.check_span(name, &parts.headers)))
    }
}
