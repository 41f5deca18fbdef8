//! Connect's error bodies: the unary error JSON and the end-of-stream message of a stream.
//!
//! Both carry the same `Error` object (`{"code", "message", "details"}`); a unary call sends it
//! as the body of a non-200 answer, a stream as the `error` of its final envelope (the HTTP
//! status stays 200). Turning either into a workspace error goes through [`Code::error_kind`].

use std::collections::BTreeMap;
use std::fmt;

use sandbox_core::{ErrorKind, Operation};
use serde::{Deserialize, Deserializer, Serialize};

use crate::Code;
use crate::json;

json::message! {
    /// A Connect error: what a unary call answers with on failure and what a failed stream ends
    /// with.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize)]
    pub struct ConnectError {
        /// The code (required on the wire: `{}` and `{"code": null}` are refused).
        pub code: Code,
        /// A developer-facing message; omitted when empty.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub message: String,
        /// Typed details; omitted when empty.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "Vec::is_empty"
        )]
        pub details: Vec<ErrorDetail>,
    }
}

json::message! {
    /// One typed detail of a [`ConnectError`]: a protobuf message in binary form.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize)]
    pub struct ErrorDetail {
        /// The message's fully qualified protobuf name (`google.rpc.RetryInfo`).
        #[serde(rename = "type")]
        pub r#type: String,
        /// The binary protobuf message. Base64 on the wire: standard alphabet without padding when
        /// written (the Connect spec), any alphabet and padding when read.
        #[serde(with = "unpadded_base64")]
        pub value: Vec<u8>,
        /// The message as JSON, for people reading the wire; never to be relied upon.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub debug: Option<serde_json::Value>,
    }
}

mod unpadded_base64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::json::encode_base64_unpadded(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        crate::json::decode_base64(&text).map_err(|e| {
            serde::de::Error::custom(format_args!("invalid base64 in an error detail: {e}"))
        })
    }
}

/// Longest raw body text kept as the message of a non-Connect error answer: enough for any
/// proxy's error page summary, bounded so a stray HTML page does not become a log line.
const RAW_MESSAGE_LIMIT: usize = 512;

impl ConnectError {
    /// An error with a code and message and no details.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// Interprets a non-200 unary answer.
    ///
    /// A Connect error body (a JSON object whose `code` names a Connect code) is taken as it
    /// is. Anything else came from something in front of the server, or from envd's HTTP
    /// middleware (its 401 is `{"code": 401, "message": ...}`), so the code is inferred from
    /// the status ([`Code::from_http_status`]) and the message is the body's `message`
    /// string, else the body's text, else the status.
    pub fn from_unary_response(status: u16, body: &[u8]) -> ConnectError {
        let inferred = Code::from_http_status(status);
        let fallback_message = || {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                format!("HTTP {status}")
            } else {
                truncate(text, RAW_MESSAGE_LIMIT).to_owned()
            }
        };
        let Ok(serde_json::Value::Object(object)) = serde_json::from_slice(body) else {
            return ConnectError::new(inferred, fallback_message());
        };
        let message = object
            .get("message")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let code = object
            .get("code")
            .and_then(serde_json::Value::as_str)
            .and_then(Code::from_wire);
        match code {
            Some(code) => ConnectError {
                code,
                message: message.unwrap_or_default(),
                // Details that do not parse are dropped rather than losing the error itself.
                details: object
                    .get("details")
                    .and_then(|d| Vec::<ErrorDetail>::deserialize(d).ok())
                    .unwrap_or_default(),
            },
            None => ConnectError::new(inferred, message.unwrap_or_else(fallback_message)),
        }
    }

    /// Parses an error object (a unary error body once its status is known to be an error).
    pub fn from_json(body: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(body)
    }

    /// The JSON body of a unary error answer.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// The HTTP status a unary answer carrying this error uses.
    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// How the workspace classifies this error.
    pub fn error_kind(&self) -> ErrorKind {
        self.code.error_kind()
    }

    /// The workspace error for `operation`, classified by [`Code::error_kind`]. The message
    /// keeps the Connect code (`not_found: file not found`). Callers add the provider and, for
    /// unary answers, the HTTP status.
    pub fn to_core_error(&self, operation: Operation) -> sandbox_core::Error {
        sandbox_core::Error::new(self.error_kind(), operation, self.to_string())
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{}: {}", self.code, self.message)
        }
    }
}

impl std::error::Error for ConnectError {}

