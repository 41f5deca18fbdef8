//! Running commands in a container.
//!
//! The container, not the client, enforces the timeout: cancelling the Engine API request
//! leaves the process running, so every command is wrapped in `timeout -s KILL <secs>` inside
//! the container. And because a caller that goes away (a dropped future) must not leave its
//! process behind either, every exec carries a random marker in its environment
//! (`SANDBOX_EXEC_ID`), inherited by everything it starts; when the call is dropped before the
//! command ends, a background task kills every process carrying the marker.
//!
//! Output takes one of three shapes. A buffered exec keeps each stream up to a cap
//! ([`DEFAULT_MAX_OUTPUT`]; the rest is dropped and the result says `truncated`): large output
//! belongs to the streamed forms. An exec with an `on_output` hook hands every frame to the hook
//! and keeps nothing. And `start` gives the adapter's own readers (file streams, tree
//! listings) a `Running` exec whose frames are read from the engine's connection only when
//! the reader asks for the next one, so a slow consumer slows the command instead of filling
//! the service's memory. Stdin is written from the caller's bytes as they are, concurrently with
//! reading output in the same task: nothing is copied for a writer task or for a retry.
//!
//! A container removed or killed while a command runs ends the command by SIGKILL (exit 137),
//! or leaves no exit code at all. Such an ending is checked against the container: one that is
//! gone answers `not_found` with code `sandbox_gone` instead of a result, so the caller learns
//! that the sandbox, not the command, ended.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::ContainerStateStatusEnum;
use bollard::query_parameters::InspectContainerOptions;
use futures_util::{Stream, StreamExt};
use sandbox_core::{
    Command, Error, ErrorCode, ErrorKind, ExecRequest, ExecResult, Operation, OutputStream,
    Provider,
};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::errors::{self, provider_error};

/// The file whose mtime is the container's last activity; the idle sweeper reads it.
pub const ACTIVITY_MARKER: &str = "/var/lib/sandbox-activity";
/// The environment variable carrying an exec's kill marker.
pub const EXEC_MARKER_ENV: &str = "SANDBOX_EXEC_ID";
/// Extra time the client waits beyond the in-container timeout before giving up on the engine.
pub const CLIENT_GRACE: Duration = Duration::from_secs(10);
/// The most output of one stream a buffered exec keeps by default (the rest is dropped and the
/// result says `truncated`). Small on purpose: every concurrent exec may hold this much per
/// stream, and output of any size streams through `on_output` without being kept.
pub const DEFAULT_MAX_OUTPUT: usize = 4 * 1024 * 1024;

/// The status of a process ended by SIGKILL: the timeout's kill, or the end of its container.
pub(crate) const SIGKILL_STATUS: i32 = 137;
/// How often, and how far apart, a command's SIGKILL is checked against its container. The
/// engine may record the command's end a moment before the container's own, so a container that
/// still looks alive is asked again before the 137 is believed.
const GONE_CHECKS: u32 = 5;
const GONE_CHECK_PAUSE: Duration = Duration::from_millis(100);

/// The account commands run as when the request names none. Root: one session owns one
/// sandbox, so the in-container account is not a tenant boundary.
pub const DEFAULT_USER: &str = "root";

/// The engine's spelling of an account. Root is always uid 0, and saying so numerically works
/// in images without an `/etc/passwd` (scratch-based ones), where the name cannot be resolved.
pub fn engine_user(user: Option<&str>) -> String {
    match user.unwrap_or(DEFAULT_USER) {
        "root" => "0".to_owned(),
        other => other.to_owned(),
    }
}

