//! Background processes through envd's process service (the port's `Processes`), using the
//! sandbox agent's extensions where the envd has them and envd's own calls where it does not.
//!
//! - **Start.** `Process/Start` with the tag and `stdin`, and no deadline: envd bounds a
//!   started process's life by its call's `Connect-Timeout-Ms`, and a background process must
//!   outlive the call. The call returns once the `start` event named the pid (at most
//!   [`START_WAIT`]), and the stream is dropped then: envd keeps a process running when its
//!   stream closes. What runs is exec's: the argv form as it is, the shell form
//!   `/bin/bash -l -c EXPR` (and that is the argv reported); the account is the spec's user,
//!   else root; no `cwd` is envd's default. A refusal as over capacity (the agent's process
//!   cap) is `process_limit`.
//! - **Listing.** `GET /sandbox-agent/processes`, the agent's listing: live processes and the
//!   recently ended ones with their exit code or signal, their output counts and ring size.
//!   An envd without it (answered 404 or unimplemented: E2B's own envd) is listed by
//!   `Process/List` instead, which names live processes only, with their tags; their output
//!   count and ring are unknown there, and read as 0.
//! - **Tags.** envd does not keep tags unique, so a start with a tag first lists, and a running
//!   holder of the tag refuses it (`process_tag_in_use`).
//! - **Attach.** `Process/Connect` with the `sandbox-replay-offset` header: the answer's header
//!   says where the replay really starts, and when that is later than asked the first event is
//!   `Gap { from: asked, to: answered }`. An attach from "what comes next" (`None`) asks for
//!   the output count the listing reported, so every `Data` carries its exact offset; without
//!   the listing that count is unknown, so it asks from 0 (the ring is replayed too, at its
//!   true offsets). An answer without the header comes from an envd that keeps no output: its
//!   events are live output only, their offsets counted from the offset asked, since how much
//!   was missed cannot be known.
//! - **Input, stdin, signals.** `SendInput` (in chunks, sent again while the agent refuses a
//!   chunk as over its stdin buffer), `CloseStdin`, `SendSignal` with the signal's number (the
//!   agent takes every signal of the port; E2B's envd only TERM and KILL, and another one it
//!   refuses is `unsupported`). A refusal worded as "not found" or "not running" is told apart
//!   by the listing: unknown is `process_not_found`, ended is `process_exited`, running with
//!   its stdin closed is `stdin_closed`. Without the listing, a process missing from it is
//!   probed with a `Connect` (the agent keeps an ended process connectable for a while): one
//!   that answers has ended, one that does not is unknown.
//! - **Failures** of the envd are explained by the control plane (gone, paused).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use sandbox_core::process::errors;
use sandbox_core::{
    Command, Error, ErrorCode, ErrorKind, ExecRequest, Operation, OutputStream, ProcessEvent,
    ProcessInfo, ProcessOutput, ProcessSelector, ProcessSpec, ProcessStatus, ProcessStream,
    ProcessTag, Processes, SandboxHandle, Signal,
};
use sandbox_envd::ProcessStatus as EnvdStatus;
use sandbox_envd::process::process_event::data_event::Output;
use sandbox_envd::process::process_event::{EndEvent, Event};
use sandbox_envd::process::{self as ps, ProcessInput};
use sandbox_transport::envd::{CallOptions, ServerStream};
use serde::Deserialize;

use crate::envd::{Envd, SandboxEnvd};
use crate::errors::provider_error;
use crate::provider::E2bProvider;

/// The agent's listing extension.
pub(crate) const PROCESSES_PATH: &str = "/sandbox-agent/processes";
/// The longest listing read (the agent's live processes and 64 ended ones, with their argv).
const LISTING_LIMIT: usize = 8 * 1024 * 1024;
/// How long a start (of a process or a terminal) waits for envd's `start` event.
pub(crate) const START_WAIT: Duration = Duration::from_secs(30);
/// How long the probe of a process missing from a live-only listing waits for an answer.
const PROBE_WAIT: Duration = Duration::from_secs(5);
/// While the agent refuses input as over its stdin buffer, the chunk is sent again after a
/// wait doubling from the first to the last, for at most [`INPUT_WAIT`] in all.
const INPUT_RETRY_FIRST: Duration = Duration::from_millis(2);
const INPUT_RETRY_MAX: Duration = Duration::from_millis(100);
const INPUT_WAIT: Duration = Duration::from_secs(60);

