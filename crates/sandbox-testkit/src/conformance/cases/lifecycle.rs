//! Health, create, get, list (and its pages) and delete: what every provider does, and the
//! refusals of a provider without `metadata`, `volumes` or `list`.

use std::time::Duration;

use sandbox_core::{
    ErrorCode, ErrorKind, ListCursor, ListFilter, ListOrder, ListPage, SandboxId, SandboxState,
    TemplateId, VolumeMount,
};

use super::super::{
    CaseResult, Ctx, Failure, NAMESPACE_KEY, ensure, ensure_eq, expect_kind, within,
};
use super::path;

pub(super) async fn health_ok(ctx: &Ctx) -> CaseResult {
    within(Duration::from_secs(60), "health", ctx.provider().health()).await??;
    Ok(())
}

pub(super) async fn create_then_get(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    ensure_eq("handle provider", h.provider(), ctx.provider().provider())?;
    let summary = ctx.provider().get(h.id()).await?;
    ensure_eq("summary id", &summary.id, h.id())?;
    ensure_eq("state after create", summary.state, SandboxState::Running)
}

pub(super) async fn metadata_round_trips(ctx: &Ctx) -> CaseResult {
    let token = ctx.token();
    let mut request = ctx.create_request();
    request
        .metadata
        .insert("sandbox_conformance_token".to_owned(), token.clone());
    let h = ctx.create_with(request.clone()).await?;
    let summary = ctx.provider().get(h.id()).await?;
    for (k, v) in &request.metadata {
        ensure_eq(
            &format!("get metadata[{k}]"),
            summary.metadata.get(k),
            Some(v),
        )?;
        ensure_eq(
            &format!("handle metadata[{k}]"),
            h.metadata().get(k),
            Some(v),
        )?;
    }
    Ok(())
}

pub(super) async fn list_filters_by_metadata_and_state(ctx: &Ctx) -> CaseResult {
    let (t1, t2) = (ctx.token(), ctx.token());
    let mut r1 = ctx.create_request();
    r1.metadata
        .insert("sandbox_conformance_token".to_owned(), t1.clone());
    let mut r2 = ctx.create_request();
    r2.metadata
        .insert("sandbox_conformance_token".to_owned(), t2);
    let a = ctx.create_with(r1).await?;
    let b = ctx.create_with(r2).await?;
    let p = ctx.provider();
    let ids = |list: Vec<sandbox_core::SandboxSummary>| {
        let mut ids: Vec<SandboxId> = list.into_iter().map(|s| s.id).collect();
        ids.sort();
        ids
    };
    let mut by_token = ListFilter::default();
    by_token
        .metadata
        .insert(NAMESPACE_KEY.to_owned(), ctx.namespace().to_owned());
    by_token
        .metadata
        .insert("sandbox_conformance_token".to_owned(), t1);
    ensure_eq(
        "list by metadata",
        ids(p.list(&by_token).await?),
        vec![a.id().clone()],
    )?;

    let mut by_ns = ListFilter::default();
    by_ns
        .metadata
        .insert(NAMESPACE_KEY.to_owned(), ctx.namespace().to_owned());
    let listed = ids(p.list(&by_ns).await?);
    ensure(listed.contains(a.id()) && listed.contains(b.id()), || {
        format!("list by namespace missed a sandbox: {listed:?}")
    })?;

    let running = ListFilter {
        states: vec![SandboxState::Running, SandboxState::Paused],
        ..by_token.clone()
    };
    ensure_eq(
        "list by metadata and live states",
        ids(p.list(&running).await?),
        vec![a.id().clone()],
    )?;
    let terminal = ListFilter {
        states: vec![SandboxState::Terminal],
        ..by_token
    };
    ensure_eq(
        "list by metadata and terminal state",
        ids(p.list(&terminal).await?),
        vec![],
    )
}

