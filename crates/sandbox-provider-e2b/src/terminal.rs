//! Terminals through envd (the port's `Terminals` and `TerminalReattach`): the shell is a PTY
//! process (`Process/Start` with a `pty` size), typed input is `SendInput` `pty` bytes, a
//! resize is `Update`.
//!
//! - **The shell** is `/bin/bash -i -l`, as root unless the options name a user, in the
//!   options' `cwd` (else envd's default), with `TERM` forced, a UTF-8 locale, the caller's env
//!   and a random `SANDBOX_TERMINAL_ID` that marks every process of the session.
//! - **Input** is coalesced: writes go into a queue of [`INPUT_QUEUE`] messages (a full queue
//!   holds the writer back), and each `SendInput` drains up to [`INPUT_BATCH`] bytes of it,
//!   bounded by [`INPUT_TIMEOUT`]; a failed send fails the writes after it.
//! - **Close** hangs up the whole session, the shell's background jobs included (they live in
//!   process groups of their own, out of reach of a signal to the shell's): a script run as
//!   root finds every process carrying the session's marker, sends SIGHUP and SIGCONT, and
//!   SIGKILL two seconds later to what is left; then the shell itself is killed.
//! - **Detach** (or dropping the terminal) only drops the stream: envd keeps the PTY process.
//!   Every shell is started with the agent's detach timer (`Sandbox-Detach-Timeout-Ms`, the
//!   options' detach timeout), so one nobody reattaches to is killed by the agent, whatever
//!   became of this service; its streams ask for a short keepalive so the agent notices a
//!   detach within seconds. E2B's own envd ignores the header: there a detached shell lives
//!   until it exits or its sandbox ends.
//! - **Reattach** finds the pid among envd's live processes tagged `sandbox-terminal-*`
//!   (anything else is `terminal_not_found`), takes the session marker from the process's
//!   environment (for a later close), and `Connect`s with a replay from offset 0: the agent's
//!   ring of recent output, then live output (an envd without the replay gives live output
//!   only).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::terminal::{TERMINAL_TERM, terminal_closed, terminal_not_found};
use sandbox_core::{
    Error, ErrorKind, Operation, SandboxHandle, Terminal, TerminalEvent, TerminalInput,
    TerminalOptions, TerminalOutput, TerminalReattach, TerminalSize, Terminals,
};
use sandbox_envd::process::process_event::Event;
use sandbox_envd::process::process_event::data_event::Output;
use sandbox_envd::process::{self as ps, ProcessEvent, ProcessInput, ProcessSelector};
use sandbox_transport::envd::{CallOptions, ServerStream};
use tokio::sync::mpsc;

use crate::envd::Envd;
use crate::errors::provider_error;
use crate::process::{START_WAIT, client_for};
use crate::provider::E2bProvider;

/// The environment variable marking every process of one terminal session.
pub(crate) const TERMINAL_MARKER_ENV: &str = "SANDBOX_TERMINAL_ID";
/// The tag prefix of every terminal's process: a reattach accepts only these.
pub(crate) const TERMINAL_TAG: &str = "sandbox-terminal";
/// The shell and its arguments.
pub(crate) const SHELL: [&str; 3] = ["/bin/bash", "-i", "-l"];
/// How many writes may wait to be sent.
pub(crate) const INPUT_QUEUE: usize = 64;
/// The most input bytes one `SendInput` carries.
pub(crate) const INPUT_BATCH: usize = 4096;
/// The bound of one `SendInput` (refusals as over the agent's input buffer sent again
/// within it).
pub(crate) const INPUT_TIMEOUT: Duration = Duration::from_secs(5);
/// The bound of one resize.
const RESIZE_TIMEOUT: Duration = Duration::from_secs(10);
/// The bound of the hang-up at close (its script sleeps two seconds between its signals).
const HANGUP_TIMEOUT: Duration = Duration::from_secs(20);
/// The bound of the kill of the shell after the hang-up.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// The agent's detach-timer request header.
const HEADER_DETACH_TIMEOUT: &str = "sandbox-detach-timeout-ms";

