//! The Redis [`BindingStore`]: the one source of truth for which sandbox belongs to which session
//! when several service replicas share the work. Standalone Redis or Redis Cluster, through
//! fred.
//!
//! - Keys of one session share one hash tag ([`keys`]), so every script runs on one slot.
//! - Bindings are the `sandbox-core` JSON, byte for byte. Conditional writes (compare-and-delete,
//!   the token patch, the stale mark) read the stored bytes, decide in Rust, and swap only if
//!   the bytes are still exactly those (`scripts::Scripts::cas`); a concurrent writer makes
//!   the swap miss and the operation re-reads. So a token patch never erases a concurrent stale
//!   mark, and no Lua JSON re-encoding can corrupt a field (cjson turns integers into floats).
//! - The lifecycle lock is a random token under `SET NX PX`, renewed at a third of its lease;
//!   a failed or refused renewal trips the lock's [`sandbox_core::OwnershipToken`]. Release is compare-and-
//!   delete.
//! - **Fail closed**: every Redis error is returned (kind `unavailable`/`timeout`, origin
//!   [`Origin::Store`]); nothing reads as "unbound" and no lock is granted without Redis.
//! - [`RedisDeadlines`]: the E2B-API sandboxes' deadlines, one sorted set on the same client.
//! - Every error this crate returns is the store's (`[errors.origin]`): each one is made
//!   through `stored`, core's binding validation included, so the service answers
//!   `store_unavailable` for an outage whatever the operation is called.

pub mod config;
mod deadlines;
#[cfg(feature = "failpoints")]
mod failpoints;
pub mod keys;
mod lock;
mod scripts;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::scan::Scanner as _;
use fred::types::{Expiration, SetOptions};
use futures_util::StreamExt as _;
use sandbox_core::{
    ActivityRegistry, BackgroundActivity, Binding, BindingKey, BindingStore, ConfigId, Error,
    ErrorCode, ErrorKind, InvalidationReport, LifecycleLock, Operation, OptimisticReads, Origin,
    Provider, ResolveSnapshot, RewindLock, RewindLocks, SandboxId, Secret, TenantId, TurnLeases,
    TurnState, timefmt,
};
use time::OffsetDateTime;

pub use config::{RedisStoreConfig, TlsSettings, Topology};
pub use deadlines::RedisDeadlines;
use keys::{Namespace, SessionKeys};
use scripts::Scripts;

/// How often a conditional write re-reads after a concurrent writer made its swap miss.
const CAS_ATTEMPTS: usize = 16;

/// Says that `error` is the store's (`[errors.origin]`). Every error this crate makes goes
/// through here, and so does an error of core's it passes on (binding validation).
pub(crate) fn stored(error: Error) -> Error {
    error.with_origin(Origin::Store)
}

/// Maps a fred error raised by `operation` on `client` onto the core taxonomy, once, here. A
/// command that timed out while the client had no connection (it was reconnecting) is
/// `unavailable`: Redis is down, not slow.
pub(crate) fn fail(client: &Client, operation: Operation, e: &fred::error::Error) -> Error {
    let mapped = map_err(operation, e);
    if mapped.kind() == ErrorKind::Timeout && !client.is_connected() {
        return stored(Error::unavailable(
            operation,
            format!("redis is unreachable (reconnecting): {}", e.details()),
        ));
    }
    mapped
}

fn map_err(operation: Operation, e: &fred::error::Error) -> Error {
    use fred::error::ErrorKind as K;
    // rustls reports an untrusted or mismatched server certificate as an I/O error; it is a
    // trust problem to fix in the config, not an outage to wait out.
    if e.details().contains("InvalidCertificate") {
        return stored(Error::new(
            ErrorKind::Authentication,
            operation,
            format!(
                "redis: TLS: the server's certificate is not trusted ({}); check the CA file and the server name",
                e.details()
            ),
        ));
    }
    let kind = match e.kind() {
        K::Timeout => ErrorKind::Timeout,
        K::IO | K::Canceled | K::Routing | K::Cluster | K::Backpressure | K::Sentinel => {
            ErrorKind::Unavailable
        }
        K::Auth => ErrorKind::Authentication,
        K::Config | K::Url => ErrorKind::InvalidRequest,
        _ => ErrorKind::Internal,
    };
    stored(Error::new(
        kind,
        operation,
        format!("redis: {}", e.details()),
    ))
}

