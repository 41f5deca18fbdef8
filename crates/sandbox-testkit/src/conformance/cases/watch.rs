//! Directory watches: armed on return, the recursive flag, and what may be watched. Changes
//! are made through the port's own file methods, so they are real changes on every backend.

use std::time::{Duration, Instant};

use sandbox_core::{
    ErrorCode, ErrorKind, SandboxPath, WatchEvent, WatchEventKind, WatchStream, narrow,
};

use super::super::{CaseResult, Ctx, Failure, ensure, expect_kind, within};
use super::scratch;

async fn watch(
    ctx: &Ctx,
    h: &sandbox_core::SandboxHandle,
    dir: &SandboxPath,
    recursive: bool,
) -> Result<WatchStream, Failure> {
    let w = narrow::watch(ctx.provider())
        .ok_or_else(|| Failure("watch declared but not callable".to_owned()))?;
    Ok(within(
        Duration::from_secs(60),
        "watch_dir",
        w.watch_dir(h, dir, recursive),
    )
    .await??)
}

/// Reads events until one for `path` with a kind in `kinds` arrives (30 s at most); returns
/// the events seen before it.
async fn expect_event(
    stream: &mut WatchStream,
    path: &SandboxPath,
    kinds: &[WatchEventKind],
) -> Result<Vec<WatchEvent>, Failure> {
    let mut before = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next_event()).await {
            Ok(Some(Ok(event))) if &event.path == path && kinds.contains(&event.kind) => {
                return Ok(before);
            }
            Ok(Some(Ok(event))) => before.push(event),
            Ok(Some(Err(e))) => return Err(Failure(format!("the watch failed: {e}"))),
            Ok(None) => {
                return Err(Failure(format!(
                    "the watch ended before {kinds:?} of {path}; saw {before:?}"
                )));
            }
            Err(_) => {
                return Err(Failure(format!(
                    "no {kinds:?} of {path} within 30s; saw {before:?}"
                )));
            }
        }
    }
}

/// Create, rewrite, rename and remove after the call returned are all reported.
pub(super) async fn watch_sees_changes_after_return(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let p = ctx.provider();
    let dir = scratch(ctx, "watched")?;
    p.make_dir(&h, &dir).await?;
    let mut events = watch(ctx, &h, &dir, false).await?;
    // No delay between the return and the change: the watch must already be armed.
    let file = dir.join(&format!("{}.txt", ctx.token()))?;
    p.write_file(&h, &file, &ctx.bytes(64)).await?;
    expect_event(&mut events, &file, &[WatchEventKind::Create]).await?;
    p.write_file(&h, &file, &ctx.bytes(128)).await?;
    expect_event(
        &mut events,
        &file,
        &[WatchEventKind::Write, WatchEventKind::Create],
    )
    .await?;
    let last = match narrow::streamed_files(p) {
        Some(s) => {
            let renamed = dir.join(&format!("{}.moved", ctx.token()))?;
            s.rename_path(&h, &file, &renamed).await?;
            expect_event(&mut events, &file, &[WatchEventKind::Rename]).await?;
            renamed
        }
        None => file,
    };
    p.remove(&h, &last).await?;
    expect_event(&mut events, &last, &[WatchEventKind::Remove]).await?;
    Ok(())
}

/// Without `recursive`, changes below a subdirectory are not reported; with it, they are.
pub(super) async fn watch_recursive_flag(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let p = ctx.provider();
    let dir = scratch(ctx, "tree")?;
    let sub = dir.join("sub")?;
    p.make_dir(&h, &sub).await?;
    let mut flat = watch(ctx, &h, &dir, false).await?;
    let mut deep = watch(ctx, &h, &dir, true).await?;
    let inner = sub.join(&format!("{}.txt", ctx.token()))?;
    p.write_file(&h, &inner, b"deep").await?;
    expect_event(&mut deep, &inner, &[WatchEventKind::Create]).await?;
    let top = dir.join(&format!("{}.txt", ctx.token()))?;
    p.write_file(&h, &top, b"top").await?;
    let before = expect_event(&mut flat, &top, &[WatchEventKind::Create]).await?;
    let leaked: Vec<&WatchEvent> = before
        .iter()
        .filter(|e| e.path.is_strictly_under(&sub))
        .collect();
    ensure(leaked.is_empty(), || {
        format!("a non-recursive watch reported changes below {sub}: {leaked:?}")
    })
}

/// A missing directory is `not_found`; a file is `not_a_directory`.
pub(super) async fn watch_needs_a_directory(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let missing = scratch(ctx, "absent")?;
    let w = narrow::watch(ctx.provider())
        .ok_or_else(|| Failure("watch declared but not callable".to_owned()))?;
    expect_kind(
        "watching a missing directory",
        w.watch_dir(&h, &missing, false).await.map(drop),
        ErrorKind::NotFound,
    )?;
    let file = scratch(ctx, "plain.txt")?;
    ctx.provider().write_file(&h, &file, b"x").await?;
    match w.watch_dir(&h, &file, false).await {
        Err(e)
            if e.kind() == ErrorKind::InvalidRequest
                && e.code() == Some(ErrorCode::NotADirectory) =>
        {
            Ok(())
        }
        Err(e) => Err(Failure(format!(
            "watching a file: expected not_a_directory, got {e}"
        ))),
        Ok(_) => Err(Failure("watching a file succeeded".to_owned())),
    }
}
