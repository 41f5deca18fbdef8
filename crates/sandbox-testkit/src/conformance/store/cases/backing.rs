//! What only a store with a real backing can get wrong: corrupt stored values and an
//! unreachable backing. Both fail closed: an error, never
//! "unbound", because an unbound session gets a second sandbox.

use sandbox_core::{BindingKey, ErrorCode};

use super::super::{OP_LIMIT, StoreCtx, expect_code, expect_store_error};
use crate::conformance::{CaseResult, Failure, ensure, ensure_eq, within};

/// Plants a valid binding of `key` and reads it back, proving the hook writes where `get`
/// reads (so the refusals that follow are not vacuous), then deletes it through the port.
async fn plant_round_trip(ctx: &StoreCtx, key: &BindingKey) -> CaseResult {
    let good = ctx.binding(key)?;
    let json = serde_json::to_vec(&good).map_err(|e| Failure(format!("encode: {e}")))?;
    ctx.plant_raw(key, json).await?;
    ensure_eq(
        "a planted valid binding",
        ctx.get_on(ctx.store(), key).await?,
        Some(good.clone()),
    )?;
    let deleted = within(
        OP_LIMIT,
        "delete_if_match",
        ctx.store()
            .delete_if_match(key, good.provider, &good.sandbox_id),
    )
    .await??;
    ensure_eq("delete of the planted binding", deleted, true)
}

/// Ends a case that planted junk: overwrite it with a valid binding and delete that through
/// the port, so nothing corrupt outlives the case.
async fn scrub(ctx: &StoreCtx, key: &BindingKey) -> CaseResult {
    plant_round_trip(ctx, key).await
}

/// `[get.malformed]`: undecodable or invalid stored values are errors, never
/// "unbound", and create-if-absent does not replace them.
pub(super) async fn malformed_value_is_an_error(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    plant_round_trip(ctx, &key).await?;
    let valid =
        serde_json::to_string(&ctx.binding(&key)?).map_err(|e| Failure(format!("encode: {e}")))?;
    let junk: Vec<(&str, Vec<u8>)> = vec![
        (
            "truncated JSON",
            valid.as_bytes()[..valid.len() / 2].to_vec(),
        ),
        ("not JSON", b"not json at all".to_vec()),
        ("bytes that are not UTF-8", vec![0xff, 0xfe, 0x00, 0x7b]),
        ("a JSON array", b"[]".to_vec()),
        (
            "schema version 2",
            valid.replace("\"version\":1", "\"version\":2").into_bytes(),
        ),
        (
            "an unknown provider",
            valid
                .replacen("\"provider\":\"", "\"provider\":\"nope-", 1)
                .into_bytes(),
        ),
    ];
    for (what, bytes) in junk {
        ctx.plant_raw(&key, bytes).await?;
        let got = within(OP_LIMIT, "get", ctx.store().get(&key)).await?;
        expect_store_error(&format!("get of a stored value with {what}"), got)?;
        let replacement = ctx.binding(&key)?;
        let created = within(OP_LIMIT, "create", ctx.store().create(&key, &replacement)).await?;
        ensure(!matches!(created, Ok(true)), || {
            format!("create over a stored value with {what} replaced it")
        })?;
    }
    scrub(ctx, &key).await
}

/// `[get.malformed]`: a well-formed binding of another key stored under this one
/// is an error with code `invalid_binding`.
pub(super) async fn foreign_value_is_an_error(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    plant_round_trip(ctx, &key).await?;
    let others = [
        ctx.key_in(key.tenant)?,
        BindingKey {
            tenant: ctx.other_tenant(key.tenant)?,
            session: key.session.clone(),
        },
    ];
    for other in others {
        let foreign = ctx.binding(&other)?;
        let json = serde_json::to_vec(&foreign).map_err(|e| Failure(format!("encode: {e}")))?;
        ctx.plant_raw(&key, json).await?;
        let got = within(OP_LIMIT, "get", ctx.store().get(&key)).await?;
        expect_code(
            &format!("get of {other}'s binding stored under {key}"),
            got,
            ErrorCode::InvalidBinding,
        )?;
    }
    scrub(ctx, &key).await
}

/// `[lock.fail_closed]`: with the backing down, get, create, delete, the token
/// patch and the lifecycle lock all fail (no lock is granted, nothing reads as unbound), as do
/// the optional parts, each with a store error (`[errors.origin]`: an outage is what
/// `store_unavailable` is for); after it comes back nothing has changed.
pub(super) async fn outage_fails_closed(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let b = ctx.binding(&key)?;
    ctx.create(&key, &b).await?;
    let fresh = ctx.key()?;
    let fresh_binding = ctx.binding(&fresh)?;
    ctx.take_down().await?;
    let outcome = during_outage(ctx, &key, &b, &fresh, &fresh_binding).await;
    ctx.bring_up().await?;
    outcome?;
    ensure_eq(
        "binding after the outage",
        ctx.get_on(ctx.store(), &key).await?,
        Some(b),
    )?;
    ensure_eq(
        "key created during the outage",
        ctx.get_on(ctx.store(), &fresh).await?,
        None,
    )
}

async fn during_outage(
    ctx: &StoreCtx,
    key: &BindingKey,
    b: &sandbox_core::Binding,
    fresh: &BindingKey,
    fresh_binding: &sandbox_core::Binding,
) -> CaseResult {
    let s = ctx.store();
    let get = within(OP_LIMIT, "get", s.get(key)).await?;
    expect_store_error("get while down", get)?;
    let create = within(OP_LIMIT, "create", s.create(fresh, fresh_binding)).await?;
    if matches!(create, Ok(true)) {
        ctx.track(fresh.clone());
    }
    expect_store_error("create while down", create)?;
    let delete = within(
        OP_LIMIT,
        "delete_if_match",
        s.delete_if_match(key, b.provider, &b.sandbox_id),
    )
    .await?;
    expect_store_error("delete_if_match while down", delete)?;
    let patch = within(
        OP_LIMIT,
        "replace_traffic_token_if_match",
        s.replace_traffic_token_if_match(key, b, &ctx.secret()),
    )
    .await?;
    expect_store_error("token patch while down", patch)?;
    let lock = within(OP_LIMIT, "lock_lifecycle", s.lock_lifecycle(key)).await?;
    expect_store_error("lock_lifecycle while down", lock.map(drop))?;
    if let Some(turns) = s.turn_leases() {
        let begin = within(OP_LIMIT, "begin_turn", turns.begin_turn(key)).await?;
        expect_store_error("begin_turn while down", begin)?;
        let state = within(OP_LIMIT, "turn_state", turns.turn_state(key)).await?;
        expect_store_error("turn_state while down", state)?;
    }
    if let Some(rewinds) = s.rewind_locks() {
        let rewind = within(OP_LIMIT, "try_lock_rewind", rewinds.try_lock_rewind(key)).await?;
        expect_store_error("try_lock_rewind while down", rewind.map(drop))?;
    }
    if let Some(activities) = s.activities() {
        let list = within(OP_LIMIT, "list", activities.list(key)).await?;
        expect_store_error("activity list while down", list)?;
    }
    Ok(())
}
