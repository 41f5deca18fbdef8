//! Invalidate-by-config: what it marks, and how it waits for a held lifecycle lock.

use std::time::{Duration, Instant};

use sandbox_core::{Binding, BindingKey, ConfigId, InvalidationReport, TenantId};

use super::super::{OP_LIMIT, StoreCtx, expect_store_error};
use crate::conformance::{CaseResult, Failure, ensure, ensure_eq, within};

async fn invalidate(
    ctx: &StoreCtx,
    on_peer: bool,
    tenant: TenantId,
    config: &ConfigId,
) -> Result<InvalidationReport, Failure> {
    let store = if on_peer { ctx.peer() } else { ctx.store() };
    let limit = ctx.timing().invalidate_lock_wait * 4 + OP_LIMIT;
    within(
        limit,
        "invalidate_by_config",
        store.invalidate_by_config(tenant, config),
    )
    .await?
    .map_err(|e| Failure(format!("invalidate_by_config: {e}")))
}

fn failed_sessions(report: &InvalidationReport) -> Vec<String> {
    report
        .failed
        .iter()
        .map(|(s, e)| format!("{s}: {e}"))
        .collect()
}

/// A binding of `key` with `config`.
fn with_config(
    ctx: &StoreCtx,
    key: &BindingKey,
    config: Option<ConfigId>,
) -> Result<Binding, Failure> {
    let mut b = ctx.binding(key)?;
    b.config_id = config;
    Ok(b)
}

/// `[invalidate.marks]`: marks exactly the unmarked bindings of (tenant, config) — never another
/// config, the default config, a legacy binding without a config, another tenant's binding of
/// the same config and session ID, or an already-marked one — touches no other field, and does
/// not count a binding twice. The default config (the sentinel) is a config like any other:
/// invalidating it marks its bindings and still not the legacy ones.
pub(super) async fn invalidate_marks_only_tenant_and_config(ctx: &StoreCtx) -> CaseResult {
    let tenant = ctx.tenant()?;
    let other_tenant = ctx.other_tenant(tenant)?;
    let config = ctx.config()?;
    let other_config = ctx.config()?;
    let default = ConfigId::default_config();

    let targets = [ctx.key_in(tenant)?, ctx.key_in(tenant)?];
    let other_cfg = ctx.key_in(tenant)?;
    let legacy = ctx.key_in(tenant)?;
    let default_cfg = ctx.key_in(tenant)?;
    let pre_marked = ctx.key_in(tenant)?;
    let foreign = BindingKey {
        tenant: other_tenant,
        session: targets[0].session.clone(),
    };

    let mut originals = Vec::new();
    for key in &targets {
        originals.push((key.clone(), with_config(ctx, key, Some(config.clone()))?));
    }
    let untouched = [
        (
            other_cfg.clone(),
            with_config(ctx, &other_cfg, Some(other_config))?,
        ),
        (legacy.clone(), with_config(ctx, &legacy, None)?),
        (
            default_cfg.clone(),
            with_config(ctx, &default_cfg, Some(default.clone()))?,
        ),
        (
            foreign.clone(),
            with_config(ctx, &foreign, Some(config.clone()))?,
        ),
        (pre_marked.clone(), {
            let mut b = with_config(ctx, &pre_marked, Some(config.clone()))?;
            b.stale_at = Some(ctx.instant()?);
            b.traffic_token = Some(ctx.secret());
            b
        }),
    ];
    for (key, b) in originals.iter().chain(untouched.iter()) {
        ctx.create(key, b).await?;
    }

    let report = invalidate(ctx, false, tenant, &config).await?;
    ensure_eq("failed sessions", failed_sessions(&report), Vec::new())?;
    ensure_eq("bindings marked", report.marked, targets.len())?;
    let mut marks = Vec::new();
    for (key, original) in &originals {
        let read = ctx
            .get_on(ctx.peer(), key)
            .await?
            .ok_or_else(|| Failure(format!("invalidation deleted {key}")))?;
        let mark = read
            .stale_at
            .ok_or_else(|| Failure(format!("{key} of the invalidated config was not marked")))?;
        let mut unmarked = read;
        unmarked.stale_at = None;
        ensure_eq(
            &format!("other fields of the marked binding {key}"),
            &unmarked,
            original,
        )?;
        marks.push(mark);
    }
    for (key, original) in &untouched {
        ensure_eq(
            &format!("binding {key} outside (tenant, config) or already marked"),
            ctx.get_on(ctx.store(), key).await?,
            Some(original.clone()),
        )?;
    }

    // Again, through the other instance: nothing left to mark, and the marks stay as they were.
    let again = invalidate(ctx, true, tenant, &config).await?;
    ensure_eq(
        "failed sessions of the second run",
        failed_sessions(&again),
        Vec::new(),
    )?;
    ensure_eq("bindings marked by the second run", again.marked, 0)?;
    for ((key, _), mark) in originals.iter().zip(&marks) {
        let read = ctx.get_on(ctx.store(), key).await?.and_then(|b| b.stale_at);
        ensure_eq(
            &format!("mark of {key} after a second run"),
            read,
            Some(*mark),
        )?;
    }

    // The default config: its binding only, never the legacy one.
    let default_run = invalidate(ctx, false, tenant, &default).await?;
    ensure_eq(
        "bindings of the default config marked",
        default_run.marked,
        1,
    )?;
    let default_mark = ctx
        .get_on(ctx.store(), &default_cfg)
        .await?
        .and_then(|b| b.stale_at);
    ensure(default_mark.is_some(), || {
        "the default config's binding was not marked".to_owned()
    })?;
    ensure_eq(
        "legacy binding after invalidating the default config",
        ctx.get_on(ctx.store(), &legacy).await?,
        Some(untouched[1].1.clone()),
    )
}

