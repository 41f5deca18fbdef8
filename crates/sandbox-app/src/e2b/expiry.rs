//! The timeout engine of E2B-API sandboxes: kills each sandbox once its deadline has passed,
//! or pauses it when its create asked for that (`autoPause`); either way its deadline is then
//! removed, since a paused sandbox has none until a connect resumes it.
//!
//! Deadlines live in a [`DeadlineStore`] (Redis, or the file store), written by the API before
//! it answers a create or a set-timeout. This engine only reads them back:
//! - [`Expiry::sweep_once`] takes the due deadlines (a bounded batch, earliest first), reads
//!   each again (one extended since is left alone), asks the [`ExpiryTarget`] to delete the
//!   sandbox, and removes a deadline only after its delete succeeded, so a failed delete is tried again by the next sweep and a crash between the
//!   two deletes again (an absent sandbox is `Ok`). Each kill reports its lag, `now - deadline`.
//! - [`Expiry::reconcile`], at start, gives every live sandbox without a stored deadline one:
//!   `max(create-time label, now + default timeout)`. A deadline may be missing because the
//!   store was lost (a deleted file, a flushed Redis) or because a crash fell between the create
//!   and the write; either way the sandbox is never killed early, because the label is what the
//!   caller asked for and `now + default` is a full timeout from a moment it surely was alive.
//!   Each such assignment is logged with both values.
//! - [`Expiry::spawn`] runs the two: reconcile once (retried with backoff while the store or
//!   the target fail, since sweeping before it could miss no deadline but would leave the
//!   unlabelled ones unkilled), then a sweep every [`SWEEP_INTERVAL`] until shutdown.
//!
//! Several replicas may run an engine over one store: two sweeps that race over one deadline
//! both delete (the second finds nothing, which is `Ok`) and both remove (absent is `Ok`).
//!
//! Deadlines of sandboxes that are not live are removed by reconcile only once they are due.
//! One that is not due yet may belong to a sandbox whose create is in flight on this or another
//! replica (its deadline written, the sandbox not listed yet); removing it would leave that
//! sandbox without a deadline until the next restart. When it comes due, a sweep deletes the
//! (absent) sandbox and removes it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    Clock, DeadlineStore, Error, ErrorKind, MAX_DEADLINE_MILLIS, Operation, SystemClock,
    deadline_from_millis,
};
use time::OffsetDateTime;
use tokio::task::JoinHandle;

/// How often the engine sweeps.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// How many due deadlines one sweep takes. A full batch is followed by another sweep at once.
pub const SWEEP_BATCH: usize = 256;

/// The first wait before a failed reconcile is tried again; it doubles up to
/// [`RECONCILE_RETRY_MAX`].
pub const RECONCILE_RETRY_MIN: Duration = Duration::from_millis(500);

/// The warning reconcile logs for each sandbox it gave a deadline (operators grep for it;
/// the engine tests look for it).
pub const LOG_ASSIGNED: &str = "e2b sandbox had no readable stored deadline; gave it max(create-time label, now + default timeout)";

/// The longest wait between two reconcile attempts.
pub const RECONCILE_RETRY_MAX: Duration = Duration::from_secs(30);

/// What the engine kills and where it learns which sandboxes exist (the E2B control plane over
/// the provider port).
#[async_trait]
pub trait ExpiryTarget: Send + Sync {
    /// Ends the sandbox `key` names as its create asked: deletes it, or pauses it when it
    /// pauses at its timeout. An absent sandbox is `Ok` ([`Expired::Killed`]: it is as dead as
    /// asked), and so is one already paused ([`Expired::Paused`]: a paused sandbox has no
    /// deadline).
    async fn expire(&self, key: &str) -> Result<Expired, Error>;
    /// Every running E2B-API sandbox, with the deadline its create stamped on it (its
    /// `sandbox.e2b.deadline` metadata), `None` when that is missing or unreadable. Paused
    /// ones are left out: they have no deadline, and reconcile must not give them one.
    async fn live(&self) -> Result<Vec<(String, Option<OffsetDateTime>)>, Error>;
}

/// What [`ExpiryTarget::expire`] did to a sandbox at its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Deleted (or already gone).
    Killed,
    /// Paused (or already paused): it stays, with no deadline, until a connect resumes it.
    Paused,
}

/// A deadline reconcile gave a live sandbox that had none in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    pub key: String,
    /// The create-time label, when the sandbox carried one.
    pub label: Option<OffsetDateTime>,
    /// What was stored: `max(label, now + default timeout)`.
    pub deadline: OffsetDateTime,
}

