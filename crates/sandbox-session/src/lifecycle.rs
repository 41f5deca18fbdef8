//! The lifecycle coordinator: turns `(tenant, session)` into exactly one live sandbox under
//! races, restarts and provider faults.
//!
//! Every transition runs under the session's lifecycle lock. The rules that matter most:
//! - a store error means no provider call at all (an unreadable binding is not "unbound");
//! - only `not_found`/`terminal` from the provider may replace a binding — every other error is
//!   returned and the binding kept, because replacing it on a transient failure destroys the
//!   user's workspace;
//! - before creating, sandboxes this session already owns are recovered through their ownership
//!   metadata (a restart or a lost binding must not create a second sandbox);
//! - the loser of a create race deletes its own sandbox and uses the winner's;
//! - cleanup that must outlive a cancelled caller is spawned, holds the lock until it finishes,
//!   and stops as soon as lock ownership is lost (another replica may be acting by then).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::observer::{LifecycleObserver, NoopObserver, ResolveOutcome};
use crate::quota::{Counted, QuotaGate, QuotaPermit};
use sandbox_core::{
    Binding, BindingKey, BindingStore, Bootstrapper, Capabilities, Clock, ConfigId, ConnectRequest,
    CreateRequest, Error, ErrorCode, ErrorKind, LifecycleLock, ListFilter, Metadata, Operation,
    OwnershipToken, SandboxHandle, SandboxId, SandboxProvider, SandboxState, SandboxSummary,
    SessionExistence, SystemClock, TemplateId, narrow, owner_metadata,
};

/// How long cleanup of one sandbox may take (it runs on after the caller is gone).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

const OP_RESOLVE: Operation = Operation::new("resolve");
const OP_DESTROY: Operation = Operation::new("destroy");
const OP_LOOKUP: Operation = Operation::new("lookup");

/// What the coordinator needs to know about the config it serves.
#[derive(Debug, Clone)]
pub struct LifecycleConfig {
    /// The config whose sandboxes this coordinator creates (stamped in metadata and bindings).
    pub config_id: ConfigId,
    /// The request every new sandbox starts from (template, timeout policy, env, network). The
    /// coordinator never mutates it; each create works on a copy.
    pub create_request: CreateRequest,
    /// The provider issues per-sandbox inbound tokens and inbound traffic is closed (the
    /// default), so a sandbox without a token is unusable: it is deleted, never bound.
    pub requires_inbound_token: bool,
}

/// The coordinator. Cheap to clone; holds no per-session state (the store does).
#[derive(Clone)]
pub struct Lifecycle {
    provider: Arc<dyn SandboxProvider>,
    store: Arc<dyn BindingStore>,
    existence: Arc<dyn SessionExistence>,
    bootstrapper: Option<Arc<dyn Bootstrapper>>,
    config: Arc<LifecycleConfig>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn LifecycleObserver>,
    quotas: QuotaGate,
}

impl fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lifecycle")
            .field("provider", &self.provider.provider())
            .field("config_id", &self.config.config_id)
            .finish_non_exhaustive()
    }
}

/// Options of one resolve.
#[derive(Debug, Clone, Default)]
pub struct ResolveOptions {
    /// Boot a *new* sandbox from this template (a snapshot, for a forked or restored session)
    /// instead of the config's. Ignored when the session already has a live sandbox.
    pub template_override: Option<TemplateId>,
}

/// The lifecycle lock of one resolve, shared with the cleanup it spawns: the lock is released
/// when the last holder lets go, so a cleanup that outlives its caller still runs under it.
struct Hold {
    lock: Option<LifecycleLock>,
}

impl Hold {
    fn ownership(&self) -> OwnershipToken {
        self.lock
            .as_ref()
            .map_or_else(OwnershipToken::never_lost, |l| l.ownership().clone())
    }
}

fn session_deleted(key: &BindingKey) -> Error {
    Error::new(
        ErrorKind::NotFound,
        OP_RESOLVE,
        format!("session {key} no longer exists"),
    )
    .with_code(ErrorCode::SessionDeleted)
}

fn internal(op: Operation, message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Internal, op, message)
}

/// Joins a primary error with a secondary one into one message (the primary's kind, code and
/// origin win: the joined error is reported as the primary's).
fn join(primary: Error, secondary: &Error) -> Error {
    let message = format!("{}; also: {secondary}", primary.message());
    let mut joined =
        Error::new(primary.kind(), primary.operation(), message).with_origin(primary.origin());
    if let Some(code) = primary.code() {
        joined = joined.with_code(code);
    }
    joined
}

