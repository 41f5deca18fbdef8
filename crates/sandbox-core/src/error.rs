//! The one error type of the workspace and its provider-neutral taxonomy.
//!
//! Adapters keep private error enums and map them onto [`Error`] exactly once, at their boundary,
//! so the lifecycle coordinator can decide what to do with a failure without knowing which
//! backend produced it. The decision that matters most is [`Error::can_replace_binding`]: only
//! proof that a sandbox is gone may replace a session's binding; everything else (including
//! errors nobody classified) preserves it, because replacing a binding on a transient failure
//! silently destroys a user's workspace.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::diagnostics::scrub;
use crate::provider::Provider;

/// A `Result` whose error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Stable, provider-neutral classification of a failure.
///
/// Kinds deliberately collapse statuses that call for the same lifecycle decision; the original
/// HTTP status stays available in [`Error::http_status`] for diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The sandbox, file or path does not exist.
    NotFound,
    /// The sandbox is permanently gone (killed, crashed, terminated). Same lifecycle meaning as
    /// `NotFound`, kept apart for observability.
    Terminal,
    /// Bad or expired credentials.
    Authentication,
    /// The caller asked for something malformed or impossible (bad template, bad path, oversized
    /// payload). Not retryable.
    InvalidRequest,
    /// The backend does not implement the requested capability.
    Unsupported,
    /// Concurrent modification or a busy resource (state changed under us, snapshot in use, lock
    /// held by someone else).
    Conflict,
    /// Quota, rate limit or out of capacity.
    Capacity,
    /// A deadline elapsed before the backend answered. Distinct from a command that ran out of
    /// its execution timeout, which is a normal [`crate::ExecResult`] with `killed == true`.
    Timeout,
    /// The backend could not be reached or answered with a server error.
    Unavailable,
    /// Anything unclassified. Adapters narrow this whenever they can.
    Internal,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::NotFound,
        ErrorKind::Terminal,
        ErrorKind::Authentication,
        ErrorKind::InvalidRequest,
        ErrorKind::Unsupported,
        ErrorKind::Conflict,
        ErrorKind::Capacity,
        ErrorKind::Timeout,
        ErrorKind::Unavailable,
        ErrorKind::Internal,
    ];

    /// The stable wire name (`not_found`, `invalid_request`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Terminal => "terminal",
            ErrorKind::Authentication => "authentication",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Capacity => "capacity",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }

    /// Whether an error of this kind proves the bound sandbox is permanently gone.
    ///
    /// An allow-list on purpose: a kind added later, or one an adapter picked carelessly,
    /// preserves the binding rather than destroying a workspace.
    pub fn can_replace_binding(self) -> bool {
        matches!(self, ErrorKind::NotFound | ErrorKind::Terminal)
    }

    /// Classifies a provider's HTTP status for `operation`.
    ///
    /// A 404 on [`Operation::CREATE`] is `invalid_request`: the sandbox cannot be missing before
    /// it exists, so the thing the provider did not find is the template the caller named.
    pub fn from_http_status(operation: Operation, status: u16) -> ErrorKind {
        match status {
            400 | 422 => ErrorKind::InvalidRequest,
            401 | 403 => ErrorKind::Authentication,
            404 if operation == Operation::CREATE => ErrorKind::InvalidRequest,
            404 => ErrorKind::NotFound,
            408 | 504 => ErrorKind::Timeout,
            409 => ErrorKind::Conflict,
            410 => ErrorKind::Terminal,
            429 | 507 => ErrorKind::Capacity,
            500..=599 => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        }
    }

    /// The HTTP status this workspace's own API answers with for the kind.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::NotFound | ErrorKind::Terminal => 404,
            ErrorKind::Authentication => 401,
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Unsupported => 501,
            ErrorKind::Conflict => 409,
            ErrorKind::Capacity => 429,
            ErrorKind::Timeout => 504,
            ErrorKind::Unavailable => 503,
            ErrorKind::Internal => 500,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A machine-readable reason more specific than the kind, for conditions callers branch on
