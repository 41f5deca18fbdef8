//! The one forwarding helper for test doubles that change a few methods of a port on purpose
//! (a planted defect, a lock that never excludes) and forward the rest.
//!
//! A double implements a hook trait ([`ProviderHooks`], [`StoreHooks`]) and writes only the
//! methods it changes; every hook defaults to calling `next`, the wrapped component. The
//! wrappers ([`Forward`], [`ForwardStore`]) are the decorators: they implement the ports and
//! forward every method through the hooks (`#[deny(clippy::missing_trait_methods)]`), and
//! their accessors hand out their own capability wrappers, so a double cannot lose a method
//! or a capability by forgetting it. A double that hides a capability says so
//! ([`ProviderHooks::hides`], [`StoreHooks::hides_turn_leases`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    ActivityRegistry, BackgroundActivity, Binding, BindingKey, BindingStore, Capabilities,
    Capability, ConfigId, ConnectProbe, ConnectRequest, CreateRequest, Desktop, DesktopOptions,
    DesktopStream, DirEntry, Error, ExecRequest, ExecResult, InvalidationReport, KeepAlive,
    LifecycleLock, ListFilter, ListPage, NetworkFields, Operation, OptimisticReads, Origin,
    Provider, ReadStream, ResolveSnapshot, RewindLock, RewindLocks, SandboxHandle, SandboxId,
    SandboxPage, SandboxPath, SandboxProvider, SandboxSummary, Secret, SnapshotId, SnapshotRef,
    Snapshots, StatEntry, Template, TemplateCatalog, TenantId, Terminal, TerminalOptions,
    TerminalReattach, TerminalSize, Terminals, TreeLimits, TreeListing, TurnLeases, TurnState,
};
use sandbox_core::{BuiltTemplate, TemplateBuildRequest, TemplateBuilds};
use sandbox_core::{
    PauseResume, ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, Processes, Signal,
    StreamedFiles, Tunnel, Tunnels, Watch, WatchStream,
};

