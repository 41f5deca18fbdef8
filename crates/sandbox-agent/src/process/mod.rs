//! The `process.Process` service: starting processes with pipes or a PTY, streaming their
//! events, feeding their input, signalling and resizing them.
//!
//! Semantics follow envd (`docs/envd.md`, "Process semantics"): `start` first, then `data`
//! chunks in the order read (stdout and stderr up to 32 KiB, pty up to 16 KiB), a `keepalive`
//! after each idle `Keepalive-Ping-Interval`, exactly one `end`, then the end of the stream.
//! `Connect-Timeout-Ms` on `Start` bounds the process's life; closing a stream early never
//! kills the process. What the agent adds:
//!
//! - **Re-attach that keeps working.** Every process keeps its recent output in a bounded
//!   ring (the `output` module); `Connect` works for the process's whole life and for 30 s after its
//!   exit, and the request header [`HEADER_REPLAY_OFFSET`] replays output from a byte offset
//!   (our extension; clients that do not send it see envd's behaviour).
//! - **Limits**, each a start flag: live processes, output ring and pending input per
//!   process; hitting one is `resource_exhausted`.
//! - **One waiter.** Exit statuses come from the agent's reaper ([`crate::pid1`]), never from
//!   waiting on the child directly.

mod detach;
mod fdio;
mod input;
mod launch;
mod listing;
mod output;
mod pty;

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use hyper::Response;
use hyper::header::HeaderValue;
use rustix::process::{Pid, Signal};
use sandbox_envd::process::process_event::data_event::Output as DataOutput;
use sandbox_envd::process::process_event::{DataEvent, EndEvent, Event, KeepAlive, StartEvent};
use sandbox_envd::process::process_input::Input as InputKind;
use sandbox_envd::process::process_selector::Selector;
use sandbox_envd::process::{
    self as ps, ProcessEvent, ProcessInput, ProcessSelector, stream_input_request,
};
use sandbox_envd::{Code, ConnectError, Method, ProcessStatus};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use self::fdio::AsyncIo;
use self::input::{Input, Refused};
use self::output::{Kind, Next, Output, ReadFrom};
use crate::config::Config;
use crate::connect::{self, Body, RequestStream, ResponseStream};
use crate::log;
use crate::pid1::Children;
use crate::server::CallContext;

pub use self::listing::{LISTED_EXITED, Listed, Listing};

/// Request header of `Connect` (our extension): replay the process's output from this byte
/// offset (all streams counted together, from 0 at the start), then go on live. The answer
/// carries the same header with the offset the replay really starts at, later than asked when
/// the ring no longer holds those bytes. An offset beyond the output so far is `out_of_range`.
pub const HEADER_REPLAY_OFFSET: &str = "sandbox-replay-offset";
pub use self::detach::HEADER_DETACH_TIMEOUT;

/// How long an exited process can still be connected to (served as `start`, any replay, and
/// `end`).
pub const EXITED_RETENTION: Duration = Duration::from_secs(30);
/// The most exited processes remembered at once (the oldest are forgotten first).
const EXITED_MAX: usize = 1024;
/// Largest `data` chunk of a pipe and of a PTY, as envd sends them.
const PIPE_CHUNK: usize = 32 * 1024;
const PTY_CHUNK: usize = 16 * 1024;
/// Once a process has exited, output its descendants still write to the inherited pipe is
/// read until the pipe is quiet this long (or at most `DRAIN_MAX`): envd likewise stops
/// reading once the process is waited for, so a background child cannot hold `end` back.
const DRAIN_IDLE: Duration = Duration::from_millis(50);
const DRAIN_MAX: Duration = Duration::from_millis(500);

/// One started process.
#[derive(Debug)]
struct Proc {
    pid: u32,
    tag: Option<String>,
    config: ps::ProcessConfig,
    output: Arc<Output>,
    /// The stdin pipe's or the PTY's input queue; `None` for `stdin: false`.
    input: Option<Arc<Input>>,
    is_pty: bool,
    /// The PTY master, for resizing; released when the process is retired.
    pty: Mutex<Option<Arc<AsyncIo>>>,
    /// Set once the reaper has collected the process: its pid may be reused from then on, so
    /// it is no longer signalled or written to.
    reaped: AtomicBool,
    /// The detach timer, when the `Start` asked for one (`detach`).
    detach: Option<Arc<detach::Detach>>,
}

