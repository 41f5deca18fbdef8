//! Commands through envd's process service: one `process.Process/Start` per command.
//!
//! - **What runs.** The argv form is started as it is (`cmd` the program, `args` the rest:
//!   nothing is interpreted); the shell form is `/bin/bash -l -c <expression>`, what E2B's
//!   SDKs run, the expression one argument.
//! - **Environment, directory, account.** The request's env and cwd go in the process config
//!   (no cwd: envd's default); the account is the request's user, else root, as envd's Basic
//!   credentials.
//! - **Stdin.** A request with stdin starts the process with stdin open, sends it in chunks of
//!   [`STDIN_CHUNK`], then closes it; without, stdin is closed from the start.
//! - **Timeout.** The request's timeout (else [`DEFAULT_TIMEOUT`]) is the call's deadline, sent
//!   as `Connect-Timeout-Ms`, so envd kills the process at it; here the result is then
//!   `killed`, exit -1, with the output seen so far.
//! - **Cancellation.** A dropped call kills what it started: a guard armed once the pid is
//!   known sends SIGKILL (spawned, bounded by [`KILL_TIMEOUT`]) unless the process ended.
//! - **Output.** Each stream is kept up to [`MAX_OUTPUT`] and flagged `truncated` past it, or
//!   handed to the request's hook and not kept.
//! - **Failures.** A `Start` is never retried: whether envd began the process cannot be known
//!   after a cut connection, and a command must never run twice. A failed call is explained by
//!   the control plane (`E2bProvider::explain`: gone, paused).

use std::time::{Duration, Instant};

use sandbox_core::{
    Command, Error, ExecRequest, ExecResult, Operation, OutputHook, OutputStream, SandboxHandle,
};
use sandbox_envd::process::process_event::data_event::Output;
use sandbox_envd::process::process_event::{EndEvent, Event};
use sandbox_envd::process::{self as ps, ProcessInput};
use sandbox_transport::envd::CallOptions;

use crate::envd::Envd;
use crate::provider::E2bProvider;

/// A command's budget when the request names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The most of each stream kept in a result; the rest is dropped and flagged `truncated`.
pub const MAX_OUTPUT: usize = 4 * 1024 * 1024;
/// The most stdin sent in one `SendInput` (base64 in a JSON message, well under envd's
/// message limit).
pub const STDIN_CHUNK: usize = 256 * 1024;
/// The bound of the kill a dropped call sends.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// The shell of the shell form.
pub const SHELL: &str = "/bin/bash";

/// The process config of `request`.
pub(crate) fn process_config(request: &ExecRequest) -> ps::ProcessConfig {
    let (cmd, args) = match &request.command {
        Command::Argv { program, args } => (program.clone(), args.clone()),
        Command::Shell(expression) => (
            SHELL.to_owned(),
            vec!["-l".to_owned(), "-c".to_owned(), expression.clone()],
        ),
    };
    ps::ProcessConfig {
        cmd,
        args,
        envs: request.env.clone(),
        cwd: request.cwd.as_ref().map(|c| c.as_str().to_owned()),
    }
}

/// Output kept up to a cap per stream, or handed to a hook.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) truncated: bool,
}

impl Collected {
    pub(crate) fn push(
        &mut self,
        hook: Option<&OutputHook>,
        stream: OutputStream,
        bytes: &[u8],
        cap: usize,
    ) {
        if let Some(hook) = hook {
            hook.emit(stream, bytes);
            return;
        }
        let kept = match stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        };
        let room = cap.saturating_sub(kept.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// Kills the started process unless disarmed (the call ended with the process).
struct KillGuard {
    client: Envd,
    pid: Option<u32>,
}

impl Drop for KillGuard {
    fn drop(&mut self) {
        let Some(pid) = self.pid.take() else {
            return;
        };
        let client = self.client.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let selector = ps::ProcessSelector {
                selector: Some(ps::process_selector::Selector::Pid(pid)),
            };
            let options = CallOptions::new().timeout(KILL_TIMEOUT);
            if let Err(e) = client
                .send_signal(selector, ps::Signal::Sigkill, options)
                .await
            {
                tracing::debug!(pid, error = %e, "killing a dropped command's process failed");
            }
        });
    }
}

/// Runs `request` in `sandbox`.
pub(crate) async fn run(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    request: ExecRequest,
) -> Result<ExecResult, Error> {
    let envd = provider.envd(sandbox).await?;
    let client = match request.user.as_deref() {
        Some(user) => envd.as_user(user)?,
        None => envd.client().clone(),
    };
    match execute(&client, &request).await {
        Ok(result) => Ok(result),
        Err(e) => Err(provider
            .explain(sandbox.id(), e.with_operation(Operation::EXEC))
            .await),
    }
}