/// One listed process: the agent's listing entry (unknown fields ignored, absent ones their
/// defaults), or a live process of envd's `Process/List`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Listed {
    pid: u32,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    stdin: bool,
    #[serde(default)]
    output_bytes: u64,
    #[serde(default)]
    ring_bytes: u64,
    running: bool,
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    signal: Option<i32>,
}

#[derive(Debug, Deserialize)]
struct Listing {
    processes: Vec<Listed>,
}

impl Listed {
    /// A live process as envd's `Process/List` names it: whether its stdin takes input is
    /// not said, so it is taken as not (a refused input is then `stdin_closed`).
    fn live(info: ps::ProcessInfo) -> Listed {
        let config = info.config.unwrap_or_default();
        Listed {
            pid: info.pid,
            tag: info.tag,
            cmd: config.cmd,
            args: config.args,
            stdin: false,
            output_bytes: 0,
            ring_bytes: 0,
            running: true,
            exit_code: None,
            signal: None,
        }
    }

    fn info(&self) -> ProcessInfo {
        let status = if self.running {
            ProcessStatus::Running
        } else {
            ProcessStatus::Exited {
                exit_code: self.exit_code,
                signal: self.signal.and_then(signal_of),
            }
        };
        ProcessInfo {
            pid: self.pid,
            // A tag the port cannot name (another envd client's) leaves it found by pid only.
            tag: self.tag.clone().and_then(|t| ProcessTag::new(t).ok()),
            argv: std::iter::once(self.cmd.clone())
                .chain(self.args.iter().cloned())
                .collect(),
            status,
            output_bytes: self.output_bytes,
            ring_bytes: self.ring_bytes,
        }
    }

    fn has_tag(&self, tag: &ProcessTag) -> bool {
        self.tag.as_deref() == Some(tag.as_str())
    }
}

/// A sandbox's processes, and whether they came from the agent's listing (`full`: ended ones
/// included) or from envd's live-only `Process/List`.
struct Known {
    all: Vec<Listed>,
    full: bool,
}

/// The port's signal with this number.
fn signal_of(number: i32) -> Option<Signal> {
    Signal::ALL.into_iter().find(|s| s.number() == number)
}

/// The listed process `target` names, by the agent's rule: the pid's (a running one first), or
/// the running holder of the tag (the most recently started), else the most recently ended one.
fn find<'a>(all: &'a [Listed], target: &ProcessSelector) -> Option<&'a Listed> {
    match target {
        ProcessSelector::Pid(pid) => all
            .iter()
            .find(|p| p.pid == *pid && p.running)
            .or_else(|| all.iter().rev().find(|p| p.pid == *pid)),
        ProcessSelector::Tag(tag) => all
            .iter()
            .rev()
            .find(|p| p.has_tag(tag) && p.running)
            .or_else(|| all.iter().rev().find(|p| p.has_tag(tag))),
    }
}

fn envd_selector(target: &ProcessSelector) -> ps::ProcessSelector {
    match target {
        ProcessSelector::Pid(pid) => ps::ProcessSelector::pid(*pid),
        ProcessSelector::Tag(tag) => ps::ProcessSelector::tag(tag.as_str().to_owned()),
    }
}

/// How `end` reads in the port's terms: an exit code, or the signal that ended it.
fn status_of(end: &EndEvent) -> ProcessStatus {
    if end.exited {
        return ProcessStatus::Exited {
            exit_code: Some(end.exit_code),
            signal: None,
        };
    }
    let signal = match EnvdStatus::parse(&end.status) {
        Some(EnvdStatus::Signaled { signal, .. }) => signal_of(signal),
        _ => None,
    };
    ProcessStatus::Exited {
        exit_code: None,
        signal,
    }
}

/// Whether `e` says the envd has no such endpoint (rather than that the sandbox is missing: a
/// missing sandbox fails envd's own listing too, and that failure is the one explained).
fn lacks_extension(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Unsupported)
        || matches!(e.http_status(), Some(404 | 405 | 501))
}

/// The sandbox's processes (see the module docs).
async fn list_all(client: &Envd, op: Operation) -> Result<Known, Error> {
    match client
        .get_json::<Listing>(op, PROCESSES_PATH, LISTING_LIMIT, CallOptions::new())
        .await
    {
        Ok(listing) => Ok(Known {
            all: listing.processes,
            full: true,
        }),
        Err(e) if lacks_extension(&e) => {
            let live = client.list(CallOptions::new()).await?;
            Ok(Known {
                all: live.into_iter().map(Listed::live).collect(),
                full: false,
            })
        }
        Err(e) => Err(e),
    }
}

