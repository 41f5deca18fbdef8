//! Interactive PTYs: an exec with a TTY.
//!
//! Docker cannot reattach to an exec's PTY, so closing a terminal must not strand its shell and
//! the jobs started from it: every process of the session carries a random
//! `SANDBOX_TERMINAL_ID` in its environment, and close hangs up all of them (SIGHUP, SIGCONT,
//! then SIGKILL for whatever is left two seconds later). While open, the activity marker is
//! touched periodically so the idle sweep does not reclaim a sandbox someone is typing in.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use futures_util::{Stream, StreamExt};
use sandbox_core::{
    Error, ErrorKind, ExecRequest, Operation, SandboxHandle, Terminal, TerminalEvent,
    TerminalInput, TerminalOptions, TerminalOutput, TerminalSize, Terminals,
};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::errors::{self, provider_error};
use crate::exec::{self, ACTIVITY_MARKER};
use crate::provider::DockerProvider;

/// The environment variable marking every process of one terminal session.
pub const TERMINAL_MARKER_ENV: &str = "SANDBOX_TERMINAL_ID";

type OutputStream = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

struct DockerTerminalOutput {
    // `next_event` takes `&mut self`, so the mutex is never locked: it only makes the struct
    // `Sync` (the engine's stream is `Send` but not `Sync`).
    stream: Mutex<OutputStream>,
    docker: Docker,
    exec_id: String,
    finished: bool,
}

impl std::fmt::Debug for DockerTerminalOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerTerminalOutput")
            .field("exec_id", &self.exec_id)
            .field("finished", &self.finished)
            .finish()
    }
}

#[async_trait]
impl TerminalOutput for DockerTerminalOutput {
    async fn next_event(&mut self) -> Option<TerminalEvent> {
        if self.finished {
            return None;
        }
        let stream = self
            .stream
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        match stream.next().await {
            Some(Ok(
                LogOutput::StdOut { message }
                | LogOutput::StdErr { message }
                | LogOutput::Console { message },
            )) => Some(TerminalEvent::Data(message.to_vec())),
            Some(Ok(LogOutput::StdIn { .. })) => Some(TerminalEvent::Data(Vec::new())),
            Some(Err(e)) => {
                self.finished = true;
                Some(TerminalEvent::Failed(errors::map(
                    Operation::TERMINAL_IO,
                    e,
                )))
            }
            None => {
                self.finished = true;
                Some(TerminalEvent::Exited(
                    exit_status(&self.docker, &self.exec_id).await,
                ))
            }
        }
    }
}

/// The shell's exit status; `None` when the engine cannot say.
async fn exit_status(docker: &Docker, exec_id: &str) -> Option<i32> {
    for _ in 0..50 {
        match docker.inspect_exec(exec_id).await {
            Ok(inspect) if inspect.running != Some(true) => {
                return inspect.exit_code.and_then(|c| i32::try_from(c).ok());
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(_) => return None,
        }
    }
    None
}

struct DockerTerminalInput {
    input: tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    docker: Docker,
    container: String,
    exec_id: String,
    marker: String,
    closed: AtomicBool,
    refresher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for DockerTerminalInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerTerminalInput")
            .field("exec_id", &self.exec_id)
            .field("closed", &self.closed)
            .finish()
    }
}

impl DockerTerminalInput {
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
}

