//! Setting, reading, replacing and removing deadlines; key independence and validation;
//! concurrency; durability across a reopen.

use sandbox_core::{ErrorCode, ErrorKind, MAX_DEADLINE_KEY_BYTES};
use time::{Duration as TimeDelta, OffsetDateTime};

use super::super::{DeadlineCtx, OP_LIMIT, expect_refusal, ms_ceil};
use super::due::{end_of_range, sorted};
use crate::conformance::{CaseResult, Failure, ensure, ensure_eq, within};

/// `[deadlines.set]`, `[deadlines.get]`, `[deadlines.replace]`: no deadline before a set; a set
/// reads back rounded up to the millisecond through every instance; a later and then an earlier
/// set each replace the one before, and `due` reports only the last.
pub(super) async fn set_get_replace(ctx: &DeadlineCtx) -> CaseResult {
    let key = ctx.key();
    for (which, store) in ctx.instances() {
        ensure_eq(
            &format!("deadline of a key never set, through the {which}"),
            ctx.get_on(store, &key).await?,
            None,
        )?;
    }
    let first = ctx.instant()?;
    let later = first + TimeDelta::milliseconds(ctx.number(1..86_400_000));
    let earlier = first - TimeDelta::milliseconds(ctx.number(86_400_000..2 * 86_400_000));
    for (step, at) in [("first", first), ("later", later), ("earlier", earlier)] {
        ctx.set(&key, at).await?;
        for (which, store) in ctx.instances() {
            ensure_eq(
                &format!("deadline after the {step} set, through the {which}"),
                ctx.get_on(store, &key).await?,
                Some(ms_ceil(at)),
            )?;
        }
    }
    ensure_eq(
        "due at the end of the range after three sets of one key",
        ctx.due_on(ctx.store(), end_of_range()?, 1_000).await?,
        vec![(key, ms_ceil(earlier))],
    )
}

/// `[deadlines.remove]`, `[deadlines.get]`: removing a key without a deadline is `Ok`; a removed
/// deadline reads as `None` everywhere, is not due, and removing it again is `Ok`; another key
/// is untouched.
pub(super) async fn remove_absent_is_ok(ctx: &DeadlineCtx) -> CaseResult {
    let never = ctx.key();
    ctx.track(&never);
    ctx.remove(&never).await?;
    ensure_eq(
        "deadline of a key removed without ever being set",
        ctx.get_on(ctx.store(), &never).await?,
        None,
    )?;
    let (gone, kept) = (ctx.key(), ctx.key());
    let (gone_at, kept_at) = (ctx.instant()?, ctx.instant()?);
    ctx.set(&gone, gone_at).await?;
    ctx.set(&kept, kept_at).await?;
    ctx.remove(&gone).await?;
    for (which, store) in ctx.instances() {
        ensure_eq(
            &format!("deadline of a removed key, through the {which}"),
            ctx.get_on(store, &gone).await?,
            None,
        )?;
        ensure_eq(
            &format!("deadline of the other key, through the {which}"),
            ctx.get_on(store, &kept).await?,
            Some(ms_ceil(kept_at)),
        )?;
    }
    ctx.remove(&gone).await?;
    ensure_eq(
        "due after a remove",
        ctx.due_on(ctx.store(), end_of_range()?, 1_000).await?,
        vec![(kept, ms_ceil(kept_at))],
    )
}