fn invalid_binding(why: String) -> Error {
    stored(Error::internal(
        Operation::new("get"),
        format!("stored binding is invalid: {why}"),
    ))
    .with_code(ErrorCode::InvalidBinding)
}

/// The Redis binding store. Cheap to clone; clones share the client.
#[derive(Clone)]
pub struct RedisBindingStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) scripts: Scripts,
    pub(crate) ns: Namespace,
    pub(crate) config: RedisStoreConfig,
}

impl fmt::Debug for RedisBindingStore {
    // Never the credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBindingStore")
            .field("namespace", &self.inner.ns.as_str())
            .field("topology", &self.inner.config.topology.kind())
            .finish_non_exhaustive()
    }
}

impl RedisBindingStore {
    /// Connects to the Redis the config names and loads the scripts. Fails (kind
    /// `unavailable`) when Redis cannot be reached within the connect timeout.
    pub async fn connect(config: RedisStoreConfig) -> Result<Self, Error> {
        let ns = Namespace::new(&config.namespace)?;
        let client = config.client()?;
        let connect = async {
            client
                .init()
                .await
                .map_err(|e| fail(&client, Operation::new("connect"), &e))?;
            Ok::<_, Error>(())
        };
        tokio::time::timeout(config.connect_timeout, connect)
            .await
            .map_err(|_| {
                stored(Error::unavailable(
                    Operation::new("connect"),
                    format!(
                        "redis did not answer within {} ms",
                        config.connect_timeout.as_millis()
                    ),
                ))
            })??;
        let scripts = Scripts::new();
        let store = RedisBindingStore {
            inner: Arc::new(Inner {
                client,
                scripts,
                ns,
                config,
            }),
        };
        store.inner.load_scripts().await?;
        Ok(store)
    }

    /// The underlying client (tests and health checks).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Answers `PING` (a health check).
    pub async fn ping(&self) -> Result<(), Error> {
        self.inner
            .client
            .ping::<String>(None)
            .await
            .map(|_| ())
            .map_err(|e| fail(&self.inner.client, Operation::new("ping"), &e))
    }

    /// The keys of `key` (tests plant values through them).
    pub fn keys_of(&self, key: &BindingKey) -> SessionKeys {
        SessionKeys::new(&self.inner.ns, key)
    }

    fn keys(&self, key: &BindingKey) -> SessionKeys {
        self.keys_of(key)
    }

    /// The raw stored binding bytes.
    async fn raw(&self, operation: Operation, key: &str) -> Result<Option<Vec<u8>>, Error> {
        self.inner
            .client
            .get::<Option<Vec<u8>>, _>(key)
            .await
            .map_err(|e| fail(&self.inner.client, operation, &e))
    }

