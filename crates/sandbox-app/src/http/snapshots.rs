//! Snapshot routes: `POST /v1/sessions/{session}/snapshots` snapshots the session's bound sandbox
//! (lookup-only: an unbound session is 404 `no_live_sandbox`, never provisioned), and
//! `POST /v1/sessions/{session}/restore` creates the session's sandbox from a snapshot (409
//! `conflict` when the session already has one: restoring over it would discard its workspace).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sandbox_core::SnapshotId;
use sandbox_core::ids::MAX_ID_LEN;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::error::ApiError;
use super::sessions::observed;
use super::{AppState, session_key};

/// Body of the snapshot route (an empty body means no name).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SnapshotBody {
    #[serde(default)]
    name: Option<String>,
}

/// Body of the restore route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreBody {
    snapshot_id: String,
}

/// The session path segment, a decoding failure (invalid UTF-8 after percent-decoding) being a
/// 400 `invalid_session` like any other unusable session ID.
pub(crate) fn session_segment(
    path: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    path.map(|Path(s)| s)
        .map_err(|e| ApiError::bad_request("invalid_session", e.body_text()))
}

/// A JSON body within the configured limit: 413 `payload_too_large` beyond it, 400
/// `invalid_json` when it does not parse. `empty_default` lets an empty body stand for `{}`.
pub(crate) fn json_body<T: DeserializeOwned + Default>(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
    what: &str,
    empty_default: bool,
) -> Result<T, ApiError> {
    let body = body_bytes(state, body)?;
    if empty_default && body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("{what} body: {e}")))
}

/// The raw body within the configured limit.
pub(crate) fn body_bytes(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the request body exceeds {} bytes",
                state.limits.json_max_bytes
            ),
        )
    };
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            // The router's extractor limit (axum's 2 MiB default) tripped before ours.
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                e.body_text(),
            )
        } else {
            ApiError::bad_request("invalid_json", e.body_text())
        }
    })?;
    if u64::try_from(body.len()).unwrap_or(u64::MAX) > state.limits.json_max_bytes {
        return Err(too_large());
    }
    Ok(body)
}

/// `POST /v1/sessions/{session}/snapshots`: 201 `{"snapshot_id", "name", "source"}`.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let session = session_segment(path)?;
    let key = session_key(&state, &headers, &session)?;
    let body: SnapshotBody = json_body(&state, body, "snapshot", true)?;
    if let Some(name) = &body.name
        && (name.len() > MAX_ID_LEN || name.chars().any(char::is_control))
    {
        return Err(ApiError::bad_request(
            "invalid_snapshot",
            format!("a snapshot name is at most {MAX_ID_LEN} bytes without control characters"),
        ));
    }
    let snapshot = state
        .manager
        .snapshot(&key, body.name.as_deref())
        .await
        .map_err(|e| observed(&state, e))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "snapshot_id": snapshot.id.as_str(),
            "name": snapshot.name,
            "source": snapshot.source.as_ref().map(|s| s.as_str()),
        })),
    )
        .into_response())
}

/// `POST /v1/sessions/{session}/restore`: 201 `{"session", "sandbox_id"}`.
pub async fn restore(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let session = session_segment(path)?;
    let key = session_key(&state, &headers, &session)?;
    let body: Option<RestoreBody> = json_body(&state, body, "restore", false)?;
    let body = body.ok_or_else(|| {
        ApiError::bad_request(
            "invalid_json",
            "restore body: expected {\"snapshot_id\": ...}",
        )
    })?;
    let snapshot = SnapshotId::new(body.snapshot_id)
        .map_err(|e| ApiError::bad_request("invalid_snapshot", e.message().to_owned()))?;
    let handle = state
        .manager
        .create_from_snapshot(&key, &snapshot)
        .await
        .map_err(|e| observed(&state, e))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "session": session, "sandbox_id": handle.id().as_str() })),
    )
        .into_response())
}
