//! The `sandbox` client commands as a user runs them — separate processes talking to a running
//! service over HTTP — against real Docker: `exec` streams live and passes the exit status
//! through, `files put|get|ls` round-trip bytes, `shell` runs in a real pseudo-terminal with raw
//! mode and resizes and restores the terminal afterwards.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::Server;

use std::io::{BufRead as _, Read as _, Write as _};
use std::os::fd::AsFd as _;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TOKEN: &str = "token-cli";
/// Generous: outcomes are asserted, not speed.
const DEADLINE: Duration = Duration::from_secs(60);

fn cli(s: &Server) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandbox"));
    cmd.env("SANDBOX_SERVER", &s.base)
        .env("SANDBOX_TOKEN", TOKEN)
        .env_remove("SANDBOX_TOKEN_FILE")
        .env_remove("SANDBOX_CONFIG");
    cmd
}

/// Runs the CLI to completion off the runtime's threads.
async fn run(mut cmd: Command, stdin: &[u8]) -> Output {
    let stdin = stdin.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&stdin).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn exec_streams_live_and_passes_the_exit_status_through() {
    let s = support::start("tcli", &[TOKEN]).await;

    let mut cmd = cli(&s);
    cmd.args([
        "exec",
        "chat",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    let out = run(cmd, b"").await;
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");

    // Live: the command prints a token, then waits for a file the test creates only after it
    // has read the token from the CLI's stdout.
    let mut cmd = cli(&s);
    cmd.args([
        "exec",
        "--shell",
        "chat",
        "echo ready-$((40+2)); while [ ! -f /workspace/go ]; do sleep 0.1; done; echo finished",
    ]);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stdout);
        let mut line = String::new();
        lines.read_line(&mut line).unwrap();
        (line, lines)
    });
    let (line, mut rest) = tokio::time::timeout(DEADLINE, first)
        .await
        .expect("the first line arrived while the command still runs")
        .unwrap();
    assert_eq!(line, "ready-42\n");
    assert!(
        child.try_wait().unwrap().is_none(),
        "still waiting for the file"
    );
    let (status, r) = s
        .call(
            "POST",
            "/v1/sessions/chat/exec",
            r#"{"command":"touch","args":["/workspace/go"]}"#,
        )
        .await;
    assert_eq!((status, r["exit_code"].as_i64()), (200, Some(0)), "{r}");
    let status = tokio::task::spawn_blocking(move || {
        let mut tail = String::new();
        rest.read_to_string(&mut tail).unwrap();
        (child.wait().unwrap(), tail)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "{status:?}");
    assert_eq!(status.1, "finished\n");

    // Options: env, cwd, stdin, timeout.
    let mut cmd = cli(&s);
    cmd.args(["exec", "chat", "mkdir", "-p", "/workspace/sub"]);
    assert!(run(cmd, b"").await.status.success());
    let mut cmd = cli(&s);
    cmd.args([
        "exec",
        "--env",
        "GREETING=hi there",
        "--cwd",
        "/workspace/sub",
        "--stdin",
        "chat",
        "--",
        "sh",
        "-c",
        "echo \"$GREETING\"; pwd; cat",
    ]);
    let out = run(cmd, b"from stdin\n").await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "hi there\n/workspace/sub\nfrom stdin\n");
    let mut cmd = cli(&s);
    cmd.args(["exec", "--timeout", "1", "chat", "sleep", "30"]);
    let out = run(cmd, b"").await;
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(
        text(&out.stderr).contains("killed at its timeout"),
        "{out:?}"
    );

    // Errors: a wrong token, a server that is not there.
    let mut cmd = cli(&s);
    cmd.env("SANDBOX_TOKEN", "wrong")
        .args(["exec", "chat", "true"]);
    let out = run(cmd, b"").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("unauthorized"), "{out:?}");
    let mut cmd = cli(&s);
    cmd.env("SANDBOX_SERVER", "http://127.0.0.1:9")
        .args(["exec", "chat", "true"]);
    let out = run(cmd, b"").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("is `sandbox serve` running"),
        "{out:?}"
    );
    assert_eq!(s.containers().await, 1, "one session, one container");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn files_round_trip_through_the_cli() {
    let s = support::start("tclifiles", &[TOKEN]).await;
    let dir = std::env::temp_dir().join(format!("sbx-cli-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let local = dir.join("blob.bin");
    let payload: Vec<u8> = (0..5 * 1024 * 1024).map(|_| fastrand::u8(..)).collect();
    std::fs::write(&local, &payload).unwrap();

    let mut cmd = cli(&s);
    cmd.args(["files", "put", "docs"])
        .arg(&local)
        .arg("/workspace/data/blob.bin");
    let out = run(cmd, b"").await;
    assert!(out.status.success(), "{out:?}");

    let back = dir.join("back.bin");
    let mut cmd = cli(&s);
    cmd.args(["files", "get", "docs", "/workspace/data/blob.bin", "-o"])
        .arg(&back);
    let out = run(cmd, b"").await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        std::fs::read(&back).unwrap() == payload,
        "the bytes came back unchanged"
    );

    // stdin in, stdout out.
    let mut cmd = cli(&s);
    cmd.args(["files", "put", "docs", "-", "/workspace/note.txt"]);
    assert!(run(cmd, b"note\n").await.status.success());
    let mut cmd = cli(&s);
    cmd.args(["files", "get", "docs", "/workspace/note.txt"]);
    let out = run(cmd, b"").await;
    assert_eq!(text(&out.stdout), "note\n");

    let mut cmd = cli(&s);
    cmd.args(["files", "ls", "docs", "--depth", "2"]);
    let out = run(cmd, b"").await;
    assert!(out.status.success(), "{out:?}");
    let listing = text(&out.stdout);
    assert!(
        listing.contains(&format!("- {} /workspace/data/blob.bin\n", payload.len())),
        "{listing}"
    );
    assert!(listing.contains("/workspace/data/\n"), "{listing}");
    assert!(listing.contains("/workspace/note.txt\n"), "{listing}");

    // The attachments rule holds through the CLI too.
    let mut cmd = cli(&s);
    cmd.args(["files", "put", "docs", "-", "/workspace/input/a.txt"]);
    let out = run(cmd, b"a").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("invalid_path"), "{out:?}");
    let mut cmd = cli(&s);
    cmd.args([
        "files",
        "put",
        "--attachment",
        "docs",
        "-",
        "/workspace/input/a.txt",
    ]);
    assert!(run(cmd, b"a").await.status.success());

    // A failed download leaves no file behind under the name.
    let missing = dir.join("missing.bin");
    let mut cmd = cli(&s);
    cmd.args(["files", "get", "docs", "/workspace/none", "-o"])
        .arg(&missing);
    let out = run(cmd, b"").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("not_found"), "{out:?}");
    assert!(std::fs::read_dir(&dir).unwrap().all(|e| {
        let name = e.unwrap().file_name();
        name != "missing.bin" && !name.to_string_lossy().contains("partial")
    }));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A pseudo-terminal the test owns: the CLI gets the secondary side as its stdin, stdout and
