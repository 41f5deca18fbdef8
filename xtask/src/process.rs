//! External commands with deadlines.
//!
//! Every command xtask runs goes through [`run_with_deadline`]: a hung `docker build` or a wedged
//! `cargo` must end the run with a clear message, not stall CI until its own time limit.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How often a running child is polled for exit.
const POLL: Duration = Duration::from_millis(50);

/// How long we keep reading a child's pipes after it exited: a grandchild that outlived it
/// (a daemon, a killed compiler's helper) may hold them open forever.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Which stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What to do with a child's output.
pub enum Output<'a> {
    /// The child writes straight to our stdout/stderr (cargo keeps its progress bars and colours).
    Inherit,
    /// Collect stdout and stderr; nothing is shown.
    Capture,
    /// Collect stdout and stderr and hand every line (without its newline) to the callback as it
    /// arrives, so long commands show progress.
    Stream(&'a mut dyn FnMut(Stream, &str)),
}

impl std::fmt::Debug for Output<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Inherit => "Inherit",
            Self::Capture => "Capture",
            Self::Stream(_) => "Stream",
        })
    }
}

/// How a command ended.
#[derive(Debug)]
pub struct Outcome {
    /// Shown in messages: the program and its arguments.
    pub command: String,
    /// `None` when the deadline passed and the child (and its descendants) were killed.
    pub status: Option<ExitStatus>,
    /// Empty in [`Output::Inherit`] mode.
    pub stdout: String,
    /// Empty in [`Output::Inherit`] mode.
    pub stderr: String,
    pub elapsed: Duration,
    pub deadline: Duration,
}

impl Outcome {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    pub fn timed_out(&self) -> bool {
        self.status.is_none()
    }

    /// One line saying how the command ended, e.g. "`docker version` exited with status 1".
    pub fn describe(&self) -> String {
        match self.status {
            None => format!(
                "`{}` did not finish within its {}s deadline and was killed",
                self.command,
                self.deadline.as_secs()
            ),
            Some(status) if status.success() => format!("`{}` succeeded", self.command),
            Some(status) => format!("`{}` failed ({status})", self.command),
        }
    }

    /// `Ok` on success, else [`Outcome::describe`] plus the tail of stderr (when captured).
    pub fn check(&self) -> Result<(), String> {
        if self.success() {
            return Ok(());
        }
        let mut msg = self.describe();
        let tail = tail_lines(self.stderr.trim_end(), 20);
        if !tail.is_empty() {
            msg.push_str(":\n");
            msg.push_str(&tail);
        }
        Err(msg)
    }
}

/// Renders a command for messages: program and arguments, space-separated.
pub fn render(cmd: &Command) -> String {
    // `/root/.rustup/toolchains/.../bin/cargo` reads better as `cargo`.
    let program = Path::new(cmd.get_program());
    let program = program.file_name().unwrap_or(program.as_os_str());
    let mut parts = vec![program.to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(char::is_whitespace) {
            format!("'{a}'")
        } else {
            a.into_owned()
        }
    }));
    parts.join(" ")
}

/// Runs `cmd` to completion or until `deadline` passes, whichever comes first.
///
/// On timeout the child and every process descended from it are killed (SIGKILL), so a `cargo`
/// that hangs in a test binary does not leave the test binary behind. Stdin is always null:
/// CI has none and nothing we run should wait for a keyboard.
///
/// Errors only when the command cannot be started; a failing or timed-out command is an
/// [`Outcome`].
pub fn run_with_deadline(
    cmd: &mut Command,
    deadline: Duration,
    mut output: Output<'_>,
) -> Result<Outcome, String> {
    let command = render(cmd);
    let capture = !matches!(output, Output::Inherit);
    cmd.stdin(Stdio::null());
    if capture {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    } else {
        cmd.stdout(Stdio::inherit()).stderr(Stdio::inherit());
    }
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start `{command}`: {e}"))?;

    let (tx, rx) = mpsc::channel::<Option<(Stream, String)>>();
    let mut open_pipes = 0;
    if capture {
        if let Some(out) = child.stdout.take() {
            spawn_reader(out, Stream::Stdout, tx.clone());
            open_pipes += 1;
        }
        if let Some(err) = child.stderr.take() {
            spawn_reader(err, Stream::Stderr, tx.clone());
            open_pipes += 1;
        }
    }
    drop(tx);

    let mut stdout = String::new();
    let mut stderr = String::new();
    let mut on_line = |stream: Stream, line: String| {
        if let Output::Stream(sink) = &mut output {
            sink(stream, &line);
        }
        let buf = match stream {
            Stream::Stdout => &mut stdout,
            Stream::Stderr => &mut stderr,
        };
        buf.push_str(&line);
        buf.push('\n');
    };

    let hard_stop = start + deadline;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => {
                kill_tree(&mut child);
                return Err(format!("cannot wait for `{command}`: {e}"));
            }
        }
        if Instant::now() >= hard_stop {
            kill_tree(&mut child);
            break None;
        }
        if open_pipes > 0 {
            match rx.recv_timeout(POLL) {
                Ok(Some((stream, line))) => on_line(stream, line),
                Ok(None) => open_pipes -= 1,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => open_pipes = 0,
            }
        } else {
            thread::sleep(POLL);
        }
    };

    // The child is gone; collect what is still in the pipes.
    let drain_until = Instant::now() + DRAIN_GRACE;
    while open_pipes > 0 {
        let left = drain_until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match rx.recv_timeout(left) {
            Ok(Some((stream, line))) => on_line(stream, line),
            Ok(None) => open_pipes -= 1,
            Err(_) => break,
        }
    }

    Ok(Outcome {
        command,
        status,
        stdout,
        stderr,
        elapsed: start.elapsed(),
        deadline,
    })
}

