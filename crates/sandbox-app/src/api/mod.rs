//! The wire form of the HTTP API: the request and response types of every route, declared once.
//! The handlers (`crate::http`) build and read them, the CLI client (`crate::client`) reads and
//! builds them, and the OpenAPI document (`GET /v1/openapi.json`) is derived from them
//! (`utoipa::ToSchema`).
//!
//! These types are the API's own, not `sandbox_core`'s: each maps from or to the core type
//! explicitly, field by field, so renaming a field in `sandbox-core` breaks the build here
//! instead of changing the JSON silently. Field names, optionality, the fields left out when
//! empty and enum spellings are the API's contract.
//!
//! [`errors`] holds the error statuses and codes each route family can answer, as data.

pub mod errors;
pub mod schema;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

// ---- errors ----------------------------------------------------------------------------------

/// The one error shape of the API (component `Error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Machine-readable; the route lists the codes of each status.
    pub code: String,
    /// One line, scrubbed of credentials.
    pub message: String,
}

// ---- service ---------------------------------------------------------------------------------

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: HealthStatus,
    pub backend: String,
    pub store: String,
    /// A reason code only; the details are in the service's log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub reason: Option<HealthReason>,
}

/// Whether the backend and the store answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    Ok,
    Unavailable,
}

/// Which one does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthReason {
    BackendUnavailable,
    StoreUnavailable,
}

// ---- sessions --------------------------------------------------------------------------------

/// The `{session}` path segment (documentation only: handlers read it with
/// `crate::http::SessionPath`).
#[derive(Debug, Clone, Deserialize)]
pub struct SessionParam {
    pub session: String,
}

impl IntoParams for SessionParam {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![schema::path_param("session", schema::session())]
    }
}

/// `GET /v1/sessions/{session}`: the sandbox bound to the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub session: String,
    pub sandbox_id: String,
    pub provider: String,
    pub state: String,
}

/// `POST /v1/sessions/{session}/keepalive`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeepAlive {
    pub refreshed: bool,
    pub next_refresh_ms: u64,
}

// ---- exec ------------------------------------------------------------------------------------

/// Query of `POST /v1/sessions/{session}/exec`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ExecQuery {
    /// Answer NDJSON: one line per output chunk as it happens, then the result
    #[serde(default)]
    pub stream: bool,
}

/// An exec spec: argv form (`command` + `args`) or shell form (`shell: true`, no `args`).
/// The field order is the one `sandbox_core::ExecSpec` reports in its errors.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    #[schema(schema_with = schema::program)]
    pub command: String,
    #[serde(default)]
    #[schema(schema_with = schema::args_schema)]
    pub args: Vec<String>,
    #[serde(default)]
    pub shell: bool,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    #[schema(schema_with = schema::env)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    #[schema(schema_with = schema::optional_path)]
    pub cwd: Option<String>,
    #[serde(default)]
    #[schema(schema_with = schema::optional_user)]
    pub user: Option<String>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub timeout_ms: Option<i64>,
}

impl From<ExecSpec> for sandbox_core::ExecSpec {
    fn from(spec: ExecSpec) -> Self {
        let ExecSpec {
            command,
            args,
            shell,
            stdin,
            env,
            cwd,
            user,
            timeout_ms,
        } = spec;
        sandbox_core::ExecSpec {
            command,
            args,
            shell,
            stdin,
            env,
            cwd,
            user,
            timeout_ms,
        }
    }
}

/// The buffered result of an exec (the exec and execute routes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    pub exit_code: i32,
    pub killed: bool,
    pub duration_ms: u64,
    /// Lossy UTF-8, for display
    pub stdout: String,
    /// Lossy UTF-8, for display
    pub stderr: String,
    pub stdout_utf8: bool,
    pub stderr_utf8: bool,
    /// The exact bytes (standard base64), present only when stdout is not UTF-8
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, content_encoding = "base64")]
    pub stdout_b64: Option<String>,
    /// The exact bytes (standard base64), present only when stderr is not UTF-8
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, content_encoding = "base64")]
    pub stderr_b64: Option<String>,
    /// Output past the capture limit was dropped
    pub truncated: bool,
}

