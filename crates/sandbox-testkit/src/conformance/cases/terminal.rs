//! Terminals (PTYs): echo, resize, the shell's exit status, closing without leaving a shell
//! behind, the open options, and (where declared) reattaching by pid and the detach timeout.

use std::time::{Duration, Instant};

use sandbox_core::{
    ErrorCode, ErrorKind, ExecRequest, SandboxHandle, SandboxPath, TerminalEvent, TerminalOptions,
    TerminalSize, narrow,
};

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq, preview, within};
use super::exec;

struct OpenTerminal {
    terminal: sandbox_core::Terminal,
    seen: Vec<u8>,
}

async fn open_terminal(
    ctx: &Ctx,
    h: &SandboxHandle,
    options: TerminalOptions,
) -> Result<OpenTerminal, Failure> {
    let terminals = narrow::terminals(ctx.provider())
        .ok_or_else(|| Failure("pty declared but not callable".to_owned()))?;
    let terminal = within(
        Duration::from_secs(60),
        "open_terminal",
        terminals.open_terminal(h, options),
    )
    .await??;
    Ok(OpenTerminal {
        terminal,
        seen: Vec::new(),
    })
}

impl OpenTerminal {
    async fn type_line(&self, line: &str) -> CaseResult {
        self.terminal
            .input
            .write(format!("{line}\n").as_bytes())
            .await
            .map_err(Failure::from)
    }

    /// Reads output until `needle` appears (or the terminal ends, or 30 s pass).
    async fn read_until(&mut self, needle: &str) -> Result<(), Failure> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !String::from_utf8_lossy(&self.seen).contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.terminal.output.next_event()).await {
                Ok(Some(TerminalEvent::Data(bytes))) => self.seen.extend_from_slice(&bytes),
                Ok(Some(other)) => {
                    return Err(Failure(format!(
                        "terminal ended before {needle:?}: {other:?}"
                    )));
                }
                Ok(None) => return Err(Failure(format!("terminal closed before {needle:?}"))),
                Err(_) => {
                    return Err(Failure(format!(
                        "{needle:?} not seen within 30s; got {}",
                        preview(&self.seen)
                    )));
                }
            }
        }
        Ok(())
    }
}

pub(super) async fn terminal_echo_round_trip(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let mut t = open_terminal(ctx, &h, TerminalOptions::default()).await?;
    let (a, b) = (ctx.token(), ctx.token());
    // Typed as `a""b`, printed as `ab`: the terminal's echo of the typed line cannot match.
    t.type_line(&format!("echo {a}\"\"{b}")).await?;
    t.read_until(&format!("{a}{b}")).await?;
    t.terminal.input.close().await.map_err(Failure::from)
}

pub(super) async fn terminal_resize_is_visible(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let mut t = open_terminal(ctx, &h, TerminalOptions::default()).await?;
    let size = TerminalSize {
        cols: u16::try_from(ctx.int(60..=200)).unwrap_or(100),
        rows: u16::try_from(ctx.int(20..=60)).unwrap_or(40),
    };
    t.terminal.input.resize(size).await.map_err(Failure::from)?;
    t.type_line("stty size").await?;
    t.read_until(&format!("{} {}", size.rows, size.cols))
        .await?;
    t.terminal.input.close().await.map_err(Failure::from)
}

pub(super) async fn terminal_exit_code(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let mut t = open_terminal(ctx, &h, TerminalOptions::default()).await?;
    let code = ctx.exit_code();
    t.type_line(&format!("exit {code}")).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, t.terminal.output.next_event()).await {
            Ok(Some(TerminalEvent::Data(_))) => {}
            Ok(Some(TerminalEvent::Exited(status))) => {
                return ensure_eq("terminal exit status", status, Some(code));
            }
            Ok(Some(TerminalEvent::Failed(e))) => {
                return Err(Failure(format!("terminal failed instead of exiting: {e}")));
            }
            Ok(None) => return Err(Failure("terminal ended without an exit event".to_owned())),
            Err(_) => return Err(Failure("no exit event within 30s".to_owned())),
        }
    }
}

/// Processes of the sandbox whose environment holds `VAR=value` (the scanning shell does not).
async fn marked_processes(
    ctx: &Ctx,
    h: &SandboxHandle,
    var: &str,
    value: &str,
) -> Result<usize, Failure> {
    let script =
        format!("grep -l '{var}={value}' /proc/[0-9]*/environ 2>/dev/null | grep -vc self || true");
    let r = exec(ctx, h, ExecRequest::shell(script)).await?;
    Ok(r.stdout_lossy().trim().parse().unwrap_or(usize::MAX))
}

