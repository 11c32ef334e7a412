//! What the engine answers when it refuses or fails: a kind (what the failure means to the
//! caller), the stable `error_type` of the wire, and a message that never holds host paths
//! or internals. The engine knows no HTTP: the server maps each kind to a status in one
//! table (`sandcall_server::error`).

use sandcall_api::error_type;

/// What a refusal or failure means to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or asks for what cannot be: nothing was done.
    Invalid,
    /// The credentials (a continuation token's, say) do not allow this.
    Unauthorized,
    /// No such session, file or workspace for this caller.
    NotFound,
    /// The thing is there, but in a state that does not allow this now.
    Conflict,
    /// The request, or what it would store, is larger than a limit.
    TooLarge,
    /// The caller holds as much as its own cap allows.
    TooMany,
    /// Storing this would take the caller over its quota, or the disk is full.
    InsufficientStorage,
    /// The server, or a store it needs, cannot take this now; retrying later may pass.
    Unavailable,
    /// A server the engine relies on for this (an MCP tool server) failed.
    Upstream,
    /// The request took longer than it may.
    Timeout,
    /// A failure inside the server, logged in full where it happened.
    Internal,
}

/// A refusal or failure of the engine, answered to the client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct EngineError {
    pub kind: ErrorKind,
    pub error_type: &'static str,
    pub message: String,
    pub retry_after_s: Option<u64>,
    /// `ErrorBody::code`, where one applies.
    pub code: Option<&'static str>,
}

impl EngineError {
    pub fn new(kind: ErrorKind, error_type: &'static str, message: impl Into<String>) -> Self {
        EngineError {
            kind,
            error_type,
            message: message.into(),
            retry_after_s: None,
            code: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, error_type::INVALID_REQUEST, message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::TooLarge, error_type::PAYLOAD_TOO_LARGE, message)
    }

    pub fn at_capacity(retry_after_s: u64) -> Self {
        EngineError {
            retry_after_s: Some(retry_after_s),
            ..Self::new(
                ErrorKind::Unavailable,
                error_type::AT_CAPACITY,
                "all sandboxes are busy and the queue is full; retry later",
            )
        }
    }

    /// The principal holds as much as its own cap allows; `message` says which cap.
    pub fn principal_at_capacity(message: impl Into<String>) -> Self {
        EngineError {
            retry_after_s: Some(1),
            ..Self::new(ErrorKind::TooMany, error_type::PRINCIPAL_AT_CAPACITY, message)
        }
    }

    /// Storing this would take the principal over its quota; `message` says which.
    pub fn quota_exceeded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InsufficientStorage, error_type::QUOTA_EXCEEDED, message)
    }

    /// The session store (Redis) cannot be reached; logged in full here, answered
    /// without detail. Nothing was changed: the same request may be retried.
    pub fn store_unavailable(detail: &str) -> Self {
        Self::unavailable(
            "the session store is unavailable now; nothing was changed, retry later",
            detail,
        )
    }

    /// The file store (S3) could not be reached or did not answer; logged in full here,
    /// answered without detail. No file is half stored: the same request may be retried.
    pub fn file_store_unavailable(detail: &str) -> Self {
        Self::unavailable("the file store cannot be reached now; retry later", detail)
    }

    fn unavailable(message: &'static str, detail: &str) -> Self {
        tracing::warn!(detail, "{message}");
        EngineError {
            retry_after_s: Some(1),
            ..Self::new(ErrorKind::Unavailable, error_type::STORE_UNAVAILABLE, message)
        }
    }

    /// An internal failure: logged in full here, answered without detail.
    pub fn internal(error_type: &'static str, detail: &str) -> Self {
        tracing::error!(error_type, detail, "internal error");
        Self::new(
            ErrorKind::Internal,
            error_type,
            "the server could not complete the request",
        )
    }
}
