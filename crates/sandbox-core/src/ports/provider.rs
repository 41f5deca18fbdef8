//! The provider port and its optional capability traits.
//!
//! Contract bullets the conformance suite in `sandbox-testkit` checks carry a tag in brackets
//! (e.g. `[delete.absent]`), and each case cites the tags it checks. `cargo xtask tidy` (rule
//! `contract-tags`) keeps the two in step: every tag here is cited by a case, every cite is a
//! tag here. A bullet without a tag is a rule the suite cannot observe through the port.

use std::time::Duration;

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::Error;
use crate::exec::{ExecRequest, ExecResult};
use crate::fs::{BufferedStream, DirEntry, ReadStream, StatEntry, TreeLimits, TreeListing};
use crate::ids::TenantId;
use crate::ids::{SandboxId, SnapshotId};
use crate::path::SandboxPath;
use crate::process::{ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, Signal};
use crate::provider::Provider;
use crate::sandbox::{
    ConnectRequest, CreateRequest, ListFilter, ListPage, NetworkFields, SandboxHandle, SandboxPage,
    SandboxSummary,
};
use crate::template::{BuiltTemplate, SnapshotRef, Template, TemplateBuildRequest};
use crate::terminal::{DesktopOptions, DesktopStream, Terminal, TerminalOptions, TerminalSize};
use crate::watch::WatchStream;

/// A sandbox backend (Docker engine, E2B, Cube, the test kit's fake).
///
/// General rules, for every method:
/// - `[general.concurrency]` Safe for concurrent use from many tasks.
/// - `[general.cancel]` Every call may be cancelled by dropping its future. A dropped call
///   leaves nothing running that the adapter started *for the call itself* (an exec'd process
///   is killed); a dropped [`create`](SandboxProvider::create) may leave a sandbox behind,
///   which metadata recovery or the orphan reaper reclaims (so `create` must stamp the
///   request's metadata before it can be observed).
/// - Failures are [`Error`]s with the kind that describes them; in
///   particular `not_found`/`terminal` only when the provider *proved* the sandbox is gone,
///   because only those kinds let a caller replace a session's binding. (Untagged: each
///   method's own bullets check the kinds it returns, and an unproven failure of a real
///   backend is not something a conformance run can provoke.)
/// - `[files.path]` Every file method takes a [`SandboxPath`]: absolute and normalised, so a
///   relative, empty or traversing path (or one with a NUL byte) is refused with
///   `invalid_request` where the caller builds it and never reaches an adapter.
#[async_trait]
pub trait SandboxProvider: Send + Sync + std::fmt::Debug {
    /// Which backend this is; recorded in bindings to detect provider switches.
    fn provider(&self) -> Provider;

    /// The static capability set. Callable before [`health`](SandboxProvider::health).
    /// - `[capabilities.static]` Known without contacting the backend, and exactly the set the
    ///   adapter documents (its conformance test pins it, so a case cannot vanish because the
    ///   adapter declared less).
    /// - `[capabilities.callable]` Each optional trait's flag is set exactly when its `as_*`
    ///   accessor returns it, so [`narrow`] finds every declared capability.
    fn capabilities(&self) -> Capabilities;

    /// The [`NetworkPolicy`](crate::NetworkPolicy) fields this backend enforces at create.
    ///
    /// A create setting a field not declared here is refused with `unsupported` naming the
    /// field (never accepted and left unapplied). The checking layer
    /// ([`crate::layers::Checked`]) does the refusing and adapters only declare, so this is
    /// tested once, on the layer (`sandbox-testkit`'s `tests/checking.rs`), not per adapter.
    fn network_fields(&self) -> NetworkFields;

    /// Probes the control plane.
    /// - `[health.ok]` `Ok(())` when reachable and authenticated.
    async fn health(&self) -> Result<(), Error>;

    /// Spawns a sandbox.
    /// - `[create.metadata]` With the `metadata` capability, the request's metadata is stored
    ///   and returned by `get`/`list`; without it, non-empty metadata is refused with
    ///   `unsupported` (never silently dropped).
    /// - `[create.unknown_template]` A template the provider does not know is
    ///   `invalid_request`.
    /// - `[create.volumes]` Without the `volumes` capability, non-empty mounts are refused with
    ///   `unsupported`.
    /// - `[create.running]` The returned sandbox is running and accepts `exec`.
    /// - `[create.snapshot_owner]` With `from_snapshot`, the template must be a snapshot this
    ///   client took, in its namespace, of a sandbox of the tenant the request's ownership
    ///   metadata names (`owner_metadata::TENANT`; none names only snapshots without a tenant).
    ///   Anything else, whether missing, foreign or not a snapshot at all, is `not_found` with
    ///   code `snapshot_not_found` and one message for all of them, and nothing is fetched from
    ///   a registry on the way.
    /// - `[create.user]` With the `default_user` capability, a request's
    ///   [`user`](CreateRequest::user) is who every process, file operation and terminal that
    ///   names no user acts as, and a process that names no `cwd` starts in its `workdir`
    ///   (which exists afterwards); without the capability, a request naming a user is refused
    ///   with `unsupported`.
    async fn create(&self, request: CreateRequest) -> Result<SandboxHandle, Error>;