    /// Conditional write: swaps `expected` for `new` (empty: delete) only if the stored bytes
    /// are still exactly `expected`.
    async fn swap(
        &self,
        operation: Operation,
        key: &str,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool, Error> {
        let swapped: i64 = self
            .inner
            .eval(
                operation,
                &self.inner.scripts.cas,
                vec![key.to_owned()],
                vec![expected.to_vec(), new.to_vec()],
            )
            .await?;
        Ok(swapped == 1)
    }

    /// Reads, lets `decide` compute the replacement (or `None` to leave it), and swaps it in,
    /// re-reading while concurrent writers make the swap miss. `Ok(false)` when `decide`
    /// declined.
    async fn update<F>(
        &self,
        operation: Operation,
        key: &BindingKey,
        decide: F,
    ) -> Result<bool, Error>
    where
        F: Fn(Binding) -> Result<Option<Vec<u8>>, Error> + Send + Sync,
    {
        let redis_key = self.keys(key).binding;
        for _ in 0..CAS_ATTEMPTS {
            let Some(raw) = self.raw(operation, &redis_key).await? else {
                return Ok(false);
            };
            let current = decode(key, &raw).map_err(|e| e.with_operation(operation))?;
            let Some(new) = decide(current)? else {
                return Ok(false);
            };
            if self.swap(operation, &redis_key, &raw, &new).await? {
                return Ok(true);
            }
        }
        Err(stored(Error::conflict(
            operation,
            format!("the binding of {key} kept changing during {CAS_ATTEMPTS} attempts"),
        )))
    }

    /// Marks the binding stale if it is still of `config` and not yet stale.
    async fn mark_stale(&self, key: &BindingKey, config: &ConfigId) -> Result<bool, Error> {
        let now = OffsetDateTime::now_utc();
        self.update(Operation::new("invalidate_by_config"), key, |mut b| {
            if b.config_id.as_ref() != Some(config) || b.stale_at.is_some() {
                return Ok(None);
            }
            b.stale_at = Some(now);
            encode(&b).map(Some)
        })
        .await
    }
}

impl Inner {
    async fn load_scripts(&self) -> Result<(), Error> {
        for script in self.scripts.all() {
            script
                .load(&self.client)
                .await
                .map_err(|e| fail(&self.client, Operation::new("connect"), &e))?;
        }
        Ok(())
    }

    /// Runs a script (re-loading it after a `NOSCRIPT`, e.g. a restarted Redis).
    pub(crate) async fn eval<R>(
        &self,
        operation: Operation,
        script: &fred::types::scripts::Script,
        keys: Vec<String>,
        args: Vec<Vec<u8>>,
    ) -> Result<R, Error>
    where
        R: fred::types::FromValue,
    {
        let args: Vec<fred::types::Value> = args
            .into_iter()
            .map(|a| fred::types::Value::Bytes(a.into()))
            .collect();
        script
            .evalsha_with_reload::<R, _, _>(&self.client, keys, args)
            .await
            .map_err(|e| fail(&self.client, operation, &e))
    }
}

fn decode(key: &BindingKey, raw: &[u8]) -> Result<Binding, Error> {
    let binding: Binding =
        serde_json::from_slice(raw).map_err(|e| invalid_binding(e.to_string()))?;
    binding
        .validate(key)
        .map_err(|e| invalid_binding(e.message().to_owned()))?;
    Ok(binding)
}

fn encode(binding: &Binding) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(binding).map_err(|e| {
        stored(Error::invalid_request(
            Operation::VALIDATE,
            format!("invalid binding: {e}"),
        ))
        .with_code(ErrorCode::InvalidBinding)
    })
}

fn millis(d: Duration) -> Vec<u8> {
    d.as_millis().max(1).to_string().into_bytes()
}

#[async_trait]
impl BindingStore for RedisBindingStore {
    async fn get(&self, key: &BindingKey) -> Result<Option<Binding>, Error> {
        let raw = self
            .raw(Operation::new("get"), &self.keys(key).binding)
            .await?;
        raw.map(|raw| decode(key, &raw)).transpose()
    }

    async fn create(&self, key: &BindingKey, binding: &Binding) -> Result<bool, Error> {
        binding.check_storable(key).map_err(stored)?;
        let json = encode(binding)?;
        let stored: Option<String> = self
            .inner
            .client
            .set(
                self.keys(key).binding,
                json,
                None,
                Some(SetOptions::NX),
                false,
            )
            .await
            .map_err(|e| fail(&self.inner.client, Operation::new("create"), &e))?;
        Ok(stored.is_some())
    }

