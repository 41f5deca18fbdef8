//! The control plane's routes (module docs of [`super`]).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json};
use sandbox_core::{
    CreateRequest, Error, IdleTimeout, ListFilter, Operation, SandboxState, SandboxSummary,
    TimeoutAction, TimeoutPolicy,
};
use serde::Deserialize;
use time::OffsetDateTime;

use super::expiry::Expired;
use super::ids::E2bId;
use super::wire::{self, CLIENT_ID, ListedSandbox, SandboxAnswer, SandboxDetail};
use super::{ApiError, Caller, E2bApi, Inner, Located, MAX_BODY_BYTES, is_gone, meta};

/// The control plane's routes (authenticated by the layer [`super::router`] puts on them).
pub(crate) fn routes() -> Router<E2bApi> {
    Router::new()
        .route("/v2/sandboxes", post(create_v2).get(list_v2))
        .route("/sandboxes", post(create_legacy).get(list_legacy))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume_legacy))
}

/// The legacy create's default timeout, as the API defines it.
const LEGACY_DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest refresh the API accepts.
const MAX_REFRESH: Duration = Duration::from_secs(3600);
/// The user and working directory processes of an E2B sandbox default to.
pub const DEFAULT_USER: &str = "user";
pub const DEFAULT_WORKDIR: &str = "/home/user";

async fn body_of(request: Request) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|e| {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
                )
            } else {
                ApiError::bad_request(format!("the request body could not be read: {e}"))
            }
        })
}

/// A JSON body of `T`, or `T::default()` for an empty one (the routes whose body is optional).
pub(crate) async fn optional_json<T: for<'de> Deserialize<'de> + Default>(
    request: Request,
) -> Result<T, ApiError> {
    let body = body_of(request).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid: {e}")))
}

fn timeout_of(api: &Inner, seconds: Option<i64>, default: Duration) -> Result<Duration, ApiError> {
    let Some(seconds) = seconds else {
        return Ok(default.min(api.settings.max_timeout));
    };
    if seconds <= 0 {
        return Err(ApiError::bad_request("Timeout must be greater than 0"));
    }
    let asked = Duration::from_secs(seconds.unsigned_abs());
    if asked > api.settings.max_timeout {
        let max = api.settings.max_timeout.as_secs();
        return Err(ApiError::bad_request(format!(
            "Timeout cannot be greater than {} hours ({max} seconds)",
            max / 3600
        )));
    }
    Ok(asked)
}

fn after(now: OffsetDateTime, d: Duration) -> OffsetDateTime {
    now + time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}

async fn create_v2(
    State(api): State<E2bApi>,
    Extension(caller): Extension<Caller>,
    request: Request,
) -> Result<Response, ApiError> {
    create(api, caller, request, false).await
}

async fn create_legacy(
    State(api): State<E2bApi>,
    Extension(caller): Extension<Caller>,
    request: Request,
) -> Result<Response, ApiError> {
    create(api, caller, request, true).await
}

