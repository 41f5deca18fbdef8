//! The checking layer: refuses, before the adapter sees it, every request the adapter's own
//! declarations do not allow.
//!
//! Every adapter's public constructor returns its provider wrapped in [`Checked`], so the
//! refusals hold for an embedder that uses one adapter crate alone, and adapters do not repeat
//! them. What it checks, all from [`SandboxProvider::capabilities`] and
//! [`SandboxProvider::network_fields`]:
//! - create: the request's own validation (timeout policy, env names), then metadata without
//!   `metadata`, mounts without `volumes` (`[create.metadata]`, `[create.volumes]`), a user
//!   without `default_user` (`[create.user]`) and every network-policy field the adapter does
//!   not enforce, each named;
//! - exec: the request's own validation, and the shell form without `posix_shell`
//!   (`[exec.shell]`); the same for a background process's start;
//! - connect without `reconnect`, list (and its pages) without `list`, the directory operations without
//!   `fs_enumeration`;
//! - each capability trait's methods without the trait's flag.
//!
//! Every refusal is `unsupported` (validation failures `invalid_request`) and says the inner
//! provider's origin, as the adapter's own refusal did, so status codes and metric families
//! are what they were. The layer holds no state and needs no runtime.

use std::ops::Deref;
use std::time::Duration;

use async_trait::async_trait;

use crate::capabilities::{Capabilities, Capability};
use crate::error::{Error, ErrorCode, Operation};
use crate::exec::{Command, ExecRequest, ExecResult};
use crate::fs::{DirEntry, ReadStream, StatEntry, TreeLimits, TreeListing};
use crate::ids::{SandboxId, SnapshotId, TenantId};
use crate::path::SandboxPath;
use crate::ports::provider::{
    ConnectProbe, Desktop, KeepAlive, PauseResume, Processes, SandboxProvider, Snapshots,
    StreamedFiles, TemplateBuilds, TemplateCatalog, TerminalReattach, Terminals, Tunnel, Tunnels,
    Watch,
};
use crate::process::{ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, Signal};
use crate::provider::Provider;
use crate::sandbox::{
    ConnectRequest, CreateRequest, ListFilter, ListPage, NetworkFields, SandboxHandle, SandboxPage,
    SandboxSummary,
};
use crate::template::{
    BuiltTemplate, SnapshotRef, Template, TemplateBuildRequest, is_template_tag, is_template_word,
};
use crate::terminal::{DesktopOptions, DesktopStream, Terminal, TerminalOptions, TerminalSize};
use crate::watch::WatchStream;

/// A provider behind the checking policy.
///
/// It dereferences to the adapter, so adapter-specific methods (a sweep, the engine client,
/// the fake's failure injection) stay reachable; every port method goes through the policy,
/// because method resolution finds the wrapper's impl before it dereferences.
#[derive(Debug, Clone)]
pub struct Checked<P> {
    inner: P,
}

impl<P: SandboxProvider> Checked<P> {
    /// Wraps `inner`.
    pub fn new(inner: P) -> Self {
        Checked { inner }
    }

    /// The adapter itself, without the policy (its port methods then refuse nothing).
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Unwraps the adapter.
    pub fn into_inner(self) -> P {
        self.inner
    }

    fn unsupported(&self, op: Operation, message: impl Into<String>) -> Error {
        Error::unsupported(op, message).with_provider(self.inner.provider())
    }

    /// `capability` is declared, or the call is refused.
    fn require(&self, capability: Capability, op: Operation) -> Result<(), Error> {
        if self.inner.capabilities().has(capability) {
            Ok(())
        } else {
            Err(self.unsupported(
                op,
                format!(
                    "the {} backend does not declare {capability}",
                    self.inner.provider()
                ),
            ))
        }
    }

    /// The whole create policy; public so an adapter's tests can pin what it refuses.
    pub fn check_create(&self, request: &CreateRequest) -> Result<(), Error> {
        let op = Operation::CREATE;
        let provider = self.inner.provider();
        request
            .validate()
            .map_err(|e| e.with_operation(op).with_provider(provider))?;
        let caps = self.inner.capabilities();
        if !request.metadata.is_empty() && !caps.metadata {
            return Err(self.unsupported(
                op,
                format!("the {provider} backend does not store metadata"),
            ));
        }
        if !request.volumes.is_empty() && !caps.volumes {
            return Err(
                self.unsupported(op, format!("the {provider} backend does not mount volumes"))
            );
        }
        if request.user.is_some() && !caps.default_user {
            return Err(self.unsupported(
                op,
                format!(
                    "the {provider} backend cannot run a sandbox as a default user (it lacks \
                     default_user); remove user from the request"
                ),
            ));
        }
        let enforced = self.inner.network_fields();
        let refused: Vec<&str> = enforced
            .unenforced(&request.network)
            .map(|f| f.as_str())
            .collect();
        if !refused.is_empty() {
            return Err(self.unsupported(
                op,
                format!(
                    "the {provider} backend does not enforce the network policy field{} {}; \
                     remove {} from the policy",
                    if refused.len() == 1 { "" } else { "s" },
                    refused.join(", "),
                    if refused.len() == 1 { "it" } else { "them" },
                ),
            ));
        }
        Ok(())
    }

