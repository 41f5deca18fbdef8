//! The in-memory fake provider: a faithful state machine of sandboxes, metadata, states, files
//! and processes, with failure injection, for fast hermetic tests.
//!
//! It runs the portable argv vocabulary of `exec` (the `fake::exec` module) natively and interprets no shell, so cases
//! that need a real POSIX userland sit behind capabilities it does not declare (`posix_shell`,
//! `pty`). It is a test double: it never stands in for a real backend in an acceptance test.
//!
//! What it deliberately does not model: real processes and signals (a timed-out command is a
//! cancelled future, not a killed PID), accounts and permissions (a process reports the user
//! it runs as, the call's or the sandbox's default user, and nothing checks it), symlinks, networking and network
//! policy (its one network is a sandbox's own ports, which `nc -l` listens on and tunnels
//! reach, `fake::tunnel`), resource limits, provider idle timeouts (nothing pauses on its own; tests call
//! [`FakeProvider::pause`]), and durable storage (everything lives in this process).
//!
//! Like every adapter, it is handed out wrapped in the checking layer
//! ([`sandbox_core::Checked`]): [`FakeProvider::new`] and [`FakeProviderBuilder::build`] return
//! `Checked<FakeProvider>`, which refuses what the fake's declarations do not allow (metadata
//! or a capability removed with [`FakeProviderBuilder::without`], the shell form, any network
//! policy), so the fake itself holds no copy of those refusals. The wrapper dereferences to the
//! fake, so failure injection and inspection are called on it directly.

mod exec;
mod fs;
mod process;
mod templates;
mod tunnel;

pub use self::process::{PROCESS_CAP, REMEMBERED_EXITED, RING_BYTES};
pub use self::tunnel::TUNNEL_CAP;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sandbox_core::{
    ByteStream, ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, Processes, ReadStream,
    Signal, StreamedFiles, Tunnel, Tunnels, Watch, WatchEvent, WatchEvents, WatchStream,
};
use sandbox_core::{
    Capabilities, Capability, Checked, Clock, Command, ConnectProbe, ConnectRequest, CreateRequest,
    DirEntry, Error, ErrorCode, ExecRequest, ExecResult, KeepAlive, ListFilter, Metadata,
    NetworkFields, Operation, PauseResume, Provider, SandboxHandle, SandboxId, SandboxPath,
    SandboxProvider, SandboxState, SandboxSummary, SandboxUser, Secret, SnapshotId, SnapshotRef,
    Snapshots, StatEntry, SystemClock, Template, TemplateCatalog, TemplateId, TenantId,
    owner_metadata,
};

use self::exec::{Output, ProcessEnv};
use self::fs::{MemFs, Watcher};
use self::process::{Attach, ProcTable};
use self::tunnel::Ports;

/// The template every fake starts with (and its standard template).
pub const FAKE_TEMPLATE: &str = "fake-base";

/// The exec timeout when a request names none: 60 s, the Docker adapter's default too, so a
/// case that relies on the default behaves alike on both.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// The fake's full capability set: every flag except `posix_shell`, `pty`, `desktop` and
/// `volumes`, which need a real userland, a real PTY or a real mount, and `terminal_reattach`,
/// which needs `pty`. Background processes
/// run its argv vocabulary (see the `fake::process` module for what they model).
pub fn fake_capabilities() -> Capabilities {
    Capabilities::from_slice(&[
        Capability::Reconnect,
        Capability::Metadata,
        Capability::List,
        Capability::PauseResume,
        Capability::TimeoutRefresh,
        Capability::FsEnumeration,
        Capability::Snapshots,
        Capability::TemplateCatalog,
        Capability::ConnectProbe,
        Capability::KeepAlive,
        Capability::Processes,
        Capability::StreamedFiles,
        Capability::Watch,
        Capability::DefaultUser,
        Capability::TemplateBuilds,
        Capability::Tunnels,
    ])
}

/// Operations failures, latency and hooks can be attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FakeOp {
    Health,
    Create,
    Connect,
    ConnectSession,
    Get,
    List,
    Delete,
    Exec,
    WriteFile,
    ReadFile,
    ListDir,
    MakeDir,
    Remove,
    Stat,
    CreateSnapshot,
    DeleteSnapshot,
    ListSnapshots,
    ListTemplates,
    EnsureTemplate,
    KeepAlive,
    StartProcess,
    ListProcesses,
    AttachProcess,
    SendInput,
    CloseStdin,
    SignalProcess,
    ReadStream,
    WriteStream,
    RenamePath,
    WatchDir,
    Pause,
    Resume,
    BuildTemplate,
    ListBuiltTemplates,
    TagTemplate,
    UntagTemplate,
    DeleteTemplate,
    OpenTunnel,
}

/// What a hook sees: the operation and, when it targets one, the sandbox.
#[derive(Debug, Clone)]
pub struct FakeCall {
    pub op: FakeOp,
    pub sandbox: Option<SandboxId>,
}

/// A boxed future, for hooks.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Runs before an operation (after injected latency); an `Err` fails the operation with it.
/// Hooks can block (a barrier, a channel) to orchestrate races.
pub type FakeHook = Arc<dyn Fn(FakeCall) -> BoxFuture<Result<(), Error>> + Send + Sync>;

#[derive(Default)]
struct Faults {
    next: HashMap<FakeOp, VecDeque<Error>>,
    always: HashMap<FakeOp, Error>,
    per_sandbox: HashMap<(FakeOp, SandboxId), Error>,
    latency: HashMap<FakeOp, Duration>,
    hooks: HashMap<FakeOp, FakeHook>,
}

