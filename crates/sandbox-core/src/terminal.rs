//! Interactive terminals (PTYs) and desktops, in provider-neutral form.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, ErrorCode, Operation};
use crate::path::SandboxPath;
use crate::secret::Secret;

/// A terminal window size. Zero in either dimension means "keep the current/default size".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminalSize {
    pub cols: u16,
    pub rows: u16,
}

impl TerminalSize {
    /// The size a terminal opens with when the caller names none.
    pub const DEFAULT: TerminalSize = TerminalSize { cols: 80, rows: 24 };

    /// `self`, with zero dimensions replaced from `fallback`.
    pub fn or(self, fallback: TerminalSize) -> TerminalSize {
        TerminalSize {
            cols: if self.cols == 0 {
                fallback.cols
            } else {
                self.cols
            },
            rows: if self.rows == 0 {
                fallback.rows
            } else {
                self.rows
            },
        }
    }
}

impl Default for TerminalSize {
    fn default() -> Self {
        TerminalSize::DEFAULT
    }
}

/// The `TERM` every adapter forces, so full-screen programs work.
pub const TERMINAL_TERM: &str = "xterm-256color";

/// Parameters for opening a PTY.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TerminalOptions {
    pub size: TerminalSize,
    /// Working directory; `None` is the workspace root.
    pub cwd: Option<SandboxPath>,
    /// Account; `None` is the default exec user.
    pub user: Option<String>,
    /// Extra environment; `TERM` is always forced to [`TERMINAL_TERM`].
    pub env: BTreeMap<String, String>,
    /// On a backend that can reattach (`terminal_reattach`): how long the terminal may run
    /// with no client attached before the backend kills it (its whole session). `None` is
    /// [`crate::config::DEFAULT_TERMINAL_IDLE_DISCONNECT`]. Backends honour any positive value
    /// (callers clamp what their users may ask for); a backend that cannot reattach ignores
    /// it, since its terminals end with their client.
    pub detach_timeout: Option<Duration>,
    /// Let a lookup-only open resume a paused sandbox. Off by default: opening a panel must not
    /// wake (and re-bill) a paused instance without an explicit click.
    pub allow_resume: bool,
}

impl TerminalOptions {
    /// Refuses what no backend can honour, as exec does (code `invalid_command`): environment
    /// names outside `[A-Za-z_][A-Za-z0-9_]*`, NUL bytes in values, a malformed user, a zero
    /// detach timeout. The working directory is a [`SandboxPath`], valid by construction.
    pub fn validate(&self) -> Result<(), Error> {
        let op = Operation::OPEN_TERMINAL;
        for (name, value) in &self.env {
            crate::exec::validate_env_name(name).map_err(|e| e.with_operation(op))?;
            if value.contains('\0') {
                return Err(Error::invalid_request(
                    op,
                    format!("invalid terminal: environment variable {name} contains a NUL byte"),
                )
                .with_code(ErrorCode::InvalidCommand));
            }
        }
        if let Some(user) = &self.user {
            crate::exec::validate_user(user).map_err(|e| e.with_operation(op))?;
        }
        if self.detach_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::invalid_request(
                op,
                "invalid terminal: a detach timeout must be positive",
            )
            .with_code(ErrorCode::InvalidTimeout));
        }
        Ok(())
    }

    /// The detach timeout in force: the caller's, or the default.
    pub fn detach_timeout_or_default(&self) -> Duration {
        self.detach_timeout
            .unwrap_or(crate::config::DEFAULT_TERMINAL_IDLE_DISCONNECT)
    }
}

/// One event on a terminal's output stream.
#[derive(Debug, Clone)]
pub enum TerminalEvent {
    /// Raw PTY output bytes.
    Data(Vec<u8>),
    /// The shell exited; `None` when the provider cannot tell the status.
    Exited(Option<i32>),
    /// The stream ended abnormally (transport failure, provider error).
    Failed(Error),
}

/// The reading half of a terminal.
#[async_trait]
pub trait TerminalOutput: Send + Sync + std::fmt::Debug {
    /// The next event; `None` once the session has ended (after `Exited`/`Failed`, or after
    /// close). Cancel-safe: dropping the future loses no event.
    async fn next_event(&mut self) -> Option<TerminalEvent>;
}

