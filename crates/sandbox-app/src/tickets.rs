//! Short-lived, single-use tickets that authorise a terminal WebSocket upgrade.
//!
//! Browsers cannot put a bearer header on a WebSocket, and a token must never travel in a query
//! string (it ends up in proxy and access logs). So a bearer-authenticated `POST` issues a
//! ticket bound to one `(tenant, session)`; the upgrade presents it once, within its lifetime.
//! Tickets live in this process's memory only: they are random 32-byte hex strings, stored by
//! their SHA-256 digest, and expired ones are pruned on every access.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sandbox_core::{BindingKey, Clock, SessionId, SystemClock};
use time::OffsetDateTime;

use crate::auth::{digest, hex};

/// How long a ticket stays valid when nobody says otherwise.
pub const DEFAULT_TICKET_TTL: Duration = Duration::from_secs(60);

/// Outstanding tickets beyond this are refused rather than grown without bound.
pub const MAX_OUTSTANDING: usize = 10_000;

/// Unused tickets one tenant may hold when nobody says otherwise. Per tenant, so one tenant
/// filling the pool cannot lock every other tenant out of their terminals.
pub const DEFAULT_PER_TENANT: usize = 16;

/// Why a ticket cannot be issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IssueError {
    /// Too many tickets outstanding in the whole process.
    Full,
    /// The tenant holds its limit of unused tickets (the limit).
    TenantFull(usize),
    /// The operating system's random source failed.
    Random(String),
}

#[derive(Debug, Clone)]
struct Entry {
    key: BindingKey,
    expires: OffsetDateTime,
}

/// The in-memory ticket store. Cheap to share behind an `Arc`.
pub struct TerminalTickets {
    entries: Mutex<HashMap<String, Entry>>,
    ttl: Duration,
    per_tenant: usize,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for TerminalTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tickets themselves.
        f.debug_struct("TerminalTickets")
            .field("ttl", &self.ttl)
            .field("outstanding", &self.lock().len())
            .finish()
    }
}

impl Default for TerminalTickets {
    fn default() -> Self {
        TerminalTickets::new(DEFAULT_TICKET_TTL)
    }
}

impl TerminalTickets {
    /// A store whose tickets live `ttl`, on the system clock.
    pub fn new(ttl: Duration) -> Self {
        TerminalTickets::with_clock(ttl, Arc::new(SystemClock))
    }

    /// A store on an injected clock (tests move it to expire tickets).
    pub fn with_clock(ttl: Duration, clock: Arc<dyn Clock>) -> Self {
        TerminalTickets {
            entries: Mutex::new(HashMap::new()),
            ttl,
            per_tenant: DEFAULT_PER_TENANT,
            clock,
        }
    }

    /// Caps the unused tickets of one tenant at `limit`.
    #[must_use]
    pub fn with_per_tenant(mut self, limit: usize) -> Self {
        self.per_tenant = limit;
        self
    }

    /// How long a ticket stays valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pruned(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        let now = self.clock.now();
        let mut entries = self.lock();
        entries.retain(|_, e| e.expires > now);
        entries
    }

    /// Issues a new ticket for `key`.
    pub fn issue(&self, key: BindingKey) -> Result<String, IssueError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| IssueError::Random(e.to_string()))?;
        let ticket = hex(&raw);
        let expires = self
            .clock
            .now()
            .saturating_add(time::Duration::try_from(self.ttl).unwrap_or(time::Duration::MAX));
        let mut entries = self.pruned();
        if entries
            .values()
            .filter(|e| e.key.tenant == key.tenant)
            .count()
            >= self.per_tenant
        {
            return Err(IssueError::TenantFull(self.per_tenant));
        }
        if entries.len() >= MAX_OUTSTANDING {
            return Err(IssueError::Full);
        }
        entries.insert(hex(&digest(&ticket)), Entry { key, expires });
        Ok(ticket)
    }

    /// The key `ticket` is bound to, when it is live and was issued for `session`; does not
    /// use it up.
    pub fn check(&self, ticket: &str, session: &SessionId) -> Option<BindingKey> {
        let entries = self.pruned();
        entries
            .get(&hex(&digest(ticket)))
            .filter(|e| &e.key.session == session)
            .map(|e| e.key.clone())
    }

    /// Uses `ticket` up: true when it was live and bound to exactly `key` (then it is gone).
    pub fn redeem(&self, ticket: &str, key: &BindingKey) -> bool {
        let mut entries = self.pruned();
        let id = hex(&digest(ticket));
        if entries.get(&id).is_some_and(|e| &e.key == key) {
            entries.remove(&id);
            true
        } else {
            false
        }
    }

    /// Outstanding (unexpired, unused) tickets.
    pub fn outstanding(&self) -> usize {
        self.pruned().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::{ManualClock, TenantId};

    fn key(tenant: u64, session: &str) -> BindingKey {
        BindingKey {
            tenant: TenantId::new(tenant).unwrap(),
            session: SessionId::new(session).unwrap(),
        }
    }

    #[test]
    fn single_use_bound_and_expiring() {
        let clock = ManualClock::new(OffsetDateTime::UNIX_EPOCH + time::Duration::days(20_000));
        let store = TerminalTickets::with_clock(Duration::from_secs(60), Arc::new(clock.clone()));
        let a = key(1, "s1");
        let t = store.issue(a.clone()).unwrap();
        assert_eq!(t.len(), 64);
        assert!(t.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(store.issue(a.clone()).unwrap(), t, "tickets are random");
        // Another session, another tenant: refused, and the ticket survives the attempt.
        assert_eq!(store.check(&t, &SessionId::new("s2").unwrap()), None);
        assert!(!store.redeem(&t, &key(2, "s1")));
        assert_eq!(store.check(&t, &a.session), Some(a.clone()));
        assert!(store.redeem(&t, &a));
        assert!(!store.redeem(&t, &a), "single use");
        assert_eq!(store.check(&t, &a.session), None);
        assert!(!store.redeem("nonsense", &a));

        let t = store.issue(a.clone()).unwrap();
        clock.advance(Duration::from_secs(61));
        assert_eq!(store.check(&t, &a.session), None, "expired");
        assert!(!store.redeem(&t, &a));
        assert_eq!(store.outstanding(), 0, "expired tickets are pruned");
        assert!(format!("{store:?}").contains("outstanding"));
        assert!(!format!("{store:?}").contains(&t));
    }

    #[test]
    fn one_tenant_cannot_take_another_tenants_tickets() {
        let store = TerminalTickets::new(Duration::from_secs(60)).with_per_tenant(3);
        for i in 0..3 {
            store.issue(key(1, &format!("s{i}"))).unwrap();
        }
        assert_eq!(store.issue(key(1, "s9")), Err(IssueError::TenantFull(3)));
        // Tenant 2 is unaffected by tenant 1's pile.
        let t = store.issue(key(2, "s1")).unwrap();
        assert!(store.redeem(&t, &key(2, "s1")));
        // A redeemed ticket frees its tenant's slot.
        let mine = store.issue(key(2, "s1")).unwrap();
        assert!(store.redeem(&mine, &key(2, "s1")));
        assert_eq!(store.outstanding(), 3);
    }
}
