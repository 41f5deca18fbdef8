//! The interactive terminal over a WebSocket.
//!
//! - `POST /v1/sessions/{session}/terminal/ticket` (bearer): `{"ticket":"..","expires_in_ms":N}`,
//!   a short-lived single-use ticket bound to the caller's `(tenant, session)`. Browsers cannot
//!   send a bearer header on a WebSocket and tokens never travel in a query string, so the
//!   ticket is what authorises the upgrade.
//! - `GET /v1/sessions/{session}/terminal?ticket=..[&resume=true][&cols=C&rows=R]
//!   [&cwd=/dir][&user=name][&env={"A":"1"}]`: the upgrade, opening a new terminal; or
//!   `..?ticket=..&pid=N[&cols=C&rows=R]`: reattaching to the running terminal `N` of the
//!   session's sandbox. Everything that can refuse is answered as an HTTP error *before*
//!   upgrading: no, used, expired or foreign ticket 401 `invalid_ticket`; a bad `cwd` 400
//!   `invalid_path`, a bad `env` (not a JSON object of strings) 400 `invalid_query`, a bad
//!   environment name or user 400 `invalid_command`, `pid` with `cwd`/`env`/`user`/`resume` 400
//!   `invalid_query`; nothing bound 404 `no_live_sandbox`; a `pid` that is no running terminal
//!   of the session's sandbox 404 `terminal_not_found` (the sandbox comes from the ticket's
//!   session, so another session's terminals cannot be named at all); bound but not running
//!   409 `session_sandbox_paused` (unless `resume=true`, for an open); a backend without PTYs
//!   501 `terminal_unsupported`, one that cannot reattach 501 `terminal_reattach_unsupported`.
//!   Lookup-only: it never provisions a sandbox. The ticket is used up only once the checks
//!   that need no terminal pass.
//!
//! On the socket, the server's first frame is `{"type":"opened","pid":N}` (`pid` null when the
//! backend cannot tell it), the reattach handle; a reattach then replays the terminal's recent
//! output before live output. Binary frames carry raw PTY bytes both ways; the client sends
//! `{"type":"resize","cols":C,"rows":R}` as a text frame. The server ends with
//! `{"type":"exit","code":N}` (`-1` when unknown) or `{"type":"error","code":..,"message":..}`
//! and a close frame. Keystrokes are coalesced (a queue of 64 chunks; each PTY write drains up
//! to 4 KiB, no timer). A terminal with neither keystrokes nor output for
//! `limits.terminal_idle_seconds` (0 = 15 min; the config accepts 60 s to 24 h) is
//! disconnected; while open, the provider's idle timer is refreshed at the interval
//! `keep_alive` answers.
//!
//! How the socket ends decides the shell's fate. A client close frame with code 1000 (normal:
//! "I am done") ends the terminal: the shell and its jobs are hung up. Every other end — a
//! close frame with another code or none (a browser navigating away says 1001), the client
//! vanishing, the idle disconnect, the task being dropped — detaches: where the backend
//! declares `terminal_reattach` (Docker with the agent) the shell keeps running, reattachable
//! by pid, until it has had no client for the same `limits.terminal_idle_seconds`, when the
//! backend kills it (the agent's own timer, so it holds across a restart of this service);
//! elsewhere a detach is a close (Docker's exec plane cannot reattach).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use sandbox_core::{
    BindingKey, SandboxPath, SessionId, Terminal, TerminalEvent, TerminalInput, TerminalOptions,
    TerminalSize,
};
use sandbox_session::manager::SessionManager;
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use super::error::ApiError;
use super::metrics::Metrics;
use super::{AppState, Caller, SessionPath, session_key};
use crate::api;
use crate::config::Limits;
use crate::tickets::IssueError;