impl Proc {
    fn running(&self) -> bool {
        !self.reaped.load(Ordering::Acquire)
    }
}

#[derive(Debug, Default)]
struct Table {
    live: BTreeMap<u32, Arc<Proc>>,
    exited: VecDeque<(Instant, Arc<Proc>)>,
}

impl Table {
    fn prune(&mut self) {
        let now = Instant::now();
        while let Some((at, _)) = self.exited.front() {
            if now.duration_since(*at) > EXITED_RETENTION || self.exited.len() > EXITED_MAX {
                self.exited.pop_front();
            } else {
                break;
            }
        }
    }
}

#[derive(Debug)]
struct Inner {
    config: Arc<Config>,
    children: Arc<Children>,
    table: Mutex<Table>,
    agent_uid: u32,
    agent_path: Option<String>,
}

/// The process service (cheap to clone).
#[derive(Debug, Clone)]
pub struct ProcessService {
    inner: Arc<Inner>,
}

fn not_found(selector: &Selector) -> ConnectError {
    match selector {
        Selector::Pid(pid) => {
            ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
        }
        Selector::Tag(tag) => {
            ConnectError::new(Code::NotFound, format!("process with tag {tag} not found"))
        }
    }
}

fn event(member: Event) -> ProcessEvent {
    ProcessEvent::new(member)
}

impl ProcessService {
    /// A service whose processes are waited for through `children`.
    pub fn new(config: Arc<Config>, children: Arc<Children>) -> Self {
        ProcessService {
            inner: Arc::new(Inner {
                config,
                children,
                table: Mutex::new(Table::default()),
                agent_uid: rustix::process::geteuid().as_raw(),
                agent_path: std::env::var("PATH").ok(),
            }),
        }
    }

    /// Answers one call of the service (the router has checked headers and user).
    pub async fn call(self, call: CallContext, method: Method, body: Body) -> Response<Body> {
        use ps::method as m;
        let limit = self.inner.config.max_message_bytes;
        let inner = self.inner;
        match method {
            m::START => match RequestStream::new(body, limit).single().await {
                Ok(request) => inner.start(call, request),
                Err(e) => connect::stream_error(e),
            },
            m::CONNECT => match RequestStream::new(body, limit).single().await {
                Ok(request) => inner.connect(call, &request),
                Err(e) => connect::stream_error(e),
            },
            m::STREAM_INPUT => stream_input(inner, RequestStream::new(body, limit)).await,
            m::LIST => match read::<ps::ListRequest>(body, limit).await {
                Ok(_) => answer(Ok(inner.list())),
                Err(refused) => refused,
            },
            m::SEND_INPUT => match read::<ps::SendInputRequest>(body, limit).await {
                Ok(r) => answer(
                    inner
                        .find_running(r.process.as_ref())
                        .and_then(|proc| write_input(&proc, r.input))
                        .map(|()| ps::SendInputResponse {}),
                ),
                Err(refused) => refused,
            },
            m::CLOSE_STDIN => match read::<ps::CloseStdinRequest>(body, limit).await {
                Ok(r) => answer(inner.close_stdin(r.process.as_ref())),
                Err(refused) => refused,
            },
            m::SEND_SIGNAL => match read::<ps::SendSignalRequest>(body, limit).await {
                Ok(r) => answer(inner.signal(&r)),
                Err(refused) => refused,
            },
            m::UPDATE => match read::<ps::UpdateRequest>(body, limit).await {
                Ok(r) => answer(inner.update(&r)),
                Err(refused) => refused,
            },
            other => connect::error_for(
                other,
                ConnectError::new(Code::Unimplemented, format!("{} is not served", other.path)),
            ),
        }
    }

