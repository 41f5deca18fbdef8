//! The lifecycle lock and the rewind lock: random tokens under leases that a background task
//! renews at a third of the lease, and compare-and-delete release.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    BindingKey, Error, ErrorCode, LifecycleLock, LockRelease, Operation, OwnershipSource,
    OwnershipToken, RewindLock,
};
use tokio::task::JoinHandle;

use crate::keys::SessionKeys;
use crate::{Inner, millis, set_nx_px, stored};

/// The acquire loop's sleep between attempts: 25–74 ms, jittered so waiting replicas do not
/// retry in lockstep.
const RETRY_MIN_MS: u64 = 25;
const RETRY_SPREAD_MS: u64 = 50;

/// How long a release may take once the holder is done.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// 16 random bytes from the OS, hex: a holder's proof of ownership.
fn token() -> Result<String, Error> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| {
        stored(Error::internal(
            Operation::new("lock_lifecycle"),
            format!("no randomness for a lock token: {e}"),
        ))
    })?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// Waits for the session's lifecycle lock. The caller's deadline is the future itself. A Redis
/// error ends the wait with that error: no lock is ever granted without Redis.
pub(crate) async fn acquire(
    inner: Arc<Inner>,
    lock_key: String,
    key: &BindingKey,
) -> Result<LifecycleLock, Error> {
    let operation = Operation::new("lock_lifecycle");
    let token = token()?;
    let lease = inner.config.lock_lease;
    // If this future is dropped between a successful SET and the guard below, the lease
    // bounds how long the orphan lock lives.
    while !set_nx_px(&inner.client, operation, &lock_key, &token, lease).await? {
        let pause = RETRY_MIN_MS + fastrand::u64(..RETRY_SPREAD_MS);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    let (source, ownership) = OwnershipToken::new_pair();
    let renewer = tokio::spawn(renew_lifecycle(
        inner.clone(),
        lock_key.clone(),
        token.clone(),
        source.clone(),
        key.to_string(),
    ));
    let lock = LifecycleLock::new(
        ownership,
        Box::new(LifecycleRelease {
            held: Some(Held {
                inner,
                lock_key,
                token,
                renewer,
            }),
            source,
        }),
    );
    #[cfg(feature = "failpoints")]
    crate::failpoints::lock_held(key).await;
    Ok(lock)
}

/// Renews the lease at a third of it; a refused or failed renewal trips ownership (another
/// replica may take the lock once the lease runs out, so the holder must stop acting).
async fn renew_lifecycle(
    inner: Arc<Inner>,
    lock_key: String,
    token: String,
    source: OwnershipSource,
    session: String,
) {
    let lease = inner.config.lock_lease;
    let every = lease / 3;
    loop {
        tokio::time::sleep(every).await;
        let renewed: Result<i64, Error> = inner
            .eval(
                Operation::new("renew_lifecycle_lock"),
                &inner.scripts.renew,
                vec![lock_key.clone()],
                vec![token.clone().into_bytes(), millis(lease)],
            )
            .await;
        match renewed {
            Ok(1) => {}
            Ok(_) => {
                tracing::warn!(session, "lifecycle lock lost: the key expired or was taken");
                source.trip("the lock's lease ran out or another holder took it");
                return;
            }
            Err(e) => {
                tracing::warn!(session, error = %e, "lifecycle lock renewal failed");
                source.trip(&format!("renewing the lease failed: {e}"));
                return;
            }
        }
    }
}

struct Held {
    inner: Arc<Inner>,
    lock_key: String,
    token: String,
    renewer: JoinHandle<()>,
}

impl Held {
    /// Stops renewing and deletes the key if it still holds our token; whether it did.
    async fn release(self, operation: Operation) -> Result<bool, Error> {
        self.renewer.abort();
        let released = tokio::time::timeout(
            RELEASE_TIMEOUT,
            self.inner.eval::<i64>(
                operation,
                &self.inner.scripts.release,
                vec![self.lock_key.clone()],
                vec![self.token.clone().into_bytes()],
            ),
        )
        .await
        .unwrap_or_else(|_| {
            Err(stored(Error::timeout(
                operation,
                "releasing the lock did not finish in time",
            )))
        })?;
        Ok(released == 1)
    }

    /// Release from `Drop`: on the runtime, in the background; the lease is the fallback.
    fn release_in_background(self, operation: Operation) {
        self.renewer.abort();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = self.release(operation).await {
                    tracing::warn!(error = %e, "releasing a dropped lock failed; its lease will expire");
                }
            });
        }
    }
}

