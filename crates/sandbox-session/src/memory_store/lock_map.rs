//! Per-key lifecycle locks: one fair async mutex per session, created on demand and dropped
//! again when nobody holds or awaits it.
//!
//! A single store-wide lock would be simpler and wrong: the lifecycle lock is held across
//! provider calls (a create can take a minute), so one slow session would stall every other,
//! and callers that wait on each other while holding their own sessions' locks (fifty creates
//! meeting at a barrier) would deadlock.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sandbox_core::BindingKey;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Slot = Arc<AsyncMutex<()>>;

/// The map of per-key mutexes.
#[derive(Default)]
pub(super) struct LockMap {
    slots: Mutex<HashMap<BindingKey, Slot>>,
}

impl fmt::Debug for LockMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockMap")
            .field("entries", &self.len())
            .finish()
    }
}

impl LockMap {
    /// The map is only touched synchronously and never across an await; a panic while holding
    /// it cannot leave it inconsistent (every edit is one insert or remove), so a poisoned
    /// guard is recovered instead of spreading the panic to every session.
    fn slots(&self) -> MutexGuard<'_, HashMap<BindingKey, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of keys with a mutex (held or awaited).
    pub(super) fn len(&self) -> usize {
        self.slots().len()
    }

    /// Waits for `key`'s lock. Cancel-safe: dropping the future while it waits leaves the lock
    /// untouched (tokio's mutex hands a permit granted to a dropped waiter to the next one) and
    /// removes the map entry if nobody else needs it.
    pub(super) async fn acquire(self: &Arc<Self>, key: &BindingKey) -> HeldLock {
        let claim = Claim::new(self.clone(), key.clone());
        let guard = claim.slot().lock_owned().await;
        HeldLock {
            guard: Some(guard),
            claim,
        }
    }
}

/// Interest in one key's mutex, registered while waiting or holding. Clones of the slot are
/// only taken under the map lock, so a strong count of one seen under that lock means nobody
/// else holds, awaits or is about to await the mutex, and the entry can go.
struct Claim {
    map: Arc<LockMap>,
    key: BindingKey,
    slot: Option<Slot>,
}

impl Claim {
    fn new(map: Arc<LockMap>, key: BindingKey) -> Self {
        let slot = map.slots().entry(key.clone()).or_default().clone();
        Claim {
            map,
            key,
            slot: Some(slot),
        }
    }

    fn slot(&self) -> Slot {
        // Always `Some` until drop; the default is never reached but keeps this panic-free.
        self.slot.clone().unwrap_or_default()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut slots = self.map.slots();
        drop(self.slot.take());
        if slots
            .get(&self.key)
            .is_some_and(|slot| Arc::strong_count(slot) == 1)
        {
            slots.remove(&self.key);
        }
    }
}

/// A held lock. Dropping it releases: the guard first, then the claim, so the claim sees the
/// guard's reference gone and can retire an idle entry.
pub(super) struct HeldLock {
    guard: Option<OwnedMutexGuard<()>>,
    claim: Claim,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        drop(self.guard.take());
        // `claim` is dropped right after this, by the compiler.
    }
}

impl fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLock")
            .field("key", &self.claim.key)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(session: &str) -> BindingKey {
        BindingKey::new(1, session).unwrap()
    }

    #[tokio::test]
    async fn entries_come_and_go_with_holders_and_waiters() {
        let map = Arc::new(LockMap::default());
        let a = key("a");
        let held = map.acquire(&a).await;
        assert_eq!(map.len(), 1);
        // A waiter that gives up leaves the entry to the holder, and nothing behind.
        let gave_up = tokio::time::timeout(Duration::from_millis(20), map.acquire(&a)).await;
        assert!(gave_up.is_err());
        assert_eq!(map.len(), 1);
        drop(held);
        assert_eq!(map.len(), 0);
        // The cancelled waiter left no lock held: the next acquire is immediate.
        let again = tokio::time::timeout(Duration::from_secs(1), map.acquire(&a))
            .await
            .unwrap();
        drop(again);
        assert_eq!(map.len(), 0);
    }

    #[tokio::test]
    async fn a_queued_waiter_gets_the_lock_on_release() {
        let map = Arc::new(LockMap::default());
        let a = key("a");
        let held = map.acquire(&a).await;
        let waiter = {
            let map = map.clone();
            let a = a.clone();
            tokio::spawn(async move { map.acquire(&a).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(held);
        let second = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(map.len(), 1);
        drop(second);
        assert_eq!(map.len(), 0);
    }
}