/// The controlling half of a terminal; safe to use concurrently with the reader.
#[async_trait]
pub trait TerminalInput: Send + Sync + std::fmt::Debug {
    /// Feeds raw bytes (keystrokes) into the PTY.
    async fn write(&self, data: &[u8]) -> Result<(), Error>;
    /// Changes the window size; zero dimensions are ignored.
    async fn resize(&self, size: TerminalSize) -> Result<(), Error>;
    /// Ends the terminal: the whole session is hung up (the shell and its jobs), so nothing
    /// is stranded. Idempotent.
    async fn close(&self) -> Result<(), Error>;
    /// Lets go of the terminal without ending it, where the backend can reattach
    /// (`terminal_reattach`): the shell keeps running for a later reattach by pid, until the
    /// options' detach timeout passes with nobody attached. A backend that cannot reattach
    /// closes instead (the default), since nobody could ever reach the shell again.
    /// Idempotent, and a no-op after `close`.
    async fn detach(&self) -> Result<(), Error> {
        self.close().await
    }
}

/// An open terminal.
#[derive(Debug)]
pub struct Terminal {
    /// The remote shell's PID, doubling as the reattach handle where the backend declares
    /// `terminal_reattach`; `None` when the backend cannot tell it.
    pub pid: Option<u32>,
    pub output: Box<dyn TerminalOutput>,
    pub input: std::sync::Arc<dyn TerminalInput>,
}

/// Parameters for dialling a sandbox desktop (websockify).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DesktopOptions {
    /// Basic-auth user for websockify; `None` is the default desktop user.
    pub basic_auth_user: Option<String>,
    /// Read from inside the sandbox; a backend-to-sandbox credential, never sent to a browser.
    pub basic_auth_password: Option<Secret>,
}

/// A relayed desktop connection carrying binary frames (raw RFB bytes).
#[async_trait]
pub trait DesktopStream: Send + std::fmt::Debug {
    /// Sends one binary frame.
    async fn send(&mut self, frame: Vec<u8>) -> Result<(), Error>;
    /// The next binary frame; `None` when the peer closed.
    async fn recv(&mut self) -> Option<Result<Vec<u8>, Error>>;
    /// Closes the connection. Idempotent.
    async fn close(&mut self) -> Result<(), Error>;
}

/// The error of a reattach to a pid that is no live terminal of the sandbox (code
/// `terminal_not_found`, kind `not_found`: the sandbox itself is fine, so callers must never
/// replace a binding on it).
pub fn terminal_not_found(pid: u32) -> Error {
    Error::not_found(
        Operation::REATTACH_TERMINAL,
        format!("no running terminal of this sandbox has pid {pid}"),
    )
    .with_code(ErrorCode::TerminalNotFound)
}

/// An error for terminal I/O on a session that already ended.
pub fn terminal_closed() -> Error {
    Error::conflict(Operation::TERMINAL_IO, "terminal is closed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated_like_execs() {
        assert!(TerminalOptions::default().validate().is_ok());
        let code = |o: TerminalOptions| o.validate().unwrap_err().code();
        let mut o = TerminalOptions::default();
        o.env.insert("NOT OK".to_owned(), "1".to_owned());
        assert_eq!(code(o), Some(ErrorCode::InvalidCommand));
        let mut o = TerminalOptions::default();
        o.env.insert("OK".to_owned(), "a\0b".to_owned());
        assert_eq!(code(o), Some(ErrorCode::InvalidCommand));
        let o = TerminalOptions {
            user: Some("-root".to_owned()),
            ..TerminalOptions::default()
        };
        let e = o.validate().unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidCommand));
        assert_eq!(e.kind(), crate::ErrorKind::InvalidRequest);
        assert_eq!(e.operation(), Operation::OPEN_TERMINAL);
        let o = TerminalOptions {
            detach_timeout: Some(Duration::ZERO),
            ..TerminalOptions::default()
        };
        assert_eq!(code(o), Some(ErrorCode::InvalidTimeout));
        assert_eq!(
            TerminalOptions::default().detach_timeout_or_default(),
            crate::config::DEFAULT_TERMINAL_IDLE_DISCONNECT
        );
    }

    #[test]
    fn reattach_codes_answer_404_and_501() {
        let e = terminal_not_found(9);
        assert_eq!(e.kind(), crate::ErrorKind::NotFound);
        assert_eq!(e.status_and_code(), (404, "terminal_not_found"));
        let e = Error::unsupported(Operation::REATTACH_TERMINAL, "x")
            .with_code(ErrorCode::TerminalReattachUnsupported);
        assert_eq!(e.status_and_code(), (501, "terminal_reattach_unsupported"));
    }
}
