//! The one error shape of the API: `{"error":{"code":"...","message":"..."}}`, with the status
//! and the machine-readable code derived from the core taxonomy in one place.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sandbox_core::{Error, Origin};

use crate::api;

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
    /// The body of the answer, in the API's error shape.
    pub fn body(self) -> api::ErrorResponse {
        api::ErrorResponse {
            error: api::ErrorBody {
                code: self.code.to_owned(),
                message: self.message,
            },
        }
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

/// Whether an error is reported as the binding store's (`store_*`, the store metric family) or
/// as the backend's (`provider_*`). Only the error's origin decides, never its operation's
/// name. Everything that is not the store's is the backend's: a transport failure is the way
/// to a provider failing, a caller's input is refused before it reaches either (and has its
/// own codes), and an error nobody attributed is reported as the backend's, as it always was.
pub(crate) fn from_store(err: &Error) -> bool {
    match err.origin() {
        Origin::Store => true,
        Origin::Provider(_) | Origin::Transport | Origin::Caller | Origin::Unspecified => false,
    }
}

/// The status and code of a core error: core's one table (`Error::status_and_code`), which
/// the envd router answers with too.
pub fn classify(err: &Error) -> (StatusCode, &'static str) {
    let (status, code) = err.status_and_code();
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        code,
    )
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
        let (status, retry_after) = (self.status, self.retry_after);
        let mut response = (status, Json(self.body())).into_response();
        if let Some(seconds) = retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE {
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
    use sandbox_core::{ErrorCode, ErrorKind, Operation, Provider};

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
            Error::unavailable(Operation::GET, "down").with_origin(Origin::Store),
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
        );
        check(
            Error::timeout(Operation::new("lock_lifecycle"), "slow").with_origin(Origin::Store),
            StatusCode::GATEWAY_TIMEOUT,
            "store_timeout",
        );
        check(
            Error::timeout(Operation::EXEC, "slow").with_provider(Provider::Docker),
            StatusCode::GATEWAY_TIMEOUT,
            "provider_timeout",
        );
        check(
            Error::unavailable(Operation::new("dial"), "refused").with_origin(Origin::Transport),
            StatusCode::SERVICE_UNAVAILABLE,
            "provider_unavailable",
        );
        check(
            Error::unsupported(Operation::VALIDATE, "x").with_code(ErrorCode::BackendDisabled),
            StatusCode::SERVICE_UNAVAILABLE,
            "backend_disabled",
        );
        // The background-process and watch codes (issue 17): each has its own status, never
        // the catch-all 500.
        for (code, status) in [
            (ErrorCode::ProcessNotFound, StatusCode::NOT_FOUND),
            (ErrorCode::ProcessExited, StatusCode::CONFLICT),
            (ErrorCode::StdinClosed, StatusCode::CONFLICT),
            (ErrorCode::ProcessTagInUse, StatusCode::CONFLICT),
            (ErrorCode::InvalidSignal, StatusCode::BAD_REQUEST),
            (ErrorCode::InvalidOffset, StatusCode::BAD_REQUEST),
            (ErrorCode::NotADirectory, StatusCode::BAD_REQUEST),
            (ErrorCode::WatchOverflow, StatusCode::TOO_MANY_REQUESTS),
            (ErrorCode::ProcessLimit, StatusCode::TOO_MANY_REQUESTS),
        ] {
            check(
                Error::conflict(Operation::ATTACH_PROCESS, "x").with_code(code),
                status,
                code.as_str(),
            );
        }
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

    /// The origin decides store or provider; the operation's name does not, whatever it says.
    #[test]
    fn the_origin_decides_not_the_operation_name() {
        // The form the old rule read ("store." prefix). The operation scheme keeps it out of
        // the code (tidy checks `Operation::new` literals); this test needs it on purpose.
        const STORE_PREFIXED: &str = "store.get";
        let store_named = Operation::new(STORE_PREFIXED);
        let cases = [
            // A store error whose operation does not look like a store's.
            (
                Error::unavailable(Operation::EXEC, "redis down").with_origin(Origin::Store),
                "store_unavailable",
            ),
            (
                Error::timeout(Operation::CREATE, "redis slow").with_origin(Origin::Store),
                "store_timeout",
            ),
            // A provider error whose operation is named like a store's.
            (
                Error::unavailable(store_named, "engine down").with_provider(Provider::Docker),
                "provider_unavailable",
            ),
            (
                Error::timeout(store_named, "engine slow").with_provider(Provider::E2b),
                "provider_timeout",
            ),
            // Nobody said: the backend's, as before.
            (
                Error::unavailable(store_named, "down"),
                "provider_unavailable",
            ),
        ];
        for (err, code) in cases {
            assert_eq!(classify(&err).1, code, "{err}");
        }
    }
}