impl Lifecycle {
    /// A coordinator for `provider` and `store`. Refuses providers that cannot reconnect: a
    /// session sandbox must be reachable again after a restart.
    pub fn new(
        provider: Arc<dyn SandboxProvider>,
        store: Arc<dyn BindingStore>,
        existence: Arc<dyn SessionExistence>,
        config: LifecycleConfig,
    ) -> Result<Self, Error> {
        if !provider.capabilities().reconnect {
            return Err(Error::unsupported(
                Operation::VALIDATE,
                format!(
                    "provider {} cannot reconnect to a sandbox, which session sandboxes need",
                    provider.provider()
                ),
            ));
        }
        config.create_request.validate()?;
        Ok(Lifecycle {
            provider,
            store,
            existence,
            bootstrapper: None,
            config: Arc::new(config),
            clock: Arc::new(SystemClock),
            observer: Arc::new(NoopObserver),
            quotas: QuotaGate::unlimited(),
        })
    }

    /// Enforces per-tenant quotas (sandboxes here; the manager takes the rest from the same
    /// gate).
    #[must_use]
    pub fn with_quotas(mut self, quotas: QuotaGate) -> Self {
        self.quotas = quotas;
        self
    }

    /// The quota gate.
    pub fn quotas(&self) -> &QuotaGate {
        &self.quotas
    }

    /// A slot for one more sandbox of `tenant`, or `quota_exceeded`. Counts the tenant's live
    /// sandboxes in the backend by their ownership metadata, after reserving (see
    /// [`QuotaGate::reserve`]); `None` when the tenant has no limit, or when the provider cannot
    /// list by metadata (then nothing can be counted, and the limit cannot hold).
    pub(crate) async fn sandbox_slot(
        &self,
        tenant: sandbox_core::TenantId,
    ) -> Result<Option<QuotaPermit>, Error> {
        let caps = self.caps();
        if self.quotas.quota(tenant).max_sandboxes.is_none() || !(caps.list && caps.metadata) {
            return Ok(None);
        }
        let reservation = self.quotas.reserve(tenant, Counted::CreatingSandbox);
        let filter = ListFilter {
            metadata: Metadata::from([(owner_metadata::TENANT.to_owned(), tenant.to_string())]),
            states: Vec::new(),
        };
        let live = self
            .provider
            .list(&filter)
            .await?
            .iter()
            .filter(|s| s.state != SandboxState::Terminal)
            .count();
        reservation
            .check(Operation::CREATE, u32::try_from(live).unwrap_or(u32::MAX))
            .map(Some)
    }

    /// Drops the binding of a sandbox the provider proved gone *during* an operation (an exec
    /// whose container vanished), so the next provisioning call creates a fresh one instead of
    /// failing on the dead binding. Only the binding to exactly `sandbox` goes.
    pub async fn forget_gone(&self, key: &BindingKey, sandbox: &SandboxId) -> Result<(), Error> {
        let removed = self
            .store
            .delete_if_match(key, self.provider.provider(), sandbox)
            .await?;
        if removed {
            tracing::info!(session = %key, sandbox = %sandbox, "the bound sandbox vanished mid-operation; binding dropped");
        }
        Ok(())
    }

    /// Customises each session's first create (fork).
    #[must_use]
    pub fn with_bootstrapper(mut self, bootstrapper: Arc<dyn Bootstrapper>) -> Self {
        self.bootstrapper = Some(bootstrapper);
        self
    }

    /// Uses `clock` for binding timestamps.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Reports resolves and sandbox creates/deletes to `observer` (metrics).
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn LifecycleObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<dyn SandboxProvider> {
        &self.provider
    }
    /// The store.
    pub fn store(&self) -> &Arc<dyn BindingStore> {
        &self.store
    }
    /// The config.
    pub fn config(&self) -> &LifecycleConfig {
        &self.config
    }
    fn caps(&self) -> Capabilities {
        self.provider.capabilities()
    }

    /// The session's live sandbox, creating (or recovering) it when needed.
    ///
    /// Dropping the future is safe: cleanup already started keeps running under the lock, and a
    /// sandbox created but not yet bound is adopted by the next resolve through its metadata.
    pub async fn resolve(&self, key: &BindingKey) -> Result<SandboxHandle, Error> {
        self.resolve_with(key, ResolveOptions::default()).await
    }

