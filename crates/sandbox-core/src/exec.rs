//! Running commands inside a sandbox.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode};
use crate::path::SandboxPath;
use crate::sandbox::invalid_timeout;

/// What to run: a program with arguments, or one shell expression.
///
/// An enum rather than a `(command, args, shell)` triple so "shell with arguments" cannot be
/// represented; [`ExecSpec`] is the wire form that can, and refuses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `program` is executed directly with `args` as `argv[1..]`; nothing is interpreted.
    Argv { program: String, args: Vec<String> },
    /// Interpreted by the sandbox's POSIX shell (needs the `posix_shell` capability).
    Shell(String),
}

impl Command {
    /// A short, log-safe label: the program name, or `sh -c` for shell commands (never the
    /// arguments, which may carry credentials).
    pub fn label(&self) -> &str {
        match self {
            Command::Argv { program, .. } => program,
            Command::Shell(_) => "sh -c",
        }
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Observes output while a command runs. Called from whatever task the adapter reads output on;
/// it must not block, and must not keep the slice.
#[derive(Clone)]
pub struct OutputHook(Arc<OutputFn>);

type OutputFn = dyn Fn(OutputStream, &[u8]) + Send + Sync;

impl OutputHook {
    /// Wraps a callback.
    pub fn new(f: impl Fn(OutputStream, &[u8]) + Send + Sync + 'static) -> Self {
        OutputHook(Arc::new(f))
    }
    /// Delivers one chunk.
    pub fn emit(&self, stream: OutputStream, chunk: &[u8]) {
        (self.0)(stream, chunk);
    }
}

impl fmt::Debug for OutputHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OutputHook")
    }
}