async fn create(
    api: E2bApi,
    Caller(tenant): Caller,
    request: Request,
    legacy: bool,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let body = body_of(request).await?;
    let new = wire::parse_new_sandbox(&body, legacy).map_err(|r| ApiError::bad_request(r.0))?;
    meta::check_caller_metadata(&new.metadata).map_err(ApiError::bad_request)?;
    for name in new.env.keys() {
        sandbox_core::exec::validate_env_name(name)
            .map_err(|e| ApiError::bad_request(format!("envVars: {}", e.message())))?;
    }
    let default = if legacy {
        LEGACY_DEFAULT_TIMEOUT
    } else {
        inner.settings.default_timeout
    };
    let timeout = timeout_of(inner, new.timeout, default)?;
    if new.auto_pause && sandbox_core::narrow::pause_resume(&*inner.provider).is_none() {
        return Err(ApiError::bad_request(
            "autoPause: this server's backend cannot pause sandboxes",
        ));
    }
    let (image, booted) = resolve_template(inner, tenant, &new.template).await?;

    let id = E2bId::generate().map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    let _reserved = reserve(&api, tenant, &id).await?;

    let deadline = after(OffsetDateTime::now_utc(), timeout);
    // Written before the sandbox exists: a crash after this line leaves a deadline whose
    // sandbox may or may not exist, which the timeout engine handles either way; a crash
    // after the create and before the write would leave a sandbox nothing ever kills.
    inner.deadlines.set_deadline(id.as_str(), deadline).await?;
    let mut create = CreateRequest::new(image.clone());
    create.metadata = meta::stamped(
        &new.metadata,
        &id,
        tenant,
        deadline.unix_timestamp(),
        &new.template,
    );
    if new.auto_pause {
        create.metadata.insert(
            meta::ON_TIMEOUT.to_owned(),
            meta::ON_TIMEOUT_PAUSE.to_owned(),
        );
    }
    match booted {
        Booted::Image => {}
        Booted::Built(template_id) => {
            create
                .metadata
                .insert(super::templates::BUILT_TEMPLATE.to_owned(), template_id);
            create.metadata.insert(
                sandbox_core::TEMPLATE_TENANT.to_owned(),
                tenant.get().to_string(),
            );
        }
        Booted::Snapshot => {
            // The backend restores only a snapshot of the tenant the ownership metadata
            // (stamped above) names. A restored sandbox may inherit the source's metadata
            // (Docker: the image's labels), so every flag this API reads is written out,
            // and none of the source's settings carries over unasked.
            create.from_snapshot = true;
            for (key, value) in [
                (meta::ON_TIMEOUT, meta::ON_TIMEOUT_KILL),
                (meta::PUBLIC, "true"),
                (meta::INTERNET, "true"),
            ] {
                create
                    .metadata
                    .entry(key.to_owned())
                    .or_insert_with(|| value.to_owned());
            }
        }
    }
    create.env = new.env;
    // Their own timeout engine owns them (and pauses the ones that pause): the backend's idle
    // reclaim must never.
    create.timeout = TimeoutPolicy {
        idle: IdleTimeout::Never,
        on_timeout: TimeoutAction::Kill,
        auto_resume: false,
    };
    if new.traffic_closed {
        create
            .metadata
            .insert(meta::PUBLIC.to_owned(), "false".to_owned());
    }
    if new.deny_internet {
        create.network.allow_internet_access = Some(false);
        create
            .metadata
            .insert(meta::INTERNET.to_owned(), "false".to_owned());
    }
    create.user = Some(
        sandbox_core::SandboxPath::new(DEFAULT_WORKDIR)
            .and_then(|workdir| sandbox_core::SandboxUser::new(DEFAULT_USER, workdir))
            .map_err(ApiError::from_core)?,
    );
    let handle = match inner.provider.create(create).await {
        Ok(handle) => handle,
        Err(e) => {
            let _ = inner.deadlines.remove_deadline(id.as_str()).await;
            return Err(base_hint(inner, &image, create_failed(e)));
        }
    };
    let located = Located {
        tenant,
        sandbox: handle.id().clone(),
    };
    inner.index.remember(&id, located.clone());
    let envd_version = match inner.envd.envd_version(handle.id()).await {
        Ok(version) => inner.learn_envd_version(version),
        Err(e) => {
            // A sandbox whose agent does not answer is of no use to an SDK: undo the create.
            tracing::warn!(sandbox = %id, error = %e, "e2b api: the new sandbox's agent did not answer; deleting it");
            let _ = inner.provider.delete(&located.sandbox).await;
            inner.index.forget(&id);
            let _ = inner.deadlines.remove_deadline(id.as_str()).await;
            return Err(create_failed(e));
        }
    };
    tracing::info!(sandbox = %id, tenant = tenant.get(), template = %new.template, timeout_seconds = timeout.as_secs(), "e2b api: sandbox created");
    let answer = sandbox_answer(
        inner,
        tenant,
        &id,
        &new.template,
        envd_version,
        !new.traffic_closed,
    );
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// What a create's template is, beyond the backend's template it names.
enum Booted {
    /// An image of `[e2b.templates]`.
    Image,
    /// The tenant's built template of this ID.
    Built(String),
    /// One of the tenant's snapshots.
    Snapshot,
}

/// The image a create's `templateID` boots: the operator's `[e2b.templates]` first (a name,
/// with or without `:default`), then the tenant's own built templates (by name, `name:tag` or
/// template ID), then the tenant's snapshots (by snapshot ID). Anything else is 404.
async fn resolve_template(
    inner: &Inner,
    tenant: sandbox_core::TenantId,
    template: &str,
) -> Result<(sandbox_core::TemplateId, Booted), ApiError> {
    let name = template.to_ascii_lowercase();
    let configured = inner
        .settings
        .templates
        .get(&name)
        .or_else(|| {
            inner
                .settings
                .templates
                .get(name.trim_end_matches(":default"))
        })
        .cloned();
    if let Some(image) = configured {
        return Ok((image, Booted::Image));
    }
    if let Some((image, template_id)) = super::templates::resolve(inner, tenant, template).await? {
        return Ok((image, Booted::Built(template_id)));
    }
    if let Some(snapshot) = super::snapshots::resolve(inner, tenant, template).await? {
        return Ok((snapshot, Booted::Snapshot));
    }
    let shown: String = template.chars().take(128).collect();
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        format!("template '{shown}' not found"),
    ))
}