/// The hang-up of one session: `$1` is the marker, passed as an argument so the scanning
/// shell (whose environment lacks it) never matches itself.
const HANGUP_SCRIPT: &str = concat!(
    "scan() { for d in /proc/[0-9]*; do p=${d#/proc/}; [ \"$p\" = \"$$\" ] && continue; ",
    "tr '\\000' '\\n' < \"$d/environ\" 2>/dev/null | grep -qx \"SANDBOX_TERMINAL_ID=$1\" ",
    "&& echo \"$p\"; done; }; ",
    "pids=$(scan \"$1\"); [ -n \"$pids\" ] || exit 0; ",
    "kill -HUP $pids 2>/dev/null; kill -CONT $pids 2>/dev/null; sleep 2; ",
    "pids=$(scan \"$1\"); [ -n \"$pids\" ] && kill -KILL $pids 2>/dev/null; exit 0"
);

/// The keepalive a terminal's stream asks for: the agent learns of a detach when it next
/// sends, so the interval is a fraction of the detach timeout (within [1 s, 15 s]).
fn stream_keepalive(detach_timeout: Duration) -> Duration {
    (detach_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(15))
}

/// A terminal stream's call: no deadline (it lives until closed, or until the detach timer
/// ends it), a short keepalive.
fn stream_options(detach_timeout: Duration) -> CallOptions {
    CallOptions::new()
        .no_timeout()
        .keepalive(stream_keepalive(detach_timeout))
}

/// The session's environment: the caller's, `TERM` forced, a UTF-8 locale, the marker.
fn shell_env(options: &TerminalOptions, marker: &str) -> BTreeMap<String, String> {
    let mut env = options.env.clone();
    env.insert("TERM".to_owned(), TERMINAL_TERM.to_owned());
    env.insert("LANG".to_owned(), "C.UTF-8".to_owned());
    env.insert("LC_ALL".to_owned(), "C.UTF-8".to_owned());
    env.insert(TERMINAL_MARKER_ENV.to_owned(), marker.to_owned());
    env
}

fn random_hex() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

fn pty_size(size: TerminalSize) -> ps::Pty {
    ps::Pty {
        size: Some(ps::pty::Size {
            cols: u32::from(size.cols),
            rows: u32::from(size.rows),
        }),
    }
}

