//! The deadline-store suite on the in-memory store, and proof that it checks
//! something: each planted defect (a wrapper around that store that breaks one
//! promise) is caught by the case guarding that promise.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::Arc;

use async_trait::async_trait;
use sandbox_core::{DeadlineStore, Error, Origin};
use sandbox_testkit::MemoryDeadlines;
use sandbox_testkit::conformance::deadlines::{
    DeadlineFeatures, DeadlineTarget, check_deadline_store, find_deadline_case, run_deadline_case,
};
use time::OffsetDateTime;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_passes_on_the_memory_store() {
    check_deadline_store(
        DeadlineFeatures::NONE,
        Arc::new(|_ns| {
            Box::pin(async { Ok(DeadlineTarget::new(Arc::new(MemoryDeadlines::new()))) })
        }),
    )
    .await
    .unwrap();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defect {
    /// `due` in key order, not deadline order.
    DueByKey,
    /// `due` ignores its limit.
    DueUnbounded,
    /// A deadline equal to `now` is not due.
    DueStrict,
    /// The first set wins; later sets change nothing.
    FirstSetWins,
    /// Stores the deadline rounded down (a sandbox could be killed early).
    RoundsDown,
    /// Removing a key without a deadline is an error.
    RemoveAbsentFails,
    /// Keys are folded to lower case.
    CaseInsensitive,
    /// Keys are not validated.
    NoKeyCheck,
    /// Errors say nothing about their origin.
    NoOrigin,
    /// A set reads the whole map, yields, then writes it back: concurrent sets are lost.
    LostUpdates,
    /// `due` stops a decade ahead: everything later counts as due.
    FarIsDue,
    /// Reopening forgets everything (a store that is not durable claiming it is).
    ForgetsOnReopen,
}

#[derive(Debug)]
struct Defective {
    inner: MemoryDeadlines,
    defect: Defect,
}

const DECADE_MS: i64 = 3_653 * 86_400_000;

#[async_trait]
impl DeadlineStore for Defective {
    async fn set_deadline(&self, key: &str, at: OffsetDateTime) -> Result<(), Error> {
        let key = self.key(key);
        match self.defect {
            Defect::FirstSetWins if self.inner.deadline(&key).await?.is_some() => Ok(()),
            Defect::RoundsDown => {
                let nanos = at.unix_timestamp_nanos();
                let floored =
                    OffsetDateTime::from_unix_timestamp_nanos(nanos - nanos.rem_euclid(1_000_000))
                        .unwrap_or(at);
                self.inner.set_deadline(&key, floored).await
            }
            Defect::NoKeyCheck if sandbox_core::check_deadline_key(OP, &key).is_err() => Ok(()),
            Defect::LostUpdates => {
                // A whole-state rewrite without a lock: read, yield, write back.
                let snapshot = self.inner.due(far_end(), usize::MAX).await?;
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                let fresh = MemoryDeadlines::new();
                for (k, at) in snapshot {
                    fresh.set_deadline(&k, at).await?;
                }
                fresh.set_deadline(&key, at).await?;
                // Replace the shared map's contents with the (possibly stale) snapshot.
                for (k, _) in self.inner.due(far_end(), usize::MAX).await? {
                    self.inner.remove_deadline(&k).await?;
                }
                for (k, at) in fresh.due(far_end(), usize::MAX).await? {
                    self.inner.set_deadline(&k, at).await?;
                }
                Ok(())
            }
            _ => self.relabel(self.inner.set_deadline(&key, at).await),
        }
    }

    async fn deadline(&self, key: &str) -> Result<Option<OffsetDateTime>, Error> {
        let key = self.key(key);
        if self.defect == Defect::NoKeyCheck && sandbox_core::check_deadline_key(OP, &key).is_err()
        {
            return Ok(None);
        }
        self.relabel(self.inner.deadline(&key).await)
    }

    async fn remove_deadline(&self, key: &str) -> Result<(), Error> {
        let key = self.key(key);
        if self.defect == Defect::NoKeyCheck && sandbox_core::check_deadline_key(OP, &key).is_err()
        {
            return Ok(());
        }
        if self.defect == Defect::RemoveAbsentFails && self.inner.deadline(&key).await?.is_none() {
            return Err(Error::not_found(OP, "no deadline").with_origin(Origin::Store));
        }
        self.relabel(self.inner.remove_deadline(&key).await)
    }

    async fn due(
        &self,
        now: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<(String, OffsetDateTime)>, Error> {
        let mut due = match self.defect {
            Defect::DueUnbounded => self.inner.due(now, usize::MAX).await?,
            Defect::DueStrict => self
                .inner
                .due(now, usize::MAX)
                .await?
                .into_iter()
                .filter(|(_, at)| *at < now)
                .take(limit)
                .collect(),
            Defect::FarIsDue => {
                let all = self.inner.due(far_end(), usize::MAX).await?;
                all.into_iter()
                    .filter(|(_, at)| {
                        *at <= now || (*at - now).whole_milliseconds() > i128::from(DECADE_MS)
                    })
                    .take(limit)
                    .collect()
            }
            _ => self.inner.due(now, limit).await?,
        };
        if self.defect == Defect::DueByKey {
            due.sort_by(|a, b| a.0.cmp(&b.0));
        }
        Ok(due)
    }
}

const OP: sandbox_core::Operation = sandbox_core::Operation::new("set_deadline");

fn far_end() -> OffsetDateTime {
    sandbox_core::deadline_from_millis(OP, sandbox_core::MAX_DEADLINE_MILLIS).unwrap()
}

impl Defective {
    fn key(&self, key: &str) -> String {
        if self.defect == Defect::CaseInsensitive {
            key.to_lowercase()
        } else {
            key.to_owned()
        }
    }
    fn relabel<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        if self.defect == Defect::NoOrigin {
            r.map_err(|e| e.with_origin(Origin::Unspecified))
        } else {
            r
        }
    }
}

fn target(defect: Defect) -> DeadlineTarget {
    let inner = MemoryDeadlines::new();
    let store = Arc::new(Defective {
        inner: inner.clone(),
        defect,
    });
    if defect == Defect::ForgetsOnReopen {
        return DeadlineTarget::new(store).with_reopen(Arc::new(|| {
            Box::pin(async { Ok(Arc::new(MemoryDeadlines::new()) as Arc<dyn DeadlineStore>) })
        }));
    }
    DeadlineTarget::new(store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_planted_defect_is_caught_by_its_case() {
    let table = [
        (Defect::DueByKey, "deadlines_due_exactly_earliest_first"),
        (Defect::DueUnbounded, "deadlines_due_respects_limit"),
        (Defect::DueStrict, "deadlines_due_exactly_earliest_first"),
        (Defect::FirstSetWins, "deadlines_set_get_replace"),
        (Defect::RoundsDown, "deadlines_set_get_replace"),
        (Defect::RemoveAbsentFails, "deadlines_remove_absent_is_ok"),
        (Defect::CaseInsensitive, "deadlines_keys_are_independent"),
        (Defect::NoKeyCheck, "deadlines_invalid_keys_are_refused"),
        (Defect::NoOrigin, "deadlines_invalid_keys_are_refused"),
        (Defect::LostUpdates, "deadlines_concurrent_sets_all_land"),
        (Defect::FarIsDue, "deadlines_far_future_is_not_due"),
        (Defect::ForgetsOnReopen, "deadlines_durable_across_reopen"),
    ];
    for (defect, name) in table {
        let case = find_deadline_case(name).unwrap_or_else(|| panic!("no case {name}"));
        let result = run_deadline_case(&case, target(defect), fastrand::u64(..)).await;
        assert!(
            result.is_err(),
            "{name} passed a store with defect {defect:?}"
        );
        // The same case passes on the honest store, so the defect is what it caught.
        let honest = DeadlineTarget::new(Arc::new(MemoryDeadlines::new()));
        let honest = if defect == Defect::ForgetsOnReopen {
            let shared = MemoryDeadlines::new();
            let reopened = shared.clone();
            DeadlineTarget::new(Arc::new(shared)).with_reopen(Arc::new(move || {
                let reopened = reopened.clone();
                Box::pin(async move { Ok(Arc::new(reopened) as Arc<dyn DeadlineStore>) })
            }))
        } else {
            honest
        };
        run_deadline_case(&case, honest, fastrand::u64(..))
            .await
            .unwrap_or_else(|f| panic!("{name} fails the honest store: {f}"));
    }
}

#[test]
fn the_describe_document_lists_every_case_with_its_cites() {
    let doc = sandbox_testkit::conformance::deadlines::describe("memory", &DeadlineFeatures::NONE);
    let cases = doc["cases"].as_array().unwrap();
    let durable = cases
        .iter()
        .find(|c| c["name"] == "conformance::deadlines_durable_across_reopen")
        .unwrap();
    assert_eq!(durable["applicable"], false);
    assert_eq!(durable["missing"], serde_json::json!(["reopen"]));
    assert!(
        cases
            .iter()
            .filter(|c| c["name"] != "conformance::deadlines_declared_features_match")
            .all(|c| !c["cites"].as_array().unwrap().is_empty())
    );
}