struct FakeSandbox {
    template: TemplateId,
    state: SandboxState,
    metadata: Metadata,
    env: BTreeMap<String, String>,
    started_at: time::OffsetDateTime,
    token: Option<Secret>,
    /// The create request's default user (`default_user`).
    user: Option<SandboxUser>,
    fs: Arc<Mutex<MemFs>>,
    running: Arc<AtomicUsize>,
    keep_alives: usize,
    /// Background processes; they die with the sandbox (the table kills them when dropped).
    procs: Arc<Mutex<ProcTable>>,
    /// Its listening ports and open tunnels (`fake::tunnel`).
    ports: Arc<Ports>,
}

struct Snapshot {
    source: SandboxId,
    /// The source sandbox's tenant (its ownership metadata), checked at every restore.
    tenant: Option<String>,
    name: Option<String>,
    fs: MemFs,
    created_at: time::OffsetDateTime,
}

#[derive(Default)]
struct State {
    sandboxes: BTreeMap<SandboxId, FakeSandbox>,
    snapshots: BTreeMap<SnapshotId, Snapshot>,
    templates: BTreeMap<TemplateId, Template>,
    /// Tenants' built templates, one per build (`template_builds`).
    built: Vec<sandbox_core::BuiltTemplate>,
    next: u64,
}

struct Inner {
    provider: Provider,
    capabilities: Capabilities,
    instance: u32,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    faults: Mutex<Faults>,
    calls: Mutex<HashMap<FakeOp, usize>>,
    issue_tokens: bool,
    /// Tokens connect reissues (as Cube may after a resume), by sandbox.
    reissued: Mutex<HashMap<SandboxId, Secret>>,
    /// The most background processes a sandbox runs at once.
    process_cap: usize,
    /// The most tunnels a sandbox has open at once.
    tunnel_cap: usize,
}

/// The fake provider. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct FakeProvider {
    inner: Arc<Inner>,
}

/// Builds a [`FakeProvider`].
#[derive(Debug)]
pub struct FakeProviderBuilder {
    provider: Provider,
    capabilities: Capabilities,
    templates: Vec<TemplateId>,
    clock: Option<Arc<dyn Clock>>,
    issue_tokens: bool,
    process_cap: usize,
    tunnel_cap: usize,
}

impl FakeProviderBuilder {
    /// Which provider the fake identifies as (default `e2b`, whose capability set it resembles).
    /// Two fakes with different providers exercise provider-switch paths.
    #[must_use]
    pub fn provider(mut self, provider: Provider) -> Self {
        self.provider = provider;
        self
    }
    /// Removes a capability. The checking layer the fake comes in then refuses the capability's
    /// operations, exactly as for a backend without it. There is no way to add one: tests may
    /// narrow, never widen.
    #[must_use]
    pub fn without(mut self, capability: Capability) -> Self {
        self.capabilities = self.capabilities.with(capability, false);
        self
    }
    /// Registers an extra known template.
    #[must_use]
    pub fn template(mut self, template: TemplateId) -> Self {
        self.templates.push(template);
        self
    }
    /// Whether create issues an inbound traffic token (default yes, like E2B and Cube with
    /// closed inbound traffic; no, like Docker).
    #[must_use]
    pub fn issue_tokens(mut self, issue: bool) -> Self {
        self.issue_tokens = issue;
        self
    }
    /// Caps the background processes a sandbox runs at once (default [`PROCESS_CAP`]), so a
    /// test reaches the cap cheaply.
    #[must_use]
    pub fn process_cap(mut self, cap: usize) -> Self {
        self.process_cap = cap;
        self
    }
    /// Bounds the tunnels a sandbox has open at once (default [`TUNNEL_CAP`]).
    #[must_use]
    pub fn tunnel_cap(mut self, cap: usize) -> Self {
        self.tunnel_cap = cap;
        self
    }
    /// Uses `clock` for creation times.
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }
    /// The provider, wrapped in the checking layer like every adapter's.
    pub fn build(self) -> Checked<FakeProvider> {
        Checked::new(self.build_bare())
    }

    fn build_bare(self) -> FakeProvider {
        let mut state = State::default();
        for id in self.templates {
            state
                .templates
                .insert(id.clone(), template_view(&id, false));
        }
        FakeProvider {
            inner: Arc::new(Inner {
                provider: self.provider,
                capabilities: self.capabilities,
                instance: fastrand::u32(..),
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                state: Mutex::new(state),
                faults: Mutex::new(Faults::default()),
                calls: Mutex::new(HashMap::new()),
                issue_tokens: self.issue_tokens,
                reissued: Mutex::new(HashMap::new()),
                process_cap: self.process_cap,
                tunnel_cap: self.tunnel_cap,
            }),
        }
    }
}

