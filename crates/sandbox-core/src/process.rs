//! Background processes, in provider-neutral form (capability `processes`,
//! [`crate::Processes`]).
//!
//! A background process outlives the call that started it: it is found again by its pid or by
//! the tag its starter gave it, and its output is kept in a bounded replay ring so an attach
//! after a dropped connection (or a service restart) can replay what it missed.
//!
//! # Stream types
//!
//! The output of an attach is a [`ProcessOutput`]: an object-safe trait with one async-trait
//! method, like [`crate::TerminalOutput`] and [`crate::ByteStream`], so core keeps its
//! dependency allow-list (no `futures-core`, no `bytes`). A caller pulls events; an adapter
//! produces at most a bounded amount ahead of the puller.
//!
//! # Offsets and the replay ring
//!
//! Every byte a process writes, stdout and stderr together in the order they were produced, has
//! an offset: the first byte is 0. An adapter keeps the last [`ProcessInfo::ring_bytes`] of
//! them. An attach names the offset to start from (`None`: from what is produced next):
//! - an offset inside the ring replays from exactly there;
//! - an offset older than the ring's start yields one [`ProcessEvent::Gap`] naming the lost
//!   range, then the output from the ring's start. A gap is an event, not an error, so a
//!   reattaching terminal need not make a second call (during which the ring would move on);
//! - an offset past what was produced is `invalid_request` with code `invalid_offset`.
//!
//! A slow reader is never an unbounded queue: an adapter either holds the process's output
//! back until the reader catches up (back-pressure on the process, as the agent does), or lets
//! the ring move past the reader's cursor, who then gets a [`ProcessEvent::Gap`] too (as the
//! fake does). Either way the memory an attach costs is the ring's.

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Operation};
use crate::exec::{Command, ExecRequest, OutputStream};
use crate::path::SandboxPath;

/// The caller's name for a background process, unique among the sandbox's running processes:
/// 1 to 64 bytes of `[A-Za-z0-9._-]`, starting with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ProcessTag(String);

impl ProcessTag {
    /// Longest tag accepted.
    pub const MAX_LEN: usize = 64;

    /// Validates `raw`; anything else is `invalid_request` with code `invalid_command`.
    pub fn new(raw: impl Into<String>) -> Result<ProcessTag, Error> {
        let raw = raw.into();
        let ok = !raw.is_empty()
            && raw.len() <= ProcessTag::MAX_LEN
            && raw
                .as_bytes()
                .first()
                .is_some_and(u8::is_ascii_alphanumeric)
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(ProcessTag(raw))
        } else {
            Err(Error::invalid_input(format!(
                "invalid process tag {:?}: 1 to {} bytes of letters, digits, '.', '_' or '-', \
                 starting with a letter or digit",
                raw.chars().take(64).collect::<String>(),
                ProcessTag::MAX_LEN
            ))
            .with_code(ErrorCode::InvalidCommand))
        }
    }

    /// The tag.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ProcessTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for ProcessTag {
    type Error = Error;
    fn try_from(raw: String) -> Result<Self, Self::Error> {
        ProcessTag::new(raw)
    }
}

impl From<ProcessTag> for String {
    fn from(tag: ProcessTag) -> String {
        tag.0
    }
}

/// How a call names a process.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessSelector {
    /// The process's pid inside the sandbox.
    Pid(u32),
    /// The tag it was started with. A tag names the running process holding it, else the most
    /// recently started exited one still listed.
    Tag(ProcessTag),
}

impl fmt::Display for ProcessSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessSelector::Pid(pid) => write!(f, "pid {pid}"),
            ProcessSelector::Tag(tag) => write!(f, "tag {tag}"),
        }
    }
}

/// What to start in the background.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// Argv or shell form; the shell form needs `posix_shell`, as for exec.
    pub command: Command,
    /// The caller's name for it; `None` means it is found by pid only.
    pub tag: Option<ProcessTag>,
    /// Merged into the process environment.
    pub env: BTreeMap<String, String>,
    /// Working directory; `None` is the provider's default.
    pub cwd: Option<SandboxPath>,
    /// OS account; `None` is the adapter default.
    pub user: Option<String>,
    /// Keep stdin open for [`crate::Processes::send_input`]; otherwise it is closed at start
    /// (a program reading it sees end of file at once).
    pub stdin: bool,
}

impl ProcessSpec {
    /// The argv form, untagged, stdin closed.
    pub fn argv<I, S>(program: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ProcessSpec::with_command(Command::Argv {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
        })
    }

    /// The shell form, untagged, stdin closed.
    pub fn shell(expression: impl Into<String>) -> Self {
        ProcessSpec::with_command(Command::Shell(expression.into()))
    }

