//! Session routes: inspect (never connects, never provisions), destroy, keep-alive.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::ApiError;
use super::{AppState, Caller, SessionPath, session_key};

/// `GET /v1/sessions/{session}`: the binding and the sandbox state, without connecting (a
/// connect would resume a paused sandbox). 404 `no_live_sandbox` when nothing is bound.
pub async fn get_session(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
) -> Result<Response, ApiError> {
    let key = session_key(caller, &session)?;
    let lifecycle = state.manager.lifecycle();
    match lifecycle.peek_state(&key).await.map_err(ApiError::from)? {
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_live_sandbox",
            format!("session {session} has no sandbox"),
        )),
        Some((sandbox_id, sandbox_state)) => Ok(Json(json!({
            "session": session,
            "sandbox_id": sandbox_id.as_str(),
            "provider": lifecycle.provider().provider().as_str(),
            "state": sandbox_state.as_str(),
        }))
        .into_response()),
    }
}

/// `DELETE /v1/sessions/{session}`: destroys the sandbox and the binding (idempotent: 204 also
/// when nothing was bound).
pub async fn destroy(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
) -> Result<StatusCode, ApiError> {
    let key = session_key(caller, &session)?;
    state.manager.destroy(&key).await.map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sessions/{session}/keepalive`: refreshes the bound sandbox's idle timer
/// (lookup-only) and answers when to call again.
pub async fn keep_alive(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
) -> Result<Json<serde_json::Value>, ApiError> {
    let key = session_key(caller, &session)?;
    let next = state
        .manager
        .keep_alive(&key)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(
        json!({ "refreshed": !next.is_zero(), "next_refresh_ms": next.as_millis() as u64 }),
    ))
}
