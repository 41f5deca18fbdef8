//! Bindings: create-if-absent, identity, round-trip, compare-and-delete, tenant isolation and
//! the token patch.

use std::time::Duration;

use sandbox_core::{Binding, ConfigId, ErrorCode, ErrorKind, Secret};

use super::super::{OP_LIMIT, StoreCtx, expect_code, expect_kind};
use crate::conformance::{CaseResult, ensure_eq, within};

/// `[create.absent]`: the first create stores, a second one (even of another
/// sandbox, even from another instance) returns `false` and changes nothing, and the binding
/// does not expire.
pub(super) async fn create_if_absent(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    ensure_eq(
        "get before create",
        ctx.get_on(ctx.store(), &key).await?,
        None,
    )?;
    let first = ctx.binding(&key)?;
    ctx.create(&key, &first).await?;
    let second = ctx.binding(&key)?;
    for (which, store) in [("store", ctx.store()), ("peer", ctx.peer())] {
        let stored = within(OP_LIMIT, "second create", store.create(&key, &second)).await??;
        ensure_eq(&format!("second create through the {which}"), stored, false)?;
        ensure_eq(
            &format!("binding after a second create through the {which}"),
            ctx.get_on(ctx.peer(), &key).await?,
            Some(first.clone()),
        )?;
    }
    // No expiry: a day later (when the store's clock can be moved) it is still there.
    if ctx.target().advance_clock.is_some() {
        ctx.elapse(Duration::from_secs(24 * 3600)).await?;
        ensure_eq(
            "binding a day later",
            ctx.get_on(ctx.store(), &key).await?,
            Some(first),
        )?;
    }
    Ok(())
}

/// `[create.validate]`: a binding whose identity is another key's is refused with
/// `invalid_request` (code `invalid_binding`) and stored under neither key.
pub(super) async fn create_refuses_foreign_identity(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let other_session = ctx.key_in(key.tenant)?;
    let other_tenant = sandbox_core::BindingKey {
        tenant: ctx.other_tenant(key.tenant)?,
        session: key.session.clone(),
    };
    for foreign_key in [other_session, other_tenant] {
        let foreign = ctx.binding(&foreign_key)?;
        let result = within(OP_LIMIT, "create", ctx.store().create(&key, &foreign)).await?;
        if matches!(result, Ok(true)) {
            ctx.track(key.clone());
        }
        expect_kind(
            "create of another key's binding",
            result.clone(),
            ErrorKind::InvalidRequest,
        )?;
        expect_code(
            "create of another key's binding",
            result,
            ErrorCode::InvalidBinding,
        )?;
        ensure_eq("get of the key", ctx.get_on(ctx.store(), &key).await?, None)?;
        ensure_eq(
            "get of the binding's own key",
            ctx.get_on(ctx.store(), &foreign_key).await?,
            None,
        )?;
    }
    Ok(())
}

/// `[get.round_trip]`: every field round-trips exactly (nanosecond timestamps, config, stale mark,
/// token), through the other instance too; bindings without config or token are valid; an
/// empty token is not stored (it reads back as absent).
pub(super) async fn binding_round_trips(ctx: &StoreCtx) -> CaseResult {
    let full_key = ctx.key()?;
    let mut full = ctx.binding(&full_key)?;
    full.config_id = Some(ctx.config()?);
    full.stale_at = Some(ctx.instant()?);
    full.traffic_token = Some(ctx.secret());
    ctx.create(&full_key, &full).await?;
    ensure_eq(
        "full binding read back by the peer",
        ctx.get_on(ctx.peer(), &full_key).await?,
        Some(full),
    )?;

    let bare_key = ctx.key()?;
    let bare = ctx.binding(&bare_key)?;
    ctx.create_on(ctx.peer(), &bare_key, &bare).await?;
    ensure_eq(
        "binding without config or token",
        ctx.get_on(ctx.store(), &bare_key).await?,
        Some(bare),
    )?;

    let default_key = ctx.key()?;
    let mut default_config = ctx.binding(&default_key)?;
    default_config.config_id = Some(ConfigId::default_config());
    ctx.create(&default_key, &default_config).await?;
    ensure_eq(
        "binding of the default config (sentinel)",
        ctx.get_on(ctx.store(), &default_key).await?,
        Some(default_config),
    )?;

    let empty_key = ctx.key()?;
    let mut empty = ctx.binding(&empty_key)?;
    empty.traffic_token = Some(Secret::new(""));
    ctx.create(&empty_key, &empty).await?;
    let read = ctx.get_on(ctx.store(), &empty_key).await?;
    empty.traffic_token = None;
    ensure_eq("binding created with an empty token", read, Some(empty))
}

