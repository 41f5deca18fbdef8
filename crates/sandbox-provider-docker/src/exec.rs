//! Running commands in a container.
//!
//! The container, not the client, enforces the timeout: cancelling the Engine API request
//! leaves the process running, so every command is wrapped in `timeout -s KILL <secs>` inside
//! the container. And because a caller that goes away (a dropped future) must not leave its
//! process behind either, every exec carries a random marker in its environment
//! (`SANDBOX_EXEC_ID`), inherited by everything it starts; when the call is dropped before the
//! command ends, a background task kills every process carrying the marker.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures_util::StreamExt;
use sandbox_core::{Command, Error, ErrorKind, ExecRequest, ExecResult, Operation, OutputStream};
use tokio::io::AsyncWriteExt;

use crate::errors::{self, provider_error};

/// The file whose mtime is the container's last activity; the idle sweeper reads it.
pub const ACTIVITY_MARKER: &str = "/var/lib/sandbox-activity";
/// The environment variable carrying an exec's kill marker.
pub const EXEC_MARKER_ENV: &str = "SANDBOX_EXEC_ID";
/// Extra time the client waits beyond the in-container timeout before giving up on the engine.
pub const CLIENT_GRACE: Duration = Duration::from_secs(10);
/// The most output of one stream an exec keeps by default (the rest is dropped and the result
/// says `truncated`).
pub const DEFAULT_MAX_OUTPUT: usize = 64 * 1024 * 1024;

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

/// Runs `request` in `container`.
pub async fn run(
    docker: &Docker,
    container: &str,
    request: ExecRequest,
    default_timeout: Duration,
    max_output: usize,
) -> Result<ExecResult, Error> {
    request.validate().map_err(|e| {
        e.with_operation(Operation::EXEC)
            .with_provider(sandbox_core::Provider::Docker)
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
        attach_stdin: Some(request.stdin.is_some()),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        ..Default::default()
    };
    let created = docker
        .create_exec(container, options)
        .await
        .map_err(|e| errors::map(Operation::EXEC, e))?;
    let mut guard = KillOnDrop {
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
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = attached
    else {
        return Err(provider_error(
            ErrorKind::Internal,
            Operation::EXEC,
            "exec started detached",
        ));
    };
    // Stdin is written concurrently with reading output: a command that echoes a large stdin
    // would otherwise fill its stdout pipe while we are still blocked writing.
    let stdin = request.stdin.clone();
    let writer = tokio::spawn(async move {
        if let Some(data) = stdin {
            let _ = input.write_all(&data).await;
        }
        // Always half-close, so a command reading stdin sees EOF.
        let _ = input.shutdown().await;
    });
    let collected = Arc::new(Mutex::new(Collected::default()));
    let sink = collected.clone();
    let hook = request.on_output.clone();
    let read = async move {
        while let Some(frame) = output.next().await {
            let frame = frame.map_err(|e| errors::map(Operation::EXEC, e))?;
            let (stream, bytes) = match &frame {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    (OutputStream::Stdout, message)
                }
                LogOutput::StdErr { message } => (OutputStream::Stderr, message),
                LogOutput::StdIn { .. } => continue,
            };
            if let Some(hook) = &hook {
                hook.emit(stream, bytes);
            }
            // Keep reading past the cap (a command blocked on a full pipe would only wait for its
            // timeout), but stop keeping.
            sink.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(stream, bytes, max_output);
        }
        Ok::<(), Error>(())
    };
    let finished = tokio::time::timeout(timeout + CLIENT_GRACE, read).await;
    writer.abort();
    let Collected {
        stdout,
        stderr,
        truncated,
    } = std::mem::take(&mut *collected.lock().unwrap_or_else(PoisonError::into_inner));
    match finished {
        Err(_) => {
            // The in-container timeout did not end the command (no timeout(1) in the image, or
            // the engine stalled): the guard kills it; report what a timeout is.
            return Ok(ExecResult {
                stdout,
                stderr,
                exit_code: -1,
                duration: started.elapsed(),
                killed: true,
                truncated,
            });
        }
        Ok(result) => result?,
    }
    let exit_code = exit_code_of(docker, &created.id).await?;
    guard.armed = false;
    let duration = started.elapsed();
    // timeout(1) with SIGKILL ends the command with 137, which a command can also produce by
    // itself; only a 137 that arrives once the budget is spent is the timeout's kill.
    let killed = exit_code == 137 && duration >= timeout;
    Ok(ExecResult {
        stdout,
        stderr,
        exit_code: if killed { -1 } else { exit_code },
        duration,
        killed,
        truncated,
    })
}

/// The output kept of one exec, each stream capped.
#[derive(Default)]
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
}

impl Collected {
    fn push(&mut self, stream: OutputStream, bytes: &[u8], cap: usize) {
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

    #[test]
    fn the_kill_script_takes_the_marker_as_an_argument() {
        let script = kill_marked_script(EXEC_MARKER_ENV, false);
        assert!(script.contains("SANDBOX_EXEC_ID=$1"));
        assert!(!script.contains("abc"));
        assert!(kill_marked_script("X", true).contains("kill -HUP"));
    }
}
