//! The one error type of the workspace and its provider-neutral taxonomy.
//!
//! Adapters keep private error enums and map them onto [`Error`] exactly once, at their boundary,
//! so the lifecycle coordinator can decide what to do with a failure without knowing which
//! backend produced it. The decision that matters most is [`Error::can_replace_binding`]: only
//! proof that a sandbox is gone may replace a session's binding; everything else (including
//! errors nobody classified) preserves it, because replacing a binding on a transient failure
//! silently destroys a user's workspace.
//!
//! # Where an error came from
//!
//! Every error carries an [`Origin`]: the component that failed. It is data, set where the
//! error is made, and it is the only thing that says "store or provider": the HTTP layer picks
//! `store_unavailable` over `provider_unavailable` and the metric family by it, never by the
//! operation's name.
//!
//! - [`Origin::Provider`]: set by [`Error::with_provider`] (and [`Error::from_http_status`]), so
//!   every adapter that names itself on its errors says where they came from. A provider that
//!   passes on a transport error claims it the same way.
//! - [`Origin::Store`]: set by every binding store on every error it returns, including the
//!   lifecycle lock's [`crate::ownership::ownership_lost`].
//! - [`Origin::Transport`]: set by `sandbox-transport` on what it builds (a refused endpoint, a
//!   failed dial, an envd client without a provider); a provider claims them at its boundary.
//! - [`Origin::Caller`]: set by [`Error::invalid_input`], which the constructors in this crate
//!   that validate what a request carries use, before any backend is involved: IDs (`ids`),
//!   sandbox paths and the workspace's write rules (`path`, `policy::workspace`), exec specs with
//!   their env names and timeouts (`exec`, `sandbox`); the script validator in
//!   `sandbox-session::policy` uses it too.
//!   Validation of what was *not* caller input (configuration, stored bindings, timestamps) uses
//!   [`Error::invalid_request`] and does not say Caller: the layer that read it knows where it
//!   came from. (A provider that parses its own answers with these constructors, a container ID
//!   say, re-labels a refusal with `with_provider`.)
//! - [`Origin::Unspecified`]: nobody said. That is the service's own coordination code (the
//!   lifecycle coordinator, the session manager) or a layer that did not classify. It is
//!   reported like a provider's error, which is what every error that was not the store's has
//!   always been reported as; a layer that knows better says so.
//!
//! A later builder replaces an earlier origin, like [`Error::with_operation`]: the last layer
//! that handled the error knows most about whose it is.
//!
//! # Operation names
//!
//! An [`Operation`] names the step that failed: the port method's name when a port method
//! failed (`create`, `read_file`, `lock_lifecycle`, `begin_turn`), else a verb phrase for the
//! step (`validate`, `dial`, `resolve`, `sweep_idle`, `renew_lifecycle_lock`). Names are
//! snake_case — ASCII lowercase letters, digits and `_`, starting with a letter
//! ([`Operation::follows_scheme`]) — and carry no component prefix: which component failed is
//! the [`Origin`], so the same name may appear with different origins (a store's `get` and a
//! provider's `get`). An envd RPC is named after its method (`start_process`, `list_dir`), not
//! its path. `cargo xtask tidy` checks every `Operation::new("...")` literal against the form.

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
    /// No terminal of the sandbox has the pid a reattach named (never started, ended, or a
    /// process that is not a terminal).
    TerminalNotFound,
    /// The backend cannot reattach to a terminal: its terminals end with their connection.
    TerminalReattachUnsupported,
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
    /// No background process has the pid or tag a call named.
    ProcessNotFound,
    /// Input or a signal for a background process that already ended.
    ProcessExited,
    /// Input for a background process whose stdin is closed (or was never kept open).
    StdinClosed,
    /// A background process was started with a tag a running process holds.
    ProcessTagInUse,
    /// A signal name is not one the process calls send.
    InvalidSignal,
    /// An attach's replay offset is past the output produced so far.
    InvalidOffset,
    /// A directory watcher fell too far behind; its stream was stopped.
    WatchOverflow,
    /// An operation that needs a directory (a watch) met something else.
    NotADirectory,
    /// The sandbox already runs as many processes as its cap allows; nothing was started.
    ProcessLimit,
    /// A deadline store was handed a key it cannot keep (blank, too long, a control character).
    InvalidDeadlineKey,
    /// A deadline store holds as many deadlines as it is bounded to; nothing was stored.
    DeadlineLimit,
    /// A listing's paging cursor is not one the listing wrote (garbled, forged, or written
    /// for the other order).
    InvalidCursor,
    /// The built template does not exist, or is not this tenant's (the two answer alike, so
    /// the error reveals nothing about other tenants' templates).
    TemplateNotFound,
    /// A tunnel named a port inside the sandbox that nothing listens on.
    PortClosed,
    /// The sandbox already has as many tunnels open as its bound allows; nothing was opened.
    TunnelLimit,
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
            ErrorCode::TerminalNotFound => "terminal_not_found",
            ErrorCode::TerminalReattachUnsupported => "terminal_reattach_unsupported",
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
            ErrorCode::ProcessNotFound => "process_not_found",
            ErrorCode::ProcessExited => "process_exited",
            ErrorCode::StdinClosed => "stdin_closed",
            ErrorCode::ProcessTagInUse => "process_tag_in_use",
            ErrorCode::InvalidSignal => "invalid_signal",
            ErrorCode::InvalidOffset => "invalid_offset",
            ErrorCode::WatchOverflow => "watch_overflow",
            ErrorCode::NotADirectory => "not_a_directory",
            ErrorCode::ProcessLimit => "process_limit",
            ErrorCode::InvalidDeadlineKey => "invalid_deadline_key",
            ErrorCode::DeadlineLimit => "deadline_limit",
            ErrorCode::InvalidCursor => "invalid_cursor",
            ErrorCode::TemplateNotFound => "template_not_found",
            ErrorCode::PortClosed => "port_closed",
            ErrorCode::TunnelLimit => "tunnel_limit",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name of the operation that failed (`create`, `exec`, `lock_lifecycle`, ...), following