fn template_view(id: &TemplateId, standard: bool) -> Template {
    Template {
        id: id.as_str().to_owned(),
        name: id.as_str().to_owned(),
        status: "ready".to_owned(),
        standard,
        ..Template::default()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FakeProvider {
    /// A fake with the full capability set and the [`FAKE_TEMPLATE`] template, wrapped in the
    /// checking layer.
    #[allow(clippy::new_ret_no_self)] // The constructor hands out the fake already wrapped.
    pub fn new() -> Checked<FakeProvider> {
        FakeProvider::builder().build()
    }

    /// A builder starting from the full capability set.
    pub fn builder() -> FakeProviderBuilder {
        FakeProviderBuilder {
            provider: Provider::E2b,
            capabilities: fake_capabilities(),
            templates: vec![FakeProvider::template()],
            issue_tokens: true,
            clock: None,
            process_cap: PROCESS_CAP,
            tunnel_cap: TUNNEL_CAP,
        }
    }

    /// The standard template ([`FAKE_TEMPLATE`]).
    #[allow(clippy::expect_used)] // A literal that passes validation (pinned by a unit test).
    pub fn template() -> TemplateId {
        TemplateId::new(FAKE_TEMPLATE).expect("FAKE_TEMPLATE is a valid template id")
    }

    // ---- failure injection -------------------------------------------------------------

    /// The next call of `op` fails with `error` (calls queue up).
    pub fn fail_next(&self, op: FakeOp, error: Error) {
        lock(&self.inner.faults)
            .next
            .entry(op)
            .or_default()
            .push_back(error);
    }
    /// Every call of `op` fails with `error` until [`clear_faults`](Self::clear_faults).
    pub fn fail_always(&self, op: FakeOp, error: Error) {
        lock(&self.inner.faults).always.insert(op, error);
    }
    /// Every call of `op` on sandbox `id` fails with `error`.
    pub fn fail_for(&self, op: FakeOp, id: &SandboxId, error: Error) {
        lock(&self.inner.faults)
            .per_sandbox
            .insert((op, id.clone()), error);
    }
    /// Delays every call of `op`.
    pub fn set_latency(&self, op: FakeOp, latency: Duration) {
        lock(&self.inner.faults).latency.insert(op, latency);
    }
    /// Runs `hook` before every call of `op`.
    pub fn set_hook(&self, op: FakeOp, hook: FakeHook) {
        lock(&self.inner.faults).hooks.insert(op, hook);
    }
    /// Removes every injected failure, latency and hook.
    pub fn clear_faults(&self) {
        *lock(&self.inner.faults) = Faults::default();
    }
    /// How many calls of `op` were made (failed ones included).
    pub fn calls(&self, op: FakeOp) -> usize {
        lock(&self.inner.calls).get(&op).copied().unwrap_or(0)
    }

    // ---- state control and inspection ---------------------------------------------------

    /// Pauses a sandbox, as a provider idle timeout would: no fault injection, no checks (the
    /// port's [`PauseResume::pause`] is the checked call).
    pub fn pause(&self, id: &SandboxId) -> bool {
        self.set_state(id, SandboxState::Paused)
    }
    /// Marks a sandbox terminal (killed by the provider) without removing it.
    pub fn terminate(&self, id: &SandboxId) -> bool {
        self.set_state(id, SandboxState::Terminal)
    }
    fn set_state(&self, id: &SandboxId, state: SandboxState) -> bool {
        let mut st = lock(&self.inner.state);
        match st.sandboxes.get_mut(id) {
            Some(sbx) => {
                sbx.state = state;
                true
            }
            None => false,
        }
    }
    /// The IDs of every sandbox that exists (any state).
    pub fn sandbox_ids(&self) -> Vec<SandboxId> {
        lock(&self.inner.state).sandboxes.keys().cloned().collect()
    }
    /// The state of one sandbox, `None` when it does not exist.
    pub fn state_of(&self, id: &SandboxId) -> Option<SandboxState> {
        lock(&self.inner.state).sandboxes.get(id).map(|s| s.state)
    }
    /// Processes currently running in a sandbox.
    pub fn running_processes(&self, id: &SandboxId) -> usize {
        lock(&self.inner.state)
            .sandboxes
            .get(id)
            .map_or(0, |s| s.running.load(Ordering::SeqCst))
    }
    /// How many keep-alives a sandbox received.
    pub fn keep_alives(&self, id: &SandboxId) -> usize {
        lock(&self.inner.state)
            .sandboxes
            .get(id)
            .map_or(0, |s| s.keep_alives)
    }
    /// The traffic token issued to a sandbox at create.
    pub fn issued_token(&self, id: &SandboxId) -> Option<Secret> {
        lock(&self.inner.state)
            .sandboxes
            .get(id)
            .and_then(|s| s.token.clone())
    }
    /// Makes every later connect to `id` answer with `token`, as Cube may reissue one after a
    /// resume.
    pub fn reissue_token_on_connect(&self, id: &SandboxId, token: Secret) {
        lock(&self.inner.reissued).insert(id.clone(), token);
    }
    /// Snapshot IDs that exist.
    pub fn snapshot_ids(&self) -> Vec<SnapshotId> {
        lock(&self.inner.state).snapshots.keys().cloned().collect()
    }

    // ---- internals ----------------------------------------------------------------------

    /// Counts the call, applies latency, runs the hook, then returns the injected failure if any.
    async fn enter(&self, op: FakeOp, sandbox: Option<&SandboxId>) -> Result<(), Error> {
        *lock(&self.inner.calls).entry(op).or_insert(0) += 1;
        let (latency, hook) = {
            let faults = lock(&self.inner.faults);
            (
                faults.latency.get(&op).copied(),
                faults.hooks.get(&op).cloned(),
            )
        };
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        if let Some(hook) = hook {
            hook(FakeCall {
                op,
                sandbox: sandbox.cloned(),
            })
            .await?;
        }
        let mut faults = lock(&self.inner.faults);
        if let Some(err) = faults.next.get_mut(&op).and_then(VecDeque::pop_front) {
            return Err(err);
        }
        if let Some(err) = faults.always.get(&op) {
            return Err(err.clone());
        }
        if let Some(id) = sandbox
            && let Some(err) = faults.per_sandbox.get(&(op, id.clone()))
        {
            return Err(err.clone());
        }
        Ok(())
    }

    fn err(&self, error: Error) -> Error {
        error.with_provider(self.inner.provider)
    }

    fn summary(&self, id: &SandboxId, sbx: &FakeSandbox) -> SandboxSummary {
        SandboxSummary {
            id: id.clone(),
            template: Some(sbx.template.clone()),
            state: sbx.state,
            raw_state: sbx.state.as_str().to_owned(),
            metadata: if self.inner.capabilities.metadata {
                sbx.metadata.clone()
            } else {
                Metadata::new()
            },
            started_at: Some(sbx.started_at),
            ended_at: None,
        }
    }

    fn handle(&self, id: &SandboxId, sbx: &FakeSandbox, token: Option<Secret>) -> SandboxHandle {
        SandboxHandle::new(id.clone(), self.inner.provider)
            .with_metadata(if self.inner.capabilities.metadata {
                sbx.metadata.clone()
            } else {
                Metadata::new()
            })
            .with_traffic_token(token)
    }

    /// The sandbox's shared parts for a data-plane call, checking it is running.
    fn running_parts(&self, id: &SandboxId, op: Operation) -> Result<RunningParts, Error> {
        let st = lock(&self.inner.state);
        let sbx = st
            .sandboxes
            .get(id)
            .ok_or_else(|| self.err(Error::not_found(op, format!("sandbox {id} not found"))))?;
        match sbx.state {
            SandboxState::Running => Ok(RunningParts {
                user: sbx.user.clone(),
                fs: sbx.fs.clone(),
                running: sbx.running.clone(),
                env: sbx.env.clone(),
                procs: sbx.procs.clone(),
                ports: sbx.ports.clone(),
            }),
            SandboxState::Terminal => Err(self.err(Error::new(
                sandbox_core::ErrorKind::Terminal,
                op,
                format!("sandbox {id} is terminated"),
            ))),
            // [pause.refused]: at once, with the code that says a resume would help.
            SandboxState::Paused => Err(self.err(
                Error::conflict(op, format!("sandbox {id} is paused, not running"))
                    .with_code(ErrorCode::SandboxPaused),
            )),
            other => Err(self.err(Error::conflict(
                op,
                format!("sandbox {id} is {other}, not running"),
            ))),
        }
    }

    /// What a process (an exec or a background one) sees: the user (the call's, else the
    /// sandbox's default user, else root), the cwd (default the default user's workdir, else
    /// `/workspace`; it must exist) and the environment, the sandbox's merged over the
    /// defaults and the request's over that.
    #[allow(clippy::too_many_arguments)] // One place builds a process; each part is distinct.
    fn process_env(
        &self,
        op: Operation,
        parts: &RunningParts,
        argv: Vec<String>,
        user: Option<&str>,
        cwd: Option<SandboxPath>,
        request_env: &BTreeMap<String, String>,
        stdin: Vec<u8>,
    ) -> Result<ProcessEnv, Error> {
        let default = parts.user.as_ref();
        let user = user
            .or(default.map(|u| u.name.as_str()))
            .unwrap_or("root")
            .to_owned();
        let cwd = cwd
            .or_else(|| default.map(|u| u.workdir.clone()))
            .unwrap_or_else(|| {
                SandboxPath::new("/workspace").unwrap_or_else(|_| SandboxPath::root())
            });
        if !lock(&parts.fs).is_dir(&cwd) {
            return Err(self.err(Error::invalid_request(
                op,
                format!("working directory {cwd} does not exist"),
            )));
        }
        let home = if user == "root" {
            "/root".to_owned()
        } else {
            format!("/home/{user}")
        };
        let mut env: BTreeMap<String, String> = [
            ("HOME".to_owned(), home),
            (
                "PATH".to_owned(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            ),
        ]
        .into();
        env.extend(parts.env.clone());
        env.extend(request_env.clone());
        Ok(ProcessEnv {
            argv,
            stdin,
            env,
            cwd,
            user,
            fs: parts.fs.clone(),
            ports: parts.ports.clone(),
        })
    }

    fn procs_of(&self, id: &SandboxId, op: Operation) -> Result<Arc<Mutex<ProcTable>>, Error> {
        self.running_parts(id, op).map(|parts| parts.procs)
    }

    fn fs_of(&self, id: &SandboxId, op: Operation) -> Result<Arc<Mutex<MemFs>>, Error> {
        self.running_parts(id, op).map(|parts| parts.fs)
    }

    fn now(&self) -> time::OffsetDateTime {
        self.inner.clock.now()
    }
}

impl fmt::Debug for FakeProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = lock(&self.inner.state);
        f.debug_struct("FakeProvider")
            .field("provider", &self.inner.provider)
            .field("instance", &format_args!("{:08x}", self.inner.instance))
            .field("sandboxes", &st.sandboxes.len())
            .field("snapshots", &st.snapshots.len())
            .finish()
    }
}

#[async_trait]
impl SandboxProvider for FakeProvider {
    fn provider(&self) -> Provider {
        self.inner.provider
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities
    }

    /// None: the fake models no network, so any policy is refused rather than ignored.
    fn network_fields(&self) -> NetworkFields {
        NetworkFields::NONE
    }

    async fn health(&self) -> Result<(), Error> {
        self.enter(FakeOp::Health, None).await
    }

    async fn create(&self, request: CreateRequest) -> Result<SandboxHandle, Error> {
        // Validation, metadata, volumes and network policy are the checking layer's.
        self.enter(FakeOp::Create, None).await?;
        let now = self.now();
        let mut st = lock(&self.inner.state);
        if request.from_snapshot {
            // [create.snapshot_owner]: missing, foreign and "not a snapshot" answer alike.
            let tenant = request.metadata.get(owner_metadata::TENANT);
            let owned = SnapshotId::new(request.template.as_str())
                .ok()
                .and_then(|id| st.snapshots.get(&id))
                .is_some_and(|snap| snap.tenant.as_ref() == tenant);
            if !owned {
                return Err(self.err(snapshot_not_found()));
            }
        }
        // [template_builds.owner]: a built template boots for its tenant only.
        if templates::is_built_ref(&request.template) {
            templates::check_owner(&st, &request).map_err(|e| self.err(e))?;
        } else if !st.templates.contains_key(&request.template) {
            return Err(self.err(Error::invalid_request(
                Operation::CREATE,
                format!("unknown template {}", request.template),
            )));
        }
        let mut fs = match st
            .snapshots
            .get(&SnapshotId::new(request.template.as_str())?)
        {
            Some(snapshot) => snapshot.fs.clone(),
            None => MemFs::new(now),
        };
        // [create.user]: the default user's workdir exists, as a real backend creates it.
        if let Some(user) = &request.user {
            fs.mkdir_p(&user.workdir, now, Operation::CREATE)
                .map_err(|e| self.err(e))?;
        }
        st.next += 1;
        let id = SandboxId::new(format!("fake-{:08x}-{}", self.inner.instance, st.next))?;
        // Like E2B with closed inbound traffic: every sandbox gets a token at create, and only
        // at create.
        let token = self
            .inner
            .issue_tokens
            .then(|| Secret::new(format!("tok-{:016x}", fastrand::u64(..))));
        let sbx = FakeSandbox {
            template: request.template.clone(),
            state: SandboxState::Running,
            metadata: request.metadata,
            env: request.env,
            started_at: now,
            token: token.clone(),
            user: request.user,
            fs: Arc::new(Mutex::new(fs)),
            running: Arc::new(AtomicUsize::new(0)),
            keep_alives: 0,
            procs: Arc::new(Mutex::new(ProcTable::default())),
            ports: Arc::new(Ports::new(self.inner.tunnel_cap)),
        };
        let handle = self.handle(&id, &sbx, token);
        st.sandboxes.insert(id, sbx);
        Ok(handle)
    }

    async fn connect(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        self.enter(FakeOp::Connect, Some(&request.sandbox_id))
            .await?;
        self.connect_locked(&request, Operation::CONNECT)
    }

    async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error> {
        self.enter(FakeOp::Get, Some(id)).await?;
        let st = lock(&self.inner.state);
        let sbx = st.sandboxes.get(id).ok_or_else(|| {
            self.err(Error::not_found(
                Operation::GET,
                format!("sandbox {id} not found"),
            ))
        })?;
        Ok(self.summary(id, sbx))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SandboxSummary>, Error> {
        self.enter(FakeOp::List, None).await?;
        let st = lock(&self.inner.state);
        Ok(st
            .sandboxes
            .iter()
            .map(|(id, sbx)| self.summary(id, sbx))
            .filter(|s| filter.matches(s))
            .collect())
    }

    async fn delete(&self, id: &SandboxId) -> Result<(), Error> {
        self.enter(FakeOp::Delete, Some(id)).await?;
        let mut st = lock(&self.inner.state);
        match st.sandboxes.remove(id) {
            Some(_) => Ok(()),
            None => Err(self.err(Error::not_found(
                Operation::DELETE,
                format!("sandbox {id} not found"),
            ))),
        }
    }

    async fn exec(
        &self,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        let id = sandbox.id();
        self.enter(FakeOp::Exec, Some(id)).await?;
        let argv = match &request.command {
            Command::Argv { program, args } => std::iter::once(program.clone())
                .chain(args.iter().cloned())
                .collect(),
            // The checking layer refuses the shell form (no `posix_shell`) before it gets here;
            // the bare fake still cannot run one.
            Command::Shell(_) => {
                return Err(self.err(Error::unsupported(
                    Operation::EXEC,
                    "the fake interprets no shell",
                )));
            }
        };
        let parts = self.running_parts(id, Operation::EXEC)?;
        let running = parts.running.clone();
        let process = self.process_env(
            Operation::EXEC,
            &parts,
            argv,
            request.user.as_deref(),
            request.cwd.clone(),
            &request.env,
            request.stdin.clone().unwrap_or_default(),
        )?;
        let output = Arc::new(Mutex::new(Output::new(request.on_output.clone())));
        let timeout = request.timeout.map_or(DEFAULT_EXEC_TIMEOUT, |t| t.get());
        // The guard counts the process as running until the future ends, including when the
        // caller drops it: a dropped exec is a killed process.
        let _guard = RunningGuard::new(running);
        let started = Instant::now();
        let outcome = tokio::time::timeout(timeout, exec::run(process, output.clone())).await;
        let duration = started.elapsed();
        let mut out = lock(&output);
        let (exit_code, killed) = match outcome {
            Ok(code) => (code, false),
            Err(_) => (-1, true),
        };
        Ok(ExecResult {
            stdout: std::mem::take(&mut out.stdout),
            stderr: std::mem::take(&mut out.stderr),
            exit_code,
            duration,
            killed,
            truncated: false,
        })
    }

    async fn write_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        self.enter(FakeOp::WriteFile, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), Operation::WRITE_FILE)?;
        let now = self.now();
        let result = lock(&fs).write(path, content.to_vec(), now);
        result.map_err(|e| self.err(e))
    }

    async fn read_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<u8>, Error> {
        self.enter(FakeOp::ReadFile, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), Operation::READ_FILE)?;
        let result = lock(&fs).read(path).map(<[u8]>::to_vec);
        result.map_err(|e| self.err(e))
    }

    async fn list_dir(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<DirEntry>, Error> {
        self.enter(FakeOp::ListDir, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), Operation::LIST_DIR)?;
        let result = lock(&fs).list(path);
        result.map_err(|e| self.err(e))
    }

    async fn make_dir(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        self.enter(FakeOp::MakeDir, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), Operation::MAKE_DIR)?;
        let now = self.now();
        let result = lock(&fs).mkdir_p(path, now, Operation::MAKE_DIR);
        result.map_err(|e| self.err(e))
    }

    async fn remove(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        self.enter(FakeOp::Remove, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), Operation::REMOVE)?;
        let result = lock(&fs).remove(path);
        result.map_err(|e| self.err(e))
    }

    async fn stat(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<StatEntry, Error> {
        self.enter(FakeOp::Stat, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), Operation::STAT)?;
        let result = lock(&fs).stat(path);
        result.map_err(|e| self.err(e))
    }

    // The fake implements every optional trait it can; whether a caller may use one is decided
    // by the flags (see `sandbox_core::narrow`), so a narrowed fake demonstrates the two-signal
    // rule rather than hiding the methods.
    fn as_snapshots(&self) -> Option<&dyn Snapshots> {
        Some(self)
    }
    fn as_template_catalog(&self) -> Option<&dyn TemplateCatalog> {
        Some(self)
    }
    fn as_keep_alive(&self) -> Option<&dyn KeepAlive> {
        Some(self)
    }
    fn as_connect_probe(&self) -> Option<&dyn ConnectProbe> {
        Some(self)
    }
    fn as_processes(&self) -> Option<&dyn Processes> {
        Some(self)
    }
    fn as_streamed_files(&self) -> Option<&dyn StreamedFiles> {
        Some(self)
    }
    fn as_pause_resume(&self) -> Option<&dyn PauseResume> {
        Some(self)
    }
    fn as_tunnels(&self) -> Option<&dyn Tunnels> {
        Some(self)
    }
    fn as_watch(&self) -> Option<&dyn Watch> {
        Some(self)
    }
    fn as_template_builds(&self) -> Option<&dyn sandbox_core::TemplateBuilds> {
        Some(self)
    }
}