/// The client acting as `user`, root when none is named.
pub(crate) fn client_for(envd: &SandboxEnvd, user: Option<&str>) -> Result<Envd, Error> {
    match user {
        Some(user) => envd.as_user(user),
        None => Ok(envd.client().clone()),
    }
}

/// Whether envd still knows `target` though a live-only listing lacks it: a `Connect` that
/// answers at all names a process that has ended since (or is about to be forgotten). No
/// deadline goes with it (envd bounds what a call's deadline covers); the wait here does.
async fn still_known(client: &Envd, target: &ProcessSelector) -> bool {
    let probe = async {
        let mut stream = client
            .connect(envd_selector(target), CallOptions::new().no_timeout())
            .await?;
        stream.message().await
    };
    matches!(
        tokio::time::timeout(PROBE_WAIT, probe).await,
        Ok(Ok(Some(_)))
    )
}

/// The port's error for envd's refusal of a call naming `target` (see the module docs).
async fn refused(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    client: &Envd,
    op: Operation,
    target: &ProcessSelector,
    e: Error,
) -> Error {
    if !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Internal) {
        return provider.explain(sandbox.id(), e.with_operation(op)).await;
    }
    let listed = match list_all(client, op).await {
        Ok(listed) => listed,
        Err(_) => return provider_error(e.with_operation(op)),
    };
    let refusal = match find(&listed.all, target) {
        None if !listed.full && still_known(client, target).await => errors::exited(op, target),
        None => errors::not_found(op, target),
        // envd found no running process: whatever the listing says, it has ended.
        Some(_) if e.kind() == ErrorKind::NotFound => errors::exited(op, target),
        Some(p) if !p.running => errors::exited(op, target),
        Some(p) if op == Operation::SEND_INPUT && !p.stdin => errors::stdin_closed(op, target),
        Some(_) => e.with_operation(op),
    };
    provider_error(refusal)
}

/// The program and arguments `spec` runs: exec's (`crate::exec::process_config`).
fn command_of(spec: &ProcessSpec) -> ps::ProcessConfig {
    let mut request = match &spec.command {
        Command::Argv { program, args } => ExecRequest::argv(program.clone(), args.clone()),
        Command::Shell(expression) => ExecRequest::shell(expression.clone()),
    };
    request.env = spec.env.clone();
    request.cwd = spec.cwd.clone();
    crate::exec::process_config(&request)
}

/// Starts `spec` in the background (see the module docs).
async fn start(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    spec: ProcessSpec,
) -> Result<ProcessInfo, Error> {
    let op = Operation::START_PROCESS;
    let envd = provider.envd(sandbox).await?;
    let root = envd.client();
    let failed = |e: Error| provider.explain(sandbox.id(), e.with_operation(op));
    if let Some(tag) = &spec.tag {
        let listed = match list_all(root, op).await {
            Ok(listed) => listed,
            Err(e) => return Err(failed(e).await),
        };
        if listed.all.iter().any(|p| p.running && p.has_tag(tag)) {
            return Err(provider_error(errors::tag_in_use(tag)));
        }
    }
    let process = command_of(&spec);
    let argv: Vec<String> = std::iter::once(process.cmd.clone())
        .chain(process.args.iter().cloned())
        .collect();
    let request = ps::StartRequest {
        process: Some(process),
        pty: None,
        tag: spec.tag.as_ref().map(|t| t.as_str().to_owned()),
        stdin: Some(spec.stdin),
    };
    let client = client_for(&envd, spec.user.as_deref())?;
    let opening = async {
        let mut stream = client
            .start(&request, CallOptions::new().no_timeout())
            .await?;
        let first = stream.message().await?;
        Ok::<_, Error>((stream, first))
    };
    let waited = tokio::time::timeout(START_WAIT, opening)
        .await
        .unwrap_or_else(|_| {
            Err(provider_error(Error::timeout(
                op,
                format!("envd did not start the process within {START_WAIT:?}"),
            )))
        });
    let (stream, first) = match waited {
        Ok(opened) => opened,
        // The agent's only capacity refusal of a start is its process cap.
        Err(e) if e.kind() == ErrorKind::Capacity => {
            return Err(provider_error(
                Error::new(
                    ErrorKind::Capacity,
                    op,
                    format!(
                        "the sandbox runs as many processes as it may: {}",
                        e.message()
                    ),
                )
                .with_code(ErrorCode::ProcessLimit),
            ));
        }
        // The program could not be started (missing, not executable, a bad directory).
        Err(e) if e.kind() == ErrorKind::InvalidRequest => {
            return Err(provider_error(e.with_operation(op)));
        }
        Err(e) => return Err(failed(e).await),
    };
    let pid = match first.and_then(|m| m.event).and_then(|e| e.event) {
        Some(Event::Start(s)) => s.pid,
        other => {
            return Err(provider_error(Error::internal(
                op,
                format!("envd's first process event was not start: {other:?}"),
            )));
        }
    };
    // Closing the Start stream detaches; the process runs on.
    drop(stream);
    // The ring's size is the agent's setting, which only its listing tells; without it no
    // replay is promised.
    let ring_bytes = match root
        .get_json::<Listing>(op, PROCESSES_PATH, LISTING_LIMIT, CallOptions::new())
        .await
    {
        Ok(listing) => listing
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .map_or(0, |p| p.ring_bytes),
        Err(_) => 0,
    };
    Ok(ProcessInfo {
        pid,
        tag: spec.tag,
        argv,
        status: ProcessStatus::Running,
        output_bytes: 0,
        ring_bytes,
    })
}