    /// The live and the recently ended processes (`GET /sandbox-agent/processes`, the
    /// `listing` module).
    pub fn listing(&self) -> Listing {
        self.inner.listing()
    }

    /// Live processes now.
    pub fn live(&self) -> usize {
        self.inner.lock().live.len()
    }

    /// Stops every process: SIGTERM to each process group, SIGKILL to what is left after
    /// `grace`, then waits (briefly) for the reaper to see them go.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.signal_all(Signal::TERM);
        let deadline = Instant::now() + grace;
        while self.live() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.live() > 0 {
            self.inner.signal_all(Signal::KILL);
            let deadline = Instant::now() + Duration::from_secs(1);
            while self.live() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Reads a unary request; a refusal is already the answer.
async fn read<Req: serde::de::DeserializeOwned>(
    body: Body,
    limit: usize,
) -> Result<Req, Response<Body>> {
    connect::read_unary::<Req>(body, limit)
        .await
        .map_err(|e| connect::unary_error(&e))
}

/// A unary answer.
fn answer<Resp: serde::Serialize>(result: Result<Resp, ConnectError>) -> Response<Body> {
    match result {
        Ok(message) => connect::unary_ok(&message),
        Err(e) => connect::unary_error(&e),
    }
}

fn write_input(proc: &Proc, input: Option<ProcessInput>) -> Result<(), ConnectError> {
    let internal = |what: &str, why: &str| {
        ConnectError::new(Code::Internal, format!("error writing to {what}: {why}"))
    };
    let (data, what) = match input.and_then(|i| i.input) {
        Some(InputKind::Stdin(data)) => {
            if proc.is_pty {
                return Err(internal(
                    "stdin",
                    "tty assigned to process — input should be written to the pty, not the stdin",
                ));
            }
            (data, "stdin")
        }
        Some(InputKind::Pty(data)) => {
            if !proc.is_pty {
                return Err(internal(
                    "tty",
                    "tty not assigned to process — input should be written to the stdin, not the tty",
                ));
            }
            (data, "tty")
        }
        None => {
            return Err(ConnectError::new(
                Code::Unimplemented,
                "the input names neither stdin nor pty",
            ));
        }
    };
    let Some(queue) = &proc.input else {
        return Err(internal(what, "stdin not enabled or closed"));
    };
    match queue.send(Bytes::from(data)) {
        Ok(()) => Ok(()),
        Err(Refused::Full { capacity }) => Err(ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "the input buffer of process {} is full ({capacity} bytes not yet read; \
                 --stdin-buffer-bytes)",
                proc.pid
            ),
        )),
        Err(Refused::Closed(why)) => Err(internal(what, &why)),
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn list(&self) -> ps::ListResponse {
        let table = self.lock();
        ps::ListResponse {
            processes: table
                .live
                .values()
                .filter(|p| p.running())
                .map(|p| ps::ProcessInfo {
                    config: Some(p.config.clone()),
                    pid: p.pid,
                    tag: p.tag.clone(),
                })
                .collect(),
        }
    }

    fn listing(&self) -> Listing {
        let mut table = self.lock();
        table.prune();
        let ring_bytes = self.config.output_ring_bytes as u64;
        let entry = |p: &Proc| {
            let status = p.output.end_status();
            Listed {
                pid: p.pid,
                tag: p.tag.clone(),
                cmd: p.config.cmd.clone(),
                args: p.config.args.clone(),
                pty: p.is_pty,
                stdin: p.input.as_ref().is_some_and(|i| i.is_open()),
                output_bytes: p.output.end(),
                ring_bytes,
                // Running until its end is recorded, so an ended entry always has its status.
                running: status.is_none(),
                status: None,
                exit_code: None,
                signal: None,
            }
            .ended(status.as_deref())
        };
        let mut processes: Vec<Listed> = table.live.values().map(|p| entry(p)).collect();
        let ended = table.exited.len();
        processes.extend(
            table
                .exited
                .iter()
                .skip(ended.saturating_sub(LISTED_EXITED))
                .map(|(_, p)| entry(p)),
        );
        Listing { processes }
    }

    /// The process `selector` names, if it is running (and so may be written to or signalled).
    fn find_running(&self, selector: Option<&ProcessSelector>) -> Result<Arc<Proc>, ConnectError> {
        self.find(selector, false)
    }

    fn find(
        &self,
        selector: Option<&ProcessSelector>,
        with_exited: bool,
    ) -> Result<Arc<Proc>, ConnectError> {
        let Some(selector) = selector.and_then(|s| s.selector.as_ref()) else {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "a process selector (pid or tag) is required",
            ));
        };
        let mut table = self.lock();
        table.prune();
        let matches = |p: &Proc| match selector {
            Selector::Pid(pid) => p.pid == *pid,
            Selector::Tag(tag) => p.tag.as_deref() == Some(tag.as_str()),
        };
        let live = table
            .live
            .values()
            .filter(|p| with_exited || p.running())
            .find(|p| matches(p));
        if let Some(p) = live {
            return Ok(Arc::clone(p));
        }
        if with_exited && let Some((_, p)) = table.exited.iter().rev().find(|(_, p)| matches(p)) {
            return Ok(Arc::clone(p));
        }
        Err(not_found(selector))
    }

    fn signal_all(&self, signal: Signal) {
        let table = self.lock();
        for p in table.live.values().filter(|p| p.running()) {
            if let Some(pid) = i32::try_from(p.pid).ok().and_then(Pid::from_raw) {
                let _ = rustix::process::kill_process_group(pid, signal);
            }
        }
    }

    fn start(self: &Arc<Self>, call: CallContext, request: ps::StartRequest) -> Response<Body> {
        let began = Instant::now();
        match self.launch(&call, request, began) {
            Ok((pid, cursor, attached)) => {
                let (out, response) = ResponseStream::open();
                let deadline = call.timeout.map(|t| began + t);
                tokio::spawn(async move {
                    let _attached = attached;
                    pump(out, pid, cursor, call.keepalive, deadline, |e| {
                        ps::StartResponse { event: Some(e) }
                    })
                    .await;
                });
                response
            }
            Err(e) => connect::stream_error(e),
        }
    }

    fn launch(
        self: &Arc<Self>,
        call: &CallContext,
        request: ps::StartRequest,
        began: Instant,
    ) -> Result<(u32, output::Cursor, Option<detach::Attached>), ConnectError> {
        let config = request.process.unwrap_or_default();
        let detach = detach::requested(&call.headers)?.map(detach::Detach::new);
        if config.cmd.is_empty() {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "process.cmd is required",
            ));
        }
        let max = self.config.max_processes;
        if self.lock().live.len() >= max {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("the agent already runs {max} processes (--max-processes)"),
            ));
        }
        let cwd = launch::working_dir(
            config.cwd.as_deref(),
            &call.user,
            self.config.default_workdir.as_deref(),
        )?;
        let env = launch::environment(
            &call.user,
            &self.config.default_env,
            &config.envs,
            self.agent_path.clone(),
        );
        let credentials = launch::credentials(&call.user, &self.config.accounts, self.agent_uid)?;
        let command_line = std::iter::once(config.cmd.as_str())
            .chain(config.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        let start_error = |e: std::io::Error| {
            ConnectError::new(
                Code::InvalidArgument,
                format!("error starting process '{command_line}': {e}"),
            )
        };

        let pty = match &request.pty {
            Some(p) => {
                let size = p.size.unwrap_or_default();
                Some(pty::open(size.cols, size.rows).map_err(|e| {
                    ConnectError::new(Code::Internal, format!("error opening a pty: {e}"))
                })?)
            }
            None => None,
        };
        let keep_stdin = request.stdin.unwrap_or(true);
        let (pid, (stdin, stdout, stderr), exit) = self
            .children
            .spawn(|| {
                let mut command = Command::new(&config.cmd);
                command
                    .args(&config.args)
                    .env_clear()
                    .envs(&env)
                    .current_dir(&cwd);
                match &pty {
                    Some(pair) => {
                        command
                            .stdin(Stdio::from(pair.slave.try_clone()?))
                            .stdout(Stdio::from(pair.slave.try_clone()?))
                            .stderr(Stdio::from(pair.slave.try_clone()?));
                    }
                    None => {
                        command
                            .stdin(if keep_stdin {
                                Stdio::piped()
                            } else {
                                Stdio::null()
                            })
                            .stdout(Stdio::piped())
                            .stderr(Stdio::piped());
                    }
                }
                let mut child = crate::sys::spawn_session_leader(
                    &mut command,
                    credentials.as_ref(),
                    pty.is_some(),
                )?;
                let pipes = (
                    child.stdin.take().map(OwnedFd::from),
                    child.stdout.take().map(OwnedFd::from),
                    child.stderr.take().map(OwnedFd::from),
                );
                // `command` (with its copies of the PTY slave) and `child` (never waited on:
                // the reaper collects it) are dropped here.
                Ok((child.id(), pipes))
            })
            .map_err(start_error)?;
        let master = pty.map(|pair| pair.master);

        match self.attach(
            pid,
            config,
            request.tag,
            master,
            stdin,
            stdout,
            stderr,
            detach,
        ) {
            Ok((proc, sources, writer)) => {
                let cursor = proc.output.subscribe(ReadFrom::Offset(0)).map_err(|_| {
                    ConnectError::new(Code::Internal, "the output ring refused its first reader")
                })?;
                let deadline = call.timeout.map(|t| began + t);
                // The program only: arguments may carry secrets.
                log::info!(
                    self.config.log,
                    "process {pid} started: {}",
                    proc.config.cmd
                );
                let attached = proc.detach.as_ref().map(|d| {
                    d.spawn(&proc, self.config.log.clone());
                    d.attach()
                });
                tokio::spawn(supervise(
                    Arc::clone(self),
                    proc,
                    sources,
                    writer,
                    exit,
                    deadline,
                ));
                Ok((pid, cursor, attached))
            }
            Err(e) => {
                // Registered with the reaper already; it collects the process once killed.
                kill_group(pid, Signal::KILL);
                Err(ConnectError::new(
                    Code::Internal,
                    format!("error attaching to process {pid}: {e}"),
                ))
            }
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the pieces of one spawned process, once"
    )]
    #[expect(
        clippy::type_complexity,
        reason = "a private hand-over between two steps"
    )]
    fn attach(
        &self,
        pid: u32,
        config: ps::ProcessConfig,
        tag: Option<String>,
        master: Option<OwnedFd>,
        stdin: Option<OwnedFd>,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
        detach: Option<Arc<detach::Detach>>,
    ) -> std::io::Result<(
        Arc<Proc>,
        Vec<(Kind, Arc<AsyncIo>, usize)>,
        Option<tokio::task::JoinHandle<()>>,
    )> {
        let capacity = self.config.stdin_buffer_bytes;
        let mut sources = Vec::new();
        let mut writer_io = None;
        let mut pty_io = None;
        if let Some(master) = master {
            let io = Arc::new(AsyncIo::new(master, true)?);
            sources.push((Kind::Pty, Arc::clone(&io), PTY_CHUNK));
            writer_io = Some(Arc::clone(&io));
            pty_io = Some(io);
        } else {
            for (kind, fd) in [(Kind::Stdout, stdout), (Kind::Stderr, stderr)] {
                if let Some(fd) = fd {
                    sources.push((kind, Arc::new(AsyncIo::new(fd, false)?), PIPE_CHUNK));
                }
            }
            if let Some(fd) = stdin {
                writer_io = Some(Arc::new(AsyncIo::new(fd, false)?));
            }
        }
        let input = writer_io.as_ref().map(|_| Input::new(capacity));
        let proc = Arc::new(Proc {
            pid,
            tag,
            config,
            output: Output::new(self.config.output_ring_bytes),
            input: input.clone(),
            is_pty: pty_io.is_some(),
            pty: Mutex::new(pty_io),
            reaped: AtomicBool::new(false),
            detach,
        });
        let writer = match (input, writer_io) {
            (Some(input), Some(io)) => Some(tokio::spawn(input.run_writer(io))),
            _ => None,
        };
        self.lock().live.insert(pid, Arc::clone(&proc));
        Ok((proc, sources, writer))
    }

    /// Moves an ended process from the live table to the recently exited.
    fn retire(&self, proc: &Arc<Proc>) {
        let mut table = self.lock();
        table.live.remove(&proc.pid);
        table.exited.push_back((Instant::now(), Arc::clone(proc)));
        table.prune();
    }

    fn connect(&self, call: CallContext, request: &ps::ConnectRequest) -> Response<Body> {
        match self.attach_reader(&call, request) {
            Ok((proc, cursor, replay)) => {
                let (out, mut response) = ResponseStream::open();
                if replay && let Ok(v) = HeaderValue::from_str(&cursor.start().to_string()) {
                    response.headers_mut().insert(HEADER_REPLAY_OFFSET, v);
                }
                let deadline = call.timeout.map(|t| Instant::now() + t);
                let attached = proc.detach.as_ref().map(detach::Detach::attach);
                let pid = proc.pid;
                tokio::spawn(async move {
                    let _attached = attached;
                    pump(out, pid, cursor, call.keepalive, deadline, |e| {
                        ps::ConnectResponse { event: Some(e) }
                    })
                    .await;
                });
                response
            }
            Err(e) => connect::stream_error(e),
        }
    }

    fn attach_reader(
        &self,
        call: &CallContext,
        request: &ps::ConnectRequest,
    ) -> Result<(Arc<Proc>, output::Cursor, bool), ConnectError> {
        let proc = self.find(request.process.as_ref(), true)?;
        let replay = match call.headers.get(HEADER_REPLAY_OFFSET) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok())
                    .ok_or_else(|| {
                        ConnectError::new(
                            Code::InvalidArgument,
                            format!("{HEADER_REPLAY_OFFSET} {v:?}: expected a byte offset"),
                        )
                    })?,
            ),
        };
        let from = replay.map_or(ReadFrom::Live, ReadFrom::Offset);
        let cursor = proc.output.subscribe(from).map_err(|beyond| {
            ConnectError::new(
                Code::OutOfRange,
                format!(
                    "replay offset {} is beyond the {} bytes process {} has written",
                    replay.unwrap_or_default(),
                    beyond.end,
                    proc.pid
                ),
            )
        })?;
        Ok((proc, cursor, replay.is_some()))
    }

    fn close_stdin(
        &self,
        selector: Option<&ProcessSelector>,
    ) -> Result<ps::CloseStdinResponse, ConnectError> {
        let proc = self.find_running(selector)?;
        if proc.is_pty {
            return Err(ConnectError::new(
                Code::Unknown,
                "error closing stdin: cannot close stdin for PTY process — send Ctrl+D (0x04) instead",
            ));
        }
        if let Some(input) = &proc.input {
            input.close();
        }
        Ok(ps::CloseStdinResponse {})
    }

    fn signal(
        &self,
        request: &ps::SendSignalRequest,
    ) -> Result<ps::SendSignalResponse, ConnectError> {
        let proc = self.find_running(request.process.as_ref())?;
        let signal = match request.signal {
            ps::Signal::Sigkill => Signal::KILL,
            ps::Signal::Sigterm => Signal::TERM,
            // envd's answer for the unset value.
            ps::Signal::Unspecified => {
                return Err(ConnectError::new(
                    Code::Unimplemented,
                    format!("invalid signal: {:?}", request.signal),
                ));
            }
            // proto3 enums are open: our extension takes the other signals of the provider
            // port's set by number (see `EXTRA_SIGNALS`).
            ps::Signal::Unrecognized(n) => extra_signal(n).ok_or_else(|| {
                ConnectError::new(
                    Code::InvalidArgument,
                    format!(
                        "invalid signal: {n} is not one of HUP, INT, QUIT, USR1, USR2, TERM, KILL"
                    ),
                )
            })?,
        };
        let pid = i32::try_from(proc.pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| ConnectError::new(Code::Internal, "a pid out of range"))?;
        rustix::process::kill_process_group(pid, signal)
            .map_err(|e| ConnectError::new(Code::Internal, format!("error sending signal: {e}")))?;
        Ok(ps::SendSignalResponse {})
    }

    fn update(&self, request: &ps::UpdateRequest) -> Result<ps::UpdateResponse, ConnectError> {
        let proc = self.find_running(request.process.as_ref())?;
        let Some(size) = request.pty.as_ref().map(|p| p.size.unwrap_or_default()) else {
            return Ok(ps::UpdateResponse {});
        };
        let master = proc
            .pty
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let Some(master) = master else {
            return Err(ConnectError::new(
                Code::Internal,
                "error resizing tty: tty not assigned to process",
            ));
        };
        pty::resize(master.get_ref(), size.cols, size.rows)
            .map_err(|e| ConnectError::new(Code::Internal, format!("error resizing tty: {e}")))?;
        Ok(ps::UpdateResponse {})
    }
}

