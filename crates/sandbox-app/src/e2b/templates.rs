//! Template builds from images already on the backend: the routes `Template.build` and the
//! SDKs' template calls use, over the port's `TemplateBuilds` capability.
//!
//! A build's source is `fromImage` only, and the image must be allowed by the operator
//! (`e2b.build_images`) and present on the backend, which never fetches it. Everything else a
//! build start may say (`fromTemplate`, `fromImageRegistry`, steps, start and ready commands)
//! is refused with 400 naming it: it would need a build this service does not run.
//!
//! Where things live: a finished build is the backend's (for Docker an image with labels and
//! one tag per template tag), so ready templates survive a restart and every replica sees
//! them. A template created by `POST /v3/templates` whose build has not finished, and a
//! failed build's status and reason, are kept in this process only (`Records`, bounded):
//! after a restart, or on another replica, such a build is unknown (404).
//!
//! A template belongs to its tenant: every lookup is by the caller's tenant, and another
//! tenant's template answers 404 like one that does not exist.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json};
use sandbox_core::{
    BuiltTemplate, ErrorKind, ListFilter, SandboxState, TemplateBuildRequest, TemplateBuilds,
    TemplateId, TenantId, is_template_name, is_template_tag, narrow,
};
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::{ApiError, Caller, E2bApi, Inner, MAX_BODY_BYTES, meta};

/// The metadata key a sandbox booted from a built template carries: the template's ID, so a
/// delete can tell the template is in use.
pub const BUILT_TEMPLATE: &str = "sandbox.e2b.built_template";

/// The tag a name without one means.
pub const DEFAULT_TAG: &str = "default";

/// Templates with an unfinished or failed build this process remembers at most; past it the
/// oldest finished records are forgotten, and when none is finished a new template is 429.
const RECORDS_CAPACITY: usize = 4096;
/// Log lines a build's record keeps.
const MAX_LOGS: usize = 100;

pub(crate) fn routes() -> Router<E2bApi> {
    Router::new()
        .route("/v3/templates", post(request_build))
        .route("/v2/templates/{id}/builds/{build}", post(start_build))
        .route("/templates/{id}/builds/{build}/status", get(build_status))
        .route("/templates/{id}/files/{hash}", get(file_upload))
        .route("/templates/tags", post(assign_tags).delete(remove_tags))
        .route("/templates/{id}/tags", get(list_tags))
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates/{id}", get(get_one).delete(delete))
        .route("/v2/templates", get(list))
        .route("/templates", get(list))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Building => "building",
            Status::Ready => "ready",
            Status::Error => "error",
        }
    }
}

#[derive(Debug, Clone)]
struct LogLine {
    at: OffsetDateTime,
    level: &'static str,
    message: String,
}

#[derive(Debug, Clone)]
struct BuildRecord {
    build_id: String,
    tags: Vec<String>,
    status: Status,
    reason: Option<String>,
    logs: Vec<LogLine>,
    created_at: OffsetDateTime,
    updated_at: OffsetDateTime,
}

#[derive(Debug, Clone)]
struct TemplateRecord {
    name: String,
    created_at: OffsetDateTime,
    builds: Vec<BuildRecord>,
}

/// Templates whose builds this process started, by tenant and template ID (module docs).
#[derive(Debug, Default)]
pub(crate) struct Records {
    known: Mutex<HashMap<(TenantId, String), TemplateRecord>>,
}

impl Records {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(TenantId, String), TemplateRecord>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn find_by_name(&self, tenant: TenantId, name: &str) -> Option<String> {
        self.lock()
            .iter()
            .find(|((t, _), r)| *t == tenant && r.name == name)
            .map(|((_, id), _)| id.clone())
    }

    fn get(&self, tenant: TenantId, id: &str) -> Option<TemplateRecord> {
        self.lock().get(&(tenant, id.to_owned())).cloned()
    }