#[async_trait]
impl Terminals for E2bProvider {
    async fn open_terminal(
        &self,
        sandbox: &SandboxHandle,
        options: TerminalOptions,
    ) -> Result<Terminal, Error> {
        let op = Operation::OPEN_TERMINAL;
        let envd = self.envd(sandbox).await?;
        let client = client_for(&envd, options.user.as_deref())?;
        let marker = random_hex();
        let detach_timeout = options.detach_timeout_or_default();
        let detach_ms = u64::try_from(detach_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let start = ps::StartRequest {
            process: Some(ps::ProcessConfig {
                cmd: SHELL[0].to_owned(),
                args: SHELL[1..].iter().map(|a| (*a).to_owned()).collect(),
                envs: shell_env(&options, &marker),
                cwd: options.cwd.as_ref().map(|c| c.as_str().to_owned()),
            }),
            pty: Some(pty_size(options.size.or(TerminalSize::DEFAULT))),
            tag: Some(format!("{TERMINAL_TAG}-{}", random_hex())),
            stdin: None,
        };
        let call = stream_options(detach_timeout).extension(HEADER_DETACH_TIMEOUT, detach_ms);
        let opening = async {
            let mut stream = client.start(&start, call).await?;
            let first = stream.message().await?;
            Ok::<_, Error>((stream, first))
        };
        let waited = tokio::time::timeout(START_WAIT, opening)
            .await
            .unwrap_or_else(|_| {
                Err(provider_error(Error::timeout(
                    op,
                    format!("envd did not start the shell within {START_WAIT:?}"),
                )))
            });
        let (stream, first) = match waited {
            Ok(opened) => opened,
            Err(e) => return Err(self.explain(sandbox.id(), e.with_operation(op)).await),
        };
        let Some(Event::Start(started)) = first.and_then(|m| m.event).and_then(|e| e.event) else {
            return Err(provider_error(Error::internal(
                op,
                "envd's first terminal event was not start",
            )));
        };
        Ok(assemble(
            client,
            envd.client().clone(),
            started.pid,
            marker,
            Stream::Start(stream),
        ))
    }
}

#[async_trait]
impl TerminalReattach for E2bProvider {
    async fn reattach_terminal(
        &self,
        sandbox: &SandboxHandle,
        pid: u32,
        size: TerminalSize,
    ) -> Result<Terminal, Error> {
        let op = Operation::REATTACH_TERMINAL;
        let envd = self.envd(sandbox).await?;
        let root = envd.client().clone();
        let failed = |e: Error| self.explain(sandbox.id(), e.with_operation(op));
        let listed = match root.list(CallOptions::new()).await {
            Ok(listed) => listed,
            Err(e) => return Err(failed(e).await),
        };
        let prefix = format!("{TERMINAL_TAG}-");
        let Some(info) = listed
            .into_iter()
            .find(|p| p.pid == pid && p.tag.as_deref().is_some_and(|t| t.starts_with(&prefix)))
        else {
            return Err(provider_error(terminal_not_found(pid)));
        };
        let marker = info
            .config
            .and_then(|c| c.envs.get(TERMINAL_MARKER_ENV).cloned())
            .ok_or_else(|| {
                provider_error(Error::internal(
                    op,
                    format!("terminal {pid} carries no {TERMINAL_MARKER_ENV}"),
                ))
            })?;
        // The detach timer was set at the start; the keepalive only paces how soon the agent
        // sees this stream go, so the default timeout's pace is good enough here.
        let call = stream_options(sandbox_core::config::DEFAULT_TERMINAL_IDLE_DISCONNECT);
        let opening = async {
            let (mut stream, _) = root
                .connect_from(ProcessSelector::pid(pid), Some(0), call)
                .await?;
            let first = stream.message().await?;
            Ok::<_, Error>((stream, first))
        };
        let (stream, first) = match opening.await {
            Ok(opened) => opened,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(provider_error(terminal_not_found(pid)));
            }
            Err(e) => return Err(failed(e).await),
        };
        if !matches!(
            first.and_then(|m| m.event).and_then(|e| e.event),
            Some(Event::Start(_))
        ) {
            return Err(provider_error(Error::internal(
                op,
                "envd's first reattach event was not start",
            )));
        }
        if size.cols > 0 && size.rows > 0 {
            let resized = root
                .resize_pty(
                    ProcessSelector::pid(pid),
                    u32::from(size.cols),
                    u32::from(size.rows),
                    CallOptions::new().timeout(RESIZE_TIMEOUT),
                )
                .await;
            if let Err(e) = resized {
                return Err(failed(e).await);
            }
        }
        Ok(assemble(
            root.clone(),
            root,
            pid,
            marker,
            Stream::Connect(stream),
        ))
    }
}

/// The two halves of an attached terminal; `client` acts as the shell's user, `root` hangs up.
fn assemble(client: Envd, root: Envd, pid: u32, marker: String, stream: Stream) -> Terminal {
    let (queue, pending) = mpsc::channel(INPUT_QUEUE);
    let failure = Arc::new(Mutex::new(None));
    let pump = tokio::spawn(pump(client.clone(), pid, pending, failure.clone()));
    let input = Arc::new(E2bTerminalInput {
        client,
        root,
        pid,
        marker,
        queue: Mutex::new(Some(queue)),
        failure,
        closed: AtomicBool::new(false),
        pump: Mutex::new(Some(pump)),
    });
    Terminal {
        // The reattach handle: envd keeps the PTY process when this stream goes.
        pid: Some(pid),
        output: Box::new(E2bTerminalOutput {
            stream: Mutex::new(stream),
            finished: false,
        }),
        input,
    }
}