/// Largest WebSocket message and frame the server accepts (a paste bigger than this is split by
/// any sane client; a resize message is tiny).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Largest single WebSocket frame.
pub const MAX_FRAME_BYTES: usize = 64 * 1024;
/// Keystroke chunks queued before the socket reader waits for the PTY.
const INPUT_QUEUE: usize = 64;
/// One PTY write carries at most this much of the queue.
const COALESCE_BYTES: usize = 4096;
/// Bound on one PTY write or resize.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one provider TTL refresh.
const REFRESH_TIMEOUT: Duration = Duration::from_secs(8);
/// After a failed refresh, try again this much later.
const REFRESH_RETRY: Duration = Duration::from_secs(15);
/// Bound on one frame to the client: a client that stopped reading is treated as gone.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on closing the terminal.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle disconnect when the limit says 0.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(15 * 60);
/// The longest idle disconnect honoured.
pub const MAX_IDLE: Duration = Duration::from_secs(24 * 60 * 60);

/// The idle disconnect for `limits`: 0 means the default, and it is capped at a day.
pub fn idle_limit(limits: &Limits) -> Duration {
    match limits.terminal_idle_seconds {
        0 => DEFAULT_IDLE,
        s => Duration::from_secs(s).min(MAX_IDLE),
    }
}