    /// Adds build `build` to template `id` (creating its record), within the bound.
    fn add(&self, tenant: TenantId, id: &str, name: &str, build: BuildRecord) -> bool {
        let mut known = self.lock();
        let key = (tenant, id.to_owned());
        if !known.contains_key(&key) && known.len() >= RECORDS_CAPACITY {
            let finished = |r: &TemplateRecord| {
                r.builds
                    .iter()
                    .all(|b| matches!(b.status, Status::Ready | Status::Error))
            };
            let oldest = known
                .iter()
                .filter(|(_, r)| finished(r))
                .min_by_key(|(_, r)| r.created_at)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    known.remove(&k);
                }
                None => return false,
            }
        }
        let record = known.entry(key).or_insert_with(|| TemplateRecord {
            name: name.to_owned(),
            created_at: build.created_at,
            builds: Vec::new(),
        });
        record.builds.push(build);
        true
    }

    fn update(&self, tenant: TenantId, id: &str, build_id: &str, f: impl FnOnce(&mut BuildRecord)) {
        let mut known = self.lock();
        if let Some(b) = known
            .get_mut(&(tenant, id.to_owned()))
            .and_then(|r| r.builds.iter_mut().find(|b| b.build_id == build_id))
        {
            f(b);
            b.updated_at = OffsetDateTime::now_utc();
        }
    }

    fn forget(&self, tenant: TenantId, id: &str) {
        self.lock().remove(&(tenant, id.to_owned()));
    }
}

fn log(build: &mut BuildRecord, level: &'static str, message: impl Into<String>) {
    if build.logs.len() < MAX_LOGS {
        build.logs.push(LogLine {
            at: OffsetDateTime::now_utc(),
            level,
            message: message.into(),
        });
    }
}

fn builds_port(inner: &Inner) -> Result<&dyn TemplateBuilds, ApiError> {
    narrow::template_builds(inner.provider.as_ref()).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this backend cannot build templates",
        )
    })
}

fn template_not_found(id: &str) -> ApiError {
    let shown: String = id.chars().take(128).collect();
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("template '{shown}' not found"),
    )
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

async fn json_body<T: for<'de> Deserialize<'de>>(request: Request) -> Result<T, ApiError> {
    let body = axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|e| ApiError::bad_request(format!("the request body could not be read: {e}")))?;
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid: {e}")))
}

/// `name[:tag]`, lower-cased, split; a namespace (`team/name`) is refused: templates here are
/// the tenant's own, with no team namespace.
fn split_reference(raw: &str) -> Result<(String, Option<String>), ApiError> {
    let lowered = raw.trim().to_ascii_lowercase();
    if lowered.contains('/') {
        return Err(ApiError::bad_request(
            "template names have no namespace here: name a template as name or name:tag",
        ));
    }
    let (name, tag) = match lowered.split_once(':') {
        Some((n, t)) => (n.to_owned(), Some(t.to_owned())),
        None => (lowered, None),
    };
    if !is_template_name(&name) {
        return Err(ApiError::bad_request(format!(
            "template name {:?} must be 1 to {} lower-case letters, digits, - and _",
            name.chars().take(64).collect::<String>(),
            sandbox_core::MAX_TEMPLATE_NAME
        )));
    }
    if let Some(t) = &tag {
        check_tag(t)?;
    }
    Ok((name, tag))
}

fn check_tag(tag: &str) -> Result<(), ApiError> {
    if is_template_tag(tag) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "tag {:?} must be 1 to {} lower-case letters, digits, -, _ and .",
            tag.chars().take(64).collect::<String>(),
            sandbox_core::MAX_TEMPLATE_WORD
        )))
    }
}

/// A random template ID: 20 lower-case letters and digits.
fn new_template_id() -> Result<String, ApiError> {
    let mut raw = [0u8; 20];
    getrandom::fill(&mut raw).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no randomness: {e}"),
        )
    })?;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    Ok(raw
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect())
}

/// A random build ID, a UUID (version 4) as the SDKs parse build IDs.
fn new_build_id() -> Result<String, ApiError> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no randomness: {e}"),
        )
    })?;
    raw[6] = (raw[6] & 0x0f) | 0x40;
    raw[8] = (raw[8] & 0x3f) | 0x80;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

/// One template of the tenant as the API shows it: the backend's finished builds merged with
/// this process's records.
#[derive(Debug, Clone)]
struct View {
    template_id: String,
    name: String,
    created_at: OffsetDateTime,
    /// Finished builds, from the backend.
    ready: Vec<BuiltTemplate>,
    /// This process's records (unfinished, failed, and recently finished builds).
    records: Vec<BuildRecord>,
}

