//! File routes of a session's sandbox: download, upload (model-authored files and attachments),
//! recursive listing, stat, mkdir and removal.
//!
//! | route | sandbox |
//! |---|---|
//! | `GET /v1/sessions/{session}/files/content?path=` | lookup-only (`no_live_sandbox` when unbound) |
//! | `PUT /v1/sessions/{session}/files/content?path=` | provisions; anywhere but `/workspace/input` |
//! | `PUT /v1/sessions/{session}/attachments?path=` | provisions; only below `/workspace/input` |
//! | `DELETE /v1/sessions/{session}/attachments?path=` | lookup-only; 204 (also when unbound or missing) |
//! | `GET /v1/sessions/{session}/files?path=&depth=` | lookup-only; unbound lists nothing |
//! | `GET /v1/sessions/{session}/files/stat?path=` | lookup-only |
//! | `POST /v1/sessions/{session}/files/mkdir?path=` | provisions; model-write rule |
//! | `DELETE /v1/sessions/{session}/files?path=` | lookup-only; model-write rule |
//!
//! Every `path` is absolute and normalized by [`SandboxPath`] (missing, relative or `..` ⇒ 400
//! `invalid_path`); a query field the route does not know ⇒ 400 `invalid_query`.
//!
//! Uploads are *bounded*, not streamed through: the core port writes whole buffers
//! (`write_file(&[u8])`), so the body is read frame by frame into one buffer, held once and
//! lent to the adapter, and the read stops with 413 `payload_too_large` as soon as it would
//! pass `limits.upload_max_bytes` (a declared `Content-Length` beyond the limit is refused
//! before reading anything). Every buffered body counts against the process-wide in-flight
//! budget (503 `server_busy` when it is spent), so memory is bounded by the budget, not by how
//! many uploads arrive at once. The path and the write rule are checked before the body is
//! read, so a refused path costs no transfer.
//!
//! Downloads *stream*: the adapter reads the file inside the sandbox as the client takes the
//! answer, so a slow client slows the reader and a large file never sits in the service's
//! memory. Only regular files are served, judged on what the path resolves to (a FIFO, a
//! device, `/dev/zero` through a symlink: 400 `not_a_regular_file`); a file beyond
//! `limits.download_max_bytes` is 400 `file_too_large` when that is known before the first
//! byte, and otherwise cuts the answer short (the reader is stopped at the cap).
//!
//! Listings walk the tree in one go with an entry cap and a deadline, and say `truncated` when
//! either cut them short.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream::StreamExt;
use sandbox_core::{BindingKey, SandboxPath};

use super::body::{DRAIN_MAX_BYTES, declared_length, drain, read_limited};
use super::error::ApiError;
use super::{AppState, Caller, SessionPath, session_key};
use crate::api;

/// Deepest recursive listing accepted.
pub const MAX_LIST_DEPTH: usize = 16;
/// Entries one listing returns at most (then `truncated`).
pub const MAX_LIST_ENTRIES: usize = sandbox_core::TreeLimits::DEFAULT_MAX_ENTRIES;

use crate::api::{ListQuery, PathQuery};

pub(super) type QueryResult<T> = Result<Query<T>, QueryRejection>;

pub(super) fn query<T>(q: QueryResult<T>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))
}

/// The validated `path` parameter.
pub(super) fn sandbox_path(raw: Option<&str>) -> Result<SandboxPath, ApiError> {
    let raw = raw.ok_or_else(|| {
        ApiError::bad_request("invalid_path", "the `path` query parameter is required")
    })?;
    SandboxPath::new(raw).map_err(ApiError::from)
}

/// The session and the path of a single-path route, in the order session, query, path.
pub(super) fn key_and_path(
    caller: Caller,
    session: &str,
    q: QueryResult<PathQuery>,
) -> Result<(BindingKey, SandboxPath), ApiError> {
    let key = session_key(caller, session)?;
    let q = query(q)?;
    let path = sandbox_path(q.path.as_deref())?;
    Ok((key, path))
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the upload is larger than the limit of {limit} bytes"),
    )
}

