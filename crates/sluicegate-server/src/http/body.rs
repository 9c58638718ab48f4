//! A request body, read whole and bounded; one that cannot be read answers as every
//! other error of the API does, in JSON.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;

use super::error::ApiError;

/// The largest request body the HTTP API reads: a check is a few hundred bytes, so a
/// flood is refused before it is parsed.
pub(super) const MAX_BODY_BYTES: usize = 256 * 1024;

/// The body of a request, at most [`MAX_BODY_BYTES`] (the router's `DefaultBodyLimit`).
pub(super) struct Body(pub(super) Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(request, state)
            .await
            .map(Body)
            .map_err(|rejection| {
                let status = rejection.status();
                let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    format!("request body: larger than {MAX_BODY_BYTES} bytes")
                } else {
                    format!("request body: {}", rejection.body_text())
                };
                ApiError::new(status, message)
            })
    }
}