fn invalid_ticket() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "invalid_ticket",
        "a valid, unused terminal ticket for this session is required \
         (POST /v1/sessions/{session}/terminal/ticket)",
    )
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/terminal/ticket",
    operation_id = "issueTerminalTicket",
    tag = "terminal",
    summary = "A short-lived, single-use ticket that authorises one terminal WebSocket upgrade for the session",
    params(api::SessionParam),
    responses(
        (status = 200, description = "The ticket", body = api::TerminalTicket),
        api::errors::TicketErrors,
    ),
)]
/// `POST /v1/sessions/{session}/terminal/ticket`.
pub async fn issue_ticket(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
) -> Result<Json<api::TerminalTicket>, ApiError> {
    let key = session_key(caller, &session)?;
    // Only for a session with a running sandbox: a ticket for nothing is pool space taken for
    // nothing (and the upgrade would refuse it anyway).
    state
        .manager
        .require_running(&key)
        .await
        .map_err(ApiError::from)?;
    let ticket = state.tickets.issue(key).map_err(|e| match e {
        IssueError::Full => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_tickets",
            "too many terminal tickets outstanding; try again shortly",
        ),
        IssueError::TenantFull(limit) => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "quota_exceeded",
            format!("this tenant holds {limit} unused terminal tickets already (limit tickets_per_tenant = {limit}); use or let them expire"),
        ),
        IssueError::Random(m) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("no randomness for a ticket: {m}"),
        ),
    })?;
    Ok(Json(api::TerminalTicket {
        ticket,
        expires_in_ms: api::millis(state.tickets.ttl()),
    }))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{session}/terminal",
    operation_id = "openTerminal",
    tag = "terminal",
    summary = "The interactive terminal over a WebSocket, authorised by a ticket (no bearer header); lookup-only",
    description = "A WebSocket upgrade (RFC 6455): the four handshake headers below are required, and a plain GET is refused with 4xx `websocket_upgrade_required` once its ticket is checked.",
    params(
        api::SessionParam,
        api::TerminalQuery,
        ("Connection" = String, Header, description = "`Upgrade`", pattern = "^[Uu][Pp][Gg][Rr][Aa][Dd][Ee]$"),
        ("Upgrade" = String, Header, description = "`websocket`", pattern = "^[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt]$"),
        ("Sec-WebSocket-Version" = String, Header, description = "`13`", pattern = "^13$"),
        ("Sec-WebSocket-Key" = String, Header, description = "16 random bytes, base64", pattern = "^[A-Za-z0-9+/]{22}==$"),
    ),
    responses(
        (
            status = 101,
            description = "Switching to the WebSocket protocol: binary frames carry PTY bytes both ways; text frames are `TerminalClientFrame` from the client (`{\"type\":\"resize\",..}`) and `TerminalServerFrame` from the service (first `{\"type\":\"opened\",\"pid\":N}`, the reattach handle for a later `pid=N`; at the end `{\"type\":\"exit\"|\"error\",..}`). A client close frame with code 1000 ends the terminal; any other end of the socket detaches it (kept for a reattach where the backend can, killed after `limits.terminal_idle_seconds` without a client)",
            extensions(
                ("x-websocket-client-frame" = json!({ "$ref": "#/components/schemas/TerminalClientFrame" })),
                ("x-websocket-server-frame" = json!({ "$ref": "#/components/schemas/TerminalServerFrame" })),
            ),
        ),
        api::errors::TerminalErrors,
    ),
)]
/// `GET /v1/sessions/{session}/terminal`: checks, opens the PTY, then upgrades.
pub async fn open(
    State(state): State<AppState>,
    SessionPath(session): SessionPath,
    query: Result<Query<api::TerminalQuery>, axum::extract::rejection::QueryRejection>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let session = SessionId::new(&session)
        .map_err(|e| ApiError::bad_request("invalid_session", e.message().to_owned()))?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let ticket = query
        .ticket
        .as_deref()
        .filter(|t| !t.is_empty())
        .ok_or_else(invalid_ticket)?;
    let key = state
        .tickets
        .check(ticket, &session)
        .ok_or_else(invalid_ticket)?;
    let upgrade = upgrade
        .map_err(|e| ApiError::new(e.status(), "websocket_upgrade_required", e.body_text()))?;
    let size = TerminalSize {
        cols: query.cols,
        rows: query.rows,
    };
    let open = match query.pid {
        Some(pid) => {
            if query.cwd.is_some() || query.env.is_some() || query.user.is_some() || query.resume {
                return Err(ApiError::bad_request(
                    "invalid_query",
                    "pid reattaches to a running terminal: cwd, env, user and resume belong to a new one",
                ));
            }
            Open::Reattach(pid)
        }
        None => Open::New(new_options(&query, size, idle_limit(&state.limits))?),
    };

    // Lookup-only checks, before the ticket is used up and before anything is opened.
    if !state.manager.supports_terminals() {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "terminal_unsupported",
            format!(
                "the {} backend cannot open terminals",
                state.manager.backend()
            ),
        ));
    }
    if matches!(open, Open::Reattach(_)) && !state.manager.supports_terminal_reattach() {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "terminal_reattach_unsupported",
            format!(
                "the {} backend cannot reattach to terminals: they end with their connection",
                state.manager.backend()
            ),
        ));
    }
    if query.resume {
        let bound = state.manager.peek(&key).await.map_err(ApiError::from)?;
        if bound.is_none() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "no_live_sandbox",
                format!("session {} has no sandbox", key.session),
            ));
        }
    } else {
        state
            .manager
            .require_running(&key)
            .await
            .map_err(ApiError::from)?;
    }
    if !state.tickets.redeem(ticket, &key) {
        // Used by a concurrent upgrade, or expired meanwhile.
        return Err(invalid_ticket());
    }

    let lease = match open {
        Open::New(options) => state.manager.open_terminal(&key, options).await,
        Open::Reattach(pid) => state.manager.reattach_terminal(&key, pid, size).await,
    };
    let (terminal, slot) = lease.map_err(ApiError::from)?.into_parts();
    // From here on the guard detaches the terminal whatever happens, including a failed
    // upgrade (the callback below is then dropped without running).
    let guard = EndOnDrop(Some(terminal.input.clone()));
    let relay = Relay {
        manager: state.manager.clone(),
        metrics: state.metrics.clone(),
        key,
        idle: idle_limit(&state.limits),
    };
    Ok(upgrade
        .max_message_size(MAX_MESSAGE_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .on_upgrade(move |socket| async move {
            relay.run(socket, terminal, guard).await;
            // The tenant's terminal slot is free once the relay is over.
            drop(slot);
        }))
}

