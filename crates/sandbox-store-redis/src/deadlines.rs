//! [`RedisDeadlines`]: the deadline store of a service on Redis (issue 18), shared by every
//! replica: one sorted set per namespace ([`keys::deadlines_key`]), member the key (an E2B
//! sandbox ID), score the deadline in whole Unix milliseconds (an `f64` holds them exactly).
//!
//! `ZADD` sets or replaces, `ZSCORE` reads, `ZREM` removes (absent is `Ok`), and `due` is one
//! `ZRANGEBYSCORE -inf <now> WITHSCORES LIMIT 0 <limit>`, whose order (score, then member
//! byte-wise) is exactly the port's. A deadline is written when Redis acknowledged it; it
//! survives a restart of the service, and a restart of Redis as far as the server's persistence
//! is configured to.
//!
//! Errors are the binding store's: every one has origin `store`, an outage is
//! `unavailable`/`timeout`, and a score no store wrote is an error, never "no deadline".

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use fred::interfaces::SortedSetsInterface;
use fred::types::Value;
use sandbox_core::{
    DeadlineStore, Error, Operation, check_deadline_key, deadline_from_millis, deadline_millis,
    due_cutoff_millis,
};
use time::OffsetDateTime;

use crate::{Inner, RedisBindingStore, RedisStoreConfig, fail, keys, stored};

/// The Redis deadline store. Cheap to clone; clones (and the binding store it was made from)
/// share the client.
#[derive(Clone)]
pub struct RedisDeadlines {
    inner: Arc<Inner>,
    key: String,
}

impl fmt::Debug for RedisDeadlines {
    // Never the credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDeadlines")
            .field("key", &self.key)
            .field("topology", &self.inner.config.topology.kind())
            .finish_non_exhaustive()
    }
}

impl RedisDeadlines {
    /// The deadlines of `store`'s namespace, on its client (no second connection).
    pub fn from_store(store: &RedisBindingStore) -> Self {
        RedisDeadlines {
            key: keys::deadlines_key(&store.inner.ns),
            inner: store.inner.clone(),
        }
    }

    /// Connects as [`RedisBindingStore::connect`] does and uses that client.
    pub async fn connect(config: RedisStoreConfig) -> Result<Self, Error> {
        Ok(RedisDeadlines::from_store(
            &RedisBindingStore::connect(config).await?,
        ))
    }

    /// The sorted set's key (tests plant values through it).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// A stored score as whole milliseconds: anything but an integer in the range a store
    /// writes is an error naming the member.
    fn millis(operation: Operation, member: &str, score: f64) -> Result<i64, Error> {
        // The range check first makes the cast exact (every integer in it is an f64).
        if score.fract() != 0.0
            || !(0.0..=sandbox_core::MAX_DEADLINE_MILLIS as f64).contains(&score)
        {
            return Err(stored(Error::internal(
                operation,
                format!("redis: the deadline of {member:?} is {score}, which no store writes"),
            )));
        }
        Ok(score as i64)
    }
}

#[async_trait]
impl DeadlineStore for RedisDeadlines {
    async fn set_deadline(&self, key: &str, at: OffsetDateTime) -> Result<(), Error> {
        let operation = Operation::new("set_deadline");
        check_deadline_key(operation, key)?;
        // At most MAX_DEADLINE_MILLIS, below 2^53: the cast is exact.
        let score = deadline_millis(operation, at)? as f64;
        let _: i64 = self
            .inner
            .client
            .zadd(&self.key, None, None, false, false, (score, key))
            .await
            .map_err(|e| fail(&self.inner.client, operation, &e))?;
        Ok(())
    }

    async fn deadline(&self, key: &str) -> Result<Option<OffsetDateTime>, Error> {
        let operation = Operation::new("deadline");
        check_deadline_key(operation, key)?;
        let score: Option<f64> = self
            .inner
            .client
            .zscore(&self.key, key)
            .await
            .map_err(|e| fail(&self.inner.client, operation, &e))?;
        score
            .map(|s| deadline_from_millis(operation, Self::millis(operation, key, s)?))
            .transpose()
    }

    async fn remove_deadline(&self, key: &str) -> Result<(), Error> {
        let operation = Operation::new("remove_deadline");
        check_deadline_key(operation, key)?;
        let _: i64 = self
            .inner
            .client
            .zrem(&self.key, key)
            .await
            .map_err(|e| fail(&self.inner.client, operation, &e))?;
        Ok(())
    }

    async fn due(
        &self,
        now: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<(String, OffsetDateTime)>, Error> {
        let operation = Operation::new("due");
        let cutoff = due_cutoff_millis(now);
        if limit == 0 || cutoff < 0 {
            return Ok(Vec::new());
        }
        let count = i64::try_from(limit).unwrap_or(i64::MAX);
        let flat: Vec<Value> = self
            .inner
            .client
            .zrangebyscore(&self.key, "-inf", cutoff, true, Some((0, count)))
            .await
            .map_err(|e| fail(&self.inner.client, operation, &e))?;
        let pairs = flatten(flat);
        if !pairs.len().is_multiple_of(2) {
            return Err(stored(Error::internal(
                operation,
                "redis: ZRANGEBYSCORE WITHSCORES answered an odd number of values",
            )));
        }
        let mut out = Vec::with_capacity(pairs.len() / 2);
        for pair in pairs.chunks(2) {
            let [member, score] = pair else { continue };
            let member = member.as_string().ok_or_else(|| {
                stored(Error::internal(
                    operation,
                    "redis: a deadline member that is not text",
                ))
            })?;
            let score = score.as_f64().ok_or_else(|| {
                stored(Error::internal(
                    operation,
                    format!("redis: the deadline of {member:?} is not a number"),
                ))
            })?;
            let at = deadline_from_millis(operation, Self::millis(operation, &member, score)?)?;
            out.push((member, at));
        }
        Ok(out)
    }
}

/// `WITHSCORES` answers `[member, score, ...]` over RESP2 and `[[member, score], ...]` over
/// RESP3: both as one flat list.
fn flatten(values: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::with_capacity(values.len() * 2);
    for v in values {
        match v {
            Value::Array(inner) => out.extend(inner),
            other => out.push(other),
        }
    }
    out
}
