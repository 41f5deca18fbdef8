//! Terminals through the agent (agent mode): the shell is a PTY process the agent starts
//! (`Start` with a `pty` size), typed input is `SendInput` `pty` bytes, a resize is `Update`.
//!
//! Closing keeps exec mode's promise (`crate::terminal`): the whole session is hung up, the
//! shell's background jobs included, which live in process groups of their own and so escape a
//! signal to the shell's group. Every process of the session carries the random
//! `SANDBOX_TERMINAL_ID` in its environment, and close runs exec mode's hang-up script (SIGHUP,
//! SIGCONT, SIGKILL two seconds later for what is left) as a process of the agent, then kills
//! the shell's group. The agent touches the activity marker on every request it serves; an open
//! terminal sends a health call periodically, so a sandbox someone is reading output in is
//! not swept as idle.
//!
//! Detaching (or dropping the terminal) only drops the stream: the agent keeps the PTY process
//! and its output ring. Every terminal is started with the agent's detach timer
//! (`Sandbox-Detach-Timeout-Ms`, the options' detach timeout), so one nobody reattaches to is
//! killed by the agent itself, whatever became of this process; its streams ask for a short
//! keepalive so the agent notices a detach within seconds. A reattach finds the pid among the
//! agent's processes tagged `sandbox-terminal-*` (anything else is `terminal_not_found`), takes
//! the session marker from the process's environment (for a later close), and `Connect`s with
//! `Sandbox-Replay-Offset: 0`: the ring's output (the most recent `--output-ring-bytes`), then
//! live output.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    Error, Operation, Terminal, TerminalEvent, TerminalInput, TerminalOptions, TerminalOutput,
    TerminalSize,
};
use sandbox_envd::process::process_event::Event;
use sandbox_envd::process::process_event::data_event::Output;
use sandbox_envd::process::{self as ps, ProcessEvent, ProcessInput, ProcessSelector};
use sandbox_transport::envd::{CallOptions, ServerStream};

use super::exec::{
    KillOnDrop, client_for, cwd_or_default, exit_of, lease, random_tag, until_started,
};
use crate::channel::{Channel, ChannelClient, Lease};
use crate::exec::kill_marked_script;
use crate::provider::DockerProvider;
use crate::terminal::{TERMINAL_MARKER_ENV, shell_script};

/// The bound of the hang-up at close (its script sleeps two seconds between its signals).
const HANGUP_TIMEOUT: Duration = Duration::from_secs(20);
/// The bound of one input or resize call.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// The tag prefix of every terminal's process: a reattach accepts only these.
const TERMINAL_TAG: &str = "sandbox-terminal";
/// The agent's detach-timer request header (`docs/envd.md`, "Our extensions").
const HEADER_DETACH_TIMEOUT: &str = "sandbox-detach-timeout-ms";
/// The agent's replay request header.
const HEADER_REPLAY_OFFSET: &str = "sandbox-replay-offset";

/// The keepalive a terminal's stream asks for: the agent learns of a detach when it next sends,
/// so the interval is a fraction of the detach timeout (within [1 s, 15 s]).
fn stream_keepalive(detach_timeout: Duration) -> Duration {
    (detach_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(15))
}

/// The call options of a terminal's stream (`Start` or `Connect`): no deadline (a terminal
/// lives until it is closed or the agent's detach timer ends it), a short keepalive.
fn stream_options(detach_timeout: Duration) -> CallOptions {
    CallOptions::new()
        .no_timeout()
        .keepalive(stream_keepalive(detach_timeout))
}