impl FakeProvider {
    fn connect_locked(
        &self,
        request: &ConnectRequest,
        op: Operation,
    ) -> Result<SandboxHandle, Error> {
        let id = &request.sandbox_id;
        let mut st = lock(&self.inner.state);
        let sbx = st
            .sandboxes
            .get_mut(id)
            .ok_or_else(|| self.err(Error::not_found(op, format!("sandbox {id} not found"))))?;
        match sbx.state {
            SandboxState::Terminal => {
                return Err(self.err(Error::new(
                    sandbox_core::ErrorKind::Terminal,
                    op,
                    format!("sandbox {id} is terminated"),
                )));
            }
            // Connect resumes a paused sandbox (auto-resume); transitions settle at once here.
            SandboxState::Paused | SandboxState::Transitioning | SandboxState::Unknown => {
                sbx.state = SandboxState::Running;
            }
            SandboxState::Running => {}
        }
        // Like E2B and Cube, a connect answer carries no token; the handle keeps the caller's.
        let sbx = &*sbx;
        let reissued = lock(&self.inner.reissued).get(id).cloned();
        Ok(self.handle(id, sbx, reissued.or_else(|| request.traffic_token.clone())))
    }
}

/// What a data-plane call needs of a running sandbox.
struct RunningParts {
    user: Option<SandboxUser>,
    fs: Arc<Mutex<MemFs>>,
    running: Arc<AtomicUsize>,
    env: BTreeMap<String, String>,
    procs: Arc<Mutex<ProcTable>>,
    ports: Arc<Ports>,
}

