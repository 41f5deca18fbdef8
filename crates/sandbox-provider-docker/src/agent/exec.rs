//! Commands through the agent (agent mode): one `process.Process/Start` on the container's kept
//! channel per command, instead of an exec-create per command.
//!
//! The semantics are exec mode's (`crate::exec`), reached another way:
//! - **What runs.** The argv form is started as it is; the shell form is `/bin/sh -c
//!   <`SHELL_SCRIPT`> sandbox-exec <expression>`, bash when the image has it, else POSIX sh, the
//!   expression a positional argument, never spliced into script text. A program the agent
//!   cannot start (missing, not executable, a missing working directory) started nothing, so
//!   the same argv is started once more under `/bin/sh -c 'exec "$@"'`, whose answer (127 and
//!   the shell's message, or the working directory's error) is exec mode's.
//! - **Environment, directory, account.** The request's env is the process's additions; the
//!   directory defaults to the workspace root (exec mode's container working directory); the
//!   account is sent as the call's user (root, the default, is the agent's own default).
//! - **Timeout.** The call's deadline is the command's budget, sent as `Connect-Timeout-Ms`:
//!   the agent kills the process group when it passes, and the result is exec mode's timeout
//!   result (`killed`, exit -1, the output seen so far).
//! - **Cancellation.** The agent keeps a process running when its stream closes, so a dropped
//!   call kills it: every process is started with a random tag, and a guard armed until the
//!   end event sends SIGKILL to that tag's process group (spawned, bounded).
//! - **Output.** Each stream is kept up to the cap and flagged `truncated` past it, or handed to
//!   the request's hook and not kept, as in exec mode.
//! - **Failures.** The lease is held for the whole call. A container that is not running is
//!   started and the lease taken again (nothing was started). A cut stream invalidates the
//!   channel and is checked against the container: gone is `sandbox_gone`, stopped is
//!   `unavailable`, paused is `sandbox_paused`. A failed `Start` is never retried on a cut
//!   connection: whether the agent began the process cannot be known, and a command must never
//!   run twice.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::ContainerStateStatusEnum;
use bollard::query_parameters::InspectContainerOptions;
use sandbox_core::{
    Command, Error, ErrorCode, ErrorKind, ExecRequest, ExecResult, Operation, OutputStream,
    Provider,
};
use sandbox_envd::ProcessStatus;
use sandbox_envd::process::process_event::data_event::Output;
use sandbox_envd::process::process_event::{EndEvent, Event};
use sandbox_envd::process::{self as ps, ProcessInput, ProcessSelector};
use sandbox_transport::envd::{CallOptions, ServerStream};

use crate::channel::{self, Channel, ChannelClient, Lease};
use crate::errors::{self, provider_error};
use crate::exec::{self as exec_mode, Collected};
use crate::provider::DockerProvider;

/// The shell form's script: bash when present (what agents expect), else POSIX sh; the
/// expression travels as `$1`.
pub(crate) const SHELL_SCRIPT: &str = "if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc -c \"$1\"; else exec sh -c \"$1\"; fi";
/// The argv form's fallback when the agent cannot start the program itself: the shell's own
/// answer for a missing or unexecutable program.
pub(crate) const ARGV_FALLBACK_SCRIPT: &str = "exec \"$@\"";
/// `$0` of the wrapper shells, as in exec mode.
pub(crate) const SHELL_NAME: &str = "sandbox-exec";