    /// Re-attaches to an existing sandbox, resuming it when it is paused or stopped.
    /// - `[connect.gone]` A deleted, unknown or terminal sandbox is `not_found` or `terminal`
    ///   (replaceable); every other failure keeps another kind.
    /// - `[connect.token]` The request's traffic token is carried on the handle when the
    ///   provider's answer has none.
    async fn connect(&self, request: ConnectRequest) -> Result<SandboxHandle, Error>;

    /// One sandbox's summary.
    /// - `[get.absent]` A sandbox that does not exist is `not_found`.
    /// - `[get.metadata]` With `metadata`, the summary carries the create-time metadata.
    async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error>;

    /// Enumerates sandboxes visible to this client. Requires the `list` capability (otherwise
    /// `unsupported`).
    /// - `[list.filter]` Returns exactly the sandboxes that pass [`ListFilter::matches`]
    ///   (paused ones included when the filter allows them: they are what leaks cost money).
    async fn list(&self, filter: &ListFilter) -> Result<Vec<SandboxSummary>, Error>;

    /// One page of [`list`](SandboxProvider::list) (needs `list`, like it).
    /// - `[list.page]` The pages, in the page's [`ListOrder`](crate::ListOrder) (by
    ///   `started_at`, then id; newest first by default), concatenate to exactly what `list`
    ///   returns for the filter, each sandbox once; a page holds at most `limit` items, and
    ///   `next` is present exactly when more remain. A `limit` of 0 is `invalid_request`.
    /// - `[list.page.cursor]` A cursor names the last item of its page, so the next page
    ///   resumes after that item even when sandboxes came or went in between; a cursor the
    ///   listing did not write (garbled, invented, or written for the other order) is
    ///   `invalid_request` with code `invalid_cursor`.
    ///
    /// The provided implementation pages the whole of `list` ([`ListPage::apply`]): correct,
    /// and as costly as `list` per page. A backend with server-side paging overrides it.
    async fn list_page(&self, filter: &ListFilter, page: &ListPage) -> Result<SandboxPage, Error> {
        if page.limit == 0 {
            // Refused before the listing is fetched.
            return page.apply(Vec::new());
        }
        page.apply(self.list(filter).await?)
    }

    /// Destroys a sandbox.
    /// - `[delete.gone]` Afterwards `get` is `not_found` and `connect` is replaceable.
    /// - `[delete.absent]` Deleting an absent sandbox is `not_found` (callers treat that as
    ///   success).
    async fn delete(&self, id: &SandboxId) -> Result<(), Error>;

    /// Runs one command.
    /// - `[exec.argv]` The argv form runs the program directly; nothing is interpreted.
    /// - `[exec.shell]` The shell form needs `posix_shell`; without it, `unsupported`.
    /// - `[exec.io]` Stdin is delivered then closed; env and cwd apply; stdout and stderr are
    ///   kept apart and returned whole (at least 1 MiB intact), exit codes exactly.
    /// - `[exec.stream]` `on_output` sees output while the command runs, not replayed at the
    ///   end. With a hook attached the adapter keeps nothing: the result's `stdout` and
    ///   `stderr` are empty (the hook had every byte), so streaming costs no buffer.
    /// - `[exec.timeout]` A command exceeding its timeout returns promptly with
    ///   `killed == true`, and (`[exec.timeout.reaped]`) leaves no process behind in the
    ///   sandbox; a command that itself exits 124 or 137 is *not* reported as killed.
    /// - `[exec.cancel]` Dropping the call kills what it started.
    /// - `[exec.concurrent]` Many concurrent execs on one sandbox each get their own result.
    async fn exec(
        &self,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error>;

    /// Writes a whole file, creating parent directories.
    /// - `[files.binary]` Content is binary-safe and round-trips through `read_file` (at least
    ///   10 MiB).
    async fn write_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error>;

    /// Reads a whole file.
    /// - `[files.missing]` A missing path is `not_found`.
    async fn read_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<u8>, Error>;

    /// Reads a file as a stream of chunks, pulled by the caller.
    /// - `[files.stream]` The chunks are the file's bytes in order; the adapter reads ahead of
    ///   the caller by a bounded amount (backpressure), never the whole file.
    /// - `[files.stream.regular]` Only a regular file is read, judged on what the path
    ///   resolves to: a FIFO, a device (`/dev/zero` through a symlink), a directory or a path
    ///   resolving into a reserved tree is `invalid_request` with code `not_a_regular_file`
    ///   or `invalid_path`, answered without waiting on the file.
    /// - `[files.stream.cap]` A file longer than `max_bytes` ends the stream with an error of
    ///   code `file_too_large` as soon as the cap is passed, and the reader is stopped then.
    /// - `[files.missing]` A missing path is `not_found`.
    ///
    /// The provided implementation reads the whole file with
    /// [`read_file`](SandboxProvider::read_file): correct, but memory-bound by the file. Adapters
    /// that can stream override it.
    async fn read_file_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        let bytes = self.read_file(sandbox, path).await?;
        if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max_bytes {
            return Err(file_too_large(path, max_bytes));
        }
        Ok(Box::new(BufferedStream::new(bytes)))
    }