/// Opens a terminal in the channel's container.
pub(crate) async fn open(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    options: TerminalOptions,
    marker: String,
    env: std::collections::BTreeMap<String, String>,
) -> Result<Terminal, Error> {
    let op = Operation::OPEN_TERMINAL;
    let lease = lease(provider, op, channel).await?;
    let client = client_for(&lease, options.user.as_deref())?;
    let size = options.size.or(TerminalSize::DEFAULT);
    let detach_timeout = options.detach_timeout_or_default();
    let detach_ms = u64::try_from(detach_timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let start = ps::StartRequest {
        process: Some(ps::ProcessConfig {
            cmd: "/bin/sh".to_owned(),
            args: vec!["-c".to_owned(), shell_script()],
            envs: env,
            cwd: Some(cwd_or_default(channel, options.cwd.as_ref()).await?),
        }),
        pty: Some(ps::Pty {
            size: Some(ps::pty::Size {
                cols: u32::from(size.cols),
                rows: u32::from(size.rows),
            }),
        }),
        tag: Some(random_tag(TERMINAL_TAG)),
        stdin: None,
    };
    let container = channel.container().to_owned();
    let opening = async {
        // No deadline: a terminal lives until it is closed, or until the agent's detach timer
        // ends it; the stream's idle limit watches the stream.
        let call = stream_options(detach_timeout).extension(HEADER_DETACH_TIMEOUT, detach_ms);
        let mut stream = client.start(&start, call).await?;
        let first = stream.message().await?;
        Ok::<_, Error>((stream, first))
    };
    let (stream, first) = match until_started(provider.docker(), &container, opening).await {
        Ok(opened) => opened,
        Err(e) => {
            let e = super::exec::explain(provider.docker(), &container, e).await;
            return Err(e.with_operation(op));
        }
    };
    let Some(Event::Start(started)) = first.and_then(|m| m.event).and_then(|e| e.event) else {
        return Err(crate::errors::provider_error(
            sandbox_core::ErrorKind::Internal,
            op,
            "the agent's first terminal event was not start",
        ));
    };
    let pid = started.pid;
    Ok(assemble(
        provider,
        client,
        lease,
        pid,
        marker,
        Stream::Start(stream),
    ))
}

/// Reattaches to the running terminal `pid` of the channel's container.
pub(crate) async fn reattach(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    pid: u32,
    size: TerminalSize,
) -> Result<Terminal, Error> {
    let op = Operation::REATTACH_TERMINAL;
    let lease = lease(provider, op, channel).await?;
    let client = lease.client().clone();
    let listed = client
        .list(CallOptions::new().timeout(IO_TIMEOUT))
        .await
        .map_err(|e| e.with_operation(op))?;
    let prefix = format!("{TERMINAL_TAG}-");
    let Some(info) = listed
        .into_iter()
        .find(|p| p.pid == pid && p.tag.as_deref().is_some_and(|t| t.starts_with(&prefix)))
    else {
        return Err(sandbox_core::terminal::terminal_not_found(pid));
    };
    let marker = info
        .config
        .and_then(|c| c.envs.get(TERMINAL_MARKER_ENV).cloned())
        .ok_or_else(|| {
            crate::errors::provider_error(
                sandbox_core::ErrorKind::Internal,
                op,
                format!("terminal {pid} carries no {TERMINAL_MARKER_ENV}"),
            )
        })?;
    // The detach timer was set at the start; the keepalive only paces how soon the agent sees
    // this stream go, so the default timeout's pace is good enough here.
    let call = stream_options(sandbox_core::config::DEFAULT_TERMINAL_IDLE_DISCONNECT)
        .extension(HEADER_REPLAY_OFFSET, 0);
    let mut stream = match client.connect(ProcessSelector::pid(pid), call).await {
        Ok(stream) => stream,
        Err(e) if e.kind() == sandbox_core::ErrorKind::NotFound => {
            return Err(sandbox_core::terminal::terminal_not_found(pid));
        }
        Err(e) => return Err(e.with_operation(op)),
    };
    match stream.message().await {
        Ok(Some(ps::ConnectResponse {
            event: Some(ProcessEvent {
                event: Some(Event::Start(_)),
            }),
        })) => {}
        Ok(_) => {
            return Err(crate::errors::provider_error(
                sandbox_core::ErrorKind::Internal,
                op,
                "the agent's first reattach event was not start",
            ));
        }
        Err(e) if e.kind() == sandbox_core::ErrorKind::NotFound => {
            return Err(sandbox_core::terminal::terminal_not_found(pid));
        }
        Err(e) => return Err(e.with_operation(op)),
    }
    if size.cols > 0 && size.rows > 0 {
        client
            .resize_pty(
                ProcessSelector::pid(pid),
                u32::from(size.cols),
                u32::from(size.rows),
                CallOptions::new().timeout(IO_TIMEOUT),
            )
            .await
            .map_err(|e| e.with_operation(op))?;
    }
    Ok(assemble(
        provider,
        client,
        lease,
        pid,
        marker,
        Stream::Connect(stream),
    ))
}

/// The two halves of an attached terminal.
fn assemble(
    provider: &DockerProvider,
    client: ChannelClient,
    lease: Lease,
    pid: u32,
    marker: String,
    stream: Stream,
) -> Terminal {
    let refresh_every = (provider.inner.config.idle_ttl / 3)
        .clamp(Duration::from_secs(15), Duration::from_secs(120));
    let refresh_lease = lease.clone();
    let refresher = tokio::spawn(async move {
        loop {
            tokio::time::sleep(refresh_every).await;
            let _ = refresh_lease
                .client()
                .health(CallOptions::new().timeout(Duration::from_secs(10)))
                .await;
        }
    });
    let input = Arc::new(AgentTerminalInput {
        client,
        lease: lease.clone(),
        pid,
        marker,
        closed: AtomicBool::new(false),
        refresher: Mutex::new(Some(refresher)),
    });
    let output = AgentTerminalOutput {
        stream: Mutex::new(stream),
        _lease: lease,
        finished: false,
    };
    Terminal {
        // The reattach handle: the agent keeps the PTY process when this stream goes.
        pid: Some(pid),
        output: Box::new(output),
        input,
    }
}

/// The stream a terminal's output arrives on: its `Start`, or a reattach's `Connect`.
enum Stream {
    Start(ServerStream<ps::StartResponse>),
    Connect(ServerStream<ps::ConnectResponse>),
}

impl Stream {
    /// The next message's event (`Ok(None)` at the end of the stream).
    async fn next(&mut self) -> Result<Option<Option<ProcessEvent>>, Error> {
        Ok(match self {
            Stream::Start(s) => s.message().await?.map(|m| m.event),
            Stream::Connect(s) => s.message().await?.map(|m| m.event),
        })
    }
}

struct AgentTerminalOutput {
    // `next_event` takes `&mut self`, so the mutex is never contended: it only makes the
    // struct `Sync`.
    stream: Mutex<Stream>,
    /// The channel is not closed as idle while the terminal is open.
    _lease: Lease,
    finished: bool,
}

impl std::fmt::Debug for AgentTerminalOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTerminalOutput")
            .field("finished", &self.finished)
            .finish()
    }
}