impl From<&sandbox_core::ExecResult> for ExecResult {
    fn from(r: &sandbox_core::ExecResult) -> Self {
        let (stdout, stdout_utf8, stdout_b64) = buffered(&r.stdout);
        let (stderr, stderr_utf8, stderr_b64) = buffered(&r.stderr);
        ExecResult {
            exit_code: r.exit_code,
            killed: r.killed,
            duration_ms: millis(r.duration),
            stdout,
            stderr,
            stdout_utf8,
            stderr_utf8,
            stdout_b64,
            stderr_b64,
            truncated: r.truncated,
        }
    }
}

/// One stream's buffered fields: lossy text (for display), whether it is UTF-8, and the exact
/// bytes as base64 when it is not.
fn buffered(bytes: &[u8]) -> (String, bool, Option<String>) {
    use base64::Engine as _;
    let utf8 = std::str::from_utf8(bytes).is_ok();
    (
        String::from_utf8_lossy(bytes).into_owned(),
        utf8,
        (!utf8).then(|| base64::engine::general_purpose::STANDARD.encode(bytes)),
    )
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One line of the streaming exec answer (`?stream=true`, `application/x-ndjson`): output
/// chunks as they happen, then one final result or error line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ExecStreamLine {
    Output(ExecOutput),
    End(ExecEnd),
    Error(ErrorResponse),
}

/// Which output stream a chunk is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamName {
    Stdout,
    Stderr,
}

impl From<sandbox_core::OutputStream> for StreamName {
    fn from(stream: sandbox_core::OutputStream) -> Self {
        match stream {
            sandbox_core::OutputStream::Stdout => StreamName::Stdout,
            sandbox_core::OutputStream::Stderr => StreamName::Stderr,
        }
    }
}

/// An output chunk: text cut at character boundaries as `data`, or bytes that are not UTF-8 as
/// `data_b64` (standard base64); exactly one of the two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecOutput {
    pub stream: StreamName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, content_encoding = "base64")]
    pub data_b64: Option<String>,
}

/// The last line of a stream that ran to its end (the output already went out line by line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecEnd {
    pub exit_code: i32,
    pub killed: bool,
    pub duration_ms: u64,
    pub truncated: bool,
    /// The client read too slowly: output past the service's queue bound was dropped
    pub stream_overflow: bool,
}

/// `POST /v1/execute`: a script run in a fresh sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptRequest {
    #[schema(schema_with = schema::script_file_name)]
    pub file_name: String,
    pub content: String,
    #[serde(default)]
    #[schema(schema_with = schema::args_schema)]
    pub args: Vec<String>,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    #[schema(schema_with = schema::env)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub timeout_ms: Option<i64>,
}

// ---- snapshots -------------------------------------------------------------------------------

/// `POST /v1/sessions/{session}/snapshots` (an empty body means no name).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    #[serde(default)]
    #[schema(schema_with = schema::optional_snapshot_name)]
    pub name: Option<String>,
}

/// The snapshot taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotCreated {
    pub snapshot_id: String,
    pub name: Option<String>,
    /// The sandbox it was taken from
    pub source: Option<String>,
}

impl From<&sandbox_core::SnapshotRef> for SnapshotCreated {
    fn from(s: &sandbox_core::SnapshotRef) -> Self {
        SnapshotCreated {
            snapshot_id: s.id.as_str().to_owned(),
            name: s.name.clone(),
            source: s.source.as_ref().map(|id| id.as_str().to_owned()),
        }
    }
}

/// `POST /v1/sessions/{session}/restore`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    #[schema(schema_with = schema::snapshot_id)]
    pub snapshot_id: String,
}

/// The sandbox a restore created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RestoreCreated {
    pub session: String,
    pub sandbox_id: String,
}

// ---- files -----------------------------------------------------------------------------------

/// Query of the file routes that take one path.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    pub path: Option<String>,
}

impl IntoParams for PathQuery {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![schema::query_param("path", true, schema::path())]
    }
}

/// Query of the listing route.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub path: Option<String>,
    // Kept as text so a malformed depth is `invalid_depth`, not a generic query error.
    pub depth: Option<String>,
}

impl IntoParams for ListQuery {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![
            schema::query_param("path", true, schema::path()),
            schema::query_param("depth", false, schema::depth()),
        ]
    }
}