/// What the upgrade does: open a new terminal, or reattach to a running one.
#[derive(Debug)]
enum Open {
    New(TerminalOptions),
    Reattach(u32),
}

/// The options of a new terminal from the query, validated (before the ticket is used up).
fn new_options(
    query: &api::TerminalQuery,
    size: TerminalSize,
    idle: Duration,
) -> Result<TerminalOptions, ApiError> {
    let cwd = query
        .cwd
        .as_deref()
        .map(SandboxPath::new)
        .transpose()
        .map_err(ApiError::from)?;
    let env = match query.env.as_deref() {
        None => std::collections::BTreeMap::new(),
        Some(raw) => serde_json::from_str(raw).map_err(|e| {
            ApiError::bad_request(
                "invalid_query",
                format!("env must be a JSON object of strings, such as {{\"A\":\"1\"}}: {e}"),
            )
        })?,
    };
    let options = TerminalOptions {
        size: size.or(TerminalSize::DEFAULT),
        cwd,
        user: query.user.clone(),
        env,
        detach_timeout: Some(idle),
        allow_resume: query.resume,
    };
    options.validate().map_err(ApiError::from)?;
    Ok(options)
}

/// Ends the terminal input when dropped without [`EndOnDrop::end`] having run: a detach (the
/// relay was dropped, so nobody said the terminal is done).
struct EndOnDrop(Option<Arc<dyn TerminalInput>>);

impl EndOnDrop {
    /// Closes (`close`: the shell is hung up) or detaches it.
    async fn end(mut self, close: bool) {
        if let Some(input) = self.0.take() {
            end_input(input, close).await;
        }
    }
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Some(input) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(end_input(input, false));
        }
    }
}

async fn end_input(input: Arc<dyn TerminalInput>, close: bool) {
    let ended = if close {
        timeout(CLOSE_TIMEOUT, input.close()).await
    } else {
        timeout(CLOSE_TIMEOUT, input.detach()).await
    };
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, close, "ending a terminal failed"),
        Err(_) => tracing::warn!(close, "ending a terminal timed out"),
    }
}

/// Aborts a helper task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One item of the input queue: resizes travel with the keystrokes so their order holds.
#[derive(Debug)]
enum InputOp {
    Keys(Vec<u8>),
    Resize(TerminalSize),
}

/// Why the relay ended.
#[derive(Debug)]
enum End {
    /// The client's close frame said 1000: it is done with the terminal.
    ClientDone,
    /// A close frame with another code, or none: the client only went away.
    ClientClosed,
    ClientGone,
    Exited(Option<i32>),
    Failed(sandbox_core::Error),
    Idle,
}

struct Relay {
    manager: SessionManager,
    metrics: Arc<Metrics>,
    key: BindingKey,
    idle: Duration,
}