/// the scheme in the [module docs](self#operation-names): the port method's name or a
/// snake_case verb phrase, with no component prefix (that is the error's [`Origin`]).
///
/// A newtype over a static string rather than an enum so stores, transports and later layers can
/// name their own operations without editing this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Operation(&'static str);

impl Operation {
    /// Names an operation: the port method's name or a snake_case verb phrase, see the module
    /// docs. Not checked here (a name is a label, and a malformed one must not take a service
    /// down); `cargo xtask tidy` checks the literals and [`Operation::follows_scheme`] is the
    /// rule.
    pub const fn new(name: &'static str) -> Self {
        Operation(name)
    }

    /// Whether `name` has the form of an operation name: `[a-z][a-z0-9_]*`.
    pub const fn follows_scheme(name: &str) -> bool {
        let bytes = name.as_bytes();
        if bytes.is_empty() || !bytes[0].is_ascii_lowercase() {
            return false;
        }
        let mut i = 1;
        while i < bytes.len() {
            let b = bytes[i];
            if !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
                return false;
            }
            i += 1;
        }
        true
    }
    /// The operation's name.
    pub const fn as_str(self) -> &'static str {
        self.0
    }

    pub const HEALTH: Operation = Operation::new("health");
    pub const CREATE: Operation = Operation::new("create");
    pub const CONNECT: Operation = Operation::new("connect");
    pub const CONNECT_SESSION: Operation = Operation::new("connect_session");
    pub const GET: Operation = Operation::new("get");
    pub const LIST: Operation = Operation::new("list");
    pub const DELETE: Operation = Operation::new("delete");
    pub const EXEC: Operation = Operation::new("exec");
    pub const WRITE_FILE: Operation = Operation::new("write_file");
    pub const READ_FILE: Operation = Operation::new("read_file");
    pub const LIST_DIR: Operation = Operation::new("list_dir");
    pub const MAKE_DIR: Operation = Operation::new("make_dir");
    pub const REMOVE: Operation = Operation::new("remove");
    pub const STAT: Operation = Operation::new("stat");
    pub const CREATE_SNAPSHOT: Operation = Operation::new("create_snapshot");
    pub const DELETE_SNAPSHOT: Operation = Operation::new("delete_snapshot");
    pub const LIST_SNAPSHOTS: Operation = Operation::new("list_snapshots");
    pub const LIST_TEMPLATES: Operation = Operation::new("list_templates");
    pub const ENSURE_TEMPLATE: Operation = Operation::new("ensure_template");
    pub const OPEN_TERMINAL: Operation = Operation::new("open_terminal");
    pub const TERMINAL_IO: Operation = Operation::new("terminal_io");
    pub const REATTACH_TERMINAL: Operation = Operation::new("reattach_terminal");
    pub const DIAL_DESKTOP: Operation = Operation::new("dial_desktop");
    pub const KEEP_ALIVE: Operation = Operation::new("keep_alive");
    pub const START_PROCESS: Operation = Operation::new("start_process");
    pub const LIST_PROCESSES: Operation = Operation::new("list_processes");
    pub const ATTACH_PROCESS: Operation = Operation::new("attach_process");
    pub const SEND_INPUT: Operation = Operation::new("send_input");
    pub const CLOSE_STDIN: Operation = Operation::new("close_stdin");
    pub const SIGNAL_PROCESS: Operation = Operation::new("signal_process");
    pub const READ_FILE_STREAM: Operation = Operation::new("read_file_stream");
    pub const WRITE_FILE_STREAM: Operation = Operation::new("write_file_stream");
    pub const RENAME_PATH: Operation = Operation::new("rename_path");
    pub const WATCH_DIR: Operation = Operation::new("watch_dir");
    pub const PAUSE: Operation = Operation::new("pause");
    pub const RESUME: Operation = Operation::new("resume");
    pub const OPEN_TUNNEL: Operation = Operation::new("open_tunnel");
    pub const BUILD_TEMPLATE: Operation = Operation::new("build_template");
    pub const LIST_BUILT_TEMPLATES: Operation = Operation::new("list_built_templates");
    pub const TAG_TEMPLATE: Operation = Operation::new("tag_template");
    pub const UNTAG_TEMPLATE: Operation = Operation::new("untag_template");
    pub const DELETE_TEMPLATE: Operation = Operation::new("delete_template");
    /// Parsing or validating input before it is used: a request's (origin [`Origin::Caller`]),
    /// or a configuration's or a stored value's (whose origin the reading layer says).
    pub const VALIDATE: Operation = Operation::new("validate");
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The component an error came from (see the [module docs](self#where-an-error-came-from)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Origin {
    /// A sandbox backend: its control plane, or its sandboxes' data plane (envd, an exec).
    Provider(Provider),
    /// The binding store: bindings, the lifecycle lock, turn leases, the rewind lock, the
    /// activity registry.
    Store,
    /// The guarded outbound transport, for a failure no provider claimed: a refused endpoint, a
    /// dial, TLS, an envd client that was not configured with a provider.
    Transport,
    /// The caller's request, refused by validation before any backend was involved.
    Caller,
    /// Not said: the service's own coordination code, or a layer that did not classify.
    /// Reported like a provider's error.
    #[default]
    Unspecified,
}

impl Origin {
    /// The name `Display` starts an error with: the provider's name, `store`, `transport`,
    /// `caller`, or `sandbox` (the service itself) when unspecified.
    pub fn label(self) -> &'static str {
        match self {
            Origin::Provider(p) => p.as_str(),
            Origin::Store => "store",
            Origin::Transport => "transport",
            Origin::Caller => "caller",
            Origin::Unspecified => "sandbox",
        }
    }

    /// The provider, for [`Origin::Provider`].
    pub fn provider(self) -> Option<Provider> {
        match self {
            Origin::Provider(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// The error every port returns: kind, optional code, origin, operation, message, HTTP status
/// and the original cause.
///
/// `Display` is one line without a trailing period, `<origin> <operation>: <kind>: <message>`
/// (then `: <cause>`), the origin as [`Origin::label`] names it. It never prints secrets: the
/// message and the cause go through [`crate::diagnostics::scrub`], which removes line breaks
/// and redacts credential-looking values, because error strings end up in logs.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    code: Option<ErrorCode>,
    origin: Origin,
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
            origin: Origin::Unspecified,
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

    /// Shorthand for [`ErrorKind::InvalidRequest`]: a request that is malformed or impossible.
    /// It says nothing about whose input it was; [`Error::invalid_input`] is the caller's.
    pub fn invalid_request(operation: Operation, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidRequest, operation, message)
    }
    /// The caller's input, refused by validation before any backend is involved:
    /// `invalid_request` of [`Operation::VALIDATE`] from [`Origin::Caller`].
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Error::invalid_request(Operation::VALIDATE, message).with_origin(Origin::Caller)
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
    /// Names the backend that produced the error: its origin becomes
    /// [`Origin::Provider`]`(provider)`.
    pub fn with_provider(self, provider: Provider) -> Self {
        self.with_origin(Origin::Provider(provider))
    }
    /// Says which component the error came from, replacing what an earlier layer said.
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
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
    /// The component the error came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }
    /// The backend that produced the error, when its origin is a provider.
    pub fn provider(&self) -> Option<Provider> {
        self.origin.provider()
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

    /// The HTTP status and machine-readable code the workspace's HTTP surfaces answer this
    /// error with (the service's API, and the envd router that forwards to sandboxes): a
    /// specific code first, then the kind; the origin tells a store failure from a provider
    /// failure. One table, so no two surfaces can say different things about one error.
    pub fn status_and_code(&self) -> (u16, &'static str) {
        if let Some(code) = self.code {
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
                | ErrorCode::FileTooLarge
                | ErrorCode::InvalidSignal
                | ErrorCode::InvalidOffset
                | ErrorCode::NotADirectory
                | ErrorCode::InvalidDeadlineKey
                | ErrorCode::InvalidCursor => 400,
                ErrorCode::SessionDeleted
                | ErrorCode::NoLiveSandbox
                | ErrorCode::SnapshotNotFound
                | ErrorCode::TemplateNotFound
                | ErrorCode::SandboxGone
                | ErrorCode::ProcessNotFound
                | ErrorCode::TerminalNotFound => 404,
                ErrorCode::QuotaExceeded
                | ErrorCode::WatchOverflow
                | ErrorCode::ProcessLimit
                | ErrorCode::DeadlineLimit
                | ErrorCode::TunnelLimit => 429,
                ErrorCode::SandboxPaused
                | ErrorCode::SessionRewindLocked
                | ErrorCode::SessionTurnActive
                | ErrorCode::SessionWorkActive
                | ErrorCode::ProcessExited
                | ErrorCode::StdinClosed
                | ErrorCode::ProcessTagInUse => 409,
                ErrorCode::TerminalUnsupported
                | ErrorCode::DesktopUnsupported
                | ErrorCode::TerminalReattachUnsupported => 501,
                ErrorCode::BackendDisabled
                | ErrorCode::EgressProtectionUnavailable
                | ErrorCode::LockOwnershipLost => 503,
                // A binding the store cannot read is our fault, not the caller's.
                ErrorCode::InvalidBinding => 500,
                // The sandbox is up but its program is not listening: a gateway's failure to
                // reach its upstream, not the service's.
                ErrorCode::PortClosed => 502,
            };
            return (status, code.as_str());
        }
        let from_store = self.origin == Origin::Store;
        match self.kind {
            ErrorKind::NotFound => (404, "not_found"),
            ErrorKind::Terminal => (404, "sandbox_gone"),
            ErrorKind::InvalidRequest => (400, "invalid_request"),
            ErrorKind::Unsupported => (501, "unsupported"),
            ErrorKind::Conflict => (409, "conflict"),
            ErrorKind::Capacity => (429, "capacity"),
            ErrorKind::Timeout if from_store => (504, "store_timeout"),
            ErrorKind::Timeout => (504, "provider_timeout"),
            ErrorKind::Unavailable if from_store => (503, "store_unavailable"),
            ErrorKind::Unavailable => (503, "provider_unavailable"),
            // The provider refused *our* credentials: a deployment problem, not the caller's.
            ErrorKind::Authentication => (502, "provider_authentication"),
            ErrorKind::Internal => (500, "internal"),
        }
    }

    /// Whether this error proves the bound sandbox is permanently gone (allow-list: only
    /// `not_found` and `terminal`).
    pub fn can_replace_binding(&self) -> bool {
        self.kind.can_replace_binding()
    }

    /// One log line: `<kind> origin=<origin> op=<operation> http=<status> [code=<code>]
    /// <message>`, scrubbed of secrets.
    pub fn diagnostics(&self) -> String {
        let status = self
            .http_status
            .map_or_else(|| "-".to_owned(), |s| s.to_string());
        let mut line = format!(
            "{} origin={} op={} http={}",
            self.kind, self.origin, self.operation, status
        );
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
        write!(
            f,
            "{} {}: {}: {}",
            self.origin,
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
            .field("origin", &self.origin)
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
        let debug = format!("{e:?}");
        assert!(!debug.contains("sk-live-123"));
        assert!(debug.contains("origin: Provider(Cube)"), "{debug}");
        assert_eq!(
            e.diagnostics(),
            "unavailable origin=cube op=exec http=503 request failed: Authorization: Bearer [redacted]"
        );
        let source = std::error::Error::source(&e).expect("cause retained");
        assert!(source.to_string().contains("connection reset"));
        let coded = Error::invalid_input("bad").with_code(ErrorCode::InvalidPath);
        assert_eq!(
            coded.diagnostics(),
            "invalid_request origin=caller op=validate http=- code=invalid_path bad"
        );
        assert_eq!(coded.to_string(), "caller validate: invalid_request: bad");
    }

    #[test]
    fn display_names_the_origin_first() {
        let check = |origin: Origin, want: &str| {
            let e = Error::unavailable(Operation::GET, "down").with_origin(origin);
            assert_eq!(e.to_string(), want, "{origin:?}");
        };
        check(
            Origin::Provider(Provider::Docker),
            "docker get: unavailable: down",
        );
        check(Origin::Store, "store get: unavailable: down");
        check(Origin::Transport, "transport get: unavailable: down");
        check(Origin::Caller, "caller get: unavailable: down");
        // Unsaid is the service itself, as every error without a provider was shown before.
        check(Origin::Unspecified, "sandbox get: unavailable: down");
    }

    #[test]
    fn origin_is_a_field_the_builders_set() {
        let plain = Error::internal(Operation::EXEC, "x");
        assert_eq!(plain.origin(), Origin::Unspecified);
        assert_eq!(plain.provider(), None);
        // with_provider is the provider origin, so adapters that name themselves need no edit.
        let docker = plain.clone().with_provider(Provider::Docker);
        assert_eq!(docker.origin(), Origin::Provider(Provider::Docker));
        assert_eq!(docker.provider(), Some(Provider::Docker));
        // The last layer that says wins, and a non-provider origin has no provider.
        let claimed = docker.with_origin(Origin::Store);
        assert_eq!(claimed.origin(), Origin::Store);
        assert_eq!(claimed.provider(), None);
        let http = Error::from_http_status(Provider::E2b, Operation::GET, 503, "x");
        assert_eq!(http.origin(), Origin::Provider(Provider::E2b));
        let input = Error::invalid_input("bad id");
        assert_eq!(
            (input.kind(), input.operation(), input.origin()),
            (
                ErrorKind::InvalidRequest,
                Operation::VALIDATE,
                Origin::Caller
            )
        );
        // invalid_request alone says nothing about whose input it was.
        let request = Error::invalid_request(Operation::VALIDATE, "bad config");
        assert_eq!(request.origin(), Origin::Unspecified);
    }

    /// The constructors that validate what a request carries say the caller; validation of
    /// configuration does not.
    #[test]
    fn caller_input_validation_says_caller() {
        use crate::exec::{ExecRequest, ExecSpec, ExecTimeout};
        let spec = |json: &str| {
            ExecRequest::try_from(serde_json::from_str::<ExecSpec>(json).unwrap()).unwrap_err()
        };
        let refusals = [
            crate::ids::SessionId::new("a{b").unwrap_err(),
            crate::ids::TenantId::new(0).unwrap_err(),
            crate::path::SandboxPath::new("relative/path").unwrap_err(),
            crate::path::SandboxPath::new("/a/../b").unwrap_err(),
            spec(r#"{"command":"echo","shell":true,"args":["x"]}"#),
            spec(r#"{"command":"env","env":{"A-B":"1"}}"#),
            ExecTimeout::new(std::time::Duration::ZERO).unwrap_err(),
            crate::policy::workspace::WorkspaceLayout::standard()
                .check_model_write(&crate::path::SandboxPath::new("/etc").unwrap())
                .unwrap_err(),
        ];
        for e in refusals {
            assert_eq!(e.origin(), Origin::Caller, "{e}");
            assert_eq!(e.operation(), Operation::VALIDATE, "{e}");
            assert!(e.to_string().starts_with("caller validate: "), "{e}");
        }
        let config = crate::provider::SandboxType::parse("nope").unwrap_err();
        assert_eq!(config.origin(), Origin::Unspecified, "{config}");
    }

    #[test]
    fn operation_names_are_snake_case() {
        for ok in [
            "get",
            "read_file",
            "lock_lifecycle",
            "sweep_idle",
            "list_dir2",
        ] {
            assert!(Operation::follows_scheme(ok), "{ok}");
        }
        for bad in [
            "",
            "store.get",
            "envd.files.upload",
            "/process.Process/Start",
            "ReadFile",
            "read-file",
            "_get",
            "2get",
            "get file",
        ] {
            assert!(!Operation::follows_scheme(bad), "{bad:?}");
        }
        for op in [
            Operation::HEALTH,
            Operation::CREATE,
            Operation::CONNECT,
            Operation::CONNECT_SESSION,
            Operation::GET,
            Operation::LIST,
            Operation::DELETE,
            Operation::EXEC,
            Operation::WRITE_FILE,
            Operation::READ_FILE,
            Operation::LIST_DIR,
            Operation::MAKE_DIR,
            Operation::REMOVE,
            Operation::STAT,
            Operation::CREATE_SNAPSHOT,
            Operation::DELETE_SNAPSHOT,
            Operation::LIST_SNAPSHOTS,
            Operation::LIST_TEMPLATES,
            Operation::ENSURE_TEMPLATE,
            Operation::OPEN_TERMINAL,
            Operation::TERMINAL_IO,
            Operation::REATTACH_TERMINAL,
            Operation::DIAL_DESKTOP,
            Operation::KEEP_ALIVE,
            Operation::PAUSE,
            Operation::RESUME,
            Operation::OPEN_TUNNEL,
            Operation::BUILD_TEMPLATE,
            Operation::LIST_BUILT_TEMPLATES,
            Operation::TAG_TEMPLATE,
            Operation::UNTAG_TEMPLATE,
            Operation::DELETE_TEMPLATE,
            Operation::VALIDATE,
        ] {
            assert!(Operation::follows_scheme(op.as_str()), "{op}");
        }
    }

    #[test]
    fn kind_and_code_wire_names() {
        for kind in ErrorKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        assert_eq!(ErrorCode::SandboxPaused.as_str(), "session_sandbox_paused");
        assert_eq!(
            serde_json::to_value(ErrorCode::InvalidPath).unwrap(),
            "invalid_path"
        );
    }
}