/// (an HTTP API turns it into its error code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// A sandbox path was relative, traversing or otherwise malformed.
    InvalidPath,
    /// A timeout was zero, negative, not a number or too large.
    InvalidTimeout,
    /// An exec request was malformed (shell form with arguments, empty program, bad env name).
    InvalidCommand,
    /// A binding key could not address sandbox state.
    InvalidBindingKey,
    /// A stored binding failed schema validation.
    InvalidBinding,
    /// A sandbox type or provider string is not one we know.
    UnknownSandboxType,
    /// A named config lacks fields its provider requires.
    ConfigIncomplete,
    /// A tenant-supplied endpoint is not an acceptable outbound destination.
    UnsafeOutboundUrl,
    /// A script failed security validation.
    SecurityViolation,
    /// The owning session no longer exists.
    SessionDeleted,
    /// A lookup-only operation found no sandbox bound to the session.
    NoLiveSandbox,
    /// The bound sandbox is not confirmed running and the caller did not allow a resume.
    SandboxPaused,
    /// The backend cannot open interactive terminals.
    TerminalUnsupported,
    /// The backend cannot relay a desktop.
    DesktopUnsupported,
    /// Another rewind holds the session.
    SessionRewindLocked,
    /// A chat turn holds the session, so a rewind must not start.
    SessionTurnActive,
    /// Background work is live in the session, so a rewind must not start.
    SessionWorkActive,
    /// Exclusive ownership of the session's lifecycle lock was lost.
    LockOwnershipLost,
    /// An operator has not enabled the requested backend.
    BackendDisabled,
    /// The network isolation a sandbox needs cannot be installed (not root, no iptables), so
    /// the sandbox is refused rather than started unprotected.
    EgressProtectionUnavailable,
    /// The image (template) is not present and the pull policy forbids fetching it.
    ImageNotPresent,
    /// The snapshot does not exist, or is not this tenant's snapshot in this namespace (the two
    /// answer alike, so the error reveals nothing about other tenants' snapshots).
    SnapshotNotFound,
    /// A per-tenant quota is spent; the message names the limit. Nothing was created.
    QuotaExceeded,
    /// A file read met something other than a regular file (a FIFO, a device, a directory, a
    /// symlink into a reserved tree): refused before any byte is read.
    NotARegularFile,
    /// A file is larger than the operation may return.
    FileTooLarge,
    /// The sandbox disappeared while the operation ran (removed, or died): the binding is
    /// dropped and the next provisioning call creates a new one.
    SandboxGone,
}

impl ErrorCode {
    /// The stable wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidPath => "invalid_path",
            ErrorCode::InvalidTimeout => "invalid_timeout",
            ErrorCode::InvalidCommand => "invalid_command",
            ErrorCode::InvalidBindingKey => "invalid_binding_key",
            ErrorCode::InvalidBinding => "invalid_binding",
            ErrorCode::UnknownSandboxType => "unknown_sandbox_type",
            ErrorCode::ConfigIncomplete => "config_incomplete",
            ErrorCode::UnsafeOutboundUrl => "unsafe_outbound_url",
            ErrorCode::SecurityViolation => "security_violation",
            ErrorCode::SessionDeleted => "session_deleted",
            ErrorCode::NoLiveSandbox => "no_live_sandbox",
            ErrorCode::SandboxPaused => "session_sandbox_paused",
            ErrorCode::TerminalUnsupported => "terminal_unsupported",
            ErrorCode::DesktopUnsupported => "desktop_unsupported",
            ErrorCode::SessionRewindLocked => "session_rewind_locked",
            ErrorCode::SessionTurnActive => "session_turn_active",
            ErrorCode::SessionWorkActive => "session_work_active",
            ErrorCode::LockOwnershipLost => "lock_ownership_lost",
            ErrorCode::BackendDisabled => "backend_disabled",
            ErrorCode::EgressProtectionUnavailable => "egress_protection_unavailable",
            ErrorCode::ImageNotPresent => "image_not_present",
            ErrorCode::SnapshotNotFound => "snapshot_not_found",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::NotARegularFile => "not_a_regular_file",
            ErrorCode::FileTooLarge => "file_too_large",
            ErrorCode::SandboxGone => "sandbox_gone",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name of the operation that failed (`create`, `exec`, `store.get`, ...).
///
/// A newtype over a static string rather than an enum so stores, transports and later layers can
/// name their own operations without editing this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Operation(&'static str);

impl Operation {
    /// Names an operation. Use a short snake_case verb phrase.
    pub const fn new(name: &'static str) -> Self {
        Operation(name)
    }
    /// The operation's name.
    pub const fn as_str(self) -> &'static str {
        self.0
    }

