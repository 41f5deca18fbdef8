//! Per-tenant quotas: how many sandboxes, running commands, terminals and snapshots one tenant
//! may hold at once.
//!
//! Every refusal is a `capacity` error with code `quota_exceeded` whose message names the
//! limit, raised *before* anything is created: a tenant at its ceiling costs the host nothing.
//!
//! Counting differs by what is counted:
//! - Sandboxes and snapshots live in the backend, so they are counted there (the provider's
//!   listing by the ownership metadata every session sandbox carries), which holds across
//!   replicas and restarts. In-flight creates of this process are reserved first and counted
//!   too, so concurrent first requests of one tenant cannot all pass the same count. Two
//!   replicas racing at the very limit can still overshoot by one each: the count is the
//!   backend's, the reservation only this process's.
//! - Running commands, open terminals and open attach/watch streams exist only while a call
//!   is in progress, so they are counted in this process by permits that release on drop (a
//!   cancelled call frees its slot).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use sandbox_core::{Error, ErrorCode, ErrorKind, Operation, TenantId};

/// One tenant's ceilings; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantQuota {
    /// Live (running or paused) sandboxes of the tenant's sessions and ephemeral runs.
    pub max_sandboxes: Option<u32>,
    /// Commands running at once (execs, streamed execs, ephemeral executes).
    pub max_concurrent_execs: Option<u32>,
    /// Interactive terminals open at once.
    pub max_terminals: Option<u32>,
    /// Snapshots kept.
    pub max_snapshots: Option<u32>,
    /// Long-lived output streams open at once: process attaches and directory watches
    /// (issue 17). Each holds a connection and a backend stream, like a terminal.
    pub max_streams: Option<u32>,
}

impl TenantQuota {
    /// No ceiling at all.
    pub const UNLIMITED: TenantQuota = TenantQuota {
        max_sandboxes: None,
        max_concurrent_execs: None,
        max_terminals: None,
        max_snapshots: None,
        max_streams: None,
    };
}

/// The quotas of every tenant: a default and per-tenant overrides.
#[derive(Debug, Clone, Default)]
pub struct Quotas {
    pub default: TenantQuota,
    pub tenants: HashMap<TenantId, TenantQuota>,
}

impl Quotas {
    /// No tenant has a ceiling.
    pub fn unlimited() -> Self {
        Quotas::default()
    }

    /// The quota of `tenant`.
    pub fn of(&self, tenant: TenantId) -> TenantQuota {
        self.tenants.get(&tenant).copied().unwrap_or(self.default)
    }
}

/// What a permit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counted {
    /// A running command.
    Exec,
    /// An open terminal.
    Terminal,
    /// A sandbox being created by this process (not yet visible in the backend's listing).
    CreatingSandbox,
    /// A snapshot being taken by this process.
    TakingSnapshot,
    /// An open process attach or directory watch.
    Stream,
}

impl Counted {
    fn noun(self) -> &'static str {
        match self {
            Counted::Exec => "commands running",
            Counted::Terminal => "terminals open",
            Counted::CreatingSandbox => "sandboxes",
            Counted::TakingSnapshot => "snapshots",
            Counted::Stream => "attach or watch streams open",
        }
    }
    fn setting(self) -> &'static str {
        match self {
            Counted::Exec => "max_concurrent_execs",
            Counted::Terminal => "max_terminals",
            Counted::CreatingSandbox => "max_sandboxes",
            Counted::TakingSnapshot => "max_snapshots",
            Counted::Stream => "max_streams",
        }
    }
    fn limit(self, quota: &TenantQuota) -> Option<u32> {
        match self {
            Counted::Exec => quota.max_concurrent_execs,
            Counted::Terminal => quota.max_terminals,
            Counted::CreatingSandbox => quota.max_sandboxes,
            Counted::TakingSnapshot => quota.max_snapshots,
            Counted::Stream => quota.max_streams,
        }
    }
}

type Counts = Mutex<HashMap<(TenantId, Counted), u32>>;

/// The quotas and this process's counters. Cheap to clone (shared state).
#[derive(Debug, Clone, Default)]
pub struct QuotaGate {
    quotas: Arc<Quotas>,
    counts: Arc<Counts>,
}

impl QuotaGate {
    /// A gate enforcing `quotas`.
    pub fn new(quotas: Quotas) -> Self {
        QuotaGate {
            quotas: Arc::new(quotas),
            counts: Arc::default(),
        }
    }

    /// A gate that never refuses.
    pub fn unlimited() -> Self {
        QuotaGate::new(Quotas::unlimited())
    }

    /// The quota of `tenant`.
    pub fn quota(&self, tenant: TenantId) -> TenantQuota {
        self.quotas.of(tenant)
    }

    /// Takes one slot of `what` for `tenant`, counting `already` slots held elsewhere (the
    /// backend's live sandboxes or snapshots; 0 for purely in-process counts). Refused with
    /// `quota_exceeded` when the slot would pass the tenant's limit.
    pub fn acquire(
        &self,
        op: Operation,
        tenant: TenantId,
        what: Counted,
        already: u32,
    ) -> Result<QuotaPermit, Error> {
        let limit = what.limit(&self.quotas.of(tenant));
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let held = counts.entry((tenant, what)).or_insert(0);
        if let Some(limit) = limit
            && already.saturating_add(*held) >= limit
        {
            return Err(exceeded(op, tenant, what, limit));
        }
        *held += 1;
        Ok(QuotaPermit {
            counts: self.counts.clone(),
            key: (tenant, what),
        })
    }