/// `[deadlines.keys]`: keys that differ only in case, by a suffix or as a prefix are separate;
/// setting, replacing and removing one leaves the others exactly as they were.
pub(super) async fn keys_are_independent(ctx: &DeadlineCtx) -> CaseResult {
    let base = ctx.key();
    let keys = [
        base.clone(),
        base.to_uppercase(),
        format!("{base}-1"),
        base[..10].to_owned(),
    ];
    let mut expected = Vec::new();
    for key in &keys {
        let at = ctx.instant()?;
        ctx.set(key, at).await?;
        expected.push((key.clone(), ms_ceil(at)));
    }
    let check = |what: &'static str, expected: Vec<(String, OffsetDateTime)>| async move {
        for (key, at) in &expected {
            ensure_eq(
                &format!("{what}: deadline of {key:?}"),
                ctx.get_on(ctx.store(), key).await?,
                Some(*at),
            )?;
        }
        ensure_eq(
            &format!("{what}: due at the end of the range"),
            ctx.due_on(ctx.store(), end_of_range()?, 1_000).await?,
            sorted(expected),
        )
    };
    check("after setting four keys", expected.clone()).await?;
    let replaced = ctx.instant()?;
    ctx.set(&keys[1], replaced).await?;
    expected[1].1 = ms_ceil(replaced);
    check("after replacing the upper-case key", expected.clone()).await?;
    ctx.remove(&keys[0]).await?;
    ensure_eq(
        "deadline of the removed key",
        ctx.get_on(ctx.store(), &keys[0]).await?,
        None,
    )?;
    expected.remove(0);
    check("after removing the base key", expected).await
}

/// How many tasks set their own key at once.
const CONCURRENT_TASKS: usize = 64;

/// `[deadlines.concurrent]`, `[deadlines.set]`: 64 tasks each set a distinct key at the same
/// time; every one lands with its own deadline (a store that rewrites a whole file or value per
/// set must not lose a concurrent writer's entry).
pub(super) async fn concurrent_sets_all_land(ctx: &DeadlineCtx) -> CaseResult {
    let mut expected = Vec::new();
    for _ in 0..CONCURRENT_TASKS {
        let (key, at) = (ctx.key(), ctx.instant()?);
        ctx.track(&key);
        expected.push((key, at));
    }
    let tasks: Vec<_> = expected
        .iter()
        .cloned()
        .map(|(key, at)| {
            let store = ctx.store_arc();
            tokio::spawn(async move { store.set_deadline(&key, at).await.map(|()| key) })
        })
        .collect();
    for task in tasks {
        let joined = within(OP_LIMIT, "a concurrent set", task).await?;
        joined
            .map_err(|e| Failure(format!("a concurrent set task failed: {e}")))?
            .map_err(|e| Failure(format!("a concurrent set_deadline: {e}")))?;
    }
    let expected: Vec<(String, OffsetDateTime)> = expected
        .into_iter()
        .map(|(k, at)| (k, ms_ceil(at)))
        .collect();
    for (which, store) in ctx.instances() {
        for (key, at) in &expected {
            ensure_eq(
                &format!("deadline of {key:?} set concurrently, through the {which}"),
                ctx.get_on(store, key).await?,
                Some(*at),
            )?;
        }
    }
    ensure_eq(
        "due after the concurrent sets",
        ctx.due_on(ctx.store(), end_of_range()?, 1_000).await?,
        sorted(expected),
    )
}

/// `[deadlines.key]`, `[deadlines.origin]`: a blank key, one with a line break, a NUL or an
/// escape, and one a byte over the bound are refused by every method with `invalid_request`
/// and code `invalid_deadline_key`, from the store; nothing is stored for any of them, and a
/// key exactly at the bound is kept.
pub(super) async fn invalid_keys_are_refused(ctx: &DeadlineCtx) -> CaseResult {
    let token = ctx.key();
    let bad = [
        String::new(),
        "   ".to_owned(),
        format!("{token}\nx"),
        format!("{token}\0"),
        format!("\u{1b}[31m{token}"),
        "k".repeat(MAX_DEADLINE_KEY_BYTES + 1),
    ];
    let at = ctx.instant()?;
    for key in &bad {
        let store = ctx.store();
        let kind = ErrorKind::InvalidRequest;
        let code = ErrorCode::InvalidDeadlineKey;
        let shown: String = key.chars().take(24).collect();
        expect_refusal(
            &format!("set_deadline {shown:?}"),
            within(OP_LIMIT, "set_deadline", store.set_deadline(key, at)).await?,
            kind,
            code,
        )?;
        expect_refusal(
            &format!("deadline {shown:?}"),
            within(OP_LIMIT, "deadline", store.deadline(key)).await?,
            kind,
            code,
        )?;
        expect_refusal(
            &format!("remove_deadline {shown:?}"),
            within(OP_LIMIT, "remove_deadline", store.remove_deadline(key)).await?,
            kind,
            code,
        )?;
    }
    ensure_eq(
        "due after only refused sets",
        ctx.due_on(ctx.store(), end_of_range()?, 1_000).await?,
        Vec::new(),
    )?;
    let longest = format!(
        "{token}{}",
        "k".repeat(MAX_DEADLINE_KEY_BYTES - token.len())
    );
    ctx.set(&longest, at).await?;
    ensure_eq(
        "deadline of a key exactly at the length bound",
        ctx.get_on(ctx.store(), &longest).await?,
        Some(ms_ceil(at)),
    )
}