async fn stream_input(inner: Arc<Inner>, mut requests: RequestStream) -> Response<Body> {
    let result = async {
        let mut proc: Option<Arc<Proc>> = None;
        while let Some(message) = requests.next::<ps::StreamInputRequest>().await? {
            match message.event {
                Some(stream_input_request::Event::Start(start)) => {
                    proc = Some(inner.find_running(start.process.as_ref())?);
                }
                Some(stream_input_request::Event::Data(data)) => {
                    let Some(p) = &proc else {
                        return Err(ConnectError::new(
                            Code::InvalidArgument,
                            "the first message of StreamInput must be start",
                        ));
                    };
                    write_input(p, data.input)?;
                }
                Some(stream_input_request::Event::Keepalive(_)) => {}
                None => {
                    return Err(ConnectError::new(
                        Code::Unimplemented,
                        "a StreamInput message with no event",
                    ));
                }
            }
        }
        Ok(())
    }
    .await;
    let (mut out, response) = ResponseStream::open();
    // The answer fits the channel's buffer, so these sends complete without a reader.
    match result {
        Ok(()) => {
            if out.send(&ps::StreamInputResponse {}).await.is_ok() {
                out.end(Ok(())).await;
            }
        }
        Err(e) => out.end(Err(e)).await,
    }
    response
}