pub(super) async fn list_pages_through_a_filter(ctx: &Ctx) -> CaseResult {
    let token = ctx.token();
    let mut made = Vec::new();
    for _ in 0..3 {
        let mut request = ctx.create_request();
        request
            .metadata
            .insert("sandbox_conformance_token".to_owned(), token.clone());
        made.push(ctx.create_with(request).await?.id().clone());
    }
    made.sort();
    let mut filter = ListFilter::default();
    filter
        .metadata
        .insert(NAMESPACE_KEY.to_owned(), ctx.namespace().to_owned());
    filter
        .metadata
        .insert("sandbox_conformance_token".to_owned(), token);
    let p = ctx.provider();
    // Every page of the filter's listing in `order`, two at a time.
    let pages = |order: ListOrder| {
        let filter = filter.clone();
        async move {
            let mut page = ListPage {
                limit: 2,
                cursor: None,
                order,
            };
            let mut sizes = Vec::new();
            let mut ids = Vec::new();
            loop {
                let got = p.list_page(&filter, &page).await?;
                sizes.push(got.items.len());
                ids.extend(got.items.into_iter().map(|s| s.id));
                match got.next {
                    Some(next) if sizes.len() < 4 => page.cursor = Some(next),
                    Some(_) => {
                        return Err(Failure(format!(
                            "paging 3 sandboxes 2 at a time did not end: {sizes:?}"
                        )));
                    }
                    None => return Ok::<_, Failure>((sizes, ids)),
                }
            }
        }
    };
    let (sizes, newest) = pages(ListOrder::NewestFirst).await?;
    ensure_eq("page sizes, limit 2", sizes, vec![2, 1])?;
    let mut sorted = newest.clone();
    sorted.sort();
    ensure_eq("the pages' sandboxes, each once", sorted, made)?;
    let (_, mut oldest) = pages(ListOrder::OldestFirst).await?;
    oldest.reverse();
    ensure_eq(
        "oldest first is newest first reversed",
        oldest,
        newest.clone(),
    )?;
    // The first page's order is `list`'s order by start time then id.
    let mut listed: Vec<_> = p
        .list(&filter)
        .await?
        .into_iter()
        .map(|s| (s.started_at, s.id))
        .collect();
    listed.sort();
    listed.reverse();
    let listed: Vec<SandboxId> = listed.into_iter().map(|(_, id)| id).collect();
    ensure_eq("newest first is by start time then id", newest, listed)?;
    // A cursor the listing did not write.
    let forged = ListCursor::parse("c1deadbeef.0000000000000000");
    ensure(
        forged
            .as_ref()
            .is_err_and(|e| e.code() == Some(ErrorCode::InvalidCursor)),
        || format!("an invented cursor was not invalid_cursor: {forged:?}"),
    )
}

pub(super) async fn create_unknown_template_is_invalid_request(ctx: &Ctx) -> CaseResult {
    let template = TemplateId::new(format!("sandbox-conformance-missing-{}", ctx.token()))?;
    let mut request = ctx.create_request();
    request.template = template;
    let result = ctx.provider().create(request).await;
    if let Ok(h) = &result {
        ctx.track(h.id().clone());
    }
    expect_kind(
        "create from an unknown template",
        result,
        ErrorKind::InvalidRequest,
    )
}

pub(super) async fn create_with_volumes_is_unsupported(ctx: &Ctx) -> CaseResult {
    let mut request = ctx.create_request();
    request
        .volumes
        .push(VolumeMount::new("conformance-vol", path("/mnt/vol")?)?);
    let result = ctx.provider().create(request).await;
    if let Ok(h) = &result {
        ctx.track(h.id().clone());
    }
    expect_kind("create with volumes", result, ErrorKind::Unsupported)
}

pub(super) async fn create_with_metadata_is_unsupported(ctx: &Ctx) -> CaseResult {
    let mut request = ctx.create_request();
    request
        .metadata
        .insert(NAMESPACE_KEY.to_owned(), ctx.namespace().to_owned());
    let result = ctx.provider().create(request).await;
    if let Ok(h) = &result {
        ctx.track(h.id().clone());
    }
    expect_kind("create with metadata", result, ErrorKind::Unsupported)
}

pub(super) async fn list_is_unsupported(ctx: &Ctx) -> CaseResult {
    expect_kind(
        "list",
        ctx.provider().list(&ListFilter::default()).await,
        ErrorKind::Unsupported,
    )?;
    expect_kind(
        "list_page",
        ctx.provider()
            .list_page(&ListFilter::default(), &ListPage::first(2))
            .await,
        ErrorKind::Unsupported,
    )
}

pub(super) async fn delete_then_get_is_not_found(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    ctx.provider().delete(h.id()).await?;
    ctx.untrack(h.id());
    expect_kind(
        "get after delete",
        ctx.provider().get(h.id()).await,
        ErrorKind::NotFound,
    )?;
    expect_kind(
        "second delete",
        ctx.provider().delete(h.id()).await,
        ErrorKind::NotFound,
    )
}
