//! An error answer of the HTTP API: `{"error": "..."}` with a status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sluicegate::{RequestIdConflict, RequestUse, StoreError};

use crate::service::DecideError;

pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    /// Fields beside `error` that say what was wrong, for a program to read.
    details: serde_json::Map<String, serde_json::Value>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            details: serde_json::Map::new(),
        }
    }

    /// 409 Conflict: the request id was used before for another request. Names the id,
    /// the rule that remembers it, and what differs (`remembered` and `asked`: a mode and
    /// a cost each).
    fn request_id_conflict(conflict: RequestIdConflict) -> Self {
        let used = |u: RequestUse| serde_json::json!({ "mode": u.mode.name(), "cost": u.cost });
        let mut error = ApiError::new(StatusCode::CONFLICT, conflict.to_string());
        error.details.extend([
            ("request_id".to_owned(), conflict.request_id.into()),
            ("rule".to_owned(), conflict.rule.into()),
            ("remembered".to_owned(), used(conflict.remembered)),
            ("asked".to_owned(), used(conflict.asked)),
        ]);
        error
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = self.details;
        body.insert("error".to_owned(), self.message.into());
        (self.status, axum::Json(serde_json::Value::Object(body))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidCheck(message) => ApiError::bad_request(message),
            StoreError::RequestIdConflict(conflict) => ApiError::request_id_conflict(conflict),
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
            DecideError::RequestIdConflict(conflict) => ApiError::request_id_conflict(conflict),
            DecideError::NoConfiguration => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                DecideError::NO_CONFIGURATION.to_owned(),
            ),
        }
    }
}