/// The signals `SendSignal` takes by number (envd's TERM and KILL also by name): the provider
/// port's whole set (`sandbox_core`'s `Signal::ALL`), so every signal a caller of the port can
/// name reaches the process. Any other number is refused.
const EXTRA_SIGNALS: [(i32, Signal); 7] = [
    (1, Signal::HUP),
    (2, Signal::INT),
    (3, Signal::QUIT),
    (9, Signal::KILL),
    (10, Signal::USR1),
    (12, Signal::USR2),
    (15, Signal::TERM),
];

fn extra_signal(number: i32) -> Option<Signal> {
    EXTRA_SIGNALS
        .iter()
        .find(|(n, _)| *n == number)
        .map(|(_, s)| *s)
}

fn kill_group(pid: u32, signal: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// Runs a process's life: its output readers, its deadline, its exit and its `end`.
async fn supervise(
    inner: Arc<Inner>,
    proc: Arc<Proc>,
    sources: Vec<(Kind, Arc<AsyncIo>, usize)>,
    writer: Option<tokio::task::JoinHandle<()>>,
    exit: oneshot::Receiver<ProcessStatus>,
    deadline: Option<Instant>,
) {
    let (exited_tx, exited_rx) = watch::channel(false);
    let readers: Vec<_> = sources
        .into_iter()
        .map(|(kind, io, chunk)| {
            tokio::spawn(read_output(
                Arc::clone(&proc.output),
                kind,
                io,
                chunk,
                exited_rx.clone(),
            ))
        })
        .collect();
    let mut exit = exit;
    let status = match deadline {
        Some(at) => tokio::select! {
            status = &mut exit => status,
            () = tokio::time::sleep_until(at) => {
                log::info!(
                    inner.config.log,
                    "process {}: its Start deadline passed, killing its process group", proc.pid);
                kill_group(proc.pid, Signal::KILL);
                exit.await
            }
        },
        None => exit.await,
    };
    proc.reaped.store(true, Ordering::Release);
    if let Some(detach) = &proc.detach {
        detach.exited();
    }
    let _ = exited_tx.send(true);
    for reader in readers {
        let _ = reader.await;
    }
    if let Some(writer) = writer {
        writer.abort();
    }
    if let Some(input) = &proc.input {
        input.stop("the process has exited");
    }
    let end = match status {
        Ok(status) => status.end_event(),
        // The reaper went away (the agent is stopping): say so rather than invent a status.
        Err(_) => EndEvent {
            exit_code: -1,
            exited: false,
            status: "unknown".to_owned(),
            error: Some("the agent stopped before the process's exit was seen".to_owned()),
        },
    };
    log::info!(
        inner.config.log,
        "process {} ended: {}",
        proc.pid,
        end.status
    );
    proc.output.finish(end);
    proc.pty
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    inner.retire(&proc);
}

/// Copies one pipe (or the PTY) into the output ring until end of file, or, once the process
/// has exited, until the pipe is quiet (see `DRAIN_IDLE`).
async fn read_output(
    output: Arc<Output>,
    kind: Kind,
    io: Arc<AsyncIo>,
    chunk: usize,
    mut exited: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; chunk];
    let mut drain_until: Option<Instant> = None;
    loop {
        let read = match drain_until {
            None => tokio::select! {
                r = io.read(&mut buf) => Some(r),
                _ = exited.wait_for(|e| *e) => {
                    drain_until = Some(Instant::now() + DRAIN_MAX);
                    continue;
                }
            },
            Some(limit) => {
                let left = limit.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    None
                } else {
                    tokio::time::timeout(DRAIN_IDLE.min(left), io.read(&mut buf))
                        .await
                        .ok()
                }
            }
        };
        match read {
            Some(Ok(n)) if n > 0 => output.push(kind, Bytes::copy_from_slice(&buf[..n])).await,
            _ => return,
        }
    }
}

