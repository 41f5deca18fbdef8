//! Connect error codes, their HTTP statuses, and what each means to the rest of the workspace.
//!
//! The mapping onto [`ErrorKind`] is the one place an envd failure is classified, so every
//! adapter speaking envd (E2B, Cube) decides the same way.
//!
//! One caution for callers: envd's `not_found` is about a *file or process* inside a sandbox,
//! never about the sandbox itself (a vanished sandbox shows up at the edge as 502 or as a
//! control-plane 404). It maps to [`ErrorKind::NotFound`] because that is what it means to the
//! caller of a file or process operation; code deciding a binding's fate must not feed it an
//! envd error.

use std::fmt;

use sandbox_core::ErrorKind;
use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};

/// A Connect error code (the gRPC status codes, snake_case on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    /// `canceled`: the call was canceled, usually by the caller.
    Canceled,
    /// `unknown`: no better code applies (also what an unrecognized code string reads as).
    Unknown,
    /// `invalid_argument`: the request is invalid whatever the system's state.
    InvalidArgument,
    /// `deadline_exceeded`: the deadline passed before the call completed.
    DeadlineExceeded,
    /// `not_found`: a file, directory or process does not exist.
    NotFound,
    /// `already_exists`: the thing to create exists.
    AlreadyExists,
    /// `permission_denied`: the caller may not do this.
    PermissionDenied,
    /// `resource_exhausted`: a quota or resource ran out.
    ResourceExhausted,
    /// `failed_precondition`: the system is not in the state the call needs.
    FailedPrecondition,
    /// `aborted`: a concurrency conflict; retry at a higher level.
    Aborted,
    /// `out_of_range`: past the valid range.
    OutOfRange,
    /// `unimplemented`: not implemented, supported or enabled.
    Unimplemented,
    /// `internal`: a broken invariant.
    Internal,
    /// `unavailable`: transiently unavailable; retry idempotent calls.
    Unavailable,
    /// `data_loss`: unrecoverable data loss.
    DataLoss,
    /// `unauthenticated`: missing or invalid credentials.
    Unauthenticated,
}