impl View {
    fn latest_status(&self) -> Status {
        match self.records.iter().max_by_key(|b| b.updated_at) {
            Some(b) if b.status != Status::Ready => b.status,
            _ if !self.ready.is_empty() => Status::Ready,
            Some(b) => b.status,
            None => Status::Waiting,
        }
    }

    fn latest_build_id(&self) -> String {
        let newest_record = self.records.iter().max_by_key(|b| b.created_at);
        let newest_ready = self.ready.iter().max_by_key(|b| b.created_at);
        match (newest_record, newest_ready) {
            (Some(r), Some(b)) if b.created_at.is_some_and(|c| c > r.created_at) => {
                b.build_id.clone()
            }
            (Some(r), _) => r.build_id.clone(),
            (None, Some(b)) => b.build_id.clone(),
            (None, None) => String::new(),
        }
    }
}

async fn views(inner: &Inner, tenant: TenantId) -> Result<Vec<View>, ApiError> {
    let built = builds_port(inner)?.list_built_templates(tenant).await?;
    let mut out: Vec<View> = Vec::new();
    for b in built {
        match out.iter_mut().find(|v| v.template_id == b.template_id) {
            Some(v) => v.ready.push(b),
            None => out.push(View {
                template_id: b.template_id.clone(),
                name: b.name.clone(),
                created_at: b.created_at.unwrap_or_else(OffsetDateTime::now_utc),
                ready: vec![b],
                records: Vec::new(),
            }),
        }
    }
    let records: Vec<(String, TemplateRecord)> = inner
        .templates
        .lock()
        .iter()
        .filter(|((t, _), _)| *t == tenant)
        .map(|((_, id), r)| (id.clone(), r.clone()))
        .collect();
    for (id, r) in records {
        match out.iter_mut().find(|v| v.template_id == id) {
            Some(v) => v.records = r.builds,
            None => out.push(View {
                template_id: id,
                name: r.name,
                created_at: r.created_at,
                ready: Vec::new(),
                records: r.builds,
            }),
        }
    }
    Ok(out)
}

/// The tenant's template that `reference` (`id`, `name`, with or without `:tag`) names.
async fn view_of(
    inner: &Inner,
    tenant: TenantId,
    reference: &str,
) -> Result<(View, Option<String>), ApiError> {
    let (base, tag) = split_reference(reference).map_err(|_| template_not_found(reference))?;
    views(inner, tenant)
        .await?
        .into_iter()
        .find(|v| v.template_id == base || v.name == base)
        .map(|v| (v, tag))
        .ok_or_else(|| template_not_found(reference))
}

/// What a create naming `reference` boots for `tenant`, when it names one of the tenant's
/// ready templates: the backend's template, and the template's ID. `None` when no template
/// of the tenant has that ID or name (the caller answers 404).
pub(crate) async fn resolve(
    inner: &Inner,
    tenant: TenantId,
    reference: &str,
) -> Result<Option<(TemplateId, String)>, ApiError> {
    let Some(port) = narrow::template_builds(inner.provider.as_ref()) else {
        return Ok(None);
    };
    let Ok((base, tag)) = split_reference(reference) else {
        return Ok(None);
    };
    let tag = tag.unwrap_or_else(|| DEFAULT_TAG.to_owned());
    let built = port.list_built_templates(tenant).await?;
    Ok(built
        .into_iter()
        .find(|b| (b.template_id == base || b.name == base) && b.tags.contains(&tag))
        .map(|b| (b.template, b.template_id)))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BuildRequestV3 {
    name: Option<String>,
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(rename = "teamID")]
    #[allow(dead_code)] // Accepted and ignored: a tenant is its own team.
    team_id: Option<String>,
    #[serde(rename = "cpuCount")]
    #[allow(dead_code)] // Sizes are the backend's per-sandbox limits, not per template.
    cpu_count: Option<i64>,
    #[serde(rename = "memoryMB")]
    #[allow(dead_code)]
    memory_mb: Option<i64>,
    #[allow(dead_code)]
    min_free_disk_mb: Option<i64>,
}