/// Streams a process's events to one client: `start`, data as the cursor yields it,
/// keepalives while idle, `end`, and the end of the stream. A client that goes away only
/// detaches; a passed deadline ends the stream with `deadline_exceeded`.
async fn pump<R: serde::Serialize>(
    mut out: ResponseStream,
    pid: u32,
    mut cursor: output::Cursor,
    keepalive: Duration,
    deadline: Option<Instant>,
    wrap: fn(ProcessEvent) -> R,
) {
    if out
        .send(&wrap(event(Event::Start(StartEvent { pid }))))
        .await
        .is_err()
    {
        return;
    }
    let mut ping_at = Instant::now() + keepalive;
    loop {
        let output = Arc::clone(cursor.output());
        let changed = output.changed();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let message = match cursor.next() {
            Next::Data(kind, data) => {
                let data = data.to_vec();
                let output = match kind {
                    Kind::Stdout => DataOutput::Stdout(data),
                    Kind::Stderr => DataOutput::Stderr(data),
                    Kind::Pty => DataOutput::Pty(data),
                };
                ping_at = Instant::now() + keepalive;
                event(Event::Data(DataEvent {
                    output: Some(output),
                }))
            }
            Next::End(end) => {
                if out.send(&wrap(event(Event::End(end)))).await.is_ok() {
                    out.end(Ok(())).await;
                }
                return;
            }
            Next::Wait => {
                let expired = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = &mut changed => continue,
                    () = tokio::time::sleep_until(ping_at) => {
                        ping_at = Instant::now() + keepalive;
                        event(Event::Keepalive(KeepAlive {}))
                    }
                    () = expired => {
                        out.end(Err(ConnectError::new(
                            Code::DeadlineExceeded,
                            "the call's deadline (connect-timeout-ms) passed",
                        )))
                        .await;
                        return;
                    }
                }
            }
        };
        if out.send(&wrap(message)).await.is_err() {
            return;
        }
    }
}