    fn with_command(command: Command) -> Self {
        ProcessSpec {
            command,
            tag: None,
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            stdin: false,
        }
    }

    /// Sets the tag.
    #[must_use]
    pub fn tagged(mut self, tag: ProcessTag) -> Self {
        self.tag = Some(tag);
        self
    }

    /// Keeps stdin open.
    #[must_use]
    pub fn with_stdin(mut self) -> Self {
        self.stdin = true;
        self
    }

    /// The same checks an exec request gets: a non-empty program or expression, no NUL bytes,
    /// portable env names, a plausible user (`invalid_request`, code `invalid_command`).
    pub fn validate(&self) -> Result<(), Error> {
        let mut as_exec = match &self.command {
            Command::Argv { program, args } => ExecRequest::argv(program.clone(), args.clone()),
            Command::Shell(expression) => ExecRequest::shell(expression.clone()),
        };
        as_exec.env = self.env.clone();
        as_exec.user = self.user.clone();
        as_exec.validate()
    }

    /// The argv the process runs, as [`ProcessInfo::argv`] reports it (`/bin/sh -c EXPR` for the
    /// shell form).
    pub fn argv_view(&self) -> Vec<String> {
        match &self.command {
            Command::Argv { program, args } => std::iter::once(program.clone())
                .chain(args.iter().cloned())
                .collect(),
            Command::Shell(expression) => {
                vec!["/bin/sh".to_owned(), "-c".to_owned(), expression.clone()]
            }
        }
    }
}

/// Whether a listed process still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum ProcessStatus {
    /// Still running.
    Running,
    /// Ended. `exit_code` is `None` when it was ended by a signal (then `signal` names it, when
    /// the provider can tell) or when the provider cannot tell the status.
    Exited {
        exit_code: Option<i32>,
        signal: Option<Signal>,
    },
}

impl ProcessStatus {
    /// Whether the process still runs.
    pub fn is_running(self) -> bool {
        matches!(self, ProcessStatus::Running)
    }
}

/// One background process, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub tag: Option<ProcessTag>,
    pub argv: Vec<String>,
    pub status: ProcessStatus,
    /// Output bytes produced so far (the offset the next byte gets).
    pub output_bytes: u64,
    /// Size of the replay ring: how many of the latest output bytes an attach can replay.
    pub ring_bytes: u64,
}

/// A signal [`crate::Processes::signal_process`] can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Signal {
    Hup,
    Int,
    Quit,
    Kill,
    Usr1,
    Usr2,
    Term,
}

impl Signal {
    /// Every signal, in number order.
    pub const ALL: [Signal; 7] = [
        Signal::Hup,
        Signal::Int,
        Signal::Quit,
        Signal::Kill,
        Signal::Usr1,
        Signal::Usr2,
        Signal::Term,
    ];

    /// The name without `SIG` (`TERM`).
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Hup => "HUP",
            Signal::Int => "INT",
            Signal::Quit => "QUIT",
            Signal::Kill => "KILL",
            Signal::Usr1 => "USR1",
            Signal::Usr2 => "USR2",
            Signal::Term => "TERM",
        }
    }

    /// The Linux signal number.
    pub fn number(self) -> i32 {
        match self {
            Signal::Hup => 1,
            Signal::Int => 2,
            Signal::Quit => 3,
            Signal::Kill => 9,
            Signal::Usr1 => 10,
            Signal::Usr2 => 12,
            Signal::Term => 15,
        }
    }

    /// Parses a name, with or without `SIG`, any case; anything else is `invalid_request`
    /// with code `invalid_signal`.
    pub fn parse(raw: &str) -> Result<Signal, Error> {
        let upper = raw.to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        Signal::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| {
                Error::invalid_input(format!(
                    "unknown signal {:?}: expected one of HUP, INT, QUIT, KILL, USR1, USR2, TERM",
                    raw.chars().take(32).collect::<String>()
                ))
                .with_code(ErrorCode::InvalidSignal)
            })
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of an attached process's output.
#[derive(Debug, Clone)]
pub enum ProcessEvent {
    /// Output bytes (never empty) starting at `offset`.
    Data {
        stream: OutputStream,
        offset: u64,
        data: Vec<u8>,
    },
    /// The bytes `from..to` are no longer in the replay ring (the attach asked for older output,
    /// or the reader fell behind); the next `Data` starts at `to`.
    Gap { from: u64, to: u64 },
    /// The process ended; the stream ends after this event.
    Exited(ProcessStatus),
    /// The stream ended abnormally (transport failure, provider error). The process may still
    /// run: attach again.
    Failed(Error),
}

