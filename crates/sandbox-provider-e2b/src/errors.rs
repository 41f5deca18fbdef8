//! The one mapping from E2B's failures onto `sandbox_core::Error`.
//!
//! - **Control-plane answers.** A status is classified by
//!   [`ErrorKind::from_http_status`] for the operation (a 404 on create is the template, so
//!   `invalid_request`; elsewhere `not_found`; 410 `terminal`; 429 and 507 `capacity`; 408
//!   and 504 `timeout`; any other 5xx `unavailable`), and the message is the body's `message`
//!   (E2B's `{"code", "message"}`), bounded. Deleting a snapshot or a template that something
//!   still uses is `conflict`, whatever status the plane chose (E2B answers 400).
//! - **No answer.** A refused, reset or unresolvable connection is `unavailable`; a route
//!   deadline that passed is `timeout`. Neither ever lets a binding be replaced: only
//!   `not_found` and `terminal` do, and they come only from an answer that says so.
//! - **envd.** The envd client classifies its own failures (Connect codes, cut streams) and
//!   claims them for this provider ([`sandbox_transport::EnvdConfig::with_provider`]); this
//!   module only adds the file-service rules ([`is_dir_exists`]).
//! - **Whose.** Everything here carries `Origin::Provider(Provider::E2b)`.

use sandbox_core::{Error, ErrorKind, Operation, Provider};

/// The longest message kept from an error body: enough for any E2B message, bounded so a
/// misbehaving plane cannot make an error cost memory or flood a log line.
pub const MESSAGE_LIMIT: usize = 1024;

/// Claims `error` for this provider (every error the adapter returns goes through here or
/// [`http_error`]).
pub(crate) fn provider_error(error: Error) -> Error {
    error.with_provider(Provider::E2b)
}

/// The message of an E2B error body (`{"code": 404, "message": "..."}`), or the body itself
/// as text when it is not that shape; bounded to [`MESSAGE_LIMIT`] characters.
pub fn body_message(body: &[u8]) -> String {
    let parsed = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned));
    let text = match parsed {
        Some(message) => message,
        None => String::from_utf8_lossy(body).trim().to_owned(),
    };
    let mut out: String = text.chars().take(MESSAGE_LIMIT).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// Whether a delete of a snapshot or template failed because something still uses it (E2B
/// answers such a delete 400, with one of these phrases).
fn still_referenced(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("paused sandbox")
        || m.contains("sandboxes using")
        || (m.contains("cannot delete template") && m.contains("using it"))
}

/// The error for a control-plane answer of `status` to `op`, whose body is `body`.
pub fn http_error(op: Operation, status: u16, body: &[u8]) -> Error {
    let message = body_message(body);
    let mut kind = ErrorKind::from_http_status(op, status);
    let deletes = op == Operation::DELETE_SNAPSHOT || op == Operation::DELETE_TEMPLATE;
    if deletes && (kind == ErrorKind::Conflict || still_referenced(&message)) {
        kind = ErrorKind::Conflict;
    }
    let shown = if message.is_empty() {
        format!("the control plane answered {status}")
    } else {
        format!("the control plane answered {status}: {message}")
    };
    provider_error(Error::new(kind, op, shown).with_http_status(status))
}

/// Whether a `make_dir` failure says the directory is already there (which `make_dir`
/// callers take as success).
pub fn is_dir_exists(error: &Error) -> bool {
    let m = error.message().to_ascii_lowercase();
    m.contains("directory already exists")
        || (error.kind() == ErrorKind::Conflict && m.contains("already exists"))
}