    /// A slot of `what` reserved *before* the backend is counted: the caller counts, then
    /// calls [`Reservation::check`] with what the backend holds. Reserving first means two
    /// concurrent creates of one tenant each see the other, whichever order they count in.
    pub fn reserve(&self, tenant: TenantId, what: Counted) -> Reservation {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.entry((tenant, what)).or_insert(0) += 1;
        drop(counts);
        Reservation {
            gate: self.clone(),
            permit: QuotaPermit {
                counts: self.counts.clone(),
                key: (tenant, what),
            },
        }
    }

    /// How many slots of `what` this process holds for `tenant`.
    pub fn held(&self, tenant: TenantId, what: Counted) -> u32 {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(tenant, what))
            .copied()
            .unwrap_or(0)
    }
}

/// See [`QuotaGate::reserve`]. Dropping it releases the slot.
#[derive(Debug)]
pub struct Reservation {
    gate: QuotaGate,
    permit: QuotaPermit,
}

impl Reservation {
    /// Keeps the slot when `in_backend` (counted after reserving) plus this process's *other*
    /// reservations stay under the limit; otherwise `quota_exceeded`, and the slot is released.
    pub fn check(self, op: Operation, in_backend: u32) -> Result<QuotaPermit, Error> {
        let (tenant, what) = self.permit.key;
        let Some(limit) = what.limit(&self.gate.quota(tenant)) else {
            return Ok(self.permit);
        };
        let others = self.gate.held(tenant, what).saturating_sub(1);
        if in_backend.saturating_add(others) >= limit {
            return Err(exceeded(op, tenant, what, limit));
        }
        Ok(self.permit)
    }
}

/// One counted slot; dropping it gives the slot back.
#[derive(Debug)]
pub struct QuotaPermit {
    counts: Arc<Counts>,
    key: (TenantId, Counted),
}

impl Drop for QuotaPermit {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = counts.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

fn exceeded(op: Operation, tenant: TenantId, what: Counted, limit: u32) -> Error {
    Error::new(
        ErrorKind::Capacity,
        op,
        format!(
            "tenant {tenant} has {limit} {} already (quota {} = {limit})",
            what.noun(),
            what.setting()
        ),
    )
    .with_code(ErrorCode::QuotaExceeded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(n: u64) -> TenantId {
        TenantId::new(n).unwrap()
    }

    fn gate(max: u32) -> QuotaGate {
        QuotaGate::new(Quotas {
            default: TenantQuota {
                max_concurrent_execs: Some(max),
                max_sandboxes: Some(max),
                ..TenantQuota::UNLIMITED
            },
            tenants: HashMap::from([(tenant(9), TenantQuota::UNLIMITED)]),
        })
    }

    #[test]
    fn permits_count_per_tenant_and_release_on_drop() {
        let g = gate(2);
        let op = Operation::EXEC;
        let a = g.acquire(op, tenant(1), Counted::Exec, 0).unwrap();
        let _b = g.acquire(op, tenant(1), Counted::Exec, 0).unwrap();
        let err = g.acquire(op, tenant(1), Counted::Exec, 0).unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::QuotaExceeded));
        assert_eq!(err.kind(), ErrorKind::Capacity);
        assert!(
            err.to_string().contains("max_concurrent_execs = 2"),
            "{err}"
        );
        // Another tenant, and a tenant whose override lifts the limit, are not affected.
        let _c = g.acquire(op, tenant(2), Counted::Exec, 0).unwrap();
        for _ in 0..5 {
            std::mem::forget(g.acquire(op, tenant(9), Counted::Exec, 0).unwrap());
        }
        drop(a);
        assert!(g.acquire(op, tenant(1), Counted::Exec, 0).is_ok());
        assert!(
            g.acquire(op, tenant(1), Counted::Exec, 2).is_err(),
            "backend counts too"
        );
    }

    #[test]
    fn reservations_see_each_other_whatever_the_order() {
        let g = gate(2);
        let op = Operation::CREATE;
        // One sandbox is live. Two creates reserve, then both count 1 in the backend: only one
        // may proceed.
        let first = g.reserve(tenant(1), Counted::CreatingSandbox);
        let second = g.reserve(tenant(1), Counted::CreatingSandbox);
        let first = first.check(op, 1);
        let second = second.check(op, 1);
        assert!(first.is_err() || second.is_err(), "both passed");
        // The refused one released its slot: with the winner done and visible (2 live), a
        // later create is refused on the count alone.
        drop((first, second));
        assert_eq!(g.held(tenant(1), Counted::CreatingSandbox), 0);
        assert!(
            g.reserve(tenant(1), Counted::CreatingSandbox)
                .check(op, 2)
                .is_err()
        );
        assert!(
            g.reserve(tenant(1), Counted::CreatingSandbox)
                .check(op, 1)
                .is_ok()
        );
    }
}
