//! The HTTP API (axum). Every route authenticates with a bearer token mapped to a tenant;
//! sessions are tenant-scoped names, so another tenant's session is simply not there (404).

pub mod error;
pub mod exec;
pub mod execute;
pub mod files;
pub mod metrics;
pub mod openapi;
mod output;
pub mod sessions;
pub mod snapshots;
pub mod terminal;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use sandbox_core::{BindingKey, SandboxProvider, TenantId};
use sandbox_session::manager::SessionManager;

use self::error::ApiError;
use self::metrics::Metrics;
use crate::auth::TenantAuth;
use crate::config::Limits;

/// Everything a handler needs. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    pub auth: Arc<TenantAuth>,
    pub manager: SessionManager,
    pub provider: Arc<dyn SandboxProvider>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Single-use tickets authorising terminal WebSocket upgrades.
    pub tickets: Arc<crate::tickets::TerminalTickets>,
    /// The binding store, as `/healthz` reports it.
    pub store: StoreInfo,
}

/// The binding store's kind and, for a store with a backing service, its health check.
#[derive(Clone)]
pub struct StoreInfo {
    pub kind: &'static str,
    pub health: Option<Arc<dyn StoreHealth>>,
}

impl StoreInfo {
    /// The process-local memory store (always healthy).
    pub fn memory() -> Self {
        StoreInfo {
            kind: "memory",
            health: None,
        }
    }
}

impl std::fmt::Debug for StoreInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreInfo")
            .field("kind", &self.kind)
            .finish()
    }
}

/// Whether a store's backing service answers.
#[async_trait::async_trait]
pub trait StoreHealth: Send + Sync {
    async fn check(&self) -> Result<(), sandbox_core::Error>;
}

/// The router with every route and the metrics layer.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route(
            "/v1/sessions/{session}",
            get(sessions::get_session).delete(sessions::destroy),
        )
        .route("/v1/sessions/{session}/exec", post(exec::exec))
        .route("/v1/sessions/{session}/snapshots", post(snapshots::create))
        .route("/v1/sessions/{session}/restore", post(snapshots::restore))
        .route("/v1/execute", post(execute::execute))
        .route(
            "/v1/sessions/{session}/files",
            get(files::list).delete(files::remove),
        )
        .route(
            "/v1/sessions/{session}/files/content",
            get(files::download).put(files::upload),
        )
        .route("/v1/sessions/{session}/files/stat", get(files::stat))
        .route("/v1/sessions/{session}/files/mkdir", post(files::mkdir))
        .route(
            "/v1/sessions/{session}/attachments",
            axum::routing::put(files::put_attachment).delete(files::delete_attachment),
        )
        .route(
            "/v1/sessions/{session}/keepalive",
            post(sessions::keep_alive),
        )
        .route("/v1/sessions/{session}/terminal", get(terminal::open))
        .route(
            "/v1/sessions/{session}/terminal/ticket",
            post(terminal::issue_ticket),
        );
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::render))
        .route("/v1/openapi.json", get(openapi::serve))
        .merge(api)
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "route_not_found", "no such route")
        })
        // JSON bodies up to the configured limit (uploads stream past it and enforce their own).
        .layer(axum::extract::DefaultBodyLimit::max(
            usize::try_from(state.limits.json_max_bytes).unwrap_or(usize::MAX),
        ))
        .layer(middleware::from_fn_with_state(state.clone(), record))
        .with_state(state)
}

/// The `{session}` path segment. A segment that does not even decode (`%FF`) is a 400
/// `invalid_session` in the API's error shape, not axum's plain-text rejection.
#[derive(Debug)]
pub struct SessionPath(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(session) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::bad_request("invalid_session", e.body_text()))?;
        Ok(SessionPath(session))
    }
}

/// Counts every request by route and status and times it.
async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    state.metrics.observe_request(
        &method,
        &route,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// `GET /healthz`: 200 when the backend answers, 503 with the reason otherwise. No auth: load
/// balancers probe it.
async fn healthz(State(state): State<AppState>) -> Response {
    let backend = state.provider.provider().as_str();
    let store = state.store.kind;
    let store_check = match &state.store.health {
        Some(h) => h.check().await,
        None => Ok(()),
    };
    let verdict = match (state.provider.health().await, store_check) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), _) => Err(format!("backend: {e}")),
        (Ok(()), Err(e)) => Err(format!("store: {e}")),
    };
    match verdict {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({ "status": "ok", "backend": backend, "store": store })),
        )
            .into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({ "status": "unavailable", "backend": backend, "store": store, "reason": reason })),
        )
            .into_response(),
    }
}

/// The tenant behind the request's bearer token.
pub fn tenant(state: &AppState, headers: &HeaderMap) -> Result<TenantId, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(ApiError::unauthorized)?;
    let token = value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(ApiError::unauthorized)?;
    state
        .auth
        .tenant_of(token)
        .ok_or_else(ApiError::unauthorized)
}

/// The binding key of `session` for the caller.
pub fn session_key(
    state: &AppState,
    headers: &HeaderMap,
    session: &str,
) -> Result<BindingKey, ApiError> {
    let tenant = tenant(state, headers)?;
    let session = sandbox_core::SessionId::new(session)
        .map_err(|e| ApiError::bad_request("invalid_session", e.message().to_owned()))?;
    Ok(BindingKey { tenant, session })
}