/// Sends the queued input, up to [`INPUT_BATCH`] bytes per `SendInput`, until the queue closes
/// or a send fails (its error is kept for the writers).
async fn pump(
    client: Envd,
    pid: u32,
    mut pending: mpsc::Receiver<Vec<u8>>,
    failure: Arc<Mutex<Option<Error>>>,
) {
    let mut carried: Option<Vec<u8>> = None;
    loop {
        let mut batch = match carried.take() {
            Some(bytes) => bytes,
            None => match pending.recv().await {
                Some(bytes) => bytes,
                None => return,
            },
        };
        while batch.len() < INPUT_BATCH {
            match pending.try_recv() {
                Ok(next) if batch.len() + next.len() <= INPUT_BATCH => batch.extend(next),
                Ok(next) => {
                    carried = Some(next);
                    break;
                }
                Err(_) => break,
            }
        }
        if let Err(e) = send_batch(&client, pid, batch).await {
            *failure.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(provider_error(e.with_operation(Operation::TERMINAL_IO)));
            return;
        }
    }
}

/// One `SendInput` of `batch`, sent again while the agent refuses it as over its input
/// buffer (the shell has not read what it holds), all within [`INPUT_TIMEOUT`].
async fn send_batch(client: &Envd, pid: u32, batch: Vec<u8>) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + INPUT_TIMEOUT;
    let mut wait = Duration::from_millis(2);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let sent = client
            .send_input(
                ProcessSelector::pid(pid),
                ProcessInput::pty(batch.clone()),
                CallOptions::new().timeout(left.max(Duration::from_millis(1))),
            )
            .await;
        match sent {
            Err(e)
                if e.kind() == ErrorKind::Capacity
                    && tokio::time::Instant::now() + wait < deadline =>
            {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
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

struct E2bTerminalOutput {
    // `next_event` takes `&mut self`, so the mutex is never contended: it only makes the
    // struct `Sync`.
    stream: Mutex<Stream>,
    finished: bool,
}

impl std::fmt::Debug for E2bTerminalOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bTerminalOutput")
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl TerminalOutput for E2bTerminalOutput {
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
                        Some(Output::Pty(b) | Output::Stdout(b) | Output::Stderr(b))
                            if !b.is_empty() =>
                        {
                            return Some(TerminalEvent::Data(b));
                        }
                        _ => {}
                    },
                    Some(Event::End(end)) => {
                        self.finished = true;
                        return Some(TerminalEvent::Exited(end.exited.then_some(end.exit_code)));
                    }
                    Some(Event::Start(_) | Event::Keepalive(_)) | None => {}
                },
                Ok(None) => {
                    self.finished = true;
                    return Some(TerminalEvent::Exited(None));
                }
                Err(e) => {
                    self.finished = true;
                    return Some(TerminalEvent::Failed(provider_error(
                        e.with_operation(Operation::TERMINAL_IO),
                    )));
                }
            }
        }
    }
}