/// The most stdin sent in one `SendInput` (base64 in a JSON message: well under the 4 MiB
/// message limit). A quarter of the agent's default per-process stdin buffer, so a chunk fits
/// as soon as the process has read part of the previous ones.
const STDIN_CHUNK: usize = 256 * 1024;
/// The first wait before a chunk the agent refused as over its stdin buffer is sent again; it
/// doubles up to [`STDIN_RETRY_MAX`]. The process drains the buffer as it reads, so the refusal
/// is back-pressure, not failure.
const STDIN_RETRY_FIRST: Duration = Duration::from_millis(2);
const STDIN_RETRY_MAX: Duration = Duration::from_millis(100);
/// While no `start` event has come, the container is checked this often for a pause (a paused
/// agent answers nothing, and the call would otherwise wait for its whole budget).
const PAUSE_CHECK_EVERY: Duration = Duration::from_secs(2);
/// How long an agent that does not answer yet is waited for, and how often it is asked.
const AGENT_READY_WAIT: Duration = Duration::from_secs(5);
const AGENT_READY_PAUSE: Duration = Duration::from_millis(50);
/// The bound of the kill a dropped call sends.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `request` in container `id` through its agent `channel`.
pub(crate) async fn run(
    provider: &DockerProvider,
    channel: &Arc<Channel>,
    request: &ExecRequest,
) -> Result<ExecResult, Error> {
    let op = Operation::EXEC;
    request
        .validate()
        .map_err(|e| e.with_operation(op).with_provider(Provider::Docker))?;
    let lease = lease(provider, op, channel).await?;
    let config = &provider.inner.config;
    let timeout = request
        .timeout
        .map_or(config.default_exec_timeout, |t| t.get());
    let call = Call {
        docker: provider.docker(),
        channel,
        client: client_for(&lease, request.user.as_deref())?,
        lease: &lease,
        request,
        timeout,
        max_output: config.max_output_bytes,
    };
    let process = match &request.command {
        Command::Shell(expression) => shell_process(expression),
        Command::Argv { program, args } => argv_process(program, args),
    };
    match call.run(process).await? {
        Ran::Done(result) => Ok(result),
        Ran::NotStarted(refusal) => match &request.command {
            Command::Argv { program, args } => {
                tracing::debug!(error = %refusal.message(), "the agent could not start the program itself; asking the shell");
                let mut argv = vec![program.clone()];
                argv.extend(args.iter().cloned());
                match call.run(wrapped_argv(argv)).await? {
                    Ran::Done(result) => Ok(result),
                    Ran::NotStarted(e) => Err(e.with_operation(op)),
                }
            }
            Command::Shell(_) => Err(refusal.with_operation(op)),
        },
    }
}

/// A lease on `channel`. A container that had stopped is started first (the engine refuses
/// the channel's exec before anything runs), and an agent not answering yet (a container just
/// created or started binds its socket a moment after it runs) is asked again for a bounded
/// time: opening a channel starts nothing, so trying again is safe. A paused container is
/// reported at once.
pub(crate) async fn lease(
    provider: &DockerProvider,
    op: Operation,
    channel: &Arc<Channel>,
) -> Result<Lease, Error> {
    let deadline = Instant::now() + AGENT_READY_WAIT;
    let mut started = false;
    loop {
        match channel.lease().await {
            Ok(lease) => return Ok(lease),
            Err(e) if errors::is_not_running(&e) && !started => {
                provider.ensure_running(op, channel.container()).await?;
                started = true;
            }
            Err(e)
                if e.kind() == ErrorKind::Unavailable
                    && e.code() != Some(ErrorCode::SandboxPaused)
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(AGENT_READY_PAUSE).await;
            }
            Err(e) => return Err(e.with_operation(op)),
        }
    }
}

/// The lease's client acting as `user`: the default client (the agent's default user, the
/// sandbox's `[create.user]` or root) when the call names none, else one sharing its
/// connection with the user in its `Authorization`. A named root is sent too: root is the
/// default only of a sandbox created without a user.
pub(crate) fn client_for(lease: &Lease, user: Option<&str>) -> Result<ChannelClient, Error> {
    match user {
        None => Ok(lease.client().clone()),
        Some(user) => lease.client().as_user(user),
    }
}

/// The directory a process starts in: the call's `cwd`, else the sandbox's default workdir
/// ([`Channel::workdir`]). Always sent, so the agent's own fallback (the user's home) never
/// applies to the port's calls.
pub(crate) async fn cwd_or_default(
    channel: &Channel,
    cwd: Option<&sandbox_core::SandboxPath>,
) -> Result<String, Error> {
    match cwd {
        Some(path) => Ok(path.as_str().to_owned()),
        None => channel.workdir().await,
    }
}