/// A failed create of the default Debian image says how to make that image.
fn base_hint(inner: &Inner, image: &sandbox_core::TemplateId, error: ApiError) -> ApiError {
    let is_default_base = image.as_str() == crate::config::DEFAULT_E2B_BASE_IMAGE
        && inner.settings.templates.get("base") == Some(image);
    if !is_default_base {
        return error;
    }
    ApiError::new(
        error.status,
        format!(
            "{} (template base boots the Debian sandbox image {}: build it with `cargo xtask debian-image`, or name another image in e2b.templates.base)",
            error.message,
            image.as_str()
        ),
    )
}

/// A tenant's create in flight, counted against its sandbox limit until it ends (dropped).
struct Reservation {
    api: E2bApi,
    tenant: sandbox_core::TenantId,
    id: E2bId,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut pending = self
            .api
            .inner
            .pending_creates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(ids) = pending.get_mut(&self.tenant) {
            ids.remove(&self.id);
            if ids.is_empty() {
                pending.remove(&self.tenant);
            }
        }
    }
}

/// Counts create `id` against the tenant's limit: the tenant holds its live sandboxes and its
/// creates in flight in this process, each counted once (a create that already made its
/// sandbox is both, by the same ID). Only the check is serialised per tenant, not the creates,
/// so a tenant's parallel creates still run in parallel. (Replicas each know their own creates
/// in flight: a burst spread over several may overshoot by what they had in flight at once.)
async fn reserve(
    api: &E2bApi,
    tenant: sandbox_core::TenantId,
    id: &E2bId,
) -> Result<Option<Reservation>, ApiError> {
    let inner = &api.inner;
    let Some(max) = inner.settings.max_sandboxes(tenant) else {
        return Ok(None);
    };
    let gate = {
        let mut gates = inner
            .create_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(gates.entry(tenant).or_default())
    };
    let _checking = gate.lock().await;
    let live: std::collections::HashSet<String> = inner
        .provider
        .list(&tenant_filter(tenant))
        .await?
        .into_iter()
        .filter_map(|s| s.metadata.get(meta::ID).cloned())
        .collect();
    let mut pending = inner
        .pending_creates
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let in_flight = pending.entry(tenant).or_default();
    let held = live.len()
        + in_flight
            .iter()
            .filter(|p| !live.contains(p.as_str()))
            .count();
    if held >= usize::try_from(max).unwrap_or(usize::MAX) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "tenant {} already holds {held} sandboxes, its limit (quotas.max_sandboxes); kill one first",
                tenant.get()
            ),
        ));
    }
    in_flight.insert(id.clone());
    Ok(Some(Reservation {
        api: api.clone(),
        tenant,
        id: id.clone(),
    }))
}

/// A create the backend refused: a caller's mistake keeps its status, the backend's failures
/// are 500s (503 when it is busy or away), with the backend's words.
fn create_failed(error: Error) -> ApiError {
    ApiError::from_core(error)
}

fn tenant_filter(tenant: sandbox_core::TenantId) -> ListFilter {
    let mut metadata = meta::api_filter();
    metadata.insert(meta::TENANT.to_owned(), tenant.get().to_string());
    ListFilter {
        metadata,
        ..ListFilter::default()
    }
}

