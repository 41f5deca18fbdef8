//! The memory store's data: bindings, turn leases, rewind holds and activity leases.
//!
//! Everything here is synchronous and takes `now` as a parameter, so the rules (the same ones
//! the Redis scripts implement) are testable without a runtime and judged by whatever clock the
//! store was built with. The store keeps one [`State`] behind one mutex and never awaits while
//! holding it, which makes every operation atomic the way a Lua script is atomic in Redis.

use std::collections::{BTreeMap, HashMap};
use std::sync::Weak;
use std::time::Duration;

use sandbox_core::{
    BackgroundActivity, Binding, BindingKey, ConfigId, Error, ErrorCode, Operation, Origin,
    Provider, SandboxId, Secret, SessionId, TenantId, TurnState,
};
use time::{OffsetDateTime, PrimitiveDateTime};

/// What a deadline saturates to when `now + ttl` does not fit: a lease that never expires is
/// the safe reading of an absurdly long TTL.
const FAR_FUTURE: OffsetDateTime = PrimitiveDateTime::MAX.assume_utc();

/// `now + ttl`, saturating.
pub(super) fn deadline(now: OffsetDateTime, ttl: Duration) -> OffsetDateTime {
    time::Duration::try_from(ttl)
        .ok()
        .and_then(|ttl| now.checked_add(ttl))
        .unwrap_or(FAR_FUTURE)
}

/// Expired leases are swept from every key once per this many lease operations, so keys that
/// are never touched again do not keep their dead entries for the life of the process.
const SWEEP_EVERY: u32 = 256;

/// A chat-turn lease: what the Redis store keeps as a `turn` hash (`refs`, `rebuild`) with a
/// PEXPIRE.
#[derive(Debug, Clone, Copy)]
struct TurnLease {
    refs: u64,
    rebuild: bool,
    expires_at: OffsetDateTime,
}

/// A held rewind lock.
#[derive(Debug)]
pub(super) struct RewindHold {
    /// Tells successive holders apart, so a late release of an old holder never frees the lock
    /// of the next one.
    id: u64,
    expires_at: OffsetDateTime,
    /// Alive exactly as long as the holder's `RewindLock`. See [`State::rewind_held`].
    holder: Weak<()>,
}

#[derive(Debug, Clone)]
struct ActivityLease {
    activity: BackgroundActivity,
    expires_at: OffsetDateTime,
}

/// Why [`State::begin_turn`] or [`State::try_lock_rewind`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    RewindLocked,
    TurnActive,
    WorkActive,
}

impl Refusal {
    pub(super) fn into_error(self, operation: Operation, key: &BindingKey) -> Error {
        let (code, why) = match self {
            Refusal::RewindLocked => (ErrorCode::SessionRewindLocked, "a rewind holds"),
            Refusal::TurnActive => (ErrorCode::SessionTurnActive, "a chat turn holds"),
            Refusal::WorkActive => (ErrorCode::SessionWorkActive, "background work is live in"),
        };
        Error::conflict(operation, format!("{why} session {key}"))
            .with_code(code)
            .with_origin(Origin::Store)
    }
}

/// The lease lengths the state judges by.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ttls {
    pub(super) turn_lease: Duration,
    pub(super) rewind: Duration,
}

#[derive(Debug, Default)]
pub(super) struct State {
    bindings: HashMap<BindingKey, Binding>,
    turns: HashMap<BindingKey, TurnLease>,
    rewinds: HashMap<BindingKey, RewindHold>,
    /// Per key, by activity id (ordered, so `list` is deterministic).
    activities: HashMap<BindingKey, BTreeMap<String, ActivityLease>>,
    next_rewind_id: u64,
    ops_since_sweep: u32,
}

impl State {
    // ---- bindings ---------------------------------------------------------------------------

    pub(super) fn get(&self, key: &BindingKey) -> Option<Binding> {
        self.bindings.get(key).cloned()
    }

    /// Create-if-absent. The caller has validated `binding` against `key`.
    pub(super) fn create(&mut self, key: &BindingKey, mut binding: Binding) -> bool {
        if self.bindings.contains_key(key) {
            return false;
        }
        // The wire schema omits an empty token and reads it back as absent; store what a
        // shared store would hand back, so the two kinds of store agree on `get`.
        if binding.traffic_token.as_ref().is_some_and(Secret::is_empty) {
            binding.traffic_token = None;
        }
        self.bindings.insert(key.clone(), binding);
        true
    }