/// The shell snippet run as `sh -c <snippet> sandbox-exec <args...>`. It touches the activity
/// marker, then replaces itself with `timeout`, so the command is the wrapper's only child.
fn wrapper(command: &Command, secs: u64) -> Vec<String> {
    let touch = format!("touch {ACTIVITY_MARKER} 2>/dev/null || true");
    let mut argv = vec!["/bin/sh".to_owned(), "-c".to_owned()];
    match command {
        Command::Shell(expression) => {
            // bash when the image has it (what agents expect), else POSIX sh. The expression
            // travels as a positional argument, never spliced into the script text.
            argv.push(format!(
                "{touch}; if command -v bash >/dev/null 2>&1; then exec timeout -s KILL {secs} bash --noprofile --norc -c \"$1\"; \
                 else exec timeout -s KILL {secs} sh -c \"$1\"; fi"
            ));
            argv.push("sandbox-exec".to_owned());
            argv.push(expression.clone());
        }
        Command::Argv { program, args } => {
            argv.push(format!("{touch}; exec timeout -s KILL {secs} \"$@\""));
            argv.push("sandbox-exec".to_owned());
            argv.push(program.clone());
            argv.extend(args.iter().cloned());
        }
    }
    argv
}

/// Kills every process in `container` whose environment carries `marker`, then (when `hangup`)
/// gives them a moment to exit on SIGHUP first. The scanning shell gets the marker as an
/// argument, not in its environment, so it never matches itself.
pub fn kill_marked_script(env_name: &str, hangup: bool) -> String {
    let scan = format!(
        "for d in /proc/[0-9]*; do p=${{d#/proc/}}; [ \"$p\" = \"$$\" ] && continue; \
         if tr '\\000' '\\n' < \"$d/environ\" 2>/dev/null | grep -qx \"{env_name}=$1\"; then echo \"$p\"; fi; done"
    );
    if hangup {
        format!(
            "pids=$({scan}); [ -n \"$pids\" ] || exit 0; kill -HUP $pids 2>/dev/null; kill -CONT $pids 2>/dev/null; \
             sleep 2; pids=$({scan}); [ -n \"$pids\" ] && kill -KILL $pids 2>/dev/null; exit 0"
        )
    } else {
        format!("pids=$({scan}); [ -n \"$pids\" ] && kill -KILL $pids 2>/dev/null; exit 0")
    }
}

/// Runs the kill script (best effort: the container may be gone, which is the same outcome).
pub async fn kill_marked(
    docker: &Docker,
    container: &str,
    env_name: &str,
    marker: &str,
    hangup: bool,
) {
    let options = CreateExecOptions {
        cmd: Some(vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            kill_marked_script(env_name, hangup),
            "sandbox-kill".to_owned(),
            marker.to_owned(),
        ]),
        user: Some("0".to_owned()),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        ..Default::default()
    };
    let Ok(created) = docker.create_exec(container, options).await else {
        return;
    };
    if let Ok(StartExecResults::Attached { mut output, .. }) =
        docker.start_exec(&created.id, None).await
    {
        let drain = async { while output.next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(20), drain).await;
    }
}

/// Kills the exec's processes unless disarmed: the drop path of a cancelled call.
struct KillOnDrop {
    docker: Docker,
    container: String,
    marker: String,
    armed: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // A dropped exec future is a cancelled call: the process it started must not keep
        // running. The kill needs I/O, so it is spawned; without a runtime (process exit)
        // there is nothing left to do it with, and the in-container timeout still bounds it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (docker, container, marker) = (
                self.docker.clone(),
                self.container.clone(),
                self.marker.clone(),
            );
            runtime.spawn(async move {
                kill_marked(&docker, &container, EXEC_MARKER_ENV, &marker, false).await
            });
        }
    }
}

/// Output frames as bollard hands them out.
type Frames = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// An exec that has started: its output, its stdin, and the kill that runs when it is dropped
/// before [`Running::finish`] saw the command end.
pub(crate) struct Running {
    frames: Frames,
    input: Pin<Box<dyn AsyncWrite + Send>>,
    exec_id: String,
    guard: KillOnDrop,
    started: Instant,
    /// The in-container budget.
    timeout: Duration,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exit {
    /// The exit status; -1 when the timeout killed the command.
    pub(crate) code: i32,
    /// The in-container timeout killed the command.
    pub(crate) killed: bool,
    pub(crate) duration: Duration,
}

impl Running {
    /// The next output frame, read from the engine's connection now: nothing is read ahead, so
    /// a reader that does not ask holds the command on a full pipe. `None` once the command
    /// closed its output. A broken connection is checked against the container first.
    pub(crate) async fn next_frame(&mut self) -> Option<Result<(OutputStream, Vec<u8>), Error>> {
        loop {
            let frame = match self.frames.next().await? {
                Ok(frame) => frame,
                Err(e) => return Some(Err(self.explain(errors::map(Operation::EXEC, e)).await)),
            };
            let (stream, message) = match frame {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    (OutputStream::Stdout, message)
                }
                LogOutput::StdErr { message } => (OutputStream::Stderr, message),
                LogOutput::StdIn { .. } => continue,
            };
            return Some(Ok((stream, message.into())));
        }
    }

