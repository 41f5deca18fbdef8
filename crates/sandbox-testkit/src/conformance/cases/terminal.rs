//! Terminals (PTYs): echo, resize, the shell's exit status, and closing without leaving a
//! shell behind.

use std::time::{Duration, Instant};

use sandbox_core::{
    ExecRequest, SandboxHandle, TerminalEvent, TerminalOptions, TerminalSize, narrow,
};

use super::super::{CaseResult, Ctx, Failure, ensure_eq, preview, within};
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