/// A control-plane answer that could not be read as what `op` expects.
pub(crate) fn unreadable(op: Operation, what: impl std::fmt::Display) -> Error {
    provider_error(Error::internal(
        op,
        format!("the control plane's answer is unreadable: {what}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::Origin;

    /// Every status the plane answers × the operations where it means something different.
    #[test]
    fn statuses_map_per_operation() {
        use ErrorKind::*;
        let rows: &[(u16, Operation, ErrorKind)] = &[
            (400, Operation::CREATE, InvalidRequest),
            (422, Operation::LIST, InvalidRequest),
            (401, Operation::GET, Authentication),
            (403, Operation::DELETE, Authentication),
            // A create cannot miss the sandbox: what is missing is the template.
            (404, Operation::CREATE, InvalidRequest),
            (404, Operation::CONNECT, NotFound),
            (404, Operation::GET, NotFound),
            (404, Operation::DELETE, NotFound),
            (404, Operation::KEEP_ALIVE, NotFound),
            (408, Operation::CREATE, Timeout),
            (504, Operation::CONNECT, Timeout),
            (409, Operation::PAUSE, Conflict),
            (410, Operation::CONNECT, Terminal),
            (429, Operation::CREATE, Capacity),
            (507, Operation::CREATE_SNAPSHOT, Capacity),
            (500, Operation::CONNECT, Unavailable),
            (502, Operation::GET, Unavailable),
            (503, Operation::CREATE, Unavailable),
            (418, Operation::LIST, Internal),
            // "Still referenced" is a conflict whatever the status.
            (409, Operation::DELETE_SNAPSHOT, Conflict),
        ];
        for &(status, op, kind) in rows {
            let e = http_error(op, status, br#"{"code":1,"message":"m"}"#);
            assert_eq!(e.kind(), kind, "{status} on {op}");
            assert_eq!(e.http_status(), Some(status));
            assert_eq!(e.origin(), Origin::Provider(Provider::E2b));
            assert_eq!(e.operation(), op);
        }
        // Only a plane's own "gone" answers may replace a binding; a 5xx never does.
        for status in [500, 502, 503, 504, 408, 429] {
            for op in [Operation::CONNECT, Operation::GET, Operation::EXEC] {
                assert!(!http_error(op, status, b"").can_replace_binding());
            }
        }
        assert!(http_error(Operation::CONNECT, 404, b"").can_replace_binding());
        assert!(!http_error(Operation::CREATE, 404, b"").can_replace_binding());
    }

    #[test]
    fn still_referenced_deletes_are_conflicts() {
        for message in [
            "cannot delete template 'x': there are paused sandboxes using it",
            "snapshot is used by a paused sandbox",
            "there are sandboxes using this template",
        ] {
            let body = serde_json::json!({"code": 400, "message": message}).to_string();
            for op in [Operation::DELETE_SNAPSHOT, Operation::DELETE_TEMPLATE] {
                let e = http_error(op, 400, body.as_bytes());
                assert_eq!(e.kind(), ErrorKind::Conflict, "{op}: {message}");
            }
            // The same words on another operation mean nothing special.
            let e = http_error(Operation::CREATE, 400, body.as_bytes());
            assert_eq!(e.kind(), ErrorKind::InvalidRequest);
        }
        let plain = http_error(Operation::DELETE_SNAPSHOT, 400, b"{\"message\":\"bad id\"}");
        assert_eq!(plain.kind(), ErrorKind::InvalidRequest);
    }

    #[test]
    fn messages_come_from_the_body_and_are_bounded() {
        let e = http_error(
            Operation::GET,
            404,
            br#"{"code":404,"message":"sandbox x not found"}"#,
        );
        assert!(e.message().ends_with("sandbox x not found"), "{e}");
        let e = http_error(Operation::GET, 502, b"<html>bad gateway</html>");
        assert!(e.message().contains("<html>bad gateway</html>"), "{e}");
        let long = "x".repeat(100_000);
        let e = http_error(Operation::GET, 500, long.as_bytes());
        assert!(
            e.message().len() < MESSAGE_LIMIT + 100,
            "{}",
            e.message().len()
        );
        assert!(
            http_error(Operation::GET, 500, b"")
                .message()
                .contains("answered 500")
        );
    }

    #[test]
    fn an_existing_directory_is_recognised() {
        let yes = Error::conflict(Operation::MAKE_DIR, "path already exists");
        assert!(is_dir_exists(&yes));
        let yes = Error::invalid_request(Operation::MAKE_DIR, "Directory already exists: /a");
        assert!(is_dir_exists(&yes));
        let no = Error::invalid_request(Operation::MAKE_DIR, "path already exists");
        assert!(!is_dir_exists(&no));
    }
}