async fn execute(client: &Envd, request: &ExecRequest) -> Result<ExecResult, Error> {
    let started = Instant::now();
    let budget = request.timeout.map_or(DEFAULT_TIMEOUT, |t| t.get());
    let start = ps::StartRequest {
        process: Some(process_config(request)),
        pty: None,
        tag: None,
        stdin: Some(request.stdin.is_some()),
    };
    let mut stream = client
        .start(&start, CallOptions::new().timeout(budget))
        .await?;
    let mut guard = KillGuard {
        client: client.clone(),
        pid: None,
    };
    let mut out = Collected::default();
    let hook = request.on_output.as_ref();
    let mut stdin = request.stdin.as_deref();
    let end = loop {
        let message = match stream.message().await {
            Ok(Some(message)) => message,
            Ok(None) => {
                return Err(Error::unavailable(
                    Operation::EXEC,
                    "envd ended the command's stream without its end event",
                ));
            }
            Err(e) if e.kind() == sandbox_core::ErrorKind::Timeout => break None,
            Err(e) => return Err(e),
        };
        match message.event.and_then(|e| e.event) {
            Some(Event::Start(s)) => {
                guard.pid = Some(s.pid);
                if let Some(data) = stdin.take() {
                    send_stdin(client, s.pid, data).await?;
                }
            }
            Some(Event::Data(d)) => match d.output {
                Some(Output::Stdout(b)) => out.push(hook, OutputStream::Stdout, &b, MAX_OUTPUT),
                Some(Output::Stderr(b)) => out.push(hook, OutputStream::Stderr, &b, MAX_OUTPUT),
                Some(Output::Pty(b)) => out.push(hook, OutputStream::Stdout, &b, MAX_OUTPUT),
                None => {}
            },
            Some(Event::End(end)) => break Some(end),
            Some(Event::Keepalive(_)) | None => {}
        }
    };
    let (exit_code, killed) = match &end {
        Some(end) => {
            // It ended by itself: nothing left to kill.
            guard.pid = None;
            (exit_code_of(end), false)
        }
        // The deadline passed: envd kills the process at it, and the guard makes sure.
        None => (-1, true),
    };
    Ok(ExecResult {
        stdout: out.stdout,
        stderr: out.stderr,
        exit_code,
        duration: started.elapsed(),
        killed,
        truncated: out.truncated,
    })
}

/// An end event's exit status: its code, or -1 when a signal ended it (envd reports no code
/// then and a status such as `signal: killed`).
fn exit_code_of(end: &EndEvent) -> i32 {
    if end.exit_code == 0 && end.status.starts_with("signal") {
        -1
    } else {
        end.exit_code
    }
}

async fn send_stdin(client: &Envd, pid: u32, data: &[u8]) -> Result<(), Error> {
    let selector = || ps::ProcessSelector {
        selector: Some(ps::process_selector::Selector::Pid(pid)),
    };
    for chunk in data.chunks(STDIN_CHUNK) {
        let input = ProcessInput {
            input: Some(ps::process_input::Input::Stdin(chunk.to_vec())),
        };
        client
            .send_input(selector(), input, CallOptions::new())
            .await?;
    }
    client.close_stdin(selector(), CallOptions::new()).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::SandboxPath;

    #[test]
    fn argv_runs_as_it_is_and_the_shell_form_is_one_argument() {
        let mut argv = ExecRequest::argv("/bin/echo", ["a b", "$HOME;rm"]);
        argv.env.insert("K".into(), "v".into());
        argv.cwd = Some(SandboxPath::new("/tmp").unwrap());
        let c = process_config(&argv);
        assert_eq!(c.cmd, "/bin/echo");
        assert_eq!(c.args, ["a b", "$HOME;rm"]);
        assert_eq!(c.envs.get("K").map(String::as_str), Some("v"));
        assert_eq!(c.cwd.as_deref(), Some("/tmp"));
        let shell = ExecRequest::shell("echo $((1+1)) | cat");
        let c = process_config(&shell);
        assert_eq!(c.cmd, SHELL);
        assert_eq!(c.args, ["-l", "-c", "echo $((1+1)) | cat"]);
        assert_eq!(c.cwd, None);
    }

    #[test]
    fn output_is_capped_per_stream_or_handed_to_the_hook() {
        let mut out = Collected::default();
        out.push(None, OutputStream::Stdout, b"abcdef", 4);
        out.push(None, OutputStream::Stderr, b"xy", 4);
        assert_eq!(out.stdout, b"abcd");
        assert_eq!(out.stderr, b"xy");
        assert!(out.truncated);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let hook = OutputHook::new(move |_, b| sink.lock().unwrap().extend_from_slice(b));
        let mut hooked = Collected::default();
        hooked.push(Some(&hook), OutputStream::Stdout, b"live", 1);
        assert!(hooked.stdout.is_empty() && !hooked.truncated);
        assert_eq!(&*seen.lock().unwrap(), b"live");
    }

    #[test]
    fn a_signal_ending_is_minus_one() {
        let end = |code: i32, status: &str| EndEvent {
            exit_code: code,
            exited: true,
            status: status.to_owned(),
            error: None,
        };
        assert_eq!(exit_code_of(&end(3, "exit status 3")), 3);
        assert_eq!(exit_code_of(&end(0, "exit status 0")), 0);
        assert_eq!(exit_code_of(&end(0, "signal: killed")), -1);
    }
}
