//! Streamed files, rename and directory watch (capabilities `streamed_files` and `watch`,
//! issue 17).
//!
//! | route | sandbox |
//! |---|---|
//! | `GET /v1/sessions/{session}/files/stream?path=` | lookup-only; the file's bytes |
//! | `PUT /v1/sessions/{session}/files/stream?path=` | provisions; model-write rule; `{"path","bytes"}` |
//! | `POST /v1/sessions/{session}/files/rename` | lookup-only; model-write rule on both paths; 204 |
//! | `GET /v1/sessions/{session}/watch?path=&recursive=` | lookup-only; NDJSON stream |
//!
//! The streamed routes never hold a file: an upload's request body *is* the source the
//! backend's `write_stream` pulls, frame by frame (no queue in between: the next frame is read
//! off the connection only when the backend asks for it, so a slow sandbox slows the client),
//! and a download's response body pulls the backend's `read_stream` as the client takes it.
//! Their size limit is `limits.stream_file_max_bytes`, not the whole-buffer
//! `limits.upload_max_bytes`, and nothing of them counts against the in-flight budget (the
//! service holds at most a frame of each). A declared `Content-Length` beyond the limit is
//! refused before reading; a body that passes it mid-way stops the write, which leaves the
//! target as it was (backend writes are atomic), and answers 413.
//!
//! A backend that does not declare `streamed_files` answers 501 `streamed_files_unsupported`
//! (the whole-buffer routes under `…/files/content` still work there); the service never
//! falls back to buffering. Likewise `watch` and 501 `watch_unsupported`.
//!
//! # The watch stream
//!
//! `application/x-ndjson`, one [`api::WatchStreamLine`] per line: first
//! `{"type":"started","path":..,"recursive":..}` once the watch is armed (every change after
//! it is reported), then `{"type":"event","kind":"create"|"write"|"remove"|"rename"|"chmod",
//! "path":..}` per change, and last `{"type":"ended"}` (the directory went away) or
//! `{"type":"error","code":..,"message":..}`. A client that reads too slowly gets
//! `watch_overflow` as that error once the backend's bounded queue is full (events were lost:
//! list the directory and watch again). Each watch takes one of the tenant's
//! `quotas.max_streams` slots until its response body is dropped.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream::StreamExt;
use sandbox_core::{ByteStream, Error, ErrorCode, Operation, SandboxPath, WatchStream};

use super::body::{DRAIN_MAX_BYTES, declared_length, drain, read_error, read_json};
use super::error::ApiError;
use super::files::{QueryResult, key_and_path, query, refuse_unread, sandbox_path};
use super::metrics::Metrics;
use super::processes::ndjson;
use super::{AppState, Caller, SessionPath, session_key};
use crate::api;
use crate::api::PathQuery;

