//! Turn leases, the rewind lock, and the background-activity registry that feeds both.

use std::time::Duration;

use sandbox_core::{
    BindingKey, ErrorCode, ErrorKind, RewindLock, RewindLocks, TurnLeases, TurnState,
};

use super::super::{OP_LIMIT, StoreCtx, expect_code, expect_kind};
use crate::conformance::{CaseResult, Failure, ensure, ensure_eq, within};

const IDLE: TurnState = TurnState {
    active: false,
    may_rebuild: false,
};
const OPEN: TurnState = TurnState {
    active: true,
    may_rebuild: true,
};
const SPENT: TurnState = TurnState {
    active: true,
    may_rebuild: false,
};

/// A lease long enough never to lapse during a case.
const LONG_LEASE: Duration = Duration::from_secs(600);

async fn state(turns: &dyn TurnLeases, key: &BindingKey) -> Result<TurnState, Failure> {
    within(OP_LIMIT, "turn_state", turns.turn_state(key))
        .await?
        .map_err(|e| Failure(format!("turn_state: {e}")))
}

async fn expect_state(
    what: &str,
    turns: &dyn TurnLeases,
    key: &BindingKey,
    want: TurnState,
) -> CaseResult {
    ensure_eq(what, state(turns, key).await?, want)
}

async fn begin(turns: &dyn TurnLeases, key: &BindingKey) -> CaseResult {
    Ok(within(OP_LIMIT, "begin_turn", turns.begin_turn(key)).await??)
}

async fn end(turns: &dyn TurnLeases, key: &BindingKey) -> CaseResult {
    Ok(within(OP_LIMIT, "end_turn", turns.end_turn(key)).await??)
}

async fn consume(turns: &dyn TurnLeases, key: &BindingKey) -> CaseResult {
    Ok(within(
        OP_LIMIT,
        "consume_turn_rebuild",
        turns.consume_turn_rebuild(key),
    )
    .await??)
}

async fn lock_rewind(rewinds: &dyn RewindLocks, key: &BindingKey) -> Result<RewindLock, Failure> {
    within(OP_LIMIT, "try_lock_rewind", rewinds.try_lock_rewind(key))
        .await?
        .map_err(|e| Failure(format!("try_lock_rewind of a free session: {e}")))
}

async fn has_rewind(rewinds: &dyn RewindLocks, key: &BindingKey) -> Result<bool, Failure> {
    Ok(within(OP_LIMIT, "has_rewind_lock", rewinds.has_rewind_lock(key)).await??)
}

/// Waits (bounded) until `has_rewind_lock` reads `want`: a store whose drop-release needs I/O
/// spawns it, so it lands shortly after the drop.
async fn await_rewind(
    rewinds: &dyn RewindLocks,
    key: &BindingKey,
    want: bool,
    what: &str,
) -> CaseResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if has_rewind(rewinds, key).await? == want {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Failure(format!("{what}: has_rewind_lock stayed {}", !want)));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- turn leases ----------------------------------------------------------------------------

/// `[turn.lease]`: inactive initially; the first begin opens the turn with its rebuild; a nested
/// begin keeps it; consume spends it; the first end keeps the turn open; the last end closes
/// it; the next turn gets a rebuild again. Every step is read through the other instance.
pub(super) async fn turn_lease_lifecycle(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let (t, tp) = (ctx.turns(ctx.store())?, ctx.turns(ctx.peer())?);
    expect_state("initially", tp, &key, IDLE).await?;
    begin(t, &key).await?;
    expect_state("after the first begin", tp, &key, OPEN).await?;
    begin(tp, &key).await?;
    expect_state("after a nested begin", t, &key, OPEN).await?;
    consume(t, &key).await?;
    expect_state("after consume", tp, &key, SPENT).await?;
    begin(t, &key).await?;
    expect_state("after a third begin of a spent turn", tp, &key, SPENT).await?;
    end(tp, &key).await?;
    end(t, &key).await?;
    expect_state("after the second-to-last end", tp, &key, SPENT).await?;
    end(t, &key).await?;
    expect_state("after the last end", tp, &key, IDLE).await?;
    begin(tp, &key).await?;
    expect_state("the next turn", t, &key, OPEN).await?;
    end(t, &key).await?;
    expect_state("after the next turn", tp, &key, IDLE).await
}

