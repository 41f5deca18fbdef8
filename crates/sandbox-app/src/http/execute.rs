//! `POST /v1/execute`: an ephemeral script run. A fresh sandbox is created, the script is
//! validated (400 `security_violation` when the validator refuses it), uploaded into the
//! workspace root under `file_name` (whose extension picks the interpreter) and run with `args`,
//! `stdin`, `env` and `timeout_ms`; the sandbox is deleted afterwards, also when the client goes
//! away. The answer is the exec route's buffered result.

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use sandbox_core::ExecTimeout;
use sandbox_session::manager::Script;
use serde::Deserialize;

use super::error::ApiError;
use super::output::result_json;
use super::sessions::observed;
use super::snapshots::json_body;
use super::{AppState, tenant};

/// The body of the route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptBody {
    file_name: String,
    content: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    timeout_ms: Option<i64>,
}

/// The handler.
pub async fn execute(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    // Authenticated like every session route, though the run belongs to no session.
    tenant(&state, &headers)?;
    let body: Option<ScriptBody> = json_body(&state, body, "execute", false)?;
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
        .execute(None, script)
        .await
        .map_err(|e| observed(&state, e))?;
    Ok(Json(result_json(&result)))
}