/// A random tag naming one started process (the kill of a dropped call finds it by it).
pub(crate) fn random_tag(prefix: &str) -> String {
    format!(
        "{prefix}-{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    )
}

/// The shell form's process.
fn shell_process(expression: &str) -> (String, Vec<String>) {
    (
        "/bin/sh".to_owned(),
        vec![
            "-c".to_owned(),
            SHELL_SCRIPT.to_owned(),
            SHELL_NAME.to_owned(),
            expression.to_owned(),
        ],
    )
}

/// The argv form's process: the program itself.
fn argv_process(program: &str, args: &[String]) -> (String, Vec<String>) {
    (program.to_owned(), args.to_vec())
}

/// `argv` under the shell (see [`ARGV_FALLBACK_SCRIPT`]).
fn wrapped_argv(argv: Vec<String>) -> (String, Vec<String>) {
    let mut args = vec![
        "-c".to_owned(),
        ARGV_FALLBACK_SCRIPT.to_owned(),
        SHELL_NAME.to_owned(),
    ];
    args.extend(argv);
    ("/bin/sh".to_owned(), args)
}

/// How one `Start` went.
enum Ran {
    Done(ExecResult),
    /// The agent answered that it could not start the process: nothing ran.
    NotStarted(Error),
}

/// One command's call on the channel.
struct Call<'a> {
    docker: &'a Docker,
    channel: &'a Arc<Channel>,
    client: ChannelClient,
    lease: &'a Lease,
    request: &'a ExecRequest,
    timeout: Duration,
    max_output: usize,
}

impl Call<'_> {
    async fn run(&self, (cmd, args): (String, Vec<String>)) -> Result<Ran, Error> {
        let op = Operation::EXEC;
        let container = self.channel.container();
        let request = self.request;
        let tag = random_tag("sandbox-exec");
        let start = ps::StartRequest {
            process: Some(ps::ProcessConfig {
                cmd,
                args,
                envs: request.env.clone(),
                cwd: Some(cwd_or_default(self.channel, request.cwd.as_ref()).await?),
            }),
            pty: None,
            tag: Some(tag.clone()),
            stdin: Some(request.stdin.is_some()),
        };
        let mut guard = KillOnDrop {
            lease: Some(self.lease.clone()),
            selector: ProcessSelector::tag(tag),
        };
        let began = Instant::now();
        let options = CallOptions::new().timeout(self.timeout);
        let opening = async {
            let mut stream = self.client.start(&start, options).await?;
            let first = stream.message().await?;
            Ok::<_, Error>((stream, first))
        };
        let (mut stream, first) = match until_started(self.docker, container, opening).await {
            Ok(opened) => opened,
            // The agent refused to start it (its spawn failed): nothing runs.
            Err(e) if e.kind() == ErrorKind::InvalidRequest => {
                guard.disarm();
                return Ok(Ran::NotStarted(e));
            }
            Err(e) if e.kind() == ErrorKind::Timeout && began.elapsed() >= self.timeout => {
                return Ok(Ran::Done(timed_out(Collected::default(), began)));
            }
            Err(e) => return Err(self.failed(e).await),
        };
        let pid = match first.and_then(|m| m.event).and_then(|e| e.event) {
            Some(Event::Start(s)) => s.pid,
            other => {
                return Err(provider_error(
                    ErrorKind::Internal,
                    op,
                    format!("the agent's first process event was not start: {other:?}"),
                ));
            }
        };
        let process = ProcessSelector::pid(pid);
        let hook = request.on_output.as_ref();
        let mut kept = Collected::default();
        let mut end: Option<EndEvent> = None;
        let read = read_events(&mut stream, |event| match event {
            Event::Data(data) => {
                let (which, bytes) = match data.output {
                    Some(Output::Stdout(b) | Output::Pty(b)) => (OutputStream::Stdout, b),
                    Some(Output::Stderr(b)) => (OutputStream::Stderr, b),
                    None => return,
                };
                match hook {
                    Some(hook) => hook.emit(which, &bytes),
                    None => kept.push(which, &bytes, self.max_output),
                }
            }
            Event::End(e) => end = Some(e),
            Event::Start(_) | Event::Keepalive(_) => {}
        });
        let write = async {
            let Some(data) = request.stdin.as_deref() else {
                return;
            };
            for chunk in data.chunks(STDIN_CHUNK) {
                let mut wait = STDIN_RETRY_FIRST;
                loop {
                    let input = ProcessInput::stdin(chunk.to_vec());
                    match self
                        .client
                        .send_input(process.clone(), input, CallOptions::new())
                        .await
                    {
                        Ok(_) => break,
                        // The agent's stdin buffer for the process is full: it has not read
                        // the earlier chunks yet. Wait and send the same chunk again; the
                        // call's deadline (the read side) bounds the waiting.
                        Err(e) if e.kind() == ErrorKind::Capacity => {
                            tokio::time::sleep(wait).await;
                            wait = (wait * 2).min(STDIN_RETRY_MAX);
                        }
                        // The process is gone or stopped reading; the read ends the call.
                        // Stdin is left open rather than closed: a command must never see a
                        // cut input as its whole input.
                        Err(_) => return,
                    }
                }
            }
            // Always closed, so a command reading stdin sees end of file.
            let _ = self
                .client
                .close_stdin(process.clone(), CallOptions::new())
                .await;
        };
        let read = exec_mode::read_while_writing(read, write).await;
        let duration = began.elapsed();
        match (read, end) {
            // The end event is the verdict, whatever happened to the stream after it.
            (_, Some(end)) => {
                let (code, signalled) = exit_of(&end);
                if signalled && code == exec_mode::SIGKILL_STATUS && duration >= self.timeout {
                    // The agent's kill at the deadline.
                    guard.disarm();
                    return Ok(Ran::Done(timed_out(kept, began)));
                }
                if signalled && let Some(gone) = exec_mode::vanished(self.docker, container).await {
                    guard.disarm();
                    return Err(gone);
                }
                guard.disarm();
                Ok(Ran::Done(ExecResult {
                    stdout: kept.stdout,
                    stderr: kept.stderr,
                    exit_code: code,
                    duration,
                    killed: false,
                    truncated: kept.truncated,
                }))
            }
            // The call's deadline: the agent kills the group at the same deadline, and the
            // armed guard makes sure of it.
            (Err(e), None) if e.kind() == ErrorKind::Timeout && duration >= self.timeout => {
                Ok(Ran::Done(timed_out(kept, began)))
            }
            (Err(e), None) => Err(self.failed(e).await),
            (Ok(()), None) => Err(provider_error(
                ErrorKind::Internal,
                op,
                "the agent ended the process's stream without its end event",
            )),
        }
    }

    /// A failed call: the channel is dropped when the failure leaves it suspect, and the
    /// container is asked whether it is what failed.
    async fn failed(&self, err: Error) -> Error {
        if matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout) {
            self.channel.invalidate().await;
        }
        explain(self.docker, self.channel.container(), err)
            .await
            .with_operation(Operation::EXEC)
    }
}