    /// How the command ended, once its output is closed. A SIGKILL or a missing exit code is
    /// checked against the container: a container that went away is an error, not a result.
    pub(crate) async fn finish(mut self) -> Result<Exit, Error> {
        let code = match exit_code_of(&self.guard.docker, &self.exec_id).await {
            Ok(code) => code,
            Err(e) => return Err(self.explain(e).await),
        };
        let duration = self.started.elapsed();
        if (code == SIGKILL_STATUS || code < 0)
            && let Some(gone) = vanished(&self.guard.docker, &self.guard.container).await
        {
            // Nothing is left to kill.
            self.guard.armed = false;
            return Err(gone);
        }
        self.guard.armed = false;
        // timeout(1) with SIGKILL ends the command with 137, which a command can also produce
        // by itself; only a 137 that arrives once the budget is spent is the timeout's kill.
        let killed = code == SIGKILL_STATUS && duration >= self.timeout;
        Ok(Exit {
            code: if killed { -1 } else { code },
            killed,
            duration,
        })
    }

    /// `err`, or the container's disappearance when that is what caused it. (`&mut`: the
    /// output stream is `Send` but not `Sync`, so only a unique borrow may cross an await.)
    async fn explain(&mut self, err: Error) -> Error {
        vanished(&self.guard.docker, &self.guard.container)
            .await
            .unwrap_or(err)
    }
}

/// Whether the container is what ended a command: `Some` with `sandbox_gone` (`not_found`)
/// when it was removed, is being removed or is dead, and with `unavailable` when it stopped (a
/// stopped container is started again by the next call, so its binding must not be replaced).
/// `None` while it runs, and when the engine cannot say: only proof counts.
pub(crate) async fn vanished(docker: &Docker, container: &str) -> Option<Error> {
    for check in 0..GONE_CHECKS {
        if check > 0 {
            tokio::time::sleep(GONE_CHECK_PAUSE).await;
        }
        let status = match docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
        {
            Ok(inspect) => inspect.state.and_then(|s| s.status),
            Err(e) => {
                let e = errors::map(Operation::EXEC, e);
                return (e.http_status() == Some(404)).then(|| sandbox_gone(container));
            }
        };
        match status {
            Some(ContainerStateStatusEnum::REMOVING | ContainerStateStatusEnum::DEAD) => {
                return Some(sandbox_gone(container));
            }
            Some(ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::CREATED) => {
                return Some(provider_error(
                    ErrorKind::Unavailable,
                    Operation::EXEC,
                    format!(
                        "sandbox {container} stopped while the command ran; the next call starts it again"
                    ),
                ));
            }
            _ => {}
        }
    }
    None
}

/// The error of a command whose sandbox went away under it.
pub(crate) fn sandbox_gone(container: &str) -> Error {
    Error::not_found(
        Operation::EXEC,
        format!("sandbox {container} disappeared while the command ran"),
    )
    .with_code(ErrorCode::SandboxGone)
    .with_provider(Provider::Docker)
}

