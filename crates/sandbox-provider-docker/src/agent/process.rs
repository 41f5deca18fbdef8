//! Background processes through the agent (agent mode): the port's `Processes` over the kept
//! channel (`crate::channel`), on envd's process service and two of the agent's extensions.
//!
//! - **Start.** `Process/Start` with the tag and `stdin`, and no deadline: envd bounds a
//!   started process's life by its call's `Connect-Timeout-Ms`, and a background process must
//!   outlive the call. The call returns once the agent's `start` event named the pid, and the
//!   stream is dropped then: the agent keeps a process running when its stream closes. The
//!   shell form runs `/bin/sh -c EXPR`, as [`ProcessSpec::argv_view`] reports it; the
//!   directory defaults to the workspace root, as exec's does.
//! - **Listing.** envd's `Process/List` names live processes only, so the listing is the
//!   agent's `GET /sandbox-agent/processes` (`docs/envd.md`, "Our extensions"): the live ones
//!   and the recently ended ones with their exit code or signal. It lists everything the agent
//!   runs, the commands of exec and terminals included, since they are processes of the
//!   sandbox too.
//! - **Tags.** envd does not keep tags unique, so a start with a tag first lists, and a running
//!   holder of the tag refuses it (`process_tag_in_use`). Two starts racing with one tag can
//!   both pass that check: the listing then names the tag twice, and a tag selects the most
//!   recently started running holder (the agent's rule).
//! - **Attach.** `Process/Connect` with the agent's `sandbox-replay-offset` header; the answer's
//!   header says where the replay really starts, and when that is later than asked the first
//!   event is `Gap { from: asked, to: answered }`. An attach from "what comes next" (`None`)
//!   asks for the output count the listing reported, so every `Data` carries its exact offset.
//!   The stream holds its channel lease and has no deadline (the agent's keepalives keep it
//!   from looking idle).
//! - **Input, stdin, signals.** `SendInput` (in chunks, waiting while the agent's stdin buffer
//!   for the process is full), `CloseStdin`, `SendSignal` with the signal's number: the agent
//!   takes every signal of the port by number (proto3 enums are open), envd's TERM and KILL
//!   among them. A refusal the agent words as "not found" or "not running" is told apart by
//!   the listing: unknown is `process_not_found`, ended is `process_exited`, running with its
//!   stdin closed is `stdin_closed`.
//! - **Ended processes** stay listed, and attachable, for the agent's retention of 30 s after
//!   their end (at most 64 of them); then a pid or tag naming one is `process_not_found`.
//! - **The cap.** The agent runs at most `docker.processes_per_sandbox` processes at once (its
//!   `--max-processes`, set at install; commands and terminals count too); a start past it is
//!   `process_limit`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sandbox_core::process::errors;
use sandbox_core::{
    Command, Error, ErrorKind, Operation, OutputStream, ProcessEvent, ProcessInfo, ProcessOutput,
    ProcessSelector, ProcessSpec, ProcessStatus, ProcessTag, Provider, Signal,
};
use sandbox_envd::ProcessStatus as EnvdStatus;
use sandbox_envd::process::process_event::data_event::Output;
use sandbox_envd::process::process_event::{EndEvent, Event};
use sandbox_envd::process::{self as ps, ProcessInput};
use sandbox_transport::envd::{CallOptions, ServerStream};
use serde::Deserialize;

use super::exec::{client_for, cwd_or_default, explain, lease, until_started};
use crate::channel::{Channel, Lease};
use crate::provider::DockerProvider;

/// The agent's listing extension.
pub(crate) const PROCESSES_PATH: &str = "/sandbox-agent/processes";
/// The longest listing read: the live processes (at most the cap) and 64 ended ones, each
/// with its argv.
const LISTING_LIMIT: usize = 8 * 1024 * 1024;
/// How long a start waits for the agent's `start` event.
const START_WAIT: Duration = Duration::from_secs(30);
/// The most input sent in one `SendInput`, as exec sends it.
const INPUT_CHUNK: usize = 256 * 1024;
/// While the agent refuses input as over its stdin buffer (the process has not read what it
/// holds), the same chunk is sent again after a wait doubling from the first to the last,
/// for at most [`INPUT_WAIT`] in all: back-pressure, as the fake's bounded queue gives.
const INPUT_RETRY_FIRST: Duration = Duration::from_millis(2);
const INPUT_RETRY_MAX: Duration = Duration::from_millis(100);
const INPUT_WAIT: Duration = Duration::from_secs(60);