/// Attaches to `target`'s output from `from` (see the module docs).
async fn attach(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    target: &ProcessSelector,
    from: Option<u64>,
) -> Result<ProcessStream, Error> {
    let op = Operation::ATTACH_PROCESS;
    let envd = provider.envd(sandbox).await?;
    let client = envd.client();
    let listed = match list_all(client, op).await {
        Ok(listed) => listed,
        Err(e) => return Err(provider.explain(sandbox.id(), e.with_operation(op)).await),
    };
    let entry = find(&listed.all, target);
    if listed.full && entry.is_none() {
        return Err(provider_error(errors::not_found(op, target)));
    }
    let selector = entry.map_or_else(
        || envd_selector(target),
        |e| ps::ProcessSelector::pid(e.pid),
    );
    let produced = entry.filter(|_| listed.full).map(|e| e.output_bytes);
    let asked = from.or(produced).unwrap_or(0);
    let opening = async {
        let (mut stream, start) = client
            .connect_from(selector, Some(asked), CallOptions::new().no_timeout())
            .await?;
        let first = stream.message().await?;
        Ok::<_, Error>((stream, start, first))
    };
    let (stream, start, first) = match opening.await {
        Ok(opened) => opened,
        Err(e) if e.kind() == ErrorKind::InvalidRequest => {
            let ahead = match produced {
                Some(produced) => errors::offset_ahead(asked, produced),
                None => Error::invalid_request(
                    op,
                    format!("offset {asked} is past the output produced so far"),
                )
                .with_code(ErrorCode::InvalidOffset),
            };
            return Err(provider_error(ahead));
        }
        // Unknown, or forgotten between the listing and the attach.
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(provider_error(errors::not_found(op, target)));
        }
        Err(e) => return Err(provider.explain(sandbox.id(), e.with_operation(op)).await),
    };
    let internal = |what: String| provider_error(Error::internal(op, what));
    let pid = match first.and_then(|m| m.event).and_then(|e| e.event) {
        Some(Event::Start(s)) => s.pid,
        other => {
            return Err(internal(format!(
                "the attach began with {other:?}, not start"
            )));
        }
    };
    let (offset, gap) = match start {
        Some(start) if start >= asked => (
            start,
            (start > asked).then_some(ProcessEvent::Gap {
                from: asked,
                to: start,
            }),
        ),
        Some(start) => {
            return Err(internal(format!(
                "envd answered a replay from {start} when asked for {asked}"
            )));
        }
        // An envd that keeps no output: live output only (module docs).
        None => (asked, None),
    };
    Ok(Box::new(Attach {
        stream,
        pid,
        gap,
        offset,
        done: false,
    }))
}

/// An attach's events; dropping it detaches (envd keeps the process running).
struct Attach {
    stream: ServerStream<ps::ConnectResponse>,
    pid: u32,
    /// The gap to report first, when the replay started later than asked.
    gap: Option<ProcessEvent>,
    /// The offset of the next byte.
    offset: u64,
    done: bool,
}