struct LifecycleRelease {
    held: Option<Held>,
    source: OwnershipSource,
}

#[async_trait]
impl LockRelease for LifecycleRelease {
    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let operation = Operation::new("release_lifecycle_lock");
        if held.release(operation).await? {
            return Ok(());
        }
        // The key no longer held our token: someone else may have acted meanwhile.
        let reason = "the lock was gone or held by another at release";
        self.source.trip(reason);
        Err(sandbox_core::ownership::ownership_lost(reason))
    }
}

impl Drop for LifecycleRelease {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.release_in_background(Operation::new("release_lifecycle_lock"));
        }
    }
}

/// Takes the rewind lock, refusing while a turn is open, background work is live or another
/// rewind holds it; a keeper renews it, re-acquiring with the same token after a lapse.
pub(crate) async fn lock_rewind(
    inner: Arc<Inner>,
    keys: SessionKeys,
    key: &BindingKey,
) -> Result<RewindLock, Error> {
    let operation = Operation::new("try_lock_rewind");
    let token = token()?;
    let ttl = inner.config.rewind_ttl;
    let taken: i64 = inner
        .eval(
            operation,
            &inner.scripts.lock_rewind,
            vec![
                keys.turn.clone(),
                keys.rewind.clone(),
                keys.activity.clone(),
            ],
            vec![token.clone().into_bytes(), millis(ttl)],
        )
        .await?;
    let refused = |code: ErrorCode, why: &str| {
        Err(stored(Error::conflict(operation, format!("{why} session {key}"))).with_code(code))
    };
    match taken {
        1 => {}
        0 => return refused(ErrorCode::SessionRewindLocked, "a rewind holds"),
        -1 => return refused(ErrorCode::SessionTurnActive, "a chat turn holds"),
        _ => return refused(ErrorCode::SessionWorkActive, "background work is live in"),
    }
    let keeper = tokio::spawn(keep_rewind(
        inner.clone(),
        keys.rewind.clone(),
        token.clone(),
        key.to_string(),
    ));
    Ok(RewindLock::new(Box::new(RewindRelease {
        held: Some(Held {
            inner,
            lock_key: keys.rewind,
            token,
            renewer: keeper,
        }),
    })))
}

/// Keeps a rewind lock alive until released: renews it, and after a transient error or a lapse
/// re-acquires it with the same token, so a Redis blip cannot hand the session to a second
/// rewinder or to a turn.
async fn keep_rewind(inner: Arc<Inner>, rewind_key: String, token: String, session: String) {
    let ttl = inner.config.rewind_ttl;
    loop {
        tokio::time::sleep(ttl / 3).await;
        let kept: Result<i64, Error> = inner
            .eval(
                Operation::new("renew_rewind_lock"),
                &inner.scripts.keep_rewind,
                vec![rewind_key.clone()],
                vec![token.clone().into_bytes(), millis(ttl)],
            )
            .await;
        match kept {
            Ok(1) => {}
            Ok(2) => tracing::warn!(
                session,
                "rewind lock had lapsed; re-acquired with its token"
            ),
            Ok(_) => {
                tracing::error!(
                    session,
                    "rewind lock taken by another holder; stopped renewing"
                );
                return;
            }
            Err(e) => tracing::warn!(session, error = %e, "rewind lock renewal failed; retrying"),
        }
    }
}

struct RewindRelease {
    held: Option<Held>,
}

#[async_trait]
impl LockRelease for RewindRelease {
    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        if let Some(held) = self.held.take() {
            held.release(Operation::new("release_rewind_lock")).await?;
        }
        Ok(())
    }
}

impl Drop for RewindRelease {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.release_in_background(Operation::new("release_rewind_lock"));
        }
    }
}