fn sandbox_answer(
    inner: &Inner,
    tenant: sandbox_core::TenantId,
    id: &E2bId,
    template: &str,
    envd_version: String,
    public: bool,
) -> SandboxAnswer {
    SandboxAnswer {
        template_id: template.to_owned(),
        sandbox_id: id.as_str().to_owned(),
        client_id: CLIENT_ID.to_owned(),
        envd_version,
        envd_access_token: inner.keys.access_token(tenant, id),
        traffic_access_token: (!public).then(|| inner.keys.traffic_token(tenant, id)),
        domain: inner.settings.domain.clone(),
    }
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The state word of the API: only `running` and `paused` exist on its wire.
fn state_word(state: SandboxState) -> Option<&'static str> {
    match state {
        SandboxState::Running | SandboxState::Transitioning => Some("running"),
        SandboxState::Paused => Some("paused"),
        SandboxState::Terminal | SandboxState::Unknown => None,
    }
}

async fn listed(inner: &Inner, summary: &SandboxSummary) -> Option<ListedSandbox> {
    let id = summary.metadata.get(meta::ID)?;
    let state = state_word(summary.state)?;
    let end = match inner.deadlines.deadline(id).await {
        Ok(Some(at)) => Some(at),
        _ => meta::deadline_of(&summary.metadata),
    };
    let started = summary.started_at.unwrap_or_else(OffsetDateTime::now_utc);
    Some(ListedSandbox {
        template_id: summary
            .metadata
            .get(meta::TEMPLATE)
            .cloned()
            .unwrap_or_default(),
        sandbox_id: id.clone(),
        client_id: CLIENT_ID.to_owned(),
        started_at: rfc3339(started),
        end_at: rfc3339(end.unwrap_or(started)),
        cpu_count: inner.settings.cpu_count,
        memory_mb: inner.settings.memory_mb,
        disk_size_mb: inner.settings.disk_size_mb,
        state,
        envd_version: envd_version_hint(inner, summary).await,
        metadata: meta::caller_view(&summary.metadata),
    })
}

/// The envd version a listing reports. Every agent this service installs is the one
/// version it checked at start, so the version one sandbox's agent reported stands for all:
/// a listing of a hundred sandboxes opens no hundred channels.
async fn envd_version_hint(inner: &Inner, summary: &SandboxSummary) -> String {
    if let Some(known) = inner.known_envd_version() {
        return known;
    }
    match inner.envd.envd_version(&summary.id).await {
        Ok(version) => inner.learn_envd_version(version),
        Err(_) => String::new(),
    }
}

async fn get_one(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let (e2b_id, located) = inner.locate_owned(tenant, &id).await?;
    let summary = match inner.provider.get(&located.sandbox).await {
        Ok(summary) => summary,
        Err(e) if is_gone(&e) => {
            inner.index.forget(&e2b_id);
            return Err(ApiError::sandbox_not_found(&id));
        }
        Err(e) => return Err(e.into()),
    };
    let listed = listed(inner, &summary)
        .await
        .ok_or_else(|| ApiError::sandbox_not_found(&id))?;
    let detail = SandboxDetail {
        listed,
        envd_access_token: inner.keys.access_token(tenant, &e2b_id),
        allow_internet_access: meta::internet_of(&summary.metadata),
        domain: inner.settings.domain.clone(),
        lifecycle: wire::Lifecycle {
            auto_resume: false,
            on_timeout: if meta::pauses_on_timeout(&summary.metadata) {
                meta::ON_TIMEOUT_PAUSE
            } else {
                meta::ON_TIMEOUT_KILL
            },
        },
    };
    Ok(Json(detail).into_response())
}

/// The query of `GET /v2/sandboxes` (and of the legacy list, which takes `metadata` only).
/// Read by hand so a parameter this server does not honour is refused by name, never
/// ignored: an ignored filter would answer a wider set than asked for.
#[derive(Debug, Default)]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<String>,
    next_token: Option<String>,
    order: Option<String>,
}

impl ListQuery {
    fn parse(raw: Option<&str>, legacy: bool) -> Result<ListQuery, ApiError> {
        let mut out = ListQuery::default();
        for (key, value) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            let value = Some(value.into_owned());
            match key.as_ref() {
                "metadata" => out.metadata = value,
                "state" if !legacy => out.state = value,
                "limit" if !legacy => out.limit = value,
                "nextToken" if !legacy => out.next_token = value,
                "order" if !legacy => out.order = value,
                other => {
                    let shown: String = other.chars().take(64).collect();
                    return Err(ApiError::bad_request(format!(
                        "{shown}: not a filter this server supports, so it cannot honour it"
                    )));
                }
            }
        }
        Ok(out)
    }
}