    /// [`resolve`](Self::resolve) with options.
    pub async fn resolve_with(
        &self,
        key: &BindingKey,
        options: ResolveOptions,
    ) -> Result<SandboxHandle, Error> {
        if options.template_override.is_none()
            && let Some(reads) = self.store.optimistic_reads()
            && let Some(handle) = self.resolve_fast(key, reads).await
        {
            self.observer.resolved(ResolveOutcome::Bound);
            return Ok(handle);
        }
        let lock = self.store.lock_lifecycle(key).await?;
        let hold = Arc::new(Hold { lock: Some(lock) });
        let outcome = self.resolve_locked(key, &options, &hold).await;
        let released = release(hold).await;
        let how = outcome.as_ref().ok().map(|(_, how)| *how);
        let result = match (outcome, released) {
            (Ok((handle, _)), Ok(())) => Ok(handle),
            // The work may have raced another holder: report it rather than hand out a handle
            // whose binding someone else may have replaced. The next resolve re-reads the truth.
            (Ok(_), Err(e)) => Err(e),
            (Err(e), Ok(())) => Err(e),
            (Err(e), Err(lost)) => Err(join(e, &lost)),
        };
        self.observer.resolved(match &result {
            Ok(_) => how.unwrap_or(ResolveOutcome::Bound),
            Err(e) => ResolveOutcome::Failed(e.kind()),
        });
        result
    }

    /// The fast path for an already-bound session: one lock-free read, then a connect. It never
    /// writes to the store, and gives up (`None`, so the caller takes the locked path) on any
    /// doubt: a read error, nothing bound, another provider's binding, a stale mark, a turn-lease
    /// write due, a deleted session, any connect error, or a reissued token to persist.
    async fn resolve_fast(
        &self,
        key: &BindingKey,
        reads: &dyn sandbox_core::OptimisticReads,
    ) -> Option<SandboxHandle> {
        let snapshot = reads.read_for_resolve(key).await.ok()?;
        let b = snapshot.binding?;
        if snapshot.turn_needs_write
            || b.stale_at.is_some()
            || b.provider != self.provider.provider()
        {
            return None;
        }
        if !self.existence.session_exists(key).await.ok()? {
            return None;
        }
        let handle = self.connect_bound(&b).await.ok()?;
        if handle.traffic_token().is_some() && handle.traffic_token() != b.traffic_token.as_ref() {
            return None;
        }
        Some(handle)
    }

    async fn resolve_locked(
        &self,
        key: &BindingKey,
        options: &ResolveOptions,
        hold: &Arc<Hold>,
    ) -> Result<(SandboxHandle, ResolveOutcome), Error> {
        // 1. The binding. A store error ends here, before any provider call.
        let mut binding = self.store.get(key).await?;

        // 2. The session must still exist; a deleted session loses its sandbox too.
        if !self.existence.session_exists(key).await? {
            let destroyed = match &binding {
                Some(b) => self.destroy_bound(key, b).await.err(),
                None => None,
            };
            return Err(match destroyed {
                Some(e) => join(session_deleted(key), &e),
                None => session_deleted(key),
            });
        }

        // 3. A binding of another provider (a config switched backends): drop the binding only.
        // Asking this provider about the other provider's ID could hit an unrelated sandbox.
        if let Some(b) = &binding
            && b.provider != self.provider.provider()
        {
            if !self
                .store
                .delete_if_match(key, b.provider, &b.sandbox_id)
                .await?
            {
                return Err(Error::conflict(
                    OP_RESOLVE,
                    format!("binding of {key} changed during provider replacement"),
                ));
            }
            tracing::info!(session = %key, old_provider = %b.provider, "dropped a binding of another provider");
            binding = None;
        }

        // 4. A stale binding (the config's image changed) is rebuilt at most once per turn.
        if let Some(b) = &binding
            && b.stale_at.is_some()
            && self.should_rebuild_stale(key).await
        {
            self.destroy_bound(key, b).await?;
            tracing::info!(session = %key, sandbox = %b.sandbox_id, "rebuilt a stale sandbox");
            binding = None;
        }

        // 5. The first resolve of a turn spends the turn's rebuild even when nothing was stale, so
        // an image change landing mid-turn cannot tear the sandbox down until the next turn.
        if let Some(leases) = self.store.turn_leases()
            && let Err(e) = leases.consume_turn_rebuild(key).await
        {
            tracing::warn!(session = %key, error = %e, "could not spend the turn's rebuild");
        }

        // 6. Connect to the bound sandbox; only proof that it is gone replaces the binding.
        if let Some(b) = binding {
            match self.connect_bound(&b).await {
                Ok(handle) => {
                    self.persist_token(key, &b, &handle).await;
                    return Ok((handle, ResolveOutcome::Bound));
                }
                Err(e) if e.can_replace_binding() => {
                    if !self
                        .store
                        .delete_if_match(key, b.provider, &b.sandbox_id)
                        .await?
                    {
                        return Err(Error::conflict(
                            OP_RESOLVE,
                            format!("binding of {key} changed while replacing a gone sandbox"),
                        ));
                    }
                    tracing::info!(session = %key, sandbox = %b.sandbox_id, error = %e, "bound sandbox is gone; replacing");
                }
                Err(e) => return Err(e),
            }
        }

        // 7. Recover a sandbox this session already owns (a restart, a lost binding).
        if let Some(handle) = self.recover(key, hold).await? {
            return Ok((handle, ResolveOutcome::Recovered));
        }

        // 8. Create.
        let handle = self.create(key, options, hold).await?;
        Ok((handle, ResolveOutcome::Created))
    }