/// Refuses an upload before reading its body (a bad path, a wrong token). The body is drained
/// as an over-limit one is (bounded in bytes and time), so a client still writing reads this
/// answer instead of a broken pipe, and the connection is closed after it.
pub(super) async fn refuse_unread(headers: &HeaderMap, body: Body, error: ApiError) -> Response {
    if declared_length(headers).is_none_or(|n| n <= DRAIN_MAX_BYTES) {
        drain(&mut body.into_data_stream(), DRAIN_MAX_BYTES).await;
    }
    let mut response = error.into_response();
    response.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{session}/files/content",
    operation_id = "downloadFile",
    tag = "files",
    summary = "A regular file's bytes, streamed (lookup-only; at most `limits.download_max_bytes`)",
    params(api::SessionParam, api::PathQuery),
    responses(
        (status = 200, description = "The file's bytes", body = String, content_type = "application/octet-stream"),
        api::errors::DownloadErrors,
    ),
)]
/// `GET …/files/content?path=`: the file's bytes, streamed. Lookup-only.
pub async fn download(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<Response, ApiError> {
    let (key, path) = key_and_path(caller, &session, q)?;
    let stream = state
        .manager
        .read_file_stream(&key, &path, state.limits.download_max_bytes)
        .await
        .map_err(ApiError::from)?;
    octet_stream(stream, &state.metrics).await
}

/// A file's bytes as an `application/octet-stream` answer, pulled from `stream` as the client
/// reads. The first chunk is awaited before answering, so a refusal the adapter can only make
/// once the file is open (it turned out not to be a regular file, or larger than the cap) is
/// still a proper error answer rather than a cut-off 200.
pub(super) async fn octet_stream(
    mut stream: sandbox_core::ReadStream,
    metrics: &std::sync::Arc<super::metrics::Metrics>,
) -> Result<Response, ApiError> {
    let first = match stream.next_chunk().await {
        None => None,
        Some(Ok(chunk)) => Some(chunk),
        Some(Err(e)) => return Err(ApiError::from(e)),
    };
    let metrics = metrics.clone();
    let rest = futures_util::stream::unfold(Some(stream), move |stream| {
        let metrics = metrics.clone();
        async move {
            let mut stream = stream?;
            match stream.next_chunk().await {
                Some(Ok(chunk)) => Some((Ok(Bytes::from(chunk)), Some(stream))),
                Some(Err(e)) => {
                    // Mid-answer there is no status left to send: the connection is cut, so
                    // the client sees an incomplete body rather than a shorter "file".
                    metrics.observe_error(&e);
                    tracing::warn!(error = %e, "download ended early");
                    Some((Err(e), None))
                }
                None => None,
            }
        }
    });
    let body = futures_util::stream::iter(first.map(|c| Ok(Bytes::from(c)))).chain(rest);
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(body),
    )
        .into_response())
}

#[utoipa::path(
    put,
    path = "/v1/sessions/{session}/files/content",
    operation_id = "uploadFile",
    tag = "files",
    summary = "Writes a model-authored file anywhere but `/workspace/input` (provisions the sandbox)",
    params(api::SessionParam, api::PathQuery),
    request_body(
        content = String,
        content_type = "application/octet-stream",
        description = "The file's bytes, at most `limits.upload_max_bytes`",
    ),
    responses(
        (status = 204, description = "Written"),
        api::errors::UploadErrors,
    ),
)]
/// `PUT …/files/content?path=`: writes a model-authored file (anywhere but the attachments
/// directory). Provisions the sandbox on first use.
pub async fn upload(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
    body: Body,
) -> Result<StatusCode, Response> {
    write_upload(
        &state,
        caller,
        &headers,
        &session,
        q,
        body,
        Upload::ModelFile,
    )
    .await
}

#[utoipa::path(
    put,
    path = "/v1/sessions/{session}/attachments",
    operation_id = "putAttachment",
    tag = "files",
    summary = "Writes an attachment below `/workspace/input` (provisions the sandbox)",
    params(api::SessionParam, api::PathQuery),
    request_body(
        content = String,
        content_type = "application/octet-stream",
        description = "The file's bytes, at most `limits.upload_max_bytes`",
    ),
    responses(
        (status = 204, description = "Written"),
        api::errors::AttachmentErrors,
    ),
)]
/// `PUT …/attachments?path=`: writes an attachment, only below `/workspace/input`. Provisions.
pub async fn put_attachment(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
    body: Body,
) -> Result<StatusCode, Response> {
    write_upload(
        &state,
        caller,
        &headers,
        &session,
        q,
        body,
        Upload::Attachment,
    )
    .await
}

/// Which write rule an upload follows.
#[derive(Clone, Copy)]
enum Upload {
    /// Anywhere but `/workspace/input`.
    ModelFile,
    /// Only below `/workspace/input`.
    Attachment,
}