/// The longest execution timeout accepted.
pub const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A validated execution timeout: more than zero, at most [`MAX_EXEC_TIMEOUT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecTimeout(Duration);

impl ExecTimeout {
    /// Validates `duration`.
    pub fn new(duration: Duration) -> Result<Self, Error> {
        if duration.is_zero() {
            return Err(invalid_timeout("exec timeout must not be zero".to_owned()));
        }
        if duration > MAX_EXEC_TIMEOUT {
            return Err(invalid_timeout(format!(
                "exec timeout {}s exceeds the maximum of {}s",
                duration.as_secs(),
                MAX_EXEC_TIMEOUT.as_secs()
            )));
        }
        Ok(ExecTimeout(duration))
    }
    /// From milliseconds as they arrive on the wire (signed, so a negative value is refused
    /// with a clear message instead of wrapping).
    pub fn from_millis(millis: i64) -> Result<Self, Error> {
        let millis = u64::try_from(millis).map_err(|_| {
            invalid_timeout(format!("exec timeout must be positive, got {millis} ms"))
        })?;
        ExecTimeout::new(Duration::from_millis(millis))
    }
    /// From fractional seconds; NaN, infinities, negatives and zero are refused.
    pub fn from_secs_f64(secs: f64) -> Result<Self, Error> {
        if !secs.is_finite() || secs <= 0.0 {
            return Err(invalid_timeout(format!(
                "exec timeout must be a positive number of seconds, got {secs}"
            )));
        }
        let duration = Duration::try_from_secs_f64(secs)
            .map_err(|_| invalid_timeout(format!("exec timeout {secs}s is out of range")))?;
        ExecTimeout::new(duration)
    }
    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

/// One command invocation.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub command: Command,
    /// Written to the process's stdin, which is then closed. `None` closes stdin at once.
    pub stdin: Option<Vec<u8>>,
    /// Merged into the process environment.
    pub env: BTreeMap<String, String>,
    /// Working directory; `None` is the provider's default.
    pub cwd: Option<SandboxPath>,
    /// OS account; `None` is the adapter default (root: one session owns one sandbox, so the
    /// in-sandbox account is not a tenant boundary).
    pub user: Option<String>,
    /// `None` is the provider default.
    pub timeout: Option<ExecTimeout>,
    /// Receives output chunks while the command runs.
    pub on_output: Option<OutputHook>,
}

impl ExecRequest {
    /// Runs `program` with `args`, unvalidated fields at their defaults. Use
    /// [`ExecRequest::validate`] (or build from an [`ExecSpec`]) on untrusted input.
    pub fn argv<I, S>(program: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest::with_command(Command::Argv {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
        })
    }
    /// Runs a shell expression.
    pub fn shell(expression: impl Into<String>) -> Self {
        ExecRequest::with_command(Command::Shell(expression.into()))
    }
    fn with_command(command: Command) -> Self {
        ExecRequest {
            command,
            stdin: None,
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            timeout: None,
            on_output: None,
        }
    }
    /// Sets stdin.
    #[must_use]
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }
    /// Adds one environment variable.
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }
    /// Sets the working directory.
    #[must_use]
    pub fn cwd(mut self, dir: SandboxPath) -> Self {
        self.cwd = Some(dir);
        self
    }
    /// Sets the timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: ExecTimeout) -> Self {
        self.timeout = Some(timeout);
        self
    }
    /// Sets the output hook.
    #[must_use]
    pub fn on_output(mut self, hook: OutputHook) -> Self {
        self.on_output = Some(hook);
        self
    }

    /// Refuses what no backend can run: an empty program or expression, NUL bytes in argv (they
    /// cannot cross `execve`), invalid environment names, a malformed user.
    pub fn validate(&self) -> Result<(), Error> {
        match &self.command {
            Command::Argv { program, args } => {
                if program.trim().is_empty() {
                    return Err(invalid_command("program must not be empty"));
                }
                if program.contains('\0') || args.iter().any(|a| a.contains('\0')) {
                    return Err(invalid_command("arguments must not contain NUL bytes"));
                }
            }
            Command::Shell(expression) => {
                if expression.trim().is_empty() {
                    return Err(invalid_command("shell command must not be empty"));
                }
                if expression.contains('\0') {
                    return Err(invalid_command("shell command must not contain NUL bytes"));
                }
            }
        }
        for (name, value) in &self.env {
            validate_env_name(name)?;
            if value.contains('\0') {
                return Err(invalid_command(&format!(
                    "environment variable {name} contains a NUL byte"
                )));
            }
        }
        if let Some(user) = &self.user {
            validate_user(user)?;
        }
        Ok(())
    }
}

fn invalid_command(why: &str) -> Error {
    Error::invalid_input(format!("invalid command: {why}")).with_code(ErrorCode::InvalidCommand)
}

/// Environment variable names: `[A-Za-z_][A-Za-z0-9_]*`, at most 256 bytes. Stricter than
/// `execve` on purpose: names outside this set do not survive every shell and SDK on the way.
pub fn validate_env_name(name: &str) -> Result<(), Error> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || name.len() > 256 || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(invalid_command(&format!(
            "invalid environment variable name {:?}",
            name.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// OS account names: a name or numeric ID, `[A-Za-z0-9_.-]`, 1–64 bytes, not starting with `-`.
pub fn validate_user(user: &str) -> Result<(), Error> {
    let ok = !user.is_empty()
        && user.len() <= 64
        && !user.starts_with('-')
        && user
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !ok {
        return Err(invalid_command(&format!(
            "invalid user {:?}",
            user.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// The wire form of an [`ExecRequest`] (`{"command":"echo","args":["hi"]}`,
/// `{"command":"ls | wc -l","shell":true}`). Converting it validates everything.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub shell: bool,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<i64>,
}

impl TryFrom<ExecSpec> for ExecRequest {
    type Error = Error;
    fn try_from(spec: ExecSpec) -> Result<Self, Error> {
        let command = if spec.shell {
            if !spec.args.is_empty() {
                return Err(invalid_command(
                    "a shell command takes no separate arguments: put them in the command, or set shell=false",
                ));
            }
            Command::Shell(spec.command)
        } else {
            Command::Argv {
                program: spec.command,
                args: spec.args,
            }
        };
        let request = ExecRequest {
            command,
            stdin: spec.stdin.map(String::into_bytes),
            env: spec.env,
            cwd: spec.cwd.as_deref().map(SandboxPath::new).transpose()?,
            user: spec.user,
            timeout: spec.timeout_ms.map(ExecTimeout::from_millis).transpose()?,
            on_output: None,
        };
        request.validate()?;
        Ok(request)
    }
}

/// The outcome of a command that ran.
///
/// A command that ran out of its timeout is a normal result with `killed == true`, told apart
/// from a command that itself exited 124 or 137; a failure to run at all is an [`Error`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecResult {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The exit status; -1 when the process was killed and no status is known.
    pub exit_code: i32,
    pub duration: Duration,
    /// The command was killed because it exceeded its timeout.
    pub killed: bool,
    /// Output beyond the provider's cap was dropped (the command still ran to completion). A
    /// command's output is untrusted and unbounded; holding all of it would let one `yes`
    /// exhaust the service's memory.
    pub truncated: bool,
}

impl ExecResult {
    /// Exited with status 0 and was not killed.
    pub fn success(&self) -> bool {
        self.exit_code == 0 && !self.killed
    }
    /// Stdout as text, invalid UTF-8 replaced.
    pub fn stdout_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// Stderr as text, invalid UTF-8 replaced.
    pub fn stderr_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn spec(json: &str) -> Result<ExecRequest, Error> {
        let spec: ExecSpec =
            serde_json::from_str(json).map_err(|e| Error::invalid_input(e.to_string()))?;
        ExecRequest::try_from(spec)
    }

    fn refused(json: &str, needle: &str) {
        let err = spec(json).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{json}");
        assert!(err.to_string().contains(needle), "{json}: {err}");
    }

    #[test]
    fn exec_spec_table() {
        let r = spec(r#"{"command":"echo","args":["a","b"],"env":{"X_1":"v"},"cwd":"/workspace","timeout_ms":1500}"#).unwrap();
        assert_eq!(
            r.command,
            Command::Argv {
                program: "echo".into(),
                args: vec!["a".into(), "b".into()]
            }
        );
        assert_eq!(r.timeout.unwrap().get(), Duration::from_millis(1500));
        assert_eq!(
            spec(r#"{"command":"ls | wc -l","shell":true}"#)
                .unwrap()
                .command,
            Command::Shell("ls | wc -l".into())
        );

        refused(
            r#"{"command":"ls","args":["-l"],"shell":true}"#,
            "no separate arguments",
        );
        refused(r#"{"command":""}"#, "program must not be empty");
        refused(r#"{"command":"  ","shell":true}"#, "must not be empty");
        refused(r#"{"command":"echo","timeout_ms":0}"#, "must not be zero");
        refused(r#"{"command":"echo","timeout_ms":-1}"#, "must be positive");
        refused(
            r#"{"command":"echo","timeout_ms":9223372036854775807}"#,
            "exceeds the maximum",
        );
        refused(r#"{"command":"echo","cwd":"relative/dir"}"#, "absolute");
        refused(r#"{"command":"echo","cwd":"/workspace/../etc"}"#, "'..'");
        refused(
            r#"{"command":"echo","env":{"1BAD":"x"}}"#,
            "environment variable name",
        );
        refused(
            r#"{"command":"echo","env":{"A=B":"x"}}"#,
            "environment variable name",
        );
        refused(r#"{"command":"echo","user":"-root"}"#, "invalid user");
        refused(r#"{"command":"echo","args":["a\u0000b"]}"#, "NUL");
        refused(r#"{"command":"echo","bogus":1}"#, "unknown field");
    }

    #[test]
    fn exec_timeout_constructors() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e30] {
            assert_eq!(
                ExecTimeout::from_secs_f64(bad).unwrap_err().code(),
                Some(ErrorCode::InvalidTimeout),
                "{bad}"
            );
        }
        assert_eq!(
            ExecTimeout::from_secs_f64(0.25).unwrap().get(),
            Duration::from_millis(250)
        );
        assert!(ExecTimeout::new(MAX_EXEC_TIMEOUT).is_ok());
        assert!(ExecTimeout::new(MAX_EXEC_TIMEOUT + Duration::from_nanos(1)).is_err());
    }

    #[test]
    fn results_and_labels() {
        let r = ExecResult {
            exit_code: 0,
            ..ExecResult::default()
        };
        assert!(r.success());
        assert!(
            !ExecResult {
                killed: true,
                ..r.clone()
            }
            .success()
        );
        assert_eq!(ExecRequest::shell("secret=1 run").command.label(), "sh -c");
        assert_eq!(ExecRequest::argv("echo", ["tok"]).command.label(), "echo");
    }
}
