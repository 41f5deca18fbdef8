//! The one error shape of the API: `{"error":{"code":"...","message":"..."}}`, with the status
//! and the machine-readable code derived from the core taxonomy in one place.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sandbox_core::{Error, ErrorCode, ErrorKind};
use serde_json::json;

/// An API error.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds a client should wait before trying again (`Retry-After`), for refusals that
    /// pass by themselves (a spent in-flight budget).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// A new error.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }
    /// The same error, telling the client to retry after `seconds`.
    #[must_use]
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }
    /// 401: no or a wrong bearer token.
    pub fn unauthorized() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )
    }
    /// 400 for a body or parameter the route cannot use.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }
}

/// The status and code of a core error. Specific codes first, then the kind; the operation
/// tells a store failure from a provider failure.
pub fn classify(err: &Error) -> (StatusCode, &'static str) {
    if let Some(code) = err.code() {
        let status = match code {
            ErrorCode::InvalidPath
            | ErrorCode::InvalidTimeout
            | ErrorCode::InvalidCommand
            | ErrorCode::InvalidBindingKey
            | ErrorCode::UnknownSandboxType
            | ErrorCode::ConfigIncomplete
            | ErrorCode::UnsafeOutboundUrl
            | ErrorCode::SecurityViolation
            | ErrorCode::ImageNotPresent
            | ErrorCode::NotARegularFile
            | ErrorCode::FileTooLarge => StatusCode::BAD_REQUEST,
            ErrorCode::SessionDeleted
            | ErrorCode::NoLiveSandbox
            | ErrorCode::SnapshotNotFound
            | ErrorCode::SandboxGone => StatusCode::NOT_FOUND,
            ErrorCode::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::SandboxPaused
            | ErrorCode::SessionRewindLocked
            | ErrorCode::SessionTurnActive
            | ErrorCode::SessionWorkActive => StatusCode::CONFLICT,
            ErrorCode::TerminalUnsupported | ErrorCode::DesktopUnsupported => {
                StatusCode::NOT_IMPLEMENTED
            }
            ErrorCode::BackendDisabled
            | ErrorCode::EgressProtectionUnavailable
            | ErrorCode::LockOwnershipLost => StatusCode::SERVICE_UNAVAILABLE,
            // A binding the store cannot read is our fault, not the caller's.
            ErrorCode::InvalidBinding => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        return (status, code.as_str());
    }
    let from_store = err.operation().as_str().starts_with("store.");
    match err.kind() {
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        ErrorKind::Terminal => (StatusCode::NOT_FOUND, "sandbox_gone"),
        ErrorKind::InvalidRequest => (StatusCode::BAD_REQUEST, "invalid_request"),
        ErrorKind::Unsupported => (StatusCode::NOT_IMPLEMENTED, "unsupported"),
        ErrorKind::Conflict => (StatusCode::CONFLICT, "conflict"),
        ErrorKind::Capacity => (StatusCode::TOO_MANY_REQUESTS, "capacity"),
        ErrorKind::Timeout => (
            StatusCode::GATEWAY_TIMEOUT,
            if from_store {
                "store_timeout"
            } else {
                "provider_timeout"
            },
        ),
        ErrorKind::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            if from_store {
                "store_unavailable"
            } else {
                "provider_unavailable"
            },
        ),
        // The provider refused *our* credentials: a deployment problem, not the caller's.
        ErrorKind::Authentication => (StatusCode::BAD_GATEWAY, "provider_authentication"),
        ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        let (status, code) = classify(&err);
        // Display is one line and scrubbed of credentials (sandbox_core::diagnostics).
        ApiError {
            status,
            code,
            message: err.to_string(),
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body was never read, so the server drops the connection after
            // this answer. Saying so keeps a client from pooling it and sending its next
            // request into a socket that is about to close.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::Operation;

    #[test]
    fn an_unread_body_closes_the_connection() {
        let too_large = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "over")
            .into_response();
        assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(too_large.headers()["connection"], "close");
        let bad = ApiError::bad_request("invalid_json", "x").into_response();
        assert!(bad.headers().get("connection").is_none());
    }

    #[test]
    fn codes_and_statuses() {
        let check = |err: Error, status: StatusCode, code: &str| {
            let (s, c) = classify(&err);
            assert_eq!((s, c), (status, code), "{err}");
        };
        check(
            Error::invalid_request(Operation::VALIDATE, "x").with_code(ErrorCode::InvalidPath),
            StatusCode::BAD_REQUEST,
            "invalid_path",
        );
        check(
            Error::conflict(Operation::OPEN_TERMINAL, "x").with_code(ErrorCode::SandboxPaused),
            StatusCode::CONFLICT,
            "session_sandbox_paused",
        );
        check(
            Error::unsupported(Operation::OPEN_TERMINAL, "x")
                .with_code(ErrorCode::TerminalUnsupported),
            StatusCode::NOT_IMPLEMENTED,
            "terminal_unsupported",
        );
        check(
            Error::unavailable(Operation::EXEC, "down"),
            StatusCode::SERVICE_UNAVAILABLE,
            "provider_unavailable",
        );
        check(
            Error::unavailable(Operation::new("store.get"), "down"),
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
        );
        check(
            Error::unsupported(Operation::VALIDATE, "x").with_code(ErrorCode::BackendDisabled),
            StatusCode::SERVICE_UNAVAILABLE,
            "backend_disabled",
        );
        check(
            Error::not_found(Operation::READ_FILE, "x"),
            StatusCode::NOT_FOUND,
            "not_found",
        );
        check(
            Error::new(ErrorKind::Authentication, Operation::CREATE, "x"),
            StatusCode::BAD_GATEWAY,
            "provider_authentication",
        );
    }
}
