//! The HTTP API (axum). Every `/v1` route but the OpenAPI document and the ticketed terminal
//! upgrade authenticates with a bearer token mapped to a tenant, in one layer that runs before
//! any handler, so no body of an unauthenticated request is ever read; sessions are
//! tenant-scoped names, so another tenant's session is simply not there (404).

pub mod body;
pub mod error;
pub mod exec;
pub mod execute;
pub mod files;
pub mod metrics;
pub mod openapi;
mod output;
pub mod processes;
pub mod sessions;
pub mod snapshots;
pub mod streams;
pub mod terminal;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::Extension;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use sandbox_core::{BindingKey, SandboxProvider, TenantId};
use sandbox_session::manager::SessionManager;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use self::body::InflightBudget;
use self::error::ApiError;
use self::metrics::Metrics;
use crate::api;
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
    /// The bytes of request bodies the whole process may hold at once.
    pub budget: Arc<InflightBudget>,
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

/// Every route, declared once: the router and the OpenAPI document are both built from this.
/// The first router's routes are public, the second's sit behind the authentication layer
/// (and the document says so, from which router a route is in).
pub(crate) fn declared() -> (OpenApiRouter<AppState>, OpenApiRouter<AppState>) {
    let mut public = OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(healthz))
        .routes(routes!(metrics::render))
        .routes(routes!(openapi::serve))
        // Authorised by its single-use ticket: browsers cannot send a bearer header on a
        // WebSocket.
        .routes(routes!(terminal::open));
    openapi::finish(public.get_openapi_mut(), false);
    let mut authenticated = OpenApiRouter::new()
        .routes(routes!(sessions::get_session, sessions::destroy))
        .routes(routes!(exec::exec))
        .routes(routes!(snapshots::create))
        .routes(routes!(snapshots::restore))
        .routes(routes!(execute::execute))
        .routes(routes!(files::list, files::remove))
        .routes(routes!(files::download, files::upload))
        .routes(routes!(files::stat))
        .routes(routes!(files::mkdir))
        .routes(routes!(files::put_attachment, files::delete_attachment))
        .routes(routes!(sessions::keep_alive))
        .routes(routes!(terminal::issue_ticket))
        // Background processes, streamed files and watch (issue 17).
        .routes(routes!(processes::start, processes::list))
        .routes(routes!(processes::attach))
        .routes(routes!(processes::send_input, processes::close_stdin))
        .routes(routes!(processes::signal))
        .routes(routes!(streams::download, streams::upload))
        .routes(routes!(streams::rename))
        .routes(routes!(streams::watch));
    openapi::finish(authenticated.get_openapi_mut(), true);
    (public, authenticated)
}

/// The router with every route, the authentication layer and the metrics layer.
pub fn router(state: AppState) -> Router {
    let (public, authenticated) = declared();
    // Only matched routes: an unknown path stays a 404 `route_not_found` for everyone.
    let authenticated =
        authenticated.route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    let (router, document) = public.merge(authenticated).split_for_parts();
    let document = openapi::Document(Arc::new(
        serde_json::to_value(document).unwrap_or(serde_json::Value::Null),
    ));
    router
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "route_not_found", "no such route")
        })
        .layer(Extension(document))
        .layer(middleware::from_fn_with_state(state.clone(), record))
        .with_state(state)
}

/// The caller's tenant, put in the request by the authentication layer.
#[derive(Debug, Clone, Copy)]
pub struct Caller(pub TenantId);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        // Absent only on a route registered outside the authenticated router: refuse rather
        // than serve it as nobody.
        parts
            .extensions
            .get::<Caller>()
            .copied()
            .ok_or_else(ApiError::unauthorized)
    }
}

/// The authentication layer: the bearer token maps to a tenant, or the request ends here with
/// 401 before its handler (and so its body) is touched.
async fn authenticate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    match tenant(&state, request.headers()) {
        Ok(tenant) => {
            request.extensions_mut().insert(Caller(tenant));
            next.run(request).await
        }
        Err(refused) => {
            let mut response = refused.into_response();
            if request.headers().contains_key(header::CONTENT_LENGTH)
                || request.headers().contains_key(header::TRANSFER_ENCODING)
            {
                // The body stays unread, so the connection cannot carry another request.
                response.headers_mut().insert(
                    header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            response
        }
    }
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

/// The method as a metric label: the standard methods by name, anything a client made up as
/// `other`, so invented methods cannot grow the series set.
pub(crate) fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

/// Counts every request by method, route and status, and times it.
async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    state.metrics.observe_request(
        metrics::API_SANDBOX,
        method,
        &route,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "health",
    tag = "service",
    summary = "Backend health (no auth: load balancers probe it)",
    responses(
        (status = 200, description = "The backend answers", body = api::Health),
        (status = 503, description = "The backend does not answer", body = api::Health),
    ),
)]
/// `GET /healthz`: 200 when the backend and the store answer, 503 with a reason *code*
/// otherwise (`backend_unavailable`, `store_unavailable`). No auth: load balancers probe it, so
/// it says nothing an anonymous caller should learn (no engine errors, no addresses); the
/// details go to the log.
async fn healthz(State(state): State<AppState>) -> Response {
    let backend = state.provider.provider().as_str();
    let store = state.store.kind;
    let store_check = match &state.store.health {
        Some(h) => h.check().await,
        None => Ok(()),
    };
    let verdict = match (state.provider.health().await, store_check) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), _) => {
            tracing::warn!(error = %e, "health check: the backend does not answer");
            Err(api::HealthReason::BackendUnavailable)
        }
        (Ok(()), Err(e)) => {
            tracing::warn!(error = %e, "health check: the store does not answer");
            Err(api::HealthReason::StoreUnavailable)
        }
    };
    let (status, health, reason) = match verdict {
        Ok(()) => (StatusCode::OK, api::HealthStatus::Ok, None),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            api::HealthStatus::Unavailable,
            Some(reason),
        ),
    };
    let body = api::Health {
        status: health,
        backend: backend.to_owned(),
        store: store.to_owned(),
        reason,
    };
    (status, axum::Json(body)).into_response()
}

/// The bearer token of an `Authorization` value. The scheme is case-insensitive (RFC 9110
/// §11.1), so `bearer x` is the same credential as `Bearer x`.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The tenant behind the request's bearer token.
pub fn tenant(state: &AppState, headers: &HeaderMap) -> Result<TenantId, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .ok_or_else(ApiError::unauthorized)?;
    state
        .auth
        .tenant_of(token)
        .ok_or_else(ApiError::unauthorized)
}

/// The binding key of `session` for the caller.
pub fn session_key(Caller(tenant): Caller, session: &str) -> Result<BindingKey, ApiError> {
    let session = sandbox_core::SessionId::new(session)
        .map_err(|e| ApiError::bad_request("invalid_session", e.message().to_owned()))?;
    Ok(BindingKey { tenant, session })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for (value, token) in [
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER  abc ", Some("abc")),
            ("Basic abc", None),
            ("Bearer ", None),
            ("Bearer", None),
            ("Bearerabc", None),
        ] {
            assert_eq!(bearer_token(value), token, "{value:?}");
        }
    }

    #[test]
    fn made_up_methods_share_one_label() {
        assert_eq!(method_label(&Method::GET), "GET");
        for raw in ["FOO", "PROPFIND", "X1"] {
            assert_eq!(
                method_label(&Method::from_bytes(raw.as_bytes()).unwrap()),
                "other"
            );
        }
    }
}