/// `[delete.match]`: compare-and-delete deletes only on an exact (provider, sandbox) match.
pub(super) async fn delete_if_match_exact(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let b = ctx.binding(&key)?;
    ctx.create(&key, &b).await?;
    let wrong_provider = ctx.other_provider(b.provider);
    let wrong_sandbox = ctx.sandbox_id()?;
    let attempts = [
        ("another provider", wrong_provider, b.sandbox_id.clone()),
        ("another sandbox", b.provider, wrong_sandbox.clone()),
        (
            "another provider and sandbox",
            wrong_provider,
            wrong_sandbox,
        ),
    ];
    for (what, provider, sandbox) in attempts {
        let deleted = within(
            OP_LIMIT,
            "delete_if_match",
            ctx.peer().delete_if_match(&key, provider, &sandbox),
        )
        .await??;
        ensure_eq(&format!("delete_if_match with {what}"), deleted, false)?;
        ensure_eq(
            &format!("binding after delete_if_match with {what}"),
            ctx.get_on(ctx.store(), &key).await?,
            Some(b.clone()),
        )?;
    }
    let deleted = within(
        OP_LIMIT,
        "delete_if_match",
        ctx.peer().delete_if_match(&key, b.provider, &b.sandbox_id),
    )
    .await??;
    ensure_eq("delete_if_match with the exact pair", deleted, true)?;
    ensure_eq(
        "binding after delete",
        ctx.get_on(ctx.store(), &key).await?,
        None,
    )?;
    let again = within(
        OP_LIMIT,
        "delete_if_match",
        ctx.store().delete_if_match(&key, b.provider, &b.sandbox_id),
    )
    .await??;
    ensure_eq("delete_if_match of an unbound key", again, false)
}

/// `[tenant.isolated]`: the same session ID under two tenants is two bindings; deleting one leaves the
/// other.
pub(super) async fn tenants_are_isolated(ctx: &StoreCtx) -> CaseResult {
    let a = ctx.key()?;
    let b = sandbox_core::BindingKey {
        tenant: ctx.other_tenant(a.tenant)?,
        session: a.session.clone(),
    };
    let ba = ctx.binding(&a)?;
    ctx.create(&a, &ba).await?;
    ensure_eq(
        "the other tenant's key before its create",
        ctx.get_on(ctx.store(), &b).await?,
        None,
    )?;
    let bb = ctx.binding(&b)?;
    ctx.create_on(ctx.peer(), &b, &bb).await?;
    ensure_eq(
        "tenant A's binding",
        ctx.get_on(ctx.store(), &a).await?,
        Some(ba.clone()),
    )?;
    ensure_eq(
        "tenant B's binding",
        ctx.get_on(ctx.store(), &b).await?,
        Some(bb.clone()),
    )?;
    let deleted = within(
        OP_LIMIT,
        "delete_if_match",
        ctx.store().delete_if_match(&b, bb.provider, &bb.sandbox_id),
    )
    .await??;
    ensure_eq("delete of tenant B's binding", deleted, true)?;
    ensure_eq(
        "tenant A's binding after tenant B's delete",
        ctx.get_on(ctx.peer(), &a).await?,
        Some(ba),
    )
}

