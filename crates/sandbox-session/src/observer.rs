//! Hooks through which an embedding service counts what the coordinator does (metrics), without
//! this crate choosing a metrics library.

use std::fmt;

use sandbox_core::ErrorKind;

/// How a resolve ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResolveOutcome {
    /// The bound sandbox answered and was handed out.
    Bound,
    /// Nothing usable was bound; a sandbox carrying the session's ownership metadata was adopted
    /// (after a restart or a lost binding).
    Recovered,
    /// A new sandbox was created and bound (or a racing winner's was used).
    Created,
    /// The resolve failed with this error kind.
    Failed(ErrorKind),
}

impl ResolveOutcome {
    /// A stable label: `bound`, `recovered`, `created`, or `failed`.
    pub fn label(self) -> &'static str {
        match self {
            ResolveOutcome::Bound => "bound",
            ResolveOutcome::Recovered => "recovered",
            ResolveOutcome::Created => "created",
            ResolveOutcome::Failed(_) => "failed",
        }
    }
}

/// Receives lifecycle events. Called inline on the resolving task, so implementations must be
/// cheap and must not block (increment a counter, no I/O). Every method defaults to nothing.
pub trait LifecycleObserver: Send + Sync + fmt::Debug {
    /// One resolve finished.
    fn resolved(&self, _outcome: ResolveOutcome) {}
    /// The provider created a sandbox (counted even if it is deleted again right after, e.g.
    /// the loser of a create race), so `created - destroyed` is what this process left alive.
    fn sandbox_created(&self) {}
    /// The provider deleted a sandbox (or confirmed it was already gone) on this process's
    /// request.
    fn sandbox_destroyed(&self) {}
}

/// The default observer: ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopObserver;

impl LifecycleObserver for NoopObserver {}
