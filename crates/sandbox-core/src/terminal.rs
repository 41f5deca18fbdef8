//! Interactive terminals (PTYs) and desktops, in provider-neutral form.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::error::{Error, Operation};
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
    /// Reattach to this already-running PTY instead of starting a shell (falls back to a new
    /// shell when reattach fails).
    pub attach_pid: Option<u32>,
    /// Let a lookup-only open resume a paused sandbox. Off by default: opening a panel must not
    /// wake (and re-bill) a paused instance without an explicit click.
    pub allow_resume: bool,
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
    /// Disconnects. A backend that can reattach leaves the shell running for a later reattach;
    /// one that cannot (Docker) hangs up the whole session so no shell or job is stranded.
    /// Idempotent.
    async fn close(&self) -> Result<(), Error>;
}

/// An open terminal.
#[derive(Debug)]
pub struct Terminal {
    /// The remote shell's PID, doubling as the reattach handle; `None` means a reconnect cannot
    /// resume this shell.
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

/// An error for terminal I/O on a session that already ended.
pub fn terminal_closed() -> Error {
    Error::conflict(Operation::TERMINAL_IO, "terminal is closed")
}
