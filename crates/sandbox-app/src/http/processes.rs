//! Background processes of a session's sandbox (capability `processes`, issue 17).
//!
//! | route | sandbox |
//! |---|---|
//! | `POST /v1/sessions/{session}/processes` | provisions; 201 with the process |
//! | `GET /v1/sessions/{session}/processes` | lookup-only; unbound lists nothing |
//! | `GET …/processes/{process}/attach?from=` | lookup-only; NDJSON stream |
//! | `POST …/processes/{process}/stdin` | lookup-only; the body's bytes, 204 |
//! | `DELETE …/processes/{process}/stdin` | lookup-only; closes stdin, 204 |
//! | `POST …/processes/{process}/signal` | lookup-only; `{"signal":"TERM"}`, 204 |
//!
//! `{process}` is a pid (digits) or the tag the process was started with. A backend that does
//! not declare `processes` answers every route 501 `processes_unsupported`, checked before any
//! body is read.
//!
//! # The attach stream
//!
//! `application/x-ndjson`, one [`api::ProcessStreamLine`] per line, chosen so a plain HTTP
//! client can read it line by line and resume it after a dropped connection:
//! - `{"type":"data","stream":"stdout","offset":N,"data":"..."}` (or `"data_b64"` when the
//!   chunk is not UTF-8 on its own: the bytes are exact, never re-cut, so offsets stay exact);
//! - `{"type":"gap","from":A,"to":B}`: output `A..B` is no longer in the replay ring;
//! - `{"type":"exited","offset":N,"exit_code":C}` (or `"signal":"KILL"`): the last line;
//! - `{"type":"error","offset":N,"code":..,"message":..}`: the stream failed, the process may
//!   still run (the last line).
//!
//! Offsets count stdout and stderr together. To resume, attach again with `?from=` the offset
//! after the last line handled. `from` absent means live output only; an offset past what was
//! produced is 400 `invalid_offset`. Each open attach takes one of the tenant's
//! `quotas.max_streams` slots until its response body is dropped. Nothing is queued for a slow
//! client: the next event is pulled from the backend only when the client took the previous
//! line, so an attach costs the backend's replay ring, not the service's memory. Dropping the
//! connection detaches; the process keeps running.

use std::convert::Infallible;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sandbox_core::{
    BindingKey, ProcessEvent, ProcessSelector, ProcessStatus, ProcessStream, ProcessTag, Signal,
};

use super::body::{read_json, read_json_bytes};
use super::error::ApiError;
use super::metrics::Metrics;
use super::{AppState, Caller, SessionPath, session_key};
use crate::api;

/// The `{session}` and `{process}` segments of a process route. A segment that does not
/// decode is a 400 `invalid_session`, in the API's error shape.
#[derive(Debug)]
pub struct ProcessPath {
    pub session: String,
    pub process: String,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ProcessPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let axum::extract::Path((session, process)) =
            axum::extract::Path::<(String, String)>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::bad_request("invalid_session", e.body_text()))?;
        Ok(ProcessPath { session, process })
    }
}

/// A pid (digits only) or a tag.
pub fn selector(raw: &str) -> Result<ProcessSelector, ApiError> {
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        return raw.parse::<u32>().map(ProcessSelector::Pid).map_err(|_| {
            ApiError::bad_request(
                "invalid_process",
                format!("pid {raw} is out of range (at most {})", u32::MAX),
            )
        });
    }
    ProcessTag::new(raw)
        .map(ProcessSelector::Tag)
        .map_err(|e| ApiError::bad_request("invalid_process", e.message().to_owned()))
}

/// 501 `processes_unsupported` when the backend does not declare `processes`.
fn require_processes(state: &AppState) -> Result<(), ApiError> {
    if state.manager.supports_processes() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "processes_unsupported",
        format!(
            "the {} backend cannot run background processes",
            state.manager.backend()
        ),
    ))
}