/// The two upload routes: path and write rule first (a refusal drains the unread body), then
/// the bounded read, then the write.
async fn write_upload(
    state: &AppState,
    caller: Caller,
    headers: &HeaderMap,
    session: &str,
    q: QueryResult<PathQuery>,
    body: Body,
    kind: Upload,
) -> Result<StatusCode, Response> {
    let checked = key_and_path(caller, session, q).and_then(|(key, path)| {
        let layout = state.manager.layout();
        match kind {
            Upload::ModelFile => layout.check_model_write(&path),
            Upload::Attachment => layout.check_attachment_write(&path),
        }
        .map_err(ApiError::from)?;
        Ok((key, path))
    });
    let (key, path) = match checked {
        Ok(checked) => checked,
        Err(e) => return Err(refuse_unread(headers, body, e).await),
    };
    let content = read_limited(
        state,
        headers,
        body,
        state.limits.upload_max_bytes,
        too_large,
    )
    .await
    .map_err(IntoResponse::into_response)?;
    let written = match kind {
        Upload::ModelFile => state.manager.write_file(&key, &path, &content).await,
        Upload::Attachment => state.manager.write_attachment(&key, &path, &content).await,
    };
    written.map_err(|e| ApiError::from(e).into_response())?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{session}/attachments",
    operation_id = "deleteAttachment",
    tag = "files",
    summary = "Removes a staged attachment (lookup-only; idempotent)",
    params(api::SessionParam, api::PathQuery),
    responses(
        (status = 204, description = "Removed, or nothing was there"),
        api::errors::PathErrors,
    ),
)]
/// `DELETE …/attachments?path=`: removes a staged attachment. Lookup-only; idempotent (204 also
/// when nothing is bound or the file is gone).
pub async fn delete_attachment(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<StatusCode, ApiError> {
    let (key, path) = key_and_path(caller, &session, q)?;
    state
        .manager
        .remove_attachment(&key, &path)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{session}/files",
    operation_id = "listFiles",
    tag = "files",
    summary = "Entries below `path`, `depth` levels deep, at most 10000 of them in one bounded walk (`truncated` says when the cap or the deadline cut it; lookup-only: an unbound session or a missing directory lists nothing)",
    params(api::SessionParam, api::ListQuery),
    responses(
        (status = 200, description = "The entries", body = api::Listing),
        api::errors::ListErrors,
    ),
)]
/// `GET …/files?path=&depth=`: the entries below `path`, `depth` levels deep (default 1, at
/// most [`MAX_LIST_DEPTH`]), at most [`MAX_LIST_ENTRIES`] of them (`truncated` says when the
/// cap or the deadline cut the walk). Lookup-only: an unbound session or a missing directory
/// lists nothing.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
    q: QueryResult<ListQuery>,
) -> Result<Json<api::Listing>, ApiError> {
    let key = session_key(caller, &session)?;
    let q = query(q)?;
    let path = sandbox_path(q.path.as_deref())?;
    let depth = match q.depth.as_deref() {
        None => 1,
        Some(raw) => raw
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|d| (1..=MAX_LIST_DEPTH).contains(d))
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_depth",
                    format!("depth must be an integer from 1 to {MAX_LIST_DEPTH}, got {raw:?}"),
                )
            })?,
    };
    let listing = state
        .manager
        .list_files(&key, &path, sandbox_core::TreeLimits::depth(depth))
        .await
        .map_err(ApiError::from)?;
    Ok(Json(api::Listing::from(listing)))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{session}/files/stat",
    operation_id = "statFile",
    tag = "files",
    summary = "Kind, size and modification time of one path (lookup-only)",
    params(api::SessionParam, api::PathQuery),
    responses(
        (status = 200, description = "The entry", body = api::StatEntry),
        api::errors::PathErrors,
    ),
)]
/// `GET …/files/stat?path=`: kind, size and modification time of one path. Lookup-only.
pub async fn stat(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<Json<api::StatEntry>, ApiError> {
    let (key, path) = key_and_path(caller, &session, q)?;
    let entry = state
        .manager
        .stat(&key, &path)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(api::StatEntry::from(entry)))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/files/mkdir",
    operation_id = "makeDir",
    tag = "files",
    summary = "Creates a directory and its parents (provisions; the model-write rule applies)",
    params(api::SessionParam, api::PathQuery),
    responses(
        (status = 204, description = "Created (or already there)"),
        api::errors::MkdirErrors,
    ),
)]
/// `POST …/files/mkdir?path=`: creates a directory and its parents (existing is success).
/// Provisions; the model-write rule applies (never under `/workspace/input`).
pub async fn mkdir(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<StatusCode, ApiError> {
    let (key, path) = key_and_path(caller, &session, q)?;
    state
        .manager
        .make_dir(&key, &path)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{session}/files",
    operation_id = "removeFile",
    tag = "files",
    summary = "Removes a path recursively (lookup-only; the model-write rule applies)",
    params(api::SessionParam, api::PathQuery),
    responses(
        (status = 204, description = "Removed"),
        api::errors::RemoveErrors,
    ),
)]
/// `DELETE …/files?path=`: removes a path recursively. The model-write rule applies (never
/// under `/workspace/input`, never a top-level directory); lookup-only: nothing bound is
/// `no_live_sandbox`, a missing path `not_found`.
pub async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<StatusCode, ApiError> {
    let (key, path) = key_and_path(caller, &session, q)?;
    state
        .manager
        .remove(&key, &path)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}
