//! The one mapping from failures to HTTP responses: every status sandcall answers with is
//! chosen here, from the engine's `ErrorKind`s, the auth crate's refusals and the
//! server's own (`From` impls below), or by the server's own refusals built here.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sandcall_api::{error_type, ErrorBody};
use sandcall_auth::AuthError;
use sandcall_engine::error::{EngineError, ErrorKind};

/// An error answered to the client: a status, a stable `error_type` and a message that
/// never contains host paths or internals.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub error_type: &'static str,
    pub message: String,
    pub retry_after_s: Option<u64>,
    /// `ErrorBody::code`, where one applies.
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, error_type: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            error_type,
            message: message.into(),
            retry_after_s: None,
            code: None,
        }
    }

    // The refusals the server shares with the engine are the engine's, mapped by the
    // table below: one status for each.
    pub fn bad_request(message: impl Into<String>) -> Self {
        EngineError::bad_request(message).into()
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        EngineError::too_large(message).into()
    }

    pub fn quota_exceeded(message: impl Into<String>) -> Self {
        EngineError::quota_exceeded(message).into()
    }

    /// An internal failure: logged in full here, answered without detail.
    pub fn internal(error_type: &'static str, detail: &str) -> Self {
        EngineError::internal(error_type, detail).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        sandcall_engine::telemetry::refused(self.error_type);
        let body = ErrorBody {
            error: self.message,
            error_type: self.error_type.to_string(),
            code: self.code.map(str::to_owned),
            retry_after_seconds: self.retry_after_s,
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

/// The status of each kind of engine failure: the one table.
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::TooMany => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
        ErrorKind::Timeout => StatusCode::REQUEST_TIMEOUT,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        ApiError {
            status: status_of(e.kind),
            error_type: e.error_type,
            message: e.message,
            retry_after_s: e.retry_after_s,
            code: e.code,
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthorized(message) => Self::new(StatusCode::UNAUTHORIZED, error_type::UNAUTHORIZED, message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind has its own status: two kinds that shared one would be one kind.
    #[test]
    fn each_kind_has_a_status_of_its_own() {
        let kinds = [
            ErrorKind::Invalid,
            ErrorKind::Unauthorized,
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::TooLarge,
            ErrorKind::TooMany,
            ErrorKind::InsufficientStorage,
            ErrorKind::Unavailable,
            ErrorKind::Upstream,
            ErrorKind::Timeout,
            ErrorKind::Internal,
        ];
        let statuses: std::collections::HashSet<_> = kinds.iter().map(|k| status_of(*k)).collect();
        assert_eq!(statuses.len(), kinds.len());
        let e = ApiError::from(EngineError::at_capacity(3));
        assert_eq!((e.status, e.retry_after_s), (StatusCode::SERVICE_UNAVAILABLE, Some(3)));
    }
}