    pub(super) fn delete_if_match(
        &mut self,
        key: &BindingKey,
        provider: Provider,
        sandbox: &SandboxId,
    ) -> bool {
        let matches = self
            .bindings
            .get(key)
            .is_some_and(|b| b.provider == provider && &b.sandbox_id == sandbox);
        if matches {
            self.bindings.remove(key);
        }
        matches
    }

    /// Patches the token field alone, so a stale mark written after the caller read `expected`
    /// survives (the reason the Redis script edits the JSON text instead of replacing it).
    pub(super) fn replace_traffic_token(
        &mut self,
        key: &BindingKey,
        expected: &Binding,
        token: &Secret,
    ) -> bool {
        if token.is_empty() {
            return false;
        }
        match self.bindings.get_mut(key) {
            Some(b)
                if b.provider == expected.provider
                    && b.sandbox_id == expected.sandbox_id
                    && b.traffic_token.as_ref() != Some(token) =>
            {
                b.traffic_token = Some(token.clone());
                true
            }
            _ => false,
        }
    }

    /// The sessions of `tenant` with an unmarked binding of `config`, in order. Legacy bindings
    /// (no config) never match: `config` is normalized, so even the default config is the
    /// sentinel, never "absent".
    pub(super) fn invalidation_candidates(
        &self,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Vec<SessionId> {
        let mut sessions: Vec<SessionId> = self
            .bindings
            .iter()
            .filter(|(k, b)| k.tenant == tenant && is_markable(b, config))
            .map(|(k, _)| k.session.clone())
            .collect();
        sessions.sort();
        sessions
    }

    /// Marks `key` stale if it still holds an unmarked binding of `config`; returns whether it
    /// wrote. Re-checked under the session's lifecycle lock, because the binding may have been
    /// rebuilt, deleted or marked since the candidates were listed.
    pub(super) fn mark_stale(
        &mut self,
        key: &BindingKey,
        config: &ConfigId,
        now: OffsetDateTime,
    ) -> bool {
        match self.bindings.get_mut(key) {
            Some(b) if is_markable(b, config) => {
                b.stale_at = Some(now);
                true
            }
            _ => false,
        }
    }

    /// The binding and whether a resolve would write to the turn lease (an unspent rebuild,
    /// or a lease past half its life to re-arm), read without changing anything.
    pub(super) fn snapshot(
        &self,
        key: &BindingKey,
        now: OffsetDateTime,
        ttls: Ttls,
    ) -> (Option<Binding>, bool) {
        let half = time::Duration::try_from(ttls.turn_lease / 2).unwrap_or(time::Duration::MAX);
        let needs_write = self
            .turns
            .get(key)
            .filter(|t| t.expires_at > now)
            .is_some_and(|t| t.rebuild || t.expires_at - now < half);
        (self.bindings.get(key).cloned(), needs_write)
    }

    pub(super) fn binding_count(&self) -> usize {
        self.bindings.len()
    }

    // ---- turn leases ------------------------------------------------------------------------

    /// The live lease of `key`; an expired one is dropped first, as Redis would have.
    fn live_turn(&mut self, key: &BindingKey, now: OffsetDateTime) -> Option<&mut TurnLease> {
        if self.turns.get(key).is_some_and(|t| t.expires_at <= now) {
            self.turns.remove(key);
        }
        self.turns.get_mut(key)
    }

    pub(super) fn begin_turn(
        &mut self,
        key: &BindingKey,
        now: OffsetDateTime,
        ttls: Ttls,
    ) -> Result<(), Refusal> {
        self.maybe_sweep(now, ttls);
        if self.rewind_held(key, now, ttls) {
            return Err(Refusal::RewindLocked);
        }
        let expires_at = deadline(now, ttls.turn_lease);
        match self.live_turn(key, now) {
            Some(lease) => {
                lease.refs = lease.refs.saturating_add(1);
                lease.expires_at = expires_at;
            }
            None => {
                // The first hold of a turn allows its one rebuild.
                self.turns.insert(
                    key.clone(),
                    TurnLease {
                        refs: 1,
                        rebuild: true,
                        expires_at,
                    },
                );
            }
        }
        Ok(())
    }

    /// Releases one hold; the last drops the lease. Deliberately does not re-arm the TTL (the
    /// reference's EndTurn does not either): a release is not a sign of life.
    pub(super) fn end_turn(&mut self, key: &BindingKey, now: OffsetDateTime) {
        let Some(lease) = self.live_turn(key, now) else {
            return;
        };
        lease.refs = lease.refs.saturating_sub(1);
        if lease.refs == 0 {
            self.turns.remove(key);
        }
    }

    pub(super) fn turn_state(
        &mut self,
        key: &BindingKey,
        now: OffsetDateTime,
        ttls: Ttls,
    ) -> TurnState {
        let live_work = self.has_live_activities(key, now);
        let expires_at = deadline(now, ttls.turn_lease);
        let rebuild = self.live_turn(key, now).map(|lease| {
            lease.expires_at = expires_at;
            lease.rebuild
        });
        TurnState {
            active: rebuild.is_some() || live_work,
            // Live background work counts as a turn that must not rebuild: tearing down the
            // sandbox would kill the work.
            may_rebuild: rebuild == Some(true) && !live_work,
        }
    }

    /// Spends the rebuild; never creates a lease (an empty lease would read as an open turn to
    /// the rewind lock).
    pub(super) fn consume_turn_rebuild(
        &mut self,
        key: &BindingKey,
        now: OffsetDateTime,
        ttls: Ttls,
    ) {
        let expires_at = deadline(now, ttls.turn_lease);
        if let Some(lease) = self.live_turn(key, now) {
            lease.rebuild = false;
            lease.expires_at = expires_at;
        }
    }

    // ---- rewind lock ------------------------------------------------------------------------

    /// Whether a rewind holds `key`.
    ///
    /// The Redis store's rewind key has a 2-minute TTL that a renewer extends every 40 s until
    /// unlock, so it expires only when its holder's process died. In one process the holder
    /// cannot die without taking the store with it, and its `RewindLock` releases on drop, so
    /// the lease is modelled as renewed on every look while the holder's handle is alive, and
    /// as expired once the TTL passed with no handle left (reachable only by leaking one).
    pub(super) fn rewind_held(
        &mut self,
        key: &BindingKey,
        now: OffsetDateTime,
        ttls: Ttls,
    ) -> bool {
        let Some(hold) = self.rewinds.get_mut(key) else {
            return false;
        };
        if hold.expires_at > now {
            return true;
        }
        if hold.holder.strong_count() > 0 {
            hold.expires_at = deadline(now, ttls.rewind);
            return true;
        }
        self.rewinds.remove(key);
        false
    }

    /// Takes the rewind lock; returns the hold's id.
    pub(super) fn try_lock_rewind(
        &mut self,
        key: &BindingKey,
        holder: Weak<()>,
        now: OffsetDateTime,
        ttls: Ttls,
    ) -> Result<u64, Refusal> {
        if self.live_turn(key, now).is_some() {
            return Err(Refusal::TurnActive);
        }
        if self.has_live_activities(key, now) {
            return Err(Refusal::WorkActive);
        }
        if self.rewind_held(key, now, ttls) {
            return Err(Refusal::RewindLocked);
        }
        let id = self.next_rewind_id;
        self.next_rewind_id = self.next_rewind_id.wrapping_add(1);
        self.rewinds.insert(
            key.clone(),
            RewindHold {
                id,
                expires_at: deadline(now, ttls.rewind),
                holder,
            },
        );
        Ok(id)
    }

    /// Frees the rewind lock of `key` if hold `id` still has it (compare-and-delete).
    pub(super) fn release_rewind(&mut self, key: &BindingKey, id: u64) {
        if self.rewinds.get(key).is_some_and(|h| h.id == id) {
            self.rewinds.remove(key);
        }
    }

    // ---- activities -------------------------------------------------------------------------

    fn live_activities(
        &mut self,
        key: &BindingKey,
        now: OffsetDateTime,
    ) -> Option<&mut BTreeMap<String, ActivityLease>> {
        let empty = match self.activities.get_mut(key) {
            None => return None,
            Some(leases) => {
                leases.retain(|_, l| l.expires_at > now);
                leases.is_empty()
            }
        };
        if empty {
            self.activities.remove(key);
            return None;
        }
        self.activities.get_mut(key)
    }

    fn has_live_activities(&mut self, key: &BindingKey, now: OffsetDateTime) -> bool {
        self.live_activities(key, now).is_some()
    }

    /// Registers (or, for an id already live, renews) an activity. `Err(live)` when the kind is
    /// at its cap.
    pub(super) fn add_activity(
        &mut self,
        key: &BindingKey,
        activity: &BackgroundActivity,
        lease: Duration,
        kind_cap: usize,
        now: OffsetDateTime,
        ttls: Ttls,
    ) -> Result<(), usize> {
        self.maybe_sweep(now, ttls);
        let expires_at = deadline(now, lease);
        if let Some(leases) = self.live_activities(key, now) {
            if let Some(existing) = leases.get_mut(&activity.id) {
                // Re-adding renews: a retried registration must not eat a second slot.
                existing.activity = activity.clone();
                existing.expires_at = expires_at;
                return Ok(());
            }
            let live = leases
                .values()
                .filter(|l| l.activity.kind == activity.kind)
                .count();
            if live >= kind_cap {
                return Err(live);
            }
        } else if kind_cap == 0 {
            return Err(0);
        }
        self.activities.entry(key.clone()).or_default().insert(
            activity.id.clone(),
            ActivityLease {
                activity: activity.clone(),
                expires_at,
            },
        );
        Ok(())
    }

    pub(super) fn renew_activity(
        &mut self,
        key: &BindingKey,
        id: &str,
        lease: Duration,
        now: OffsetDateTime,
    ) -> bool {
        match self.live_activities(key, now).and_then(|l| l.get_mut(id)) {
            Some(existing) => {
                existing.expires_at = deadline(now, lease);
                true
            }
            None => false,
        }
    }

    pub(super) fn remove_activity(&mut self, key: &BindingKey, id: &str) {
        if let Some(leases) = self.activities.get_mut(key) {
            leases.remove(id);
            if leases.is_empty() {
                self.activities.remove(key);
            }
        }
    }

    pub(super) fn list_activities(
        &mut self,
        key: &BindingKey,
        now: OffsetDateTime,
    ) -> Vec<BackgroundActivity> {
        self.live_activities(key, now)
            .map(|leases| leases.values().map(|l| l.activity.clone()).collect())
            .unwrap_or_default()
    }

    // ---- housekeeping -----------------------------------------------------------------------

    /// Every [`SWEEP_EVERY`] calls, drops expired leases of every key.
    fn maybe_sweep(&mut self, now: OffsetDateTime, ttls: Ttls) {
        self.ops_since_sweep = self.ops_since_sweep.saturating_add(1);
        if self.ops_since_sweep < SWEEP_EVERY {
            return;
        }
        self.ops_since_sweep = 0;
        self.turns.retain(|_, t| t.expires_at > now);
        self.activities.retain(|_, leases| {
            leases.retain(|_, l| l.expires_at > now);
            !leases.is_empty()
        });
        let keys: Vec<BindingKey> = self.rewinds.keys().cloned().collect();
        for key in keys {
            self.rewind_held(&key, now, ttls);
        }
    }

    /// Sizes, for `Debug` (never contents: bindings carry traffic tokens).
    pub(super) fn sizes(&self) -> [usize; 4] {
        [
            self.bindings.len(),
            self.turns.len(),
            self.rewinds.len(),
            self.activities.values().map(BTreeMap::len).sum(),
        ]
    }
}

fn is_markable(binding: &Binding, config: &ConfigId) -> bool {
    binding.stale_at.is_none() && binding.config_id.as_ref() == Some(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key(session: &str) -> BindingKey {
        BindingKey::new(7, session).unwrap()
    }

    fn t0() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    fn ttls() -> Ttls {
        Ttls {
            turn_lease: Duration::from_secs(1800),
            rewind: Duration::from_secs(120),
        }
    }

    fn secs(n: i64) -> time::Duration {
        time::Duration::seconds(n)
    }

    fn activity(id: &str, kind: &str) -> BackgroundActivity {
        BackgroundActivity {
            id: id.to_owned(),
            kind: kind.to_owned(),
            started_at: t0(),
        }
    }

    #[test]
    fn deadlines_saturate() {
        assert_eq!(deadline(t0(), Duration::MAX), FAR_FUTURE);
        assert_eq!(deadline(t0(), Duration::from_secs(1)), t0() + secs(1));
    }

    #[test]
    fn turn_lease_expires_unless_rearmed() {
        let mut s = State::default();
        let k = key("a");
        s.begin_turn(&k, t0(), ttls()).unwrap();
        // turn_state re-arms: 20 + 20 minutes is past the first deadline but not the second.
        let at = t0() + secs(20 * 60);
        assert!(s.turn_state(&k, at, ttls()).active);
        let at = at + secs(20 * 60);
        assert_eq!(
            s.turn_state(&k, at, ttls()),
            TurnState {
                active: true,
                may_rebuild: true
            }
        );
        // end_turn does not re-arm; 31 minutes of silence drops the lease.
        let at = at + secs(31 * 60);
        assert_eq!(s.turn_state(&k, at, ttls()), TurnState::default());
        // A new turn re-arms the rebuild.
        s.begin_turn(&k, at, ttls()).unwrap();
        assert!(s.turn_state(&k, at, ttls()).may_rebuild);
    }

    #[test]
    fn leaked_rewind_hold_expires_but_a_live_one_is_renewed() {
        let mut s = State::default();
        let (a, b) = (key("a"), key("b"));
        let live = Arc::new(());
        s.try_lock_rewind(&a, Arc::downgrade(&live), t0(), ttls())
            .unwrap();
        let leaked = Arc::new(());
        s.try_lock_rewind(&b, Arc::downgrade(&leaked), t0(), ttls())
            .unwrap();
        drop(leaked);
        let later = t0() + secs(10 * 60);
        assert!(s.rewind_held(&a, later, ttls()));
        assert!(!s.rewind_held(&b, later, ttls()));
        assert_eq!(s.begin_turn(&a, later, ttls()), Err(Refusal::RewindLocked));
        assert!(s.begin_turn(&b, later, ttls()).is_ok());
    }

    #[test]
    fn a_stale_release_never_frees_the_next_holder() {
        let mut s = State::default();
        let k = key("a");
        let h = Arc::new(());
        let first = s
            .try_lock_rewind(&k, Arc::downgrade(&h), t0(), ttls())
            .unwrap();
        s.release_rewind(&k, first);
        let second = s
            .try_lock_rewind(&k, Arc::downgrade(&h), t0(), ttls())
            .unwrap();
        s.release_rewind(&k, first);
        assert!(s.rewind_held(&k, t0(), ttls()));
        s.release_rewind(&k, second);
        assert!(!s.rewind_held(&k, t0(), ttls()));
    }

    #[test]
    fn activity_caps_count_live_leases_of_one_kind() {
        let mut s = State::default();
        let k = key("a");
        let lease = Duration::from_secs(60);
        s.add_activity(&k, &activity("1", "job"), lease, 1, t0(), ttls())
            .unwrap();
        assert_eq!(
            s.add_activity(&k, &activity("2", "job"), lease, 1, t0(), ttls()),
            Err(1)
        );
        assert_eq!(
            s.add_activity(&k, &activity("3", "desk"), lease, 0, t0(), ttls()),
            Err(0)
        );
        // Once the first lease lapses its slot is free again.
        let later = t0() + secs(61);
        assert!(!s.renew_activity(&k, "1", lease, later));
        s.add_activity(&k, &activity("2", "job"), lease, 1, later, ttls())
            .unwrap();
        assert_eq!(s.list_activities(&k, later), vec![activity("2", "job")]);
    }

    #[test]
    fn sweeps_drop_expired_leases_of_untouched_keys() {
        let mut s = State::default();
        let lease = Duration::from_secs(1);
        for n in 0..10 {
            let k = key(&format!("old-{n}"));
            s.begin_turn(&k, t0(), ttls()).unwrap();
            s.add_activity(&k, &activity("x", "job"), lease, 1, t0(), ttls())
                .unwrap();
        }
        let later = t0() + secs(3600);
        for n in 0..SWEEP_EVERY {
            let k = key(&format!("new-{n}"));
            s.begin_turn(&k, later, ttls()).unwrap();
            s.end_turn(&k, later);
        }
        assert_eq!(s.sizes(), [0, 0, 0, 0]);
    }
}