struct RunningGuard(Arc<AtomicUsize>);

impl RunningGuard {
    fn new(counter: Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        RunningGuard(counter)
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl PauseResume for FakeProvider {
    async fn pause(&self, id: &SandboxId) -> Result<(), Error> {
        let op = Operation::PAUSE;
        self.enter(FakeOp::Pause, Some(id)).await?;
        let mut st = lock(&self.inner.state);
        let sbx = st
            .sandboxes
            .get_mut(id)
            .ok_or_else(|| self.err(Error::not_found(op, format!("sandbox {id} not found"))))?;
        match sbx.state {
            SandboxState::Terminal => Err(self.err(Error::new(
                sandbox_core::ErrorKind::Terminal,
                op,
                format!("sandbox {id} is terminated"),
            ))),
            SandboxState::Paused => Err(self.err(
                Error::conflict(op, format!("sandbox '{id}' is already paused"))
                    .with_code(ErrorCode::SandboxPaused),
            )),
            // Processes are frozen, not ended: their tasks and tables stay as they are.
            SandboxState::Running | SandboxState::Transitioning | SandboxState::Unknown => {
                sbx.state = SandboxState::Paused;
                Ok(())
            }
        }
    }

    async fn resume(&self, id: &SandboxId) -> Result<(), Error> {
        let op = Operation::RESUME;
        self.enter(FakeOp::Resume, Some(id)).await?;
        let mut st = lock(&self.inner.state);
        let sbx = st
            .sandboxes
            .get_mut(id)
            .ok_or_else(|| self.err(Error::not_found(op, format!("sandbox {id} not found"))))?;
        match sbx.state {
            SandboxState::Terminal => Err(self.err(Error::new(
                sandbox_core::ErrorKind::Terminal,
                op,
                format!("sandbox {id} is terminated"),
            ))),
            SandboxState::Running => Ok(()),
            SandboxState::Paused | SandboxState::Transitioning | SandboxState::Unknown => {
                sbx.state = SandboxState::Running;
                Ok(())
            }
        }
    }
}

#[async_trait]
impl Snapshots for FakeProvider {
    async fn create_snapshot(
        &self,
        sandbox: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotRef, Error> {
        self.enter(FakeOp::CreateSnapshot, Some(sandbox)).await?;
        let now = self.now();
        let mut st = lock(&self.inner.state);
        let (fs, tenant) = {
            let sbx = st.sandboxes.get(sandbox).ok_or_else(|| {
                self.err(Error::not_found(
                    Operation::CREATE_SNAPSHOT,
                    format!("sandbox {sandbox} not found"),
                ))
            })?;
            (
                lock(&sbx.fs).clone(),
                sbx.metadata.get(owner_metadata::TENANT).cloned(),
            )
        };
        st.next += 1;
        let id = SnapshotId::new(format!("snap-{:08x}-{}", self.inner.instance, st.next))?;
        let template = TemplateId::new(id.as_str())?;
        st.templates
            .insert(template.clone(), template_view(&template, false));
        st.snapshots.insert(
            id.clone(),
            Snapshot {
                source: sandbox.clone(),
                tenant: tenant.clone(),
                name: name.map(str::to_owned),
                fs,
                created_at: now,
            },
        );
        Ok(SnapshotRef {
            id,
            name: name.map(str::to_owned),
            source: Some(sandbox.clone()),
            created_at: Some(now),
            tenant: tenant_of(tenant.as_deref()),
        })
    }

    async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), Error> {
        self.enter(FakeOp::DeleteSnapshot, None).await?;
        let mut st = lock(&self.inner.state);
        st.snapshots.remove(id);
        if let Ok(template) = TemplateId::new(id.as_str()) {
            st.templates.remove(&template);
        }
        Ok(())
    }

    async fn list_snapshots(&self, source: Option<&SandboxId>) -> Result<Vec<SnapshotRef>, Error> {
        self.enter(FakeOp::ListSnapshots, None).await?;
        let st = lock(&self.inner.state);
        Ok(st
            .snapshots
            .iter()
            .filter(|(_, s)| source.is_none_or(|src| &s.source == src))
            .map(|(id, s)| SnapshotRef {
                id: id.clone(),
                name: s.name.clone(),
                source: Some(s.source.clone()),
                created_at: Some(s.created_at),
                tenant: tenant_of(s.tenant.as_deref()),
            })
            .collect())
    }
}

fn tenant_of(raw: Option<&str>) -> Option<TenantId> {
    raw.and_then(|t| t.parse::<u64>().ok())
        .and_then(|t| TenantId::new(t).ok())
}

/// One message for missing, foreign and non-snapshot templates alike: it must not tell a
/// caller which of them exist.
fn snapshot_not_found() -> Error {
    Error::not_found(Operation::CREATE, "no such snapshot").with_code(ErrorCode::SnapshotNotFound)
}

#[async_trait]
impl TemplateCatalog for FakeProvider {
    async fn list_templates(&self) -> Result<Vec<Template>, Error> {
        self.enter(FakeOp::ListTemplates, None).await?;
        let standard = FakeProvider::template();
        let st = lock(&self.inner.state);
        Ok(st
            .templates
            .iter()
            .filter(|(id, _)| !st.snapshots.keys().any(|s| s.as_str() == id.as_str()))
            .map(|(id, t)| Template {
                standard: *id == standard,
                ..t.clone()
            })
            .collect())
    }

    async fn ensure_standard_template(&self) -> Result<Template, Error> {
        self.enter(FakeOp::EnsureTemplate, None).await?;
        let standard = FakeProvider::template();
        let mut st = lock(&self.inner.state);
        let view = template_view(&standard, true);
        st.templates.entry(standard).or_insert_with(|| view.clone());
        Ok(view)
    }
}

#[async_trait]
impl KeepAlive for FakeProvider {
    async fn keep_alive(&self, sandbox: &SandboxHandle, _ttl: Duration) -> Result<(), Error> {
        self.enter(FakeOp::KeepAlive, Some(sandbox.id())).await?;
        self.running_parts(sandbox.id(), Operation::KEEP_ALIVE)?;
        let mut st = lock(&self.inner.state);
        if let Some(sbx) = st.sandboxes.get_mut(sandbox.id()) {
            sbx.keep_alives += 1;
        }
        Ok(())
    }
}

#[async_trait]
impl ConnectProbe for FakeProvider {
    async fn connect_session(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        self.enter(FakeOp::ConnectSession, Some(&request.sandbox_id))
            .await?;
        self.connect_locked(&request, Operation::CONNECT_SESSION)
    }
}

#[async_trait]
impl Processes for FakeProvider {
    async fn start_process(
        &self,
        sandbox: &SandboxHandle,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error> {
        let op = Operation::START_PROCESS;
        self.enter(FakeOp::StartProcess, Some(sandbox.id())).await?;
        if matches!(spec.command, Command::Shell(_)) {
            return Err(self.err(Error::unsupported(op, "the fake interprets no shell")));
        }
        let parts = self.running_parts(sandbox.id(), op)?;
        let process = self.process_env(
            op,
            &parts,
            spec.argv_view(),
            spec.user.as_deref(),
            spec.cwd.clone(),
            &spec.env,
            Vec::new(),
        )?;
        let result =
            lock(&parts.procs).start(spec.tag, process, spec.stdin, self.inner.process_cap);
        result.map_err(|e| self.err(e))
    }

    async fn list_processes(&self, sandbox: &SandboxHandle) -> Result<Vec<ProcessInfo>, Error> {
        let op = Operation::LIST_PROCESSES;
        self.enter(FakeOp::ListProcesses, Some(sandbox.id()))
            .await?;
        let procs = self.procs_of(sandbox.id(), op)?;
        let list = lock(&procs).list();
        Ok(list)
    }

    async fn attach_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<ProcessStream, Error> {
        let op = Operation::ATTACH_PROCESS;
        self.enter(FakeOp::AttachProcess, Some(sandbox.id()))
            .await?;
        let procs = self.procs_of(sandbox.id(), op)?;
        let proc = lock(&procs).find(op, target).map_err(|e| self.err(e))?;
        let attach = Attach::new(proc, from).map_err(|e| self.err(e))?;
        Ok(Box::new(attach))
    }

    async fn send_input(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        data: &[u8],
    ) -> Result<(), Error> {
        let op = Operation::SEND_INPUT;
        self.enter(FakeOp::SendInput, Some(sandbox.id())).await?;
        let procs = self.procs_of(sandbox.id(), op)?;
        let proc = lock(&procs).find(op, target).map_err(|e| self.err(e))?;
        process::send_input(&proc, target, data)
            .await
            .map_err(|e| self.err(e))
    }

    async fn close_stdin(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
    ) -> Result<(), Error> {
        let op = Operation::CLOSE_STDIN;
        self.enter(FakeOp::CloseStdin, Some(sandbox.id())).await?;
        let procs = self.procs_of(sandbox.id(), op)?;
        let proc = lock(&procs).find(op, target).map_err(|e| self.err(e))?;
        process::close_stdin(&proc, target).map_err(|e| self.err(e))
    }

    async fn signal_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        signal: Signal,
    ) -> Result<(), Error> {
        let op = Operation::SIGNAL_PROCESS;
        self.enter(FakeOp::SignalProcess, Some(sandbox.id()))
            .await?;
        let procs = self.procs_of(sandbox.id(), op)?;
        let proc = lock(&procs).find(op, target).map_err(|e| self.err(e))?;
        process::signal(&proc, target, signal).map_err(|e| self.err(e))
    }
}

/// Chunk size of the fake's streamed reads.
const STREAM_CHUNK: usize = 64 * 1024;

/// A streamed read of the fake: the file's content as it was when the read opened (as an open
/// descriptor sees it), handed out in chunks, ending in `file_too_large` past the cap.
struct FakeReadStream {
    path: SandboxPath,
    content: Vec<u8>,
    at: usize,
    max_bytes: u64,
    done: bool,
    provider: Provider,
}

#[async_trait]
impl ByteStream for FakeReadStream {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, Error>> {
        if self.done {
            return None;
        }
        let cap = usize::try_from(self.max_bytes).unwrap_or(usize::MAX);
        let end = (self.at + STREAM_CHUNK).min(self.content.len());
        if self.at >= cap.min(self.content.len()) {
            self.done = true;
            return (self.content.len() > cap).then(|| {
                Err(
                    sandbox_core::ports::provider::file_too_large(&self.path, self.max_bytes)
                        .with_provider(self.provider),
                )
            });
        }
        let end = end.min(cap);
        let chunk = self.content[self.at..end].to_vec();
        self.at = end;
        Some(Ok(chunk))
    }
}

#[async_trait]
impl StreamedFiles for FakeProvider {
    async fn read_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        let op = Operation::READ_FILE_STREAM;
        self.enter(FakeOp::ReadStream, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), op)?;
        let content = {
            let fs = lock(&fs);
            if fs.is_dir(path) {
                return Err(self.err(
                    Error::invalid_request(op, format!("{path} is a directory"))
                        .with_code(ErrorCode::NotARegularFile),
                ));
            }
            fs.read(path)
                .map(<[u8]>::to_vec)
                .map_err(|e| self.err(e.with_operation(op)))?
        };
        Ok(Box::new(FakeReadStream {
            path: path.clone(),
            content,
            at: 0,
            max_bytes,
            done: false,
            provider: self.inner.provider,
        }))
    }