/// The session and the process of a `{process}` route, in that order, then the capability.
fn key_and_target(
    state: &AppState,
    caller: Caller,
    path: &ProcessPath,
) -> Result<(BindingKey, ProcessSelector), ApiError> {
    let key = session_key(caller, &path.session)?;
    let target = selector(&path.process)?;
    require_processes(state)?;
    Ok((key, target))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/processes",
    operation_id = "startProcess",
    tag = "processes",
    summary = "Starts a process in the background (provisions the sandbox); it runs on after the call, found again by pid or tag",
    params(api::SessionParam),
    request_body(
        content = api::ProcessStartRequest,
        content_type = "application/json",
        description = "Argv form (`command` + `args`) or shell form (`shell: true`), plus `env`, `cwd`, `user`, an optional `tag` and whether `stdin` stays open",
    ),
    responses(
        (status = 201, description = "Started", body = api::Process),
        api::errors::ProcessStartErrors,
    ),
)]
/// `POST …/processes`.
pub async fn start(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    body: Body,
) -> Result<(StatusCode, Json<api::Process>), ApiError> {
    let key = session_key(caller, &session)?;
    require_processes(&state)?;
    let body = read_json_bytes(&state, &headers, body).await?;
    let request: api::ProcessStartRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("process body: {e}")))?;
    drop(body);
    let spec = request.into_spec().map_err(ApiError::from)?;
    let info = state
        .manager
        .start_process(&key, spec)
        .await
        .map_err(ApiError::from)?;
    Ok((StatusCode::CREATED, Json(api::Process::from(info))))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{session}/processes",
    operation_id = "listProcesses",
    tag = "processes",
    summary = "The session's background processes, running and recently ended (lookup-only: an unbound session lists none)",
    params(api::SessionParam),
    responses(
        (status = 200, description = "The processes", body = api::ProcessList),
        api::errors::ProcessListErrors,
    ),
)]
/// `GET …/processes`.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
) -> Result<Json<api::ProcessList>, ApiError> {
    let key = session_key(caller, &session)?;
    require_processes(&state)?;
    let processes = state
        .manager
        .list_processes(&key)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(api::ProcessList {
        processes: processes.into_iter().map(api::Process::from).collect(),
    }))
}

