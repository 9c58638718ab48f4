//! An error answer of the HTTP API: `{"error": "..."}` with a status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sluicegate::StoreError;

use crate::service::DecideError;

pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message });
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidCheck(message) => ApiError::bad_request(message),
            other => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, other.to_string()),
        }
    }
}

impl From<DecideError> for ApiError {
    fn from(e: DecideError) -> Self {
        match e {
            DecideError::Invalid(message) | DecideError::UnknownDomain(message) => {
                ApiError::bad_request(message)
            }
            DecideError::Store(e) => e.into(),
            DecideError::NoConfiguration => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                DecideError::NO_CONFIGURATION.to_owned(),
            ),
        }
    }
}