impl Relay {
    async fn run(self, mut socket: WebSocket, terminal: Terminal, guard: EndOnDrop) {
        let Terminal {
            mut output,
            input,
            pid,
        } = terminal;
        if !send(
            &mut socket,
            text_frame(&api::TerminalServerFrame::Opened { pid }),
        )
        .await
        {
            drop(output);
            guard.end(false).await;
            return;
        }
        let (tx, rx) = mpsc::channel::<InputOp>(INPUT_QUEUE);
        let writer = AbortOnDrop(tokio::spawn(write_loop(input, rx)));
        let refresher = AbortOnDrop(tokio::spawn(refresh_loop(
            self.manager.clone(),
            self.key.clone(),
        )));
        let mut deadline = Instant::now() + self.idle;
        let end = loop {
            tokio::select! {
                message = socket.recv() => match message {
                    None | Some(Err(_)) => break End::ClientGone,
                    Some(Ok(Message::Close(frame))) => {
                        break match frame {
                            Some(f) if f.code == close_code::NORMAL => End::ClientDone,
                            _ => End::ClientClosed,
                        };
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                    Some(Ok(Message::Binary(data))) => {
                        if data.is_empty() {
                            continue;
                        }
                        deadline = Instant::now() + self.idle;
                        if tx.send(InputOp::Keys(data.to_vec())).await.is_err() {
                            break End::ClientGone;
                        }
                    }
                    Some(Ok(Message::Text(text))) => {
                        match serde_json::from_str::<api::TerminalClientFrame>(text.as_str()) {
                            Ok(api::TerminalClientFrame::Resize { cols, rows }) => {
                                if tx.send(InputOp::Resize(TerminalSize { cols, rows })).await.is_err() {
                                    break End::ClientGone;
                                }
                            }
                            Err(e) => {
                                let frame = api::TerminalServerFrame::Error {
                                    code: "invalid_message".to_owned(),
                                    message: format!("text frames carry control messages such as {{\"type\":\"resize\",\"cols\":80,\"rows\":24}}: {e}"),
                                };
                                if !send(&mut socket, text_frame(&frame)).await {
                                    break End::ClientGone;
                                }
                            }
                        }
                    }
                },
                event = output.next_event() => match event {
                    Some(TerminalEvent::Data(bytes)) => {
                        if bytes.is_empty() {
                            continue;
                        }
                        deadline = Instant::now() + self.idle;
                        if !send(&mut socket, Message::Binary(bytes.into())).await {
                            break End::ClientGone;
                        }
                    }
                    Some(TerminalEvent::Exited(code)) => break End::Exited(code),
                    Some(TerminalEvent::Failed(e)) => break End::Failed(e),
                    None => break End::Exited(None),
                },
                () = tokio::time::sleep_until(deadline) => break End::Idle,
            }
        };
        // Stop feeding and refreshing, then end the terminal before telling the client: a close
        // when it is over or the client said it is done, else a detach (the output stream goes
        // first, so a backend that keeps the shell sees nobody attached).
        drop(tx);
        drop(writer);
        drop(refresher);
        drop(output);
        let close = matches!(end, End::ClientDone | End::Exited(_) | End::Failed(_));
        guard.end(close).await;
        tracing::debug!(session = %self.key, end = ?end, "terminal closed");
        let (last, close) = match end {
            End::ClientGone => return,
            End::ClientDone | End::ClientClosed => {
                // Let tungstenite flush its reply to the client's close frame.
                let _ = timeout(Duration::from_secs(1), socket.recv()).await;
                return;
            }
            End::Exited(code) => (
                Some(api::TerminalServerFrame::Exit {
                    code: code.unwrap_or(-1),
                }),
                (close_code::NORMAL, "terminal exited"),
            ),
            End::Failed(e) => {
                self.metrics.observe_error(&e);
                let api = ApiError::from(e);
                (
                    Some(api::TerminalServerFrame::Error {
                        code: api.code.to_owned(),
                        message: api.message,
                    }),
                    (close_code::ERROR, "terminal failed"),
                )
            }
            End::Idle => (None, (close_code::NORMAL, "idle timeout")),
        };
        if let Some(frame) = last
            && !send(&mut socket, text_frame(&frame)).await
        {
            return;
        }
        let frame = CloseFrame {
            code: close.0,
            reason: Utf8Bytes::from_static(close.1),
        };
        if send(&mut socket, Message::Close(Some(frame))).await {
            // Wait (briefly) for the client's close reply, discarding anything else.
            let _ = timeout(Duration::from_secs(2), async {
                while let Some(Ok(m)) = socket.recv().await {
                    if matches!(m, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
    }
}

/// A text frame of the service.
fn text_frame(frame: &api::TerminalServerFrame) -> Message {
    // The frame types always serialize; `null` would be a frame the client ignores.
    Message::Text(
        serde_json::to_string(frame)
            .unwrap_or_else(|_| "null".to_owned())
            .into(),
    )
}

/// Sends one message; false when the client is gone or stopped reading.
async fn send(socket: &mut WebSocket, message: Message) -> bool {
    matches!(
        timeout(SEND_TIMEOUT, socket.send(message)).await,
        Ok(Ok(()))
    )
}

/// The PTY input coalescer: takes the first queued chunk, drains whatever else is queued up to
/// [`COALESCE_BYTES`], writes once. No timer: the first key goes out at once. Write errors are
/// dropped (the output stream reports a dead terminal).
async fn write_loop(input: Arc<dyn TerminalInput>, mut rx: mpsc::Receiver<InputOp>) {
    let mut pending: Option<InputOp> = None;
    loop {
        let op = match pending.take() {
            Some(op) => op,
            None => match rx.recv().await {
                Some(op) => op,
                None => return,
            },
        };
        match op {
            InputOp::Resize(size) => {
                if let Ok(Err(e)) = timeout(WRITE_TIMEOUT, input.resize(size)).await {
                    tracing::debug!(error = %e, "terminal resize failed");
                }
            }
            InputOp::Keys(mut buf) => {
                while buf.len() < COALESCE_BYTES {
                    match rx.try_recv() {
                        Ok(InputOp::Keys(more)) if buf.len() + more.len() <= COALESCE_BYTES => {
                            buf.extend_from_slice(&more);
                        }
                        Ok(other) => {
                            pending = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                if let Ok(Err(e)) = timeout(WRITE_TIMEOUT, input.write(&buf)).await {
                    tracing::debug!(error = %e, "terminal write failed");
                }
            }
        }
    }
}

/// Refreshes the provider's idle timer while the terminal is open: at once, then at the interval
/// `keep_alive` answers; stops when it answers zero (nothing to refresh).
async fn refresh_loop(manager: SessionManager, key: BindingKey) {
    loop {
        let next = match timeout(REFRESH_TIMEOUT, manager.keep_alive(&key)).await {
            Ok(Ok(next)) if next.is_zero() => return,
            Ok(Ok(next)) => next,
            Ok(Err(e)) => {
                tracing::warn!(session = %key, error = %e, "terminal keep-alive failed");
                REFRESH_RETRY
            }
            Err(_) => {
                tracing::warn!(session = %key, "terminal keep-alive timed out");
                REFRESH_RETRY
            }
        };
        tokio::time::sleep(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_limit_defaults_and_caps() {
        let mut limits = Limits::default();
        assert_eq!(idle_limit(&limits), DEFAULT_IDLE);
        limits.terminal_idle_seconds = 0;
        assert_eq!(idle_limit(&limits), DEFAULT_IDLE);
        limits.terminal_idle_seconds = 2;
        assert_eq!(idle_limit(&limits), Duration::from_secs(2));
        limits.terminal_idle_seconds = u64::MAX;
        assert_eq!(idle_limit(&limits), MAX_IDLE);
    }

    #[test]
    fn control_messages_parse() {
        let c: api::TerminalClientFrame =
            serde_json::from_str(r#"{"type":"resize","cols":123,"rows":45}"#).unwrap();
        assert!(matches!(
            c,
            api::TerminalClientFrame::Resize {
                cols: 123,
                rows: 45
            }
        ));
        assert!(serde_json::from_str::<api::TerminalClientFrame>(r#"{"type":"paste"}"#).is_err());
        assert!(
            serde_json::from_str::<api::TerminalClientFrame>(
                r#"{"type":"resize","cols":-1,"rows":1}"#
            )
            .is_err()
        );
    }

    #[derive(Debug, Default)]
    struct Recorder(std::sync::Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl TerminalInput for Recorder {
        async fn write(&self, data: &[u8]) -> Result<(), sandbox_core::Error> {
            self.0
                .lock()
                .unwrap()
                .push(format!("w{}", String::from_utf8_lossy(data).len()));
            Ok(())
        }
        async fn resize(&self, size: TerminalSize) -> Result<(), sandbox_core::Error> {
            self.0
                .lock()
                .unwrap()
                .push(format!("r{}x{}", size.cols, size.rows));
            Ok(())
        }
        async fn close(&self) -> Result<(), sandbox_core::Error> {
            self.0.lock().unwrap().push("close".to_owned());
            Ok(())
        }
        async fn detach(&self) -> Result<(), sandbox_core::Error> {
            self.0.lock().unwrap().push("detach".to_owned());
            Ok(())
        }
    }

    #[tokio::test]
    async fn coalescer_drains_up_to_4k_and_keeps_order() {
        let rec = Arc::new(Recorder::default());
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        // Queue before the writer runs, so everything is there to drain.
        for _ in 0..3 {
            tx.send(InputOp::Keys(vec![b'a'; 1000])).await.unwrap();
        }
        tx.send(InputOp::Keys(vec![b'b'; 1500])).await.unwrap(); // would pass 4096
        tx.send(InputOp::Resize(TerminalSize { cols: 9, rows: 8 }))
            .await
            .unwrap();
        tx.send(InputOp::Keys(vec![b'c'; 10])).await.unwrap();
        tx.send(InputOp::Keys(vec![b'd'; 10])).await.unwrap();
        drop(tx);
        write_loop(rec.clone(), rx).await;
        assert_eq!(
            *rec.0.lock().unwrap(),
            ["w3000", "w1500", "r9x8", "w20"].map(str::to_owned)
        );
    }

    #[tokio::test]
    async fn guard_detaches_on_drop_and_ends_as_told() {
        let rec = Arc::new(Recorder::default());
        drop(EndOnDrop(Some(rec.clone())));
        for _ in 0..100 {
            if !rec.0.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*rec.0.lock().unwrap(), ["detach".to_owned()]);
        let rec2 = Arc::new(Recorder::default());
        EndOnDrop(Some(rec2.clone())).end(true).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(*rec2.0.lock().unwrap(), ["close".to_owned()], "closed once");
        let rec3 = Arc::new(Recorder::default());
        EndOnDrop(Some(rec3.clone())).end(false).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(*rec3.0.lock().unwrap(), ["detach".to_owned()]);
    }

    #[test]
    fn new_terminal_options_come_from_the_query_validated() {
        let idle = Duration::from_secs(120);
        let query = |cwd: Option<&str>, user: Option<&str>, env: Option<&str>| api::TerminalQuery {
            cwd: cwd.map(str::to_owned),
            user: user.map(str::to_owned),
            env: env.map(str::to_owned),
            ..api::TerminalQuery::default()
        };
        let o = new_options(
            &query(Some("/tmp/x"), Some("app"), Some(r#"{"FOO":"bar"}"#)),
            TerminalSize { cols: 0, rows: 0 },
            idle,
        )
        .unwrap();
        assert_eq!(o.cwd.unwrap().as_str(), "/tmp/x");
        assert_eq!(o.user.as_deref(), Some("app"));
        assert_eq!(o.env["FOO"], "bar");
        assert_eq!(o.detach_timeout, Some(idle));
        assert_eq!(o.size, TerminalSize::DEFAULT);
        let code = |q: api::TerminalQuery| {
            new_options(&q, TerminalSize::DEFAULT, idle)
                .unwrap_err()
                .code
        };
        assert_eq!(code(query(Some("relative"), None, None)), "invalid_path");
        assert_eq!(code(query(None, None, Some("[1]"))), "invalid_query");
        assert_eq!(code(query(None, None, Some(r#"{"A":1}"#))), "invalid_query");
        assert_eq!(
            code(query(None, None, Some(r#"{"A B":"1"}"#))),
            "invalid_command"
        );
        assert_eq!(code(query(None, Some("-x"), None)), "invalid_command");
    }
}