async fn request_build(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    builds_port(inner)?;
    let body: BuildRequestV3 = json_body(request).await?;
    let raw = body
        .name
        .or(body.alias)
        .ok_or_else(|| ApiError::bad_request("name: a template build needs a name"))?;
    let (name, tag) = split_reference(&raw)?;
    let mut tags: Vec<String> = tag.into_iter().collect();
    for t in body.tags {
        let t = t.to_ascii_lowercase();
        check_tag(&t)?;
        if !tags.contains(&t) {
            tags.push(t);
        }
    }
    if tags.is_empty() {
        tags.push(DEFAULT_TAG.to_owned());
    }
    // A name the tenant already has is a new build of that template.
    let existing = match inner.templates.find_by_name(tenant, &name) {
        Some(id) => Some(id),
        None => builds_port(inner)?
            .list_built_templates(tenant)
            .await?
            .into_iter()
            .find(|b| b.name == name)
            .map(|b| b.template_id),
    };
    let template_id = match existing {
        Some(id) => id,
        None => new_template_id()?,
    };
    let build_id = new_build_id()?;
    let now = OffsetDateTime::now_utc();
    let record = BuildRecord {
        build_id: build_id.clone(),
        tags: tags.clone(),
        status: Status::Waiting,
        reason: None,
        logs: Vec::new(),
        created_at: now,
        updated_at: now,
    };
    if !inner.templates.add(tenant, &template_id, &name, record) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too many template builds are unfinished; wait for some to end",
        ));
    }
    tracing::info!(tenant = tenant.get(), template = %template_id, build = %build_id, name = %name, "e2b api: template build requested");
    let answer = json!({
        "templateID": template_id,
        "buildID": build_id,
        "public": false,
        "names": [name],
        "tags": tags,
        "aliases": [name],
    });
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

/// Whether `image` is one the operator lets builds start from (`e2b.build_images`; a
/// trailing `*` matches a prefix).
pub fn build_image_allowed(allowed: &[String], image: &str) -> bool {
    allowed.iter().any(|a| match a.strip_suffix('*') {
        Some(prefix) => image.starts_with(prefix),
        None => a == image,
    })
}

async fn start_build(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path((id, build)): Path<(String, String)>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    builds_port(inner)?;
    let body: Value = json_body(request).await?;
    let Some(record) = inner.templates.get(tenant, &id) else {
        return Err(template_not_found(&id));
    };
    let Some(wanted) = record.builds.iter().find(|b| b.build_id == build).cloned() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "build '{}' of template '{id}' not found",
                build.chars().take(64).collect::<String>()
            ),
        ));
    };
    if wanted.status != Status::Waiting {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("build '{build}' was already started"),
        ));
    }
    let source = check_build_start(&body, &inner.settings.build_images)?;
    inner.templates.update(tenant, &id, &build, |b| {
        b.status = Status::Building;
        log(b, "info", format!("Building from the local image {source}"));
    });
    let request = TemplateBuildRequest {
        tenant,
        template_id: id.clone(),
        build_id: build.clone(),
        name: record.name.clone(),
        tags: wanted.tags.clone(),
        source_image: source,
    };
    let api = api.clone();
    tokio::spawn(async move {
        let inner = &api.inner;
        let result = match builds_port(inner) {
            Ok(port) => port
                .build_template(&request)
                .await
                .map_err(|e| e.message().to_owned()),
            Err(e) => Err(e.message),
        };
        match result {
            Ok(_) => {
                tracing::info!(tenant = tenant.get(), template = %request.template_id, build = %request.build_id, "e2b api: template build ready");
                inner
                    .templates
                    .update(tenant, &request.template_id, &request.build_id, |b| {
                        b.status = Status::Ready;
                        log(b, "info", "Build finished");
                    });
            }
            Err(reason) => {
                tracing::info!(tenant = tenant.get(), template = %request.template_id, build = %request.build_id, reason = %reason, "e2b api: template build failed");
                inner
                    .templates
                    .update(tenant, &request.template_id, &request.build_id, |b| {
                        b.status = Status::Error;
                        log(b, "error", reason.clone());
                        b.reason = Some(reason);
                    });
            }
        }
    });
    Ok(StatusCode::ACCEPTED.into_response())
}