    async fn write_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        mut source: ReadStream,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        let op = Operation::WRITE_FILE_STREAM;
        self.enter(FakeOp::WriteStream, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), op)?;
        if path.is_root() || lock(&fs).is_dir(path) {
            return Err(self.err(Error::invalid_request(
                op,
                format!("{path}: is a directory"),
            )));
        }
        // The staging buffer is the fake's temporary sibling: the target changes only once the
        // source ended cleanly within the cap.
        let mut staged: Vec<u8> = Vec::new();
        while let Some(chunk) = source.next_chunk().await {
            let chunk = chunk.map_err(|e| self.err(e.with_operation(op)))?;
            if (staged.len() + chunk.len()) as u64 > max_bytes {
                return Err(self.err(
                    Error::invalid_request(
                        op,
                        format!("{path}: the upload is larger than its {max_bytes}-byte limit"),
                    )
                    .with_code(ErrorCode::FileTooLarge),
                ));
            }
            staged.extend_from_slice(&chunk);
        }
        let written = staged.len() as u64;
        let now = self.now();
        let result = lock(&fs).write(path, staged, now);
        result.map_err(|e| self.err(e.with_operation(op)))?;
        Ok(written)
    }

    async fn rename_path(
        &self,
        sandbox: &SandboxHandle,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> Result<(), Error> {
        let op = Operation::RENAME_PATH;
        self.enter(FakeOp::RenamePath, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), op)?;
        let now = self.now();
        let result = lock(&fs).rename(from, to, now);
        result.map_err(|e| self.err(e))
    }
}