/// `[token.patch]`: the patch writes the token and nothing else; the same token again, an empty
/// token, another sandbox, another provider or an unbound key change nothing and return
/// `false`.
pub(super) async fn token_patch_touches_only_the_token(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let mut b = ctx.binding(&key)?;
    b.config_id = Some(ctx.config()?);
    b.traffic_token = Some(ctx.secret());
    ctx.create(&key, &b).await?;
    let fresh = ctx.secret();
    let patched = within(
        OP_LIMIT,
        "replace_traffic_token_if_match",
        ctx.peer().replace_traffic_token_if_match(&key, &b, &fresh),
    )
    .await??;
    ensure_eq("patch with a new token", patched, true)?;
    let mut want = b.clone();
    want.traffic_token = Some(fresh.clone());
    ensure_eq(
        "binding after the patch",
        ctx.get_on(ctx.store(), &key).await?,
        Some(want.clone()),
    )?;

    let mut other_sandbox = b.clone();
    other_sandbox.sandbox_id = ctx.sandbox_id()?;
    let mut other_provider = b.clone();
    other_provider.provider = ctx.other_provider(b.provider);
    let refusals = [
        ("the stored token again", b.clone(), fresh.clone()),
        ("an empty token", b.clone(), Secret::new("")),
        ("another sandbox", other_sandbox, ctx.secret()),
        ("another provider", other_provider, ctx.secret()),
    ];
    for (what, expected, token) in refusals {
        let patched = within(
            OP_LIMIT,
            "replace_traffic_token_if_match",
            ctx.store()
                .replace_traffic_token_if_match(&key, &expected, &token),
        )
        .await??;
        ensure_eq(&format!("patch with {what}"), patched, false)?;
        ensure_eq(
            &format!("binding after a patch with {what}"),
            ctx.get_on(ctx.store(), &key).await?,
            Some(want.clone()),
        )?;
    }

    let unbound = ctx.key()?;
    let expected = ctx.binding(&unbound)?;
    let patched = within(
        OP_LIMIT,
        "replace_traffic_token_if_match",
        ctx.store()
            .replace_traffic_token_if_match(&unbound, &expected, &ctx.secret()),
    )
    .await??;
    ensure_eq("patch of an unbound key", patched, false)?;
    ensure_eq(
        "unbound key after a patch",
        ctx.get_on(ctx.store(), &unbound).await?,
        None,
    )
}

/// `[token.patch]`: a stale mark written after the caller read the binding survives the caller's
/// token patch (the patch must not write back the caller's stale copy).
pub(super) async fn token_patch_keeps_concurrent_stale_mark(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let config = ctx.config()?;
    let mut b = ctx.binding(&key)?;
    b.config_id = Some(config.clone());
    ctx.create(&key, &b).await?;
    // What the caller read: no stale mark yet.
    let read: Binding = ctx
        .get_on(ctx.store(), &key)
        .await?
        .ok_or_else(|| crate::conformance::Failure("binding vanished after create".to_owned()))?;
    // Meanwhile another replica invalidates the config.
    let report = within(
        OP_LIMIT,
        "invalidate_by_config",
        ctx.peer().invalidate_by_config(key.tenant, &config),
    )
    .await??;
    ensure_eq(
        "bindings marked by the concurrent invalidation",
        report.marked,
        1,
    )?;
    let marked = ctx
        .get_on(ctx.store(), &key)
        .await?
        .and_then(|b| b.stale_at)
        .ok_or_else(|| {
            crate::conformance::Failure("the invalidation set no stale_at".to_owned())
        })?;
    let token = ctx.secret();
    let patched = within(
        OP_LIMIT,
        "replace_traffic_token_if_match",
        ctx.store()
            .replace_traffic_token_if_match(&key, &read, &token),
    )
    .await??;
    ensure_eq("patch after a concurrent stale mark", patched, true)?;
    let mut want = b;
    want.stale_at = Some(marked);
    want.traffic_token = Some(token);
    ensure_eq(
        "binding after the patch (stale mark kept)",
        ctx.get_on(ctx.peer(), &key).await?,
        Some(want),
    )
}
