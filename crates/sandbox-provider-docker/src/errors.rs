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
        BollardError::HyperResponseError { .. } | BollardError::HyperLegacyError { .. } => {
            return connection_failure(op, err);
        }
        BollardError::JsonDataError { .. } | BollardError::JsonSerdeError { .. } => (
            ErrorKind::Internal,
            None,
            format!("unexpected answer from the Docker engine: {err}"),
        ),
        _ => (ErrorKind::Internal, None, err.to_string()),
    };
    // The engine refuses every exec (and so every exec-plane call) on a paused container:
    // said with the code that tells a caller a resume would help ([pause.refused]).
    let paused = status == Some(409) && message.to_ascii_lowercase().contains("is paused");
    let mapped = Error::new(kind, op, message).with_provider(Provider::Docker);
    let mapped = match status {
        Some(status) => mapped.with_http_status(status),
        None => mapped,
    };
    let mapped = if paused {
        mapped.with_code(sandbox_core::ErrorCode::SandboxPaused)
    } else {
        mapped
    };
    mapped.with_source(err)
}

/// Maps a failure to reach the engine or to keep a connection to it, by its cause: a refusal of
/// the outbound guard stays itself (`invalid_request`, `unsafe_outbound_url`: retrying cannot
/// help); a certificate one side does not accept is `authentication`; anything else is
/// `unavailable` (the engine may come back). The message names the causes: hyper's own
/// ("client error (Connect)", shown as the source) names none of them.
pub fn connection_failure<E>(op: Operation, err: E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    if let Some(refusal) = find::<Error>(&err) {
        return refusal.clone().with_provider(Provider::Docker);
    }
    let (kind, what) = match find::<rustls::Error>(&err) {
        Some(tls) if is_certificate_problem(tls) => (
            ErrorKind::Authentication,
            "TLS with the Docker engine failed (the daemon's certificate must be issued by \
             ca.pem, and the daemon must accept cert.pem)",
        ),
        _ => (ErrorKind::Unavailable, "cannot reach the Docker engine"),
    };
    let causes = causes(&err);
    let message = if causes.is_empty() {
        what.to_owned()
    } else {
        format!("{what}: {causes}")
    };
    provider_error(kind, op, message).with_source(err)
}

/// The first `T` in `err`'s chain of causes, looking inside `io::Error`s too (whose `source`
/// skips the error they wrap, which is where TLS and connector errors travel).
fn find<'a, T: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

fn is_certificate_problem(err: &rustls::Error) -> bool {
    use rustls::AlertDescription as Alert;
    match err {
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => true,
        rustls::Error::AlertReceived(alert) => matches!(
            alert,
            Alert::BadCertificate
                | Alert::UnsupportedCertificate
                | Alert::CertificateRevoked
                | Alert::CertificateExpired
                | Alert::CertificateUnknown
                | Alert::UnknownCA
                | Alert::CertificateRequired
                | Alert::AccessDenied
        ),
        _ => false,
    }
}

/// The causes of `err` (not `err` itself, which is the source) on one line, each said once.
fn causes(err: &(dyn std::error::Error + 'static)) -> String {
    let top = err.to_string();
    let mut out = String::new();
    let mut next = err.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !top.contains(&text) && !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        next = e.source();
    }
    out
}

/// Whether an engine answer says the container is not running (exec on a stopped container).
pub fn is_not_running(err: &Error) -> bool {
    err.http_status() == Some(409)
        && err
            .message()
            .to_ascii_lowercase()
            .contains("is not running")
}

/// Whether an engine answer says the container is paused (exec refused until it is unpaused).
pub fn is_paused(err: &Error) -> bool {
    err.http_status() == Some(409) && err.message().to_ascii_lowercase().contains("is paused")
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

    /// What hyper-util hands back: its own one-line message, the cause as the source.
    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("client error (Connect)")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn connection_failures_map_by_their_cause() {
        let check = |cause: std::io::Error, kind: ErrorKind, shows: &str| {
            let e = connection_failure(Operation::CREATE, Wrapped(cause));
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.to_string().contains(shows), "{shows}: {e}");
            e
        };
        let tls = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        // The guard's refusal travels inside an io::Error, whose `source` skips it.
        let refusal = sandbox_transport::policy::refused("address 169.254.169.254 is metadata");
        assert_eq!(refusal.origin(), sandbox_core::Origin::Transport);
        let e = check(
            std::io::Error::other(refusal),
            ErrorKind::InvalidRequest,
            "169.254.169.254",
        );
        assert_eq!(e.code(), Some(sandbox_core::ErrorCode::UnsafeOutboundUrl));
        // The adapter dialled its own daemon: it claims the transport's refusal.
        assert_eq!(e.origin(), sandbox_core::Origin::Provider(Provider::Docker));
        check(
            tls(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
            ErrorKind::Authentication,
            "UnknownIssuer",
        );
        check(
            tls(rustls::Error::AlertReceived(
                rustls::AlertDescription::CertificateRequired,
            )),
            ErrorKind::Authentication,
            "ca.pem",
        );
        // Not a certificate matter: a daemon that does not speak TLS, a refused connection.
        let e = check(
            tls(rustls::Error::General("corrupt message".into())),
            ErrorKind::Unavailable,
            "corrupt message",
        );
        assert_eq!(e.code(), None);
        check(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            ErrorKind::Unavailable,
            "cannot reach the Docker engine: connection refused: client error (Connect)",
        );
    }
}