    async fn delete_if_match(
        &self,
        key: &BindingKey,
        provider: Provider,
        sandbox: &SandboxId,
    ) -> Result<bool, Error> {
        let operation = Operation::new("delete_if_match");
        let redis_key = self.keys(key).binding;
        for _ in 0..CAS_ATTEMPTS {
            let Some(raw) = self.raw(operation, &redis_key).await? else {
                return Ok(false);
            };
            // An unreadable value is never deleted on a guess.
            let current = decode(key, &raw).map_err(|e| e.with_operation(operation))?;
            if current.provider != provider || &current.sandbox_id != sandbox {
                return Ok(false);
            }
            if self.swap(operation, &redis_key, &raw, &[]).await? {
                return Ok(true);
            }
        }
        Err(stored(Error::conflict(
            operation,
            format!("the binding of {key} kept changing during {CAS_ATTEMPTS} attempts"),
        )))
    }

    async fn replace_traffic_token_if_match(
        &self,
        key: &BindingKey,
        expected: &Binding,
        token: &Secret,
    ) -> Result<bool, Error> {
        if token.is_empty() {
            return Ok(false);
        }
        self.update(
            Operation::new("replace_traffic_token_if_match"),
            key,
            |mut b| {
                if b.provider != expected.provider
                    || b.sandbox_id != expected.sandbox_id
                    || b.traffic_token.as_ref() == Some(token)
                {
                    return Ok(None);
                }
                b.traffic_token = Some(token.clone());
                encode(&b).map(Some)
            },
        )
        .await
    }

    async fn lock_lifecycle(&self, key: &BindingKey) -> Result<LifecycleLock, Error> {
        lock::acquire(self.inner.clone(), self.keys(key).lock, key).await
    }

    async fn invalidate_by_config(
        &self,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Result<InvalidationReport, Error> {
        let operation = Operation::new("invalidate_by_config");
        let pattern = keys::binding_pattern(&self.inner.ns, tenant);
        // Every primary of a cluster, not the one node a plain SCAN would reach.
        let mut sessions = Vec::new();
        {
            let mut pages = if self.inner.config.topology.is_cluster() {
                self.inner
                    .client
                    .scan_cluster(pattern, Some(200), None)
                    .boxed()
            } else {
                self.inner.client.scan(pattern, Some(200), None).boxed()
            };
            while let Some(page) = pages.next().await {
                let mut page = page.map_err(|e| fail(&self.inner.client, operation, &e))?;
                for k in page.take_results().unwrap_or_default() {
                    if let Some(s) = k
                        .as_str()
                        .and_then(|k| keys::session_of(&self.inner.ns, tenant, k))
                    {
                        sessions.push(s);
                    }
                }
            }
        }
        sessions.sort();
        sessions.dedup();
        let wait = self.inner.config.invalidate_lock_wait;
        let mut report = InvalidationReport::default();
        for session in sessions {
            let key = BindingKey { tenant, session };
            // A binding of another config (or already stale) is never waited for: read first,
            // without the lock, and only lock what may need marking (re-checked under it).
            match self.get(&key).await {
                Ok(Some(b)) if b.config_id.as_ref() == Some(config) && b.stale_at.is_none() => {}
                Ok(_) => continue,
                Err(e) => {
                    report.failed.push((key.session.clone(), e));
                    continue;
                }
            }
            // Under the session's lifecycle lock, so the mark never lands in the middle of a
            // resolve rebuilding this very binding; a bounded wait per session.
            let lock = match tokio::time::timeout(wait, self.lock_lifecycle(&key)).await {
                Ok(Ok(lock)) => lock,
                Ok(Err(e)) => {
                    report.failed.push((key.session.clone(), e));
                    continue;
                }
                Err(_) => {
                    report.failed.push((
                        key.session.clone(),
                        stored(Error::timeout(
                            operation,
                            format!(
                                "the lifecycle lock of session {key} was still held after {} ms; its binding was not marked",
                                wait.as_millis()
                            ),
                        )),
                    ));
                    continue;
                }
            };
            let marked = tokio::time::timeout(
                self.inner.config.invalidate_mark_budget,
                self.mark_stale(&key, config),
            )
            .await
            .unwrap_or_else(|_| {
                Err(stored(Error::timeout(
                    operation,
                    format!("marking session {key} stale did not finish in time"),
                )))
            });
            let released = lock.release().await;
            match (marked, released) {
                (Ok(true), Ok(())) => report.marked += 1,
                (Ok(false), Ok(())) => {}
                (Err(e), _) | (Ok(_), Err(e)) => report.failed.push((key.session.clone(), e)),
            }
        }
        Ok(report)
    }

    fn turn_leases(&self) -> Option<&dyn TurnLeases> {
        Some(self)
    }

    fn rewind_locks(&self) -> Option<&dyn RewindLocks> {
        Some(self)
    }

    fn activities(&self) -> Option<&dyn ActivityRegistry> {
        Some(self)
    }

    fn optimistic_reads(&self) -> Option<&dyn OptimisticReads> {
        Some(self)
    }
}

#[async_trait]
impl OptimisticReads for RedisBindingStore {
    /// One `EVALSHA`: the binding and the turn lease's due writes, on the session's slot.
    async fn read_for_resolve(&self, key: &BindingKey) -> Result<ResolveSnapshot, Error> {
        let operation = Operation::new("read_for_resolve");
        let k = self.keys(key);
        let (raw, due): (Option<Vec<u8>>, i64) = self
            .inner
            .eval(
                operation,
                &self.inner.scripts.read_for_resolve,
                vec![k.binding, k.turn],
                vec![millis(self.inner.config.turn_lease_ttl / 2)],
            )
            .await?;
        let binding = raw
            .map(|raw| decode(key, &raw))
            .transpose()
            .map_err(|e| e.with_operation(operation))?;
        Ok(ResolveSnapshot {
            binding,
            turn_needs_write: due == 1,
        })
    }
}

fn refusal(operation: Operation, key: &BindingKey, code: ErrorCode, why: &str) -> Error {
    stored(Error::conflict(operation, format!("{why} session {key}"))).with_code(code)
}

#[async_trait]
impl TurnLeases for RedisBindingStore {
    async fn begin_turn(&self, key: &BindingKey) -> Result<(), Error> {
        let operation = Operation::new("begin_turn");
        let k = self.keys(key);
        let refs: i64 = self
            .inner
            .eval(
                operation,
                &self.inner.scripts.begin_turn,
                vec![k.turn, k.rewind],
                vec![millis(self.inner.config.turn_lease_ttl)],
            )
            .await?;
        if refs < 0 {
            return Err(refusal(
                operation,
                key,
                ErrorCode::SessionRewindLocked,
                "a rewind holds",
            ));
        }
        Ok(())
    }