/// exec mode's timeout result.
fn timed_out(kept: Collected, began: Instant) -> ExecResult {
    ExecResult {
        stdout: kept.stdout,
        stderr: kept.stderr,
        exit_code: -1,
        duration: began.elapsed(),
        killed: true,
        truncated: kept.truncated,
    }
}

/// Reads the stream to its end, handing every event to `on_event`.
async fn read_events<F: FnMut(Event)>(
    stream: &mut ServerStream<ps::StartResponse>,
    mut on_event: F,
) -> Result<(), Error> {
    while let Some(message) = stream.message().await? {
        if let Some(event) = message.event.and_then(|e| e.event) {
            on_event(event);
        }
    }
    Ok(())
}

/// `work`, unless the container is paused while it waits (a paused agent never answers).
pub(crate) async fn until_started<T>(
    docker: &Docker,
    container: &str,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return done,
            () = tokio::time::sleep(PAUSE_CHECK_EVERY) => {
                if is_paused(docker, container).await {
                    return Err(channel::paused(container));
                }
            }
        }
    }
}

/// Whether the engine says the container is paused.
async fn is_paused(docker: &Docker, container: &str) -> bool {
    docker
        .inspect_container(container, None::<InspectContainerOptions>)
        .await
        .ok()
        .and_then(|i| i.state)
        .and_then(|s| s.status)
        == Some(ContainerStateStatusEnum::PAUSED)
}

/// `err`, or what the container says caused it: gone, stopped (exec mode's checks), or paused.
pub(crate) async fn explain(docker: &Docker, container: &str, err: Error) -> Error {
    if let Some(gone) = exec_mode::vanished(docker, container).await {
        return gone;
    }
    if is_paused(docker, container).await {
        return channel::paused(container);
    }
    err
}