struct E2bTerminalInput {
    /// The client acting as the shell's user.
    client: Envd,
    /// Root's client, for the hang-up (the session may have changed accounts).
    root: Envd,
    pid: u32,
    marker: String,
    /// The writers' end of the input queue; taken at close and detach.
    queue: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
    /// Why the pump stopped, if a send failed.
    failure: Arc<Mutex<Option<Error>>>,
    closed: AtomicBool,
    pump: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for E2bTerminalInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bTerminalInput")
            .field("pid", &self.pid)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl E2bTerminalInput {
    fn failure(&self) -> Option<Error> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Lets the pump send what is queued, then stop.
    fn close_queue(&self) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// Hangs up every process of the session marked `marker`, then kills the shell (best effort:
/// a session that already ended is the same outcome).
async fn hang_up(root: &Envd, pid: u32, marker: &str) {
    let start = ps::StartRequest {
        process: Some(ps::ProcessConfig {
            cmd: "/bin/sh".to_owned(),
            args: vec![
                "-c".to_owned(),
                HANGUP_SCRIPT.to_owned(),
                "sandbox-kill".to_owned(),
                marker.to_owned(),
            ],
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    };
    match root
        .start(&start, CallOptions::new().timeout(HANGUP_TIMEOUT))
        .await
    {
        Ok(mut stream) => while let Ok(Some(_)) = stream.message().await {},
        Err(e) => tracing::debug!(pid, error = %e, "the terminal's hang-up could not start"),
    }
    // The shell itself, should it have ignored the hang-up.
    let _ = root
        .send_signal(
            ProcessSelector::pid(pid),
            ps::Signal::Sigkill,
            CallOptions::new().timeout(KILL_TIMEOUT),
        )
        .await;
}

#[async_trait]
impl TerminalInput for E2bTerminalInput {
    async fn write(&self, data: &[u8]) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(provider_error(terminal_closed()));
        }
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let Some(queue) = self
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            return Err(provider_error(terminal_closed()));
        };
        for chunk in data.chunks(INPUT_BATCH) {
            if queue.send(chunk.to_vec()).await.is_err() {
                // The pump stopped: a send failed.
                return Err(self
                    .failure()
                    .unwrap_or_else(|| provider_error(terminal_closed())));
            }
        }
        Ok(())
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
                CallOptions::new().timeout(RESIZE_TIMEOUT),
            )
            .await
            .map_err(|e| provider_error(e.with_operation(Operation::TERMINAL_IO)))
    }

    async fn close(&self) -> Result<(), Error> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.close_queue();
        if let Some(pump) = self
            .pump
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            pump.abort();
        }
        hang_up(&self.root, self.pid, &self.marker).await;
        Ok(())
    }

    async fn detach(&self) -> Result<(), Error> {
        // The shell stays; what was typed is still sent, and the agent's detach timer ends a
        // shell nobody comes back to.
        self.closed.store(true, Ordering::Release);
        self.close_queue();
        Ok(())
    }
}

impl Drop for E2bTerminalInput {
    fn drop(&mut self) {
        // Dropped without close: a detach. The pump sends what is queued and stops.
        self.close_queue();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_env_forces_term_and_carries_the_marker() {
        let mut options = TerminalOptions::default();
        options.env.insert("TERM".to_owned(), "dumb".to_owned());
        options.env.insert("K".to_owned(), "v".to_owned());
        let env = shell_env(&options, "m1");
        assert_eq!(env.get("TERM").map(String::as_str), Some(TERMINAL_TERM));
        assert_eq!(env.get("K").map(String::as_str), Some("v"));
        assert_eq!(env.get(TERMINAL_MARKER_ENV).map(String::as_str), Some("m1"));
        assert_eq!(env.get("LANG").map(String::as_str), Some("C.UTF-8"));
    }

    #[test]
    fn the_hang_up_matches_the_marker_exactly_and_never_itself() {
        assert!(HANGUP_SCRIPT.contains(&format!("grep -qx \"{TERMINAL_MARKER_ENV}=$1\"")));
        assert!(HANGUP_SCRIPT.contains("[ \"$p\" = \"$$\" ] && continue"));
        assert!(HANGUP_SCRIPT.contains("kill -HUP") && HANGUP_SCRIPT.contains("kill -KILL"));
    }

    #[test]
    fn a_detach_is_noticed_within_a_quarter_of_its_timeout() {
        let pace = stream_keepalive;
        assert_eq!(pace(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(pace(Duration::from_secs(40)), Duration::from_secs(10));
        assert_eq!(pace(Duration::from_secs(3600)), Duration::from_secs(15));
    }
}