#[async_trait]
impl TerminalOutput for AgentTerminalOutput {
    async fn next_event(&mut self) -> Option<TerminalEvent> {
        if self.finished {
            return None;
        }
        let stream = self
            .stream
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            match stream.next().await {
                Ok(Some(event)) => match event.and_then(|e| e.event) {
                    Some(Event::Data(data)) => match data.output {
                        Some(Output::Pty(b) | Output::Stdout(b) | Output::Stderr(b)) => {
                            return Some(TerminalEvent::Data(b));
                        }
                        None => {}
                    },
                    Some(Event::End(end)) => {
                        self.finished = true;
                        let (code, _) = exit_of(&end);
                        return Some(TerminalEvent::Exited((code >= 0).then_some(code)));
                    }
                    Some(Event::Start(_) | Event::Keepalive(_)) | None => {}
                },
                Ok(None) => {
                    self.finished = true;
                    return Some(TerminalEvent::Exited(None));
                }
                Err(e) => {
                    self.finished = true;
                    return Some(TerminalEvent::Failed(
                        e.with_operation(Operation::TERMINAL_IO),
                    ));
                }
            }
        }
    }
}

struct AgentTerminalInput {
    /// The client acting as the terminal's user.
    client: ChannelClient,
    /// Root's client, for the hang-up (the session may have changed accounts).
    lease: Lease,
    pid: u32,
    marker: String,
    closed: AtomicBool,
    refresher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for AgentTerminalInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTerminalInput")
            .field("pid", &self.pid)
            .field("closed", &self.closed)
            .finish()
    }
}