/// Reads `pipe` line by line into `tx`; `None` marks the end of the pipe.
fn spawn_reader(
    pipe: impl Read + Send + 'static,
    stream: Stream,
    tx: mpsc::Sender<Option<(Stream, String)>>,
) {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.trim_end_matches(['\n', '\r']).to_owned();
                    if tx.send(Some((stream, line))).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(None);
    });
}

/// Kills `child` and all its descendants. Descendants are collected first: once the child is
/// dead they are re-parented and can no longer be found from it.
pub fn kill_tree(child: &mut Child) {
    let descendants = descendants(child.id());
    if !descendants.is_empty() {
        let _ = send_signal_many(&descendants, "KILL");
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Stops a child we started: SIGTERM, up to `deadline` for a clean exit, then SIGKILL (the child
/// and its descendants). `Err` says it had to be killed; either way it is gone and reaped.
pub fn terminate(child: &mut Child, deadline: Duration) -> Result<(), String> {
    if let Ok(Some(_)) = child.try_wait() {
        return Ok(());
    }
    send_signal(child.id(), "TERM")?;
    let start = Instant::now();
    while start.elapsed() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(100));
    }
    kill_tree(child);
    Err(format!(
        "pid {} ignored SIGTERM for {}s and was killed",
        child.id(),
        deadline.as_secs()
    ))
}

/// Sends a signal (`"TERM"`, `"KILL"`, ...) to one process.
///
/// Goes through the `kill` program because the workspace denies `unsafe_code`, and std only
/// knows SIGKILL for its own children.
pub fn send_signal(pid: u32, signal: &str) -> Result<(), String> {
    send_signal_many(&[pid], signal)
}

fn send_signal_many(pids: &[u32], signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg("-s")
        .arg(signal)
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run `kill`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`kill -s {signal}` failed ({status})"))
    }
}

/// Every live process whose ancestry leads to `root` (not `root` itself), from `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut parent_of = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
            && let Some(ppid) = parse_ppid(&stat)
        {
            parent_of.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for &(pid, ppid) in &parent_of {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
            }
        }
        i += 1;
    }
    found.remove(0);
    found
}

/// The parent pid from a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses
/// and may itself contain spaces and parentheses, so fields are counted from the last `)`.
fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Finds an executable on `PATH` (plus the sbin directories, where `dockerd` lives and which a
/// non-root `PATH` often lacks).
pub fn find_executable(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from);
    std::env::split_paths(&path)
        .chain(extra)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether we run as root (uid 0), read from `/proc/self/status`.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().next())
            == Some("0")
    })
}

/// The last `n` lines of `text`.
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A `Command` for `program` with `args`, for the common case.
pub fn command<I, S>(program: impl AsRef<OsStr>, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        command("sh", ["-c", script])
    }

    #[test]
    fn captures_both_streams_and_status() {
        let out = run_with_deadline(
            &mut sh("echo out; echo err >&2; exit 3"),
            Duration::from_secs(10),
            Output::Capture,
        )
        .unwrap();
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\n");
        assert_eq!(out.status.and_then(|s| s.code()), Some(3));
        assert!(!out.success());
        assert!(out.check().unwrap_err().contains("err"));
    }

    #[test]
    fn streams_lines_as_they_arrive() {
        let mut seen = Vec::new();
        let mut sink = |s: Stream, l: &str| seen.push((s, l.to_owned()));
        let out = run_with_deadline(
            &mut sh("echo a; echo b >&2; echo c"),
            Duration::from_secs(10),
            Output::Stream(&mut sink),
        )
        .unwrap();
        assert!(out.success());
        assert_eq!(out.stdout, "a\nc\n");
        assert!(seen.contains(&(Stream::Stdout, "a".into())));
        assert!(seen.contains(&(Stream::Stderr, "b".into())));
    }

    #[test]
    fn kills_the_whole_tree_at_the_deadline() {
        // The grandchild `sleep` holds the pipes; it must die too or we would wait forever.
        let start = Instant::now();
        let out = run_with_deadline(
            &mut sh("sleep 30 & sleep 30; echo never"),
            Duration::from_millis(300),
            Output::Capture,
        )
        .unwrap();
        assert!(out.timed_out());
        assert!(out.describe().contains("deadline"));
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn missing_program_is_an_error() {
        let err = run_with_deadline(
            &mut command("/nonexistent/xtask-no-such-program", [""; 0]),
            Duration::from_secs(1),
            Output::Capture,
        )
        .unwrap_err();
        assert!(err.contains("cannot start"));
    }

    #[test]
    fn ppid_survives_odd_command_names() {
        assert_eq!(parse_ppid("123 (a b) c) S 45 123 123 0"), Some(45));
        assert_eq!(parse_ppid("garbage"), None);
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail_lines("a\nb\nc", 2), "b\nc");
        assert_eq!(tail_lines("a", 5), "a");
    }
}
