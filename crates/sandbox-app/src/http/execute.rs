//! `POST /v1/execute`: an ephemeral script run. A fresh sandbox is created, the script is
//! validated (400 `security_violation` when the validator refuses it), uploaded into the
//! workspace root under `file_name` (whose extension picks the interpreter) and run with `args`,
//! `stdin`, `env` and `timeout_ms`; the sandbox is deleted afterwards, also when the client goes
//! away. The answer is the exec route's buffered result.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use sandbox_core::ExecTimeout;
use sandbox_session::manager::Script;

use super::body::read_json;
use super::error::ApiError;
use super::{AppState, Caller};
use crate::api;

#[utoipa::path(
    post,
    path = "/v1/execute",
    operation_id = "execute",
    tag = "exec",
    summary = "Runs a script in a fresh sandbox that is deleted afterwards",
    request_body(
        content = api::ScriptRequest,
        content_type = "application/json",
        description = "The script: its file name (the extension picks the interpreter), content, args, stdin, env, timeout_ms",
    ),
    responses(
        (status = 200, description = "The result", body = api::ExecResult),
        api::errors::ExecuteErrors,
    ),
)]
/// The handler.
pub async fn execute(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<api::ExecResult>, ApiError> {
    let body: Option<api::ScriptRequest> =
        read_json(&state, &headers, body, "execute", false).await?;
    let body = body.ok_or_else(|| {
        ApiError::bad_request(
            "invalid_json",
            "execute body: expected {\"file_name\": ..., \"content\": ...}",
        )
    })?;
    let timeout = body
        .timeout_ms
        .map(ExecTimeout::from_millis)
        .transpose()
        .map_err(ApiError::from)?;
    let script = Script {
        file_name: body.file_name,
        content: body.content,
        args: body.args,
        stdin: body.stdin,
        env: body.env,
        timeout,
        skip_validation: false,
    };
    let result = state
        .manager
        .execute(tenant, None, script)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(api::ExecResult::from(&result)))
}
