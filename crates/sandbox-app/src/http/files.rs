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
//! (`write_file(&[u8])`), so the body is read frame by frame into one buffer and the read stops
//! with 413 `payload_too_large` as soon as it would pass `limits.upload_max_bytes` (a declared
//! `Content-Length` beyond the limit is refused before reading anything). Peak memory per upload
//! is therefore the limit, never an unbounded body; nothing is written when the limit trips.
//! The path and the write rule are checked before the body is read, so a refused path costs no
//! transfer. Downloads are likewise whole buffers (`read_file` returns `Vec<u8>`).

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream::StreamExt;
use sandbox_core::{BindingKey, Error, ErrorCode, ErrorKind, Operation, SandboxPath};
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::sessions::observed;
use super::{AppState, SessionPath, session_key};

/// Deepest recursive listing accepted.
pub const MAX_LIST_DEPTH: usize = 16;

/// Query of the routes that take one path.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    path: Option<String>,
}

/// Query of the listing route.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    path: Option<String>,
    /// Kept as text so a malformed depth is `invalid_depth`, not a generic query error.
    depth: Option<String>,
}

type QueryResult<T> = Result<Query<T>, QueryRejection>;

fn query<T>(q: QueryResult<T>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))
}

/// The validated `path` parameter.
fn sandbox_path(raw: Option<&str>) -> Result<SandboxPath, ApiError> {
    let raw = raw.ok_or_else(|| {
        ApiError::bad_request("invalid_path", "the `path` query parameter is required")
    })?;
    SandboxPath::new(raw).map_err(ApiError::from)
}

