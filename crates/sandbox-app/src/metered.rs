//! The metrics layer: a provider wrapper and a binding-store wrapper that count every error
//! their inner component returns (`sandbox_provider_errors` / `sandbox_store_errors` by kind,
//! the family read from the error's origin) and time every call
//! (`sandbox_provider_operation_duration_seconds` / `sandbox_store_operation_duration_seconds`
//! by operation).
//!
//! It lives in the composition root, not in core, because it is the service's choice of
//! metrics; [`stack`] builds the production order, `Metered(Checked(adapter))`: the checking
//! layer is inside, so its refusals are counted as the provider errors they are. Being at the
//! ports, it counts each error once where it happens, so handlers need not remember to.
//!
//! Both wrappers forward every method of the port and its capability traits
//! (`#[deny(clippy::missing_trait_methods)]`), and their `as_*` accessors hand out their own
//! wrapper, so snapshot, terminal and keep-alive calls are timed too. Not timed: the chunks of
//! a streamed read or a terminal's frames after the call that opened them, and the release of
//! a lifecycle lock (a handle the store returned).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sandbox_core::{
    ActivityRegistry, BackgroundActivity, Binding, BindingKey, BindingStore, Capabilities,
    ConfigId, ConnectProbe, ConnectRequest, CreateRequest, Desktop, DesktopOptions, DesktopStream,
    DirEntry, Error, ExecRequest, ExecResult, InvalidationReport, KeepAlive, LifecycleLock,
    ListFilter, ListPage, NetworkFields, Operation, OptimisticReads, Provider, ReadStream,
    ResolveSnapshot, RewindLock, RewindLocks, SandboxHandle, SandboxId, SandboxPage, SandboxPath,
    SandboxProvider, SandboxSummary, Secret, SnapshotId, SnapshotRef, Snapshots, StatEntry,
    Template, TemplateCatalog, TenantId, Terminal, TerminalOptions, TerminalReattach, TerminalSize,
    Terminals, TreeLimits, TreeListing, TurnLeases, TurnState,
};
use sandbox_core::{BuiltTemplate, TemplateBuildRequest, TemplateBuilds};
use sandbox_core::{
    PauseResume, ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, Processes, Signal,
    StreamedFiles, Tunnel, Tunnels, Watch, WatchStream,
};

use crate::http::metrics::{Component, Metrics};

/// The production stack over a provider and a store, both reporting to `metrics`. The
/// provider is expected as its adapter's constructor returns it (already checked).
pub fn stack(
    provider: Arc<dyn SandboxProvider>,
    store: Arc<dyn BindingStore>,
    metrics: &Arc<Metrics>,
) -> (Arc<dyn SandboxProvider>, Arc<dyn BindingStore>) {
    (
        Arc::new(MeteredProvider::new(provider, metrics.clone())),
        Arc::new(MeteredStore::new(store, metrics.clone())),
    )
}

/// Times `call` and counts its error, for `component`'s `operation`.
async fn observe<T>(
    metrics: &Metrics,
    component: Component,
    operation: &'static str,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let started = Instant::now();
    let result = call.await;
    metrics.observe_operation(component, operation, started.elapsed());
    if let Err(e) = &result {
        metrics.observe_error(e);
    }
    result
}

/// A provider whose calls are timed and whose errors are counted.
#[derive(Debug)]
pub struct MeteredProvider {
    inner: Arc<dyn SandboxProvider>,
    metrics: Arc<Metrics>,
}