/// The kind of an entry, as seen without following a final symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    Other,
}

impl From<sandbox_core::EntryKind> for EntryKind {
    fn from(kind: sandbox_core::EntryKind) -> Self {
        match kind {
            sandbox_core::EntryKind::File => EntryKind::File,
            sandbox_core::EntryKind::Dir => EntryKind::Dir,
            sandbox_core::EntryKind::Other => EntryKind::Other,
        }
    }
}

/// Kind, size and modification time of one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StatEntry {
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    /// RFC 3339, UTC; absent when unknown
    #[serde(
        default,
        with = "sandbox_core::timefmt::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime, nullable = false)]
    pub modified: Option<OffsetDateTime>,
}

impl From<sandbox_core::StatEntry> for StatEntry {
    fn from(e: sandbox_core::StatEntry) -> Self {
        StatEntry {
            path: e.path.as_str().to_owned(),
            kind: e.kind.into(),
            size: e.size,
            modified: e.modified,
        }
    }
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DirEntry {
    pub name: String,
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    /// RFC 3339, UTC; absent when unknown
    #[serde(
        default,
        with = "sandbox_core::timefmt::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime, nullable = false)]
    pub modified: Option<OffsetDateTime>,
}

impl From<sandbox_core::DirEntry> for DirEntry {
    fn from(e: sandbox_core::DirEntry) -> Self {
        DirEntry {
            name: e.name,
            path: e.path.as_str().to_owned(),
            kind: e.kind.into(),
            size: e.size,
            modified: e.modified,
        }
    }
}

/// `GET /v1/sessions/{session}/files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Listing {
    pub entries: Vec<DirEntry>,
    /// The entry cap or the walk's deadline cut the listing short
    pub truncated: bool,
}

impl From<sandbox_core::TreeListing> for Listing {
    fn from(l: sandbox_core::TreeListing) -> Self {
        Listing {
            entries: l.entries.into_iter().map(DirEntry::from).collect(),
            truncated: l.truncated,
        }
    }
}

// ---- terminal --------------------------------------------------------------------------------

/// `POST /v1/sessions/{session}/terminal/ticket`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TerminalTicket {
    pub ticket: String,
    pub expires_in_ms: u64,
}

/// Query of the terminal upgrade.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TerminalQuery {
    /// From POST …/terminal/ticket; used up by a successful upgrade
    #[serde(default)]
    #[param(required = true, nullable = false, min_length = 1)]
    pub ticket: Option<String>,
    /// Let the open resume a paused sandbox
    #[serde(default)]
    pub resume: bool,
    /// Initial width (0 or absent: 80)
    #[serde(default)]
    #[param(minimum = 0, maximum = 65535)]
    pub cols: u16,
    /// Initial height (0 or absent: 24)
    #[serde(default)]
    #[param(minimum = 0, maximum = 65535)]
    pub rows: u16,
    /// Reattach to this running terminal of the session's sandbox (the pid of its `opened`
    /// frame) instead of opening a new one; `cwd`, `env` and `user` must then be absent
    #[serde(default)]
    pub pid: Option<u32>,
    /// Working directory of a new terminal (absent: the workspace root)
    #[serde(default)]
    #[param(schema_with = schema::path)]
    pub cwd: Option<String>,
    /// Account of a new terminal (absent: the default exec user)
    #[serde(default)]
    #[param(schema_with = schema::user)]
    pub user: Option<String>,
    /// Environment of a new terminal: a JSON object of strings, URL-encoded
    /// (`env=%7B%22A%22%3A%221%22%7D` for `{"A":"1"}`)
    #[serde(default)]
    pub env: Option<String>,
}

/// A text frame the client sends on the terminal WebSocket (binary frames carry raw PTY bytes
/// both ways).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TerminalClientFrame {
    Resize { cols: u16, rows: u16 },
}

/// A text frame the service sends on the terminal WebSocket, before its close frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TerminalServerFrame {
    /// The first frame: the terminal is open (or reattached), and `pid` is what a later
    /// upgrade passes as `pid=` to reattach after this socket is gone.
    Opened { pid: Option<u32> },
    /// The shell exited (`-1` when its status is unknown).
    Exit { code: i32 },
    /// The terminal failed, or the client sent a text frame that is no control message.
    Error { code: String, message: String },
}