impl std::fmt::Debug for Attach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attach")
            .field("pid", &self.pid)
            .field("offset", &self.offset)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ProcessOutput for Attach {
    async fn next_event(&mut self) -> Option<ProcessEvent> {
        if self.done {
            return None;
        }
        if let Some(gap) = self.gap.take() {
            return Some(gap);
        }
        loop {
            let failed = |e: Error| {
                Some(ProcessEvent::Failed(provider_error(
                    e.with_operation(Operation::ATTACH_PROCESS),
                )))
            };
            let message = match self.stream.message().await {
                Ok(Some(message)) => message,
                Ok(None) => {
                    self.done = true;
                    return failed(Error::unavailable(
                        Operation::ATTACH_PROCESS,
                        format!("envd ended the attach to pid {} before its end", self.pid),
                    ));
                }
                Err(e) => {
                    self.done = true;
                    return failed(e);
                }
            };
            match message.event.and_then(|e| e.event) {
                Some(Event::Data(data)) => {
                    let (stream, bytes) = match data.output {
                        Some(Output::Stdout(b) | Output::Pty(b)) => (OutputStream::Stdout, b),
                        Some(Output::Stderr(b)) => (OutputStream::Stderr, b),
                        None => continue,
                    };
                    if bytes.is_empty() {
                        continue;
                    }
                    let offset = self.offset;
                    self.offset += bytes.len() as u64;
                    return Some(ProcessEvent::Data {
                        stream,
                        offset,
                        data: bytes,
                    });
                }
                Some(Event::End(end)) => {
                    self.done = true;
                    return Some(ProcessEvent::Exited(status_of(&end)));
                }
                Some(Event::Start(_) | Event::Keepalive(_)) | None => {}
            }
        }
    }
}

/// Writes `data` to `target`'s stdin, in order.
async fn send_input(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    target: &ProcessSelector,
    data: &[u8],
) -> Result<(), Error> {
    let op = Operation::SEND_INPUT;
    let envd = provider.envd(sandbox).await?;
    let client = envd.client();
    // Empty input is still sent once, so it is judged like any other (an ended process).
    let chunks: Vec<&[u8]> = if data.is_empty() {
        vec![data]
    } else {
        data.chunks(crate::exec::STDIN_CHUNK).collect()
    };
    let began = Instant::now();
    for chunk in chunks {
        let mut wait = INPUT_RETRY_FIRST;
        loop {
            let sent = client
                .send_input(
                    envd_selector(target),
                    ProcessInput::stdin(chunk.to_vec()),
                    CallOptions::new(),
                )
                .await;
            match sent {
                Ok(()) => break,
                Err(e) if e.kind() == ErrorKind::Capacity && began.elapsed() < INPUT_WAIT => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(INPUT_RETRY_MAX);
                }
                Err(e) => return Err(refused(provider, sandbox, client, op, target, e).await),
            }
        }
    }
    Ok(())
}

#[async_trait]
impl Processes for E2bProvider {
    async fn start_process(
        &self,
        sandbox: &SandboxHandle,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error> {
        start(self, sandbox, spec).await
    }

    async fn list_processes(&self, sandbox: &SandboxHandle) -> Result<Vec<ProcessInfo>, Error> {
        let op = Operation::LIST_PROCESSES;
        let envd = self.envd(sandbox).await?;
        match list_all(envd.client(), op).await {
            Ok(listed) => Ok(listed.all.iter().map(Listed::info).collect()),
            Err(e) => Err(self.explain(sandbox.id(), e.with_operation(op)).await),
        }
    }

    async fn attach_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<ProcessStream, Error> {
        attach(self, sandbox, target, from).await
    }

    async fn send_input(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        data: &[u8],
    ) -> Result<(), Error> {
        send_input(self, sandbox, target, data).await
    }

    async fn close_stdin(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
    ) -> Result<(), Error> {
        let op = Operation::CLOSE_STDIN;
        let envd = self.envd(sandbox).await?;
        let client = envd.client();
        match client
            .close_stdin(envd_selector(target), CallOptions::new())
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => Err(refused(self, sandbox, client, op, target, e).await),
        }
    }