/// The `from` query parameter: absent, or a non-negative integer (`invalid_offset` otherwise).
fn offset(raw: Option<&str>) -> Result<Option<u64>, ApiError> {
    raw.map(|raw| {
        raw.trim().parse::<u64>().map_err(|_| {
            ApiError::bad_request(
                "invalid_offset",
                format!("from must be a non-negative integer offset, got {raw:?}"),
            )
        })
    })
    .transpose()
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{session}/processes/{process}/attach",
    operation_id = "attachProcess",
    tag = "processes",
    summary = "The process's output as an NDJSON stream, replayed from `from` (lookup-only; detaching leaves the process running)",
    params(api::ProcessParam, api::AttachQuery),
    responses(
        (
            status = 200,
            description = "An NDJSON stream whose every line is a `ProcessStreamLine`: `data` lines at their offsets, a `gap` for output the ring no longer holds, then `exited` (or `error`) last. Resume with `?from=` the offset after the last line handled",
            body = api::ProcessStreamLine,
            content_type = "application/x-ndjson",
        ),
        api::errors::AttachErrors,
    ),
)]
/// `GET …/processes/{process}/attach?from=`.
pub async fn attach(
    State(state): State<AppState>,
    caller: Caller,
    path: ProcessPath,
    q: Result<Query<api::AttachQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let key = session_key(caller, &path.session)?;
    let target = selector(&path.process)?;
    let Query(q) = q.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let from = offset(q.from.as_deref())?;
    require_processes(&state)?;
    let (stream, slot) = state
        .manager
        .attach_process(&key, &target, from)
        .await
        .map_err(ApiError::from)?
        .into_parts();
    let relay = AttachRelay {
        stream: Some(stream),
        next: from.unwrap_or(0),
        metrics: state.metrics.clone(),
        _slot: slot,
    };
    let body = futures_util::stream::unfold(relay, |mut relay| async move {
        let line = relay.next_line().await?;
        Some((Ok::<_, Infallible>(line), relay))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response())
}

/// One attach's state: the backend stream (dropped after the last line), the offset after
/// the last byte sent, and the tenant's stream slot.
struct AttachRelay {
    stream: Option<ProcessStream>,
    next: u64,
    metrics: std::sync::Arc<Metrics>,
    _slot: sandbox_session::quota::QuotaPermit,
}

impl AttachRelay {
    /// The next line, or `None` once the stream is over.
    async fn next_line(&mut self) -> Option<Bytes> {
        let stream = self.stream.as_mut()?;
        let (line, last) = match stream.next_event().await {
            None => return None,
            Some(ProcessEvent::Data {
                stream,
                offset,
                data,
            }) => {
                self.next = offset.saturating_add(data.len() as u64);
                let (text, b64) = match String::from_utf8(data) {
                    Ok(text) => (Some(text), None),
                    Err(e) => (
                        None,
                        Some(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
                    ),
                };
                let line = api::ProcessStreamLine::Data {
                    stream: stream.into(),
                    offset,
                    data: text,
                    data_b64: b64,
                };
                (line, false)
            }
            Some(ProcessEvent::Gap { from, to }) => {
                self.next = to;
                (api::ProcessStreamLine::Gap { from, to }, false)
            }
            Some(ProcessEvent::Exited(status)) => {
                let (exit_code, signal) = match status {
                    ProcessStatus::Exited { exit_code, signal } => {
                        (exit_code, signal.map(|s| s.as_str().to_owned()))
                    }
                    ProcessStatus::Running => (None, None),
                };
                let line = api::ProcessStreamLine::Exited {
                    offset: self.next,
                    exit_code,
                    signal,
                };
                (line, true)
            }
            Some(ProcessEvent::Failed(e)) => {
                self.metrics.observe_error(&e);
                tracing::warn!(error = %e, "process attach ended early");
                let body = ApiError::from(e).body().error;
                let line = api::ProcessStreamLine::Error {
                    offset: self.next,
                    code: body.code,
                    message: body.message,
                };
                (line, true)
            }
        };
        if last {
            // Detach now rather than when the client gets round to closing.
            self.stream = None;
        }
        Some(ndjson(&line))
    }
}

/// One NDJSON line of any API type. The API types always serialize; were one ever not to, the
/// line says so in the error shape instead of vanishing.
pub(super) fn ndjson<T: serde::Serialize>(line: &T) -> Bytes {
    let mut text = serde_json::to_string(line).unwrap_or_else(|e| {
        format!(
            r#"{{"type":"error","offset":0,"code":"internal","message":"a stream line failed to encode: {e}"}}"#
        )
    });
    text.push('\n');
    Bytes::from(text)
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/processes/{process}/stdin",
    operation_id = "sendProcessInput",
    tag = "processes",
    summary = "Writes the body's bytes to the process's stdin (started with `stdin: true`; lookup-only)",
    params(api::ProcessParam),
    request_body(
        content = String,
        content_type = "application/octet-stream",
        description = "The bytes, at most `limits.json_max_bytes`",
    ),
    responses(
        (status = 204, description = "Written"),
        api::errors::StdinErrors,
    ),
)]
/// `POST …/processes/{process}/stdin`.
pub async fn send_input(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    path: ProcessPath,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let (key, target) = key_and_target(&state, caller, &path)?;
    let data = read_json_bytes(&state, &headers, body).await?;
    state
        .manager
        .send_input(&key, &target, &data)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{session}/processes/{process}/stdin",
    operation_id = "closeProcessStdin",
    tag = "processes",
    summary = "Closes the process's stdin: it reads end of file (idempotent while it runs; lookup-only)",
    params(api::ProcessParam),
    responses(
        (status = 204, description = "Closed"),
        api::errors::CloseStdinErrors,
    ),
)]
/// `DELETE …/processes/{process}/stdin`.
pub async fn close_stdin(
    State(state): State<AppState>,
    caller: Caller,
    path: ProcessPath,
) -> Result<StatusCode, ApiError> {
    let (key, target) = key_and_target(&state, caller, &path)?;
    state
        .manager
        .close_stdin(&key, &target)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/processes/{process}/signal",
    operation_id = "signalProcess",
    tag = "processes",
    summary = "Sends a signal to the process (an empty body sends `TERM`; lookup-only)",
    params(api::ProcessParam),
    request_body(
        content = api::SignalRequest,
        content_type = "application/json",
        description = "`{\"signal\":\"KILL\"}`; empty for `TERM`",
    ),
    responses(
        (status = 204, description = "Sent"),
        api::errors::SignalErrors,
    ),
)]
/// `POST …/processes/{process}/signal`.
pub async fn signal(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    path: ProcessPath,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let (key, target) = key_and_target(&state, caller, &path)?;
    let request: api::SignalRequest = read_json(&state, &headers, body, "signal", true).await?;
    let signal = Signal::parse(&request.signal).map_err(ApiError::from)?;
    state
        .manager
        .signal_process(&key, &target, signal)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_named_by_pid_or_tag() {
        assert_eq!(selector("42").unwrap(), ProcessSelector::Pid(42));
        assert_eq!(
            selector("build-1").unwrap(),
            ProcessSelector::Tag(ProcessTag::new("build-1").unwrap())
        );
        for bad in ["99999999999", "", "a b", "-x", "ä"] {
            assert_eq!(
                selector(bad).unwrap_err().code,
                "invalid_process",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn offsets_are_integers_or_absent() {
        assert_eq!(offset(None).unwrap(), None);
        assert_eq!(offset(Some("0")).unwrap(), Some(0));
        assert_eq!(offset(Some(" 17 ")).unwrap(), Some(17));
        for bad in ["-1", "x", "", "1.5"] {
            assert_eq!(
                offset(Some(bad)).unwrap_err().code,
                "invalid_offset",
                "{bad:?}"
            );
        }
    }
}
