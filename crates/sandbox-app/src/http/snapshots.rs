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

use super::body::read_json;
use super::error::ApiError;
use super::{AppState, Caller, session_key};
use crate::api;

/// The session path segment, a decoding failure (invalid UTF-8 after percent-decoding) being a
/// 400 `invalid_session` like any other unusable session ID.
pub(crate) fn session_segment(
    path: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    path.map(|Path(s)| s)
        .map_err(|e| ApiError::bad_request("invalid_session", e.body_text()))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/snapshots",
    operation_id = "createSnapshot",
    tag = "snapshots",
    summary = "Snapshots the session's bound sandbox (lookup-only: never provisions)",
    params(api::SessionParam),
    request_body(
        content = Option<api::SnapshotRequest>,
        content_type = "application/json",
        description = "An optional snapshot name; an empty body means no name",
    ),
    responses(
        (status = 201, description = "The snapshot", body = api::SnapshotCreated),
        api::errors::SnapshotErrors,
    ),
)]
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
    let body: api::SnapshotRequest = read_json(&state, &headers, body, "snapshot", true).await?;
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
        Json(api::SnapshotCreated::from(&snapshot)),
    )
        .into_response())
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/restore",
    operation_id = "restoreSnapshot",
    tag = "snapshots",
    summary = "Creates the session's sandbox from a snapshot; refused when one is bound",
    params(api::SessionParam),
    request_body(
        content = api::RestoreRequest,
        content_type = "application/json",
        description = "The snapshot to restore",
    ),
    responses(
        (status = 201, description = "The new sandbox", body = api::RestoreCreated),
        api::errors::RestoreErrors,
    ),
)]
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
    let body: Option<api::RestoreRequest> =
        read_json(&state, &headers, body, "restore", false).await?;
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
        Json(api::RestoreCreated {
            sandbox_id: handle.id().as_str().to_owned(),
            session,
        }),
    )
        .into_response())
}