/// A watch of the fake, fed by its filesystem's mutations through a bounded queue.
#[derive(Debug)]
struct FakeWatch {
    dir: SandboxPath,
    rx: tokio::sync::mpsc::Receiver<WatchEvent>,
    overflowed: Arc<std::sync::atomic::AtomicBool>,
    done: bool,
    provider: Provider,
}

#[async_trait]
impl WatchEvents for FakeWatch {
    async fn next_event(&mut self) -> Option<Result<WatchEvent, Error>> {
        if self.done {
            return None;
        }
        match self.rx.recv().await {
            Some(event) => Some(Ok(event)),
            None => {
                self.done = true;
                self.overflowed.load(Ordering::SeqCst).then(|| {
                    Err(sandbox_core::watch::watch_overflow(&self.dir).with_provider(self.provider))
                })
            }
        }
    }
}

#[async_trait]
impl Watch for FakeProvider {
    async fn watch_dir(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        let op = Operation::WATCH_DIR;
        self.enter(FakeOp::WatchDir, Some(sandbox.id())).await?;
        let fs = self.fs_of(sandbox.id(), op)?;
        let (tx, rx) = tokio::sync::mpsc::channel(sandbox_core::watch::WATCH_QUEUE_EVENTS);
        let overflowed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = Watcher {
            dir: dir.clone(),
            recursive,
            tx,
            overflowed: overflowed.clone(),
        };
        // Armed under the filesystem's lock: every mutation after this returns is seen.
        let result = lock(&fs).watch(watcher);
        result.map_err(|e| self.err(e))?;
        Ok(Box::new(FakeWatch {
            dir: dir.clone(),
            rx,
            overflowed,
            done: false,
            provider: self.inner.provider,
        }))
    }
}

#[async_trait]
impl Tunnels for FakeProvider {
    async fn open_tunnel(&self, sandbox: &SandboxHandle, port: u16) -> Result<Tunnel, Error> {
        let op = Operation::OPEN_TUNNEL;
        self.enter(FakeOp::OpenTunnel, Some(sandbox.id())).await?;
        let ports = self.running_parts(sandbox.id(), op)?.ports;
        let halves = ports.connect(port).map_err(|e| self.err(e))?;
        Ok(Tunnel {
            sink: Box::new(halves.sink),
            source: Box::new(halves.source),
        })
    }
}