/// The size of every process's replay ring: the agent's `--output-ring-bytes`, set at install
/// ([`super::AGENT_FLAGS`] spells the same number; a unit test keeps them together).
pub(crate) const RING_BYTES: u64 = 1024 * 1024;

/// One process of the agent's listing (its JSON; unknown fields are ignored, absent ones are
/// their defaults).
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
            // A tag the port cannot name (another envd client's) leaves the process found by
            // its pid only.
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

/// The port's signal with this number.
fn signal_of(number: i32) -> Option<Signal> {
    Signal::ALL.into_iter().find(|s| s.number() == number)
}

/// The listed process `target` names, by the agent's own rule: the pid's (a running one
/// first), or the running holder of the tag (the most recently started), else the most
/// recently ended one with it.
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
pub(crate) fn status_of(end: &EndEvent) -> ProcessStatus {
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

async fn list_with(lease: &Lease, op: Operation) -> Result<Vec<Listed>, Error> {
    let listing: Listing = lease
        .client()
        .get_json(op, PROCESSES_PATH, LISTING_LIMIT, CallOptions::new())
        .await
        .map_err(|e| e.with_operation(op).with_provider(Provider::Docker))?;
    Ok(listing.processes)
}

/// A failed call on the channel: a suspect channel is dropped, and the container is asked
/// whether it is what failed (gone, stopped, paused).
async fn failed(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    op: Operation,
    e: Error,
) -> Error {
    if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Timeout) {
        channel.invalidate().await;
    }
    explain(provider.docker(), channel.container(), e)
        .await
        .with_operation(op)
        .with_provider(Provider::Docker)
}

/// The port's error for the agent's refusal of a call naming `target` (see the module docs).
async fn refused(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    lease: &Lease,
    op: Operation,
    target: &ProcessSelector,
    e: Error,
) -> Error {
    if !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Internal) {
        return failed(provider, channel, op, e).await;
    }
    let all = match list_with(lease, op).await {
        Ok(all) => all,
        Err(_) => return e.with_operation(op).with_provider(Provider::Docker),
    };
    let refusal = match find(&all, target) {
        None => errors::not_found(op, target),
        // The agent found no running process: whatever the listing says, it has ended
        // (reaped, its end about to be recorded).
        Some(_) if e.kind() == ErrorKind::NotFound => errors::exited(op, target),
        Some(p) if !p.running => errors::exited(op, target),
        Some(p) if op == Operation::SEND_INPUT && !p.stdin => errors::stdin_closed(op, target),
        Some(_) => e.with_operation(op),
    };
    refusal.with_provider(Provider::Docker)
}