    /// The whole exec policy.
    pub fn check_exec(&self, request: &ExecRequest) -> Result<(), Error> {
        request.validate().map_err(|e| {
            e.with_operation(Operation::EXEC)
                .with_provider(self.inner.provider())
        })?;
        if matches!(request.command, Command::Shell(_)) && !self.inner.capabilities().posix_shell {
            return Err(self.unsupported(
                Operation::EXEC,
                format!(
                    "the {} backend has no POSIX shell (it lacks posix_shell); use the argv form",
                    self.inner.provider()
                ),
            ));
        }
        Ok(())
    }

    /// The start policy of a background process: the exec checks, on its spec.
    pub fn check_start_process(&self, spec: &ProcessSpec) -> Result<(), Error> {
        let op = Operation::START_PROCESS;
        spec.validate()
            .map_err(|e| e.with_operation(op).with_provider(self.inner.provider()))?;
        if matches!(spec.command, Command::Shell(_)) && !self.inner.capabilities().posix_shell {
            return Err(self.unsupported(
                op,
                format!(
                    "the {} backend has no POSIX shell (it lacks posix_shell); use the argv form",
                    self.inner.provider()
                ),
            ));
        }
        Ok(())
    }

    /// The inner capability, present because `as_*` handed out the wrapper only then.
    fn inner_capability<'a, T: ?Sized>(
        &'a self,
        capability: Capability,
        op: Operation,
        get: impl FnOnce(&'a P) -> Option<&'a T>,
    ) -> Result<&'a T, Error> {
        self.require(capability, op)?;
        get(&self.inner).ok_or_else(|| {
            self.unsupported(
                op,
                format!(
                    "the {} backend does not implement {capability}",
                    self.inner.provider()
                ),
            )
        })
    }
}

impl<P> Deref for Checked<P> {
    type Target = P;