/// `[turn.absent]`: consuming the rebuild of a session without a lease creates none — no turn
/// appears, the next begin still gets its rebuild, and a rewind is not refused as "turn
/// active".
pub(super) async fn turn_consume_without_lease_creates_none(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let t = ctx.turns(ctx.store())?;
    consume(t, &key).await?;
    expect_state("after consume without a lease", t, &key, IDLE).await?;
    if let Some(rewinds) = ctx.peer().rewind_locks() {
        let lock = lock_rewind(rewinds, &key).await?;
        within(OP_LIMIT, "rewind release", lock.release()).await??;
        await_rewind(rewinds, &key, false, "after release").await?;
    }
    begin(t, &key).await?;
    expect_state("begin after a stray consume", t, &key, OPEN).await?;
    end(t, &key).await?;
    expect_state("after end", t, &key, IDLE).await
}

/// `[turn.absent]`: an end without a lease is harmless — it neither errors nor leaves a count
/// behind that would swallow the next turn's begin.
pub(super) async fn turn_end_without_lease_is_harmless(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let t = ctx.turns(ctx.store())?;
    end(t, &key).await?;
    end(t, &key).await?;
    expect_state("after stray ends", t, &key, IDLE).await?;
    begin(t, &key).await?;
    expect_state("begin after stray ends", t, &key, OPEN).await?;
    end(t, &key).await?;
    expect_state("after one end", t, &key, IDLE).await
}

/// `[turn.expiry]`: the turn lease lives for its TTL after the last begin, state or consume
/// (each re-arms it) and then lapses, so a turn whose caller vanished stops blocking rebuilds.
pub(super) async fn turn_lease_expires_unless_rearmed(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let t = ctx.turns(ctx.store())?;
    let ttl = ctx.timing().turn_lease_ttl;
    begin(t, &key).await?;
    ctx.elapse(ttl * 3 / 5).await?;
    expect_state("before the TTL", t, &key, OPEN).await?;
    ctx.elapse(ttl * 3 / 5).await?;
    expect_state("past the first TTL, re-armed by turn_state", t, &key, OPEN).await?;
    consume(t, &key).await?;
    ctx.elapse(ttl * 3 / 5).await?;
    expect_state("re-armed by consume", t, &key, SPENT).await?;
    ctx.elapse(ttl + ttl / 2).await?;
    expect_state("a TTL after the last re-arm", t, &key, IDLE).await?;
    // The lapsed lease left no count behind.
    begin(t, &key).await?;
    expect_state("a new turn", t, &key, OPEN).await?;
    end(t, &key).await?;
    expect_state("after its end", t, &key, IDLE).await
}

// ---- rewind lock ----------------------------------------------------------------------------

/// `[rewind.exclusive]`: the rewind lock is exclusive across instances (`session_rewind_locked`), is
/// visible through `has_rewind_lock`, and is free again after `release` and after a drop.
pub(super) async fn rewind_lock_is_exclusive(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let (r, rp) = (ctx.rewinds(ctx.store())?, ctx.rewinds(ctx.peer())?);
    ensure_eq(
        "has_rewind_lock initially",
        has_rewind(rp, &key).await?,
        false,
    )?;
    let held = lock_rewind(r, &key).await?;
    for (which, rewinds) in [("peer", rp), ("store", r)] {
        let second = within(OP_LIMIT, "try_lock_rewind", rewinds.try_lock_rewind(&key)).await?;
        expect_kind(
            &format!("a second rewind lock through the {which}"),
            second.as_ref().map(drop).map_err(Clone::clone),
            ErrorKind::Conflict,
        )?;
        expect_code(
            &format!("a second rewind lock through the {which}"),
            second,
            ErrorCode::SessionRewindLocked,
        )?;
    }
    ensure_eq(
        "has_rewind_lock while held",
        has_rewind(rp, &key).await?,
        true,
    )?;
    within(OP_LIMIT, "release", held.release()).await??;
    await_rewind(rp, &key, false, "after release").await?;
    let by_peer = lock_rewind(rp, &key).await?;
    ensure_eq(
        "has_rewind_lock while the peer holds",
        has_rewind(r, &key).await?,
        true,
    )?;
    drop(by_peer);
    await_rewind(r, &key, false, "after a dropped rewind lock").await?;
    let again = lock_rewind(r, &key).await?;
    within(OP_LIMIT, "release", again.release()).await??;
    Ok(())
}