impl AgentTerminalInput {
    fn stop_refresher(&self) {
        if let Some(task) = self
            .refresher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }

    fn io_error(e: Error) -> Error {
        e.with_operation(Operation::TERMINAL_IO)
    }
}

/// Hangs up every process of the session marked `marker`, then kills the shell's group
/// (best effort: a session that already ended is the same outcome).
async fn hang_up(lease: Lease, pid: u32, marker: String) {
    let start = ps::StartRequest {
        process: Some(ps::ProcessConfig {
            cmd: "/bin/sh".to_owned(),
            args: vec![
                "-c".to_owned(),
                kill_marked_script(TERMINAL_MARKER_ENV, true),
                "sandbox-kill".to_owned(),
                marker,
            ],
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    };
    let options = CallOptions::new().timeout(HANGUP_TIMEOUT);
    if let Ok(mut stream) = lease.client().start(&start, options).await {
        while let Ok(Some(_)) = stream.message().await {}
    }
    // The shell itself, should it have ignored the hang-up.
    drop(KillOnDrop::new(lease, ProcessSelector::pid(pid)));
}

#[async_trait]
impl TerminalInput for AgentTerminalInput {
    async fn write(&self, data: &[u8]) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(sandbox_core::terminal::terminal_closed());
        }
        // A paste larger than what the shell has read yet fills the agent's input buffer,
        // which refuses more (`Capacity`) until the shell reads: wait and send again, within
        // the write's bound, as a terminal's own line discipline would block the writer.
        let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
        let mut wait = Duration::from_millis(2);
        loop {
            let sent = self
                .client
                .send_input(
                    ProcessSelector::pid(self.pid),
                    ProcessInput::pty(data.to_vec()),
                    CallOptions::new().timeout(IO_TIMEOUT),
                )
                .await;
            match sent {
                Err(e)
                    if e.kind() == sandbox_core::ErrorKind::Capacity
                        && tokio::time::Instant::now() + wait < deadline =>
                {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(100));
                }
                other => return other.map_err(Self::io_error),
            }
        }
    }

    async fn resize(&self, size: TerminalSize) -> Result<(), Error> {
        if size.cols == 0 || size.rows == 0 {
            return Ok(());
        }
        self.client
            .resize_pty(
                ProcessSelector::pid(self.pid),
                u32::from(size.cols),
                u32::from(size.rows),
                CallOptions::new().timeout(IO_TIMEOUT),
            )
            .await
            .map_err(Self::io_error)
    }

    async fn close(&self) -> Result<(), Error> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.stop_refresher();
        hang_up(self.lease.clone(), self.pid, self.marker.clone()).await;
        Ok(())
    }

    async fn detach(&self) -> Result<(), Error> {
        // The shell stays; the output stream goes with the output half, and the agent's
        // detach timer ends a shell nobody comes back to.
        self.closed.store(true, Ordering::Release);
        self.stop_refresher();
        Ok(())
    }
}

impl Drop for AgentTerminalInput {
    fn drop(&mut self) {
        // Dropped without close: a detach. The agent's detach timer bounds the shell's life.
        self.stop_refresher();
    }
}
