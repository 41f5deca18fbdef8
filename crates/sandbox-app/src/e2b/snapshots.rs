//! Snapshots of E2B sandboxes, over the port's `Snapshots` capability: the routes
//! `Sandbox.create_snapshot`, `Sandbox.list_snapshots` and `Sandbox.delete_snapshot` use.
//!
//! - `POST /sandboxes/{id}/snapshots` (body `{}` or `{"name": ...}`) snapshots one of the
//!   caller's live sandboxes: 201 with `SnapshotInfo` (`snapshotID`, `names`).
//! - `GET /snapshots` (`sandboxID`, `limit` 1–100, `nextToken`; `X-Next-Token`) lists the
//!   caller's snapshots, newest first.
//! - A snapshot is a template on this API: `DELETE /templates/{id}` deletes one
//!   (`delete_owned`, called by the templates' delete), and a create's `templateID` boots one
//!   (`resolve`).
//!
//! A snapshot is its tenant's: the backend records the tenant of the sandbox it was taken from
//! (the sandbox's ownership tenant, which every E2B sandbox carries: `meta::stamped`), every
//! route keeps only the caller's, and a restore names the caller's tenant so the backend checks
//! it again. Another tenant's snapshot answers as one that does not exist.
//!
//! The snapshot's ID is the backend's, as it is: opaque, unguessable, and what a create names.
//! A snapshot's `names` is that ID, then the name it was taken with, as given, when it was
//! given one: a name is kept and shown (a client of this API may record what it needs in it),
//! but a create looks snapshots up by ID only.

use axum::Router;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json};
use sandbox_core::{
    ListCursor, ListOrder, ListPage, SandboxId, SandboxState, SandboxSummary, SnapshotRef,
    Snapshots, TemplateId, TenantId, narrow,
};
use serde::{Deserialize, Serialize};

use super::{ApiError, Caller, E2bApi, Inner, is_gone};

/// The snapshot routes (authenticated by the layer [`super::router`] puts on them).
pub(crate) fn routes() -> Router<E2bApi> {
    Router::new()
        .route("/sandboxes/{id}/snapshots", post(create))
        .route("/snapshots", get(list))
}

/// The longest snapshot name a create takes.
const MAX_NAME: usize = 128;
/// The most a page may hold, and what a list without `limit` gets.
const MAX_PAGE: usize = 100;

/// `SnapshotInfo`, as the SDKs read it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

impl SnapshotInfo {
    fn of(snapshot: &SnapshotRef) -> Self {
        SnapshotInfo {
            snapshot_id: snapshot.id.as_str().to_owned(),
            names: std::iter::once(snapshot.id.as_str())
                .chain(snapshot.name.as_deref())
                .map(str::to_owned)
                .collect(),
        }
    }
}

/// The body of `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSnapshot {
    #[serde(default)]
    name: Option<String>,
}

fn port(inner: &Inner) -> Result<&dyn Snapshots, ApiError> {
    narrow::snapshots(inner.provider.as_ref()).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this server's backend cannot snapshot sandboxes",
        )
    })
}

/// The caller's snapshots (of one source sandbox, when given): the backend's listing, kept to
/// those whose recorded tenant is the caller.
async fn owned(
    port: &dyn Snapshots,
    tenant: TenantId,
    source: Option<&SandboxId>,
) -> Result<Vec<SnapshotRef>, ApiError> {
    Ok(port
        .list_snapshots(source)
        .await?
        .into_iter()
        .filter(|s| s.tenant == Some(tenant))
        .collect())
}

async fn create(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let port = port(inner)?;
    let body: NewSnapshot = super::control::optional_json(request).await?;
    let name = body.name.filter(|n| !n.is_empty());
    if let Some(name) = &name
        && (name.len() > MAX_NAME || name.chars().any(char::is_control))
    {
        return Err(ApiError::bad_request(format!(
            "name must be at most {MAX_NAME} bytes without control characters"
        )));
    }
    let (e2b_id, located, _) = super::control::live_owned(inner, tenant, &id).await?;
    let snapshot = match port
        .create_snapshot(&located.sandbox, name.as_deref())
        .await
    {
        Ok(snapshot) => snapshot,
        Err(e) if is_gone(&e) => {
            inner.index.forget(&e2b_id);
            return Err(ApiError::sandbox_not_found(&id));
        }
        Err(e) => return Err(e.into()),
    };
    tracing::info!(sandbox = %e2b_id, tenant = tenant.get(), snapshot = %snapshot.id, "e2b api: snapshot taken");
    Ok((StatusCode::CREATED, Json(SnapshotInfo::of(&snapshot))).into_response())
}

/// The query of `GET /snapshots`, read by hand so a parameter this server does not honour is
/// refused by name, never ignored.
#[derive(Debug, Default)]
struct ListQuery {
    sandbox_id: Option<String>,
    limit: Option<String>,
    next_token: Option<String>,
}