    /// Whether a stale binding may be rebuilt now. Without turn leases: always. A turn-state
    /// read error keeps the sandbox (a store blip must not destroy /workspace).
    async fn should_rebuild_stale(&self, key: &BindingKey) -> bool {
        let Some(leases) = self.store.turn_leases() else {
            return true;
        };
        match leases.turn_state(key).await {
            Err(e) => {
                tracing::warn!(session = %key, error = %e, "turn state unreadable; keeping the stale sandbox");
                false
            }
            Ok(state) => !state.active || state.may_rebuild,
        }
    }

    /// Connects to a bound sandbox: the combined connect-and-probe when the provider has it,
    /// else a probe (`get`) and a connect.
    async fn connect_bound(&self, b: &Binding) -> Result<SandboxHandle, Error> {
        let request = ConnectRequest {
            sandbox_id: b.sandbox_id.clone(),
            traffic_token: b.traffic_token.clone(),
        };
        let handle = match narrow::connect_probe(&*self.provider) {
            Some(probe) => probe.connect_session(request).await?,
            None => {
                let summary = self.provider.get(&b.sandbox_id).await?;
                validate_summary(&summary, &b.sandbox_id)?;
                self.provider.connect(request).await?
            }
        };
        self.validate_handle(&handle, Some(&b.sandbox_id), OP_RESOLVE)?;
        Ok(handle)
    }

    fn validate_handle(
        &self,
        handle: &SandboxHandle,
        expected: Option<&SandboxId>,
        op: Operation,
    ) -> Result<(), Error> {
        if let Some(expected) = expected
            && handle.id() != expected
        {
            return Err(internal(
                op,
                format!("provider returned sandbox {} for {expected}", handle.id()),
            ));
        }
        if handle.provider() != self.provider.provider() {
            return Err(internal(
                op,
                format!(
                    "provider {} returned a handle of {}",
                    self.provider.provider(),
                    handle.provider()
                ),
            ));
        }
        Ok(())
    }

    /// Writes a reissued inbound token back to the binding (the binding is the only place it
    /// survives a restart). A failure only costs the next restart a re-read, so it is logged.
    async fn persist_token(&self, key: &BindingKey, b: &Binding, handle: &SandboxHandle) {
        let Some(token) = handle.traffic_token() else {
            return;
        };
        if b.traffic_token.as_ref() == Some(token) {
            return;
        }
        if let Err(e) = self
            .store
            .replace_traffic_token_if_match(key, b, token)
            .await
        {
            tracing::warn!(session = %key, error = %e, "could not persist a reissued traffic token");
        }
    }

    /// The ownership metadata of this session's sandboxes.
    fn ownership_metadata(&self, key: &BindingKey) -> Metadata {
        owner_metadata::for_session(key, self.provider.provider(), &self.config.config_id)
    }