#[async_trait]
impl TerminalInput for DockerTerminalInput {
    async fn write(&self, data: &[u8]) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(sandbox_core::terminal::terminal_closed());
        }
        let mut input = self.input.lock().await;
        input.write_all(data).await.map_err(|e| {
            provider_error(
                ErrorKind::Unavailable,
                Operation::TERMINAL_IO,
                format!("terminal write: {e}"),
            )
        })?;
        input.flush().await.map_err(|e| {
            provider_error(
                ErrorKind::Unavailable,
                Operation::TERMINAL_IO,
                format!("terminal write: {e}"),
            )
        })
    }

    async fn resize(&self, size: TerminalSize) -> Result<(), Error> {
        if size.cols == 0 || size.rows == 0 {
            return Ok(());
        }
        self.docker
            .resize_exec(
                &self.exec_id,
                ResizeExecOptions {
                    height: size.rows,
                    width: size.cols,
                },
            )
            .await
            .map_err(|e| errors::map(Operation::TERMINAL_IO, e))
    }

    async fn close(&self) -> Result<(), Error> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.stop_refresher();
        let _ = self.input.lock().await.shutdown().await;
        exec::kill_marked(
            &self.docker,
            &self.container,
            TERMINAL_MARKER_ENV,
            &self.marker,
            true,
        )
        .await;
        Ok(())
    }
}

impl Drop for DockerTerminalInput {
    fn drop(&mut self) {
        self.stop_refresher();
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // Dropped without close: the shell must not outlive its last handle.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (docker, container, marker) = (
                self.docker.clone(),
                self.container.clone(),
                self.marker.clone(),
            );
            runtime.spawn(async move {
                exec::kill_marked(&docker, &container, TERMINAL_MARKER_ENV, &marker, true).await
            });
        }
    }
}

/// The terminal's shell: it touches the activity marker, then becomes bash when the image has
/// it, else sh, interactive. The same in both data planes.
pub(crate) fn shell_script() -> String {
    format!(
        "touch {ACTIVITY_MARKER} 2>/dev/null; if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"
    )
}

/// The terminal session's environment, validated: the caller's, with `TERM` forced, a UTF-8
/// locale and the session's `marker`. The user is checked here too, before either data plane
/// starts anything.
pub(crate) fn shell_env(
    options: &TerminalOptions,
    marker: &str,
) -> Result<BTreeMap<String, String>, Error> {
    for (k, v) in options.env.iter() {
        sandbox_core::exec::validate_env_name(k)?;
        if v.contains('\0') {
            return Err(Error::invalid_request(
                Operation::OPEN_TERMINAL,
                format!("environment variable {k} contains a NUL byte"),
            ));
        }
    }
    if let Some(user) = &options.user {
        sandbox_core::exec::validate_user(user)?;
    }
    let mut env: BTreeMap<String, String> = options
        .env
        .iter()
        .filter(|(k, _)| k.as_str() != "TERM")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.insert(
        "TERM".to_owned(),
        sandbox_core::terminal::TERMINAL_TERM.to_owned(),
    );
    env.insert("LANG".to_owned(), "C.UTF-8".to_owned());
    env.insert("LC_ALL".to_owned(), "C.UTF-8".to_owned());
    env.insert(TERMINAL_MARKER_ENV.to_owned(), marker.to_owned());
    Ok(env)
}

/// Reattaching needs the agent, which keeps a terminal's PTY process when its stream goes
/// (declared on the agent plane only).
#[async_trait]
impl sandbox_core::TerminalReattach for DockerProvider {
    async fn reattach_terminal(
        &self,
        sandbox: &SandboxHandle,
        pid: u32,
        size: sandbox_core::TerminalSize,
    ) -> Result<Terminal, Error> {
        let container = sandbox.id().as_str();
        match self.channel(container) {
            Some(channel) => crate::agent::terminal::reattach(self, &channel, pid, size).await,
            None => Err(Error::unsupported(
                Operation::REATTACH_TERMINAL,
                "a terminal of the exec data plane ends with its stream: there is nothing to reattach to",
            )
            .with_code(sandbox_core::ErrorCode::TerminalReattachUnsupported)),
        }
    }
}