// ---- background processes (issue 17) ---------------------------------------------------------

/// The `{session}` and `{process}` path segments of the process routes (documentation only:
/// handlers read them with `crate::http::processes::ProcessPath`).
#[derive(Debug, Clone, Deserialize)]
pub struct ProcessParam {
    pub session: String,
    pub process: String,
}

impl IntoParams for ProcessParam {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![
            schema::path_param("session", schema::session()),
            schema::path_param("process", schema::process()),
        ]
    }
}

/// `POST /v1/sessions/{session}/processes`: what to start in the background. The command is
/// an exec spec's: argv form (`command` + `args`) or shell form (`shell: true`, no `args`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessStartRequest {
    #[schema(schema_with = schema::program)]
    pub command: String,
    #[serde(default)]
    #[schema(schema_with = schema::args_schema)]
    pub args: Vec<String>,
    #[serde(default)]
    pub shell: bool,
    #[serde(default)]
    #[schema(schema_with = schema::env)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    #[schema(schema_with = schema::optional_path)]
    pub cwd: Option<String>,
    #[serde(default)]
    #[schema(schema_with = schema::optional_user)]
    pub user: Option<String>,
    #[serde(default)]
    #[schema(schema_with = schema::optional_tag)]
    pub tag: Option<String>,
    /// Keep stdin open for `POST …/stdin`; otherwise the process reads end of file at once
    #[serde(default)]
    pub stdin: bool,
}

impl ProcessStartRequest {
    /// The core spec, validated like an exec spec (`invalid_command`, `invalid_path`).
    pub fn into_spec(self) -> Result<sandbox_core::ProcessSpec, sandbox_core::Error> {
        let ProcessStartRequest {
            command,
            args,
            shell,
            env,
            cwd,
            user,
            tag,
            stdin,
        } = self;
        let tag = tag.map(sandbox_core::ProcessTag::new).transpose()?;
        // The exec spec's own parsing and checks, so both routes refuse alike.
        let request = sandbox_core::ExecRequest::try_from(sandbox_core::ExecSpec {
            command,
            args,
            shell,
            stdin: None,
            env,
            cwd,
            user,
            timeout_ms: None,
        })?;
        let spec = sandbox_core::ProcessSpec {
            command: request.command,
            tag,
            env: request.env,
            cwd: request.cwd,
            user: request.user,
            stdin,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Whether a listed process still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    Running,
    Exited,
}

/// One background process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Process {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub tag: Option<String>,
    pub argv: Vec<String>,
    pub state: ProcessState,
    /// Set once exited with a status (absent while running, when signalled, or unknown)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub exit_code: Option<i32>,
    /// The signal that ended it (`KILL`), when known
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub signal: Option<String>,
    /// Output bytes produced so far: the offset the next byte gets
    pub output_bytes: u64,
    /// How many of the latest output bytes an attach can replay
    pub ring_bytes: u64,
}

impl From<sandbox_core::ProcessInfo> for Process {
    fn from(p: sandbox_core::ProcessInfo) -> Self {
        let (state, exit_code, signal) = match p.status {
            sandbox_core::ProcessStatus::Running => (ProcessState::Running, None, None),
            sandbox_core::ProcessStatus::Exited { exit_code, signal } => (
                ProcessState::Exited,
                exit_code,
                signal.map(|s| s.as_str().to_owned()),
            ),
        };
        Process {
            pid: p.pid,
            tag: p.tag.map(String::from),
            argv: p.argv,
            state,
            exit_code,
            signal,
            output_bytes: p.output_bytes,
            ring_bytes: p.ring_bytes,
        }
    }
}

/// `GET /v1/sessions/{session}/processes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<Process>,
}

/// Query of the attach route.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AttachQuery {
    /// The output offset to replay from (0: everything the ring still holds); absent: only
    /// what is produced from now on
    // Kept as text so a malformed offset is `invalid_offset`, not a generic query error.
    #[param(value_type = Option<u64>, nullable = false)]
    pub from: Option<String>,
}