    pub const HEALTH: Operation = Operation("health");
    pub const CREATE: Operation = Operation("create");
    pub const CONNECT: Operation = Operation("connect");
    pub const CONNECT_SESSION: Operation = Operation("connect_session");
    pub const GET: Operation = Operation("get");
    pub const LIST: Operation = Operation("list");
    pub const DELETE: Operation = Operation("delete");
    pub const EXEC: Operation = Operation("exec");
    pub const WRITE_FILE: Operation = Operation("write_file");
    pub const READ_FILE: Operation = Operation("read_file");
    pub const LIST_DIR: Operation = Operation("list_dir");
    pub const MAKE_DIR: Operation = Operation("make_dir");
    pub const REMOVE: Operation = Operation("remove");
    pub const STAT: Operation = Operation("stat");
    pub const CREATE_SNAPSHOT: Operation = Operation("create_snapshot");
    pub const DELETE_SNAPSHOT: Operation = Operation("delete_snapshot");
    pub const LIST_SNAPSHOTS: Operation = Operation("list_snapshots");
    pub const LIST_TEMPLATES: Operation = Operation("list_templates");
    pub const ENSURE_TEMPLATE: Operation = Operation("ensure_template");
    pub const OPEN_TERMINAL: Operation = Operation("open_terminal");
    pub const TERMINAL_IO: Operation = Operation("terminal_io");
    pub const DIAL_DESKTOP: Operation = Operation("dial_desktop");
    pub const KEEP_ALIVE: Operation = Operation("keep_alive");
    /// Parsing or validating caller input before any backend is involved.
    pub const VALIDATE: Operation = Operation("validate");
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// The error every port returns: kind, optional code, provider, operation, message, HTTP status
/// and the original cause.
///
/// `Display` is one line without a trailing period, and never prints secrets: the message and
/// the cause go through [`crate::diagnostics::scrub`], which removes line breaks and redacts
/// credential-looking values, because error strings end up in logs.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    code: Option<ErrorCode>,
    provider: Option<Provider>,
    operation: Operation,
    message: String,
    http_status: Option<u16>,
    source: Option<Source>,
}

impl Error {
    /// A new error of `kind` raised by `operation`.
    pub fn new(kind: ErrorKind, operation: Operation, message: impl Into<String>) -> Self {
        Error {
            kind,
            code: None,
            provider: None,
            operation,
            message: message.into(),
            http_status: None,
            source: None,
        }
    }

    /// Classifies a provider's HTTP answer (see [`ErrorKind::from_http_status`]).
    pub fn from_http_status(
        provider: Provider,
        operation: Operation,
        status: u16,
        message: impl Into<String>,
    ) -> Self {
        Error::new(
            ErrorKind::from_http_status(operation, status),
            operation,
            message,
        )
        .with_provider(provider)
        .with_http_status(status)
    }

