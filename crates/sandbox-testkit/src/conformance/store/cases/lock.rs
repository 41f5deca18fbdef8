//! The lifecycle lock: exclusive per key across instances, parallel
//! across keys, cancel-safe, released by `release` and by drop.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sandbox_core::{BindingKey, BindingStore, LifecycleLock};

use super::super::StoreCtx;
use crate::conformance::{CaseResult, Failure, ensure, ensure_eq, within};

/// How long an acquire of a free lock may take. Generous: a shared store polls with jitter.
const FREE_LOCK: Duration = Duration::from_secs(10);

async fn acquire(
    store: &dyn BindingStore,
    key: &BindingKey,
    what: &str,
) -> Result<LifecycleLock, Failure> {
    within(FREE_LOCK, what, store.lock_lifecycle(key))
        .await?
        .map_err(|e| Failure(format!("{what}: {e}")))
}

async fn release(lock: LifecycleLock, what: &str) -> CaseResult {
    within(FREE_LOCK, what, lock.release())
        .await?
        .map_err(|e| Failure(format!("{what}: {e}")))
}

/// `[lock.exclusive]`: while the store holds a key, the peer's acquire waits, and gets the
/// lock once it is released; many holders hammering one key through both instances never
/// overlap.
pub(super) async fn lock_serializes_across_instances(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let held = acquire(ctx.store(), &key, "first acquire").await?;
    let waiter = {
        let peer = ctx.peer_arc();
        let key = key.clone();
        tokio::spawn(async move { peer.lock_lifecycle(&key).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    ensure(!waiter.is_finished(), || {
        "the peer acquired a key the store holds".to_owned()
    })?;
    release(held, "release").await?;
    let second = within(FREE_LOCK, "the waiting acquire", waiter)
        .await?
        .map_err(|e| Failure(format!("waiter task: {e}")))??;
    release(second, "release of the second holder").await?;

    // Many rounds through both instances: at most one holder inside at any time.
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let rounds = 5;
    let tasks: Vec<_> = (0..6)
        .map(|n| {
            let store = if n % 2 == 0 {
                ctx.store_arc()
            } else {
                ctx.peer_arc()
            };
            let key = key.clone();
            let inside = inside.clone();
            let overlaps = overlaps.clone();
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let lock = store
                        .lock_lifecycle(&key)
                        .await
                        .map_err(|e| format!("acquire: {e}"))?;
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lock.release().await.map_err(|e| format!("release: {e}"))?;
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    within(Duration::from_secs(120), "the contended rounds", async {
        for task in tasks {
            task.await
                .map_err(|e| Failure(format!("holder task: {e}")))?
                .map_err(Failure)?;
        }
        Ok::<(), Failure>(())
    })
    .await??;
    ensure_eq("overlapping holders", overlaps.load(Ordering::SeqCst), 0)
}

/// `[lock.exclusive]`: different keys never wait for each other — a key is acquirable while
/// another is held, and many holders of distinct keys can all hold at once (they meet at a
/// barrier while holding, which deadlocks a store-wide lock).
pub(super) async fn lock_different_keys_in_parallel(ctx: &StoreCtx) -> CaseResult {
    let a = ctx.key()?;
    let b = ctx.key_in(a.tenant)?;
    let held_a = acquire(ctx.store(), &a, "acquire of key A").await?;
    let held_b = acquire(ctx.peer(), &b, "acquire of key B while A is held").await?;
    release(held_b, "release of B").await?;
    release(held_a, "release of A").await?;

    let parties = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(parties));
    let mut tasks = Vec::new();
    for n in 0..parties {
        let store = if n % 2 == 0 {
            ctx.store_arc()
        } else {
            ctx.peer_arc()
        };
        let key = ctx.key_in(a.tenant)?;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let lock = store
                .lock_lifecycle(&key)
                .await
                .map_err(|e| format!("acquire: {e}"))?;
            barrier.wait().await;
            lock.release().await.map_err(|e| format!("release: {e}"))
        }));
    }
    within(
        Duration::from_secs(30),
        "16 holders of distinct keys meeting at a barrier",
        async {
            for task in tasks {
                task.await
                    .map_err(|e| Failure(format!("holder task: {e}")))?
                    .map_err(Failure)?;
            }
            Ok::<(), Failure>(())
        },
    )
    .await?
}

/// `[lock.cancel]`: an acquire dropped while waiting (by a timeout, or by aborting its task)
/// leaves nothing held: once the holder releases, the key is acquirable at once.
pub(super) async fn lock_cancelled_wait_leaves_nothing(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let held = acquire(ctx.store(), &key, "first acquire").await?;
    let gave_up =
        tokio::time::timeout(Duration::from_millis(150), ctx.peer().lock_lifecycle(&key)).await;
    ensure(gave_up.is_err(), || {
        "an acquire of a held key finished instead of waiting".to_owned()
    })?;
    let aborted = {
        let peer = ctx.peer_arc();
        let key = key.clone();
        tokio::spawn(async move { peer.lock_lifecycle(&key).await.map(drop) })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    aborted.abort();
    let joined = aborted.await;
    ensure(joined.as_ref().is_err_and(|e| e.is_cancelled()), || {
        format!("the aborted acquire was not cancelled while waiting: {joined:?}")
    })?;
    release(held, "release").await?;
    let next = acquire(ctx.peer(), &key, "acquire after the cancelled waits").await?;
    release(next, "release").await?;
    let again = acquire(ctx.store(), &key, "another acquire").await?;
    release(again, "release").await
}

/// `[lock.ownership]`, `[lock.exclusive]`: a held lock's ownership does not trip while held,
/// an explicit release succeeds and frees the key, and dropping a lock frees it too.
pub(super) async fn lock_release_and_drop_free_the_key(ctx: &StoreCtx) -> CaseResult {
    let key = ctx.key()?;
    let held = acquire(ctx.store(), &key, "acquire").await?;
    let token = held.ownership().clone();
    tokio::time::sleep(Duration::from_millis(100)).await;
    ensure(!token.is_lost(), || {
        format!("ownership tripped while held: {:?}", token.loss_reason())
    })?;
    held.ownership().check()?;
    release(held, "release").await?;

    let by_peer = acquire(ctx.peer(), &key, "acquire after release").await?;
    drop(by_peer);
    let after_drop = acquire(ctx.store(), &key, "acquire after a dropped lock").await?;
    release(after_drop, "release").await
}