    async fn end_turn(&self, key: &BindingKey) -> Result<(), Error> {
        let _: i64 = self
            .inner
            .eval(
                Operation::new("end_turn"),
                &self.inner.scripts.end_turn,
                vec![self.keys(key).turn],
                vec![],
            )
            .await?;
        Ok(())
    }

    async fn turn_state(&self, key: &BindingKey) -> Result<TurnState, Error> {
        let k = self.keys(key);
        let state: Vec<i64> = self
            .inner
            .eval(
                Operation::new("turn_state"),
                &self.inner.scripts.turn_state,
                vec![k.turn, k.activity],
                vec![millis(self.inner.config.turn_lease_ttl)],
            )
            .await?;
        let [turn, rebuild, live_work] = state[..] else {
            return Err(stored(Error::internal(
                Operation::new("turn_state"),
                format!("unexpected script answer {state:?}"),
            )));
        };
        Ok(TurnState {
            active: turn == 1 || live_work == 1,
            may_rebuild: turn == 1 && rebuild == 1 && live_work == 0,
        })
    }

    async fn consume_turn_rebuild(&self, key: &BindingKey) -> Result<(), Error> {
        let _: i64 = self
            .inner
            .eval(
                Operation::new("consume_turn_rebuild"),
                &self.inner.scripts.consume_rebuild,
                vec![self.keys(key).turn],
                vec![millis(self.inner.config.turn_lease_ttl)],
            )
            .await?;
        Ok(())
    }
}

#[async_trait]
impl RewindLocks for RedisBindingStore {
    async fn try_lock_rewind(&self, key: &BindingKey) -> Result<RewindLock, Error> {
        lock::lock_rewind(self.inner.clone(), self.keys(key), key).await
    }