    async fn signal_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        signal: Signal,
    ) -> Result<(), Error> {
        let op = Operation::SIGNAL_PROCESS;
        let envd = self.envd(sandbox).await?;
        let client = envd.client();
        // By number: proto3 enums are open, and the agent takes every signal of the port.
        let sent = client
            .send_signal(
                envd_selector(target),
                ps::Signal::from_i32(signal.number()),
                CallOptions::new(),
            )
            .await;
        match sent {
            Ok(()) => Ok(()),
            Err(e)
                if !matches!(signal, Signal::Term | Signal::Kill)
                    && matches!(e.kind(), ErrorKind::Unsupported | ErrorKind::InvalidRequest) =>
            {
                Err(provider_error(Error::unsupported(
                    op,
                    format!("this sandbox's envd sends only TERM and KILL, not {signal}"),
                )))
            }
            Err(e) => Err(refused(self, sandbox, client, op, target, e).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(json: serde_json::Value) -> Listed {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_agents_listing_reads_in_the_ports_terms() {
        let running = listed(serde_json::json!({
            "pid": 7, "tag": "job-1", "cmd": "sleep", "args": ["30"], "stdin": true,
            "output_bytes": 5, "ring_bytes": 1024, "running": true, "pty": false
        }));
        let info = running.info();
        assert_eq!(info.tag.as_ref().map(ProcessTag::as_str), Some("job-1"));
        assert_eq!(info.argv, ["sleep", "30"]);
        assert_eq!(info.status, ProcessStatus::Running);
        assert_eq!((info.output_bytes, info.ring_bytes), (5, 1024));
        let killed =
            listed(serde_json::json!({"pid": 9, "cmd": "x", "running": false, "signal": 9}));
        assert_eq!(
            killed.info().status,
            ProcessStatus::Exited {
                exit_code: None,
                signal: Some(Signal::Kill)
            }
        );
        // A tag the port cannot hold leaves the process found by pid.
        let odd = listed(serde_json::json!({"pid": 10, "cmd": "x", "running": true, "tag": "a b"}));
        assert_eq!(odd.info().tag, None);
    }

    #[test]
    fn envds_live_listing_is_running_with_nothing_replayable() {
        let live = Listed::live(ps::ProcessInfo {
            config: Some(ps::ProcessConfig {
                cmd: "/bin/bash".to_owned(),
                args: vec!["-l".to_owned(), "-c".to_owned(), "sleep 9".to_owned()],
                ..Default::default()
            }),
            pid: 12,
            tag: Some("t".to_owned()),
        });
        assert!(!live.stdin, "an unknown stdin reads as closed");
        let info = live.info();
        assert_eq!(info.argv, ["/bin/bash", "-l", "-c", "sleep 9"]);
        assert_eq!(info.status, ProcessStatus::Running);
        assert_eq!((info.output_bytes, info.ring_bytes), (0, 0));
        assert_eq!(
            find(&[live], &ProcessSelector::Pid(12)).map(|p| p.pid),
            Some(12)
        );
    }

    #[test]
    fn a_tag_selects_its_running_holder_first() {
        let all = vec![
            listed(serde_json::json!({"pid": 1, "tag": "t", "running": false, "exit_code": 0})),
            listed(serde_json::json!({"pid": 2, "tag": "t", "running": true})),
            listed(serde_json::json!({"pid": 3, "tag": "t", "running": false, "exit_code": 1})),
        ];
        let tag = ProcessSelector::Tag(ProcessTag::new("t").unwrap());
        assert_eq!(find(&all, &tag).map(|p| p.pid), Some(2));
        assert_eq!(find(&all[..1], &tag).map(|p| p.pid), Some(1));
        assert!(find(&all, &ProcessSelector::Pid(4)).is_none());
    }

    #[test]
    fn the_shell_form_is_execs_and_ends_read_as_codes_or_signals() {
        let config = command_of(&ProcessSpec::shell("echo $HOME"));
        assert_eq!(config.cmd, crate::exec::SHELL);
        assert_eq!(config.args, ["-l", "-c", "echo $HOME"]);
        assert_eq!(
            status_of(&EnvdStatus::Exited(4).end_event()),
            ProcessStatus::Exited {
                exit_code: Some(4),
                signal: None
            }
        );
        let killed = EnvdStatus::Signaled {
            signal: 9,
            core_dumped: false,
        }
        .end_event();
        assert_eq!(
            status_of(&killed),
            ProcessStatus::Exited {
                exit_code: None,
                signal: Some(Signal::Kill)
            }
        );
        assert_eq!(
            ps::Signal::from_i32(Signal::Usr1.number()),
            ps::Signal::Unrecognized(10)
        );
    }
}