    /// Caller-side input error, refused before any backend is involved.
    pub fn invalid_request(operation: Operation, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidRequest, operation, message)
    }
    /// Shorthand for [`ErrorKind::NotFound`].
    pub fn not_found(operation: Operation, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotFound, operation, message)
    }
    /// Shorthand for [`ErrorKind::Unsupported`].
    pub fn unsupported(operation: Operation, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unsupported, operation, message)
    }
    /// Shorthand for [`ErrorKind::Internal`].
    pub fn internal(operation: Operation, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal, operation, message)
    }
    /// Shorthand for [`ErrorKind::Unavailable`].
    pub fn unavailable(operation: Operation, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unavailable, operation, message)
    }
    /// Shorthand for [`ErrorKind::Conflict`].
    pub fn conflict(operation: Operation, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Conflict, operation, message)
    }
    /// Shorthand for [`ErrorKind::Timeout`].
    pub fn timeout(operation: Operation, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Timeout, operation, message)
    }

    /// Attaches a machine-readable code.
    pub fn with_code(mut self, code: ErrorCode) -> Self {
        self.code = Some(code);
        self
    }
    /// Names the backend that produced the error.
    pub fn with_provider(mut self, provider: Provider) -> Self {
        self.provider = Some(provider);
        self
    }
    /// Records the provider's HTTP status.
    pub fn with_http_status(mut self, status: u16) -> Self {
        self.http_status = Some(status);
        self
    }
    /// Keeps the original cause, reachable through [`std::error::Error::source`].
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }
    /// Re-labels the operation, for layers that wrap a lower-level call.
    pub fn with_operation(mut self, operation: Operation) -> Self {
        self.operation = operation;
        self
    }

    /// The classification.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The machine-readable code, when one applies.
    pub fn code(&self) -> Option<ErrorCode> {
        self.code
    }
    /// The backend that produced the error, when known.
    pub fn provider(&self) -> Option<Provider> {
        self.provider
    }
    /// The operation that failed.
    pub fn operation(&self) -> Operation {
        self.operation
    }
    /// The human-readable summary, as given (not scrubbed; use `Display` for logs).
    pub fn message(&self) -> &str {
        &self.message
    }
    /// The provider's HTTP status, when the failure came from an HTTP answer.
    pub fn http_status(&self) -> Option<u16> {
        self.http_status
    }

    /// Whether this error proves the bound sandbox is permanently gone (allow-list: only
    /// `not_found` and `terminal`).
    pub fn can_replace_binding(&self) -> bool {
        self.kind.can_replace_binding()
    }

    /// One log line: `<kind> op=<operation> http=<status> <message>`, scrubbed of secrets.
    pub fn diagnostics(&self) -> String {
        let status = self
            .http_status
            .map_or_else(|| "-".to_owned(), |s| s.to_string());
        let mut line = format!("{} op={} http={}", self.kind, self.operation, status);
        if let Some(code) = self.code {
            line.push_str(" code=");
            line.push_str(code.as_str());
        }
        line.push(' ');
        line.push_str(&scrub(&self.message));
        line
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = self.provider.map_or("sandbox", Provider::as_str);
        write!(
            f,
            "{who} {}: {}: {}",
            self.operation,
            self.kind,
            scrub(&self.message)
        )?;
        if let Some(source) = &self.source {
            write!(f, ": {}", scrub(&source.to_string()))?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    // Debug is what `{:?}` and test failures print, so it goes through the same scrubbing as
    // Display instead of dumping raw fields.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("code", &self.code)
            .field("provider", &self.provider)
            .field("operation", &self.operation.as_str())
            .field("http_status", &self.http_status)
            .field("message", &scrub(&self.message))
            .field(
                "source",
                &self.source.as_ref().map(|s| scrub(&s.to_string())),
            )
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// Whether `err` proves the bound sandbox is gone. Anything that is not one of our [`Error`]s
/// (a bare I/O error, a cancellation) preserves the binding.
pub fn can_replace_binding(err: &(dyn std::error::Error + 'static)) -> bool {
    err.downcast_ref::<Error>()
        .is_some_and(Error::can_replace_binding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_not_found_and_terminal_replace_a_binding() {
        for kind in ErrorKind::ALL {
            let replace = Error::new(kind, Operation::CONNECT, "x").can_replace_binding();
            assert_eq!(
                replace,
                matches!(kind, ErrorKind::NotFound | ErrorKind::Terminal),
                "{kind}"
            );
        }
        // Errors that are not ours (a bare I/O error, a cancellation) preserve the binding.
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "not ours");
        assert!(!can_replace_binding(&io));
        let ours = Error::not_found(Operation::CONNECT, "gone");
        assert!(can_replace_binding(&ours));
    }

    #[test]
    fn http_status_table() {
        let check = |op: Operation, status: u16, want: ErrorKind| {
            assert_eq!(
                ErrorKind::from_http_status(op, status),
                want,
                "{op} {status}"
            );
        };
        check(Operation::GET, 400, ErrorKind::InvalidRequest);
        check(Operation::GET, 422, ErrorKind::InvalidRequest);
        check(Operation::GET, 401, ErrorKind::Authentication);
        check(Operation::GET, 403, ErrorKind::Authentication);
        check(Operation::GET, 404, ErrorKind::NotFound);
        check(Operation::CREATE, 404, ErrorKind::InvalidRequest);
        check(Operation::CONNECT, 404, ErrorKind::NotFound);
        check(Operation::GET, 408, ErrorKind::Timeout);
        check(Operation::GET, 504, ErrorKind::Timeout);
        check(Operation::GET, 409, ErrorKind::Conflict);
        check(Operation::GET, 410, ErrorKind::Terminal);
        check(Operation::GET, 429, ErrorKind::Capacity);
        check(Operation::GET, 507, ErrorKind::Capacity);
        check(Operation::GET, 500, ErrorKind::Unavailable);
        check(Operation::GET, 502, ErrorKind::Unavailable);
        check(Operation::GET, 418, ErrorKind::Internal);
        check(Operation::GET, 302, ErrorKind::Internal);
        let e =
            Error::from_http_status(Provider::E2b, Operation::CREATE, 404, "template not found");
        assert_eq!(e.kind(), ErrorKind::InvalidRequest);
        assert_eq!(e.http_status(), Some(404));
        assert_eq!(e.provider(), Some(Provider::E2b));
    }

    #[test]
    fn display_is_one_line_keeps_the_cause_and_hides_secrets() {
        let cause = std::io::Error::other("connection reset\nby peer");
        let e = Error::unavailable(
            Operation::EXEC,
            "request failed: Authorization: Bearer sk-live-123",
        )
        .with_provider(Provider::Cube)
        .with_http_status(503)
        .with_source(cause);
        let text = e.to_string();
        assert_eq!(
            text,
            "cube exec: unavailable: request failed: Authorization: Bearer [redacted]: connection reset by peer"
        );
        assert!(!text.contains('\n') && !text.ends_with('.'));
        assert!(!format!("{e:?}").contains("sk-live-123"));
        assert_eq!(
            e.diagnostics(),
            "unavailable op=exec http=503 request failed: Authorization: Bearer [redacted]"
        );
        let source = std::error::Error::source(&e).expect("cause retained");
        assert!(source.to_string().contains("connection reset"));
        let coded =
            Error::invalid_request(Operation::VALIDATE, "bad").with_code(ErrorCode::InvalidPath);
        assert_eq!(
            coded.diagnostics(),
            "invalid_request op=validate http=- code=invalid_path bad"
        );
        assert_eq!(coded.to_string(), "sandbox validate: invalid_request: bad");
    }

    #[test]
    fn kind_and_code_wire_names() {
        for kind in ErrorKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
            assert!((400..600).contains(&kind.http_status()));
        }
        assert_eq!(ErrorCode::SandboxPaused.as_str(), "session_sandbox_paused");
        assert_eq!(
            serde_json::to_value(ErrorCode::InvalidPath).unwrap(),
            "invalid_path"
        );
    }
}