/// Creates and starts `request` in `container`, stdin attached when `attach_stdin`. The
/// request's `stdin` and `on_output` are not used here: they are the caller's to serve.
pub(crate) async fn start(
    docker: &Docker,
    container: &str,
    request: &ExecRequest,
    attach_stdin: bool,
    default_timeout: Duration,
) -> Result<Running, Error> {
    request.validate().map_err(|e| {
        e.with_operation(Operation::EXEC)
            .with_provider(Provider::Docker)
    })?;
    let timeout = request.timeout.map_or(default_timeout, |t| t.get());
    // Whole seconds for timeout(1), rounded up so a 1.5 s budget is never cut to 1 s.
    let secs = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
    let marker = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let mut env: Vec<String> = request
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.push(format!("{EXEC_MARKER_ENV}={marker}"));
    let options = CreateExecOptions {
        cmd: Some(wrapper(&request.command, secs.max(1))),
        env: Some(env),
        working_dir: request.cwd.as_ref().map(|p| p.as_str().to_owned()),
        user: Some(engine_user(request.user.as_deref())),
        attach_stdin: Some(attach_stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        ..Default::default()
    };
    let created = docker
        .create_exec(container, options)
        .await
        .map_err(|e| errors::map(Operation::EXEC, e))?;
    let guard = KillOnDrop {
        docker: docker.clone(),
        container: container.to_owned(),
        marker,
        armed: true,
    };
    let started = Instant::now();
    let attached = docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: None,
            }),
        )
        .await
        .map_err(|e| errors::map(Operation::EXEC, e))?;
    let StartExecResults::Attached { output, input } = attached else {
        return Err(provider_error(
            ErrorKind::Internal,
            Operation::EXEC,
            "exec started detached",
        ));
    };
    Ok(Running {
        frames: output,
        input,
        exec_id: created.id,
        guard,
        started,
        timeout,
    })
}

/// Runs `request` in `container`, with the request's own stdin.
pub async fn run(
    docker: &Docker,
    container: &str,
    request: &ExecRequest,
    default_timeout: Duration,
    max_output: usize,
) -> Result<ExecResult, Error> {
    let stdin = request.stdin.as_deref();
    run_with_stdin(
        docker,
        container,
        request,
        stdin,
        default_timeout,
        max_output,
    )
    .await
}

/// Runs `request` with `stdin` (borrowed: an upload is written from the caller's buffer),
/// keeping at most `max_output` bytes per stream, or nothing when the request has an output
/// hook.
pub(crate) async fn run_with_stdin(
    docker: &Docker,
    container: &str,
    request: &ExecRequest,
    stdin: Option<&[u8]>,
    default_timeout: Duration,
    max_output: usize,
) -> Result<ExecResult, Error> {
    let mut running = start(docker, container, request, stdin.is_some(), default_timeout).await?;
    let budget = running.timeout + CLIENT_GRACE;
    let hook = request.on_output.as_ref();
    let mut kept = Collected::default();
    let finished = {
        let Running { frames, input, .. } = &mut running;
        let write = async move {
            if let Some(data) = stdin {
                let _ = input.write_all(data).await;
            }
            // Always half-close, so a command reading stdin sees EOF.
            let _ = input.shutdown().await;
        };
        let read = async {
            while let Some(frame) = frames.next().await {
                let frame = frame.map_err(|e| errors::map(Operation::EXEC, e))?;
                let (stream, bytes) = match &frame {
                    LogOutput::StdOut { message } | LogOutput::Console { message } => {
                        (OutputStream::Stdout, message)
                    }
                    LogOutput::StdErr { message } => (OutputStream::Stderr, message),
                    LogOutput::StdIn { .. } => continue,
                };
                match hook {
                    // [exec.stream]: the hook has every byte, so nothing is kept.
                    Some(hook) => hook.emit(stream, bytes),
                    // Keep reading past the cap (a command blocked on a full pipe would only
                    // wait for its timeout), but stop keeping.
                    None => kept.push(stream, bytes, max_output),
                }
            }
            Ok::<(), Error>(())
        };
        tokio::time::timeout(budget, read_while_writing(read, write)).await
    };
    let Collected {
        stdout,
        stderr,
        truncated,
    } = kept;
    match finished {
        Err(_) => {
            // The in-container timeout did not end the command (no timeout(1) in the image, or
            // the engine stalled): dropping `running` kills it; report what a timeout is.
            return Ok(ExecResult {
                stdout,
                stderr,
                exit_code: -1,
                duration: running.started.elapsed(),
                killed: true,
                truncated,
            });
        }
        Ok(Err(e)) => return Err(running.explain(e).await),
        Ok(Ok(())) => {}
    }
    let exit = running.finish().await?;
    Ok(ExecResult {
        stdout,
        stderr,
        exit_code: exit.code,
        duration: exit.duration,
        killed: exit.killed,
        truncated,
    })
}