/// The source image a build start names, or 400 naming what cannot be honoured.
fn check_build_start(body: &Value, allowed: &[String]) -> Result<String, ApiError> {
    let Some(fields) = body.as_object() else {
        return Err(ApiError::bad_request(
            "the build start must be a JSON object",
        ));
    };
    for (key, value) in fields {
        let set = !value.is_null();
        match key.as_str() {
            "fromImage" | "force" => {}
            "steps" if value.as_array().is_none_or(Vec::is_empty) => {}
            "steps" => {
                return Err(ApiError::bad_request(
                    "steps: builds here take fromImage only, with no steps (RUN, COPY, ENV...); bake them into a local image",
                ));
            }
            "fromTemplate" | "fromImageRegistry" | "startCmd" | "readyCmd" if set => {
                return Err(ApiError::bad_request(format!(
                    "{key}: not supported; builds here take fromImage naming an image on the backend"
                )));
            }
            "fromTemplate" | "fromImageRegistry" | "startCmd" | "readyCmd" => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "{}: not a build field this server supports",
                    other.chars().take(64).collect::<String>()
                )));
            }
        }
    }
    let image = fields
        .get("fromImage")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            ApiError::bad_request(
                "fromImage: a build needs fromImage naming an image on the backend",
            )
        })?;
    if !build_image_allowed(allowed, image) {
        return Err(ApiError::bad_request(format!(
            "fromImage: {} is not an image this server builds from (e2b.build_images)",
            image.chars().take(128).collect::<String>()
        )));
    }
    Ok(image.to_owned())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusQuery {
    logs_offset: Option<usize>,
    limit: Option<usize>,
    #[allow(dead_code)] // Every line this service logs is shown, whatever the level asked.
    level: Option<String>,
}

async fn build_status(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path((id, build)): Path<(String, String)>,
    axum::extract::Query(query): axum::extract::Query<StatusQuery>,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let (view, _) = view_of(inner, tenant, &id).await?;
    let offset = query.logs_offset.unwrap_or(0);
    let limit = query.limit.unwrap_or(100).min(100);
    let (status, reason, logs) = match view.records.iter().find(|b| b.build_id == build) {
        Some(b) => (b.status, b.reason.clone(), b.logs.clone()),
        None if view.ready.iter().any(|b| b.build_id == build) => (Status::Ready, None, Vec::new()),
        None => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "build '{}' of template '{id}' not found",
                    build.chars().take(64).collect::<String>()
                ),
            ));
        }
    };
    let page: Vec<&LogLine> = logs.iter().skip(offset).take(limit).collect();
    let entries: Vec<Value> = page
        .iter()
        .map(|l| json!({"timestamp": rfc3339(l.at), "message": l.message, "level": l.level}))
        .collect();
    let mut answer = json!({
        "templateID": view.template_id,
        "buildID": build,
        "status": status.word(),
        "logs": page.iter().map(|l| l.message.clone()).collect::<Vec<_>>(),
        "logEntries": entries,
    });
    if let Some(message) = reason {
        answer["reason"] = json!({"message": message, "logEntries": []});
    }
    Ok(Json(answer).into_response())
}

/// Only `COPY` steps upload files, and builds here take no steps.
async fn file_upload(Path((_id, _hash)): Path<(String, String)>) -> ApiError {
    ApiError::bad_request(
        "COPY steps are not supported: builds here take fromImage only; bake files into a local image",
    )
}

fn template_json(inner: &Inner, v: &View) -> Value {
    let now = OffsetDateTime::now_utc();
    let updated = v
        .records
        .iter()
        .map(|b| b.updated_at)
        .chain(v.ready.iter().filter_map(|b| b.created_at))
        .max()
        .unwrap_or(now);
    let build_count = v.ready.len()
        + v.records
            .iter()
            .filter(|r| !v.ready.iter().any(|b| b.build_id == r.build_id))
            .count();
    json!({
        "templateID": v.template_id,
        "buildID": v.latest_build_id(),
        "cpuCount": inner.settings.cpu_count,
        "memoryMB": inner.settings.memory_mb,
        "diskSizeMB": inner.settings.disk_size_mb,
        "public": false,
        "aliases": [v.name],
        "names": [v.name],
        "createdAt": rfc3339(v.created_at),
        "updatedAt": rfc3339(updated),
        "createdBy": null,
        "lastSpawnedAt": null,
        "spawnCount": 0,
        "buildCount": build_count,
        "envdVersion": inner.known_envd_version().unwrap_or_default(),
        "buildStatus": v.latest_status().word(),
    })
}

