//! The driver of the official E2B Python SDK's scenario (`crates/sandbox-agent/tests/sdk/
//! scenario.py`): one place for how it is run and judged, shared by every test that points the
//! SDK at an agent (on the host, in the Debian image, through the Docker adapter's channel).
//!
//! The SDK runs in debug mode (`E2B_DEBUG=true`: no control plane, every version gate open)
//! with `E2B_SANDBOX_URL` the URL under test. The scenario asserts each SDK result itself; the
//! driver asserts that it ran to its summary line with nothing failed. The venv's python comes
//! from [`ENV_PYTHON`] (`cargo xtask sdk-venv` makes the venv and prints the line).
//!
//! [`run_script`] is the runner and judge alone, for a scenario of another shape: the service's
//! E2B API scenario runs the SDK in normal mode against `sandbox serve`
//! (`crates/sandbox-app/tests/e2b/scenario.py`).

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The venv's python, set by xtask.
pub const ENV_PYTHON: &str = "SANDBOX_TEST_E2B_PYTHON";
/// The whole scenario, 50 MiB both ways included, on a slow machine.
pub const SCENARIO_DEADLINE: Duration = Duration::from_secs(300);

/// The scenario script, in the agent's tests.
pub fn scenario_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sandbox-agent/tests/sdk/scenario.py")
}

/// The venv's python from [`ENV_PYTHON`], checked; a clear panic when it is missing.
pub fn venv_python() -> PathBuf {
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
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    pub user: &'a str,
    pub home: Option<&'a str>,
}

/// Waits for `child` up to `deadline`; `None` when it had to be killed.
fn wait_deadline(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(e) => panic!("waiting for the scenario: {e}"),
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs the scenario with the venv's python against the agent at `url`, with `work` (a path
/// inside the sandbox, existing and empty) as its directory. `context` tells where the agent
/// is when something fails (its log, its container). Blocks; panics unless the scenario ran
/// to its summary line (`scenario: N passed, 0 failed`) with nothing failed; its stdout
/// otherwise.
pub fn run_scenario(
    url: &str,
    work: &Path,
    expected: &Expected<'_>,
    context: &dyn Fn() -> String,
) -> String {
    let python = venv_python();
    let mut run = Command::new(&python);
    run.arg(scenario_path())
        .env("E2B_DEBUG", "true")
        .env("E2B_SANDBOX_URL", url)
        .env("SANDBOX_SCENARIO_DIR", work)
        .env("SANDBOX_SCENARIO_USER", expected.user)
        .env_remove("SANDBOX_SCENARIO_HOME")
        .env_remove("E2B_API_KEY")
        .env_remove("E2B_ACCESS_TOKEN")
        .env_remove("SANDBOX_SCENARIO_STEPS");
    if let Some(home) = expected.home {
        run.env("SANDBOX_SCENARIO_HOME", home);
    }
    run_script(run, SCENARIO_DEADLINE, context)
}

/// Runs `run` (a scenario script under the venv's python, its environment set) up to
/// `deadline`, its output captured. `context` tells where the server under test is when
/// something fails (its log). Blocks; panics unless the script exited 0 with its last line
/// `scenario: N passed, 0 failed`; its stdout otherwise.
pub fn run_script(mut run: Command, deadline: Duration, context: &dyn Fn() -> String) -> String {
    run.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = run
        .spawn()
        .unwrap_or_else(|e| panic!("starting {:?}: {e}", run.get_program()));
    // Read both pipes on threads, so a chatty scenario cannot fill one and stall.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut s);
            }
            s
        })
    };
    let out_reader = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let err_reader = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let status = wait_deadline(&mut child, deadline);
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    let report = format!(
        "scenario status: {status:?}\n--- scenario stdout\n{stdout}\n--- scenario stderr\n{stderr}\n{}",
        context()
    );
    let Some(status) = status else {
        panic!(
            "the scenario did not finish within {}s\n{report}",
            deadline.as_secs()
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