/// What [`Expiry::reconcile`] did.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    /// Live sandboxes whose deadline was in the store, left as it was.
    pub kept: usize,
    /// Live sandboxes that got a deadline.
    pub assigned: Vec<Assigned>,
    /// Due deadlines of sandboxes that are not live, removed.
    pub removed: Vec<String>,
    /// Deadlines of sandboxes that are not live and not due yet, left for the sweep (see the
    /// module docs).
    pub left_for_sweep: usize,
    /// Sandboxes whose deadline could not be given or removed, with why.
    pub failed: Vec<(String, Error)>,
    /// Why the stored deadlines could not be listed for the clean-up of gone sandboxes (a value
    /// the store cannot read), when they could not; the live sandboxes were handled all the
    /// same, and what is left is removed by the sweeps as it comes due.
    pub cleanup_error: Option<Error>,
}

/// One sandbox a sweep killed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    pub key: String,
    pub deadline: OffsetDateTime,
    /// `now - deadline`: how late the kill came.
    pub lag: Duration,
}

/// What [`Expiry::sweep_once`] did.
#[derive(Debug, Default)]
pub struct SweepReport {
    /// The sandboxes deleted, with their deadlines removed.
    pub killed: Vec<Kill>,
    /// The sandboxes paused at their deadline (their create asked for it), with their
    /// deadlines removed.
    pub paused: Vec<Kill>,
    /// Due deadlines whose delete (or whose removal after the delete) failed; each is still in
    /// the store, so the next sweep tries again.
    pub failed: Vec<(String, Error)>,
    /// Due when the batch was read, but extended or removed before its kill (a set-timeout or
    /// a delete on this or another replica, another replica's sweep): left alone.
    pub moved: Vec<String>,
    /// The batch was full: more may be due.
    pub batch_full: bool,
}