/// `[turn.rewind_locked]`: a held rewind lock refuses `begin_turn` with `session_rewind_locked`, and the
/// refused begin leaves no turn behind.
pub(super) async fn rewind_lock_blocks_begin_turn(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let r = ctx.rewinds(ctx.store())?;
    let tp = ctx.turns(ctx.peer())?;
    let held = lock_rewind(r, &key).await?;
    let refused = within(OP_LIMIT, "begin_turn", tp.begin_turn(&key)).await?;
    expect_code(
        "begin_turn while a rewind holds the session",
        refused,
        ErrorCode::SessionRewindLocked,
    )?;
    expect_state("after the refused begin", tp, &key, IDLE).await?;
    within(OP_LIMIT, "release", held.release()).await??;
    await_rewind(r, &key, false, "after release").await?;
    begin(tp, &key).await?;
    expect_state("begin after the rewind", tp, &key, OPEN).await?;
    end(tp, &key).await
}

/// `[rewind.refusals]`: a rewind is refused with `session_turn_active` while a turn is open (even a
/// spent one), and allowed once the last turn ended.
pub(super) async fn rewind_refused_while_turn_active(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let t = ctx.turns(ctx.store())?;
    let rp = ctx.rewinds(ctx.peer())?;
    begin(t, &key).await?;
    consume(t, &key).await?;
    let refused = within(OP_LIMIT, "try_lock_rewind", rp.try_lock_rewind(&key)).await?;
    expect_code(
        "try_lock_rewind while a turn is open",
        refused,
        ErrorCode::SessionTurnActive,
    )?;
    ensure_eq(
        "has_rewind_lock after the refusal",
        has_rewind(rp, &key).await?,
        false,
    )?;
    end(t, &key).await?;
    let held = lock_rewind(rp, &key).await?;
    within(OP_LIMIT, "release", held.release()).await??;
    Ok(())
}

/// `[rewind.kept_alive]`, renewed past its TTL: a held rewind lock does not lapse while held, however
/// long that is.
pub(super) async fn rewind_lock_outlives_its_ttl(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let (r, rp) = (ctx.rewinds(ctx.store())?, ctx.rewinds(ctx.peer())?);
    let ttl = ctx.timing().rewind_ttl;
    let held = lock_rewind(r, &key).await?;
    for step in 1..=4 {
        ctx.elapse(ttl * 3 / 4).await?;
        ensure_eq(
            &format!("has_rewind_lock after {step} × 3/4 of its TTL"),
            has_rewind(rp, &key).await?,
            true,
        )?;
    }
    let second = within(OP_LIMIT, "try_lock_rewind", rp.try_lock_rewind(&key)).await?;
    expect_code(
        "a second rewind lock past the TTL",
        second,
        ErrorCode::SessionRewindLocked,
    )?;
    within(OP_LIMIT, "release", held.release()).await??;
    await_rewind(rp, &key, false, "after release").await
}