    /// Adopts the oldest sandbox carrying this session's ownership metadata and deletes the other
    /// ones (duplicates from a lost race or a crashed create). Needs `metadata` and `list`.
    async fn recover(
        &self,
        key: &BindingKey,
        hold: &Arc<Hold>,
    ) -> Result<Option<SandboxHandle>, Error> {
        let caps = self.caps();
        if !(caps.metadata && caps.list) {
            return Ok(None);
        }
        let filter = ListFilter {
            metadata: self.ownership_metadata(key),
            states: Vec::new(),
        };
        let mut candidates: Vec<SandboxSummary> = self.provider.list(&filter).await?;
        candidates.retain(|s| s.state != SandboxState::Terminal);
        // Oldest first (the first one created is the one a racing binder most likely saw);
        // unknown start times last; ties by ID so every replica picks the same survivor.
        candidates.sort_by(|a, b| {
            (a.started_at.is_none(), a.started_at, &a.id).cmp(&(
                b.started_at.is_none(),
                b.started_at,
                &b.id,
            ))
        });
        let mut survivor: Option<(SandboxHandle, SandboxSummary)> = None;
        let mut duplicates = Vec::new();
        for candidate in candidates {
            if !filter
                .metadata
                .iter()
                .all(|(k, v)| candidate.metadata.get(k) == Some(v))
            {
                return Err(internal(
                    OP_RESOLVE,
                    format!(
                        "provider listed sandbox {} outside the ownership filter",
                        candidate.id
                    ),
                ));
            }
            if survivor.is_some() {
                duplicates.push(candidate.id);
                continue;
            }
            match self
                .provider
                .connect(ConnectRequest::new(candidate.id.clone()))
                .await
            {
                Ok(handle) => {
                    self.validate_handle(&handle, Some(&candidate.id), OP_RESOLVE)?;
                    if self.config.requires_inbound_token && handle.traffic_token().is_none() {
                        // Adopting it would fail every request with 403, and a 403 never
                        // replaces a binding: it would be stuck forever.
                        tracing::warn!(session = %key, sandbox = %candidate.id, "recovered sandbox has no inbound token; deleting it");
                        duplicates.push(candidate.id);
                        continue;
                    }
                    survivor = Some((handle, candidate));
                }
                Err(e) if e.can_replace_binding() => {}
                Err(e) => return Err(e),
            }
        }
        for id in duplicates {
            self.cleanup(hold, &id).await?;
        }
        let Some((handle, summary)) = survivor else {
            return Ok(None);
        };
        let template = summary
            .template
            .clone()
            .unwrap_or_else(|| self.config.create_request.template.clone());
        let mut binding = Binding::new(
            key,
            self.provider.provider(),
            handle.id().clone(),
            template,
            summary.started_at.unwrap_or_else(|| self.clock.now()),
        );
        binding.config_id = Some(self.config.config_id.clone());
        binding.traffic_token = handle.traffic_token().cloned();
        if self.store.create(key, &binding).await? {
            tracing::info!(session = %key, sandbox = %handle.id(), "recovered a sandbox by its ownership metadata");
            return Ok(Some(handle));
        }
        // Someone bound the session meanwhile: use theirs.
        self.connect_winner(key, None, hold).await.map(Some)
    }