/// The timeout engine.
pub struct Expiry {
    store: Arc<dyn DeadlineStore>,
    target: Arc<dyn ExpiryTarget>,
    default_timeout: Duration,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for Expiry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Expiry")
            .field("store", &self.store)
            .field("default_timeout", &self.default_timeout)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// The last instant a deadline store keeps.
fn end_of_range() -> OffsetDateTime {
    deadline_from_millis(Operation::new("reconcile"), MAX_DEADLINE_MILLIS)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

impl Expiry {
    /// An engine over `store` and `target`, giving unlabelled sandboxes `default_timeout` at
    /// reconcile, on the system clock.
    pub fn new(
        store: Arc<dyn DeadlineStore>,
        target: Arc<dyn ExpiryTarget>,
        default_timeout: Duration,
    ) -> Self {
        Expiry {
            store,
            target,
            default_timeout,
            clock: Arc::new(SystemClock),
        }
    }

    /// The same engine reading time from `clock` in [`Expiry::spawn`].
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// `now + default timeout`, within the range a store keeps.
    fn default_deadline(&self, now: OffsetDateTime) -> OffsetDateTime {
        time::Duration::try_from(self.default_timeout)
            .ok()
            .and_then(|d| now.checked_add(d))
            .map_or_else(end_of_range, |at| at.min(end_of_range()))
    }

    /// Gives every live sandbox without a readable stored deadline `max(label, now + default
    /// timeout)`, logging each, and removes the due deadlines of sandboxes that are not live.
    /// Fails when the target cannot list or the store is unreachable (`unavailable`,
    /// `timeout`): nothing is decided on a store that did not answer. A stored value the store
    /// cannot read (a corrupt Redis score) is replaced like a missing one; a key the store
    /// refuses is reported in [`ReconcileReport::failed`].
    pub async fn reconcile(&self, now: OffsetDateTime) -> Result<ReconcileReport, Error> {
        let mut report = ReconcileReport::default();
        let live = self.target.live().await?;
        let default = self.default_deadline(now);
        for (key, label) in &live {
            let unreadable = match self.store.deadline(key).await {
                Ok(Some(_)) => {
                    report.kept += 1;
                    continue;
                }
                Ok(None) => None,
                Err(e) if is_outage(&e) => return Err(e),
                Err(e) => Some(e),
            };
            let deadline = label.map_or(default, |label| label.max(default));
            match self.store.set_deadline(key, deadline).await {
                Ok(()) => {
                    tracing::warn!(
                        key = %key,
                        label = ?label.map(|l| l.to_string()),
                        now_plus_default = %default,
                        deadline = %deadline,
                        read_error = ?unreadable.as_ref().map(ToString::to_string),
                        "{LOG_ASSIGNED}"
                    );
                    report.assigned.push(Assigned {
                        key: key.clone(),
                        label: *label,
                        deadline,
                    });
                }
                Err(e) if is_outage(&e) => return Err(e),
                Err(e) => report.failed.push((key.clone(), e)),
            }
        }
        let live_keys: std::collections::HashSet<&str> =
            live.iter().map(|(k, _)| k.as_str()).collect();
        let stored = match self.store.due(end_of_range(), usize::MAX).await {
            Ok(stored) => stored,
            Err(e) if is_outage(&e) => return Err(e),
            Err(e) => {
                report.cleanup_error = Some(e);
                Vec::new()
            }
        };
        for (key, deadline) in stored {
            if live_keys.contains(key.as_str()) {
                continue;
            }
            if deadline > now {
                report.left_for_sweep += 1;
                continue;
            }
            match self.store.remove_deadline(&key).await {
                Ok(()) => report.removed.push(key),
                Err(e) => report.failed.push((key, e)),
            }
        }
        Ok(report)
    }

    /// Takes up to [`SWEEP_BATCH`] due deadlines, earliest first; deletes each sandbox, and
    /// removes its deadline only once the delete succeeded. A failed delete keeps the deadline
    /// for the next sweep and is reported; only a store that cannot answer `due` fails the call.
    pub async fn sweep_once(&self, now: OffsetDateTime) -> Result<SweepReport, Error> {
        let due = self.store.due(now, SWEEP_BATCH).await?;
        let mut report = SweepReport {
            batch_full: due.len() >= SWEEP_BATCH,
            ..SweepReport::default()
        };
        for (key, _) in due {
            // Read again just before the kill: a deadline extended since the batch was read
            // must not be killed at its old time. (A set landing between this read and the
            // delete still loses; the port has no conditional remove to close that.)
            let deadline = match self.store.deadline(&key).await {
                Ok(Some(deadline)) if deadline <= now => deadline,
                Ok(_) => {
                    report.moved.push(key);
                    continue;
                }
                Err(e) => {
                    report.failed.push((key, e));
                    continue;
                }
            };
            let expired = match self.target.expire(&key).await {
                Ok(expired) => expired,
                Err(e) => {
                    report.failed.push((key, e));
                    continue;
                }
            };
            if let Err(e) = self.store.remove_deadline(&key).await {
                report.failed.push((key, e));
                continue;
            }
            let lag = Duration::try_from(now - deadline).unwrap_or(Duration::ZERO);
            let done = Kill { key, deadline, lag };
            match expired {
                Expired::Killed => report.killed.push(done),
                Expired::Paused => report.paused.push(done),
            }
        }
        Ok(report)
    }

    /// Runs the engine until `shutdown` completes: reconcile once (retried with backoff from
    /// [`RECONCILE_RETRY_MIN`] to [`RECONCILE_RETRY_MAX`] while it fails), then a sweep every
    /// [`SWEEP_INTERVAL`] (at once again after a full batch). Every kill is logged with its lag,
    /// every failure as a warning.
    pub fn spawn(
        self: Arc<Self>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut shutdown = std::pin::pin!(shutdown);
            let mut retry = RECONCILE_RETRY_MIN;
            loop {
                tokio::select! {
                    () = &mut shutdown => return,
                    result = self.reconcile(self.clock.now()) => match result {
                        Ok(report) => {
                            log_reconcile(&report);
                            break;
                        }
                        Err(e) => tracing::warn!(
                            error = %e,
                            retry_ms = retry.as_millis(),
                            "e2b expiry: reconcile failed; trying again"
                        ),
                    },
                }
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(RECONCILE_RETRY_MAX);
            }
            let mut ticks = tokio::time::interval(SWEEP_INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut again = false;
            loop {
                if !again {
                    tokio::select! {
                        () = &mut shutdown => return,
                        _ = ticks.tick() => {}
                    }
                }
                tokio::select! {
                    () = &mut shutdown => return,
                    result = self.sweep_once(self.clock.now()) => match result {
                        Ok(report) => {
                            log_sweep(&report);
                            again = report.batch_full && report.failed.is_empty();
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "e2b expiry: sweep failed");
                            again = false;
                        }
                    },
                }
            }
        })
    }
}

/// A store or target that did not answer: worth retrying as a whole, never a verdict on one key.
fn is_outage(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Timeout)
}

fn log_reconcile(report: &ReconcileReport) {
    tracing::info!(
        kept = report.kept,
        assigned = report.assigned.len(),
        removed = report.removed.len(),
        left_for_sweep = report.left_for_sweep,
        failed = report.failed.len(),
        "e2b expiry: reconciled the stored deadlines with the live sandboxes"
    );
    if let Some(e) = &report.cleanup_error {
        tracing::warn!(error = %e, "e2b expiry: could not list the stored deadlines to clean up gone sandboxes");
    }
    for (key, e) in &report.failed {
        tracing::warn!(key = %key, error = %e, "e2b expiry: reconcile could not handle a sandbox");
    }
}

