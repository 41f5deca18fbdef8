//! The session manager: the operations callers use, expressed over the lifecycle coordinator and
//! the provider, without any HTTP server.
//!
//! Provisioning operations (exec, writes, script execution) resolve the session, creating its
//! sandbox on first use. Lookup-only operations (reads, listings, input removal, terminal
//! open, keep-alive, snapshots) never provision: they lack the context that decides where a
//! sandbox should live, and opening a panel must not create — or resume and re-bill — a microVM.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::policy::workspace::{WorkspaceLayout, interpreter_for};
use sandbox_core::{
    BindingKey, ConfigId, EntryKind, Error, ErrorCode, ErrorKind, ExecRequest, ExecResult,
    ExecTimeout, InvalidationReport, Operation, Provider, ReadStream, RewindLock, SandboxHandle,
    SandboxId, SandboxPath, SandboxState, SnapshotId, SnapshotRef, StatEntry, TemplateId, TenantId,
    Terminal, TerminalOptions, TreeLimits, TreeListing, narrow,
};
use sandbox_core::{
    ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, Processes, Signal, StreamedFiles,
    Watch, WatchStream,
};

use crate::lifecycle::{Lifecycle, ResolveOptions};
use crate::policy::validator::ScriptValidator;
use crate::quota::{Counted, QuotaPermit};

const OP_TERMINAL: Operation = Operation::OPEN_TERMINAL;

/// The default refresh interval bounds of keep-alive.
const MIN_REFRESH: Duration = Duration::from_secs(15);
const MAX_REFRESH: Duration = Duration::from_secs(120);
/// The idle TTL assumed when the config names none (E2B's default).
const DEFAULT_TTL: Duration = Duration::from_secs(300);

fn no_live_sandbox(op: Operation, key: &BindingKey) -> Error {
    Error::new(
        ErrorKind::NotFound,
        op,
        format!("session {key} has no live sandbox"),
    )
    .with_code(ErrorCode::NoLiveSandbox)
}

/// One script run by [`SessionManager::execute`].
#[derive(Debug, Clone)]
pub struct Script {
    /// The file name the script is uploaded as, in the workspace root (one path segment; its
    /// extension picks the interpreter).
    pub file_name: String,
    pub content: String,
    pub args: Vec<String>,
    pub stdin: Option<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub timeout: Option<ExecTimeout>,
    /// Skip the script validator. Only for trusted scripts (an installed skill), never for
    /// model-authored ones.
    pub skip_validation: bool,
}

/// The session manager of one tenant config.
#[derive(Debug, Clone)]
pub struct SessionManager {
    lifecycle: Lifecycle,
    layout: WorkspaceLayout,
    validator: ScriptValidator,
}

impl SessionManager {
    /// A manager over `lifecycle` with the standard `/workspace` layout.
    pub fn new(lifecycle: Lifecycle) -> Self {
        SessionManager {
            lifecycle,
            layout: WorkspaceLayout::standard(),
            validator: ScriptValidator::new(),
        }
    }

    /// Uses another workspace layout (a validated output directory override).
    #[must_use]
    pub fn with_layout(mut self, layout: WorkspaceLayout) -> Self {
        self.layout = layout;
        self
    }

    /// The coordinator.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// The workspace layout.
    pub fn layout(&self) -> &WorkspaceLayout {
        &self.layout
    }

    /// The backend this manager's sandboxes run on.
    pub fn backend(&self) -> Provider {
        self.lifecycle.provider().provider()
    }

    /// Whether the backend keeps detached terminals and reattaches to them by pid; asked
    /// without touching any sandbox.
    pub fn supports_terminal_reattach(&self) -> bool {
        narrow::terminal_reattach(&**self.lifecycle.provider()).is_some()
    }

    /// Whether the backend can open terminals (PTYs) at all; asked without touching any
    /// session, so a caller can refuse before it commits to anything.
    pub fn supports_terminals(&self) -> bool {
        narrow::terminals(&**self.lifecycle.provider()).is_some()
    }

    // ---- provisioning operations ----------------------------------------------------------

    /// The session's sandbox, created on first use.
    pub async fn resolve(&self, key: &BindingKey) -> Result<SandboxHandle, Error> {
        self.lifecycle.resolve(key).await
    }

