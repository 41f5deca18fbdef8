//! What is due: exactly the deadlines at or before the instant, earliest first, bounded by the
//! limit; far-future deadlines never.

use sandbox_core::MAX_DEADLINE_MILLIS;
use time::{Duration as TimeDelta, OffsetDateTime};

use super::super::{DeadlineCtx, ms_ceil};
use crate::conformance::{CaseResult, Failure, ensure_eq};

/// The last storable instant.
pub(super) fn end_of_range() -> Result<OffsetDateTime, Failure> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(MAX_DEADLINE_MILLIS) * 1_000_000)
        .map_err(|e| Failure(format!("the end of the deadline range: {e}")))
}

/// `entries` in `due`'s order: earliest first, equal deadlines by key.
pub(super) fn sorted(mut entries: Vec<(String, OffsetDateTime)>) -> Vec<(String, OffsetDateTime)> {
    entries.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    entries
}

/// `[deadlines.due]`: around a whole-millisecond `now`, with deadlines before it, two equal
/// ones, one exactly at it, one a millisecond after, one half a millisecond before (stored
/// rounded up to `now`, so due) and one a fraction after (stored a millisecond later, so not
/// due): `due` returns exactly the ones at or before `now`, earliest first and equal ones by
/// key, each with its stored deadline; a `now` a fraction of a millisecond later changes
/// nothing, one a nanosecond earlier drops the deadline at `now`; reading twice reads the same.
pub(super) async fn due_exactly_earliest_first(ctx: &DeadlineCtx) -> CaseResult {
    let now = ctx.whole_ms()?;
    let ms = TimeDelta::milliseconds;
    let mut past = Vec::new();
    for _ in 0..8 {
        past.push((ctx.key(), now - ms(ctx.number(1..3_600_000))));
    }
    let tie = now - ms(ctx.number(1..3_600_000));
    past.push((ctx.key(), tie));
    past.push((ctx.key(), tie));
    let at_now = (ctx.key(), now);
    let half_before = (ctx.key(), now - TimeDelta::microseconds(500));
    let after = (ctx.key(), now + ms(1));
    let fraction_after = (ctx.key(), now + TimeDelta::nanoseconds(1));
    let later = (ctx.key(), now + ms(ctx.number(2..3_600_000)));
    let all: Vec<(String, OffsetDateTime)> = past
        .iter()
        .cloned()
        .chain([
            at_now.clone(),
            half_before.clone(),
            after,
            fraction_after,
            later,
        ])
        .collect();
    for (key, at) in &all {
        ctx.set(key, *at).await?;
    }
    let mut expected: Vec<(String, OffsetDateTime)> = past;
    expected.push(at_now.clone());
    expected.push((half_before.0, ms_ceil(half_before.1)));
    let expected = sorted(expected);
    for (what, query) in [
        ("at now", now),
        ("again at now", now),
        (
            "a fraction of a millisecond after now",
            now + TimeDelta::microseconds(999),
        ),
    ] {
        ensure_eq(
            &format!("due {what}"),
            ctx.due_on(ctx.store(), query, 1_000).await?,
            expected.clone(),
        )?;
    }
    let before: Vec<(String, OffsetDateTime)> = expected
        .iter()
        .filter(|(_, at)| *at < now)
        .cloned()
        .collect();
    ensure_eq(
        "due a nanosecond before now",
        ctx.due_on(ctx.store(), now - TimeDelta::nanoseconds(1), 1_000)
            .await?,
        before,
    )?;
    for (which, store) in ctx.instances() {
        ensure_eq(
            &format!("due at the end of the range, through the {which}"),
            ctx.due_on(store, end_of_range()?, 1_000).await?,
            sorted(
                all.iter()
                    .map(|(k, at)| (k.clone(), ms_ceil(*at)))
                    .collect(),
            ),
        )?;
    }
    Ok(())
}

/// `[deadlines.due]`, `[deadlines.replace]`: with 20 due deadlines, `due` with limit 5 returns
/// the first five, limit 0 none, limit 20 and 100 all; moving one of the first five into the
/// future (a replace) lets the sixth in.
pub(super) async fn due_respects_limit(ctx: &DeadlineCtx) -> CaseResult {
    let now = ctx.instant()?;
    let mut entries = Vec::new();
    for _ in 0..20 {
        let (key, at) = (
            ctx.key(),
            now - TimeDelta::milliseconds(ctx.number(1..86_400_000)),
        );
        ctx.set(&key, at).await?;
        entries.push((key, ms_ceil(at)));
    }
    let entries = sorted(entries);
    for (limit, want) in [
        (5, &entries[..5]),
        (0, &entries[..0]),
        (1, &entries[..1]),
        (20, &entries[..]),
        (100, &entries[..]),
    ] {
        ensure_eq(
            &format!("due with limit {limit}"),
            ctx.due_on(ctx.store(), now, limit).await?,
            want.to_vec(),
        )?;
    }
    let moved = &entries[2].0;
    ctx.set(moved, now + TimeDelta::hours(1)).await?;
    let want: Vec<(String, OffsetDateTime)> = entries
        .iter()
        .filter(|(k, _)| k != moved)
        .take(5)
        .cloned()
        .collect();
    ensure_eq(
        "due with limit 5 after the third was moved past now",
        ctx.due_on(ctx.store(), now, 5).await?,
        want,
    )
}

/// `[deadlines.far]`: deadlines ten years ahead and at the very end of the range are not due
/// nine years ahead, read back exactly, and are due (in order) at the end of the range.
pub(super) async fn far_future_is_not_due(ctx: &DeadlineCtx) -> CaseResult {
    let now = ctx.whole_ms()?;
    let near = (ctx.key(), now - TimeDelta::seconds(1));
    let decade = (ctx.key(), now + TimeDelta::days(3_653));
    let end = (ctx.key(), end_of_range()?);
    for (key, at) in [&near, &decade, &end] {
        ctx.set(key, *at).await?;
        ensure_eq(
            &format!("deadline of {key:?}"),
            ctx.get_on(ctx.store(), key).await?,
            Some(*at),
        )?;
    }
    ensure_eq(
        "due nine years ahead",
        ctx.due_on(ctx.store(), now + TimeDelta::days(3_287), 1_000)
            .await?,
        vec![near.clone()],
    )?;
    ensure_eq(
        "due at the end of the range",
        ctx.due_on(ctx.store(), end_of_range()?, 1_000).await?,
        vec![near, decade, end],
    )
}