fn log_sweep(report: &SweepReport) {
    for kill in &report.killed {
        tracing::info!(
            key = %kill.key,
            deadline = %kill.deadline,
            lag_ms = kill.lag.as_millis(),
            "e2b expiry: killed a sandbox past its deadline"
        );
    }
    for pause in &report.paused {
        tracing::info!(
            key = %pause.key,
            deadline = %pause.deadline,
            lag_ms = pause.lag.as_millis(),
            "e2b expiry: paused a sandbox at its deadline (its create asked for that); it has no deadline now"
        );
    }
    for (key, e) in &report.failed {
        tracing::warn!(key = %key, error = %e, "e2b expiry: could not kill a sandbox; kept its deadline for the next sweep");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex;

    use sandbox_core::{ManualClock, Origin};
    use sandbox_testkit::MemoryDeadlines;

    use super::*;
    use crate::e2b::deadlines::FileDeadlines;

    const DEFAULT: Duration = Duration::from_secs(300);

    fn t0() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }
    fn secs(n: i64) -> time::Duration {
        time::Duration::seconds(n)
    }

    /// Sandboxes in memory: each delete is recorded, and keys can be made to fail.
    #[derive(Debug, Default)]
    struct FakeTarget {
        live: Mutex<BTreeMap<String, Option<OffsetDateTime>>>,
        deleted: Mutex<Vec<String>>,
        expire_fails: Mutex<BTreeSet<String>>,
        live_failures_left: Mutex<usize>,
        /// Keys that pause at their timeout instead of dying (then no longer live: paused).
        pauses: Mutex<BTreeSet<String>>,
        paused: Mutex<Vec<String>>,
    }

    impl FakeTarget {
        fn with(sandboxes: &[(&str, Option<OffsetDateTime>)]) -> Arc<Self> {
            let t = FakeTarget::default();
            for (k, label) in sandboxes {
                t.live.lock().unwrap().insert((*k).to_owned(), *label);
            }
            Arc::new(t)
        }
        fn deleted(&self) -> Vec<String> {
            self.deleted.lock().unwrap().clone()
        }
        fn is_live(&self, key: &str) -> bool {
            self.live.lock().unwrap().contains_key(key)
        }
    }

    #[async_trait]
    impl ExpiryTarget for FakeTarget {
        async fn expire(&self, key: &str) -> Result<Expired, Error> {
            if self.expire_fails.lock().unwrap().contains(key) {
                return Err(Error::unavailable(Operation::DELETE, "engine down"));
            }
            // Give another sweep a chance to race this one.
            tokio::task::yield_now().await;
            if self.pauses.lock().unwrap().contains(key) {
                if self.live.lock().unwrap().remove(key).is_some() {
                    self.paused.lock().unwrap().push(key.to_owned());
                }
                return Ok(Expired::Paused);
            }
            if self.live.lock().unwrap().remove(key).is_some() {
                self.deleted.lock().unwrap().push(key.to_owned());
            }
            Ok(Expired::Killed)
        }
        async fn live(&self) -> Result<Vec<(String, Option<OffsetDateTime>)>, Error> {
            {
                let mut left = self.live_failures_left.lock().unwrap();
                if *left > 0 {
                    *left -= 1;
                    return Err(Error::unavailable(Operation::LIST, "engine down"));
                }
            }
            Ok(self
                .live
                .lock()
                .unwrap()
                .iter()
                .map(|(k, l)| (k.clone(), *l))
                .collect())
        }
    }

    /// Both stores, each fresh: the memory store and the file store in a temporary directory
    /// (returned so it outlives the test).
    async fn stores() -> Vec<(&'static str, Arc<dyn DeadlineStore>, tempfile::TempDir)> {
        let dir = tempfile::tempdir().unwrap();
        let file = FileDeadlines::open(dir.path()).await.unwrap();
        vec![
            (
                "memory",
                Arc::new(MemoryDeadlines::new()) as Arc<dyn DeadlineStore>,
                tempfile::tempdir().unwrap(),
            ),
            ("file", Arc::new(file), dir),
        ]
    }

    #[tokio::test]
    async fn an_expired_sandbox_is_killed_with_its_lag_and_a_later_one_kept() {
        for (name, store, _dir) in stores().await {
            let target = FakeTarget::with(&[("iold", None), ("inew", None)]);
            store.set_deadline("iold", t0()).await.unwrap();
            store.set_deadline("inew", t0() + secs(3600)).await.unwrap();
            let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
            let report = expiry.sweep_once(t0() + secs(5)).await.unwrap();
            assert_eq!(
                report.killed,
                vec![Kill {
                    key: "iold".to_owned(),
                    deadline: t0(),
                    lag: Duration::from_secs(5)
                }],
                "{name}"
            );
            assert!(report.failed.is_empty() && !report.batch_full, "{name}");
            assert_eq!(target.deleted(), vec!["iold"], "{name}");
            assert!(target.is_live("inew"), "{name}");
            assert_eq!(store.deadline("iold").await.unwrap(), None, "{name}");
            assert_eq!(
                store.deadline("inew").await.unwrap(),
                Some(t0() + secs(3600)),
                "{name}"
            );
            // Nothing more is due a second later.
            let again = expiry.sweep_once(t0() + secs(6)).await.unwrap();
            assert!(again.killed.is_empty(), "{name}");
        }
    }

    #[tokio::test]
    async fn an_extended_deadline_is_not_killed_at_the_old_time() {
        for (name, store, _dir) in stores().await {
            let target = FakeTarget::with(&[("ia", None)]);
            store.set_deadline("ia", t0()).await.unwrap();
            store.set_deadline("ia", t0() + secs(60)).await.unwrap();
            let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
            assert!(
                expiry
                    .sweep_once(t0() + secs(10))
                    .await
                    .unwrap()
                    .killed
                    .is_empty(),
                "{name}"
            );
            assert!(target.is_live("ia"), "{name}");
            let report = expiry.sweep_once(t0() + secs(61)).await.unwrap();
            assert_eq!(report.killed.len(), 1, "{name}");
            assert_eq!(report.killed[0].lag, Duration::from_secs(1), "{name}");
            assert_eq!(target.deleted(), vec!["ia"], "{name}");
        }
    }

    #[tokio::test]
    async fn a_failing_target_keeps_the_deadline_for_the_next_sweep() {
        for (name, store, _dir) in stores().await {
            let target = FakeTarget::with(&[("ibad", None), ("igood", None)]);
            target
                .expire_fails
                .lock()
                .unwrap()
                .insert("ibad".to_owned());
            store.set_deadline("ibad", t0()).await.unwrap();
            store.set_deadline("igood", t0()).await.unwrap();
            let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
            let report = expiry.sweep_once(t0() + secs(1)).await.unwrap();
            assert_eq!(report.killed.len(), 1, "{name}");
            assert_eq!(report.killed[0].key, "igood", "{name}");
            assert_eq!(report.failed.len(), 1, "{name}");
            assert_eq!(report.failed[0].0, "ibad", "{name}");
            assert_eq!(report.failed[0].1.kind(), ErrorKind::Unavailable, "{name}");
            assert_eq!(store.deadline("ibad").await.unwrap(), Some(t0()), "{name}");
            // The engine is back: the next sweep kills it, with the lag since its deadline.
            target.expire_fails.lock().unwrap().clear();
            let report = expiry.sweep_once(t0() + secs(2)).await.unwrap();
            assert_eq!(report.killed.len(), 1, "{name}");
            assert_eq!(report.killed[0].lag, Duration::from_secs(2), "{name}");
            assert_eq!(target.deleted(), vec!["igood", "ibad"], "{name}");
            assert_eq!(store.deadline("ibad").await.unwrap(), None, "{name}");
        }
    }

    #[tokio::test]
    async fn reconcile_gives_max_of_label_and_now_plus_default_never_earlier() {
        for (name, store, _dir) in stores().await {
            let now = t0();
            let target = FakeTarget::with(&[
                // A label later than now + default: the label wins.
                ("ilate", Some(now + secs(3600))),
                // A label earlier than now + default: the default wins.
                ("isoon", Some(now + secs(60))),
                // A label in the past (the service was down past it): now + default.
                ("ipast", Some(now - secs(3600))),
                ("inolabel", None),
                // A stored deadline is kept as it is, even an earlier one (a set-timeout).
                ("istored", Some(now + secs(3600))),
            ]);
            store.set_deadline("istored", now + secs(30)).await.unwrap();
            let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
            let report = expiry.reconcile(now).await.unwrap();
            assert_eq!(report.kept, 1, "{name}");
            assert!(report.failed.is_empty(), "{name}");
            let default = now + secs(300);
            let mut assigned: Vec<(String, OffsetDateTime)> = report
                .assigned
                .iter()
                .map(|a| (a.key.clone(), a.deadline))
                .collect();
            assigned.sort();
            assert_eq!(
                assigned,
                vec![
                    ("ilate".to_owned(), now + secs(3600)),
                    ("inolabel".to_owned(), default),
                    ("ipast".to_owned(), default),
                    ("isoon".to_owned(), default),
                ],
                "{name}"
            );
            for a in &report.assigned {
                assert!(a.deadline >= default, "{name}: {a:?}");
                assert!(a.label.is_none_or(|l| a.deadline >= l), "{name}: {a:?}");
                assert_eq!(store.deadline(&a.key).await.unwrap(), Some(a.deadline));
            }
            assert_eq!(
                store.deadline("istored").await.unwrap(),
                Some(now + secs(30)),
                "{name}"
            );
            // Never killed early: a second before now + default only the stored one is due.
            let early = expiry.sweep_once(default - secs(1)).await.unwrap();
            let killed: Vec<&str> = early.killed.iter().map(|k| k.key.as_str()).collect();
            assert_eq!(killed, vec!["istored"], "{name}");
            let at_default = expiry.sweep_once(default).await.unwrap();
            let mut killed: Vec<&str> = at_default.killed.iter().map(|k| k.key.as_str()).collect();
            killed.sort_unstable();
            assert_eq!(killed, vec!["inolabel", "ipast", "isoon"], "{name}");
            assert!(target.is_live("ilate"), "{name}");
            // A second reconcile changes nothing.
            let again = expiry.reconcile(now + secs(400)).await.unwrap();
            assert_eq!((again.kept, again.assigned.len()), (1, 0), "{name}");
        }
    }

    #[tokio::test]
    async fn reconcile_removes_due_deadlines_of_gone_sandboxes_only() {
        for (name, store, _dir) in stores().await {
            let now = t0();
            let target = FakeTarget::with(&[("ilive", None)]);
            store.set_deadline("ilive", now + secs(10)).await.unwrap();
            store.set_deadline("igone", now - secs(10)).await.unwrap();
            // Possibly a create in flight: its deadline is written, its sandbox not listed yet.
            store
                .set_deadline("iinflight", now + secs(300))
                .await
                .unwrap();
            let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
            let report = expiry.reconcile(now).await.unwrap();
            assert_eq!(report.removed, vec!["igone"], "{name}");
            assert_eq!(report.left_for_sweep, 1, "{name}");
            assert_eq!(store.deadline("igone").await.unwrap(), None, "{name}");
            assert_eq!(
                store.deadline("iinflight").await.unwrap(),
                Some(now + secs(300)),
                "{name}"
            );
            // When it comes due and its sandbox is still absent, a sweep clears it.
            let report = expiry.sweep_once(now + secs(300)).await.unwrap();
            let mut killed: Vec<&str> = report.killed.iter().map(|k| k.key.as_str()).collect();
            killed.sort_unstable();
            assert_eq!(killed, vec!["iinflight", "ilive"], "{name}");
            assert_eq!(
                store.due(now + secs(1000), 10).await.unwrap(),
                vec![],
                "{name}"
            );
        }
    }

    #[tokio::test]
    async fn a_failing_store_or_listing_fails_reconcile_and_a_refused_key_is_reported() {
        let store = Arc::new(MemoryDeadlines::new());
        let target = FakeTarget::with(&[("bad\nkey", None), ("igood", None)]);
        *target.live_failures_left.lock().unwrap() = 1;
        let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
        let err = expiry.reconcile(t0()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        let report = expiry.reconcile(t0()).await.unwrap();
        assert_eq!(report.assigned.len(), 1);
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.failed[0].0, "bad\nkey");
        assert_eq!(report.failed[0].1.origin(), Origin::Store);
    }

    /// A store whose reads of some keys fail: `internal` (an unreadable value) or
    /// `unavailable` (an outage), until the key is written again.
    #[derive(Debug)]
    struct Unreadable {
        inner: MemoryDeadlines,
        broken: Mutex<BTreeMap<String, ErrorKind>>,
    }

    #[async_trait]
    impl DeadlineStore for Unreadable {
        async fn set_deadline(&self, key: &str, at: OffsetDateTime) -> Result<(), Error> {
            self.broken.lock().unwrap().remove(key);
            self.inner.set_deadline(key, at).await
        }
        async fn deadline(&self, key: &str) -> Result<Option<OffsetDateTime>, Error> {
            if let Some(kind) = self.broken.lock().unwrap().get(key) {
                return Err(Error::new(*kind, Operation::new("deadline"), "bad value")
                    .with_origin(Origin::Store));
            }
            self.inner.deadline(key).await
        }
        async fn remove_deadline(&self, key: &str) -> Result<(), Error> {
            self.inner.remove_deadline(key).await
        }
        async fn due(
            &self,
            now: OffsetDateTime,
            limit: usize,
        ) -> Result<Vec<(String, OffsetDateTime)>, Error> {
            if let Some(kind) = self.broken.lock().unwrap().get("*due") {
                return Err(Error::new(*kind, Operation::new("due"), "bad value")
                    .with_origin(Origin::Store));
            }
            self.inner.due(now, limit).await
        }
    }

    /// A store whose `due` lets a set-timeout land right after it read the batch.
    #[derive(Debug)]
    struct ExtendedAfterDue {
        inner: MemoryDeadlines,
        extend: (String, OffsetDateTime),
    }

    #[async_trait]
    impl DeadlineStore for ExtendedAfterDue {
        async fn set_deadline(&self, key: &str, at: OffsetDateTime) -> Result<(), Error> {
            self.inner.set_deadline(key, at).await
        }
        async fn deadline(&self, key: &str) -> Result<Option<OffsetDateTime>, Error> {
            self.inner.deadline(key).await
        }
        async fn remove_deadline(&self, key: &str) -> Result<(), Error> {
            self.inner.remove_deadline(key).await
        }
        async fn due(
            &self,
            now: OffsetDateTime,
            limit: usize,
        ) -> Result<Vec<(String, OffsetDateTime)>, Error> {
            let due = self.inner.due(now, limit).await?;
            let (key, at) = &self.extend;
            self.inner.set_deadline(key, *at).await?;
            Ok(due)
        }
    }

    #[tokio::test]
    async fn a_deadline_extended_after_the_batch_was_read_is_not_killed() {
        let store = Arc::new(ExtendedAfterDue {
            inner: MemoryDeadlines::new(),
            extend: ("iextended".to_owned(), t0() + secs(600)),
        });
        store.inner.set_deadline("iextended", t0()).await.unwrap();
        store.inner.set_deadline("iexpired", t0()).await.unwrap();
        store.inner.set_deadline("igone", t0()).await.unwrap();
        let target = FakeTarget::with(&[("iextended", None), ("iexpired", None)]);
        let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
        let report = expiry.sweep_once(t0() + secs(1)).await.unwrap();
        let killed: Vec<&str> = report.killed.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(killed, vec!["iexpired", "igone"]);
        assert_eq!(report.moved, vec!["iextended"]);
        assert!(target.is_live("iextended"));
        assert_eq!(
            store.inner.deadline("iextended").await.unwrap(),
            Some(t0() + secs(600))
        );
    }

    #[tokio::test]
    async fn an_unreadable_deadline_is_replaced_and_an_outage_fails_reconcile() {
        let store = Arc::new(Unreadable {
            inner: MemoryDeadlines::new(),
            broken: Mutex::new(BTreeMap::new()),
        });
        store.inner.set_deadline("icorrupt", t0()).await.unwrap();
        store
            .broken
            .lock()
            .unwrap()
            .insert("icorrupt".to_owned(), ErrorKind::Internal);
        let target = FakeTarget::with(&[("icorrupt", Some(t0() + secs(3600)))]);
        let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
        let report = expiry.reconcile(t0()).await.unwrap();
        assert_eq!(
            report.assigned,
            vec![Assigned {
                key: "icorrupt".to_owned(),
                label: Some(t0() + secs(3600)),
                deadline: t0() + secs(3600),
            }]
        );
        assert_eq!(
            store.deadline("icorrupt").await.unwrap(),
            Some(t0() + secs(3600))
        );
        // An outage on a read decides nothing: the reconcile fails and writes nothing.
        store
            .broken
            .lock()
            .unwrap()
            .insert("icorrupt".to_owned(), ErrorKind::Unavailable);
        store.inner.remove_deadline("icorrupt").await.unwrap();
        let err = expiry.reconcile(t0()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert_eq!(store.inner.deadline("icorrupt").await.unwrap(), None);
        // A listing that cannot be read stops only the clean-up: the live sandbox still gets
        // its deadline.
        let mut broken = store.broken.lock().unwrap().clone();
        broken.clear();
        broken.insert("*due".to_owned(), ErrorKind::Internal);
        *store.broken.lock().unwrap() = broken;
        let report = expiry.reconcile(t0()).await.unwrap();
        assert_eq!(report.assigned.len(), 1);
        assert_eq!(
            report.cleanup_error.map(|e| e.kind()),
            Some(ErrorKind::Internal)
        );
        assert_eq!(
            store.inner.deadline("icorrupt").await.unwrap(),
            Some(t0() + secs(3600))
        );
        // An outage of the listing fails the reconcile.
        store
            .broken
            .lock()
            .unwrap()
            .insert("*due".to_owned(), ErrorKind::Timeout);
        assert_eq!(
            expiry.reconcile(t0()).await.unwrap_err().kind(),
            ErrorKind::Timeout
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_replicas_over_one_store_kill_each_sandbox_once() {
        for (name, store, _dir) in stores().await {
            let keys: Vec<String> = (0..40).map(|n| format!("i{n:03}")).collect();
            let sandboxes: Vec<(&str, Option<OffsetDateTime>)> =
                keys.iter().map(|k| (k.as_str(), None)).collect();
            let target = FakeTarget::with(&sandboxes);
            for (n, key) in keys.iter().enumerate() {
                store
                    .set_deadline(key, t0() + secs(i64::try_from(n).unwrap()))
                    .await
                    .unwrap();
            }
            let a = Expiry::new(store.clone(), target.clone(), DEFAULT);
            let b = Expiry::new(store.clone(), target.clone(), DEFAULT);
            let now = t0() + secs(100);
            let (ra, rb) = tokio::join!(a.sweep_once(now), b.sweep_once(now));
            let (ra, rb) = (ra.unwrap(), rb.unwrap());
            assert!(ra.failed.is_empty() && rb.failed.is_empty(), "{name}");
            let mut deleted = target.deleted();
            deleted.sort();
            assert_eq!(deleted, keys, "{name}: each sandbox deleted exactly once");
            let reported: BTreeSet<&str> = ra
                .killed
                .iter()
                .chain(&rb.killed)
                .map(|k| k.key.as_str())
                .collect();
            assert_eq!(reported.len(), keys.len(), "{name}");
            assert_eq!(store.due(now, 100).await.unwrap(), vec![], "{name}");
        }
    }

    /// After a restart (a reopened file store and a new engine), an expired sandbox is killed
    /// and an extended deadline holds.
    #[tokio::test]
    async fn deadlines_survive_a_restart_of_the_file_store() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = FileDeadlines::open(dir.path()).await.unwrap();
            store.set_deadline("iexpired", t0()).await.unwrap();
            store.set_deadline("iextended", t0()).await.unwrap();
            store
                .set_deadline("iextended", t0() + secs(600))
                .await
                .unwrap();
        }
        let store: Arc<dyn DeadlineStore> =
            Arc::new(FileDeadlines::open(dir.path()).await.unwrap());
        // Both sandboxes carry their create-time label t0.
        let target = FakeTarget::with(&[("iexpired", Some(t0())), ("iextended", Some(t0()))]);
        let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
        let now = t0() + secs(30);
        let report = expiry.reconcile(now).await.unwrap();
        assert_eq!((report.kept, report.assigned.len()), (2, 0));
        let report = expiry.sweep_once(now).await.unwrap();
        assert_eq!(report.killed.len(), 1);
        assert_eq!(report.killed[0].key, "iexpired");
        assert_eq!(report.killed[0].lag, Duration::from_secs(30));
        assert!(target.is_live("iextended"));
        let report = expiry.sweep_once(t0() + secs(600)).await.unwrap();
        assert_eq!(report.killed.len(), 1);
        assert_eq!(report.killed[0].key, "iextended");
    }

    #[tokio::test]
    async fn a_sandbox_that_pauses_at_its_timeout_is_paused_and_loses_its_deadline() {
        for (name, store, _dir) in stores().await {
            let target = FakeTarget::with(&[("ipause", Some(t0())), ("ikill", Some(t0()))]);
            target.pauses.lock().unwrap().insert("ipause".to_owned());
            store.set_deadline("ipause", t0()).await.unwrap();
            store.set_deadline("ikill", t0()).await.unwrap();
            let expiry = Expiry::new(store.clone(), target.clone(), DEFAULT);
            let report = expiry.sweep_once(t0() + secs(2)).await.unwrap();
            let keys = |v: &[Kill]| v.iter().map(|k| k.key.clone()).collect::<Vec<_>>();
            assert_eq!(keys(&report.paused), vec!["ipause"], "{name}");
            assert_eq!(keys(&report.killed), vec!["ikill"], "{name}");
            assert_eq!(report.paused[0].lag, Duration::from_secs(2), "{name}");
            assert_eq!(*target.paused.lock().unwrap(), vec!["ipause"], "{name}");
            assert_eq!(target.deleted(), vec!["ikill"], "{name}");
            assert_eq!(
                store.deadline("ipause").await.unwrap(),
                None,
                "{name}: a paused sandbox has no deadline"
            );
            // Paused, it is not live: a reconcile (a restart) gives it none back.
            let report = expiry.reconcile(t0() + secs(3)).await.unwrap();
            assert!(report.assigned.is_empty(), "{name}: {report:?}");
            assert_eq!(store.deadline("ipause").await.unwrap(), None, "{name}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_spawned_engine_retries_reconcile_then_sweeps_until_shutdown() {
        let store = Arc::new(MemoryDeadlines::new());
        let clock = ManualClock::new(t0());
        // No label and no stored deadline: reconcile gives it t0 + 300 s.
        let target = FakeTarget::with(&[("iunlabelled", None), ("idue", None)]);
        store.set_deadline("idue", t0() - secs(1)).await.unwrap();
        *target.live_failures_left.lock().unwrap() = 2;
        let expiry = Arc::new(
            Expiry::new(store.clone(), target.clone(), DEFAULT).with_clock(Arc::new(clock.clone())),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = expiry.spawn(async move {
            let _ = stopped.await;
        });
        let wait_for = |what: &'static str, done: Box<dyn Fn() -> bool + Send>| async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while !done() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "timed out waiting: {what}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let t = target.clone();
        wait_for(
            "the due sandbox killed",
            Box::new(move || !t.is_live("idue")),
        )
        .await;
        assert_eq!(
            store.deadline("iunlabelled").await.unwrap(),
            Some(t0() + secs(300)),
            "reconcile ran (after two failed listings) before the sweeps"
        );
        assert!(target.is_live("iunlabelled"));
        clock.advance(Duration::from_secs(300));
        let t = target.clone();
        wait_for(
            "the unlabelled sandbox killed at its given deadline",
            Box::new(move || !t.is_live("iunlabelled")),
        )
        .await;
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("the engine stops at shutdown")
            .unwrap();
        assert_eq!(target.deleted(), vec!["idue", "iunlabelled"]);
    }
}