impl From<ConnectError> for ErrorKind {
    fn from(e: ConnectError) -> ErrorKind {
        e.error_kind()
    }
}

json::message! {
    /// The payload of a stream's final envelope: `{}` on success, the error on failure, and any
    /// trailing metadata.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    pub struct EndStreamMessage {
        /// The error, for a failed call. When present on the wire it must be an object with a
        /// code: `{"error": null}` and `{"error": {}}` are refused, as the spec says.
        #[serde(
            default,
            deserialize_with = "present_error",
            skip_serializing_if = "Option::is_none"
        )]
        pub error: Option<ConnectError>,
        /// Trailers: header name to values; omitted when empty.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "BTreeMap::is_empty"
        )]
        pub metadata: BTreeMap<String, Vec<String>>,
    }
}

fn present_error<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ConnectError>, D::Error> {
    ConnectError::deserialize(d).map(Some)
}

impl EndStreamMessage {
    /// The end of a successful stream (`{}`).
    pub fn ok() -> Self {
        EndStreamMessage::default()
    }

    /// The end of a failed stream.
    pub fn failed(error: ConnectError) -> Self {
        EndStreamMessage {
            error: Some(error),
            metadata: BTreeMap::new(),
        }
    }

    /// Parses the JSON payload of an end-of-stream envelope.
    pub fn from_json(payload: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(payload)
    }

    /// The JSON payload of an end-of-stream envelope.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// The stream's outcome: its trailers on success, its error on failure.
    pub fn into_result(self) -> Result<BTreeMap<String, Vec<String>>, ConnectError> {
        match self.error {
            None => Ok(self.metadata),
            Some(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn unary_bodies() {
        let check = |status: u16, body: &str, code: Code, message: &str| {
            let e = ConnectError::from_unary_response(status, body.as_bytes());
            assert_eq!(
                (e.code, e.message.as_str()),
                (code, message),
                "{status} {body}"
            );
        };
        check(
            404,
            r#"{"code":"not_found","message":"file not found"}"#,
            Code::NotFound,
            "file not found",
        );
        // The body's code wins over the status.
        check(500, r#"{"code":"unavailable"}"#, Code::Unavailable, "");
        // envd's HTTP middleware: integer code, so the status decides.
        check(
            401,
            r#"{"code":401,"message":"unauthorized access"}"#,
            Code::Unauthenticated,
            "unauthorized access",
        );
        // A code string naming no Connect code is malformed: the status decides.
        check(
            409,
            r#"{"code":"conflict","message":"m"}"#,
            Code::Unknown,
            "m",
        );
        check(502, "Bad Gateway\n", Code::Unavailable, "Bad Gateway");
        check(404, "", Code::Unimplemented, "HTTP 404");
        check(503, "[1,2]", Code::Unavailable, "[1,2]");
        let long = "x".repeat(2000);
        assert_eq!(
            ConnectError::from_unary_response(500, long.as_bytes())
                .message
                .len(),
            RAW_MESSAGE_LIMIT
        );
        assert_eq!(truncate("ééé", 3), "é");
    }

    #[test]
    fn into_core() {
        let e = ConnectError::new(Code::NotFound, "process with pid 7 not found");
        let core = e.to_core_error(Operation::EXEC);
        assert_eq!(core.kind(), ErrorKind::NotFound);
        assert_eq!(core.operation(), Operation::EXEC);
        assert_eq!(core.message(), "not_found: process with pid 7 not found");
        assert_eq!(ConnectError::new(Code::Aborted, "").to_string(), "aborted");
        assert_eq!(e.http_status(), 404);
    }

    #[test]
    fn end_stream_refusals() {
        for bad in [
            r#"{"error":null}"#,
            r#"{"error":{}}"#,
            r#"{"error":{"code":null}}"#,
            r#"{"error":{"code":5}}"#,
            r#"{"error":"internal"}"#,
            r#"[]"#,
            r#"{"metadata":{"a":"b"}}"#,
        ] {
            assert!(
                EndStreamMessage::from_json(bad.as_bytes()).is_err(),
                "{bad}"
            );
        }
        let ok = EndStreamMessage::from_json(br#"{"metadata":null,"extra":1}"#).unwrap();
        assert_eq!(ok, EndStreamMessage::ok());
        assert_eq!(ok.into_result().unwrap(), BTreeMap::new());
        let unknown = EndStreamMessage::from_json(br#"{"error":{"code":"teapot"}}"#).unwrap();
        assert_eq!(unknown.into_result().unwrap_err().code, Code::Unknown);
    }
}