/// `POST …/processes/{process}/signal` (an empty body means `TERM`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    #[schema(schema_with = schema::signal)]
    pub signal: String,
}

impl Default for SignalRequest {
    fn default() -> Self {
        SignalRequest {
            signal: "TERM".to_owned(),
        }
    }
}

/// One line of an attach stream (`application/x-ndjson`). Every line says where it is in the
/// process's output, so a client that lost the connection resumes with `?from=` the offset
/// after the last line it handled: a `data` line's `offset` plus its byte length, or the
/// `offset` of any other line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProcessStreamLine {
    /// Output bytes starting at `offset`: `data` when the chunk is UTF-8 on its own, else the
    /// exact bytes as `data_b64` (standard base64); exactly one of the two.
    Data {
        stream: StreamName,
        offset: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(nullable = false)]
        data: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(nullable = false, content_encoding = "base64")]
        data_b64: Option<String>,
    },
    /// The bytes `from..to` are no longer in the replay ring; the next `data` starts at `to`.
    Gap { from: u64, to: u64 },
    /// The process ended (the last line); `offset` is where its output ended.
    Exited {
        offset: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(nullable = false)]
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(nullable = false)]
        signal: Option<String>,
    },
    /// The stream failed (the last line); the process may still run: attach again from
    /// `offset`.
    Error {
        offset: u64,
        code: String,
        message: String,
    },
}

// ---- streamed files, rename, watch (issue 17) ------------------------------------------------

/// `PUT /v1/sessions/{session}/files/stream`: what was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamWritten {
    pub path: String,
    pub bytes: u64,
}

/// `POST /v1/sessions/{session}/files/rename`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    #[schema(schema_with = schema::path)]
    pub from: String,
    /// Its parents are created, an existing file replaced
    #[schema(schema_with = schema::path)]
    pub to: String,
}

/// Query of the watch route.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    pub path: Option<String>,
    #[serde(default)]
    pub recursive: bool,
}

impl IntoParams for WatchQuery {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![
            schema::query_param("path", true, schema::path()),
            schema::query_param("recursive", false, schema::recursive()),
        ]
    }
}

/// What happened to a watched path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

impl From<sandbox_core::WatchEventKind> for WatchKind {
    fn from(kind: sandbox_core::WatchEventKind) -> Self {
        match kind {
            sandbox_core::WatchEventKind::Create => WatchKind::Create,
            sandbox_core::WatchEventKind::Write => WatchKind::Write,
            sandbox_core::WatchEventKind::Remove => WatchKind::Remove,
            sandbox_core::WatchEventKind::Rename => WatchKind::Rename,
            sandbox_core::WatchEventKind::Chmod => WatchKind::Chmod,
        }
    }
}

