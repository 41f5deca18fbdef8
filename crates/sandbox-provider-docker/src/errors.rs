//! Mapping bollard errors onto the core taxonomy, exactly once, at this boundary.

use bollard::errors::Error as BollardError;
use sandbox_core::{Error, ErrorKind, Operation, Provider};

/// Maps a bollard error raised by `op`.
///
/// Engine answers carry an HTTP status and map through [`ErrorKind::from_http_status`] (404 on
/// create means the image, not the container, is missing). A socket that is missing, refused or
/// timed out is `unavailable`/`timeout`: the engine may come back, and a binding must survive
/// that.
pub fn map(op: Operation, err: BollardError) -> Error {
    let (kind, status, message) = match &err {
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } => (
            ErrorKind::from_http_status(op, *status_code),
            Some(*status_code),
            message.clone(),
        ),
        BollardError::RequestTimeoutError => (
            ErrorKind::Timeout,
            None,
            "the Docker engine did not answer in time".to_owned(),
        ),
        BollardError::SocketNotFoundError(path) => (
            ErrorKind::Unavailable,
            None,
            format!("the Docker socket {path} does not exist (is dockerd running?)"),
        ),
        BollardError::IOError { err } if err.kind() == std::io::ErrorKind::PermissionDenied => (
            ErrorKind::Authentication,
            None,
            format!("permission denied on the Docker socket: {err}"),
        ),
        BollardError::IOError { err } => (
            ErrorKind::Unavailable,
            None,
            format!("Docker engine I/O error: {err}"),
        ),
        BollardError::HyperResponseError { .. } | BollardError::HyperLegacyError { .. } => (
            ErrorKind::Unavailable,
            None,
            format!("Docker engine connection failed: {err}"),
        ),
        BollardError::JsonDataError { .. } | BollardError::JsonSerdeError { .. } => (
            ErrorKind::Internal,
            None,
            format!("unexpected answer from the Docker engine: {err}"),
        ),
        _ => (ErrorKind::Internal, None, err.to_string()),
    };
    let mapped = Error::new(kind, op, message).with_provider(Provider::Docker);
    let mapped = match status {
        Some(status) => mapped.with_http_status(status),
        None => mapped,
    };
    mapped.with_source(err)
}

/// Whether an engine answer says the container is not running (exec on a stopped container).
pub fn is_not_running(err: &Error) -> bool {
    err.http_status() == Some(409)
        && err
            .message()
            .to_ascii_lowercase()
            .contains("is not running")
}

/// A `not_found` for a sandbox this adapter does not own or cannot find. Foreign containers are
/// reported exactly like missing ones, so IDs of the host's other containers leak nothing.
pub fn no_such_sandbox(op: Operation, id: &str) -> Error {
    Error::not_found(op, format!("no sandbox {id}")).with_provider(Provider::Docker)
}

/// An error about the provider itself (not an engine answer).
pub fn provider_error(kind: ErrorKind, op: Operation, message: impl Into<String>) -> Error {
    Error::new(kind, op, message).with_provider(Provider::Docker)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(status: u16, message: &str) -> BollardError {
        BollardError::DockerResponseServerError {
            status_code: status,
            message: message.to_owned(),
        }
    }

    #[test]
    fn engine_answers_map_by_status_and_operation() {
        let check = |op, err, kind| assert_eq!(map(op, err).kind(), kind);
        check(
            Operation::GET,
            server(404, "No such container: x"),
            ErrorKind::NotFound,
        );
        check(
            Operation::CREATE,
            server(404, "No such image: x"),
            ErrorKind::InvalidRequest,
        );
        check(
            Operation::EXEC,
            server(409, "Container x is not running"),
            ErrorKind::Conflict,
        );
        check(
            Operation::CREATE,
            server(500, "driver failed"),
            ErrorKind::Unavailable,
        );
        check(
            Operation::GET,
            BollardError::RequestTimeoutError,
            ErrorKind::Timeout,
        );
        check(
            Operation::GET,
            BollardError::SocketNotFoundError("/x.sock".into()),
            ErrorKind::Unavailable,
        );
        let e = map(Operation::EXEC, server(409, "Container abc is not running"));
        assert!(is_not_running(&e));
        assert_eq!(e.http_status(), Some(409));
        assert_eq!(e.provider(), Some(Provider::Docker));
    }
}