impl MeteredProvider {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn SandboxProvider>, metrics: Arc<Metrics>) -> Self {
        MeteredProvider { inner, metrics }
    }

    async fn observe<T>(
        &self,
        op: Operation,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        observe(&self.metrics, Component::Provider, op.as_str(), call).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl SandboxProvider for MeteredProvider {
    fn provider(&self) -> Provider {
        self.inner.provider()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn network_fields(&self) -> NetworkFields {
        self.inner.network_fields()
    }
    async fn health(&self) -> Result<(), Error> {
        self.observe(Operation::HEALTH, self.inner.health()).await
    }
    async fn create(&self, request: CreateRequest) -> Result<SandboxHandle, Error> {
        self.observe(Operation::CREATE, self.inner.create(request))
            .await
    }
    async fn connect(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        self.observe(Operation::CONNECT, self.inner.connect(request))
            .await
    }
    async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error> {
        self.observe(Operation::GET, self.inner.get(id)).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<SandboxSummary>, Error> {
        self.observe(Operation::LIST, self.inner.list(filter)).await
    }
    async fn list_page(&self, filter: &ListFilter, page: &ListPage) -> Result<SandboxPage, Error> {
        self.observe(Operation::LIST, self.inner.list_page(filter, page))
            .await
    }
    async fn delete(&self, id: &SandboxId) -> Result<(), Error> {
        self.observe(Operation::DELETE, self.inner.delete(id)).await
    }
    async fn exec(
        &self,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        self.observe(Operation::EXEC, self.inner.exec(sandbox, request))
            .await
    }
    async fn write_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        self.observe(
            Operation::WRITE_FILE,
            self.inner.write_file(sandbox, path, content),
        )
        .await
    }
    async fn read_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<u8>, Error> {
        self.observe(Operation::READ_FILE, self.inner.read_file(sandbox, path))
            .await
    }
    async fn read_file_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        self.observe(
            Operation::READ_FILE,
            self.inner.read_file_stream(sandbox, path, max_bytes),
        )
        .await
    }
    async fn list_tree(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        limits: TreeLimits,
    ) -> Result<TreeListing, Error> {
        self.observe(
            Operation::LIST_DIR,
            self.inner.list_tree(sandbox, dir, limits),
        )
        .await
    }
    async fn list_dir(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<DirEntry>, Error> {
        self.observe(Operation::LIST_DIR, self.inner.list_dir(sandbox, path))
            .await
    }
    async fn make_dir(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        self.observe(Operation::MAKE_DIR, self.inner.make_dir(sandbox, path))
            .await
    }
    async fn remove(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        self.observe(Operation::REMOVE, self.inner.remove(sandbox, path))
            .await
    }
    async fn stat(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<StatEntry, Error> {
        self.observe(Operation::STAT, self.inner.stat(sandbox, path))
            .await
    }
    fn as_snapshots(&self) -> Option<&dyn Snapshots> {
        self.inner.as_snapshots().map(|_| self as &dyn Snapshots)
    }
    fn as_template_catalog(&self) -> Option<&dyn TemplateCatalog> {
        self.inner
            .as_template_catalog()
            .map(|_| self as &dyn TemplateCatalog)
    }
    fn as_terminals(&self) -> Option<&dyn Terminals> {
        self.inner.as_terminals().map(|_| self as &dyn Terminals)
    }
    fn as_terminal_reattach(&self) -> Option<&dyn TerminalReattach> {
        self.inner
            .as_terminal_reattach()
            .map(|_| self as &dyn TerminalReattach)
    }
    fn as_desktop(&self) -> Option<&dyn Desktop> {
        self.inner.as_desktop().map(|_| self as &dyn Desktop)
    }
    fn as_keep_alive(&self) -> Option<&dyn KeepAlive> {
        self.inner.as_keep_alive().map(|_| self as &dyn KeepAlive)
    }
    fn as_connect_probe(&self) -> Option<&dyn ConnectProbe> {
        self.inner
            .as_connect_probe()
            .map(|_| self as &dyn ConnectProbe)
    }
    fn as_processes(&self) -> Option<&dyn Processes> {
        self.inner.as_processes().map(|_| self as &dyn Processes)
    }
    fn as_streamed_files(&self) -> Option<&dyn StreamedFiles> {
        self.inner
            .as_streamed_files()
            .map(|_| self as &dyn StreamedFiles)
    }
    fn as_watch(&self) -> Option<&dyn Watch> {
        self.inner.as_watch().map(|_| self as &dyn Watch)
    }
    fn as_pause_resume(&self) -> Option<&dyn PauseResume> {
        self.inner
            .as_pause_resume()
            .map(|_| self as &dyn PauseResume)
    }
    fn as_tunnels(&self) -> Option<&dyn Tunnels> {
        self.inner.as_tunnels().map(|_| self as &dyn Tunnels)
    }
    fn as_template_builds(&self) -> Option<&dyn TemplateBuilds> {
        self.inner
            .as_template_builds()
            .map(|_| self as &dyn TemplateBuilds)
    }
}

/// The inner capability, or `unsupported` (unreachable through `as_*`, which hands the wrapper
/// out only when the inner provider has the capability).
fn missing(provider: Provider, op: Operation) -> Error {
    Error::unsupported(op, "the backend does not implement this capability").with_provider(provider)
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Snapshots for MeteredProvider {
    async fn create_snapshot(
        &self,
        sandbox: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotRef, Error> {
        let op = Operation::CREATE_SNAPSHOT;
        let inner = self
            .inner
            .as_snapshots()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.create_snapshot(sandbox, name)).await
    }
    async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), Error> {
        let op = Operation::DELETE_SNAPSHOT;
        let inner = self
            .inner
            .as_snapshots()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.delete_snapshot(id)).await
    }
    async fn list_snapshots(&self, source: Option<&SandboxId>) -> Result<Vec<SnapshotRef>, Error> {
        let op = Operation::LIST_SNAPSHOTS;
        let inner = self
            .inner
            .as_snapshots()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.list_snapshots(source)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl TemplateCatalog for MeteredProvider {
    async fn list_templates(&self) -> Result<Vec<Template>, Error> {
        let op = Operation::LIST_TEMPLATES;
        let inner = self
            .inner
            .as_template_catalog()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.list_templates()).await
    }
    async fn ensure_standard_template(&self) -> Result<Template, Error> {
        let op = Operation::ENSURE_TEMPLATE;
        let inner = self
            .inner
            .as_template_catalog()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.ensure_standard_template()).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Terminals for MeteredProvider {
    async fn open_terminal(
        &self,
        sandbox: &SandboxHandle,
        options: TerminalOptions,
    ) -> Result<Terminal, Error> {
        let op = Operation::OPEN_TERMINAL;
        let inner = self
            .inner
            .as_terminals()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.open_terminal(sandbox, options))
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl TerminalReattach for MeteredProvider {
    async fn reattach_terminal(
        &self,
        sandbox: &SandboxHandle,
        pid: u32,
        size: TerminalSize,
    ) -> Result<Terminal, Error> {
        let op = Operation::REATTACH_TERMINAL;
        let inner = self
            .inner
            .as_terminal_reattach()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.reattach_terminal(sandbox, pid, size))
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Desktop for MeteredProvider {
    async fn dial_desktop(
        &self,
        sandbox: &SandboxHandle,
        options: DesktopOptions,
    ) -> Result<Box<dyn DesktopStream>, Error> {
        let op = Operation::DIAL_DESKTOP;
        let inner = self
            .inner
            .as_desktop()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.dial_desktop(sandbox, options)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl KeepAlive for MeteredProvider {
    async fn keep_alive(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), Error> {
        let op = Operation::KEEP_ALIVE;
        let inner = self
            .inner
            .as_keep_alive()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.keep_alive(sandbox, ttl)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ConnectProbe for MeteredProvider {
    async fn connect_session(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        let op = Operation::CONNECT_SESSION;
        let inner = self
            .inner
            .as_connect_probe()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.connect_session(request)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Processes for MeteredProvider {
    async fn start_process(
        &self,
        sandbox: &SandboxHandle,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error> {
        let op = Operation::START_PROCESS;
        let inner = self
            .inner
            .as_processes()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.start_process(sandbox, spec)).await
    }
    async fn list_processes(&self, sandbox: &SandboxHandle) -> Result<Vec<ProcessInfo>, Error> {
        let op = Operation::LIST_PROCESSES;
        let inner = self
            .inner
            .as_processes()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.list_processes(sandbox)).await
    }
    async fn attach_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<ProcessStream, Error> {
        let op = Operation::ATTACH_PROCESS;
        let inner = self
            .inner
            .as_processes()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.attach_process(sandbox, target, from))
            .await
    }
    async fn send_input(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        data: &[u8],
    ) -> Result<(), Error> {
        let op = Operation::SEND_INPUT;
        let inner = self
            .inner
            .as_processes()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.send_input(sandbox, target, data))
            .await
    }
    async fn close_stdin(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
    ) -> Result<(), Error> {
        let op = Operation::CLOSE_STDIN;
        let inner = self
            .inner
            .as_processes()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.close_stdin(sandbox, target)).await
    }
    async fn signal_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        signal: Signal,
    ) -> Result<(), Error> {
        let op = Operation::SIGNAL_PROCESS;
        let inner = self
            .inner
            .as_processes()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.signal_process(sandbox, target, signal))
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl StreamedFiles for MeteredProvider {
    async fn read_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        let op = Operation::READ_FILE_STREAM;
        let inner = self
            .inner
            .as_streamed_files()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.read_stream(sandbox, path, max_bytes))
            .await
    }
    async fn write_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        source: ReadStream,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        let op = Operation::WRITE_FILE_STREAM;
        let inner = self
            .inner
            .as_streamed_files()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.write_stream(sandbox, path, source, max_bytes))
            .await
    }
    async fn rename_path(
        &self,
        sandbox: &SandboxHandle,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> Result<(), Error> {
        let op = Operation::RENAME_PATH;
        let inner = self
            .inner
            .as_streamed_files()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.rename_path(sandbox, from, to)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Watch for MeteredProvider {
    async fn watch_dir(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        let op = Operation::WATCH_DIR;
        let inner = self
            .inner
            .as_watch()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.watch_dir(sandbox, dir, recursive))
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl PauseResume for MeteredProvider {
    async fn pause(&self, id: &SandboxId) -> Result<(), Error> {
        let op = Operation::PAUSE;
        let inner = self
            .inner
            .as_pause_resume()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.pause(id)).await
    }
    async fn resume(&self, id: &SandboxId) -> Result<(), Error> {
        let op = Operation::RESUME;
        let inner = self
            .inner
            .as_pause_resume()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.resume(id)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Tunnels for MeteredProvider {
    async fn open_tunnel(&self, sandbox: &SandboxHandle, port: u16) -> Result<Tunnel, Error> {
        let op = Operation::OPEN_TUNNEL;
        let inner = self
            .inner
            .as_tunnels()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.open_tunnel(sandbox, port)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl TemplateBuilds for MeteredProvider {
    async fn build_template(&self, request: &TemplateBuildRequest) -> Result<BuiltTemplate, Error> {
        let op = Operation::BUILD_TEMPLATE;
        let inner = self
            .inner
            .as_template_builds()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.build_template(request)).await
    }
    async fn list_built_templates(&self, tenant: TenantId) -> Result<Vec<BuiltTemplate>, Error> {
        let op = Operation::LIST_BUILT_TEMPLATES;
        let inner = self
            .inner
            .as_template_builds()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.list_built_templates(tenant)).await
    }
    async fn tag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        build_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        let op = Operation::TAG_TEMPLATE;
        let inner = self
            .inner
            .as_template_builds()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(
            op,
            inner.tag_built_template(tenant, template_id, build_id, tags),
        )
        .await
    }
    async fn untag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        let op = Operation::UNTAG_TEMPLATE;
        let inner = self
            .inner
            .as_template_builds()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.untag_built_template(tenant, template_id, tags))
            .await
    }
    async fn delete_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
    ) -> Result<(), Error> {
        let op = Operation::DELETE_TEMPLATE;
        let inner = self
            .inner
            .as_template_builds()
            .ok_or_else(|| missing(self.provider(), op))?;
        self.observe(op, inner.delete_built_template(tenant, template_id))
            .await
    }
}

/// A binding store whose calls are timed and whose errors are counted. Its operations are
/// labelled by the port method's name.
#[derive(Debug)]
pub struct MeteredStore {
    inner: Arc<dyn BindingStore>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn BindingStore>, metrics: Arc<Metrics>) -> Self {
        MeteredStore { inner, metrics }
    }

    async fn observe<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        observe(&self.metrics, Component::Store, operation, call).await
    }
}

/// A store capability the wrapper was handed out for, or an error (unreachable through the
/// accessors, which hand the wrapper out only when the inner store has the capability).
fn missing_store(operation: &'static str) -> Error {
    Error::internal(
        Operation::new(operation),
        "the binding store does not implement this capability",
    )
    .with_origin(sandbox_core::Origin::Store)
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl BindingStore for MeteredStore {
    async fn get(&self, key: &BindingKey) -> Result<Option<Binding>, Error> {
        self.observe("get", self.inner.get(key)).await
    }
    async fn create(&self, key: &BindingKey, binding: &Binding) -> Result<bool, Error> {
        self.observe("create", self.inner.create(key, binding))
            .await
    }
    async fn delete_if_match(
        &self,
        key: &BindingKey,
        provider: Provider,
        sandbox: &SandboxId,
    ) -> Result<bool, Error> {
        self.observe(
            "delete_if_match",
            self.inner.delete_if_match(key, provider, sandbox),
        )
        .await
    }
    async fn replace_traffic_token_if_match(
        &self,
        key: &BindingKey,
        expected: &Binding,
        token: &Secret,
    ) -> Result<bool, Error> {
        self.observe(
            "replace_traffic_token_if_match",
            self.inner
                .replace_traffic_token_if_match(key, expected, token),
        )
        .await
    }
    async fn lock_lifecycle(&self, key: &BindingKey) -> Result<LifecycleLock, Error> {
        self.observe("lock_lifecycle", self.inner.lock_lifecycle(key))
            .await
    }
    async fn invalidate_by_config(
        &self,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Result<InvalidationReport, Error> {
        self.observe(
            "invalidate_by_config",
            self.inner.invalidate_by_config(tenant, config),
        )
        .await
    }
    fn turn_leases(&self) -> Option<&dyn TurnLeases> {
        self.inner.turn_leases().map(|_| self as &dyn TurnLeases)
    }
    fn rewind_locks(&self) -> Option<&dyn RewindLocks> {
        self.inner.rewind_locks().map(|_| self as &dyn RewindLocks)
    }
    fn activities(&self) -> Option<&dyn ActivityRegistry> {
        self.inner
            .activities()
            .map(|_| self as &dyn ActivityRegistry)
    }
    fn optimistic_reads(&self) -> Option<&dyn OptimisticReads> {
        self.inner
            .optimistic_reads()
            .map(|_| self as &dyn OptimisticReads)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl TurnLeases for MeteredStore {
    async fn begin_turn(&self, key: &BindingKey) -> Result<(), Error> {
        let op = "begin_turn";
        let inner = self.inner.turn_leases().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.begin_turn(key)).await
    }
    async fn end_turn(&self, key: &BindingKey) -> Result<(), Error> {
        let op = "end_turn";
        let inner = self.inner.turn_leases().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.end_turn(key)).await
    }
    async fn turn_state(&self, key: &BindingKey) -> Result<TurnState, Error> {
        let op = "turn_state";
        let inner = self.inner.turn_leases().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.turn_state(key)).await
    }
    async fn consume_turn_rebuild(&self, key: &BindingKey) -> Result<(), Error> {
        let op = "consume_turn_rebuild";
        let inner = self.inner.turn_leases().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.consume_turn_rebuild(key)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl RewindLocks for MeteredStore {
    async fn try_lock_rewind(&self, key: &BindingKey) -> Result<RewindLock, Error> {
        let op = "try_lock_rewind";
        let inner = self.inner.rewind_locks().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.try_lock_rewind(key)).await
    }
    async fn has_rewind_lock(&self, key: &BindingKey) -> Result<bool, Error> {
        let op = "has_rewind_lock";
        let inner = self.inner.rewind_locks().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.has_rewind_lock(key)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ActivityRegistry for MeteredStore {
    async fn add(
        &self,
        key: &BindingKey,
        activity: &BackgroundActivity,
        lease: Duration,
        kind_cap: usize,
    ) -> Result<(), Error> {
        let op = "add_activity";
        let inner = self.inner.activities().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.add(key, activity, lease, kind_cap))
            .await
    }
    async fn renew(&self, key: &BindingKey, id: &str, lease: Duration) -> Result<bool, Error> {
        let op = "renew_activity";
        let inner = self.inner.activities().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.renew(key, id, lease)).await
    }
    async fn remove(&self, key: &BindingKey, id: &str) -> Result<(), Error> {
        let op = "remove_activity";
        let inner = self.inner.activities().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.remove(key, id)).await
    }
    async fn list(&self, key: &BindingKey) -> Result<Vec<BackgroundActivity>, Error> {
        let op = "list_activities";
        let inner = self.inner.activities().ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.list(key)).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl OptimisticReads for MeteredStore {
    async fn read_for_resolve(&self, key: &BindingKey) -> Result<ResolveSnapshot, Error> {
        let op = "read_for_resolve";
        let inner = self
            .inner
            .optimistic_reads()
            .ok_or_else(|| missing_store(op))?;
        self.observe(op, inner.read_for_resolve(key)).await
    }
}
