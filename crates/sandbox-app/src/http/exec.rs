//! `POST /v1/sessions/{session}/exec`: run a command in the session's sandbox (created on first
//! use). The body is an `ExecSpec` (`{"command":"echo","args":["hi"]}` or
//! `{"command":"ls | wc -l","shell":true}`, plus stdin, env, cwd, timeout_ms).
//!
//! Buffered by default: one JSON result (`stdout_b64`/`stderr_b64` carry the exact bytes when
//! they are not UTF-8). With `?stream=true` the answer is NDJSON — one
//! `{"stream":"stdout"|"stderr","data":"..."}` line per output chunk as it happens (text cut at
//! character boundaries; `"data_b64"` instead of `"data"` for bytes that are not UTF-8), then
//! one `{"exit_code":..}` line (or `{"error":{..}}`). A client that disconnects mid-stream cancels
//! the exec, which kills the command inside the sandbox.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream::StreamExt;
use sandbox_core::{ExecRequest, ExecSpec, OutputHook, OutputStream};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::output::{Piece, Utf8Carry};
use super::{AppState, Caller, SessionPath, session_key};
use crate::api;

/// Output bytes queued for a slow streaming client before forwarding stops.
const MAX_QUEUED_BYTES: usize = 8 * 1024 * 1024;

/// Parses the body, turning every failure into a 400 with a code the route documents.
pub fn parse_spec(body: &[u8]) -> Result<ExecRequest, ApiError> {
    let spec: api::ExecSpec = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("exec body: {e}")))?;
    ExecRequest::try_from(ExecSpec::from(spec)).map_err(ApiError::from)
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/exec",
    operation_id = "exec",
    tag = "exec",
    summary = "Runs a command in the session's sandbox, created on first use",
    params(api::SessionParam, api::ExecQuery),
    request_body(
        content = api::ExecSpec,
        content_type = "application/json",
        description = "An exec spec: argv form (`command` + `args`) or shell form (`shell: true`, no `args`), plus `stdin`, `env`, `cwd`, `user`, `timeout_ms`",
    ),
    responses(
        (
            status = 200,
            description = "The result (buffered), or with `?stream=true` an NDJSON stream whose every line is an `ExecStreamLine`: `{\"stream\":\"stdout\"|\"stderr\",\"data\":\"...\"}` per output chunk (text cut at character boundaries; `data_b64` instead of `data` for bytes that are not UTF-8), then a final result or error line",
            content(
                (api::ExecResult = "application/json"),
                (api::ExecStreamLine = "application/x-ndjson"),
            ),
        ),
        api::errors::ExecErrors,
    ),
)]
/// The handler.
pub async fn exec(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    query: Result<Query<api::ExecQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let key = session_key(caller, &session)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let body = super::body::read_json_bytes(&state, &headers, body).await?;
    let request = parse_spec(&body)?;
    drop(body);
    if !query.stream {
        let result = state
            .manager
            .exec(&key, request)
            .await
            .map_err(ApiError::from)?;
        return Ok(Json(api::ExecResult::from(&result)).into_response());
    }

    // Streaming: chunks flow through a channel from the output hook to the response body; the
    // exec runs on its own task, aborted (which kills the command) when the client goes away.
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let chunks = tx.clone();
    // The hook cannot wait for a slow client (it runs on the adapter's read loop), so the bytes
    // queued for the client are bounded instead: past the bound, output stops being forwarded
    // and the final line says `"stream_overflow": true`.
    let queued = Arc::new(AtomicUsize::new(0));
    let overflow = Arc::new(AtomicBool::new(false));
    let (hook_queued, hook_overflow) = (queued.clone(), overflow.clone());
    // Each stream's text is cut at character boundaries, not at the adapter's chunk edges.
    let carries: Arc<Mutex<[Utf8Carry; 2]>> = Arc::default();
    let hook_carries = carries.clone();
    let hook = OutputHook::new(move |stream, chunk| {
        if hook_overflow.load(Ordering::Relaxed) {
            return;
        }
        let piece = {
            let mut carries = hook_carries.lock().unwrap_or_else(PoisonError::into_inner);
            carries[stream_index(stream)].push(chunk)
        };
        let Some(piece) = piece else {
            return;
        };
        let line = output_line(stream, piece);
        if hook_queued.fetch_add(line.len(), Ordering::AcqRel) + line.len() > MAX_QUEUED_BYTES {
            hook_overflow.store(true, Ordering::Relaxed);
            return;
        }
        let _ = chunks.send(line);
    });
    let final_overflow = overflow.clone();
    let manager = state.manager.clone();
    let metrics = state.metrics.clone();
    let task = tokio::spawn(async move {
        let outcome = manager.exec(&key, request.on_output(hook)).await;
        // Characters the output ended in the middle of go out as they are.
        if !final_overflow.load(Ordering::Relaxed) {
            let mut carries = carries.lock().unwrap_or_else(PoisonError::into_inner);
            for stream in [OutputStream::Stdout, OutputStream::Stderr] {
                if let Some(piece) = carries[stream_index(stream)].finish() {
                    let _ = tx.send(output_line(stream, piece));
                }
            }
        }
        let last = match outcome {
            Ok(result) => {
                // The output already went out line by line: the last line carries none of it
                // (the adapter kept none, and nothing here may repeat it outside the queue
                // bound).
                api::ExecStreamLine::End(api::ExecEnd {
                    exit_code: result.exit_code,
                    killed: result.killed,
                    duration_ms: api::millis(result.duration),
                    truncated: result.truncated,
                    stream_overflow: final_overflow.load(Ordering::Relaxed),
                })
            }
            Err(e) => {
                metrics.observe_error(&e);
                api::ExecStreamLine::Error(ApiError::from(e).body())
            }
        };
        let _ = tx.send(ndjson_line(&last));
    });
    let guard = AbortOnDrop(task);
    let body = tokio_stream_of(rx).map(move |chunk| {
        let _keep = &guard;
        queued.fetch_sub(
            chunk.len().min(queued.load(Ordering::Acquire)),
            Ordering::AcqRel,
        );
        Ok::<_, Infallible>(chunk)
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response())
}

fn stream_index(stream: OutputStream) -> usize {
    match stream {
        OutputStream::Stdout => 0,
        OutputStream::Stderr => 1,
    }
}

/// `{"stream":"stdout","data":"..."}` (or `"data_b64"` for bytes that are not UTF-8), newline
/// terminated.
fn output_line(stream: OutputStream, piece: Piece) -> Bytes {
    ndjson_line(&api::ExecStreamLine::Output(
        piece.into_output(stream.into()),
    ))
}

/// One NDJSON line. The API types always serialize; were one ever not to, the line says so in
/// the error shape instead of vanishing.
fn ndjson_line(line: &api::ExecStreamLine) -> Bytes {
    let mut text = serde_json::to_string(line).unwrap_or_else(|e| {
        format!(
            r#"{{"error":{{"code":"internal","message":"an output line failed to encode: {e}"}}}}"#
        )
    });
    text.push('\n');
    Bytes::from(text)
}

/// Aborts the exec task when the response body is dropped (the client went away).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An `UnboundedReceiver` as a stream (ends when every sender is gone).
fn tokio_stream_of(
    mut rx: mpsc::UnboundedReceiver<Bytes>,
) -> impl futures_util::Stream<Item = Bytes> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