/// `[deadlines.range]`, `[deadlines.origin]`: an instant before the Unix epoch, or a nanosecond
/// past the last storable millisecond, is refused with code `invalid_timeout` and stores
/// nothing (not even over an existing deadline).
pub(super) async fn out_of_range_instants_are_refused(ctx: &DeadlineCtx) -> CaseResult {
    let key = ctx.key();
    let kept = ctx.instant()?;
    ctx.set(&key, kept).await?;
    let before_epoch = OffsetDateTime::UNIX_EPOCH - TimeDelta::nanoseconds(1);
    let past_the_end = end_of_range()? + TimeDelta::nanoseconds(1);
    for at in [before_epoch, past_the_end] {
        expect_refusal(
            &format!("set_deadline at {at}"),
            within(OP_LIMIT, "set_deadline", ctx.store().set_deadline(&key, at)).await?,
            ErrorKind::InvalidRequest,
            ErrorCode::InvalidTimeout,
        )?;
        ensure_eq(
            &format!("deadline after a refused set at {at}"),
            ctx.get_on(ctx.store(), &key).await?,
            Some(ms_ceil(kept)),
        )?;
    }
    // The epoch itself is storable.
    let epoch_key = ctx.key();
    ctx.set(&epoch_key, OffsetDateTime::UNIX_EPOCH).await?;
    ensure_eq(
        "deadline at the epoch",
        ctx.get_on(ctx.store(), &epoch_key).await?,
        Some(OffsetDateTime::UNIX_EPOCH),
    )
}

/// `[deadlines.durable]`: after sets, a replace and a remove have returned, a store opened
/// afresh on the backing reads exactly the surviving deadlines, and answers `due` with them.
pub(super) async fn durable_across_reopen(ctx: &DeadlineCtx) -> CaseResult {
    let (kept, extended, removed) = (ctx.key(), ctx.key(), ctx.key());
    let kept_at = ctx.instant()?;
    let extended_at = ctx.instant()?;
    ctx.set(&kept, kept_at).await?;
    ctx.set(&extended, ctx.instant()?).await?;
    ctx.set(&extended, extended_at).await?;
    ctx.set(&removed, ctx.instant()?).await?;
    ctx.remove(&removed).await?;
    let reopened = ctx.reopen().await?;
    let expected = vec![
        (kept.clone(), ms_ceil(kept_at)),
        (extended.clone(), ms_ceil(extended_at)),
    ];
    for (key, at) in &expected {
        ensure_eq(
            &format!("deadline of {key:?} after a reopen"),
            ctx.get_on(&*reopened, key).await?,
            Some(*at),
        )?;
    }
    ensure_eq(
        "deadline of the removed key after a reopen",
        ctx.get_on(&*reopened, &removed).await?,
        None,
    )?;
    let due = ctx.due_on(&*reopened, end_of_range()?, 1_000).await?;
    ensure(due == sorted(expected.clone()), || {
        format!(
            "due after a reopen: got {due:?}, want {:?}",
            sorted(expected)
        )
    })
}