/// The tenant's sandboxes with the query's metadata pairs (decoded as the SDK encodes them).
fn caller_filter(
    tenant: sandbox_core::TenantId,
    query: &ListQuery,
) -> Result<ListFilter, ApiError> {
    let mut filter = tenant_filter(tenant);
    if let Some(raw) = &query.metadata {
        let wanted = meta::decode_filter(raw).map_err(ApiError::bad_request)?;
        meta::check_caller_metadata(&wanted).map_err(ApiError::bad_request)?;
        filter.metadata.extend(wanted);
    }
    Ok(filter)
}

/// The listing entries of `summaries`, those of this API only.
async fn listed_all(inner: &Inner, summaries: &[SandboxSummary]) -> Vec<ListedSandbox> {
    let mut out = Vec::with_capacity(summaries.len());
    for summary in summaries {
        if let Some(item) = listed(inner, summary).await {
            out.push(item);
        }
    }
    out
}

/// The most a page may hold, and what a list without `limit` gets.
const MAX_PAGE: usize = 100;

async fn list_v2(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let query = ListQuery::parse(raw.as_deref(), false)?;
    let mut filter = caller_filter(tenant, &query)?;
    let order = match query.order.as_deref() {
        None | Some("desc") => sandbox_core::ListOrder::NewestFirst,
        Some("asc") => sandbox_core::ListOrder::OldestFirst,
        Some(other) => {
            let shown: String = other.chars().take(32).collect();
            return Err(ApiError::bad_request(format!(
                "order: {shown:?} is not asc or desc"
            )));
        }
    };
    let mut want_running = true;
    let mut want_paused = true;
    if let Some(states) = &query.state {
        want_running = false;
        want_paused = false;
        for word in states.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "running" => want_running = true,
                "paused" => want_paused = true,
                other => {
                    let shown: String = other.chars().take(32).collect();
                    return Err(ApiError::bad_request(format!(
                        "state: {shown:?} is not running or paused"
                    )));
                }
            }
        }
    }
    let limit = match &query.limit {
        None => MAX_PAGE,
        Some(raw) => match raw.parse::<usize>() {
            Ok(n @ 1..=MAX_PAGE) => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "limit must be a whole number from 1 to {MAX_PAGE}"
                )));
            }
        },
    };
    if want_running {
        filter
            .states
            .extend([SandboxState::Running, SandboxState::Transitioning]);
    }
    if want_paused {
        filter.states.push(SandboxState::Paused);
    }
    let cursor =
        match query.next_token.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(raw) => Some(sandbox_core::ListCursor::parse(raw).map_err(|_| {
                ApiError::bad_request("nextToken is not a token this server issued")
            })?),
        };
    let page = sandbox_core::ListPage {
        limit,
        cursor,
        order,
    };
    let page = inner.provider.list_page(&filter, &page).await?;
    let out = listed_all(inner, &page.items).await;
    let mut response = Json(out).into_response();
    if let Some(next) = page.next
        && let Ok(value) = HeaderValue::from_str(next.as_str())
    {
        response.headers_mut().insert("x-next-token", value);
    }
    Ok(response)
}

/// The legacy list: running sandboxes only, no paging.
async fn list_legacy(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let query = ListQuery::parse(raw.as_deref(), true)?;
    let mut filter = caller_filter(tenant, &query)?;
    filter.states = vec![SandboxState::Running, SandboxState::Transitioning];
    let all = inner.provider.list(&filter).await?;
    Ok(Json(listed_all(inner, &all).await).into_response())
}

