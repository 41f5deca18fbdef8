//! An in-memory [`DeadlineStore`]: the honest store the suite is proven on, and the memory store of
//! tests that need one (the timeout engine's). It keeps what the port promises and nothing
//! more: no durability (a dropped store forgets everything), so it declares neither `peer` nor
//! `reopen`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use sandbox_core::{
    DeadlineStore, Error, Operation, check_deadline_key, deadline_from_millis, deadline_millis,
    due_cutoff_millis,
};
use time::OffsetDateTime;

/// The in-memory deadline store. Clones share the deadlines.
#[derive(Debug, Clone, Default)]
pub struct MemoryDeadlines {
    deadlines: Arc<Mutex<BTreeMap<String, i64>>>,
}

impl MemoryDeadlines {
    /// An empty store.
    pub fn new() -> Self {
        MemoryDeadlines::default()
    }

    /// How many deadlines it holds.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, i64>> {
        self.deadlines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl DeadlineStore for MemoryDeadlines {
    async fn set_deadline(&self, key: &str, at: OffsetDateTime) -> Result<(), Error> {
        let operation = Operation::new("set_deadline");
        check_deadline_key(operation, key)?;
        let ms = deadline_millis(operation, at)?;
        self.map().insert(key.to_owned(), ms);
        Ok(())
    }

    async fn deadline(&self, key: &str) -> Result<Option<OffsetDateTime>, Error> {
        let operation = Operation::new("deadline");
        check_deadline_key(operation, key)?;
        let ms = self.map().get(key).copied();
        ms.map(|ms| deadline_from_millis(operation, ms)).transpose()
    }

    async fn remove_deadline(&self, key: &str) -> Result<(), Error> {
        check_deadline_key(Operation::new("remove_deadline"), key)?;
        self.map().remove(key);
        Ok(())
    }

    async fn due(
        &self,
        now: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<(String, OffsetDateTime)>, Error> {
        let operation = Operation::new("due");
        let cutoff = due_cutoff_millis(now);
        let mut due: Vec<(i64, String)> = self
            .map()
            .iter()
            .filter(|(_, ms)| **ms <= cutoff)
            .map(|(k, ms)| (*ms, k.clone()))
            .collect();
        due.sort();
        due.into_iter()
            .take(limit)
            .map(|(ms, k)| Ok((k, deadline_from_millis(operation, ms)?)))
            .collect()
    }
}