/// Waits (15 s at most) until no process carries `VAR=value`.
async fn until_no_marked(
    ctx: &Ctx,
    h: &SandboxHandle,
    var: &str,
    value: &str,
    what: &str,
) -> CaseResult {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n = marked_processes(ctx, h, var, value).await?;
        if n == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Failure(format!(
                "{n} process(es) of {what} still running after 15s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The account [`terminal_options_are_honoured`] opens its terminal as.
const USER: &str = "sandboxconf";
const UID: u32 = 4321;

pub(super) async fn terminal_options_are_honoured(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let value = ctx.token();
    let dir = format!("/tmp/term-{}", ctx.token());
    // An account of its own (a minimal image may have none but root): the shell must run as it.
    exec(
        ctx,
        &h,
        ExecRequest::shell(format!(
            "mkdir -p {dir} && {{ grep -q '^{USER}:' /etc/passwd 2>/dev/null || \
             echo '{USER}:x:{UID}:{UID}::/tmp:/bin/sh' >> /etc/passwd; }} && \
             {{ grep -q '^{USER}:' /etc/group 2>/dev/null || echo '{USER}:x:{UID}:' >> /etc/group; }}"
        )),
    )
    .await?;
    let mut options = TerminalOptions {
        cwd: Some(SandboxPath::new(&dir).map_err(Failure::from)?),
        user: Some(USER.to_owned()),
        ..TerminalOptions::default()
    };
    options
        .env
        .insert("CONFORMANCE_VALUE".to_owned(), value.clone());
    let mut t = open_terminal(ctx, &h, options).await?;
    // Printed between markers; typed with quotes so the echo of the typed line cannot match.
    t.type_line("echo \"<$CONFORMANCE_VALUE|$(pwd)|$(id -u)\"\">\"")
        .await?;
    t.read_until(&format!("<{value}|{dir}|{UID}>")).await?;
    t.terminal.input.close().await.map_err(Failure::from)?;

    let terminals = narrow::terminals(ctx.provider())
        .ok_or_else(|| Failure("pty declared but not callable".to_owned()))?;
    for (name, bad) in [
        (
            "an environment name with a space",
            env_options("BAD NAME", "x"),
        ),
        ("a NUL in a value", env_options("GOOD", "a\0b")),
        (
            "a malformed user",
            TerminalOptions {
                user: Some("-rf".to_owned()),
                ..TerminalOptions::default()
            },
        ),
    ] {
        match terminals.open_terminal(&h, bad).await {
            Ok(t) => {
                let _ = t.input.close().await;
                return Err(Failure(format!("a terminal with {name} was opened")));
            }
            Err(e) => {
                ensure_eq(
                    &format!("kind for {name}"),
                    e.kind(),
                    ErrorKind::InvalidRequest,
                )?;
                ensure_eq(
                    &format!("code for {name}"),
                    e.code(),
                    Some(ErrorCode::InvalidCommand),
                )?;
            }
        }
    }
    Ok(())
}

fn env_options(name: &str, value: &str) -> TerminalOptions {
    let mut options = TerminalOptions::default();
    options.env.insert(name.to_owned(), value.to_owned());
    options
}

pub(super) async fn terminal_reattach_keeps_the_shell(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let reattach = narrow::terminal_reattach(ctx.provider())
        .ok_or_else(|| Failure("terminal_reattach declared but not callable".to_owned()))?;
    let marker = ctx.token();
    let mut options = TerminalOptions::default();
    options
        .env
        .insert("SANDBOX_CONFORMANCE_TERM".to_owned(), marker.clone());
    let mut t = open_terminal(ctx, &h, options).await?;
    let pid = t
        .terminal
        .pid
        .ok_or_else(|| Failure("a reattachable terminal reported no pid".to_owned()))?;
    let (value, before) = (ctx.token(), ctx.token());
    t.type_line(&format!(
        "export CONFORMANCE_KEPT={value}; echo {before}\"\"-seen"
    ))
    .await?;
    t.read_until(&format!("{before}-seen")).await?;
    t.terminal.input.detach().await.map_err(Failure::from)?;
    drop(t);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Still running, detached.
    let n = marked_processes(ctx, &h, "SANDBOX_CONFORMANCE_TERM", &marker).await?;
    ensure(n >= 1, || {
        "the detached terminal's shell is gone".to_owned()
    })?;

    let size = TerminalSize {
        cols: 111,
        rows: 33,
    };
    let terminal = within(
        Duration::from_secs(60),
        "reattach_terminal",
        reattach.reattach_terminal(&h, pid, size),
    )
    .await??;
    ensure_eq("reattached pid", terminal.pid, Some(pid))?;
    let mut t = OpenTerminal {
        terminal,
        seen: Vec::new(),
    };
    // The replay carries what the shell printed before the detach.
    t.read_until(&format!("{before}-seen")).await?;
    let after = ctx.token();
    t.type_line(&format!(
        "echo \"$CONFORMANCE_KEPT\"\"\"-{after}; stty size"
    ))
    .await?;
    t.read_until(&format!("{value}-{after}")).await?;
    t.read_until("33 111").await?;
    t.terminal.input.close().await.map_err(Failure::from)?;
    until_no_marked(
        ctx,
        &h,
        "SANDBOX_CONFORMANCE_TERM",
        &marker,
        "the closed terminal",
    )
    .await
}

pub(super) async fn terminal_reattach_unknown_pid(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let reattach = narrow::terminal_reattach(ctx.provider())
        .ok_or_else(|| Failure("terminal_reattach declared but not callable".to_owned()))?;
    let expect_not_found =
        |what: &str, r: Result<sandbox_core::Terminal, sandbox_core::Error>| match r {
            Ok(_) => Err(Failure(format!("reattaching {what} succeeded"))),
            Err(e) => {
                ensure_eq(&format!("kind for {what}"), e.kind(), ErrorKind::NotFound)?;
                ensure_eq(
                    &format!("code for {what}"),
                    e.code(),
                    Some(ErrorCode::TerminalNotFound),
                )
            }
        };
    // No such pid (above any default pid_max).
    expect_not_found(
        "an unknown pid",
        reattach
            .reattach_terminal(&h, 4_999_999, TerminalSize::DEFAULT)
            .await,
    )?;
    // A terminal that was closed.
    let t = open_terminal(ctx, &h, TerminalOptions::default()).await?;
    let pid = t
        .terminal
        .pid
        .ok_or_else(|| Failure("a reattachable terminal reported no pid".to_owned()))?;
    t.terminal.input.close().await.map_err(Failure::from)?;
    drop(t);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match reattach
            .reattach_terminal(&h, pid, TerminalSize::DEFAULT)
            .await
        {
            Ok(t) if Instant::now() < deadline => {
                let _ = t.input.detach().await;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            other => return expect_not_found("a closed terminal", other),
        }
    }
}

pub(super) async fn terminal_detach_timeout_kills(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let reattach = narrow::terminal_reattach(ctx.provider())
        .ok_or_else(|| Failure("terminal_reattach declared but not callable".to_owned()))?;
    let marker = ctx.token();
    let mut options = TerminalOptions {
        detach_timeout: Some(Duration::from_secs(1)),
        ..TerminalOptions::default()
    };
    options
        .env
        .insert("SANDBOX_CONFORMANCE_TERM".to_owned(), marker.clone());
    let mut t = open_terminal(ctx, &h, options).await?;
    let pid = t
        .terminal
        .pid
        .ok_or_else(|| Failure("a reattachable terminal reported no pid".to_owned()))?;
    let (a, b) = (ctx.token(), ctx.token());
    // A job of the session too: the kill takes the whole session.
    t.type_line(&format!("sleep 4321 & echo {a}\"\"{b}"))
        .await?;
    t.read_until(&format!("{a}{b}")).await?;
    t.terminal.input.detach().await.map_err(Failure::from)?;
    drop(t);
    until_no_marked(
        ctx,
        &h,
        "SANDBOX_CONFORMANCE_TERM",
        &marker,
        "the detached terminal",
    )
    .await?;
    match reattach
        .reattach_terminal(&h, pid, TerminalSize::DEFAULT)
        .await
    {
        Ok(_) => Err(Failure(
            "the killed terminal could still be reattached".to_owned(),
        )),
        Err(e) => ensure_eq(
            "code after the kill",
            e.code(),
            Some(ErrorCode::TerminalNotFound),
        ),
    }
}

pub(super) async fn terminal_close_leaves_no_shell(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let marker = ctx.token();
    let mut options = TerminalOptions::default();
    options
        .env
        .insert("SANDBOX_CONFORMANCE_TERM".to_owned(), marker.clone());
    let mut t = open_terminal(ctx, &h, options).await?;
    let (a, b) = (ctx.token(), ctx.token());
    // A child process in the session too: closing must hang up the whole session.
    t.type_line(&format!("sleep 4321 & echo {a}\"\"{b}"))
        .await?;
    t.read_until(&format!("{a}{b}")).await?;
    t.terminal.input.close().await.map_err(Failure::from)?;
    let script = format!(
        "grep -l 'SANDBOX_CONFORMANCE_TERM={marker}' /proc/[0-9]*/environ 2>/dev/null | grep -vc self || true"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = exec(ctx, &h, ExecRequest::shell(script.clone())).await?;
        // The scanning shell itself does not carry the marker (it is not in the terminal's env).
        let n: usize = r.stdout_lossy().trim().parse().unwrap_or(usize::MAX);
        if n == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Failure(format!(
                "{n} process(es) of the closed terminal still running after 15s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