    /// Runs a command in the session's sandbox, within the tenant's `max_concurrent_execs`.
    /// A sandbox that vanishes while the command runs answers `sandbox_gone`, and its binding
    /// is dropped so the next call gets a fresh sandbox.
    pub async fn exec(&self, key: &BindingKey, request: ExecRequest) -> Result<ExecResult, Error> {
        request.validate()?;
        let _running = self.exec_slot(key.tenant)?;
        let handle = self.lifecycle.resolve(key).await?;
        let result = self.lifecycle.provider().exec(&handle, request).await;
        self.forget_if_gone(key, &handle, result).await
    }

    fn exec_slot(&self, tenant: TenantId) -> Result<QuotaPermit, Error> {
        self.lifecycle
            .quotas()
            .acquire(Operation::EXEC, tenant, Counted::Exec, 0)
    }

    /// Passes `result` through, dropping the session's binding first when it says the bound
    /// sandbox is gone.
    async fn forget_if_gone<T>(
        &self,
        key: &BindingKey,
        handle: &SandboxHandle,
        result: Result<T, Error>,
    ) -> Result<T, Error> {
        if let Err(e) = &result
            && e.code() == Some(ErrorCode::SandboxGone)
            && let Err(store) = self.lifecycle.forget_gone(key, handle.id()).await
        {
            // The next resolve proves the sandbox gone again and replaces the binding then.
            tracing::warn!(session = %key, error = %store, "could not drop the binding of a vanished sandbox");
        }
        result
    }

    /// Writes a model-authored file: anywhere in the sandbox except the attachments directory.
    pub async fn write_file(
        &self,
        key: &BindingKey,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        self.layout.check_model_write(path)?;
        let handle = self.lifecycle.resolve(key).await?;
        self.lifecycle
            .provider()
            .write_file(&handle, path, content)
            .await
    }

    /// Writes an attachment: only below the attachments directory (`/workspace/input`).
    pub async fn write_attachment(
        &self,
        key: &BindingKey,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        self.layout.check_attachment_write(path)?;
        let handle = self.lifecycle.resolve(key).await?;
        self.prepare_workspace(&handle).await?;
        self.lifecycle
            .provider()
            .write_file(&handle, path, content)
            .await
    }

    /// Creates a directory and its parents (an existing directory is success). Model-authored,
    /// so the model-write rule applies (never under the attachments directory); provisions.
    pub async fn make_dir(&self, key: &BindingKey, path: &SandboxPath) -> Result<(), Error> {
        self.layout.check_model_write(path)?;
        let handle = self.lifecycle.resolve(key).await?;
        self.lifecycle.provider().make_dir(&handle, path).await
    }