    async fn has_rewind_lock(&self, key: &BindingKey) -> Result<bool, Error> {
        let n: i64 = self
            .inner
            .client
            .exists(self.keys(key).rewind)
            .await
            .map_err(|e| fail(&self.inner.client, Operation::new("has_rewind_lock"), &e))?;
        Ok(n > 0)
    }
}

#[async_trait]
impl ActivityRegistry for RedisBindingStore {
    async fn add(
        &self,
        key: &BindingKey,
        activity: &BackgroundActivity,
        lease: Duration,
        kind_cap: usize,
    ) -> Result<(), Error> {
        let operation = Operation::new("add_activity");
        activity.validate().map_err(stored)?;
        // Cannot fail once validated; the wire form is needed for the script's argument.
        let started = timefmt::format(activity.started_at)
            .map_err(|e| stored(Error::invalid_request(operation, e.message().to_owned())))?;
        let answer: Vec<i64> = self
            .inner
            .eval(
                operation,
                &self.inner.scripts.add_activity,
                vec![self.keys(key).activity],
                vec![
                    activity.id.clone().into_bytes(),
                    activity.kind.clone().into_bytes(),
                    started.into_bytes(),
                    millis(lease),
                    kind_cap.to_string().into_bytes(),
                ],
            )
            .await?;
        match answer[..] {
            [1, _] => Ok(()),
            [_, live] => Err(stored(Error::new(
                ErrorKind::Capacity,
                operation,
                format!(
                    "session {key} already has {live} live {:?} activities (cap {kind_cap})",
                    activity.kind
                ),
            ))),
            _ => Err(stored(Error::internal(
                operation,
                format!("unexpected script answer {answer:?}"),
            ))),
        }
    }

    async fn renew(&self, key: &BindingKey, id: &str, lease: Duration) -> Result<bool, Error> {
        let renewed: i64 = self
            .inner
            .eval(
                Operation::new("renew_activity"),
                &self.inner.scripts.renew_activity,
                vec![self.keys(key).activity],
                vec![id.as_bytes().to_vec(), millis(lease)],
            )
            .await?;
        Ok(renewed == 1)
    }

    async fn remove(&self, key: &BindingKey, id: &str) -> Result<(), Error> {
        use fred::interfaces::HashesInterface;
        let _: i64 = self
            .inner
            .client
            .hdel(self.keys(key).activity, id)
            .await
            .map_err(|e| fail(&self.inner.client, Operation::new("remove_activity"), &e))?;
        Ok(())
    }

    async fn list(&self, key: &BindingKey) -> Result<Vec<BackgroundActivity>, Error> {
        let operation = Operation::new("list_activities");
        let flat: Vec<String> = self
            .inner
            .eval(
                operation,
                &self.inner.scripts.list_activities,
                vec![self.keys(key).activity],
                vec![],
            )
            .await?;
        let mut out = Vec::with_capacity(flat.len() / 3);
        for item in flat.chunks(3) {
            let [id, kind, started] = item else {
                return Err(stored(Error::internal(
                    operation,
                    "truncated activity list",
                )));
            };
            let started_at = timefmt::parse(started).map_err(|e| {
                stored(Error::internal(
                    operation,
                    format!("activity {id}: {}", e.message()),
                ))
            })?;
            out.push(BackgroundActivity {
                id: id.clone(),
                kind: kind.clone(),
                started_at,
            });
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}

/// `SET key value NX PX ms`, `true` when set.
pub(crate) async fn set_nx_px(
    client: &Client,
    operation: Operation,
    key: &str,
    value: &str,
    lease: Duration,
) -> Result<bool, Error> {
    let ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX).max(1);
    let set: Option<String> = client
        .set(
            key,
            value,
            Some(Expiration::PX(ms)),
            Some(SetOptions::NX),
            false,
        )
        .await
        .map_err(|e| fail(client, operation, &e))?;
    Ok(set.is_some())
}