async fn kill(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let (e2b_id, located) = inner.locate_owned(tenant, &id).await?;
    match inner.provider.delete(&located.sandbox).await {
        Ok(()) => {}
        Err(e) if is_gone(&e) => {
            inner.index.forget(&e2b_id);
            let _ = inner.deadlines.remove_deadline(e2b_id.as_str()).await;
            return Err(ApiError::sandbox_not_found(&id));
        }
        Err(e) => return Err(e.into()),
    }
    inner.index.forget(&e2b_id);
    // The sandbox is gone; a deadline left behind (the store failing now) only makes the
    // timeout engine try a delete that finds nothing.
    if let Err(e) = inner.deadlines.remove_deadline(e2b_id.as_str()).await {
        tracing::warn!(sandbox = %e2b_id, error = %e, "e2b api: the killed sandbox's deadline stays until the timeout engine clears it");
    }
    tracing::info!(sandbox = %e2b_id, tenant = tenant.get(), "e2b api: sandbox killed");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Checks `id` is `tenant`'s live sandbox, answering 404 when it is gone.
pub(crate) async fn live_owned(
    inner: &Inner,
    tenant: sandbox_core::TenantId,
    id: &str,
) -> Result<(E2bId, Located, SandboxSummary), ApiError> {
    let (e2b_id, located) = inner.locate_owned(tenant, id).await?;
    match inner.provider.get(&located.sandbox).await {
        Ok(summary) if state_word(summary.state).is_some() => Ok((e2b_id, located, summary)),
        Ok(_) => Err(ApiError::sandbox_not_found(id)),
        Err(e) if is_gone(&e) => {
            inner.index.forget(&e2b_id);
            Err(ApiError::sandbox_not_found(id))
        }
        Err(e) => Err(e.into()),
    }
}

async fn set_timeout(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let body: wire::TimeoutBody = optional_json(request).await?;
    let Some(seconds) = body.timeout else {
        return Err(ApiError::bad_request("timeout is required"));
    };
    let timeout = timeout_of(inner, Some(seconds), inner.settings.default_timeout)?;
    let (e2b_id, _, _) = live_owned(inner, tenant, &id).await?;
    // Overwrites: a shorter timeout than before is the caller's to ask for.
    let deadline = after(OffsetDateTime::now_utc(), timeout);
    inner
        .deadlines
        .set_deadline(e2b_id.as_str(), deadline)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn refresh(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let body: wire::RefreshBody = optional_json(request).await?;
    let duration = match body.duration {
        None => inner.settings.default_timeout.min(MAX_REFRESH),
        Some(d @ 0..=3600) => Duration::from_secs(d.unsigned_abs()),
        Some(_) => {
            return Err(ApiError::bad_request(
                "duration must be from 0 to 3600 seconds",
            ));
        }
    };
    let (e2b_id, _, _) = live_owned(inner, tenant, &id).await?;
    extend_to(inner, &e2b_id, after(OffsetDateTime::now_utc(), duration)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Moves a deadline later, never earlier.
async fn extend_to(inner: &Inner, id: &E2bId, at: OffsetDateTime) -> Result<(), Error> {
    let current = inner.deadlines.deadline(id.as_str()).await?;
    if current.is_none_or(|c| c < at) {
        inner.deadlines.set_deadline(id.as_str(), at).await?;
    }
    Ok(())
}

async fn connect(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let body: wire::TimeoutBody = optional_json(request).await?;
    let timeout = timeout_of(inner, body.timeout, inner.settings.default_timeout)?;
    let (e2b_id, located, summary) = live_owned(inner, tenant, &id).await?;
    let resumed = summary.state == SandboxState::Paused;
    if resumed {
        if body.memory == Some(false) {
            return Err(ApiError::bad_request(
                "memory: a reboot-style resume is not supported by this server; its resume keeps the memory",
            ));
        }
        resume_to(inner, &e2b_id, &located, timeout).await?;
    } else {
        // For a running sandbox a connect only ever extends its timeout.
        extend_to(inner, &e2b_id, after(OffsetDateTime::now_utc(), timeout)).await?;
    }
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    answer_for(inner, tenant, &e2b_id, &located, &summary, status).await
}

/// The `Sandbox` answer of a connect or a resume, with `status`. The envd version comes from
/// the sandbox's agent: after a resume that is the channel's first call, which re-opens it.
async fn answer_for(
    inner: &Inner,
    tenant: sandbox_core::TenantId,
    e2b_id: &E2bId,
    located: &Located,
    summary: &SandboxSummary,
    status: StatusCode,
) -> Result<Response, ApiError> {
    let envd_version = inner.learn_envd_version(inner.envd.envd_version(&located.sandbox).await?);
    let template = summary
        .metadata
        .get(meta::TEMPLATE)
        .cloned()
        .unwrap_or_default();
    let public = meta::public_of(&summary.metadata);
    let answer = sandbox_answer(inner, tenant, e2b_id, &template, envd_version, public);
    Ok((status, Json(answer)).into_response())
}

/// Resumes a paused sandbox (the provider's connect, which resumes) and gives it the deadline
/// `now + timeout`: a paused sandbox had none. The deadline is written first, so a crash
/// between the two leaves a deadline on a paused sandbox (which the timeout engine clears)
/// rather than a running sandbox that nothing ever ends.
async fn resume_to(
    inner: &Inner,
    e2b_id: &E2bId,
    located: &Located,
    timeout: Duration,
) -> Result<(), ApiError> {
    inner
        .deadlines
        .set_deadline(e2b_id.as_str(), after(OffsetDateTime::now_utc(), timeout))
        .await?;
    match inner
        .provider
        .connect(sandbox_core::ConnectRequest::new(located.sandbox.clone()))
        .await
    {
        Ok(_) => {}
        Err(e) if is_gone(&e) => {
            inner.index.forget(e2b_id);
            let _ = inner.deadlines.remove_deadline(e2b_id.as_str()).await;
            return Err(ApiError::sandbox_not_found(e2b_id.as_str()));
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(sandbox = %e2b_id, tenant = located.tenant.get(), timeout_seconds = timeout.as_secs(), "e2b api: sandbox resumed");
    Ok(())
}

/// The conflict of pausing a paused sandbox, in the API's words.
fn already_paused(id: &str) -> ApiError {
    let shown: String = id.chars().take(64).collect();
    ApiError::new(
        StatusCode::CONFLICT,
        format!("Error pausing sandbox - sandbox '{shown}' is already paused"),
    )
}

/// `POST /sandboxes/{id}/pause`: 204 once paused (its deadline then removed: a paused sandbox
/// has none), 409 when it is paused already.
async fn pause(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let body: wire::PauseBody = optional_json(request).await?;
    if body.memory == Some(false) {
        return Err(ApiError::bad_request(
            "memory: filesystem-only pause is not supported by this server; its pause keeps the memory",
        ));
    }
    let (e2b_id, located, summary) = live_owned(inner, tenant, &id).await?;
    if summary.state == SandboxState::Paused {
        return Err(already_paused(&id));
    }
    let Some(pauser) = sandbox_core::narrow::pause_resume(&*inner.provider) else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this server's backend cannot pause sandboxes",
        ));
    };
    if body.require_healthy_guest == Some(true) {
        // Strict: a guest whose envd does not answer is not paused.
        inner
            .envd
            .envd_version(&located.sandbox)
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    format!(
                        "Error pausing sandbox - the sandbox's envd did not answer: {}",
                        e.message()
                    ),
                )
            })?;
    }
    pause_located(inner, pauser, &e2b_id, &located)
        .await
        .map_err(|e| match e {
            Paused::Already => already_paused(&id),
            Paused::Failed(e) if is_gone(&e) => {
                inner.index.forget(&e2b_id);
                ApiError::sandbox_not_found(&id)
            }
            Paused::Failed(e) => e.into(),
        })?;
    tracing::info!(sandbox = %e2b_id, tenant = tenant.get(), "e2b api: sandbox paused");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Why [`pause_located`] did not pause.
enum Paused {
    /// It was paused already (by another call since it was looked at).
    Already,
    Failed(Error),
}

/// Pauses the sandbox, then removes its deadline (after the pause succeeded: a failed pause
/// keeps the sandbox running, and so its deadline).
async fn pause_located(
    inner: &Inner,
    pauser: &dyn sandbox_core::PauseResume,
    e2b_id: &E2bId,
    located: &Located,
) -> Result<(), Paused> {
    match pauser.pause(&located.sandbox).await {
        Ok(()) => {}
        Err(e)
            if e.kind() == sandbox_core::ErrorKind::Conflict
                && e.code() == Some(sandbox_core::ErrorCode::SandboxPaused) =>
        {
            return Err(Paused::Already);
        }
        Err(e) => return Err(Paused::Failed(e)),
    }
    if let Err(e) = inner.deadlines.remove_deadline(e2b_id.as_str()).await {
        // Left behind, it only makes the timeout engine find the sandbox paused and clear it.
        tracing::warn!(sandbox = %e2b_id, error = %e, "e2b api: the paused sandbox's deadline stays until the timeout engine clears it");
    }
    Ok(())
}

/// The legacy resume's default timeout, as the API defines it.
const LEGACY_RESUME_TIMEOUT: Duration = Duration::from_secs(15);

/// `POST /sandboxes/{id}/resume` (deprecated in the API): 201 once resumed, 409 when it runs.
async fn resume_legacy(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let body: wire::ResumeBody = optional_json(request).await?;
    if body.memory == Some(false) {
        return Err(ApiError::bad_request(
            "memory: a reboot-style resume is not supported by this server; its resume keeps the memory",
        ));
    }
    if body.auto_pause == Some(true) {
        return Err(ApiError::bad_request(
            "autoPause: a sandbox's timeout action is set at its create on this server, not at a resume",
        ));
    }
    let timeout = timeout_of(inner, body.timeout, LEGACY_RESUME_TIMEOUT)?;
    let (e2b_id, located, summary) = live_owned(inner, tenant, &id).await?;
    if summary.state != SandboxState::Paused {
        let shown: String = id.chars().take(64).collect();
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("Sandbox '{shown}' is already running"),
        ));
    }
    resume_to(inner, &e2b_id, &located, timeout).await?;
    answer_for(
        inner,
        tenant,
        &e2b_id,
        &located,
        &summary,
        StatusCode::CREATED,
    )
    .await
}