    fn deref(&self) -> &P {
        &self.inner
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> SandboxProvider for Checked<P> {
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
        self.check_create(&request)?;
        self.inner.create(request).await
    }

    async fn connect(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        self.require(Capability::Reconnect, Operation::CONNECT)?;
        self.inner.connect(request).await
    }

    async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error> {
        self.inner.get(id).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SandboxSummary>, Error> {
        self.require(Capability::List, Operation::LIST)?;
        self.inner.list(filter).await
    }

    async fn list_page(&self, filter: &ListFilter, page: &ListPage) -> Result<SandboxPage, Error> {
        self.require(Capability::List, Operation::LIST)?;
        self.inner.list_page(filter, page).await
    }

    async fn delete(&self, id: &SandboxId) -> Result<(), Error> {
        self.inner.delete(id).await
    }

    async fn exec(
        &self,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        self.check_exec(&request)?;
        self.inner.exec(sandbox, request).await
    }

    async fn write_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        self.inner.write_file(sandbox, path, content).await
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
        self.require(Capability::FsEnumeration, Operation::LIST_DIR)?;
        self.inner.list_tree(sandbox, dir, limits).await
    }

    async fn list_dir(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<DirEntry>, Error> {
        self.require(Capability::FsEnumeration, Operation::LIST_DIR)?;
        self.inner.list_dir(sandbox, path).await
    }

    async fn make_dir(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        self.require(Capability::FsEnumeration, Operation::MAKE_DIR)?;
        self.inner.make_dir(sandbox, path).await
    }

    async fn remove(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        self.require(Capability::FsEnumeration, Operation::REMOVE)?;
        self.inner.remove(sandbox, path).await
    }

    async fn stat(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<StatEntry, Error> {
        self.require(Capability::FsEnumeration, Operation::STAT)?;
        self.inner.stat(sandbox, path).await
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

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> Snapshots for Checked<P> {
    async fn create_snapshot(
        &self,
        sandbox: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotRef, Error> {
        let op = Operation::CREATE_SNAPSHOT;
        self.inner_capability(Capability::Snapshots, op, |p| p.as_snapshots())?
            .create_snapshot(sandbox, name)
            .await
    }

    async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), Error> {
        let op = Operation::DELETE_SNAPSHOT;
        self.inner_capability(Capability::Snapshots, op, |p| p.as_snapshots())?
            .delete_snapshot(id)
            .await
    }

    async fn list_snapshots(&self, source: Option<&SandboxId>) -> Result<Vec<SnapshotRef>, Error> {
        let op = Operation::LIST_SNAPSHOTS;
        self.inner_capability(Capability::Snapshots, op, |p| p.as_snapshots())?
            .list_snapshots(source)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> TemplateCatalog for Checked<P> {
    async fn list_templates(&self) -> Result<Vec<Template>, Error> {
        let op = Operation::LIST_TEMPLATES;
        self.inner_capability(Capability::TemplateCatalog, op, |p| p.as_template_catalog())?
            .list_templates()
            .await
    }

    async fn ensure_standard_template(&self) -> Result<Template, Error> {
        let op = Operation::ENSURE_TEMPLATE;
        self.inner_capability(Capability::TemplateCatalog, op, |p| p.as_template_catalog())?
            .ensure_standard_template()
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> Terminals for Checked<P> {
    async fn open_terminal(
        &self,
        sandbox: &SandboxHandle,
        options: TerminalOptions,
    ) -> Result<Terminal, Error> {
        let op = Operation::OPEN_TERMINAL;
        let terminals = self.inner_capability(Capability::Pty, op, |p| p.as_terminals())?;
        options.validate()?;
        terminals.open_terminal(sandbox, options).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> TerminalReattach for Checked<P> {
    async fn reattach_terminal(
        &self,
        sandbox: &SandboxHandle,
        pid: u32,
        size: TerminalSize,
    ) -> Result<Terminal, Error> {
        let op = Operation::REATTACH_TERMINAL;
        self.inner_capability(Capability::TerminalReattach, op, |p| {
            p.as_terminal_reattach()
        })
        .map_err(|e| e.with_code(ErrorCode::TerminalReattachUnsupported))?
        .reattach_terminal(sandbox, pid, size)
        .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> Desktop for Checked<P> {
    async fn dial_desktop(
        &self,
        sandbox: &SandboxHandle,
        options: DesktopOptions,
    ) -> Result<Box<dyn DesktopStream>, Error> {
        let op = Operation::DIAL_DESKTOP;
        self.inner_capability(Capability::Desktop, op, |p| p.as_desktop())?
            .dial_desktop(sandbox, options)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> KeepAlive for Checked<P> {
    async fn keep_alive(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), Error> {
        let op = Operation::KEEP_ALIVE;
        self.inner_capability(Capability::KeepAlive, op, |p| p.as_keep_alive())?
            .keep_alive(sandbox, ttl)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> ConnectProbe for Checked<P> {
    async fn connect_session(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        let op = Operation::CONNECT_SESSION;
        self.inner_capability(Capability::ConnectProbe, op, |p| p.as_connect_probe())?
            .connect_session(request)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> Processes for Checked<P> {
    async fn start_process(
        &self,
        sandbox: &SandboxHandle,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error> {
        let op = Operation::START_PROCESS;
        let inner = self.inner_capability(Capability::Processes, op, |p| p.as_processes())?;
        self.check_start_process(&spec)?;
        inner.start_process(sandbox, spec).await
    }

    async fn list_processes(&self, sandbox: &SandboxHandle) -> Result<Vec<ProcessInfo>, Error> {
        let op = Operation::LIST_PROCESSES;
        self.inner_capability(Capability::Processes, op, |p| p.as_processes())?
            .list_processes(sandbox)
            .await
    }

    async fn attach_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<ProcessStream, Error> {
        let op = Operation::ATTACH_PROCESS;
        self.inner_capability(Capability::Processes, op, |p| p.as_processes())?
            .attach_process(sandbox, target, from)
            .await
    }

    async fn send_input(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        data: &[u8],
    ) -> Result<(), Error> {
        let op = Operation::SEND_INPUT;
        self.inner_capability(Capability::Processes, op, |p| p.as_processes())?
            .send_input(sandbox, target, data)
            .await
    }

    async fn close_stdin(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
    ) -> Result<(), Error> {
        let op = Operation::CLOSE_STDIN;
        self.inner_capability(Capability::Processes, op, |p| p.as_processes())?
            .close_stdin(sandbox, target)
            .await
    }

    async fn signal_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        signal: Signal,
    ) -> Result<(), Error> {
        let op = Operation::SIGNAL_PROCESS;
        self.inner_capability(Capability::Processes, op, |p| p.as_processes())?
            .signal_process(sandbox, target, signal)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> StreamedFiles for Checked<P> {
    async fn read_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        let op = Operation::READ_FILE_STREAM;
        self.inner_capability(Capability::StreamedFiles, op, |p| p.as_streamed_files())?
            .read_stream(sandbox, path, max_bytes)
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
        self.inner_capability(Capability::StreamedFiles, op, |p| p.as_streamed_files())?
            .write_stream(sandbox, path, source, max_bytes)
            .await
    }

    async fn rename_path(
        &self,
        sandbox: &SandboxHandle,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> Result<(), Error> {
        let op = Operation::RENAME_PATH;
        self.inner_capability(Capability::StreamedFiles, op, |p| p.as_streamed_files())?
            .rename_path(sandbox, from, to)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> Watch for Checked<P> {
    async fn watch_dir(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        let op = Operation::WATCH_DIR;
        self.inner_capability(Capability::Watch, op, |p| p.as_watch())?
            .watch_dir(sandbox, dir, recursive)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> PauseResume for Checked<P> {
    async fn pause(&self, id: &SandboxId) -> Result<(), Error> {
        let op = Operation::PAUSE;
        self.inner_capability(Capability::PauseResume, op, |p| p.as_pause_resume())?
            .pause(id)
            .await
    }

    async fn resume(&self, id: &SandboxId) -> Result<(), Error> {
        let op = Operation::RESUME;
        self.inner_capability(Capability::PauseResume, op, |p| p.as_pause_resume())?
            .resume(id)
            .await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> Tunnels for Checked<P> {
    async fn open_tunnel(&self, sandbox: &SandboxHandle, port: u16) -> Result<Tunnel, Error> {
        let op = Operation::OPEN_TUNNEL;
        let inner = self.inner_capability(Capability::Tunnels, op, |p| p.as_tunnels())?;
        // [tunnel.port]: refused before the sandbox is asked, for every adapter alike.
        if port == 0 {
            return Err(crate::tunnel_errors::invalid_port(port).with_origin(crate::Origin::Caller));
        }
        inner.open_tunnel(sandbox, port).await
    }
}

/// Refuses a template ID or tag list no backend could keep, before it reaches one.
fn check_template_words(op: Operation, template_id: &str, tags: &[String]) -> Result<(), Error> {
    if !is_template_word(template_id) {
        return Err(Error::invalid_request(
            op,
            "the template ID must be lower-case letters, digits and -",
        ));
    }
    if !tags.iter().all(|t| is_template_tag(t)) {
        return Err(Error::invalid_request(
            op,
            "a tag must be lower-case letters, digits, -, _ and .",
        ));
    }
    Ok(())
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: SandboxProvider> TemplateBuilds for Checked<P> {
    async fn build_template(&self, request: &TemplateBuildRequest) -> Result<BuiltTemplate, Error> {
        let op = Operation::BUILD_TEMPLATE;
        let inner =
            self.inner_capability(Capability::TemplateBuilds, op, |p| p.as_template_builds())?;
        request.validate()?;
        inner.build_template(request).await
    }

    async fn list_built_templates(&self, tenant: TenantId) -> Result<Vec<BuiltTemplate>, Error> {
        let op = Operation::LIST_BUILT_TEMPLATES;
        self.inner_capability(Capability::TemplateBuilds, op, |p| p.as_template_builds())?
            .list_built_templates(tenant)
            .await
    }

    async fn tag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        build_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        let op = Operation::TAG_TEMPLATE;
        let inner =
            self.inner_capability(Capability::TemplateBuilds, op, |p| p.as_template_builds())?;
        check_template_words(op, template_id, tags)?;
        check_template_words(op, build_id, &[])?;
        inner
            .tag_built_template(tenant, template_id, build_id, tags)
            .await
    }

    async fn untag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        let op = Operation::UNTAG_TEMPLATE;
        let inner =
            self.inner_capability(Capability::TemplateBuilds, op, |p| p.as_template_builds())?;
        check_template_words(op, template_id, tags)?;
        inner.untag_built_template(tenant, template_id, tags).await
    }

    async fn delete_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
    ) -> Result<(), Error> {
        let op = Operation::DELETE_TEMPLATE;
        let inner =
            self.inner_capability(Capability::TemplateBuilds, op, |p| p.as_template_builds())?;
        check_template_words(op, template_id, &[])?;
        inner.delete_built_template(tenant, template_id).await
    }
}