/// Drives `read` to its end with `write` running alongside in the same task (a command that
/// echoes a large stdin would otherwise fill its stdout pipe while the write waits). `write` is
/// dropped once `read` ends: a command that exits without reading all of its stdin must not
/// hold the call.
pub(crate) async fn read_while_writing<R, W>(read: R, write: W) -> R::Output
where
    R: Future,
    W: Future<Output = ()>,
{
    tokio::pin!(read, write);
    let mut writing = true;
    loop {
        tokio::select! {
            out = &mut read => return out,
            () = &mut write, if writing => writing = false,
        }
    }
}

/// The output kept of one exec, each stream capped.
#[derive(Default)]
pub(crate) struct Collected {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) truncated: bool,
}

impl Collected {
    pub(crate) fn push(&mut self, stream: OutputStream, bytes: &[u8], cap: usize) {
        let buffer = match stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        };
        let room = cap.saturating_sub(buffer.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        buffer.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// The exit code of a finished exec. The output stream can end a moment before the engine
/// records the exit, so a still-running answer is re-asked briefly.
async fn exit_code_of(docker: &Docker, exec_id: &str) -> Result<i32, Error> {
    for _ in 0..50 {
        let inspect = docker
            .inspect_exec(exec_id)
            .await
            .map_err(|e| errors::map(Operation::EXEC, e))?;
        if inspect.running != Some(true)
            && let Some(code) = inspect.exit_code
        {
            return Ok(i32::try_from(code).unwrap_or(-1));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(provider_error(
        ErrorKind::Internal,
        Operation::EXEC,
        "the engine never reported the exit code",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_travels_as_arguments_not_script_text() {
        let argv = wrapper(&Command::Shell("echo $HOME; rm -rf /tmp/x".into()), 5);
        assert_eq!(argv[0], "/bin/sh");
        assert!(argv[2].contains("timeout -s KILL 5 bash --noprofile --norc -c \"$1\""));
        assert!(
            !argv[2].contains("rm -rf"),
            "the expression must not be spliced into the wrapper"
        );
        assert_eq!(argv[3], "sandbox-exec");
        assert_eq!(argv[4], "echo $HOME; rm -rf /tmp/x");

        let argv = wrapper(
            &Command::Argv {
                program: "cat".into(),
                args: vec!["a b".into(), "$(id)".into()],
            },
            60,
        );
        assert!(argv[2].ends_with("exec timeout -s KILL 60 \"$@\""));
        assert_eq!(&argv[3..], ["sandbox-exec", "cat", "a b", "$(id)"]);
        assert!(argv[2].starts_with(&format!("touch {ACTIVITY_MARKER}")));
    }

    #[test]
    fn output_is_capped_per_stream_and_flagged() {
        let mut c = Collected::default();
        c.push(OutputStream::Stdout, b"abcdef", 4);
        c.push(OutputStream::Stdout, b"gh", 4);
        c.push(OutputStream::Stderr, b"xy", 4);
        assert_eq!(c.stdout, b"abcd");
        assert_eq!(c.stderr, b"xy");
        assert!(c.truncated);
        let mut ok = Collected::default();
        ok.push(OutputStream::Stdout, b"abcd", 4);
        assert!(!ok.truncated, "exactly the cap is not truncation");
    }

    #[tokio::test]
    async fn reading_ends_the_call_even_when_stdin_is_not_taken() {
        // A command that exits without reading its stdin leaves the writer blocked for good.
        let out = read_while_writing(async { 7 }, std::future::pending::<()>()).await;
        assert_eq!(out, 7);
        // A writer that finishes first does not end the read.
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let read = async { rx.await.unwrap() };
        let write = async move {
            tokio::task::yield_now().await;
            tx.send(3).unwrap();
        };
        assert_eq!(read_while_writing(read, write).await, 3);
    }

    #[test]
    fn the_kill_script_takes_the_marker_as_an_argument() {
        let script = kill_marked_script(EXEC_MARKER_ENV, false);
        assert!(script.contains("SANDBOX_EXEC_ID=$1"));
        assert!(!script.contains("abc"));
        assert!(kill_marked_script("X", true).contains("kill -HUP"));
    }
}