/// The timeout engine's view: every sandbox of this API, and how to kill one.
#[derive(Debug)]
pub(crate) struct Target(pub(crate) E2bApi);

#[async_trait::async_trait]
impl super::expiry::ExpiryTarget for Target {
    async fn expire(&self, key: &str) -> Result<Expired, Error> {
        let inner = &self.0.inner;
        let Some(id) = E2bId::parse(key) else {
            return Ok(Expired::Killed);
        };
        let Some(located) = inner.locate(&id).await? else {
            return Ok(Expired::Killed);
        };
        let summary = match inner.provider.get(&located.sandbox).await {
            Ok(summary) => summary,
            Err(e) if is_gone(&e) => {
                inner.index.forget(&id);
                return Ok(Expired::Killed);
            }
            Err(e) => return Err(e),
        };
        // A paused sandbox has no deadline: one left behind (a crash between a pause and the
        // removal) is only cleared.
        if summary.state == SandboxState::Paused {
            return Ok(Expired::Paused);
        }
        if meta::pauses_on_timeout(&summary.metadata) {
            let Some(pauser) = sandbox_core::narrow::pause_resume(&*inner.provider) else {
                return Err(Error::unsupported(
                    Operation::PAUSE,
                    format!("sandbox {id} pauses at its timeout, and this backend cannot pause"),
                ));
            };
            match pauser.pause(&located.sandbox).await {
                Ok(()) => {}
                Err(e) if e.code() == Some(sandbox_core::ErrorCode::SandboxPaused) => {}
                Err(e) if is_gone(&e) => {
                    inner.index.forget(&id);
                    return Ok(Expired::Killed);
                }
                Err(e) => return Err(e),
            }
            tracing::info!(sandbox = %id, tenant = located.tenant.get(), "e2b api: sandbox paused at its timeout");
            return Ok(Expired::Paused);
        }
        match inner.provider.delete(&located.sandbox).await {
            Ok(()) => {}
            Err(e) if is_gone(&e) => {}
            Err(e) => return Err(e),
        }
        inner.index.forget(&id);
        tracing::info!(sandbox = %id, tenant = located.tenant.get(), "e2b api: sandbox killed at its timeout");
        Ok(Expired::Killed)
    }

    async fn live(&self) -> Result<Vec<(String, Option<OffsetDateTime>)>, Error> {
        let inner = &self.0.inner;
        let filter = ListFilter {
            metadata: meta::api_filter(),
            ..ListFilter::default()
        };
        let all = inner.provider.list(&filter).await?;
        Ok(all
            .iter()
            .filter(|s| !matches!(s.state, SandboxState::Terminal | SandboxState::Paused))
            .filter_map(|s| {
                let id = s.metadata.get(meta::ID)?;
                Some((id.clone(), meta::deadline_of(&s.metadata)))
            })
            .collect())
    }
}
