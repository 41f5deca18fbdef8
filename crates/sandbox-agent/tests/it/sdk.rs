//! The official E2B Python SDK (PyPI `e2b`, pinned with hashes in `tests/sdk/requirements.lock`)
//! runs `tests/sdk/scenario.py` against the agent: the agent binary is started on the host as
//! this test's child, on a free loopback port, with a temporary home, and the SDK talks to it in
//! debug mode (`E2B_DEBUG=true`, `E2B_SANDBOX_URL` the agent's URL: no control plane, every
//! version gate open). The scenario asserts each SDK result itself; this test asserts that it
//! ran to its last line with nothing failed.
//!
//! Needs the venv's python in `SANDBOX_TEST_E2B_PYTHON` (`cargo xtask sdk-venv` makes the venv
//! and prints the line), so it is ignored in a plain `cargo test`.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The venv's python, set by xtask.
const ENV_PYTHON: &str = "SANDBOX_TEST_E2B_PYTHON";
/// The whole scenario, 50 MiB both ways included, on a slow machine.
const SCENARIO_DEADLINE: Duration = Duration::from_secs(300);

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

/// Waits for `child` up to `deadline`; `None` when it had to be killed.
fn wait_deadline(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The venv's python from [`ENV_PYTHON`], checked; a clear panic when it is missing.
pub(crate) fn venv_python() -> PathBuf {
    let python = PathBuf::from(std::env::var_os(ENV_PYTHON).unwrap_or_else(|| {
        panic!("{ENV_PYTHON} is not set: run `cargo xtask sdk-venv`, which makes the venv and prints it")
    }));
    assert!(
        python.is_absolute() && python.is_file(),
        "{ENV_PYTHON}={}: not an absolute path to a file (`cargo xtask sdk-venv` prints the venv's)",
        python.display()
    );
    python
}

/// Who the scenario must find its commands running as: the agent's default user and,
/// when known, that user's home.
pub(crate) struct Expected<'a> {
    pub(crate) user: &'a str,
    pub(crate) home: Option<&'a str>,
}

/// Runs the scenario with the venv's python against the agent at `url`, with `work` (a path
/// inside the sandbox, existing and empty) as its directory. `context` tells where the agent
/// is when something fails (its log, its container). Panics unless the scenario ran to its
/// summary line with nothing failed; its stdout otherwise.
pub(crate) fn run_scenario(
    url: &str,
    work: &Path,
    expected: &Expected<'_>,
    context: &dyn Fn() -> String,
) -> String {
    let python = venv_python();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/scenario.py");
    let mut run = Command::new(&python);
    run.arg(&scenario)
        .env("E2B_DEBUG", "true")
        .env("E2B_SANDBOX_URL", url)
        .env("SANDBOX_SCENARIO_DIR", work)
        .env("SANDBOX_SCENARIO_USER", expected.user)
        .env_remove("SANDBOX_SCENARIO_HOME")
        .env_remove("E2B_API_KEY")
        .env_remove("E2B_ACCESS_TOKEN")
        .env_remove("SANDBOX_SCENARIO_STEPS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(home) = expected.home {
        run.env("SANDBOX_SCENARIO_HOME", home);
    }
    let mut child = run.spawn().unwrap();
    // Read both pipes on threads, so a chatty scenario cannot fill one and stall.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = wait_deadline(&mut child, SCENARIO_DEADLINE);
    let stdout = out_reader.join().unwrap();
    let stderr = err_reader.join().unwrap();
    let report = format!(
        "scenario status: {status:?}\n--- scenario stdout\n{stdout}\n--- scenario stderr\n{stderr}\n{}",
        context()
    );
    let Some(status) = status else {
        panic!(
            "the scenario did not finish within {}s\n{report}",
            SCENARIO_DEADLINE.as_secs()
        );
    };
    assert!(status.success(), "the scenario failed\n{report}");
    let last = stdout.lines().last().unwrap_or("");
    assert!(
        last.starts_with("scenario: ") && last.ends_with(" passed, 0 failed"),
        "the scenario did not end on its summary line\n{report}"
    );
    stdout
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