/// Starts `spec` in the background (see the module docs).
pub(crate) async fn start(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    spec: ProcessSpec,
) -> Result<ProcessInfo, Error> {
    let op = Operation::START_PROCESS;
    let lease = lease(provider, op, channel).await?;
    if let Some(tag) = &spec.tag {
        let all = list_with(&lease, op).await?;
        if all.iter().any(|p| p.running && p.has_tag(tag)) {
            return Err(errors::tag_in_use(tag).with_provider(Provider::Docker));
        }
    }
    let argv = spec.argv_view();
    let (cmd, args) = match &spec.command {
        Command::Argv { program, args } => (program.clone(), args.clone()),
        Command::Shell(_) => (argv[0].clone(), argv[1..].to_vec()),
    };
    let request = ps::StartRequest {
        process: Some(ps::ProcessConfig {
            cmd,
            args,
            envs: spec.env.clone(),
            cwd: Some(cwd_or_default(channel, spec.cwd.as_ref()).await?),
        }),
        pty: None,
        tag: spec.tag.as_ref().map(|t| t.as_str().to_owned()),
        stdin: Some(spec.stdin),
    };
    let client = client_for(&lease, spec.user.as_deref())?;
    let opening = async {
        let mut stream = client
            .start(&request, CallOptions::new().no_timeout())
            .await?;
        let first = stream.message().await?;
        Ok::<_, Error>((stream, first))
    };
    let waited = tokio::time::timeout(
        START_WAIT,
        until_started(provider.docker(), channel.container(), opening),
    )
    .await
    .map_err(|_| {
        Error::timeout(
            op,
            format!("the agent did not start the process within {START_WAIT:?}"),
        )
    });
    let (stream, first) = match waited.and_then(|opened| opened) {
        Ok(opened) => opened,
        // The agent's only capacity refusal of a start is its process cap.
        Err(e) if e.kind() == ErrorKind::Capacity => {
            return Err(
                errors::process_limit(provider.inner.config.processes_per_sandbox)
                    .with_provider(Provider::Docker),
            );
        }
        // The program could not be started (missing, not executable, a bad directory).
        Err(e) if e.kind() == ErrorKind::InvalidRequest => {
            return Err(e.with_operation(op).with_provider(Provider::Docker));
        }
        Err(e) => return Err(failed(provider, channel, op, e).await),
    };
    let pid = match first.and_then(|m| m.event).and_then(|e| e.event) {
        Some(Event::Start(s)) => s.pid,
        other => {
            return Err(Error::internal(
                op,
                format!("the agent's first process event was not start: {other:?}"),
            )
            .with_provider(Provider::Docker));
        }
    };
    // Closing the Start stream detaches; the process runs on.
    drop(stream);
    Ok(ProcessInfo {
        pid,
        tag: spec.tag,
        argv,
        status: ProcessStatus::Running,
        output_bytes: 0,
        ring_bytes: RING_BYTES,
    })
}

/// The live and recently ended processes.
pub(crate) async fn list(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
) -> Result<Vec<ProcessInfo>, Error> {
    let op = Operation::LIST_PROCESSES;
    let lease = lease(provider, op, channel).await?;
    match list_with(&lease, op).await {
        Ok(all) => Ok(all.iter().map(Listed::info).collect()),
        Err(e) => Err(failed(provider, channel, op, e).await),
    }
}

/// Attaches to `target`'s output from `from` (see the module docs).
pub(crate) async fn attach(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    target: &ProcessSelector,
    from: Option<u64>,
) -> Result<AgentAttach, Error> {
    let op = Operation::ATTACH_PROCESS;
    let lease = lease(provider, op, channel).await?;
    let all = list_with(&lease, op).await?;
    let entry = find(&all, target)
        .ok_or_else(|| errors::not_found(op, target).with_provider(Provider::Docker))?;
    let asked = from.unwrap_or(entry.output_bytes);
    let opening = async {
        let (mut stream, start) = lease
            .client()
            .connect_from(
                ps::ProcessSelector::pid(entry.pid),
                Some(asked),
                CallOptions::new().no_timeout(),
            )
            .await?;
        let first = stream.message().await?;
        Ok::<_, Error>((stream, start, first))
    };
    let (stream, start, first) = match opening.await {
        Ok(opened) => opened,
        Err(e) if e.kind() == ErrorKind::InvalidRequest => {
            return Err(
                errors::offset_ahead(asked, entry.output_bytes).with_provider(Provider::Docker)
            );
        }
        // Forgotten between the listing and the attach.
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(errors::not_found(op, target).with_provider(Provider::Docker));
        }
        Err(e) => return Err(failed(provider, channel, op, e).await),
    };
    let internal = |what: String| Error::internal(op, what).with_provider(Provider::Docker);
    match first.and_then(|m| m.event).and_then(|e| e.event) {
        Some(Event::Start(_)) => {}
        other => {
            return Err(internal(format!(
                "the agent's attach began with {other:?}, not start"
            )));
        }
    }
    let start = match start {
        Some(start) if start >= asked => start,
        other => {
            return Err(internal(format!(
                "the agent answered a replay from {other:?} when asked for {asked}"
            )));
        }
    };
    Ok(AgentAttach {
        stream,
        _lease: lease,
        pid: entry.pid,
        gap: (start > asked).then_some(ProcessEvent::Gap {
            from: asked,
            to: start,
        }),
        offset: start,
        done: false,
    })
}