/// `[rewind.kept_alive]`, renewal survives a transient error: a backing outage shorter than the
/// lease does not hand the session to a second rewinder.
pub(super) async fn rewind_lock_survives_an_outage(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let (r, rp) = (ctx.rewinds(ctx.store())?, ctx.rewinds(ctx.peer())?);
    let ttl = ctx.timing().rewind_ttl;
    let held = lock_rewind(r, &key).await?;
    ctx.take_down().await?;
    let slept = ctx.elapse(ttl / 2).await;
    ctx.bring_up().await?;
    slept?;
    // Long enough that the key would have lapsed had the renewer given up during the outage.
    ctx.elapse(ttl + ttl / 2).await?;
    ensure_eq(
        "has_rewind_lock after the outage",
        has_rewind(rp, &key).await?,
        true,
    )?;
    let second = within(OP_LIMIT, "try_lock_rewind", rp.try_lock_rewind(&key)).await?;
    expect_code(
        "a second rewind lock after the outage",
        second,
        ErrorCode::SessionRewindLocked,
    )?;
    within(OP_LIMIT, "release", held.release()).await??;
    await_rewind(rp, &key, false, "after release").await
}

// ---- activities -----------------------------------------------------------------------------

fn ids(list: &[sandbox_core::BackgroundActivity]) -> Vec<String> {
    let mut ids: Vec<String> = list.iter().map(|a| a.id.clone()).collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

/// The per-kind cap counts live activities of one kind only; re-adding a registered id renews
/// it instead of taking a second slot; a removed activity frees its slot.
pub(super) async fn activity_cap_per_kind(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let (a, ap) = (ctx.activities(ctx.store())?, ctx.activities(ctx.peer())?);
    let kind = format!("kind-{}", ctx.token());
    let other_kind = format!("kind-{}", ctx.token());
    let (one, two, three) = (
        ctx.activity(&kind)?,
        ctx.activity(&kind)?,
        ctx.activity(&kind)?,
    );
    let other = ctx.activity(&other_kind)?;
    within(OP_LIMIT, "add", a.add(&key, &one, LONG_LEASE, 2)).await??;
    within(OP_LIMIT, "add", ap.add(&key, &two, LONG_LEASE, 2)).await??;
    let over = within(OP_LIMIT, "add", a.add(&key, &three, LONG_LEASE, 2)).await?;
    expect_kind(
        "a third activity of a kind capped at 2",
        over,
        ErrorKind::Capacity,
    )?;
    within(OP_LIMIT, "add", a.add(&key, &other, LONG_LEASE, 2)).await??;
    within(OP_LIMIT, "re-add", ap.add(&key, &one, LONG_LEASE, 2)).await??;
    let listed = within(OP_LIMIT, "list", a.list(&key)).await??;
    ensure_eq(
        "live activities",
        ids(&listed),
        sorted(vec![one.id.clone(), two.id.clone(), other.id.clone()]),
    )?;
    within(OP_LIMIT, "remove", ap.remove(&key, &one.id)).await??;
    within(
        OP_LIMIT,
        "add after a remove",
        a.add(&key, &three, LONG_LEASE, 2),
    )
    .await??;
    let listed = within(OP_LIMIT, "list", ap.list(&key)).await??;
    ensure_eq(
        "live activities after remove and add",
        ids(&listed),
        sorted(vec![two.id.clone(), three.id.clone(), other.id.clone()]),
    )?;
    for activity in [&two, &three, &other] {
        within(OP_LIMIT, "remove", a.remove(&key, &activity.id)).await??;
    }
    Ok(())
}

/// Renew extends a registered activity and reports `false` for one that is gone; remove of an
/// absent activity succeeds; `list` returns what was added.
pub(super) async fn activity_renew_and_remove(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let (a, ap) = (ctx.activities(ctx.store())?, ctx.activities(ctx.peer())?);
    let job = ctx.activity(&format!("kind-{}", ctx.token()))?;
    within(OP_LIMIT, "add", a.add(&key, &job, LONG_LEASE, 1)).await??;
    let listed = within(OP_LIMIT, "list", ap.list(&key)).await??;
    ensure_eq("listed activity", listed, vec![job.clone()])?;
    let renewed = within(OP_LIMIT, "renew", ap.renew(&key, &job.id, LONG_LEASE)).await??;
    ensure_eq("renew of a live activity", renewed, true)?;
    within(OP_LIMIT, "remove", ap.remove(&key, &job.id)).await??;
    let renewed = within(OP_LIMIT, "renew", a.renew(&key, &job.id, LONG_LEASE)).await??;
    ensure_eq("renew of a removed activity", renewed, false)?;
    ensure_eq(
        "activities after remove",
        within(OP_LIMIT, "list", a.list(&key)).await??,
        Vec::new(),
    )?;
    within(OP_LIMIT, "remove again", a.remove(&key, &job.id)).await??;
    within(
        OP_LIMIT,
        "remove of an unknown id",
        a.remove(&key, &ctx.token()),
    )
    .await??;
    Ok(())
}

/// An activity lives for its lease after the last add or renew; an expired one is not listed,
/// cannot be renewed, and no longer counts against the cap.
pub(super) async fn activity_lease_expires(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let a = ctx.activities(ctx.store())?;
    let lease = Duration::from_millis(800);
    let kind = format!("kind-{}", ctx.token());
    let (job, next) = (ctx.activity(&kind)?, ctx.activity(&kind)?);
    within(OP_LIMIT, "add", a.add(&key, &job, lease, 1)).await??;
    ctx.elapse(lease / 2).await?;
    let renewed = within(OP_LIMIT, "renew", a.renew(&key, &job.id, lease)).await??;
    ensure_eq("renew within the lease", renewed, true)?;
    ctx.elapse(lease * 3 / 4).await?;
    ensure_eq(
        "listed after renew (past the first lease)",
        ids(&within(OP_LIMIT, "list", a.list(&key)).await??),
        vec![job.id.clone()],
    )?;
    ctx.elapse(lease).await?;
    ensure_eq(
        "listed after the lease lapsed",
        within(OP_LIMIT, "list", a.list(&key)).await??,
        Vec::new(),
    )?;
    let renewed = within(OP_LIMIT, "renew", a.renew(&key, &job.id, lease)).await??;
    ensure_eq("renew of a lapsed activity", renewed, false)?;
    within(
        OP_LIMIT,
        "add in the lapsed activity's slot",
        a.add(&key, &next, LONG_LEASE, 1),
    )
    .await??;
    within(OP_LIMIT, "remove", a.remove(&key, &next.id)).await??;
    Ok(())
}

/// Live background work counts as an open turn that may not rebuild, with or without a chat
/// turn; once it is gone the session is idle again.
pub(super) async fn live_activity_holds_the_turn(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let a = ctx.activities(ctx.store())?;
    let tp = ctx.turns(ctx.peer())?;
    let job = ctx.activity(&format!("kind-{}", ctx.token()))?;
    within(OP_LIMIT, "add", a.add(&key, &job, LONG_LEASE, 1)).await??;
    expect_state("with live work and no turn", tp, &key, SPENT).await?;
    begin(tp, &key).await?;
    expect_state("with live work and a turn", tp, &key, SPENT).await?;
    end(tp, &key).await?;
    expect_state("after the turn, work still live", tp, &key, SPENT).await?;
    within(OP_LIMIT, "remove", a.remove(&key, &job.id)).await??;
    expect_state("after the work ended", tp, &key, IDLE).await
}

/// Live background work refuses a rewind with `session_work_active`.
pub(super) async fn live_activity_refuses_rewind(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let a = ctx.activities(ctx.store())?;
    let rp = ctx.rewinds(ctx.peer())?;
    let job = ctx.activity(&format!("kind-{}", ctx.token()))?;
    within(OP_LIMIT, "add", a.add(&key, &job, LONG_LEASE, 1)).await??;
    let refused = within(OP_LIMIT, "try_lock_rewind", rp.try_lock_rewind(&key)).await?;
    expect_code(
        "try_lock_rewind with live background work",
        refused,
        ErrorCode::SessionWorkActive,
    )?;
    ensure(!has_rewind(rp, &key).await?, || {
        "a refused rewind left a lock behind".to_owned()
    })?;
    within(OP_LIMIT, "remove", a.remove(&key, &job.id)).await??;
    let held = lock_rewind(rp, &key).await?;
    within(OP_LIMIT, "release", held.release()).await??;
    Ok(())
}