impl ListQuery {
    fn parse(raw: Option<&str>) -> Result<ListQuery, ApiError> {
        let mut out = ListQuery::default();
        for (key, value) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            let value = Some(value.into_owned());
            match key.as_ref() {
                "sandboxID" => out.sandbox_id = value,
                "limit" => out.limit = value,
                "nextToken" => out.next_token = value,
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

async fn list(
    State(api): State<E2bApi>,
    Extension(Caller(tenant)): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let inner = &api.inner;
    let port = port(inner)?;
    let query = ListQuery::parse(raw.as_deref())?;
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
    let cursor =
        match query.next_token.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(raw) => Some(ListCursor::parse(raw).map_err(|_| {
                ApiError::bad_request("nextToken is not a token this server issued")
            })?),
        };
    // The backend records the source by its own ID, so the filter is found through the
    // caller's sandbox. A sandbox that is not the caller's, or no longer lives, has no
    // snapshots this filter can find (its snapshots stay in the unfiltered listing).
    let source = match query.sandbox_id.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(id) => match inner.locate_owned(tenant, id).await {
            Ok((_, located)) => Some(located.sandbox),
            Err(e) if e.status == StatusCode::NOT_FOUND => {
                return Ok(Json(Vec::<SnapshotInfo>::new()).into_response());
            }
            Err(e) => return Err(e),
        },
    };
    let all = owned(port, tenant, source.as_ref()).await?;
    let page = ListPage {
        limit,
        cursor,
        order: ListOrder::NewestFirst,
    };
    let (items, next) = page_of(all, &page)?;
    let mut response = Json(items.iter().map(SnapshotInfo::of).collect::<Vec<_>>()).into_response();
    if let Some(next) = next
        && let Ok(value) = HeaderValue::from_str(next.as_str())
    {
        response.headers_mut().insert("x-next-token", value);
    }
    Ok(response)
}

/// One page of `snapshots`, by creation time then ID, with the cursor of the next: the same
/// paging (and cursor text) as the sandbox listings, so a token behaves the same on every
/// list route.
fn page_of(
    snapshots: Vec<SnapshotRef>,
    page: &ListPage,
) -> Result<(Vec<SnapshotRef>, Option<ListCursor>), ApiError> {
    let mut by_key = std::collections::HashMap::new();
    let mut keyed = Vec::with_capacity(snapshots.len());
    for snapshot in snapshots {
        let key = SandboxId::new(snapshot.id.as_str())?;
        keyed.push(SandboxSummary {
            id: key.clone(),
            template: None,
            state: SandboxState::Running,
            raw_state: String::new(),
            metadata: sandbox_core::Metadata::new(),
            started_at: snapshot.created_at,
            ended_at: None,
        });
        by_key.insert(key, snapshot);
    }
    let paged = page.apply(keyed).map_err(|e| {
        if e.code() == Some(sandbox_core::ErrorCode::InvalidCursor) {
            ApiError::bad_request("nextToken is not a token this server issued")
        } else {
            ApiError::from_core(e)
        }
    })?;
    let items = paged
        .items
        .iter()
        .filter_map(|s| by_key.remove(&s.id))
        .collect();
    Ok((items, paged.next))
}

/// The caller's snapshot `template` names, as a create boots it; `None` when it names none
/// (another tenant's included), or the backend takes no snapshots.
pub(crate) async fn resolve(
    inner: &Inner,
    tenant: TenantId,
    template: &str,
) -> Result<Option<TemplateId>, ApiError> {
    let Some(port) = narrow::snapshots(inner.provider.as_ref()) else {
        return Ok(None);
    };
    let found = owned(port, tenant, None)
        .await?
        .into_iter()
        .find(|s| s.id.as_str() == template);
    Ok(match found {
        Some(s) => Some(TemplateId::new(s.id.as_str())?),
        None => None,
    })
}

/// `DELETE /templates/{id}` when `id` is one of the caller's snapshots: 204 once deleted, and
/// the backend's refusal of one still in use (a conflict, 409) as it is. `None` when `id` is
/// none of the caller's snapshots, for the templates' delete to answer.
pub(crate) async fn delete_owned(
    inner: &Inner,
    tenant: TenantId,
    id: &str,
) -> Result<Option<Response>, ApiError> {
    let Some(port) = narrow::snapshots(inner.provider.as_ref()) else {
        return Ok(None);
    };
    let Some(snapshot) = owned(port, tenant, None)
        .await?
        .into_iter()
        .find(|s| s.id.as_str() == id)
    else {
        return Ok(None);
    };
    port.delete_snapshot(&snapshot.id).await?;
    tracing::info!(tenant = tenant.get(), snapshot = %snapshot.id, "e2b api: snapshot deleted");
    Ok(Some(StatusCode::NO_CONTENT.into_response()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::SnapshotId;
    use time::OffsetDateTime;

    fn snap(id: &str, at: i64) -> SnapshotRef {
        SnapshotRef {
            id: SnapshotId::new(id).unwrap(),
            name: None,
            source: None,
            created_at: OffsetDateTime::from_unix_timestamp(at).ok(),
            tenant: TenantId::new(1).ok(),
        }
    }

    #[test]
    fn snapshot_pages_are_newest_first_and_resume_after_the_token() {
        let all = vec![snap("repo:a", 1), snap("repo:c", 3), snap("repo:b", 2)];
        let first = ListPage {
            limit: 2,
            cursor: None,
            order: ListOrder::NewestFirst,
        };
        let (items, next) = page_of(all.clone(), &first).unwrap();
        let ids: Vec<&str> = items.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["repo:c", "repo:b"]);
        let second = ListPage {
            cursor: next,
            ..first
        };
        let (items, next) = page_of(all, &second).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].id.as_str(), "repo:a");
        assert!(next.is_none());
    }

    #[test]
    fn the_info_uses_the_sdks_field_names() {
        let json = serde_json::to_value(SnapshotInfo::of(&snap("repo:a", 1))).unwrap();
        assert_eq!(json["snapshotID"], "repo:a");
        assert_eq!(json["names"], serde_json::json!(["repo:a"]));
        assert!(ListQuery::parse(Some("sandboxID=i1&limit=2&nextToken=x")).is_ok());
        let refused = ListQuery::parse(Some("template=x")).unwrap_err();
        assert!(refused.message.contains("template"), "{}", refused.message);
    }
}
