//! The E2B-compatible API: the control plane the official E2B SDKs call, over the provider
//! port only, and the envd router that relays their data-plane requests to each sandbox's
//! agent. Both are served on one listener of their own (`[e2b]` in the config); a request
//! addressed to a sandbox (`E2b-Sandbox-Id`, or a `Host` of `<port>-<id>.<domain>`) is the
//! router's, every other one the control plane's.
//!
//! - [`control`]: create (`POST /v2/sandboxes`, legacy `POST /sandboxes`), get, list (v2 with
//!   metadata and state filters and `X-Next-Token` paging, and the legacy list), kill, set
//!   timeout, refreshes, connect. Authenticated by `X-API-Key` (or `Authorization: Bearer`)
//!   against the tenants' tokens before any body is read. Errors are `{"code", "message"}`.
//! - [`envd`]: the router. It authenticates with the sandbox's access token or a signed file
//!   URL, strips the routing and credential headers, and hands the request to the
//!   [`EnvdPlane`], which relays it, bodies streamed both ways, to the agent. It implements
//!   none of envd's services itself.
//! - [`ids`]: sandbox IDs and the tokens derived from the server secret; [`meta`]: what a
//!   sandbox carries through the port's metadata; [`wire`]: the JSON.
//! - [`deadlines`] and [`expiry`]: each sandbox's deadline, kept in the store (or a file under
//!   the data directory), and the engine that kills at expiry.
//! - [`templates`]: template builds (`/v3/templates`, `/templates/...`); [`snapshots`]:
//!   `POST /sandboxes/{id}/snapshots` and `GET /snapshots` over the port's `Snapshots`, a
//!   snapshot being a template a create boots and `DELETE /templates/{id}` deletes.
//!
//! This module never names a backend adapter (tidy rule `e2b-api-port-only`): the composition
//! root hands it a provider and an [`EnvdPlane`].

pub mod control;
pub mod deadlines;
pub mod envd;
pub mod expiry;
pub mod ids;
pub mod meta;
pub mod preview;
pub mod serve;
pub mod snapshots;
pub mod templates;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use sandbox_core::{
    DeadlineStore, Error, ErrorKind, ListFilter, SandboxId, SandboxProvider, TenantId,
};

use self::ids::{E2bId, Keys};
use crate::auth::TenantAuth;
use crate::http::metrics::{API_E2B, Metrics};

/// What the E2B API needs of a backend beyond the provider port: a way to relay an HTTP
/// request to a sandbox's envd (for Docker, the agent channel), and the envd version the
/// sandbox's agent speaks.
#[async_trait::async_trait]
pub trait EnvdPlane: Send + Sync + std::fmt::Debug {
    /// The envd version sandbox `id`'s agent reports (opening its channel when needed).
    async fn envd_version(&self, id: &SandboxId) -> Result<String, Error>;
    /// Relays `request` to sandbox `id`'s envd and returns its answer, streamed. Never
    /// fails: a failure is an answer of its own, with a JSON body.
    async fn forward(&self, id: &SandboxId, request: Request<Body>) -> Response;
}

/// The settings the API runs with, from `[e2b]` and the backend's config.
#[derive(Debug, Clone)]
pub struct Settings {
    pub domain: String,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    /// Template name → engine image.
    pub templates: HashMap<String, sandbox_core::TemplateId>,
    /// What listings report of a sandbox's size (the backend's per-sandbox limits).
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    /// What each tenant may hold; of these the E2B API counts `max_sandboxes` (its own
    /// sandboxes, apart from the tenant's session sandboxes).
    pub quotas: sandbox_session::quota::Quotas,
    /// The images template builds may start from (`e2b.build_images`; a trailing `*`
    /// matches a prefix).
    pub build_images: Vec<String>,
    /// The most preview-port requests of one sandbox in flight at once (`preview`).
    pub max_tunnels_per_sandbox: usize,
}

impl Settings {
    /// The most live E2B sandboxes `tenant` may hold (`None`: no limit).
    pub fn max_sandboxes(&self, tenant: TenantId) -> Option<u32> {
        self.quotas
            .tenants
            .get(&tenant)
            .unwrap_or(&self.quotas.default)
            .max_sandboxes
    }
}