    /// Lists a directory tree, bounded (needs `fs_enumeration`).
    /// - `[files.tree]` Entries below `dir` down to `limits.depth` levels, sorted by path; a
    ///   missing root is `not_found`.
    /// - `[files.tree.caps]` At most `limits.max_entries` entries; a walk that reaches the cap
    ///   or `limits.deadline` stops and says `truncated`, instead of failing or running on.
    ///
    /// The provided implementation walks with [`list_dir`](SandboxProvider::list_dir), one call
    /// per directory; adapters with a real shell override it with one command.
    async fn list_tree(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        limits: TreeLimits,
    ) -> Result<TreeListing, Error> {
        let started = std::time::Instant::now();
        let root = self.list_dir(sandbox, dir).await?;
        let mut out = TreeListing::default();
        // An explicit stack instead of recursion: a hostile tree cannot blow the stack.
        let mut stack: Vec<(Vec<DirEntry>, usize)> = vec![(root, 1)];
        'walk: while let Some((entries, level)) = stack.pop() {
            for entry in entries {
                if out.entries.len() >= limits.max_entries || started.elapsed() > limits.deadline {
                    out.truncated = true;
                    break 'walk;
                }
                if entry.kind == crate::fs::EntryKind::Dir && level < limits.depth {
                    match self.list_dir(sandbox, &entry.path).await {
                        Ok(children) => stack.push((children, level + 1)),
                        // Removed between the two listings: it is simply not there any more.
                        Err(e) if e.kind() == crate::error::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
                out.entries.push(entry);
            }
        }
        out.entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Lists one directory level (needs `fs_enumeration`).
    /// - `[files.list]` Entries name their kind (file, dir, other) and size; a missing directory
    ///   is `not_found`.
    async fn list_dir(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<DirEntry>, Error>;

    /// Creates a directory and its parents (needs `fs_enumeration`).
    /// - `[files.mkdir]` An existing directory is success (`mkdir -p`).
    async fn make_dir(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error>;

    /// Removes a path recursively (needs `fs_enumeration`).
    /// - `[files.remove]` Directories go with their contents; `/` is refused with
    ///   `invalid_request`; a missing path is `not_found`.
    async fn remove(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error>;

    /// Metadata of one path, without following a final symlink (needs `fs_enumeration`).
    /// - `[files.stat]` Kinds are file, dir or other; a missing path is `not_found`.
    async fn stat(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<StatEntry, Error>;

    /// The snapshot capability's methods, when implemented. Use [`crate::narrow::snapshots`],
    /// which also checks the flag.
    fn as_snapshots(&self) -> Option<&dyn Snapshots> {
        None
    }
    /// The template catalog's methods, when implemented.
    fn as_template_catalog(&self) -> Option<&dyn TemplateCatalog> {
        None
    }
    /// The PTY methods, when implemented.
    fn as_terminals(&self) -> Option<&dyn Terminals> {
        None
    }
    /// Reattaching to detached terminals, when implemented. Use
    /// [`crate::narrow::terminal_reattach`], which also checks the flag.
    fn as_terminal_reattach(&self) -> Option<&dyn TerminalReattach> {
        None
    }
    /// The desktop relay, when implemented.
    fn as_desktop(&self) -> Option<&dyn Desktop> {
        None
    }
    /// The keep-alive method, when implemented.
    fn as_keep_alive(&self) -> Option<&dyn KeepAlive> {
        None
    }
    /// The combined connect-and-probe, when implemented.
    fn as_connect_probe(&self) -> Option<&dyn ConnectProbe> {
        None
    }
    /// Background processes, when implemented.
    fn as_processes(&self) -> Option<&dyn Processes> {
        None
    }
    /// Streamed file reads and writes and renames, when implemented.
    fn as_streamed_files(&self) -> Option<&dyn StreamedFiles> {
        None
    }
    /// Directory watches, when implemented.
    fn as_watch(&self) -> Option<&dyn Watch> {
        None
    }
    /// Pausing and resuming, when implemented. Use [`crate::narrow::pause_resume`], which also
    /// checks the flag.
    fn as_pause_resume(&self) -> Option<&dyn PauseResume> {
        None
    }
    /// Byte tunnels to ports inside a sandbox, when implemented. Use
    /// [`crate::narrow::tunnels`], which also checks the flag.
    fn as_tunnels(&self) -> Option<&dyn Tunnels> {
        None
    }
    /// Building tenants' templates from images on the backend, when implemented. Use
    /// [`crate::narrow::template_builds`], which also checks the flag.
    fn as_template_builds(&self) -> Option<&dyn TemplateBuilds> {
        None
    }
}

/// The error of a read past its cap.
pub fn file_too_large(path: &SandboxPath, max_bytes: u64) -> Error {
    Error::invalid_request(
        crate::error::Operation::READ_FILE,
        format!("{path} is larger than the {max_bytes} bytes this read may return"),
    )
    .with_code(crate::error::ErrorCode::FileTooLarge)
}

/// Snapshotting sandboxes into reusable templates (capability `snapshots`).
#[async_trait]
pub trait Snapshots: Send + Sync {
    /// Snapshots a sandbox; `None` lets the provider pick a name. The provider may pause the
    /// sandbox while the snapshot is taken.
    /// - `[snapshot.boot]` The returned ID is accepted as a create request's template, and the
    ///   new sandbox holds the files the source held.
    async fn create_snapshot(
        &self,
        sandbox: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotRef, Error>;
    /// Removes a snapshot.
    /// - `[snapshot.delete_idempotent]` A missing snapshot is success.
    async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), Error>;
    /// Lists snapshots, all of them or those taken from one sandbox.
    /// - `[snapshot.tenant]` Each carries the tenant of the sandbox it was taken from, when
    ///   that sandbox's ownership metadata named one.
    async fn list_snapshots(&self, source: Option<&SandboxId>) -> Result<Vec<SnapshotRef>, Error>;
}

/// Template administration (capability `template_catalog`).
#[async_trait]
pub trait TemplateCatalog: Send + Sync {
    /// Lists the templates available to this client.
    async fn list_templates(&self) -> Result<Vec<Template>, Error>;
    /// Makes the standard template available (building or pulling it when absent) and returns
    /// it. Never deletes a usable template.
    /// - `[template_catalog.standard]` Afterwards `list_templates` includes the returned
    ///   template.
    async fn ensure_standard_template(&self) -> Result<Template, Error>;
}

/// Interactive PTYs (capability `pty`).
#[async_trait]
pub trait Terminals: Send + Sync {
    /// Opens a PTY inside a running sandbox.
    /// - `[terminal.echo]` Bytes written reach the shell; its output comes back as `Data`.
    /// - `[terminal.resize]` A resize is visible to programs (`stty size`).
    /// - `[terminal.exit]` When the shell exits, `Exited` carries its status and the stream
    ///   ends.
    /// - `[terminal.close]` Closing a terminal leaves no shell behind; so does detaching one
    ///   the backend cannot reattach to.
    /// - `[terminal.options]` The shell starts in `cwd`, as `user`, with `env` set; malformed
    ///   ones (an environment name outside `[A-Za-z_][A-Za-z0-9_]*`, a bad user) are
    ///   `invalid_request` with code `invalid_command` before anything starts.
    async fn open_terminal(
        &self,
        sandbox: &SandboxHandle,
        options: TerminalOptions,
    ) -> Result<Terminal, Error>;
}

/// Terminals that outlive their client (capability `terminal_reattach`): `detach` leaves the
/// shell running, and it is reached again by its pid ([`Terminal::pid`], always set by a
/// backend declaring this).
#[async_trait]
pub trait TerminalReattach: Send + Sync {
    /// Reattaches to the running terminal `pid` of the sandbox and resizes it to `size` (zero
    /// dimensions keep the current size).
    /// - `[terminal.reattach]` A detached terminal keeps running: the reattached one replays
    ///   the recent output (what the backend's ring still holds), then carries live output,
    ///   and takes input and resizes; the shell's state (a variable set before) is intact.
    /// - `[terminal.reattach.unknown]` A pid that is no running terminal of the sandbox (never
    ///   one, or ended) is `not_found` with code `terminal_not_found`.
    /// - `[terminal.detach_timeout]` A terminal left detached for its options' detach timeout
    ///   is killed, its jobs with it; a reattach then is `terminal_not_found`.
    async fn reattach_terminal(
        &self,
        sandbox: &SandboxHandle,
        pid: u32,
        size: TerminalSize,
    ) -> Result<Terminal, Error>;
}

/// A WebSocket relay to the desktop (websockify) port of a sandbox (capability `desktop`).
#[async_trait]
pub trait Desktop: Send + Sync {
    /// Dials the desktop; the stream carries raw RFB bytes in binary frames.
    async fn dial_desktop(
        &self,
        sandbox: &SandboxHandle,
        options: DesktopOptions,
    ) -> Result<Box<dyn DesktopStream>, Error>;
}

/// Explicit refresh of the provider's idle timer (capability `keep_alive`).
#[async_trait]
pub trait KeepAlive: Send + Sync {
    /// Moves the sandbox's idle timeout to `ttl` from now (or records activity, for backends
    /// whose idle sweep reads an activity marker).
    /// - `[keep_alive.running]` On a running sandbox it succeeds, and the sandbox still runs
    ///   commands afterwards.
    async fn keep_alive(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), Error>;
}

/// Connect and lifecycle probe on one provider handle (capability `connect_probe`), instead of
/// `get` followed by `connect`.
#[async_trait]
pub trait ConnectProbe: Send + Sync {
    /// Connects and checks the sandbox's state.
    /// - `[connect_probe.gone]` Terminal or missing sandboxes are `terminal`/`not_found`;
    ///   transient failures never are.
    async fn connect_session(&self, request: ConnectRequest) -> Result<SandboxHandle, Error>;
}

/// Background processes (capability `processes`); the types and the replay rules are in
/// [`crate::process`].
///
/// A process is named by its pid or its tag ([`ProcessSelector`]). It outlives the call that
/// started it and every attach; it ends when it exits, when it is signalled, or with its
/// sandbox. Exited processes stay listed (with their status) until the adapter's own bound on
/// remembered processes pushes the oldest out, so a caller that reconnects learns how a
/// process ended.
///
/// Errors: an unknown pid or tag is `not_found` with code `process_not_found` (never the
/// sandbox's `not_found`, so it cannot replace a binding: callers branch on the code);
/// input or a signal for an ended process is `conflict` with `process_exited`; input with
/// stdin closed is `conflict` with `stdin_closed`. [`crate::process::errors`] builds them.
#[async_trait]
pub trait Processes: Send + Sync {
    /// Starts a process in the background and returns as soon as it runs.
    /// - `[process.start]` The answer names a pid, the tag, the argv and `running`; `env`,
    ///   `cwd` apply; the process runs on after the call returns.
    /// - `[process.tag]` A tag selects the process as its pid does; starting another process
    ///   with the tag of a running one is `conflict` with code `process_tag_in_use` (once it
    ///   ended, the tag is free again); a pid or tag no process has is `not_found` with code
    ///   `process_not_found`.
    /// - `[process.cap]` The live processes of a sandbox are capped (the adapter's setting):
    ///   a start past the cap is refused with `capacity` and code `process_limit`, starting
    ///   nothing; once one of them ended a start succeeds again.
    async fn start_process(
        &self,
        sandbox: &SandboxHandle,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error>;

    /// The sandbox's background processes.
    /// - `[process.list]` Running and ended processes started through this trait, an ended one
    ///   with its exit status (or, signalled, its signal).
    async fn list_processes(&self, sandbox: &SandboxHandle) -> Result<Vec<ProcessInfo>, Error>;

    /// Attaches to a process's output from the replay offset `from` (`None`: from what is
    /// produced next).
    /// - `[process.attach]` The events are the output in order, each `Data` at its offset;
    ///   from offset 0 with the output still in the ring, the bytes are the process's whole
    ///   output exactly; the stream ends with `Exited` carrying the status. Attaching to an
    ///   ended process replays what the ring holds, then `Exited`. The ring holds at least
    ///   64 KiB ([`ProcessInfo::ring_bytes`] says how much).
    /// - `[process.replay]` An offset older than the ring yields one `Gap` from the offset to
    ///   the ring's start, then the ring's bytes; an offset past the output produced is
    ///   `invalid_request` with code `invalid_offset`.
    async fn attach_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<ProcessStream, Error>;

    /// Writes `data` to the process's stdin (started with `stdin: true`).
    /// - `[process.input]` The bytes reach the process in order; after `close_stdin` the
    ///   process reads end of file, and further input is `stdin_closed`; input for an ended
    ///   process is `process_exited`.
    async fn send_input(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        data: &[u8],
    ) -> Result<(), Error>;

    /// Closes the process's stdin. Idempotent while the process runs.
    async fn close_stdin(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
    ) -> Result<(), Error>;

    /// Sends `signal` to the process. `TERM` and `KILL` every backend sends; a backend that
    /// cannot send another one refuses it with `unsupported` (envd sends only those two; the
    /// sandbox agent sends every one).
    /// - `[process.signal]` `KILL` ends the process; it is then listed as ended with no exit
    ///   code, and a signal for it is `process_exited`.
    async fn signal_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        signal: Signal,
    ) -> Result<(), Error>;
}

/// Files as bounded byte streams, and renames (capability `streamed_files`).
///
/// Declaring it promises what the port's provided
/// [`read_file_stream`](SandboxProvider::read_file_stream) does not: no call holds a whole
/// file in the service. Both directions pull: a read is a [`ReadStream`] the caller pulls, a
/// write pulls the caller's [`ReadStream`] (the source), so the sandbox side paces both.
///
/// Writes are atomic: the bytes go to a temporary sibling that is renamed over the target once
/// the source ended cleanly, so a reader sees the old file or the new one, never a part.
#[async_trait]
pub trait StreamedFiles: Send + Sync {
    /// Reads a file as a stream of chunks.
    /// - `[streamed.read]` The chunks are the file's bytes in order; a file longer than
    ///   `max_bytes` ends the stream with `file_too_large`; a missing path is `not_found`.
    async fn read_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error>;

    /// Writes a file from `source`, creating parent directories, and returns the bytes
    /// written.
    /// - `[streamed.write]` The file holds exactly the source's bytes (at least 10 MiB
    ///   round-trip).
    /// - `[streamed.write.atomic]` A source that fails, or passes `max_bytes` (then the error
    ///   is `file_too_large`), fails the call and leaves the target as it was: the old
    ///   content, or no file.
    async fn write_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        source: ReadStream,
        max_bytes: u64,
    ) -> Result<u64, Error>;

    /// Renames (moves) `from` to `to`, creating `to`'s parents.
    /// - `[streamed.rename]` A file or a directory with its contents moves: `from` is gone and
    ///   `to` holds what `from` held; an existing file at `to` is replaced; a missing `from`
    ///   is `not_found`; an existing directory at `to`, or `to` inside `from`, is
    ///   `invalid_request` with code `invalid_path`.
    async fn rename_path(
        &self,
        sandbox: &SandboxHandle,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> Result<(), Error>;
}

/// Directory event streams (capability `watch`); the types are in [`crate::watch`].
#[async_trait]
pub trait Watch: Send + Sync {
    /// Watches `dir` (and, with `recursive`, everything below it).
    /// - `[watch.armed]` The watch is armed when the call returns: a file created afterwards
    ///   is reported as `create`, rewritten as `write` (or `create`, where the backend writes
    ///   by replacing the file), renamed away as `rename` of its old path, removed as
    ///   `remove`, each with its absolute path. (`chmod` is reported by backends that can see
    ///   it; no case provokes it, since not every backend models permissions.)
    /// - `[watch.recursive]` Without `recursive`, only `dir`'s own entries are reported, not
    ///   changes deeper down; with it, those are reported too.
    /// - `[watch.dir]` A missing `dir` is `not_found`; a file is `invalid_request` with code
    ///   `not_a_directory`.
    async fn watch_dir(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<WatchStream, Error>;
}

/// Pausing a sandbox and resuming it (capability `pause_resume`).
///
/// A paused sandbox keeps its filesystem and its memory: its processes are frozen, not killed,
/// and run on from where they were after [`resume`](PauseResume::resume). It runs nothing
/// meanwhile (no exec, no file call, no tunnel reaches it) and is reported as
/// [`SandboxState::Paused`](crate::SandboxState::Paused). [`SandboxProvider::connect`] resumes a
/// paused sandbox too.
#[async_trait]
pub trait PauseResume: Send + Sync {
    /// Pauses a running sandbox.
    /// - `[pause.keeps]` Once `pause` returns, [`SandboxProvider::get`] reports the sandbox
    ///   paused; after [`resume`](PauseResume::resume) it reports it running, a file written
    ///   before the pause holds the same bytes and a process started before it still runs.
    /// - `[pause.refused]` While it is paused, a data-plane call on the sandbox (an exec, a
    ///   file call) fails promptly with code `session_sandbox_paused`
    ///   ([`ErrorCode::SandboxPaused`](crate::ErrorCode::SandboxPaused)); it never waits for a
    ///   resume and never hangs.
    /// - `[pause.twice]` Pausing a paused sandbox is `conflict` with code
    ///   `session_sandbox_paused` and the message `sandbox '<id>' is already paused`; the
    ///   sandbox stays paused.
    /// - `[pause.absent]` Pausing or resuming a sandbox that does not exist (deleted, unknown)
    ///   is `not_found`.
    async fn pause(&self, id: &SandboxId) -> Result<(), Error>;
    /// Resumes a paused sandbox.
    /// - `[resume.running]` Resuming a sandbox that runs is `Ok` and changes nothing: its
    ///   files and processes are as they were.
    /// - `[pause.connect]` [`SandboxProvider::connect`] resumes a paused sandbox as `resume`
    ///   does: afterwards it runs and its data-plane calls work again.
    async fn resume(&self, id: &SandboxId) -> Result<(), Error>;
}

/// One direction of a [`Tunnel`] into the sandbox: bytes for the port.
#[async_trait]
pub trait TunnelSink: Send + std::fmt::Debug {
    /// Sends bytes to the port, waiting while the sandbox side is full (backpressure).
    async fn send(&mut self, data: Vec<u8>) -> Result<(), Error>;
    /// Ends this direction: the program on the port reads end of file; the other direction
    /// goes on. Idempotent.
    async fn finish(&mut self) -> Result<(), Error>;
}

/// The other direction of a [`Tunnel`]: bytes from the port.
#[async_trait]
pub trait TunnelSource: Send + std::fmt::Debug {
    /// The next bytes the port sent; `None` once it closed its side. Cancel-safe: dropping
    /// the future loses no bytes, so a relay may select over it.
    async fn recv(&mut self) -> Option<Result<Vec<u8>, Error>>;
}

/// One TCP connection to a port inside a sandbox, as two halves a relay can drive from two
/// tasks. Dropping both closes the connection.
#[derive(Debug)]
pub struct Tunnel {
    /// Bytes to the port.
    pub sink: Box<dyn TunnelSink>,
    /// Bytes from the port.
    pub source: Box<dyn TunnelSource>,
}

/// Byte tunnels to TCP ports inside a sandbox (capability `tunnels`), for preview ports: they
/// reach a server listening on the sandbox's loopback whatever the sandbox's network policy,
/// since the tunnel runs over the backend's own channel to the sandbox, never the network.
///
/// Contract:
/// - `[tunnel.bytes]` Bytes sent reach the program listening on the port, and what it answers
///   comes back, each direction in order and unchanged. [`TunnelSink::finish`] is seen by that
///   program as end of file while the other direction goes on; once it closes its side,
///   [`TunnelSource::recv`] gives `None`.
/// - `[tunnel.closed]` A port nothing listens on is refused at open, promptly (no stream that
///   ends at once), with `unavailable` and code `port_closed` ([`tunnel_errors::port_closed`]).
/// - `[tunnel.port]` Port 0 is refused with `invalid_request` before the sandbox is asked.
/// - `[tunnel.cap]` A sandbox has at most the adapter's bound of tunnels open at once; an open
///   past it is refused with `capacity` and code `tunnel_limit` ([`tunnel_errors::limit`]),
///   opening nothing; once one is closed (both halves dropped), an open succeeds again.
#[async_trait]
pub trait Tunnels: Send + Sync {
    /// Opens a connection to `127.0.0.1:<port>` inside the sandbox.
    async fn open_tunnel(&self, sandbox: &SandboxHandle, port: u16) -> Result<Tunnel, Error>;
}

/// Tenants' templates built from images already on the backend (capability
/// `template_builds`). A built template is its tenant's alone: every method names the tenant,
/// and what belongs to another tenant answers as if it did not exist.
#[async_trait]
pub trait TemplateBuilds: Send + Sync {
    /// Builds a template from `request.source_image`, which must already be on the backend.
    /// A request that fails [`TemplateBuildRequest::validate`] is `invalid_request`.
    /// - `[template_builds.local]` Nothing is fetched: a source image the backend does not have
    ///   is `invalid_request` with code `image_not_present`, naming the image, and builds
    ///   nothing.
    /// - `[template_builds.boot]` The returned [`BuiltTemplate::template`], as a create
    ///   request's template with metadata [`crate::TEMPLATE_TENANT`] naming the tenant, boots
    ///   a sandbox of the source image, and the build is listed under each of its tags.
    /// - `[template_builds.owner]` The same create naming any other tenant, or none, is
    ///   `not_found` with code `template_not_found` and creates nothing.
    async fn build_template(&self, request: &TemplateBuildRequest) -> Result<BuiltTemplate, Error>;
    /// The tenant's finished builds, one entry per build, each with the tags naming it now.
    async fn list_built_templates(&self, tenant: TenantId) -> Result<Vec<BuiltTemplate>, Error>;
    /// Gives build `build_id` of the tenant's template the `tags`, moving each from any other
    /// build of the template that held it.
    /// - `[template_builds.tags]` Afterwards the listing shows the tags on that build and on no
    ///   other; an unknown template or build is `not_found` with code `template_not_found`.
    async fn tag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        build_id: &str,
        tags: &[String],
    ) -> Result<(), Error>;
    /// Takes `tags` off the tenant's template; a build left without a tag is removed. A tag
    /// the template does not have is success.
    async fn untag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        tags: &[String],
    ) -> Result<(), Error>;
    /// Removes every build of the tenant's template. Sandboxes already booted from it keep
    /// running.
    /// - `[template_builds.delete_idempotent]` Afterwards the listing has none of its builds;
    ///   a template that does not exist (or is another tenant's) is success, and unchanged.
    async fn delete_built_template(&self, tenant: TenantId, template_id: &str)
    -> Result<(), Error>;
}

/// The errors every [`Tunnels`] adapter words and codes alike.
pub mod tunnel_errors {
    use crate::{Error, ErrorCode, ErrorKind, Operation};

    /// `[tunnel.port]`: port 0 names no program.
    pub fn invalid_port(port: u16) -> Error {
        Error::invalid_request(
            Operation::OPEN_TUNNEL,
            format!("tunnel port {port}: expected a port from 1 to 65535"),
        )
    }

    /// `[tunnel.closed]`: nothing accepts connections on `port` inside the sandbox.
    pub fn port_closed(port: u16, detail: &str) -> Error {
        Error::unavailable(
            Operation::OPEN_TUNNEL,
            format!("nothing listens on port {port} inside the sandbox: {detail}"),
        )
        .with_code(ErrorCode::PortClosed)
    }

    /// `[tunnel.cap]`: the sandbox already has `cap` tunnels open.
    pub fn limit(cap: usize) -> Error {
        Error::new(
            ErrorKind::Capacity,
            Operation::OPEN_TUNNEL,
            format!("the sandbox already has {cap} tunnels open, its bound; close one first"),
        )
        .with_code(ErrorCode::TunnelLimit)
    }
}

/// Narrowing a provider to an optional capability.
///
/// Two signals must agree: the trait is implemented (the `as_*` method returns it) *and* the
/// capability flag is set. A decorator may carry a method its inner backend cannot serve, so the
/// method alone is not enough; a flag without the method cannot be called at all.
pub mod narrow {
    use super::*;

    /// The snapshot capability, if implemented and declared.
    pub fn snapshots(provider: &dyn SandboxProvider) -> Option<&dyn Snapshots> {
        provider
            .as_snapshots()
            .filter(|_| provider.capabilities().snapshots)
    }
    /// The template catalog, if implemented and declared.
    pub fn template_catalog(provider: &dyn SandboxProvider) -> Option<&dyn TemplateCatalog> {
        provider
            .as_template_catalog()
            .filter(|_| provider.capabilities().template_catalog)
    }
    /// The PTY capability, if implemented and declared.
    pub fn terminals(provider: &dyn SandboxProvider) -> Option<&dyn Terminals> {
        provider
            .as_terminals()
            .filter(|_| provider.capabilities().pty)
    }
    /// Terminal reattach, if implemented and declared.
    pub fn terminal_reattach(provider: &dyn SandboxProvider) -> Option<&dyn TerminalReattach> {
        provider
            .as_terminal_reattach()
            .filter(|_| provider.capabilities().terminal_reattach)
    }
    /// The desktop relay, if implemented and declared.
    pub fn desktop(provider: &dyn SandboxProvider) -> Option<&dyn Desktop> {
        provider
            .as_desktop()
            .filter(|_| provider.capabilities().desktop)
    }
    /// Keep-alive, if implemented and declared.
    pub fn keep_alive(provider: &dyn SandboxProvider) -> Option<&dyn KeepAlive> {
        provider
            .as_keep_alive()
            .filter(|_| provider.capabilities().keep_alive)
    }
    /// The combined connect-and-probe, if implemented and declared.
    pub fn connect_probe(provider: &dyn SandboxProvider) -> Option<&dyn ConnectProbe> {
        provider
            .as_connect_probe()
            .filter(|_| provider.capabilities().connect_probe)
    }
    /// Background processes, if implemented and declared.
    pub fn processes(provider: &dyn SandboxProvider) -> Option<&dyn Processes> {
        provider
            .as_processes()
            .filter(|_| provider.capabilities().processes)
    }
    /// Streamed files, if implemented and declared.
    pub fn streamed_files(provider: &dyn SandboxProvider) -> Option<&dyn StreamedFiles> {
        provider
            .as_streamed_files()
            .filter(|_| provider.capabilities().streamed_files)
    }
    /// Directory watches, if implemented and declared.
    pub fn watch(provider: &dyn SandboxProvider) -> Option<&dyn Watch> {
        provider
            .as_watch()
            .filter(|_| provider.capabilities().watch)
    }
    /// Pause and resume, if implemented and declared.
    pub fn pause_resume(provider: &dyn SandboxProvider) -> Option<&dyn PauseResume> {
        provider
            .as_pause_resume()
            .filter(|_| provider.capabilities().pause_resume)
    }
    /// Tunnels to ports inside a sandbox, if implemented and declared.
    pub fn tunnels(provider: &dyn SandboxProvider) -> Option<&dyn Tunnels> {
        provider
            .as_tunnels()
            .filter(|_| provider.capabilities().tunnels)
    }
    /// Template builds from images on the backend, if implemented and declared.
    pub fn template_builds(provider: &dyn SandboxProvider) -> Option<&dyn TemplateBuilds> {
        provider
            .as_template_builds()
            .filter(|_| provider.capabilities().template_builds)
    }
}