/// stderr; the test types into and reads from the primary side.
struct Pty {
    primary: std::fs::File,
    secondary: std::fs::File,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    fn open(cols: u16, rows: u16) -> Pty {
        use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
        let primary = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
        grantpt(&primary).unwrap();
        unlockpt(&primary).unwrap();
        let name = ptsname(&primary, Vec::new()).unwrap();
        let secondary = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(name.to_str().unwrap())
            .unwrap();
        let primary = std::fs::File::from(primary);
        let pty = Pty {
            primary,
            secondary,
            output: Arc::new(Mutex::new(Vec::new())),
        };
        pty.resize(cols, rows);
        let (mut reader, output) = (pty.primary.try_clone().unwrap(), pty.output.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                output.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        pty
    }

    fn resize(&self, cols: u16, rows: u16) {
        let size = rustix::termios::Winsize {
            ws_col: cols,
            ws_row: rows,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(self.secondary.as_fd(), size).unwrap();
    }

    fn type_keys(&mut self, keys: &str) {
        self.primary.write_all(keys.as_bytes()).unwrap();
    }

    fn seen(&self) -> String {
        text(&self.output.lock().unwrap())
    }

    /// Waits until the output contains `needle` (typing `retype` again every second while it
    /// does not, for things that take effect asynchronously, like a resize).
    async fn expect(&mut self, needle: &str, retype: Option<&str>) {
        let start = Instant::now();
        let mut last_typed = Instant::now();
        while !self.seen().contains(needle) {
            assert!(
                start.elapsed() < DEADLINE,
                "no {needle:?} in the terminal output:\n{}",
                self.seen()
            );
            if let Some(keys) = retype
                && last_typed.elapsed() > Duration::from_secs(1)
            {
                self.type_keys(keys);
                last_typed = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn spawn(&self, mut cmd: Command) -> Child {
        cmd.stdin(self.secondary.try_clone().unwrap())
            .stdout(self.secondary.try_clone().unwrap())
            .stderr(self.secondary.try_clone().unwrap())
            .spawn()
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn shell_runs_in_a_real_terminal_with_raw_mode_and_resize() {
    let s = support::start("tclishell", &[TOKEN]).await;
    let mut pty = Pty::open(100, 30);
    let before = rustix::termios::tcgetattr(pty.secondary.as_fd()).unwrap();
    assert!(
        before
            .local_modes
            .contains(rustix::termios::LocalModes::ICANON),
        "a fresh terminal starts in canonical mode"
    );

    // The session has no sandbox yet: the shell provisions it.
    let mut cmd = cli(&s);
    cmd.args(["shell", "term"]);
    let mut child = pty.spawn(cmd);

    pty.type_keys("echo tok$((6*7))\r");
    pty.expect("tok42", None).await;
    // Raw mode: the local terminal does not echo or buffer lines while the shell runs (the
    // remote PTY does the echoing).
    let during = rustix::termios::tcgetattr(pty.secondary.as_fd()).unwrap();
    assert!(
        !during
            .local_modes
            .contains(rustix::termios::LocalModes::ICANON)
    );
    assert!(
        !during
            .local_modes
            .contains(rustix::termios::LocalModes::ECHO)
    );

    // The initial size travelled with the upgrade.
    pty.type_keys("stty size\r");
    pty.expect("30 100", None).await;

    // A resize of the user's terminal follows (the kernel sends SIGWINCH only to a controlling
    // terminal's foreground group, so the test sends it as a terminal emulator's kernel would).
    pty.resize(120, 40);
    let pid = child.id().to_string();
    let winch = Command::new("kill")
        .args(["-WINCH", &pid])
        .status()
        .unwrap();
    assert!(winch.success());
    pty.type_keys("stty size\r");
    pty.expect("40 120", Some("stty size\r")).await;

    // Reattach: the service named the terminal's pid on stderr; this client vanishes (SIGKILL:
    // it says nothing), and `sandbox shell --pid N` finds the same shell, its variable set.
    pty.type_keys("export KEEP=kept$((6*7)); echo ex\"\"ported\r");
    pty.expect("exported", None).await;
    let seen = pty.seen();
    let term_pid: u32 = seen
        .split("sandbox: terminal pid ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no pid note in the output:\n{seen}"));
    child.kill().unwrap();
    child.wait().unwrap();
    // The killed client could not restore the mode; the next one restores what it found.
    rustix::termios::tcsetattr(
        pty.secondary.as_fd(),
        rustix::termios::OptionalActions::Now,
        &before,
    )
    .unwrap();
    let mut cmd = cli(&s);
    cmd.args(["shell", "term", "--pid", &term_pid.to_string()]);
    let mut child = pty.spawn(cmd);
    pty.type_keys("echo \"[$KEEP]\"\r");
    pty.expect("[kept42]", Some("echo \"[$KEEP]\"\r")).await;

    pty.type_keys("exit 3\r");
    let status = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < DEADLINE, "sandbox shell did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(3), "the shell's exit status");
    let after = rustix::termios::tcgetattr(pty.secondary.as_fd()).unwrap();
    assert_eq!(
        after.local_modes, before.local_modes,
        "the terminal mode is restored"
    );
    assert_eq!(s.containers().await, 1);
}