/// 501 `streamed_files_unsupported` when the backend does not declare `streamed_files`.
fn require_streamed(state: &AppState) -> Result<(), ApiError> {
    if state.manager.supports_streamed_files() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "streamed_files_unsupported",
        format!(
            "the {} backend cannot stream files; use …/files/content (bounded by limits.upload_max_bytes)",
            state.manager.backend()
        ),
    ))
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!(
            "the upload is larger than the limit of {limit} bytes (limits.stream_file_max_bytes); nothing was written"
        ),
    )
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{session}/files/stream",
    operation_id = "downloadFileStream",
    tag = "files",
    summary = "A regular file's bytes, streamed end to end (lookup-only; at most `limits.stream_file_max_bytes`; needs a backend with `streamed_files`)",
    params(api::SessionParam, api::PathQuery),
    responses(
        (status = 200, description = "The file's bytes", body = String, content_type = "application/octet-stream"),
        api::errors::StreamDownloadErrors,
    ),
)]
/// `GET …/files/stream?path=`.
pub async fn download(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<Response, ApiError> {
    let (key, path) = key_and_path(caller, &session, q)?;
    require_streamed(&state)?;
    let stream = state
        .manager
        .read_stream(&key, &path, state.limits.stream_file_max_bytes)
        .await
        .map_err(ApiError::from)?;
    super::files::octet_stream(stream, &state.metrics).await
}

/// The request body as the source a backend's `write_stream` pulls. No buffer: each pull reads
/// the next frame off the connection. What went wrong on the client's side (a stalled body,
/// one past the limit) is kept in `refusal`, so the answer is the client's error, not the
/// backend's report of a failed source.
struct BodySource {
    stream: axum::body::BodyDataStream,
    seen: u64,
    limit: u64,
    refusal: Arc<Mutex<Option<ApiError>>>,
}

impl BodySource {
    fn refuse(&self, error: ApiError) -> Error {
        let message = error.message.clone();
        *self.refusal.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
        Error::invalid_request(Operation::WRITE_FILE_STREAM, message)
    }
}

#[async_trait]
impl ByteStream for BodySource {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, Error>> {
        loop {
            match self.stream.next().await? {
                Ok(chunk) if chunk.is_empty() => {}
                Ok(chunk) => {
                    self.seen = self.seen.saturating_add(chunk.len() as u64);
                    if self.seen > self.limit {
                        let refused = self.refuse(too_large(self.limit));
                        return Some(Err(refused.with_code(ErrorCode::FileTooLarge)));
                    }
                    return Some(Ok(chunk.to_vec()));
                }
                Err(e) => return Some(Err(self.refuse(read_error(&e)))),
            }
        }
    }
}

#[utoipa::path(
    put,
    path = "/v1/sessions/{session}/files/stream",
    operation_id = "uploadFileStream",
    tag = "files",
    summary = "Writes a model-authored file from the request body as it arrives, never held whole; atomic (provisions; at most `limits.stream_file_max_bytes`; needs a backend with `streamed_files`)",
    params(api::SessionParam, api::PathQuery),
    request_body(
        content = String,
        content_type = "application/octet-stream",
        description = "The file's bytes, at most `limits.stream_file_max_bytes`",
    ),
    responses(
        (status = 200, description = "Written", body = api::StreamWritten),
        api::errors::StreamUploadErrors,
    ),
)]
/// `PUT …/files/stream?path=`.
pub async fn upload(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
    body: Body,
) -> Result<Json<api::StreamWritten>, Response> {
    let limit = state.limits.stream_file_max_bytes;
    let checked = key_and_path(caller, &session, q).and_then(|(key, path)| {
        state
            .manager
            .layout()
            .check_model_write(&path)
            .map_err(ApiError::from)?;
        require_streamed(&state)?;
        Ok((key, path))
    });
    let (key, path) = match checked {
        Ok(checked) => checked,
        Err(e) => return Err(refuse_unread(&headers, body, e).await),
    };
    if declared_length(&headers).is_some_and(|n| n > limit) {
        let mut stream = body.into_data_stream();
        if declared_length(&headers).is_some_and(|n| n <= DRAIN_MAX_BYTES) {
            drain(&mut stream, DRAIN_MAX_BYTES).await;
        }
        return Err(too_large(limit).into_response());
    }
    let refusal = Arc::new(Mutex::new(None));
    let source = BodySource {
        stream: body.into_data_stream(),
        seen: 0,
        limit,
        refusal: refusal.clone(),
    };
    let written = state
        .manager
        .write_stream(&key, &path, Box::new(source), limit)
        .await;
    let refused = refusal
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    match (written, refused) {
        (_, Some(refused)) => Err(refused.into_response()),
        (Ok(bytes), None) => Ok(Json(api::StreamWritten {
            path: path.as_str().to_owned(),
            bytes,
        })),
        (Err(e), None) => Err(ApiError::from(e).into_response()),
    }
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/files/rename",
    operation_id = "renamePath",
    tag = "files",
    summary = "Renames (moves) a file or directory, creating the target's parents and replacing a file there (lookup-only; the model-write rule applies to both paths)",
    params(api::SessionParam),
    request_body(
        content = api::RenameRequest,
        content_type = "application/json",
        description = "`{\"from\":\"/workspace/a\",\"to\":\"/workspace/b\"}`",
    ),
    responses(
        (status = 204, description = "Renamed"),
        api::errors::RenameErrors,
    ),
)]
/// `POST …/files/rename`.
pub async fn rename(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let key = session_key(caller, &session)?;
    require_streamed(&state)?;
    let request: api::RenameRequest = read_json(&state, &headers, body, "rename", false).await?;
    let from = SandboxPath::new(&request.from).map_err(ApiError::from)?;
    let to = SandboxPath::new(&request.to).map_err(ApiError::from)?;
    state
        .manager
        .rename_path(&key, &from, &to)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{session}/watch",
    operation_id = "watchDir",
    tag = "files",
    summary = "Changes below a directory as an NDJSON stream, armed when the first line arrives (lookup-only; needs a backend with `watch`)",
    params(api::SessionParam, api::WatchQuery),
    responses(
        (
            status = 200,
            description = "An NDJSON stream whose every line is a `WatchStreamLine`: `started` first, an `event` per change, `ended` or `error` (`watch_overflow` when the client fell too far behind) last",
            body = api::WatchStreamLine,
            content_type = "application/x-ndjson",
        ),
        api::errors::WatchErrors,
    ),
)]
/// `GET …/watch?path=&recursive=`.
pub async fn watch(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
    q: QueryResult<api::WatchQuery>,
) -> Result<Response, ApiError> {
    let key = session_key(caller, &session)?;
    let q = query(q)?;
    let dir = sandbox_path(q.path.as_deref())?;
    if !state.manager.supports_watch() {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "watch_unsupported",
            format!(
                "the {} backend cannot watch directories",
                state.manager.backend()
            ),
        ));
    }
    let (stream, slot) = state
        .manager
        .watch_dir(&key, &dir, q.recursive)
        .await
        .map_err(ApiError::from)?
        .into_parts();
    let started = ndjson(&api::WatchStreamLine::Started {
        path: dir.as_str().to_owned(),
        recursive: q.recursive,
    });
    let relay = WatchRelay {
        stream: Some(stream),
        metrics: state.metrics.clone(),
        _slot: slot,
    };
    let rest = futures_util::stream::unfold(relay, |mut relay| async move {
        let line = relay.next_line().await?;
        Some((Ok::<_, Infallible>(line), relay))
    });
    let body = futures_util::stream::iter([Ok(started)]).chain(rest);
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response())
}

/// One watch's state: the backend stream (dropped after the last line) and the tenant's
/// stream slot.
struct WatchRelay {
    stream: Option<WatchStream>,
    metrics: Arc<Metrics>,
    _slot: sandbox_session::quota::QuotaPermit,
}

impl WatchRelay {
    async fn next_line(&mut self) -> Option<Bytes> {
        let stream = self.stream.as_mut()?;
        let line = match stream.next_event().await {
            Some(Ok(event)) => {
                return Some(ndjson(&api::WatchStreamLine::Event {
                    kind: event.kind.into(),
                    path: event.path.as_str().to_owned(),
                }));
            }
            Some(Err(e)) => {
                self.metrics.observe_error(&e);
                let body = ApiError::from(e).body().error;
                api::WatchStreamLine::Error {
                    code: body.code,
                    message: body.message,
                }
            }
            None => api::WatchStreamLine::Ended,
        };
        self.stream = None;
        Some(ndjson(&line))
    }
}