/// An attach's events (see [`attach`]); holds its lease on the channel while it lives, and
/// dropping it detaches (the agent keeps the process running).
pub(crate) struct AgentAttach {
    stream: ServerStream<ps::ConnectResponse>,
    _lease: Lease,
    pid: u32,
    /// The gap to report first, when the replay started later than asked.
    gap: Option<ProcessEvent>,
    /// The offset of the next byte.
    offset: u64,
    done: bool,
}

impl std::fmt::Debug for AgentAttach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentAttach")
            .field("pid", &self.pid)
            .field("offset", &self.offset)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ProcessOutput for AgentAttach {
    async fn next_event(&mut self) -> Option<ProcessEvent> {
        if self.done {
            return None;
        }
        if let Some(gap) = self.gap.take() {
            return Some(gap);
        }
        loop {
            let message = match self.stream.message().await {
                Ok(Some(message)) => message,
                Ok(None) => {
                    self.done = true;
                    return Some(ProcessEvent::Failed(
                        Error::internal(
                            Operation::ATTACH_PROCESS,
                            format!(
                                "the agent ended the attach to pid {} before its end",
                                self.pid
                            ),
                        )
                        .with_provider(Provider::Docker),
                    ));
                }
                Err(e) => {
                    self.done = true;
                    return Some(ProcessEvent::Failed(
                        e.with_operation(Operation::ATTACH_PROCESS)
                            .with_provider(Provider::Docker),
                    ));
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
pub(crate) async fn send_input(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    target: &ProcessSelector,
    data: &[u8],
) -> Result<(), Error> {
    let op = Operation::SEND_INPUT;
    let lease = lease(provider, op, channel).await?;
    // Empty input is still sent once, so it is judged like any other (an ended process).
    let chunks: Vec<&[u8]> = if data.is_empty() {
        vec![data]
    } else {
        data.chunks(INPUT_CHUNK).collect()
    };
    let began = Instant::now();
    for chunk in chunks {
        let mut wait = INPUT_RETRY_FIRST;
        loop {
            let sent = lease
                .client()
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
                Err(e) => return Err(refused(provider, channel, &lease, op, target, e).await),
            }
        }
    }
    Ok(())
}

/// Closes `target`'s stdin.
pub(crate) async fn close_stdin(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    target: &ProcessSelector,
) -> Result<(), Error> {
    let op = Operation::CLOSE_STDIN;
    let lease = lease(provider, op, channel).await?;
    match lease
        .client()
        .close_stdin(envd_selector(target), CallOptions::new())
        .await
    {
        Ok(()) => Ok(()),
        Err(e) => Err(refused(provider, channel, &lease, op, target, e).await),
    }
}

/// Sends `signal` to `target`'s process group, by number.
pub(crate) async fn signal(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    target: &ProcessSelector,
    signal: Signal,
) -> Result<(), Error> {
    let op = Operation::SIGNAL_PROCESS;
    let lease = lease(provider, op, channel).await?;
    match lease
        .client()
        .send_signal(
            envd_selector(target),
            ps::Signal::from_i32(signal.number()),
            CallOptions::new(),
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(e) => Err(refused(provider, channel, &lease, op, target, e).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(json: serde_json::Value) -> Listed {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn listed_processes_read_in_the_ports_terms() {
        let running = listed(serde_json::json!({
            "pid": 7, "tag": "job-1", "cmd": "sleep", "args": ["30"], "stdin": true,
            "output_bytes": 5, "ring_bytes": 1024, "running": true, "pty": false
        }));
        let info = running.info();
        assert_eq!(info.pid, 7);
        assert_eq!(info.tag.as_ref().map(ProcessTag::as_str), Some("job-1"));
        assert_eq!(info.argv, ["sleep", "30"]);
        assert_eq!(info.status, ProcessStatus::Running);
        assert_eq!((info.output_bytes, info.ring_bytes), (5, 1024));
        let exited =
            listed(serde_json::json!({"pid": 8, "cmd": "true", "running": false, "exit_code": 3}));
        assert_eq!(
            exited.info().status,
            ProcessStatus::Exited {
                exit_code: Some(3),
                signal: None
            }
        );
        let killed =
            listed(serde_json::json!({"pid": 9, "cmd": "x", "running": false, "signal": 9}));
        assert_eq!(
            killed.info().status,
            ProcessStatus::Exited {
                exit_code: None,
                signal: Some(Signal::Kill)
            }
        );
        // A signal outside the port's set is no signal the port can name; a tag it cannot
        // hold leaves the process found by pid.
        let segv = listed(
            serde_json::json!({"pid": 10, "cmd": "x", "running": false, "signal": 11, "tag": "a b"}),
        );
        let info = segv.info();
        assert_eq!(
            info.status,
            ProcessStatus::Exited {
                exit_code: None,
                signal: None
            }
        );
        assert_eq!(info.tag, None);
    }

    #[test]
    fn selectors_follow_the_agents_rule() {
        let all = vec![
            listed(
                serde_json::json!({"pid": 1, "cmd": "a", "tag": "t", "running": false, "exit_code": 0}),
            ),
            listed(
                serde_json::json!({"pid": 2, "cmd": "b", "tag": "t", "running": false, "exit_code": 1}),
            ),
            listed(serde_json::json!({"pid": 3, "cmd": "c", "tag": "u", "running": true})),
        ];
        let tag = |t: &str| ProcessSelector::Tag(ProcessTag::new(t).unwrap());
        // Ended only: the most recently ended holder.
        assert_eq!(find(&all, &tag("t")).map(|p| p.pid), Some(2));
        assert_eq!(find(&all, &tag("u")).map(|p| p.pid), Some(3));
        assert!(find(&all, &tag("v")).is_none());
        assert_eq!(find(&all, &ProcessSelector::Pid(1)).map(|p| p.pid), Some(1));
        assert!(find(&all, &ProcessSelector::Pid(4)).is_none());
        // A running holder wins over ended ones.
        let mut with_live = all.clone();
        with_live.insert(
            0,
            listed(serde_json::json!({"pid": 4, "cmd": "d", "tag": "t", "running": true})),
        );
        assert_eq!(find(&with_live, &tag("t")).map(|p| p.pid), Some(4));
    }

    #[test]
    fn ends_read_as_exit_codes_or_signals() {
        for signal in Signal::ALL {
            let end = EnvdStatus::Signaled {
                signal: signal.number(),
                core_dumped: false,
            }
            .end_event();
            assert_eq!(
                status_of(&end),
                ProcessStatus::Exited {
                    exit_code: None,
                    signal: Some(signal)
                }
            );
        }
        assert_eq!(
            status_of(&EnvdStatus::Exited(4).end_event()),
            ProcessStatus::Exited {
                exit_code: Some(4),
                signal: None
            }
        );
        // A signal the port has no name for, or a status the agent could not tell.
        let unknown = EndEvent {
            exit_code: -1,
            exited: false,
            status: "unknown".to_owned(),
            error: None,
        };
        assert_eq!(
            status_of(&unknown),
            ProcessStatus::Exited {
                exit_code: None,
                signal: None
            }
        );
        // Every port signal goes out by the number the agent takes.
        assert_eq!(
            ps::Signal::from_i32(Signal::Kill.number()),
            ps::Signal::Sigkill
        );
        assert_eq!(
            ps::Signal::from_i32(Signal::Term.number()),
            ps::Signal::Sigterm
        );
        assert_eq!(
            ps::Signal::from_i32(Signal::Usr1.number()),
            ps::Signal::Unrecognized(10)
        );
    }
}
