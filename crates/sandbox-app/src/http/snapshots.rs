//! Snapshot routes: `POST /v1/sessions/{session}/snapshots` snapshots the session's bound sandbox
//! (lookup-only: an unbound session is 404 `no_live_sandbox`, never provisioned), and
//! `POST /v1/sessions/{session}/restore` creates the session's sandbox from a snapshot (409
//! `conflict` when the session already has one: restoring over it would discard its workspace).

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sandbox_core::SnapshotId;
use sandbox_core::ids::MAX_ID_LEN;
use serde::Deserialize;
use serde_json::json;

use super::body::read_json;
use super::error::ApiError;
use super::{AppState, Caller, session_key};

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

/// `POST /v1/sessions/{session}/snapshots`: 201 `{"snapshot_id", "name", "source"}`.
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let session = session_segment(path)?;
    let key = session_key(caller, &session)?;
    let body: SnapshotBody = read_json(&state, &headers, body, "snapshot", true).await?;
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
        .map_err(ApiError::from)?;
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
    caller: Caller,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let session = session_segment(path)?;
    let key = session_key(caller, &session)?;
    let body: Option<RestoreBody> = read_json(&state, &headers, body, "restore", false).await?;
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
        .map_err(ApiError::from)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "session": session, "sandbox_id": handle.id().as_str() })),
    )
        .into_response())
}