/// The exit status exec mode reports for `end` (a signal `n` is `128 + n`, as the engine
/// reports an exec's), and whether a signal ended the process. A status text that is not
/// envd's, or names no Linux signal (1 to 64), is -1: the agent is not trusted to name one.
pub(crate) fn exit_of(end: &EndEvent) -> (i32, bool) {
    if end.exited {
        return (end.exit_code, false);
    }
    let code = match ProcessStatus::parse(&end.status) {
        Some(ProcessStatus::Signaled { signal, .. }) if (1..=64).contains(&signal) => 128 + signal,
        _ => -1,
    };
    (code, true)
}

/// Sends SIGKILL to a process's group when dropped armed: the drop path of a cancelled call.
pub(crate) struct KillOnDrop {
    lease: Option<Lease>,
    selector: ProcessSelector,
}

impl KillOnDrop {
    pub(crate) fn new(lease: Lease, selector: ProcessSelector) -> Self {
        KillOnDrop {
            lease: Some(lease),
            selector,
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.lease = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        // The kill needs I/O, so it is spawned; without a runtime (process exit) nothing is
        // left to send it with, and the call's deadline still bounds the process in the agent.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let selector = self.selector.clone();
            runtime.spawn(async move {
                let options = CallOptions::new().timeout(KILL_TIMEOUT);
                let _ = lease
                    .client()
                    .send_signal(selector, ps::Signal::Sigkill, options)
                    .await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(exited: bool, code: i32, status: &str) -> EndEvent {
        EndEvent {
            exit_code: code,
            exited,
            status: status.to_owned(),
            error: None,
        }
    }

    #[test]
    fn signals_are_reported_as_the_engine_reports_them() {
        assert_eq!(exit_of(&end(true, 0, "exit status 0")), (0, false));
        assert_eq!(exit_of(&end(true, 137, "exit status 137")), (137, false));
        assert_eq!(exit_of(&end(false, -1, "signal: killed")), (137, true));
        assert_eq!(exit_of(&end(false, -1, "signal: terminated")), (143, true));
        assert_eq!(
            exit_of(&end(false, -1, "signal: segmentation fault (core dumped)")),
            (139, true)
        );
        assert_eq!(exit_of(&end(false, -1, "signal 40")), (-1, true));
        assert_eq!(exit_of(&end(false, -1, "signal: signal 40")), (168, true));
        assert_eq!(exit_of(&end(false, -1, "signal: signal 64")), (192, true));
        assert_eq!(exit_of(&end(false, -1, "unknown")), (-1, true));
        // What no agent produces for a real signal is no signal, and never an overflow.
        for hostile in [
            "signal: signal 0",
            "signal: signal 65",
            "signal: signal -9",
            "signal: signal 2147483647",
            "signal: signal 9",
        ] {
            assert_eq!(exit_of(&end(false, -1, hostile)), (-1, true), "{hostile}");
        }
        // Every signal the agent reports comes back as the engine would report it.
        for signal in 1..=64 {
            let status = ProcessStatus::Signaled {
                signal,
                core_dumped: signal % 2 == 0,
            };
            assert_eq!(exit_of(&status.end_event()), (128 + signal, true));
        }
    }

    #[test]
    fn the_shell_form_passes_the_expression_as_an_argument() {
        let (cmd, args) = shell_process("echo $HOME; rm -rf /tmp/x");
        assert_eq!(cmd, "/bin/sh");
        assert_eq!(args[0], "-c");
        assert!(!args[1].contains("rm -rf"), "never spliced into the script");
        assert!(args[1].contains("bash --noprofile --norc -c \"$1\""));
        assert!(args[1].contains("exec sh -c \"$1\""));
        assert_eq!(&args[2..], ["sandbox-exec", "echo $HOME; rm -rf /tmp/x"]);
        let (cmd, args) = wrapped_argv(vec!["cat".into(), "a b".into(), "$(id)".into()]);
        assert_eq!(cmd, "/bin/sh");
        assert_eq!(
            args,
            ["-c", "exec \"$@\"", "sandbox-exec", "cat", "a b", "$(id)"]
        );
        assert_eq!(
            argv_process("cat", &["x".into()]),
            ("cat".into(), vec!["x".into()])
        );
        assert_ne!(random_tag("t"), random_tag("t"));
    }
}
