//! The official E2B Python SDK (PyPI `e2b`, pinned with hashes in `tests/sdk/requirements.lock`)
//! runs `tests/sdk/scenario.py` against the agent: the agent binary is started on the host as
//! this test's child, on a free loopback port, with a temporary home, and the SDK talks to it in
//! debug mode (`E2B_DEBUG=true`, `E2B_SANDBOX_URL` the agent's URL: no control plane, every
//! version gate open). The scenario asserts each SDK result itself; this test asserts that it
//! ran to its last line with nothing failed.
//!
//! The driver is `sandbox_testkit::e2b_sdk`, shared with `sdk_debian` and the Docker adapter's
//! channel test. Needs the venv's python in `SANDBOX_TEST_E2B_PYTHON` (`cargo xtask sdk-venv` makes the venv
//! and prints the line), so it is ignored in a plain `cargo test`.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sandbox_testkit::e2b_sdk::{Expected, run_scenario, venv_python};

/// Kills and reaps the agent, and removes its temporary home, however the test ends.
struct Agent {
    child: Child,
    log: PathBuf,
    home: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

impl Agent {
    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

/// A port the kernel just handed out on 127.0.0.1 (free a moment ago; the agent binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The user this test runs as: the agent on the host can only run processes as that user
/// (root in CI), so it is the agent's default user.
fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    assert!(out.status.success(), "id -un failed: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// How the agent is started for the scenario: listening on `port` on loopback, processes run
/// as this test's user and start in `home` (the temporary home) unless a request names a cwd.
fn agent_command(port: u16, home: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"));
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--default-user")
        .arg(current_user())
        .arg("--default-workdir")
        .arg(home)
        .env("HOME", home)
        .current_dir(home);
    cmd
}

/// A fresh directory under the system's temporary directory.
fn temp_home() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("agent-sdk-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(dir.join("scenario")).unwrap();
    dir
}

#[test]
#[ignore = "needs the E2B SDK venv (SANDBOX_TEST_E2B_PYTHON, from `cargo xtask sdk-venv`)"]
fn the_official_python_sdk_passes_its_scenario() {
    venv_python();
    let home = temp_home();
    let work = home.join("scenario");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");

    let log = home.join("agent.log");
    let out = File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let mut cmd = agent_command(port, &home);
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let mut agent = Agent {
        child: cmd.spawn().unwrap(),
        log,
        home: home.clone(),
    };
    // An agent that cannot start (a bad flag, a taken port) says so at once: report that
    // instead of the scenario's wait for /health.
    std::thread::sleep(Duration::from_millis(300));
    if let Some(status) = agent.child.try_wait().unwrap() {
        panic!(
            "the agent exited ({status}) before serving:\n{}",
            agent.log_tail()
        );
    }
    let agent = std::sync::Mutex::new(agent);
    let user = current_user();
    let expected = Expected {
        user: &user,
        home: None,
    };
    let stdout = run_scenario(&url, &work, &expected, &|| {
        let Ok(mut agent) = agent.lock() else {
            return "agent: unknown (lock poisoned)".to_owned();
        };
        let exit = agent.child.try_wait().ok().flatten();
        format!(
            "agent: {}\n--- agent log (last lines)\n{}",
            exit.map_or_else(
                || "still running".to_owned(),
                |s| format!("exited early ({s})")
            ),
            agent.log_tail()
        )
    });
    drop(agent);
    // Shown with --nocapture: the closing note's SDK round trip.
    println!("{stdout}");
}