/// The API's state, shared by every request.
#[derive(Debug, Clone)]
pub struct E2bApi {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) provider: Arc<dyn SandboxProvider>,
    pub(crate) envd: Arc<dyn EnvdPlane>,
    pub(crate) auth: Arc<TenantAuth>,
    pub(crate) keys: Keys,
    pub(crate) deadlines: Arc<dyn DeadlineStore>,
    pub(crate) settings: Settings,
    pub(crate) index: SandboxIndex,
    /// Serialises each tenant's check of its sandbox limit (not its creates).
    pub(crate) create_locks: Mutex<HashMap<TenantId, Arc<tokio::sync::Mutex<()>>>>,
    /// Each tenant's creates in flight in this process, counted against its limit.
    pub(crate) pending_creates: Mutex<HashMap<TenantId, std::collections::HashSet<E2bId>>>,
    /// The preview ports' tunnels in flight, by sandbox (`preview`).
    pub(crate) tunnels: Arc<preview::TunnelCounts>,
    /// The envd version the agents last reported (one per service: see
    /// `control::envd_version_hint`).
    envd_version: Mutex<Option<String>>,
    /// Template builds this process started (`templates`).
    pub(crate) templates: templates::Records,
}

impl Inner {
    pub(crate) fn known_envd_version(&self) -> Option<String> {
        self.envd_version
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Remembers `version` as the agents' and returns it.
    pub(crate) fn learn_envd_version(&self, version: String) -> String {
        *self
            .envd_version
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(version.clone());
        version
    }
}

impl E2bApi {
    pub fn new(
        provider: Arc<dyn SandboxProvider>,
        envd: Arc<dyn EnvdPlane>,
        auth: Arc<TenantAuth>,
        keys: Keys,
        deadlines: Arc<dyn DeadlineStore>,
        settings: Settings,
    ) -> Self {
        E2bApi {
            inner: Arc::new(Inner {
                provider,
                envd,
                auth,
                keys,
                deadlines,
                settings,
                index: SandboxIndex::default(),
                create_locks: Mutex::new(HashMap::new()),
                pending_creates: Mutex::new(HashMap::new()),
                tunnels: Arc::default(),
                envd_version: Mutex::new(None),
                templates: templates::Records::default(),
            }),
        }
    }

    /// The timeout engine's view of this API's sandboxes.
    pub fn expiry_target(&self) -> Arc<dyn expiry::ExpiryTarget> {
        Arc::new(control::Target(self.clone()))
    }

    /// The deadline store the API writes.
    pub fn deadlines(&self) -> Arc<dyn DeadlineStore> {
        Arc::clone(&self.inner.deadlines)
    }
}

/// Where a sandbox lives: the tenant it belongs to and the backend's ID of it. Found through
/// the provider's listing by the sandbox's `sandbox.e2b.id` metadata and remembered, since
/// neither ever changes; forgotten when the sandbox is deleted or found gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub tenant: TenantId,
    pub sandbox: SandboxId,
}

/// The remembered locations, bounded.
#[derive(Debug, Default)]
pub(crate) struct SandboxIndex {
    known: Mutex<HashMap<E2bId, Located>>,
}

/// Locations remembered at most; past it the memory starts over (a lookup is one listing).
const INDEX_CAPACITY: usize = 16_384;

impl SandboxIndex {
    fn get(&self, id: &E2bId) -> Option<Located> {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    pub(crate) fn remember(&self, id: &E2bId, located: Located) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= INDEX_CAPACITY {
            known.clear();
        }
        known.insert(id.clone(), located);
    }

    pub(crate) fn forget(&self, id: &E2bId) {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }
}

impl Inner {
    /// Where sandbox `id` lives, whoever owns it; `None` when no such sandbox exists.
    pub(crate) async fn locate(&self, id: &E2bId) -> Result<Option<Located>, Error> {
        if let Some(found) = self.index.get(id) {
            return Ok(Some(found));
        }
        let mut filter = ListFilter {
            metadata: meta::api_filter(),
            ..ListFilter::default()
        };
        filter
            .metadata
            .insert(meta::ID.to_owned(), id.as_str().to_owned());
        let listed = self.provider.list(&filter).await?;
        // IDs are random and unique; were there ever two, the oldest is the one answered for.
        let Some(summary) = listed
            .into_iter()
            .filter(|s| meta::tenant_of(&s.metadata).is_some())
            .min_by_key(|s| s.started_at)
        else {
            return Ok(None);
        };
        let Some(tenant) = meta::tenant_of(&summary.metadata) else {
            return Ok(None);
        };
        let located = Located {
            tenant,
            sandbox: summary.id,
        };
        self.index.remember(id, located.clone());
        Ok(Some(located))
    }

    /// Where sandbox `id` of `tenant` lives: another tenant's sandbox is not there at all.
    pub(crate) async fn locate_owned(
        &self,
        tenant: TenantId,
        id: &str,
    ) -> Result<(E2bId, Located), ApiError> {
        let not_found = || ApiError::sandbox_not_found(id);
        let id = E2bId::parse(id).ok_or_else(not_found)?;
        match self.locate(&id).await.map_err(ApiError::from_core)? {
            Some(found) if found.tenant == tenant => Ok((id, found)),
            _ => Err(not_found()),
        }
    }
}