impl Code {
    /// Every code, in gRPC number order (1 to 16).
    pub const ALL: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The wire name (`not_found`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The code with this wire name.
    pub fn from_wire(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// The gRPC number (1 to 16).
    pub const fn number(self) -> u8 {
        match self {
            Code::Canceled => 1,
            Code::Unknown => 2,
            Code::InvalidArgument => 3,
            Code::DeadlineExceeded => 4,
            Code::NotFound => 5,
            Code::AlreadyExists => 6,
            Code::PermissionDenied => 7,
            Code::ResourceExhausted => 8,
            Code::FailedPrecondition => 9,
            Code::Aborted => 10,
            Code::OutOfRange => 11,
            Code::Unimplemented => 12,
            Code::Internal => 13,
            Code::Unavailable => 14,
            Code::DataLoss => 15,
            Code::Unauthenticated => 16,
        }
    }

    /// The HTTP status a unary error with this code is sent with (the Connect specification's
    /// table).
    pub const fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }

    /// The code a client infers from a non-200 unary answer without a Connect error body (the
    /// Connect specification's "HTTP to Error Code" table, the gRPC one).
    ///
    /// Deliberately not the inverse of [`Code::http_status`]: an answer without a Connect body
    /// came from something in front of envd (the edge proxy, a load balancer), so a bare 404
    /// means "no such route" (`unimplemented`), not "no such file" — and must never classify
    /// as `not_found`.
    pub const fn from_http_status(status: u16) -> Code {
        match status {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }

    /// How the workspace classifies a failure with this code.
    pub const fn error_kind(self) -> ErrorKind {
        match self {
            Code::NotFound => ErrorKind::NotFound,
            Code::Unauthenticated | Code::PermissionDenied => ErrorKind::Authentication,
            Code::InvalidArgument | Code::OutOfRange => ErrorKind::InvalidRequest,
            Code::Unimplemented => ErrorKind::Unsupported,
            Code::ResourceExhausted => ErrorKind::Capacity,
            // `canceled` from envd means its side of the call was torn down before it ended
            // (its own deadline, or shutdown): the caller's wait ran out as surely as with
            // `deadline_exceeded`. A caller that canceled on purpose never reads this error,
            // and neither kind lets a binding be replaced.
            Code::DeadlineExceeded | Code::Canceled => ErrorKind::Timeout,
            Code::Unavailable => ErrorKind::Unavailable,
            // The state of the sandbox (a symlink loop, a process in the wrong state) refused
            // the call, not its arguments: the caller's request clashes with what is there.
            Code::Aborted | Code::AlreadyExists | Code::FailedPrecondition => ErrorKind::Conflict,
            Code::Unknown | Code::Internal | Code::DataLoss => ErrorKind::Internal,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Code> for ErrorKind {
    fn from(code: Code) -> ErrorKind {
        code.error_kind()
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Reads a wire name. A string that names no code reads as [`Code::Unknown`] (the spec has no
/// user-defined codes, and `unknown` is its catch-all); anything but a string is an error.
impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Code;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Connect error code string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Code, E> {
                Ok(Code::from_wire(s).unwrap_or(Code::Unknown))
            }
        }
        deserializer.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        // (code, wire name, HTTP status, kind), straight from the Connect spec and the brief.
        let check = |code: Code, name: &str, status: u16, kind: ErrorKind| {
            assert_eq!(code.as_str(), name);
            assert_eq!(Code::from_wire(name), Some(code));
            assert_eq!(code.http_status(), status, "{name}");
            assert_eq!(code.error_kind(), kind, "{name}");
            assert_eq!(ErrorKind::from(code), kind);
        };
        use ErrorKind as K;
        check(Code::Canceled, "canceled", 499, K::Timeout);
        check(Code::Unknown, "unknown", 500, K::Internal);
        check(
            Code::InvalidArgument,
            "invalid_argument",
            400,
            K::InvalidRequest,
        );
        check(Code::DeadlineExceeded, "deadline_exceeded", 504, K::Timeout);
        check(Code::NotFound, "not_found", 404, K::NotFound);
        check(Code::AlreadyExists, "already_exists", 409, K::Conflict);
        check(
            Code::PermissionDenied,
            "permission_denied",
            403,
            K::Authentication,
        );
        check(
            Code::ResourceExhausted,
            "resource_exhausted",
            429,
            K::Capacity,
        );
        check(
            Code::FailedPrecondition,
            "failed_precondition",
            400,
            K::Conflict,
        );
        check(Code::Aborted, "aborted", 409, K::Conflict);
        check(Code::OutOfRange, "out_of_range", 400, K::InvalidRequest);
        check(Code::Unimplemented, "unimplemented", 501, K::Unsupported);
        check(Code::Internal, "internal", 500, K::Internal);
        check(Code::Unavailable, "unavailable", 503, K::Unavailable);
        check(Code::DataLoss, "data_loss", 500, K::Internal);
        check(
            Code::Unauthenticated,
            "unauthenticated",
            401,
            K::Authentication,
        );
        for (i, code) in Code::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(code.number()), i + 1);
        }
        assert_eq!(Code::from_wire("NOT_FOUND"), None);
    }

    #[test]
    fn http_inference() {
        let check = |status: u16, code: Code| assert_eq!(Code::from_http_status(status), code);
        check(400, Code::Internal);
        check(401, Code::Unauthenticated);
        check(403, Code::PermissionDenied);
        check(404, Code::Unimplemented);
        check(429, Code::Unavailable);
        check(502, Code::Unavailable);
        check(503, Code::Unavailable);
        check(504, Code::Unavailable);
        check(500, Code::Unknown);
        check(409, Code::Unknown);
        check(200, Code::Unknown);
        // A bare 404 must never look like "file not found" (it would classify as not_found).
        assert_ne!(
            Code::from_http_status(404).error_kind(),
            ErrorKind::NotFound
        );
    }
}