/// The session and the path of a single-path route, in the order auth, query, path.
fn key_and_path(
    state: &AppState,
    headers: &HeaderMap,
    session: &str,
    q: QueryResult<PathQuery>,
) -> Result<(BindingKey, SandboxPath), ApiError> {
    let key = session_key(state, headers, session)?;
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

/// How much of an over-limit body is read and discarded before the 413 is sent, and for how
/// long. A client still writing when the server stops reading gets a broken pipe instead of the
/// answer; draining a modest remainder lets ordinary clients read the 413. A bigger body is cut
/// off at once: the service never reads unbounded input to be polite.
const DRAIN_MAX_BYTES: u64 = 8 * 1024 * 1024;
const DRAIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads the whole body, answering 413 once it would pass `limit` bytes.
pub async fn read_bounded(headers: &HeaderMap, body: Body, limit: u64) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if let Some(n) = declared.filter(|n| *n > limit) {
        // Unread: a client that sent `Expect: 100-continue` gets the 413 without sending the
        // body at all. Others get it after a drain when the body is small enough to drain.
        if n <= DRAIN_MAX_BYTES {
            drain(&mut stream, n).await;
        }
        return Err(too_large(limit));
    }
    let cap = usize::try_from(declared.unwrap_or(0).min(limit)).unwrap_or(0);
    let mut buf = Vec::with_capacity(cap);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request("invalid_body", format!("reading the request body: {e}"))
        })?;
        let total = (buf.len() as u64).saturating_add(chunk.len() as u64);
        if total > limit {
            drop(buf);
            drain(&mut stream, DRAIN_MAX_BYTES).await;
            return Err(too_large(limit));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// Refuses an upload before reading its body (a bad path, a wrong token). The body is drained
/// as an over-limit one is (bounded in bytes and time), so a client still writing reads this
/// answer instead of a broken pipe, and the connection is closed after it.
async fn refuse_unread(headers: &HeaderMap, body: Body, error: ApiError) -> Response {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_none_or(|n| n <= DRAIN_MAX_BYTES) {
        drain(&mut body.into_data_stream(), DRAIN_MAX_BYTES).await;
    }
    let mut response = error.into_response();
    response.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// Discards up to `max` more bytes of `stream`, for at most [`DRAIN_DEADLINE`].
async fn drain(stream: &mut axum::body::BodyDataStream, max: u64) {
    let discard = async {
        let mut seen = 0u64;
        while seen < max {
            match stream.next().await {
                Some(Ok(chunk)) => seen = seen.saturating_add(chunk.len() as u64),
                _ => return,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_DEADLINE, discard).await;
}

fn no_live_sandbox(op: Operation, key: &BindingKey) -> Error {
    Error::new(
        ErrorKind::NotFound,
        op,
        format!("session {key} has no live sandbox"),
    )
    .with_code(ErrorCode::NoLiveSandbox)
}

/// `GET …/files/content?path=`: the file's bytes. Lookup-only.
pub async fn download(
    State(state): State<AppState>,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<Response, ApiError> {
    let (key, path) = key_and_path(&state, &headers, &session, q)?;
    let bytes = state
        .manager
        .read_file(&key, &path)
        .await
        .map_err(|e| observed(&state, e))?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from(bytes),
    )
        .into_response())
}

/// `PUT …/files/content?path=`: writes a model-authored file (anywhere but the attachments
/// directory). Provisions the sandbox on first use.
pub async fn upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
    body: Body,
) -> Result<StatusCode, Response> {
    write_upload(&state, &headers, &session, q, body, Upload::ModelFile).await
}

/// `PUT …/attachments?path=`: writes an attachment, only below `/workspace/input`. Provisions.
pub async fn put_attachment(
    State(state): State<AppState>,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
    body: Body,
) -> Result<StatusCode, Response> {
    write_upload(&state, &headers, &session, q, body, Upload::Attachment).await
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
    headers: &HeaderMap,
    session: &str,
    q: QueryResult<PathQuery>,
    body: Body,
    kind: Upload,
) -> Result<StatusCode, Response> {
    let checked = key_and_path(state, headers, session, q).and_then(|(key, path)| {
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
    let content = read_bounded(headers, body, state.limits.upload_max_bytes)
        .await
        .map_err(IntoResponse::into_response)?;
    let written = match kind {
        Upload::ModelFile => state.manager.write_file(&key, &path, &content).await,
        Upload::Attachment => state.manager.write_attachment(&key, &path, &content).await,
    };
    written.map_err(|e| observed(state, e).into_response())?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE …/attachments?path=`: removes a staged attachment. Lookup-only; idempotent (204 also
/// when nothing is bound or the file is gone).
pub async fn delete_attachment(
    State(state): State<AppState>,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<StatusCode, ApiError> {
    let (key, path) = key_and_path(&state, &headers, &session, q)?;
    state
        .manager
        .remove_attachment(&key, &path)
        .await
        .map_err(|e| observed(&state, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET …/files?path=&depth=`: the entries below `path`, `depth` levels deep (default 1, at
/// most [`MAX_LIST_DEPTH`]). Lookup-only: an unbound session or a missing directory lists
/// nothing.
pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<ListQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let key = session_key(&state, &headers, &session)?;
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
    let entries = state
        .manager
        .list_files(&key, &path, depth)
        .await
        .map_err(|e| observed(&state, e))?;
    Ok(Json(json!({ "entries": entries })))
}

/// `GET …/files/stat?path=`: kind, size and modification time of one path. Lookup-only.
pub async fn stat(
    State(state): State<AppState>,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<Json<sandbox_core::StatEntry>, ApiError> {
    let (key, path) = key_and_path(&state, &headers, &session, q)?;
    let entry = state
        .manager
        .stat(&key, &path)
        .await
        .map_err(|e| observed(&state, e))?;
    Ok(Json(entry))
}

/// `POST …/files/mkdir?path=`: creates a directory and its parents (existing is success).
/// Provisions; the model-write rule applies (never under `/workspace/input`).
pub async fn mkdir(
    State(state): State<AppState>,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<StatusCode, ApiError> {
    let (key, path) = key_and_path(&state, &headers, &session, q)?;
    state
        .manager
        .layout()
        .check_model_write(&path)
        .map_err(ApiError::from)?;
    let lifecycle = state.manager.lifecycle();
    let handle = lifecycle
        .resolve(&key)
        .await
        .map_err(|e| observed(&state, e))?;
    lifecycle
        .provider()
        .make_dir(&handle, &path)
        .await
        .map_err(|e| observed(&state, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE …/files?path=`: removes a path recursively. The model-write rule applies (never
/// under `/workspace/input`, never a top-level directory); lookup-only: nothing bound is
/// `no_live_sandbox`, a missing path `not_found`.
pub async fn remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    SessionPath(session): SessionPath,
    q: QueryResult<PathQuery>,
) -> Result<StatusCode, ApiError> {
    let (key, path) = key_and_path(&state, &headers, &session, q)?;
    state
        .manager
        .layout()
        .check_model_write(&path)
        .map_err(ApiError::from)?;
    let lifecycle = state.manager.lifecycle();
    let handle = lifecycle
        .lookup(&key)
        .await
        .map_err(|e| observed(&state, e))?
        .ok_or_else(|| observed(&state, no_live_sandbox(Operation::REMOVE, &key)))?;
    lifecycle
        .provider()
        .remove(&handle, &path)
        .await
        .map_err(|e| observed(&state, e))?;
    Ok(StatusCode::NO_CONTENT)
}