/// The reading half of an attach.
#[async_trait]
pub trait ProcessOutput: Send + std::fmt::Debug {
    /// The next event; `None` after `Exited` or `Failed`. Cancel-safe: dropping the future
    /// loses no event. Dropping the stream detaches; the process keeps running.
    async fn next_event(&mut self) -> Option<ProcessEvent>;
}

/// A boxed [`ProcessOutput`], what [`crate::Processes::attach_process`] returns.
pub type ProcessStream = Box<dyn ProcessOutput>;

/// The errors the process calls share, so every adapter words and codes them alike.
pub mod errors {
    use super::*;

    /// No process has this pid or tag (`not_found`, code `process_not_found`).
    pub fn not_found(op: Operation, target: &ProcessSelector) -> Error {
        Error::not_found(op, format!("no background process with {target}"))
            .with_code(ErrorCode::ProcessNotFound)
    }

    /// Input or a signal for a process that already ended (`conflict`, code
    /// `process_exited`).
    pub fn exited(op: Operation, target: &ProcessSelector) -> Error {
        Error::conflict(op, format!("the process with {target} has exited"))
            .with_code(ErrorCode::ProcessExited)
    }

    /// Input for a process whose stdin is closed or was never kept open (`conflict`, code
    /// `stdin_closed`).
    pub fn stdin_closed(op: Operation, target: &ProcessSelector) -> Error {
        Error::conflict(
            op,
            format!("the stdin of the process with {target} is closed"),
        )
        .with_code(ErrorCode::StdinClosed)
    }

    /// A start with a tag a running process holds (`conflict`, code `process_tag_in_use`).
    pub fn tag_in_use(tag: &ProcessTag) -> Error {
        Error::conflict(
            Operation::START_PROCESS,
            format!("a running process already has the tag {tag}"),
        )
        .with_code(ErrorCode::ProcessTagInUse)
    }

    /// A start refused because the sandbox already runs `cap` processes (`capacity`, code
    /// `process_limit`); nothing was started.
    pub fn process_limit(cap: usize) -> Error {
        Error::new(
            crate::ErrorKind::Capacity,
            Operation::START_PROCESS,
            format!("the sandbox already runs {cap} processes, its cap"),
        )
        .with_code(ErrorCode::ProcessLimit)
    }

    /// An attach offset past the output produced so far (`invalid_request`, code
    /// `invalid_offset`).
    pub fn offset_ahead(offset: u64, produced: u64) -> Error {
        Error::invalid_request(
            Operation::ATTACH_PROCESS,
            format!("offset {offset} is past the {produced} output bytes produced so far"),
        )
        .with_code(ErrorCode::InvalidOffset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn tags_are_validated() {
        for good in ["a", "job-1", "Build.2_x", &"x".repeat(64)] {
            assert_eq!(ProcessTag::new(good).unwrap().as_str(), good);
        }
        for bad in ["", "-x", ".x", "a b", "a/b", "ä", &"x".repeat(65)] {
            let err = ProcessTag::new(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{bad:?}");
            assert_eq!(err.code(), Some(ErrorCode::InvalidCommand), "{bad:?}");
        }
        assert!(serde_json::from_str::<ProcessTag>("\"a b\"").is_err());
    }

    #[test]
    fn signals_parse_by_name() {
        for s in Signal::ALL {
            assert_eq!(Signal::parse(s.as_str()).unwrap(), s);
            assert_eq!(
                Signal::parse(&format!("sig{}", s.as_str().to_lowercase())).unwrap(),
                s
            );
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert_eq!(Signal::Term.number(), 15);
        assert_eq!(Signal::Kill.number(), 9);
        let err = Signal::parse("STOP").unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::InvalidSignal));
    }

    #[test]
    fn the_cap_refusal_is_capacity_with_its_code() {
        let err = errors::process_limit(4);
        assert_eq!(err.kind(), ErrorKind::Capacity);
        assert_eq!(err.code(), Some(ErrorCode::ProcessLimit));
        assert_eq!(err.operation(), Operation::START_PROCESS);
        assert_eq!(err.status_and_code(), (429, "process_limit"));
    }

    #[test]
    fn specs_validate_like_exec() {
        assert!(ProcessSpec::argv("sleep", ["1"]).validate().is_ok());
        let err = ProcessSpec::argv(" ", Vec::<String>::new())
            .validate()
            .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::InvalidCommand));
        let mut bad_env = ProcessSpec::argv("env", Vec::<String>::new());
        bad_env.env.insert("1X".to_owned(), "v".to_owned());
        assert_eq!(
            bad_env.validate().unwrap_err().code(),
            Some(ErrorCode::InvalidCommand)
        );
        assert_eq!(
            ProcessSpec::shell("echo hi").argv_view(),
            ["/bin/sh", "-c", "echo hi"]
        );
    }
}
