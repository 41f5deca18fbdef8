//! The lifecycle lock's ownership token, defined without a runtime.
//!
//! Cleanup that must outlive a cancelled caller (deleting a sandbox the caller created but can no
//! longer bind) is spawned, and must stop the moment this process no longer holds the session's
//! lifecycle lock: past that point another replica may be acting on the same session. A store
//! hands out an [`OwnershipToken`] with every lock; it trips when ownership is lost (a lease
//! could not be renewed, the lock key vanished) and never merely because the caller went away.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use event_listener::Event;

use crate::error::{Error, ErrorCode, ErrorKind, Operation, Origin};

struct Inner {
    lost: AtomicBool,
    reason: Mutex<Option<String>>,
    event: Event,
    children: Mutex<Vec<Weak<Inner>>>,
}

impl Inner {
    fn new() -> Arc<Inner> {
        Arc::new(Inner {
            lost: AtomicBool::new(false),
            reason: Mutex::new(None),
            event: Event::new(),
            children: Mutex::new(Vec::new()),
        })
    }

    fn trip(&self, reason: &str) {
        {
            // A poisoned mutex only means another thread panicked mid-trip; the token must still
            // trip, so recover the guard rather than propagate the panic.
            let mut slot = self
                .reason
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if slot.is_some() {
                return;
            }
            *slot = Some(reason.to_owned());
        }
        self.lost.store(true, Ordering::Release);
        self.event.notify(usize::MAX);
        let children = std::mem::take(
            &mut *self
                .children
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for child in children.iter().filter_map(Weak::upgrade) {
            child.trip(reason);
        }
    }

    fn reason(&self) -> Option<String> {
        if !self.lost.load(Ordering::Acquire) {
            return None;
        }
        self.reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Observes whether this process still owns a session's lifecycle lock. Cheap to clone; every
/// clone sees the same state.
#[derive(Clone)]
pub struct OwnershipToken {
    inner: Arc<Inner>,
}

/// The store's side of an [`OwnershipToken`]: trips it when ownership is lost.
#[derive(Clone)]
pub struct OwnershipSource {
    inner: Arc<Inner>,
}

impl OwnershipToken {
    /// A fresh, owned token and the source that can trip it.
    pub fn new_pair() -> (OwnershipSource, OwnershipToken) {
        let inner = Inner::new();
        (
            OwnershipSource {
                inner: inner.clone(),
            },
            OwnershipToken { inner },
        )
    }

    /// A token that is never lost, for stores whose locks cannot be lost (a process-local lock).
    pub fn never_lost() -> OwnershipToken {
        OwnershipToken {
            inner: Inner::new(),
        }
    }

    /// A derived token that is lost when `self` is lost or when the returned source trips it.
    /// Decorators (such as a fault-injecting store wrapper) use it to add their own reasons.
    pub fn child(&self) -> (OwnershipSource, OwnershipToken) {
        let (source, token) = OwnershipToken::new_pair();
        if let Some(reason) = self.inner.reason() {
            source.trip(&reason);
        } else {
            let mut children = self
                .inner
                .children
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            children.retain(|w| w.strong_count() > 0);
            children.push(Arc::downgrade(&token.inner));
            drop(children);
            // The parent may have tripped between the check and the registration.
            if let Some(reason) = self.inner.reason() {
                source.trip(&reason);
            }
        }
        (source, token)
    }

    /// Whether ownership has been lost.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.load(Ordering::Acquire)
    }

    /// Why ownership was lost, once it has been.
    pub fn loss_reason(&self) -> Option<String> {
        self.inner.reason()
    }

    /// `Err(lock_ownership_lost)` once ownership is lost; call before each destructive step.
    pub fn check(&self) -> Result<(), Error> {
        match self.inner.reason() {
            None => Ok(()),
            Some(reason) => Err(ownership_lost(&reason)),
        }
    }

    /// Completes when ownership is lost, with the reason. Runtime-agnostic; cancel-safe.
    pub async fn lost(&self) -> String {
        loop {
            if let Some(reason) = self.inner.reason() {
                return reason;
            }
            let listener = self.inner.event.listen();
            // Re-check after registering, so a trip between the check and `listen` is not missed.
            if let Some(reason) = self.inner.reason() {
                return reason;
            }
            listener.await;
        }
    }
}

impl OwnershipSource {
    /// Marks ownership as lost (first reason wins) and wakes every waiter, children included.
    pub fn trip(&self, reason: &str) {
        self.inner.trip(reason);
    }

    /// A token observing this source.
    pub fn token(&self) -> OwnershipToken {
        OwnershipToken {
            inner: self.inner.clone(),
        }
    }
}

/// The error for an operation cut off because lock ownership was lost. The lock is the binding
/// store's, and so is the loss (a lease that could not be renewed): origin store.
pub fn ownership_lost(reason: &str) -> Error {
    Error::new(
        ErrorKind::Conflict,
        Operation::new("hold_lifecycle_lock"),
        format!("lock ownership lost: {reason}"),
    )
    .with_code(ErrorCode::LockOwnershipLost)
    .with_origin(Origin::Store)
}

impl fmt::Debug for OwnershipToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnershipToken")
            .field("lost", &self.inner.reason())
            .finish()
    }
}

impl fmt::Debug for OwnershipSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnershipSource")
            .field("lost", &self.inner.reason())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn trip_is_sticky_and_first_reason_wins() {
        let (source, token) = OwnershipToken::new_pair();
        assert!(!token.is_lost());
        assert!(token.check().is_ok());
        source.trip("lease expired");
        source.trip("second");
        assert!(token.is_lost());
        assert_eq!(token.loss_reason().as_deref(), Some("lease expired"));
        let err = token.check().unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::LockOwnershipLost));
    }

    #[test]
    fn children_follow_parents_but_not_the_reverse() {
        let (parent_src, parent) = OwnershipToken::new_pair();
        let (child_src, child) = parent.child();
        child_src.trip("forced");
        assert!(child.is_lost());
        assert!(!parent.is_lost());
        let (_, child2) = parent.child();
        parent_src.trip("renew failed");
        assert!(child2.is_lost());
        assert_eq!(child2.loss_reason().as_deref(), Some("renew failed"));
        // A child made after the parent was lost starts lost.
        let (_, late) = parent.child();
        assert!(late.is_lost());
        assert!(!OwnershipToken::never_lost().is_lost());
    }

    #[tokio::test]
    async fn lost_wakes_waiters_on_any_runtime_thread() {
        let (source, token) = OwnershipToken::new_pair();
        let (_, child) = token.child();
        let waiter = tokio::spawn(async move { child.lost().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        std::thread::spawn(move || source.trip("gone"))
            .join()
            .unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reason, "gone");
    }
}