/// One line of a watch stream (`application/x-ndjson`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchStreamLine {
    /// The first line: the watch is armed, every later change is reported.
    Started { path: String, recursive: bool },
    /// A change.
    Event { kind: WatchKind, path: String },
    /// The watch ended by itself (its directory went away); the last line.
    Ended,
    /// The watch failed (the last line). `watch_overflow`: the client fell too far behind
    /// and events were lost; list the directory and watch again.
    Error { code: String, message: String },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::{Value, json};

    use super::*;

    fn wire<T: Serialize>(value: &T) -> Value {
        serde_json::to_value(value).unwrap()
    }

    #[test]
    fn buffered_results_carry_exact_bytes_when_not_utf8() {
        let core = sandbox_core::ExecResult {
            stdout: b"plain".to_vec(),
            stderr: vec![0xff, b'x'],
            exit_code: 3,
            duration: std::time::Duration::from_millis(7),
            killed: false,
            truncated: true,
        };
        assert_eq!(
            wire(&ExecResult::from(&core)),
            json!({
                "exit_code": 3, "killed": false, "duration_ms": 7,
                "stdout": "plain", "stdout_utf8": true,
                "stderr": "\u{fffd}x", "stderr_utf8": false, "stderr_b64": "/3g=",
                "truncated": true,
            })
        );
    }

    #[test]
    fn entries_leave_out_an_unknown_modification_time() {
        let entry: sandbox_core::DirEntry = serde_json::from_value(
            json!({ "name": "a", "path": "/workspace/a", "kind": "dir", "size": 4 }),
        )
        .unwrap();
        let listing = sandbox_core::TreeListing {
            entries: vec![entry],
            truncated: false,
        };
        assert_eq!(
            wire(&Listing::from(listing)),
            json!({
                "entries": [{ "name": "a", "path": "/workspace/a", "kind": "dir", "size": 4 }],
                "truncated": false,
            })
        );
        let stat: sandbox_core::StatEntry = serde_json::from_value(json!({
            "path": "/workspace/a", "kind": "other", "size": 0,
            "modified": "2026-01-02T03:04:05Z",
        }))
        .unwrap();
        assert_eq!(
            wire(&StatEntry::from(stat)),
            json!({
                "path": "/workspace/a", "kind": "other", "size": 0,
                "modified": "2026-01-02T03:04:05Z",
            })
        );
    }

    #[test]
    fn a_snapshot_without_name_or_source_says_null() {
        let snapshot: sandbox_core::SnapshotRef =
            serde_json::from_value(json!({ "id": "snap-1" })).unwrap();
        assert_eq!(
            wire(&SnapshotCreated::from(&snapshot)),
            json!({ "snapshot_id": "snap-1", "name": null, "source": null })
        );
    }

    #[test]
    fn stream_lines_and_frames_are_spelled_as_documented() {
        let lines = [
            (
                ExecStreamLine::Output(ExecOutput {
                    stream: StreamName::Stderr,
                    data: Some("hi".to_owned()),
                    data_b64: None,
                }),
                json!({ "stream": "stderr", "data": "hi" }),
            ),
            (
                ExecStreamLine::End(ExecEnd {
                    exit_code: -1,
                    killed: true,
                    duration_ms: 2,
                    truncated: false,
                    stream_overflow: true,
                }),
                json!({ "exit_code": -1, "killed": true, "duration_ms": 2, "truncated": false, "stream_overflow": true }),
            ),
            (
                ExecStreamLine::Error(ErrorResponse {
                    error: ErrorBody {
                        code: "internal".to_owned(),
                        message: "m".to_owned(),
                    },
                }),
                json!({ "error": { "code": "internal", "message": "m" } }),
            ),
        ];
        for (line, expected) in lines {
            assert_eq!(wire(&line), expected);
            // Each line reads back as the variant it was, not as another one.
            assert_eq!(
                serde_json::from_value::<ExecStreamLine>(expected).unwrap(),
                line
            );
        }
        assert_eq!(
            wire(&TerminalServerFrame::Exit { code: 0 }),
            json!({ "type": "exit", "code": 0 })
        );
        assert_eq!(
            wire(&TerminalServerFrame::Opened { pid: Some(42) }),
            json!({ "type": "opened", "pid": 42 })
        );
        assert_eq!(
            wire(&TerminalClientFrame::Resize { cols: 80, rows: 24 }),
            json!({ "type": "resize", "cols": 80, "rows": 24 })
        );
        assert_eq!(
            wire(&Health {
                status: HealthStatus::Unavailable,
                backend: "docker".to_owned(),
                store: "memory".to_owned(),
                reason: Some(HealthReason::StoreUnavailable),
            }),
            json!({ "status": "unavailable", "backend": "docker", "store": "memory", "reason": "store_unavailable" })
        );
    }

    #[test]
    fn exec_specs_map_to_core_field_by_field() {
        let spec: ExecSpec = serde_json::from_value(json!({
            "command": "ls", "args": ["-l"], "stdin": "x", "env": { "A": "1" },
            "cwd": "/workspace", "user": "root", "timeout_ms": 5,
        }))
        .unwrap();
        let core = sandbox_core::ExecSpec::from(spec.clone());
        // The core type's own JSON of the mapped value reads back as the same API value: no
        // field was dropped or swapped on the way.
        let back: ExecSpec = serde_json::from_value(wire(&core)).unwrap();
        assert_eq!(back, spec);
        let unknown = serde_json::from_value::<ExecSpec>(json!({ "command": "ls", "x": 1 }))
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains(
                "expected one of `command`, `args`, `shell`, `stdin`, `env`, `cwd`, `user`, `timeout_ms`"
            ),
            "{unknown}"
        );
    }
}