#[async_trait]
impl Terminals for DockerProvider {
    async fn open_terminal(
        &self,
        sandbox: &SandboxHandle,
        options: TerminalOptions,
    ) -> Result<Terminal, Error> {
        let op = Operation::OPEN_TERMINAL;
        let container = sandbox.id().as_str().to_owned();
        let marker = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let shell_env = shell_env(&options, &marker)?;
        if let Some(channel) = self.channel(&container) {
            return crate::agent::terminal::open(self, &channel, options, marker, shell_env).await;
        }
        let env: Vec<String> = shell_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let user = exec::engine_user(options.user.as_deref());
        let create = CreateExecOptions {
            cmd: Some(vec!["/bin/sh".to_owned(), "-c".to_owned(), shell_script()]),
            env: Some(env),
            working_dir: Some(
                options
                    .cwd
                    .as_ref()
                    .map_or(sandbox_core::policy::workspace::WORKSPACE_ROOT, |p| {
                        p.as_str()
                    })
                    .to_owned(),
            ),
            user: Some(user),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(true),
            ..Default::default()
        };
        let created = match self.docker().create_exec(&container, create.clone()).await {
            Ok(c) => c,
            Err(e) => {
                let mapped = errors::map(op, e);
                if !errors::is_not_running(&mapped) {
                    return Err(mapped);
                }
                self.ensure_running(op, &container).await?;
                self.docker()
                    .create_exec(&container, create)
                    .await
                    .map_err(|e| errors::map(op, e))?
            }
        };
        let started = self
            .docker()
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: true,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(|e| errors::map(op, e))?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(provider_error(
                ErrorKind::Internal,
                op,
                "terminal exec started detached",
            ));
        };
        let size = options.size.or(TerminalSize::DEFAULT);
        // The PTY exists once the exec has started; a resize before that is refused.
        let _ = self
            .docker()
            .resize_exec(
                &created.id,
                ResizeExecOptions {
                    height: size.rows,
                    width: size.cols,
                },
            )
            .await;

        let refresh_every = (self.inner.config.idle_ttl / 3)
            .clamp(Duration::from_secs(15), Duration::from_secs(120));
        let (docker, refresh_container) = (self.docker().clone(), container.clone());
        let refresher = tokio::spawn(async move {
            loop {
                tokio::time::sleep(refresh_every).await;
                let touch = ExecRequest::argv("true", Vec::<String>::new());
                let _ = exec::run(
                    &docker,
                    &refresh_container,
                    &touch,
                    Duration::from_secs(30),
                    4096,
                )
                .await;
            }
        });
        let input = Arc::new(DockerTerminalInput {
            input: tokio::sync::Mutex::new(input),
            docker: self.docker().clone(),
            container,
            exec_id: created.id.clone(),
            marker,
            closed: AtomicBool::new(false),
            refresher: Mutex::new(Some(refresher)),
        });
        let output = DockerTerminalOutput {
            stream: Mutex::new(output),
            docker: self.docker().clone(),
            exec_id: created.id,
            finished: false,
        };
        // No reattach on Docker: the PID is not a handle a reconnect could use.
        Ok(Terminal {
            pid: None,
            output: Box::new(output),
            input,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_session_env_forces_term_and_carries_the_marker() {
        let mut options = TerminalOptions::default();
        options.env.insert("TERM".to_owned(), "dumb".to_owned());
        options.env.insert("A".to_owned(), "1".to_owned());
        options
            .env
            .insert(TERMINAL_MARKER_ENV.to_owned(), "forged".to_owned());
        let env = shell_env(&options, "m1").unwrap();
        assert_eq!(env["TERM"], sandbox_core::terminal::TERMINAL_TERM);
        assert_eq!(env["A"], "1");
        assert_eq!(
            env[TERMINAL_MARKER_ENV], "m1",
            "the caller cannot pick the marker"
        );
        assert_eq!(env["LC_ALL"], "C.UTF-8");
        options.env.insert("B".to_owned(), "x\0y".to_owned());
        assert_eq!(
            shell_env(&options, "m1").unwrap_err().kind(),
            ErrorKind::InvalidRequest
        );
        let bad_user = TerminalOptions {
            user: Some("-x".to_owned()),
            ..Default::default()
        };
        assert!(shell_env(&bad_user, "m1").is_err());
        assert!(shell_script().contains("exec bash -i"));
    }
}