    /// Makes sure the layout's directories exist, through provider file operations only: a
    /// missing directory is created; a file or symlink where a directory belongs is refused —
    /// never deleted, renamed or followed (a symlink planted at `/workspace/output` must not
    /// make later writes land in `/etc`).
    pub async fn prepare_workspace(&self, handle: &SandboxHandle) -> Result<(), Error> {
        let provider = self.lifecycle.provider();
        for dir in [&self.layout.root, &self.layout.input, &self.layout.output] {
            match provider.stat(handle, dir).await {
                Ok(st) if st.kind == EntryKind::Dir => {}
                Ok(st) => {
                    return Err(Error::invalid_request(
                        Operation::new("prepare_workspace"),
                        format!(
                            "{dir} is not a directory ({:?}); refusing to use or replace it",
                            st.kind
                        ),
                    )
                    .with_code(ErrorCode::InvalidPath));
                }
                Err(e) if e.kind() == ErrorKind::NotFound => provider.make_dir(handle, dir).await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Runs a script: validation (unless skipped), upload into the workspace root, the
    /// interpreter its extension names, arguments, stdin, timeout. With `key = None` the run is
    /// ephemeral: a fresh sandbox of `tenant` is created and deleted afterwards, also when the
    /// caller goes away. Either way the run counts against the tenant's
    /// `max_concurrent_execs`, and an ephemeral sandbox against its `max_sandboxes`.
    pub async fn execute(
        &self,
        tenant: TenantId,
        key: Option<&BindingKey>,
        script: Script,
    ) -> Result<ExecResult, Error> {
        let op = Operation::new("execute");
        if !script.skip_validation {
            self.validator
                .validate_all(
                    &script.content,
                    &script.args,
                    script.stdin.as_deref().unwrap_or(""),
                )
                .into_result()?;
        }
        if script.file_name.is_empty()
            || script.file_name.contains('/')
            || script.file_name.starts_with('.')
        {
            return Err(Error::invalid_request(
                op,
                format!("invalid script file name {:?}", script.file_name),
            ));
        }
        let path = self.layout.root.join(&script.file_name)?;
        let (interpreter, pre_args) = interpreter_for(&path).ok_or_else(|| {
            Error::invalid_request(
                op,
                format!(
                    "no interpreter for {:?} (use .py, .sh, .js, ...)",
                    script.file_name
                ),
            )
        })?;
        let mut argv: Vec<String> = pre_args.iter().map(|a| (*a).to_owned()).collect();
        argv.push(path.as_str().to_owned());
        argv.extend(script.args.iter().cloned());
        let mut request = ExecRequest::argv(interpreter, argv).cwd(self.layout.root.clone());
        request.env = script.env.clone();
        request.stdin = script.stdin.map(String::into_bytes);
        request.timeout = script.timeout;
        request.validate()?;
        let _running = self.exec_slot(key.map_or(tenant, |k| k.tenant))?;

        match key {
            Some(key) => {
                let handle = self.lifecycle.resolve(key).await?;
                let result = self
                    .run_script(&handle, &path, script.content.as_bytes(), request)
                    .await;
                self.forget_if_gone(key, &handle, result).await
            }
            None => {
                let ephemeral = Ephemeral::create(&self.lifecycle, tenant).await?;
                let result = self
                    .run_script(&ephemeral.handle, &path, script.content.as_bytes(), request)
                    .await;
                let deleted = ephemeral.delete().await;
                match (result, deleted) {
                    (Ok(r), Ok(())) => Ok(r),
                    (Ok(_), Err(e)) | (Err(e), _) => Err(e),
                }
            }
        }
    }

    async fn run_script(
        &self,
        handle: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        self.prepare_workspace(handle).await?;
        let provider = self.lifecycle.provider();
        provider.write_file(handle, path, content).await?;
        provider.exec(handle, request).await
    }

    // ---- lookup-only operations ----------------------------------------------------------

    async fn bound(&self, key: &BindingKey, op: Operation) -> Result<SandboxHandle, Error> {
        self.lifecycle
            .lookup(key)
            .await?
            .ok_or_else(|| no_live_sandbox(op, key))
    }

    /// The bound sandbox's id and last recorded state, read from the binding store without
    /// connecting: a connect would resume a paused sandbox and bill it again. `None` when
    /// nothing is bound, or the binding belongs to another backend.
    pub async fn peek(&self, key: &BindingKey) -> Result<Option<(SandboxId, SandboxState)>, Error> {
        self.lifecycle.peek_state(key).await
    }

    /// Reads a file of the session's live sandbox. No sandbox bound: `no_live_sandbox`.
    pub async fn read_file(&self, key: &BindingKey, path: &SandboxPath) -> Result<Vec<u8>, Error> {
        let handle = self.bound(key, Operation::READ_FILE).await?;
        self.lifecycle.provider().read_file(&handle, path).await
    }

    /// Streams a file of the session's live sandbox, at most `max_bytes` of it (see the
    /// provider's `[files.stream]` contract). No sandbox bound: `no_live_sandbox`.
    pub async fn read_file_stream(
        &self,
        key: &BindingKey,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        let handle = self.bound(key, Operation::READ_FILE).await?;
        self.lifecycle
            .provider()
            .read_file_stream(&handle, path, max_bytes)
            .await
    }

    /// Metadata of one path of the live sandbox. No sandbox bound: `no_live_sandbox`.
    pub async fn stat(&self, key: &BindingKey, path: &SandboxPath) -> Result<StatEntry, Error> {
        let handle = self.bound(key, Operation::STAT).await?;
        self.lifecycle.provider().stat(&handle, path).await
    }

    /// Lists `dir` recursively within `limits` (depth, entries, time; a walk cut short says
    /// `truncated`). No sandbox bound, or a missing root: an empty listing, so "no sandbox yet"
    /// and "no output yet" read the same.
    pub async fn list_files(
        &self,
        key: &BindingKey,
        dir: &SandboxPath,
        limits: TreeLimits,
    ) -> Result<TreeListing, Error> {
        let Some(handle) = self.lifecycle.lookup(key).await? else {
            return Ok(TreeListing::default());
        };
        match self
            .lifecycle
            .provider()
            .list_tree(&handle, dir, limits)
            .await
        {
            Err(e)
                if e.kind() == ErrorKind::NotFound && e.code() != Some(ErrorCode::SandboxGone) =>
            {
                Ok(TreeListing::default())
            }
            other => other,
        }
    }

    /// Removes a model-authored path recursively. The model-write rule applies (never under
    /// the attachments directory). Lookup-only: nothing bound is `no_live_sandbox`; a missing
    /// path is the provider's `not_found`.
    pub async fn remove(&self, key: &BindingKey, path: &SandboxPath) -> Result<(), Error> {
        self.layout.check_model_write(path)?;
        let handle = self.bound(key, Operation::REMOVE).await?;
        self.lifecycle.provider().remove(&handle, path).await
    }

    /// Removes a staged attachment. Nothing bound: nothing to remove (success).
    pub async fn remove_attachment(
        &self,
        key: &BindingKey,
        path: &SandboxPath,
    ) -> Result<(), Error> {
        self.layout.check_attachment_write(path)?;
        let Some(handle) = self.lifecycle.lookup(key).await? else {
            return Ok(());
        };
        match self.lifecycle.provider().remove(&handle, path).await {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// `no_live_sandbox` when nothing is bound, `session_sandbox_paused` when the bound sandbox
    /// is not confirmed running — checked without connecting, because a connect would resume a
    /// paused sandbox and bill it again.
    pub async fn require_running(&self, key: &BindingKey) -> Result<(), Error> {
        match self.lifecycle.peek_state(key).await? {
            None => Err(no_live_sandbox(OP_TERMINAL, key)),
            Some((_, SandboxState::Running)) => Ok(()),
            Some((id, state)) => Err(Error::new(
                ErrorKind::Conflict,
                OP_TERMINAL,
                format!("sandbox {id} of session {key} is {state}; resume it explicitly first"),
            )
            .with_code(ErrorCode::SandboxPaused)),
        }
    }

    /// Opens a PTY on the session's bound sandbox, within the tenant's `max_terminals` (the
    /// slot is held by the returned [`TerminalLease`]). Lookup-only: nothing bound is
    /// `no_live_sandbox`; a bound sandbox not confirmed running is `session_sandbox_paused`
    /// unless `options.allow_resume`; a backend without PTYs is `terminal_unsupported`.
    pub async fn open_terminal(
        &self,
        key: &BindingKey,
        options: TerminalOptions,
    ) -> Result<TerminalLease, Error> {
        let provider = self.lifecycle.provider();
        let Some(terminals) = narrow::terminals(&**provider) else {
            return Err(Error::unsupported(
                OP_TERMINAL,
                format!("the {} backend cannot open terminals", provider.provider()),
            )
            .with_code(ErrorCode::TerminalUnsupported));
        };
        let slot = self.terminal_slot(key.tenant)?;
        if !options.allow_resume {
            self.require_running(key).await?;
        }
        let handle = self.bound(key, OP_TERMINAL).await?;
        let terminal = terminals.open_terminal(&handle, options).await?;
        Ok(TerminalLease {
            terminal,
            _slot: slot,
        })
    }

    /// Reattaches to the running terminal `pid` of the session's bound sandbox (within the
    /// tenant's `max_terminals`, like an open). The sandbox is the session's, so a pid can only
    /// name a terminal of this session's sandbox; one that names none is `terminal_not_found`
    /// (never a reason to replace the binding). Lookup-only, and never resumes: a detached
    /// terminal lives in a running sandbox. A backend that cannot reattach is
    /// `terminal_reattach_unsupported`.
    pub async fn reattach_terminal(
        &self,
        key: &BindingKey,
        pid: u32,
        size: sandbox_core::TerminalSize,
    ) -> Result<TerminalLease, Error> {
        let op = Operation::REATTACH_TERMINAL;
        let provider = self.lifecycle.provider();
        let Some(reattach) = narrow::terminal_reattach(&**provider) else {
            return Err(Error::unsupported(
                op,
                format!(
                    "the {} backend cannot reattach to terminals: they end with their connection",
                    provider.provider()
                ),
            )
            .with_code(ErrorCode::TerminalReattachUnsupported));
        };
        let slot = self.terminal_slot(key.tenant)?;
        self.require_running(key).await?;
        let handle = self.bound(key, op).await?;
        let terminal = reattach.reattach_terminal(&handle, pid, size).await?;
        Ok(TerminalLease {
            terminal,
            _slot: slot,
        })
    }

    /// One of the tenant's `max_terminals` slots, taken without opening anything (a caller that
    /// must refuse before an upgrade asks here first).
    pub fn terminal_slot(&self, tenant: TenantId) -> Result<QuotaPermit, Error> {
        self.lifecycle
            .quotas()
            .acquire(OP_TERMINAL, tenant, Counted::Terminal, 0)
    }

    /// Refreshes the provider's idle timer of the bound sandbox and returns how long the caller
    /// may wait before the next refresh; `Duration::ZERO` when nothing is bound or the backend
    /// has nothing to refresh. Lookup-only.
    pub async fn keep_alive(&self, key: &BindingKey) -> Result<Duration, Error> {
        let provider = self.lifecycle.provider();
        let Some(keep) = narrow::keep_alive(&**provider) else {
            return Ok(Duration::ZERO);
        };
        let Some(handle) = self.lifecycle.lookup(key).await? else {
            return Ok(Duration::ZERO);
        };
        let ttl = match self.lifecycle.config().create_request.timeout.idle {
            sandbox_core::IdleTimeout::After(d) => d,
            _ => DEFAULT_TTL,
        };
        keep.keep_alive(&handle, ttl).await?;
        Ok((ttl / 3).clamp(MIN_REFRESH, MAX_REFRESH))
    }

    // ---- background processes, streamed files, watch (issue 17) ------------------------------
    //
    // Only a start and a streamed write provision; every other call is lookup-only, so
    // listing, attaching, signalling or watching never creates (or resumes and re-bills) a
    // sandbox. None of them ever replaces a binding on its own error: a missing *process*
    // (`process_not_found`, kind `not_found`) says nothing about the sandbox; only a
    // `sandbox_gone` drops the binding, as for exec.

    /// Whether the backend runs background processes (declared and implemented).
    pub fn supports_processes(&self) -> bool {
        narrow::processes(&**self.lifecycle.provider()).is_some()
    }

    /// Whether the backend streams files without holding them whole.
    pub fn supports_streamed_files(&self) -> bool {
        narrow::streamed_files(&**self.lifecycle.provider()).is_some()
    }

    /// Whether the backend watches directories.
    pub fn supports_watch(&self) -> bool {
        narrow::watch(&**self.lifecycle.provider()).is_some()
    }

    fn processes(&self, op: Operation) -> Result<&dyn Processes, Error> {
        let provider = self.lifecycle.provider();
        narrow::processes(&**provider).ok_or_else(|| {
            Error::unsupported(
                op,
                format!(
                    "the {} backend cannot run background processes",
                    provider.provider()
                ),
            )
        })
    }

    fn streamed(&self, op: Operation) -> Result<&dyn StreamedFiles, Error> {
        let provider = self.lifecycle.provider();
        narrow::streamed_files(&**provider).ok_or_else(|| {
            Error::unsupported(
                op,
                format!("the {} backend cannot stream files", provider.provider()),
            )
        })
    }

    /// One of the tenant's `max_streams` slots (a process attach or a watch).
    pub fn stream_slot(&self, op: Operation, tenant: TenantId) -> Result<QuotaPermit, Error> {
        self.lifecycle
            .quotas()
            .acquire(op, tenant, Counted::Stream, 0)
    }

    /// Starts a background process in the session's sandbox, created on first use (a start is
    /// the one process call that provisions: it is where the work begins).
    pub async fn start_process(
        &self,
        key: &BindingKey,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error> {
        spec.validate()?;
        let processes = self.processes(Operation::START_PROCESS)?;
        let handle = self.lifecycle.resolve(key).await?;
        let result = processes.start_process(&handle, spec).await;
        self.forget_if_gone(key, &handle, result).await
    }

    /// The background processes of the session's sandbox. Lookup-only: nothing bound lists
    /// nothing.
    pub async fn list_processes(&self, key: &BindingKey) -> Result<Vec<ProcessInfo>, Error> {
        let processes = self.processes(Operation::LIST_PROCESSES)?;
        let Some(handle) = self.lifecycle.lookup(key).await? else {
            return Ok(Vec::new());
        };
        let result = processes.list_processes(&handle).await;
        self.forget_if_gone(key, &handle, result).await
    }

    /// Attaches to a process's output from the replay offset `from`, within the tenant's
    /// `max_streams` (the slot is held by the returned lease). Lookup-only.
    pub async fn attach_process(
        &self,
        key: &BindingKey,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<StreamLease<ProcessStream>, Error> {
        let op = Operation::ATTACH_PROCESS;
        let processes = self.processes(op)?;
        let slot = self.stream_slot(op, key.tenant)?;
        let handle = self.bound(key, op).await?;
        let result = processes.attach_process(&handle, target, from).await;
        let stream = self.forget_if_gone(key, &handle, result).await?;
        Ok(StreamLease {
            stream,
            _slot: slot,
        })
    }

    /// Writes to a process's stdin. Lookup-only.
    pub async fn send_input(
        &self,
        key: &BindingKey,
        target: &ProcessSelector,
        data: &[u8],
    ) -> Result<(), Error> {
        let op = Operation::SEND_INPUT;
        let processes = self.processes(op)?;
        let handle = self.bound(key, op).await?;
        let result = processes.send_input(&handle, target, data).await;
        self.forget_if_gone(key, &handle, result).await
    }

    /// Closes a process's stdin. Lookup-only.
    pub async fn close_stdin(
        &self,
        key: &BindingKey,
        target: &ProcessSelector,
    ) -> Result<(), Error> {
        let op = Operation::CLOSE_STDIN;
        let processes = self.processes(op)?;
        let handle = self.bound(key, op).await?;
        let result = processes.close_stdin(&handle, target).await;
        self.forget_if_gone(key, &handle, result).await
    }

    /// Sends `signal` to a process. Lookup-only.
    pub async fn signal_process(
        &self,
        key: &BindingKey,
        target: &ProcessSelector,
        signal: Signal,
    ) -> Result<(), Error> {
        let op = Operation::SIGNAL_PROCESS;
        let processes = self.processes(op)?;
        let handle = self.bound(key, op).await?;
        let result = processes.signal_process(&handle, target, signal).await;
        self.forget_if_gone(key, &handle, result).await
    }

    /// Streams a file of the live sandbox through the backend's `streamed_files` (never a
    /// buffering fallback). Lookup-only.
    pub async fn read_stream(
        &self,
        key: &BindingKey,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        let op = Operation::READ_FILE_STREAM;
        let streamed = self.streamed(op)?;
        let handle = self.bound(key, op).await?;
        let result = streamed.read_stream(&handle, path, max_bytes).await;
        self.forget_if_gone(key, &handle, result).await
    }

    /// Writes a model-authored file from `source` as it is pulled (atomic: the target changes
    /// only once the source ended cleanly within `max_bytes`). Provisions, like a whole
    /// upload; the model-write rule applies.
    pub async fn write_stream(
        &self,
        key: &BindingKey,
        path: &SandboxPath,
        source: ReadStream,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        self.layout.check_model_write(path)?;
        let streamed = self.streamed(Operation::WRITE_FILE_STREAM)?;
        let handle = self.lifecycle.resolve(key).await?;
        let result = streamed
            .write_stream(&handle, path, source, max_bytes)
            .await;
        self.forget_if_gone(key, &handle, result).await
    }

    /// Renames (moves) a model-authored path; the model-write rule applies to both ends.
    /// Lookup-only, like a removal.
    pub async fn rename_path(
        &self,
        key: &BindingKey,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> Result<(), Error> {
        self.layout.check_model_write(from)?;
        self.layout.check_model_write(to)?;
        let op = Operation::RENAME_PATH;
        let streamed = self.streamed(op)?;
        let handle = self.bound(key, op).await?;
        let result = streamed.rename_path(&handle, from, to).await;
        self.forget_if_gone(key, &handle, result).await
    }

    /// Watches a directory of the live sandbox, within the tenant's `max_streams`. Armed when
    /// this returns. Lookup-only.
    pub async fn watch_dir(
        &self,
        key: &BindingKey,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<StreamLease<WatchStream>, Error> {
        let op = Operation::WATCH_DIR;
        let provider = self.lifecycle.provider();
        let watch: &dyn Watch = narrow::watch(&**provider).ok_or_else(|| {
            Error::unsupported(
                op,
                format!(
                    "the {} backend cannot watch directories",
                    provider.provider()
                ),
            )
        })?;
        let slot = self.stream_slot(op, key.tenant)?;
        let handle = self.bound(key, op).await?;
        let result = watch.watch_dir(&handle, dir, recursive).await;
        let stream = self.forget_if_gone(key, &handle, result).await?;
        Ok(StreamLease {
            stream,
            _slot: slot,
        })
    }

    /// Destroys the session's sandbox and binding (idempotent).
    pub async fn destroy(&self, key: &BindingKey) -> Result<(), Error> {
        self.lifecycle.destroy(key).await
    }

    // ---- snapshots -------------------------------------------------------------------------

    /// Snapshots the session's bound sandbox. Never provisions: an unbound session has nothing
    /// worth snapshotting.
    pub async fn snapshot(
        &self,
        key: &BindingKey,
        name: Option<&str>,
    ) -> Result<SnapshotRef, Error> {
        let op = Operation::CREATE_SNAPSHOT;
        let provider = self.lifecycle.provider();
        let snapshots = narrow::snapshots(&**provider).ok_or_else(|| {
            Error::unsupported(
                op,
                format!("the {} backend cannot snapshot", provider.provider()),
            )
        })?;
        let handle = self.bound(key, op).await?;
        let _slot = match self.lifecycle.quotas().quota(key.tenant).max_snapshots {
            None => None,
            Some(_) => {
                // Reserve, then count the backend's (see QuotaGate::reserve).
                let reservation = self
                    .lifecycle
                    .quotas()
                    .reserve(key.tenant, Counted::TakingSnapshot);
                let kept = snapshots
                    .list_snapshots(None)
                    .await?
                    .iter()
                    .filter(|s| s.tenant == Some(key.tenant))
                    .count();
                Some(reservation.check(op, u32::try_from(kept).unwrap_or(u32::MAX))?)
            }
        };
        snapshots.create_snapshot(handle.id(), name).await
    }

    /// Creates session `target`'s sandbox from a snapshot (restore, or the second half of a
    /// fork). Refused when `target` already has a live sandbox: restoring over it would silently
    /// discard its workspace.
    pub async fn create_from_snapshot(
        &self,
        target: &BindingKey,
        snapshot: &SnapshotId,
    ) -> Result<SandboxHandle, Error> {
        if self.lifecycle.store().get(target).await?.is_some() {
            return Err(Error::conflict(
                Operation::CREATE,
                format!(
                    "session {target} already has a sandbox; destroy it before restoring a snapshot into it"
                ),
            ));
        }
        let template = TemplateId::new(snapshot.as_str())?;
        self.lifecycle
            .resolve_with(
                target,
                ResolveOptions {
                    template_override: Some(template),
                },
            )
            .await
    }

    /// Forks: snapshots `source` and creates `target` from the snapshot.
    pub async fn fork(
        &self,
        source: &BindingKey,
        target: &BindingKey,
    ) -> Result<(SnapshotRef, SandboxHandle), Error> {
        let snapshot = self.snapshot(source, Some("fork")).await?;
        let handle = self.create_from_snapshot(target, &snapshot.id).await?;
        Ok((snapshot, handle))
    }

    // ---- turns, rewind, invalidation -------------------------------------------------------

    /// Opens a chat-turn hold; the first resolve of the turn may rebuild a stale sandbox, later
    /// ones keep it. End it with [`TurnHold::end`] (dropping it ends it too, in the background).
    pub async fn begin_turn(&self, key: &BindingKey) -> Result<TurnHold, Error> {
        let store = self.lifecycle.store().clone();
        if let Some(leases) = store.turn_leases() {
            leases.begin_turn(key).await?;
            return Ok(TurnHold {
                store: Some(store),
                key: key.clone(),
            });
        }
        Ok(TurnHold {
            store: None,
            key: key.clone(),
        })
    }

    /// Takes the session's exclusive rewind lock; `None` when the store has no rewind locks
    /// (a single-process deployment without leases rewinds unguarded).
    pub async fn try_lock_rewind(&self, key: &BindingKey) -> Result<Option<RewindLock>, Error> {
        match self.lifecycle.store().rewind_locks() {
            Some(locks) => locks.try_lock_rewind(key).await.map(Some),
            None => Ok(None),
        }
    }

    /// Marks every sandbox of a config stale, so each session rebuilds from the config's current
    /// image at its next resolve. Deletes nothing.
    pub async fn invalidate_config(
        &self,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Result<InvalidationReport, Error> {
        self.lifecycle
            .store()
            .invalidate_by_config(tenant, config)
            .await
    }
}

/// An open terminal and the tenant's terminal slot it holds; dropping it frees the slot.
#[derive(Debug)]
pub struct TerminalLease {
    pub terminal: Terminal,
    _slot: QuotaPermit,
}

impl TerminalLease {
    /// The terminal and its slot, for a caller that moves them apart (the slot must live as
    /// long as the terminal is in use).
    pub fn into_parts(self) -> (Terminal, QuotaPermit) {
        (self.terminal, self._slot)
    }
}

/// An open attach or watch stream and the tenant's stream slot it holds; dropping it frees
/// the slot.
#[derive(Debug)]
pub struct StreamLease<S> {
    pub stream: S,
    _slot: QuotaPermit,
}

impl<S> StreamLease<S> {
    /// The stream and its slot, for a caller that moves them apart (the slot must live as
    /// long as the stream is read).
    pub fn into_parts(self) -> (S, QuotaPermit) {
        (self.stream, self._slot)
    }
}

/// One open chat-turn hold.
#[derive(Debug)]
pub struct TurnHold {
    store: Option<Arc<dyn sandbox_core::BindingStore>>,
    key: BindingKey,
}

impl TurnHold {
    /// Ends the hold.
    pub async fn end(mut self) -> Result<(), Error> {
        match self.store.take() {
            Some(store) => match store.turn_leases() {
                Some(leases) => leases.end_turn(&self.key).await,
                None => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Drop for TurnHold {
    fn drop(&mut self) {
        // A caller that went away must still release its hold, or the session keeps a turn
        // open (no rebuilds, no rewinds) until the lease expires.
        if let (Some(store), Ok(runtime)) =
            (self.store.take(), tokio::runtime::Handle::try_current())
        {
            let key = self.key.clone();
            runtime.spawn(async move {
                if let Some(leases) = store.turn_leases() {
                    let _ = leases.end_turn(&key).await;
                }
            });
        }
    }
}

/// A sandbox for one ephemeral run: deleted by [`Ephemeral::delete`], or — when the caller
/// goes away first — by a background task on drop.
struct Ephemeral {
    lifecycle: Lifecycle,
    handle: SandboxHandle,
    deleted: bool,
    /// The tenant's sandbox slot, held while the sandbox lives.
    _slot: Option<QuotaPermit>,
}

impl Ephemeral {
    async fn create(lifecycle: &Lifecycle, tenant: TenantId) -> Result<Ephemeral, Error> {
        let slot = lifecycle.sandbox_slot(tenant).await?;
        let mut request = lifecycle.config().create_request.clone();
        if lifecycle.provider().capabilities().metadata {
            // Marked so a reaper can tell an ephemeral leftover from a session sandbox, and
            // with its tenant so the tenant's sandbox quota counts it.
            request
                .metadata
                .insert("sandbox_ephemeral".to_owned(), "true".to_owned());
            request.metadata.insert(
                sandbox_core::owner_metadata::CONFIG.to_owned(),
                lifecycle.config().config_id.as_str().to_owned(),
            );
            request.metadata.insert(
                sandbox_core::owner_metadata::TENANT.to_owned(),
                tenant.to_string(),
            );
        }
        let handle = lifecycle.provider().create(request).await?;
        Ok(Ephemeral {
            lifecycle: lifecycle.clone(),
            handle,
            deleted: false,
            _slot: slot,
        })
    }

    async fn delete(mut self) -> Result<(), Error> {
        self.deleted = true;
        match tokio::time::timeout(
            crate::lifecycle::CLEANUP_TIMEOUT,
            self.lifecycle.provider().delete(self.handle.id()),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if e.can_replace_binding() => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::timeout(
                Operation::DELETE,
                format!("deleting ephemeral sandbox {}", self.handle.id()),
            )),
        }
    }
}

impl Drop for Ephemeral {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (provider, id) = (self.lifecycle.provider().clone(), self.handle.id().clone());
            runtime.spawn(async move {
                let _ =
                    tokio::time::timeout(crate::lifecycle::CLEANUP_TIMEOUT, provider.delete(&id))
                        .await;
            });
        }
    }
}