async fn list(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let mut all = views(inner, tenant).await?;
    all.sort_by_key(|v| v.created_at);
    let items: Vec<Value> = all.iter().map(|v| template_json(inner, v)).collect();
    Ok(Json(items).into_response())
}

async fn get_one(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let (view, _) = view_of(inner, tenant, &id).await?;
    let mut answer = template_json(inner, &view);
    let mut builds: Vec<Value> = Vec::new();
    for b in &view.ready {
        let at = rfc3339(b.created_at.unwrap_or_else(OffsetDateTime::now_utc));
        builds.push(json!({
            "buildID": b.build_id, "status": "ready", "createdAt": at, "updatedAt": at,
            "finishedAt": at, "cpuCount": inner.settings.cpu_count,
            "memoryMB": inner.settings.memory_mb,
        }));
    }
    for r in view
        .records
        .iter()
        .filter(|r| !view.ready.iter().any(|b| b.build_id == r.build_id))
    {
        builds.push(json!({
            "buildID": r.build_id, "status": r.status.word(),
            "createdAt": rfc3339(r.created_at), "updatedAt": rfc3339(r.updated_at),
            "cpuCount": inner.settings.cpu_count, "memoryMB": inner.settings.memory_mb,
        }));
    }
    answer["builds"] = Value::Array(builds);
    Ok(Json(answer).into_response())
}

async fn alias(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(alias): Path<String>,
) -> Result<Response, ApiError> {
    // The operator's templates (`[e2b.templates]`) are every tenant's, ready as configured:
    // public templates, as a plane's own are. Their tag is the default one only.
    if let Ok((name, tag)) = split_reference(&alias)
        && tag.as_deref().is_none_or(|t| t == DEFAULT_TAG)
        && api.inner.settings.templates.contains_key(&name)
    {
        return Ok(Json(json!({"templateID": name, "public": true})).into_response());
    }
    // Names are per tenant: another tenant's is free for this one (404, never 403).
    let (view, _) = view_of(&api.inner, tenant, &alias).await?;
    if view.name != split_reference(&alias)?.0 {
        return Err(template_not_found(&alias));
    }
    Ok(Json(json!({"templateID": view.template_id, "public": false})).into_response())
}

async fn list_tags(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (view, _) = view_of(&api.inner, tenant, &id).await?;
    let mut tags: Vec<Value> = Vec::new();
    for b in &view.ready {
        let at = rfc3339(b.created_at.unwrap_or_else(OffsetDateTime::now_utc));
        for t in &b.tags {
            tags.push(json!({"tag": t, "buildID": b.build_id, "createdAt": at}));
        }
    }
    Ok(Json(tags).into_response())
}

#[derive(Debug, Deserialize)]
struct AssignTags {
    target: String,
    tags: Vec<String>,
}

async fn assign_tags(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let body: AssignTags = json_body(request).await?;
    let (view, tag) = view_of(inner, tenant, &body.target).await?;
    let tag = tag.unwrap_or_else(|| DEFAULT_TAG.to_owned());
    let Some(source) = view.ready.iter().find(|b| b.tags.contains(&tag)) else {
        return Err(template_not_found(&body.target));
    };
    let mut tags = Vec::new();
    for t in body.tags {
        let t = t.to_ascii_lowercase();
        check_tag(&t)?;
        tags.push(t);
    }
    if tags.is_empty() {
        return Err(ApiError::bad_request("tags: name at least one tag"));
    }
    builds_port(inner)?
        .tag_built_template(tenant, &view.template_id, &source.build_id, &tags)
        .await
        .map_err(|e| not_found_as_template(e, &body.target))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"tags": tags, "buildID": source.build_id})),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
struct RemoveTags {
    name: String,
    tags: Vec<String>,
}

