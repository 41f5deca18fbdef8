//! Session routes: inspect (never connects, never provisions), destroy, keep-alive.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::{AppState, Caller, SessionPath, session_key};
use crate::api;

#[utoipa::path(
    get,
    path = "/v1/sessions/{session}",
    operation_id = "getSession",
    tag = "sessions",
    summary = "The session's binding and sandbox state, without connecting or provisioning",
    params(api::SessionParam),
    responses(
        (status = 200, description = "The sandbox bound to the session", body = api::Session),
        api::errors::SessionErrors,
    ),
)]
/// `GET /v1/sessions/{session}`: the binding and the sandbox state, without connecting (a
/// connect would resume a paused sandbox). 404 `no_live_sandbox` when nothing is bound.
pub async fn get_session(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
) -> Result<Response, ApiError> {
    let key = session_key(caller, &session)?;
    match state.manager.peek(&key).await.map_err(ApiError::from)? {
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_live_sandbox",
            format!("session {session} has no sandbox"),
        )),
        Some((sandbox_id, sandbox_state)) => Ok(Json(api::Session {
            sandbox_id: sandbox_id.as_str().to_owned(),
            provider: state.manager.backend().as_str().to_owned(),
            state: sandbox_state.as_str().to_owned(),
            session,
        })
        .into_response()),
    }
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{session}",
    operation_id = "destroySession",
    tag = "sessions",
    summary = "Destroys the session's sandbox and binding (idempotent)",
    params(api::SessionParam),
    responses(
        (status = 204, description = "Destroyed, or nothing was bound"),
        api::errors::SessionErrors,
    ),
)]
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

#[utoipa::path(
    post,
    path = "/v1/sessions/{session}/keepalive",
    operation_id = "keepAlive",
    tag = "sessions",
    summary = "Refreshes the bound sandbox's idle timer (lookup-only) and says when to call again",
    params(api::SessionParam),
    responses(
        (status = 200, description = "Refreshed (or nothing to refresh)", body = api::KeepAlive),
        api::errors::SessionErrors,
    ),
)]
/// `POST /v1/sessions/{session}/keepalive`: refreshes the bound sandbox's idle timer
/// (lookup-only) and answers when to call again.
pub async fn keep_alive(
    State(state): State<AppState>,
    caller: Caller,
    SessionPath(session): SessionPath,
) -> Result<Json<api::KeepAlive>, ApiError> {
    let key = session_key(caller, &session)?;
    let next = state
        .manager
        .keep_alive(&key)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(api::KeepAlive {
        refreshed: !next.is_zero(),
        next_refresh_ms: api::millis(next),
    }))
}