/// An error answer of the control plane: `{"code": <status>, "message": "..."}`, the shape
/// the SDKs parse before they look at the status.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn sandbox_not_found(id: &str) -> Self {
        let shown: String = id.chars().take(64).collect();
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Sandbox \"{shown}\" doesn't exist or you don't have access to it"),
        )
    }

    pub fn unauthorized() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "Invalid API key: send the tenant's token as X-API-Key",
        )
    }

    /// A core error as the status the service's table gives it, with its message.
    pub fn from_core(error: Error) -> Self {
        let (status, _code) = error.status_and_code();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(error = %error, "e2b api: backend failure");
        }
        ApiError::new(status, error.message().to_owned())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "code": self.status.as_u16(),
            "message": self.message,
        });
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE
            || self.status == StatusCode::TOO_MANY_REQUESTS
        {
            // The SDK retries these; a second later is a fair first guess.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        ApiError::from_core(error)
    }
}

/// Whether an error proves the sandbox is gone.
pub(crate) fn is_gone(error: &Error) -> bool {
    matches!(error.kind(), ErrorKind::NotFound | ErrorKind::Terminal)
}

/// The tenant a control-plane request authenticates as.
#[derive(Debug, Clone, Copy)]
pub struct Caller(pub TenantId);

/// The largest control-plane request body (creates with metadata and env are well below).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Both planes on one router: the envd router for requests addressed to a sandbox, the
/// control plane for the rest. Every request is counted and timed on `metrics`' HTTP
/// families with `api="e2b"`.
pub fn router(api: E2bApi, metrics: Arc<Metrics>) -> Router {
    let control = control::routes()
        .merge(templates::routes())
        .merge(snapshots::routes())
        .layer(middleware::from_fn_with_state(api.clone(), authenticate))
        .route("/health", axum::routing::get(health))
        .layer(middleware::from_fn(tag_route))
        .fallback(not_found)
        .with_state(api.clone());
    control
        .layer(middleware::from_fn_with_state(api.clone(), envd::dispatch))
        .layer(middleware::from_fn_with_state((api, metrics), record))
}

/// The route a control-plane request matched, as its template (`/sandboxes/{id}`),
/// carried out on the response for [`record`].
#[derive(Debug, Clone)]
struct MatchedRoute(String);

async fn tag_route(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(MatchedRoute(route));
    }
    response
}

/// The `route` label of a request addressed to a sandbox: envd's services by name, other
/// ports as `preview`. Never the raw path, which a caller chooses.
fn envd_route(port: u16, path: &str) -> &'static str {
    if port != envd::ENVD_PORT {
        return "preview";
    }
    match path {
        "/files" => "envd /files",
        "/health" => "envd /health",
        _ if path.starts_with("/process.Process/") => "envd /process.Process",
        _ if path.starts_with("/filesystem.Filesystem/") => "envd /filesystem.Filesystem",
        _ => "envd other",
    }
}

/// Counts and times every request of this API, on the same families as the service's own.
async fn record(
    State((api, metrics)): State<(E2bApi, Arc<Metrics>)>,
    request: Request,
    next: Next,
) -> Response {
    let addressed = match envd::route_of(&api.inner.settings.domain, request.headers()) {
        envd::Route::Control => None,
        envd::Route::Bad(_) => Some("envd bad route"),
        envd::Route::Sandbox { port, .. } => Some(envd_route(port, request.uri().path())),
    };
    let method = crate::http::method_label(request.method());
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let route = match addressed {
        Some(route) => route,
        None => response
            .extensions()
            .get::<MatchedRoute>()
            .map_or("unmatched", |r| r.0.as_str()),
    };
    metrics.observe_request(
        API_E2B,
        method,
        route,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

async fn health() -> &'static str {
    "Health check successful"
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route")
}

/// Authenticates a control-plane request before any handler (and so any body read) runs.
async fn authenticate(State(api): State<E2bApi>, mut request: Request, next: Next) -> Response {
    match caller_of(&api.inner.auth, request.headers()) {
        Some(tenant) => {
            request.extensions_mut().insert(Caller(tenant));
            next.run(request).await
        }
        None => {
            // Debug, not info: anyone can send these, and the key itself is never logged.
            tracing::debug!(path = %request.uri().path(), "e2b api: request refused: no valid API key");
            ApiError::unauthorized().into_response()
        }
    }
}

fn caller_of(auth: &TenantAuth, headers: &HeaderMap) -> Option<TenantId> {
    if let Some(key) = headers.get("x-api-key") {
        return auth.tenant_of(key.to_str().ok()?.trim());
    }
    let bearer = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = bearer
        .strip_prefix("Bearer ")
        .or_else(|| bearer.strip_prefix("bearer "))?;
    auth.tenant_of(token.trim())
}