    async fn create(
        &self,
        key: &BindingKey,
        options: &ResolveOptions,
        hold: &Arc<Hold>,
    ) -> Result<SandboxHandle, Error> {
        // Held until the sandbox is bound (or refused): the slot covers the window in which
        // the new sandbox is not yet in the backend's listing.
        let _slot = self.sandbox_slot(key.tenant).await?;
        let mut request = self.config.create_request.clone();
        if self.caps().metadata {
            request.metadata.extend(self.ownership_metadata(key));
        }
        let mut overridden = options.template_override.clone();
        if overridden.is_none()
            && let Some(bootstrapper) = &self.bootstrapper
        {
            overridden = bootstrapper.template_override(key).await?;
        }
        if let Some(template) = &overridden {
            request.template = template.clone();
            request.from_snapshot = true;
        }
        let handle = match self.provider.create(request.clone()).await {
            Ok(handle) => {
                self.observer.sandbox_created();
                handle
            }
            Err(e) => {
                if overridden.is_some()
                    && let Some(bootstrapper) = self.bootstrapper.clone()
                {
                    // Immune to the caller going away: a dead snapshot must be retired or every
                    // later resolve fails on it again.
                    let (key, err) = (key.clone(), e.clone());
                    let _ = tokio::spawn(
                        async move { bootstrapper.on_create_failed(&key, &err).await },
                    )
                    .await;
                }
                return Err(e);
            }
        };
        if let Err(e) = self.validate_handle(&handle, None, Operation::CREATE) {
            return Err(self.fail_after_create(hold, handle.id(), e).await);
        }
        if self.config.requires_inbound_token && handle.traffic_token().is_none() {
            let e = internal(
                Operation::CREATE,
                "the provider issued no inbound token for a sandbox with closed inbound traffic",
            );
            return Err(self.fail_after_create(hold, handle.id(), e).await);
        }
        // The session may have been deleted while the provider was creating.
        match self.existence.session_exists(key).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(self
                    .fail_after_create(hold, handle.id(), session_deleted(key))
                    .await);
            }
            Err(e) => return Err(self.fail_after_create(hold, handle.id(), e).await),
        }
        let mut binding = Binding::new(
            key,
            self.provider.provider(),
            handle.id().clone(),
            request.template.clone(),
            self.clock.now(),
        );
        binding.config_id = Some(self.config.config_id.clone());
        binding.traffic_token = handle.traffic_token().cloned();
        let won = match self.store.create(key, &binding).await {
            Ok(won) => won,
            Err(e) => return Err(self.fail_after_create(hold, handle.id(), e).await),
        };
        if !won {
            return self.connect_winner(key, Some(&handle), hold).await;
        }
        if let Some(bootstrapper) = &self.bootstrapper
            && let Err(e) = bootstrapper
                .after_create(key, &*self.provider, &handle)
                .await
        {
            // A half-bootstrapped fork looks normal but has the wrong baseline: undo it all.
            let unbound = self
                .store
                .delete_if_match(key, binding.provider, &binding.sandbox_id)
                .await;
            let mut error = self.fail_after_create(hold, handle.id(), e).await;
            if let Err(store_error) = unbound {
                error = join(error, &store_error);
            }
            return Err(error);
        }
        tracing::debug!(session = %key, sandbox = %handle.id(), "created a session sandbox");
        Ok(handle)
    }

    /// Deletes a sandbox we created but cannot keep, and returns `error` (joined with the
    /// cleanup's failure, if any).
    async fn fail_after_create(&self, hold: &Arc<Hold>, id: &SandboxId, error: Error) -> Error {
        match self.cleanup(hold, id).await {
            Ok(()) => error,
            Err(cleanup) => join(error, &cleanup),
        }
    }

    /// After losing a create race (or finding the session bound during recovery): use the
    /// winner's sandbox. `ours` is the sandbox we created, deleted unless it is the winner.
    async fn connect_winner(
        &self,
        key: &BindingKey,
        ours: Option<&SandboxHandle>,
        hold: &Arc<Hold>,
    ) -> Result<SandboxHandle, Error> {
        // A read error leaves the winner unknown: keep our sandbox (recovery finds it later)
        // rather than delete what might be the bound one.
        let winner = self.store.get(key).await?;
        if let (Some(w), Some(ours)) = (&winner, ours)
            && &w.sandbox_id == ours.id()
            && w.provider == ours.provider()
        {
            return Ok(ours.clone());
        }
        if let Some(ours) = ours {
            self.cleanup(hold, ours.id()).await?;
        }
        let Some(winner) = winner else {
            return Err(Error::conflict(
                OP_RESOLVE,
                format!("lost the create race of {key} without a winner"),
            ));
        };
        if winner.provider != self.provider.provider() {
            return Err(Error::conflict(
                OP_RESOLVE,
                format!(
                    "the winning binding of {key} belongs to provider {}",
                    winner.provider
                ),
            ));
        }
        match self.connect_bound(&winner).await {
            Ok(handle) => Ok(handle),
            Err(e) if e.can_replace_binding() => Err(Error::conflict(
                OP_RESOLVE,
                format!("the winning sandbox of {key} is already gone: {e}"),
            )),
            Err(e) => Err(e),
        }
    }

    /// Deletes a sandbox on a task of its own that outlives the caller, holds the lock until it
    /// is done, and stops if lock ownership is lost. `not_found`/`terminal` count as success.
    async fn cleanup(&self, hold: &Arc<Hold>, id: &SandboxId) -> Result<(), Error> {
        let (provider, hold, id) = (self.provider.clone(), hold.clone(), id.clone());
        let observer = self.observer.clone();
        let ownership = hold.ownership();
        let task = tokio::spawn(async move {
            let _hold = hold; // Keeps the lock held until the delete is done.
            ownership.check()?;
            let delete = tokio::time::timeout(CLEANUP_TIMEOUT, provider.delete(&id));
            let deleted = tokio::select! {
                reason = ownership.lost() => Err(sandbox_core::ownership::ownership_lost(&reason)),
                done = delete => match done {
                    Err(_) => Err(Error::timeout(Operation::DELETE, format!("cleanup of {id} did not finish in {}s", CLEANUP_TIMEOUT.as_secs()))),
                    Ok(Err(e)) if e.can_replace_binding() => Ok(()),
                    Ok(result) => result,
                },
            };
            if deleted.is_ok() {
                observer.sandbox_destroyed();
            }
            deleted
        });
        task.await.unwrap_or_else(|e| {
            Err(internal(
                Operation::DELETE,
                format!("cleanup task failed: {e}"),
            ))
        })
    }

    /// Deletes a bound sandbox and its binding, as destroy does.
    async fn destroy_bound(&self, key: &BindingKey, b: &Binding) -> Result<(), Error> {
        if b.provider == self.provider.provider() {
            match self.provider.delete(&b.sandbox_id).await {
                Ok(()) => self.observer.sandbox_destroyed(),
                Err(e) if e.can_replace_binding() => self.observer.sandbox_destroyed(),
                // A transient failure keeps the binding: the sandbox may still exist.
                Err(e) => return Err(e),
            }
        }
        if self
            .store
            .delete_if_match(key, b.provider, &b.sandbox_id)
            .await?
        {
            return Ok(());
        }
        match self.store.get(key).await? {
            None => Ok(()),
            Some(_) => Err(Error::conflict(
                OP_DESTROY,
                format!("binding of {key} changed during destroy"),
            )),
        }
    }

    /// Destroys the session's sandbox and binding. Idempotent: an unbound session is success.
    /// A transient provider error keeps the binding (and is returned).
    pub async fn destroy(&self, key: &BindingKey) -> Result<(), Error> {
        let lock = self.store.lock_lifecycle(key).await?;
        let outcome = async {
            match self.store.get(key).await? {
                None => Ok(()),
                Some(b) => self.destroy_bound(key, &b).await,
            }
        }
        .await;
        let released = lock.release().await;
        match (outcome, released) {
            (Ok(()), r) => r,
            (Err(e), Ok(())) => Err(e),
            (Err(e), Err(lost)) => Err(join(e, &lost)),
        }
    }

    /// The bound sandbox without provisioning anything: `Ok(None)` when nothing (of this
    /// provider) is bound or the bound sandbox is gone. Connect may resume a paused sandbox.
    ///
    /// With nothing bound, a sandbox this session already owns is recovered by its ownership
    /// metadata and bound, exactly as a resolve would (under the lifecycle lock), but nothing is
    /// ever created: after a restart on the memory store, or a lost binding, the lookup-only
    /// routes (a file read, a process listing, a terminal) find the session's sandbox and what
    /// runs in it instead of answering `no_live_sandbox` until some call provisions.
    pub async fn lookup(&self, key: &BindingKey) -> Result<Option<SandboxHandle>, Error> {
        let Some(b) = self.store.get(key).await? else {
            return self.lookup_unbound(key).await;
        };
        if b.provider != self.provider.provider() {
            return Ok(None);
        }
        match self.connect_bound(&b).await {
            Ok(handle) => {
                self.persist_token(key, &b, &handle).await;
                Ok(Some(handle))
            }
            Err(e) if e.can_replace_binding() => Ok(None),
            Err(e) => Err(e.with_operation(OP_LOOKUP)),
        }
    }

    /// [`Lifecycle::lookup`] of a session with nothing bound: a recovery under the lifecycle
    /// lock, with the binding and the session's existence read again there.
    async fn lookup_unbound(&self, key: &BindingKey) -> Result<Option<SandboxHandle>, Error> {
        let caps = self.caps();
        if !(caps.metadata && caps.list) {
            return Ok(None);
        }
        let lock = self.store.lock_lifecycle(key).await?;
        let hold = Arc::new(Hold { lock: Some(lock) });
        let outcome = async {
            if self.store.get(key).await?.is_some() {
                // Bound meanwhile: the ordinary lookup, after the lock is released.
                return Ok(Err(()));
            }
            if !self.existence.session_exists(key).await? {
                return Ok(Ok(None));
            }
            self.recover(key, &hold).await.map(Ok)
        }
        .await;
        let released = release(hold).await;
        let found = match (outcome, released) {
            (Ok(found), Ok(())) => found,
            (Ok(_), Err(e)) | (Err(e), Ok(())) => return Err(e.with_operation(OP_LOOKUP)),
            (Err(e), Err(lost)) => return Err(join(e, &lost).with_operation(OP_LOOKUP)),
        };
        match found {
            Ok(Some(handle)) => {
                self.observer.resolved(ResolveOutcome::Recovered);
                Ok(Some(handle))
            }
            Ok(None) => Ok(None),
            Err(()) => Box::pin(self.lookup(key)).await,
        }
    }

    /// The state of the bound sandbox *without connecting* (a connect would resume a paused
    /// sandbox and bill it again): `None` when nothing of this provider is bound; `Unknown` when
    /// bound but the provider's listing misses it (never "unbound" while a binding exists).
    pub async fn peek_state(
        &self,
        key: &BindingKey,
    ) -> Result<Option<(SandboxId, SandboxState)>, Error> {
        let Some(b) = self.store.get(key).await? else {
            return Ok(None);
        };
        if b.provider != self.provider.provider() {
            return Ok(None);
        }
        let caps = self.caps();
        let state = if caps.list && caps.metadata {
            let filter = ListFilter {
                metadata: [
                    (owner_metadata::TENANT.to_owned(), key.tenant.to_string()),
                    (
                        owner_metadata::SESSION.to_owned(),
                        key.session.as_str().to_owned(),
                    ),
                ]
                .into(),
                states: vec![
                    SandboxState::Running,
                    SandboxState::Paused,
                    SandboxState::Transitioning,
                ],
            };
            self.provider
                .list(&filter)
                .await?
                .into_iter()
                .find(|s| s.id == b.sandbox_id)
                .map_or(SandboxState::Unknown, |s| s.state)
        } else {
            match self.provider.get(&b.sandbox_id).await {
                Ok(s) => s.state,
                Err(e) if e.can_replace_binding() => SandboxState::Unknown,
                Err(e) => return Err(e),
            }
        };
        Ok(Some((b.sandbox_id, state)))
    }
}