async fn remove_tags(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let body: RemoveTags = json_body(request).await?;
    let (view, _) = view_of(inner, tenant, &body.name).await?;
    let mut tags = Vec::new();
    for t in body.tags {
        let t = t.to_ascii_lowercase();
        check_tag(&t)?;
        tags.push(t);
    }
    builds_port(inner)?
        .untag_built_template(tenant, &view.template_id, &tags)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn not_found_as_template(e: sandbox_core::Error, what: &str) -> ApiError {
    if e.kind() == ErrorKind::NotFound {
        template_not_found(what)
    } else {
        ApiError::from_core(e)
    }
}

async fn delete(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    // A snapshot is a template on this API, deleted by this route too.
    if let Some(deleted) = super::snapshots::delete_owned(inner, tenant, &id).await? {
        return Ok(deleted);
    }
    let (view, _) = view_of(inner, tenant, &id).await?;
    if let Some(sandbox) = in_use_by(inner, tenant, &view.template_id).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "template '{id}' is in use by sandbox {sandbox}; kill the sandboxes using it first"
            ),
        ));
    }
    builds_port(inner)?
        .delete_built_template(tenant, &view.template_id)
        .await?;
    inner.templates.forget(tenant, &view.template_id);
    tracing::info!(tenant = tenant.get(), template = %view.template_id, "e2b api: template deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A running or paused sandbox of the tenant booted from the template, if any.
async fn in_use_by(
    inner: &Inner,
    tenant: TenantId,
    template_id: &str,
) -> Result<Option<String>, ApiError> {
    let mut metadata = meta::api_filter();
    metadata.insert(meta::TENANT.to_owned(), tenant.get().to_string());
    metadata.insert(BUILT_TEMPLATE.to_owned(), template_id.to_owned());
    let filter = ListFilter {
        metadata,
        states: vec![
            SandboxState::Running,
            SandboxState::Paused,
            SandboxState::Transitioning,
        ],
    };
    let listed = inner.provider.list(&filter).await?;
    Ok(listed
        .into_iter()
        .find(|s| !matches!(s.state, SandboxState::Terminal))
        .map(|s| {
            s.metadata
                .get(meta::ID)
                .cloned()
                .unwrap_or_else(|| s.id.to_string())
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_images_match_exactly_or_by_prefix() {
        let allowed = vec!["sandbox-debian:*".to_owned(), "busybox:1".to_owned()];
        assert!(build_image_allowed(&allowed, "sandbox-debian:2b89ca47ae36"));
        assert!(build_image_allowed(&allowed, "busybox:1"));
        assert!(!build_image_allowed(&allowed, "busybox:12"));
        assert!(!build_image_allowed(&allowed, "ubuntu"));
        assert!(!build_image_allowed(&[], "busybox:1"));
    }

    #[test]
    fn build_starts_take_from_image_only() {
        let allowed = vec!["img:1".to_owned()];
        let ok = json!({"fromImage": "img:1", "steps": [], "force": false});
        assert_eq!(check_build_start(&ok, &allowed).unwrap(), "img:1");
        for (body, needle) in [
            (json!({"fromImage": "img:2"}), "e2b.build_images"),
            (json!({"fromTemplate": "base"}), "fromTemplate"),
            (
                json!({"fromImage": "img:1", "fromImageRegistry": {"type": "aws"}}),
                "fromImageRegistry",
            ),
            (
                json!({"fromImage": "img:1", "steps": [{"type": "RUN", "args": ["x"]}]}),
                "steps",
            ),
            (json!({"fromImage": "img:1", "startCmd": "x"}), "startCmd"),
            (json!({"fromImage": "img:1", "bogus": 1}), "bogus"),
            (json!({}), "fromImage"),
        ] {
            let err = check_build_start(&body, &allowed).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert!(err.message.contains(needle), "{body}: {}", err.message);
        }
    }

    #[test]
    fn references_split_and_ids_look_right() {
        assert_eq!(
            split_reference("My-Env:V1").unwrap(),
            ("my-env".to_owned(), Some("v1".to_owned()))
        );
        assert_eq!(split_reference("env").unwrap(), ("env".to_owned(), None));
        assert!(split_reference("team/env").is_err());
        assert!(split_reference("env:bad tag").is_err());
        let id = new_template_id().unwrap();
        assert!(
            sandbox_core::is_template_word(&id) && id.len() == 20,
            "{id}"
        );
        let build = new_build_id().unwrap();
        assert_eq!(build.len(), 36);
        assert!(sandbox_core::is_template_word(&build), "{build}");
    }
}
