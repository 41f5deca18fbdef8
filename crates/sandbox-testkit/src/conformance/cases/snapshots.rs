//! Snapshots: a snapshot boots with the source's files, deletes idempotently, and restores only
//! for the tenant it was taken from.

use std::time::Duration;

use sandbox_core::{
    CreateRequest, ErrorCode, ErrorKind, ListFilter, TemplateId, narrow, owner_metadata,
};

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq, within};
use super::path;

pub(super) async fn snapshot_round_trip(ctx: &Ctx) -> CaseResult {
    let snapshots = narrow::snapshots(ctx.provider())
        .ok_or_else(|| Failure("snapshots declared but not callable".to_owned()))?;
    let h = ctx.create().await?;
    let file = path(&format!("/workspace/snapshot-{}.bin", ctx.token()))?;
    let content = ctx.bytes(ctx.int(1..=65536) as usize);
    ctx.provider().write_file(&h, &file, &content).await?;
    let snap = within(
        Duration::from_secs(180),
        "create_snapshot",
        snapshots.create_snapshot(h.id(), Some(&format!("conf-{}", ctx.token()))),
    )
    .await??;
    ctx.track_snapshot(snap.id.clone());
    let listed = snapshots.list_snapshots(Some(h.id())).await?;
    ensure(listed.iter().any(|s| s.id == snap.id), || {
        format!("list_snapshots does not show {}", snap.id)
    })?;
    let mut request: CreateRequest = ctx.create_request();
    request.template = TemplateId::new(snap.id.as_str())?;
    request.from_snapshot = true;
    let restored = ctx.create_with(request).await?;
    let back = ctx.provider().read_file(&restored, &file).await?;
    ensure(back == content, || {
        "the sandbox created from the snapshot lacks the file".to_owned()
    })?;
    ctx.provider().delete(restored.id()).await?;
    ctx.untrack(restored.id());
    snapshots
        .delete_snapshot(&snap.id)
        .await
        .map_err(|e| Failure(format!("delete snapshot: {e}")))?;
    snapshots
        .delete_snapshot(&snap.id)
        .await
        .map_err(|e| Failure(format!("second delete of a snapshot must succeed: {e}")))
}

/// Restores name only this tenant's snapshots: another tenant's, the standard template and an
/// invented name are one and the same `snapshot_not_found`, and none of them creates anything.
pub(super) async fn snapshot_restore_is_owner_only(ctx: &Ctx) -> CaseResult {
    let snapshots = narrow::snapshots(ctx.provider())
        .ok_or_else(|| Failure("snapshots declared but not callable".to_owned()))?;
    let (owner, other) = (ctx.int(1..=1_000_000), ctx.int(1_000_001..=2_000_000));
    let as_tenant = |tenant: u32, template: &str| -> Result<CreateRequest, Failure> {
        let mut request = ctx.create_request();
        request
            .metadata
            .insert(owner_metadata::TENANT.to_owned(), tenant.to_string());
        request.template = TemplateId::new(template)?;
        request.from_snapshot = true;
        Ok(request)
    };
    let mut source = ctx.create_request();
    source
        .metadata
        .insert(owner_metadata::TENANT.to_owned(), owner.to_string());
    let h = ctx.create_with(source).await?;
    let snap = within(
        Duration::from_secs(180),
        "create_snapshot",
        snapshots.create_snapshot(h.id(), Some(&format!("own-{}", ctx.token()))),
    )
    .await??;
    ctx.track_snapshot(snap.id.clone());
    let listed = snapshots.list_snapshots(Some(h.id())).await?;
    let tenant = listed
        .iter()
        .find(|s| s.id == snap.id)
        .and_then(|s| s.tenant);
    ensure_eq(
        "the listed snapshot's tenant",
        tenant.map(|t| t.get()),
        Some(u64::from(owner)),
    )?;
    let before = ctx
        .provider()
        .list(&ListFilter {
            metadata: ctx.metadata(),
            states: Vec::new(),
        })
        .await?
        .len();
    let mut bodies = Vec::new();
    for (what, request) in [
        (
            "another tenant's snapshot",
            as_tenant(other, snap.id.as_str())?,
        ),
        (
            "the standard template",
            as_tenant(owner, ctx.create_request().template.as_str())?,
        ),
        (
            "an invented snapshot",
            as_tenant(owner, &format!("{}-{}", snap.id.as_str(), ctx.token()))?,
        ),
    ] {
        match ctx.provider().create(request).await {
            Ok(handle) => {
                ctx.track(handle.id().clone());
                return Err(Failure(format!("restoring {what} created {}", handle.id())));
            }
            Err(e) => {
                ensure(
                    e.kind() == ErrorKind::NotFound
                        && e.code() == Some(ErrorCode::SnapshotNotFound),
                    || format!("restoring {what}: expected snapshot_not_found, got {e}"),
                )?;
                bodies.push(e.message().to_owned());
            }
        }
    }
    ensure(bodies.windows(2).all(|w| w[0] == w[1]), || {
        format!("the refusals differ, which tells a caller what exists: {bodies:?}")
    })?;
    let after = ctx
        .provider()
        .list(&ListFilter {
            metadata: ctx.metadata(),
            states: Vec::new(),
        })
        .await?
        .len();
    ensure_eq("sandboxes after the refused restores", after, before)?;
    let restored = ctx.create_with(as_tenant(owner, snap.id.as_str())?).await?;
    ctx.provider().delete(restored.id()).await?;
    ctx.untrack(restored.id());
    Ok(())
}