/// Checks a probe's summary before connecting: a missing or mismatched summary is not proof
/// of anything (internal, binding kept); a terminal one is.
fn validate_summary(summary: &SandboxSummary, expected: &SandboxId) -> Result<(), Error> {
    if &summary.id != expected {
        return Err(internal(
            OP_RESOLVE,
            format!("probe of {expected} answered for {}", summary.id),
        ));
    }
    if summary.state == SandboxState::Terminal {
        return Err(Error::new(
            ErrorKind::Terminal,
            OP_RESOLVE,
            format!("sandbox {expected} is terminated"),
        ));
    }
    Ok(())
}

/// Releases the lock once the last holder (this resolve or a cleanup it spawned) is done,
/// reporting lost ownership.
async fn release(hold: Arc<Hold>) -> Result<(), Error> {
    match Arc::try_unwrap(hold) {
        Ok(mut hold) => match hold.lock.take() {
            Some(lock) => lock.release().await,
            None => Ok(()),
        },
        // A spawned cleanup still holds the lock; it releases when it finishes. Ownership
        // already lost is still worth reporting.
        Err(shared) => shared.ownership().check(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::{Origin, Provider};

    #[test]
    fn a_joined_error_is_reported_as_its_primary() {
        let primary = Error::unavailable(Operation::new("delete_if_match"), "redis down")
            .with_origin(Origin::Store)
            .with_code(ErrorCode::LockOwnershipLost);
        let secondary =
            Error::internal(OP_DESTROY, "cleanup failed").with_provider(Provider::Docker);
        let joined = join(primary, &secondary);
        assert_eq!(joined.origin(), Origin::Store);
        assert_eq!(joined.kind(), ErrorKind::Unavailable);
        assert_eq!(joined.code(), Some(ErrorCode::LockOwnershipLost));
        assert_eq!(
            joined.message(),
            "redis down; also: docker destroy: internal: cleanup failed"
        );
    }
}