/// `[invalidate.locked]`: a session whose lifecycle lock stays held longer than the wait cap is reported
/// in `failed` within a bounded time and left unmarked, and the run goes on to mark the others;
/// once the lock is free a later run marks it.
pub(super) async fn invalidate_reports_a_locked_session(ctx: &StoreCtx) -> CaseResult {
    let tenant = ctx.tenant()?;
    let config = ctx.config()?;
    let wait = ctx.timing().invalidate_lock_wait;
    let (locked, free) = (ctx.key_in(tenant)?, ctx.key_in(tenant)?);
    for key in [&locked, &free] {
        ctx.create(key, &with_config(ctx, key, Some(config.clone()))?)
            .await?;
    }
    let held = within(
        OP_LIMIT,
        "lock_lifecycle",
        ctx.peer().lock_lifecycle(&locked),
    )
    .await??;
    let started = Instant::now();
    let report = invalidate(ctx, false, tenant, &config).await?;
    let took = started.elapsed();
    let bound = wait + Duration::from_secs(10);
    ensure(took <= bound, || {
        format!(
            "invalidation with one locked session took {} ms; the wait cap is {} ms",
            took.as_millis(),
            wait.as_millis()
        )
    })?;
    let failed: Vec<String> = report.failed.iter().map(|(s, _)| s.to_string()).collect();
    ensure_eq("failed sessions", failed, vec![locked.session.to_string()])?;
    for (session, e) in &report.failed {
        expect_store_error(
            &format!("the failure reported for session {session}"),
            Err::<(), _>(e.clone()),
        )?;
    }
    ensure_eq("bindings marked besides the locked one", report.marked, 1)?;
    ensure_eq(
        "stale mark of the locked session",
        ctx.get_on(ctx.store(), &locked)
            .await?
            .and_then(|b| b.stale_at),
        None,
    )?;
    ensure(
        ctx.get_on(ctx.store(), &free)
            .await?
            .and_then(|b| b.stale_at)
            .is_some(),
        || "the unlocked session was not marked".to_owned(),
    )?;
    within(OP_LIMIT, "release", held.release()).await??;
    let later = invalidate(ctx, true, tenant, &config).await?;
    ensure_eq(
        "failed sessions after release",
        failed_sessions(&later),
        Vec::new(),
    )?;
    ensure_eq("bindings marked after release", later.marked, 1)
}

/// `[invalidate.locked]`: the invalidation really waits for a held lock (up to the cap) rather than
/// giving up at once, and the mark after that wait still lands — it has its own budget, not
/// the wait's leftover.
pub(super) async fn invalidate_waits_for_a_briefly_held_lock(ctx: &StoreCtx) -> CaseResult {
    let tenant = ctx.tenant()?;
    let config = ctx.config()?;
    let wait = ctx.timing().invalidate_lock_wait;
    let key = ctx.key_in(tenant)?;
    ctx.create(&key, &with_config(ctx, &key, Some(config.clone()))?)
        .await?;
    let held = within(OP_LIMIT, "lock_lifecycle", ctx.peer().lock_lifecycle(&key)).await??;
    let hold_for = wait / 4;
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(hold_for).await;
        held.release().await
    });
    let report = invalidate(ctx, false, tenant, &config).await?;
    within(OP_LIMIT, "the releasing task", releaser)
        .await?
        .map_err(|e| Failure(format!("releasing task: {e}")))??;
    ensure_eq("failed sessions", failed_sessions(&report), Vec::new())?;
    ensure_eq("bindings marked after the lock came free", report.marked, 1)?;
    ensure(
        ctx.get_on(ctx.store(), &key)
            .await?
            .and_then(|b| b.stale_at)
            .is_some(),
        || "the briefly locked session was not marked".to_owned(),
    )
}