/// What a provider double changes. Each hook receives the wrapped provider (or its
/// capability) as `next`; the defaults forward unchanged. There is a hook for each method a
/// double changes today; the other methods forward without one (add a hook when a double
/// needs it).
#[async_trait]
pub trait ProviderHooks: Send + Sync + fmt::Debug {
    /// Whether the double hides `capability`'s trait (its `as_*` accessor answers `None`).
    fn hides(&self, _capability: Capability) -> bool {
        false
    }
    async fn create(
        &self,
        next: &dyn SandboxProvider,
        request: CreateRequest,
    ) -> Result<SandboxHandle, Error> {
        next.create(request).await
    }
    async fn connect(
        &self,
        next: &dyn SandboxProvider,
        request: ConnectRequest,
    ) -> Result<SandboxHandle, Error> {
        next.connect(request).await
    }
    async fn list(
        &self,
        next: &dyn SandboxProvider,
        filter: &ListFilter,
    ) -> Result<Vec<SandboxSummary>, Error> {
        next.list(filter).await
    }
    async fn list_page(
        &self,
        next: &dyn SandboxProvider,
        filter: &ListFilter,
        page: &ListPage,
    ) -> Result<SandboxPage, Error> {
        next.list_page(filter, page).await
    }
    async fn delete(&self, next: &dyn SandboxProvider, id: &SandboxId) -> Result<(), Error> {
        next.delete(id).await
    }
    async fn exec(
        &self,
        next: &dyn SandboxProvider,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        next.exec(sandbox, request).await
    }
    async fn write_file(
        &self,
        next: &dyn SandboxProvider,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        next.write_file(sandbox, path, content).await
    }
    async fn make_dir(
        &self,
        next: &dyn SandboxProvider,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<(), Error> {
        next.make_dir(sandbox, path).await
    }
    async fn remove(
        &self,
        next: &dyn SandboxProvider,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<(), Error> {
        next.remove(sandbox, path).await
    }
    async fn delete_snapshot(&self, next: &dyn Snapshots, id: &SnapshotId) -> Result<(), Error> {
        next.delete_snapshot(id).await
    }
    async fn start_process(
        &self,
        next: &dyn Processes,
        sandbox: &SandboxHandle,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error> {
        next.start_process(sandbox, spec).await
    }
    async fn attach_process(
        &self,
        next: &dyn Processes,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<ProcessStream, Error> {
        next.attach_process(sandbox, target, from).await
    }
    async fn write_stream(
        &self,
        next: &dyn StreamedFiles,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        source: ReadStream,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        next.write_stream(sandbox, path, source, max_bytes).await
    }
    async fn watch_dir(
        &self,
        next: &dyn Watch,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        next.watch_dir(sandbox, dir, recursive).await
    }
    async fn open_tunnel(
        &self,
        next: &dyn Tunnels,
        sandbox: &SandboxHandle,
        port: u16,
    ) -> Result<Tunnel, Error> {
        next.open_tunnel(sandbox, port).await
    }
}

/// A provider double: `inner` with `hooks` applied.
#[derive(Debug)]
pub struct Forward<H> {
    inner: Arc<dyn SandboxProvider>,
    hooks: H,
}

impl<H: ProviderHooks> Forward<H> {
    /// `inner` with `hooks` applied.
    pub fn new(inner: Arc<dyn SandboxProvider>, hooks: H) -> Self {
        Forward { inner, hooks }
    }

    /// The capability `accessor` hands out, unless the hooks hide it.
    fn shows(&self, capability: Capability, inner_has: bool) -> bool {
        inner_has && !self.hooks.hides(capability)
    }

    fn missing(&self, op: Operation) -> Error {
        Error::unsupported(
            op,
            "the wrapped provider does not implement this capability",
        )
        .with_provider(self.inner.provider())
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> SandboxProvider for Forward<H> {
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
        self.inner.health().await
    }
    async fn create(&self, request: CreateRequest) -> Result<SandboxHandle, Error> {
        self.hooks.create(&*self.inner, request).await
    }
    async fn connect(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        self.hooks.connect(&*self.inner, request).await
    }
    async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error> {
        self.inner.get(id).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<SandboxSummary>, Error> {
        self.hooks.list(&*self.inner, filter).await
    }
    async fn list_page(&self, filter: &ListFilter, page: &ListPage) -> Result<SandboxPage, Error> {
        self.hooks.list_page(&*self.inner, filter, page).await
    }
    async fn delete(&self, id: &SandboxId) -> Result<(), Error> {
        self.hooks.delete(&*self.inner, id).await
    }
    async fn exec(
        &self,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        self.hooks.exec(&*self.inner, sandbox, request).await
    }
    async fn write_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        self.hooks
            .write_file(&*self.inner, sandbox, path, content)
            .await
    }
    async fn read_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<u8>, Error> {
        self.inner.read_file(sandbox, path).await
    }
    async fn read_file_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        self.inner.read_file_stream(sandbox, path, max_bytes).await
    }
    async fn list_tree(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        limits: TreeLimits,
    ) -> Result<TreeListing, Error> {
        self.inner.list_tree(sandbox, dir, limits).await
    }
    async fn list_dir(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<DirEntry>, Error> {
        self.inner.list_dir(sandbox, path).await
    }
    async fn make_dir(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        self.hooks.make_dir(&*self.inner, sandbox, path).await
    }
    async fn remove(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        self.hooks.remove(&*self.inner, sandbox, path).await
    }
    async fn stat(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<StatEntry, Error> {
        self.inner.stat(sandbox, path).await
    }
    fn as_snapshots(&self) -> Option<&dyn Snapshots> {
        let has = self.inner.as_snapshots().is_some();
        self.shows(Capability::Snapshots, has)
            .then_some(self as &dyn Snapshots)
    }
    fn as_template_catalog(&self) -> Option<&dyn TemplateCatalog> {
        let has = self.inner.as_template_catalog().is_some();
        self.shows(Capability::TemplateCatalog, has)
            .then_some(self as &dyn TemplateCatalog)
    }
    fn as_terminals(&self) -> Option<&dyn Terminals> {
        let has = self.inner.as_terminals().is_some();
        self.shows(Capability::Pty, has)
            .then_some(self as &dyn Terminals)
    }
    fn as_terminal_reattach(&self) -> Option<&dyn TerminalReattach> {
        let has = self.inner.as_terminal_reattach().is_some();
        self.shows(Capability::TerminalReattach, has)
            .then_some(self as &dyn TerminalReattach)
    }
    fn as_desktop(&self) -> Option<&dyn Desktop> {
        let has = self.inner.as_desktop().is_some();
        self.shows(Capability::Desktop, has)
            .then_some(self as &dyn Desktop)
    }
    fn as_keep_alive(&self) -> Option<&dyn KeepAlive> {
        let has = self.inner.as_keep_alive().is_some();
        self.shows(Capability::KeepAlive, has)
            .then_some(self as &dyn KeepAlive)
    }
    fn as_connect_probe(&self) -> Option<&dyn ConnectProbe> {
        let has = self.inner.as_connect_probe().is_some();
        self.shows(Capability::ConnectProbe, has)
            .then_some(self as &dyn ConnectProbe)
    }
    fn as_processes(&self) -> Option<&dyn Processes> {
        let has = self.inner.as_processes().is_some();
        self.shows(Capability::Processes, has)
            .then_some(self as &dyn Processes)
    }
    fn as_streamed_files(&self) -> Option<&dyn StreamedFiles> {
        let has = self.inner.as_streamed_files().is_some();
        self.shows(Capability::StreamedFiles, has)
            .then_some(self as &dyn StreamedFiles)
    }
    fn as_watch(&self) -> Option<&dyn Watch> {
        let has = self.inner.as_watch().is_some();
        self.shows(Capability::Watch, has)
            .then_some(self as &dyn Watch)
    }

    fn as_pause_resume(&self) -> Option<&dyn PauseResume> {
        let has = self.inner.as_pause_resume().is_some();
        self.shows(Capability::PauseResume, has)
            .then_some(self as &dyn PauseResume)
    }

    fn as_tunnels(&self) -> Option<&dyn Tunnels> {
        let has = self.inner.as_tunnels().is_some();
        self.shows(Capability::Tunnels, has)
            .then_some(self as &dyn Tunnels)
    }

    fn as_template_builds(&self) -> Option<&dyn TemplateBuilds> {
        let has = self.inner.as_template_builds().is_some();
        self.shows(Capability::TemplateBuilds, has)
            .then_some(self as &dyn TemplateBuilds)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> Snapshots for Forward<H> {
    async fn create_snapshot(
        &self,
        sandbox: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotRef, Error> {
        let next = self.inner.as_snapshots();
        let next = next.ok_or_else(|| self.missing(Operation::CREATE_SNAPSHOT))?;
        next.create_snapshot(sandbox, name).await
    }
    async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), Error> {
        let next = self.inner.as_snapshots();
        let next = next.ok_or_else(|| self.missing(Operation::DELETE_SNAPSHOT))?;
        self.hooks.delete_snapshot(next, id).await
    }
    async fn list_snapshots(&self, source: Option<&SandboxId>) -> Result<Vec<SnapshotRef>, Error> {
        let next = self.inner.as_snapshots();
        let next = next.ok_or_else(|| self.missing(Operation::LIST_SNAPSHOTS))?;
        next.list_snapshots(source).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> TemplateCatalog for Forward<H> {
    async fn list_templates(&self) -> Result<Vec<Template>, Error> {
        let next = self.inner.as_template_catalog();
        let next = next.ok_or_else(|| self.missing(Operation::LIST_TEMPLATES))?;
        next.list_templates().await
    }
    async fn ensure_standard_template(&self) -> Result<Template, Error> {
        let next = self.inner.as_template_catalog();
        let next = next.ok_or_else(|| self.missing(Operation::ENSURE_TEMPLATE))?;
        next.ensure_standard_template().await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> Terminals for Forward<H> {
    async fn open_terminal(
        &self,
        sandbox: &SandboxHandle,
        options: TerminalOptions,
    ) -> Result<Terminal, Error> {
        let next = self.inner.as_terminals();
        let next = next.ok_or_else(|| self.missing(Operation::OPEN_TERMINAL))?;
        next.open_terminal(sandbox, options).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> TerminalReattach for Forward<H> {
    async fn reattach_terminal(
        &self,
        sandbox: &SandboxHandle,
        pid: u32,
        size: TerminalSize,
    ) -> Result<Terminal, Error> {
        let next = self.inner.as_terminal_reattach();
        let next = next.ok_or_else(|| self.missing(Operation::REATTACH_TERMINAL))?;
        next.reattach_terminal(sandbox, pid, size).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> Desktop for Forward<H> {
    async fn dial_desktop(
        &self,
        sandbox: &SandboxHandle,
        options: DesktopOptions,
    ) -> Result<Box<dyn DesktopStream>, Error> {
        let next = self.inner.as_desktop();
        let next = next.ok_or_else(|| self.missing(Operation::DIAL_DESKTOP))?;
        next.dial_desktop(sandbox, options).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> KeepAlive for Forward<H> {
    async fn keep_alive(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), Error> {
        let next = self.inner.as_keep_alive();
        let next = next.ok_or_else(|| self.missing(Operation::KEEP_ALIVE))?;
        next.keep_alive(sandbox, ttl).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> ConnectProbe for Forward<H> {
    async fn connect_session(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        let next = self.inner.as_connect_probe();
        let next = next.ok_or_else(|| self.missing(Operation::CONNECT_SESSION))?;
        next.connect_session(request).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> Processes for Forward<H> {
    async fn start_process(
        &self,
        sandbox: &SandboxHandle,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error> {
        let next = self.inner.as_processes();
        let next = next.ok_or_else(|| self.missing(Operation::START_PROCESS))?;
        self.hooks.start_process(next, sandbox, spec).await
    }
    async fn list_processes(&self, sandbox: &SandboxHandle) -> Result<Vec<ProcessInfo>, Error> {
        let next = self.inner.as_processes();
        let next = next.ok_or_else(|| self.missing(Operation::LIST_PROCESSES))?;
        next.list_processes(sandbox).await
    }
    async fn attach_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<ProcessStream, Error> {
        let next = self.inner.as_processes();
        let next = next.ok_or_else(|| self.missing(Operation::ATTACH_PROCESS))?;
        self.hooks.attach_process(next, sandbox, target, from).await
    }
    async fn send_input(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        data: &[u8],
    ) -> Result<(), Error> {
        let next = self.inner.as_processes();
        let next = next.ok_or_else(|| self.missing(Operation::SEND_INPUT))?;
        next.send_input(sandbox, target, data).await
    }
    async fn close_stdin(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
    ) -> Result<(), Error> {
        let next = self.inner.as_processes();
        let next = next.ok_or_else(|| self.missing(Operation::CLOSE_STDIN))?;
        next.close_stdin(sandbox, target).await
    }
    async fn signal_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        signal: Signal,
    ) -> Result<(), Error> {
        let next = self.inner.as_processes();
        let next = next.ok_or_else(|| self.missing(Operation::SIGNAL_PROCESS))?;
        next.signal_process(sandbox, target, signal).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> StreamedFiles for Forward<H> {
    async fn read_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        let next = self.inner.as_streamed_files();
        let next = next.ok_or_else(|| self.missing(Operation::READ_FILE_STREAM))?;
        next.read_stream(sandbox, path, max_bytes).await
    }
    async fn write_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        source: ReadStream,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        let next = self.inner.as_streamed_files();
        let next = next.ok_or_else(|| self.missing(Operation::WRITE_FILE_STREAM))?;
        self.hooks
            .write_stream(next, sandbox, path, source, max_bytes)
            .await
    }
    async fn rename_path(
        &self,
        sandbox: &SandboxHandle,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> Result<(), Error> {
        let next = self.inner.as_streamed_files();
        let next = next.ok_or_else(|| self.missing(Operation::RENAME_PATH))?;
        next.rename_path(sandbox, from, to).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> Watch for Forward<H> {
    async fn watch_dir(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        let next = self.inner.as_watch();
        let next = next.ok_or_else(|| self.missing(Operation::WATCH_DIR))?;
        self.hooks.watch_dir(next, sandbox, dir, recursive).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> PauseResume for Forward<H> {
    async fn pause(&self, id: &SandboxId) -> Result<(), Error> {
        let next = self.inner.as_pause_resume();
        let next = next.ok_or_else(|| self.missing(Operation::PAUSE))?;
        next.pause(id).await
    }
    async fn resume(&self, id: &SandboxId) -> Result<(), Error> {
        let next = self.inner.as_pause_resume();
        let next = next.ok_or_else(|| self.missing(Operation::RESUME))?;
        next.resume(id).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> Tunnels for Forward<H> {
    async fn open_tunnel(&self, sandbox: &SandboxHandle, port: u16) -> Result<Tunnel, Error> {
        let next = self.inner.as_tunnels();
        let next = next.ok_or_else(|| self.missing(Operation::OPEN_TUNNEL))?;
        self.hooks.open_tunnel(next, sandbox, port).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: ProviderHooks> TemplateBuilds for Forward<H> {
    async fn build_template(&self, request: &TemplateBuildRequest) -> Result<BuiltTemplate, Error> {
        let next = self.inner.as_template_builds();
        let next = next.ok_or_else(|| self.missing(Operation::BUILD_TEMPLATE))?;
        next.build_template(request).await
    }
    async fn list_built_templates(&self, tenant: TenantId) -> Result<Vec<BuiltTemplate>, Error> {
        let next = self.inner.as_template_builds();
        let next = next.ok_or_else(|| self.missing(Operation::LIST_BUILT_TEMPLATES))?;
        next.list_built_templates(tenant).await
    }
    async fn tag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        build_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        let next = self.inner.as_template_builds();
        let next = next.ok_or_else(|| self.missing(Operation::TAG_TEMPLATE))?;
        next.tag_built_template(tenant, template_id, build_id, tags)
            .await
    }
    async fn untag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        let next = self.inner.as_template_builds();
        let next = next.ok_or_else(|| self.missing(Operation::UNTAG_TEMPLATE))?;
        next.untag_built_template(tenant, template_id, tags).await
    }
    async fn delete_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
    ) -> Result<(), Error> {
        let next = self.inner.as_template_builds();
        let next = next.ok_or_else(|| self.missing(Operation::DELETE_TEMPLATE))?;
        next.delete_built_template(tenant, template_id).await
    }
}

/// What a binding-store double changes; the defaults forward to `next`. As for
/// [`ProviderHooks`], there is a hook for each method a double changes today.
#[async_trait]
pub trait StoreHooks: Send + Sync + fmt::Debug {
    /// Whether the double hides the turn leases (`turn_leases()` answers `None`).
    fn hides_turn_leases(&self) -> bool {
        false
    }
    async fn create(
        &self,
        next: &dyn BindingStore,
        key: &BindingKey,
        binding: &Binding,
    ) -> Result<bool, Error> {
        next.create(key, binding).await
    }
    async fn delete_if_match(
        &self,
        next: &dyn BindingStore,
        key: &BindingKey,
        provider: Provider,
        sandbox: &SandboxId,
    ) -> Result<bool, Error> {
        next.delete_if_match(key, provider, sandbox).await
    }
    async fn replace_traffic_token_if_match(
        &self,
        next: &dyn BindingStore,
        key: &BindingKey,
        expected: &Binding,
        token: &Secret,
    ) -> Result<bool, Error> {
        next.replace_traffic_token_if_match(key, expected, token)
            .await
    }
    async fn lock_lifecycle(
        &self,
        next: &dyn BindingStore,
        key: &BindingKey,
    ) -> Result<LifecycleLock, Error> {
        next.lock_lifecycle(key).await
    }
    async fn invalidate_by_config(
        &self,
        next: &dyn BindingStore,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Result<InvalidationReport, Error> {
        next.invalidate_by_config(tenant, config).await
    }
    async fn begin_turn(&self, next: &dyn TurnLeases, key: &BindingKey) -> Result<(), Error> {
        next.begin_turn(key).await
    }
    async fn consume_turn_rebuild(
        &self,
        next: &dyn TurnLeases,
        key: &BindingKey,
    ) -> Result<(), Error> {
        next.consume_turn_rebuild(key).await
    }
    async fn try_lock_rewind(
        &self,
        next: &dyn RewindLocks,
        key: &BindingKey,
    ) -> Result<RewindLock, Error> {
        next.try_lock_rewind(key).await
    }
}

/// A binding-store double: `inner` with `hooks` applied.
#[derive(Debug)]
pub struct ForwardStore<H> {
    inner: Arc<dyn BindingStore>,
    hooks: H,
}

impl<H: StoreHooks> ForwardStore<H> {
    /// `inner` with `hooks` applied.
    pub fn new(inner: Arc<dyn BindingStore>, hooks: H) -> Self {
        ForwardStore { inner, hooks }
    }
}

fn store_missing(operation: &'static str) -> Error {
    Error::internal(
        Operation::new(operation),
        "the wrapped store does not implement this capability",
    )
    .with_origin(Origin::Store)
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: StoreHooks> BindingStore for ForwardStore<H> {
    async fn get(&self, key: &BindingKey) -> Result<Option<Binding>, Error> {
        self.inner.get(key).await
    }
    async fn create(&self, key: &BindingKey, binding: &Binding) -> Result<bool, Error> {
        self.hooks.create(&*self.inner, key, binding).await
    }
    async fn delete_if_match(
        &self,
        key: &BindingKey,
        provider: Provider,
        sandbox: &SandboxId,
    ) -> Result<bool, Error> {
        self.hooks
            .delete_if_match(&*self.inner, key, provider, sandbox)
            .await
    }
    async fn replace_traffic_token_if_match(
        &self,
        key: &BindingKey,
        expected: &Binding,
        token: &Secret,
    ) -> Result<bool, Error> {
        self.hooks
            .replace_traffic_token_if_match(&*self.inner, key, expected, token)
            .await
    }
    async fn lock_lifecycle(&self, key: &BindingKey) -> Result<LifecycleLock, Error> {
        self.hooks.lock_lifecycle(&*self.inner, key).await
    }
    async fn invalidate_by_config(
        &self,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Result<InvalidationReport, Error> {
        self.hooks
            .invalidate_by_config(&*self.inner, tenant, config)
            .await
    }
    fn turn_leases(&self) -> Option<&dyn TurnLeases> {
        (self.inner.turn_leases().is_some() && !self.hooks.hides_turn_leases())
            .then_some(self as &dyn TurnLeases)
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
impl<H: StoreHooks> TurnLeases for ForwardStore<H> {
    async fn begin_turn(&self, key: &BindingKey) -> Result<(), Error> {
        let next = self.inner.turn_leases();
        let next = next.ok_or_else(|| store_missing("begin_turn"))?;
        self.hooks.begin_turn(next, key).await
    }
    async fn end_turn(&self, key: &BindingKey) -> Result<(), Error> {
        let next = self.inner.turn_leases();
        next.ok_or_else(|| store_missing("end_turn"))?
            .end_turn(key)
            .await
    }
    async fn turn_state(&self, key: &BindingKey) -> Result<TurnState, Error> {
        let next = self.inner.turn_leases();
        next.ok_or_else(|| store_missing("turn_state"))?
            .turn_state(key)
            .await
    }
    async fn consume_turn_rebuild(&self, key: &BindingKey) -> Result<(), Error> {
        let next = self.inner.turn_leases();
        let next = next.ok_or_else(|| store_missing("consume_turn_rebuild"))?;
        self.hooks.consume_turn_rebuild(next, key).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: StoreHooks> RewindLocks for ForwardStore<H> {
    async fn try_lock_rewind(&self, key: &BindingKey) -> Result<RewindLock, Error> {
        let next = self.inner.rewind_locks();
        let next = next.ok_or_else(|| store_missing("try_lock_rewind"))?;
        self.hooks.try_lock_rewind(next, key).await
    }
    async fn has_rewind_lock(&self, key: &BindingKey) -> Result<bool, Error> {
        let next = self.inner.rewind_locks();
        next.ok_or_else(|| store_missing("has_rewind_lock"))?
            .has_rewind_lock(key)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: StoreHooks> ActivityRegistry for ForwardStore<H> {
    async fn add(
        &self,
        key: &BindingKey,
        activity: &BackgroundActivity,
        lease: Duration,
        kind_cap: usize,
    ) -> Result<(), Error> {
        let next = self.inner.activities();
        next.ok_or_else(|| store_missing("add_activity"))?
            .add(key, activity, lease, kind_cap)
            .await
    }
    async fn renew(&self, key: &BindingKey, id: &str, lease: Duration) -> Result<bool, Error> {
        let next = self.inner.activities();
        next.ok_or_else(|| store_missing("renew_activity"))?
            .renew(key, id, lease)
            .await
    }
    async fn remove(&self, key: &BindingKey, id: &str) -> Result<(), Error> {
        let next = self.inner.activities();
        next.ok_or_else(|| store_missing("remove_activity"))?
            .remove(key, id)
            .await
    }
    async fn list(&self, key: &BindingKey) -> Result<Vec<BackgroundActivity>, Error> {
        let next = self.inner.activities();
        next.ok_or_else(|| store_missing("list_activities"))?
            .list(key)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: StoreHooks> OptimisticReads for ForwardStore<H> {
    async fn read_for_resolve(&self, key: &BindingKey) -> Result<ResolveSnapshot, Error> {
        let next = self.inner.optimistic_reads();
        next.ok_or_else(|| store_missing("read_for_resolve"))?
            .read_for_resolve(key)
            .await
    }
}
