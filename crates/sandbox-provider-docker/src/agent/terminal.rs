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
use sandbox_envd::process::{self as ps, ProcessInput, ProcessSelector};
use sandbox_transport::envd::{CallOptions, ServerStream};

use super::exec::{KillOnDrop, client_for, exit_of, lease, random_tag, until_started};
use crate::channel::{Channel, ChannelClient, Lease};
use crate::exec::kill_marked_script;
use crate::provider::DockerProvider;
use crate::terminal::{TERMINAL_MARKER_ENV, shell_script};

/// The bound of the hang-up at close (its script sleeps two seconds between its signals).
const HANGUP_TIMEOUT: Duration = Duration::from_secs(20);
/// The bound of one input or resize call.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

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
    let start = ps::StartRequest {
        process: Some(ps::ProcessConfig {
            cmd: "/bin/sh".to_owned(),
            args: vec!["-c".to_owned(), shell_script()],
            envs: env,
            cwd: Some(
                options
                    .cwd
                    .as_ref()
                    .map_or(sandbox_core::policy::workspace::WORKSPACE_ROOT, |p| {
                        p.as_str()
                    })
                    .to_owned(),
            ),
        }),
        pty: Some(ps::Pty {
            size: Some(ps::pty::Size {
                cols: u32::from(size.cols),
                rows: u32::from(size.rows),
            }),
        }),
        tag: Some(random_tag("sandbox-terminal")),
        stdin: None,
    };
    let container = channel.container().to_owned();
    let opening = async {
        // No deadline: a terminal lives until it is closed; the stream's idle limit watches it.
        let mut stream = client.start(&start, CallOptions::new()).await?;
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
    Ok(Terminal {
        // The agent keeps the PTY process, but this adapter does not reattach to it yet (exec
        // mode cannot at all), so no pid is handed out as a reattach handle.
        pid: None,
        output: Box::new(output),
        input,
    })
}

struct AgentTerminalOutput {
    // `next_event` takes `&mut self`, so the mutex is never contended: it only makes the
    // struct `Sync`.
    stream: Mutex<ServerStream<ps::StartResponse>>,
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
            match stream.message().await {
                Ok(Some(message)) => match message.event.and_then(|e| e.event) {
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
}

impl Drop for AgentTerminalInput {
    fn drop(&mut self) {
        self.stop_refresher();
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // Dropped without close: the shell must not outlive its last handle.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (lease, pid, marker) = (self.lease.clone(), self.pid, self.marker.clone());
            runtime.spawn(hang_up(lease, pid, marker));
        }
    }
}
