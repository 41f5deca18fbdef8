//! The official E2B Python SDK's scenario (`tests/sdk/scenario.py`, the same one `sdk` runs on
//! the host) against the agent as PID 1 of a container of the Debian sandbox image: the
//! sandbox the SDK expects, with its `user` account (home `/home/user`), `/bin/bash -l` and
//! coreutils, where the agent really switches to an unprivileged user for every process.
//!
//! The static agent (`SANDBOX_AGENT_BIN`, built by `cargo xtask agent`) is copied into a
//! created container at `/.sandbox/sandbox-agent` with `docker cp` (no mount of the host's
//! target directory), then the container is started. No port is published: the test dials the
//! container's address on Docker's local bridge, which never leaves the machine. The image's
//! tag comes from `SANDBOX_TEST_DEBIAN_IMAGE` (`cargo xtask debian-image` prints it), the SDK's
//! python from `SANDBOX_TEST_E2B_PYTHON`; the e2b sdk stage of `cargo xtask test` sets all three.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Tells the test which image to run (the tag is a hash of the image's recipe).
const ENV_IMAGE: &str = "SANDBOX_TEST_DEBIAN_IMAGE";
/// The static agent to copy in.
const ENV_AGENT_BIN: &str = "SANDBOX_AGENT_BIN";
/// Where the agent lives in every Docker sandbox.
const AGENT_DIR: &str = "/.sandbox";
const AGENT_PATH: &str = "/.sandbox/sandbox-agent";
/// envd's port, which the SDK also names in its `E2b-Sandbox-Port` header.
const PORT: u16 = 49983;
/// The image's account and its home, as the SDKs expect.
const USER: &str = "user";
const HOME: &str = "/home/user";
/// The scenario's own directory inside the sandbox, made by the user so it owns it.
const WORK: &str = "/home/user/scenario";

fn env_path(name: &str, how: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: {how}"))
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A container of the Debian image whose PID 1 is the agent; removed on drop, however the
/// test ends.
pub(crate) struct DebianAgent {
    pub(crate) id: String,
    pub(crate) url: String,
}

impl Drop for DebianAgent {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v", &self.id])
            .output();
    }
}

impl DebianAgent {
    /// Creates the container, copies the agent in, starts it and finds its bridge address.
    pub(crate) fn start() -> DebianAgent {
        let image = env_path(
            ENV_IMAGE,
            "`cargo xtask debian-image` builds the image and prints its tag",
        );
        let bin = PathBuf::from(env_path(
            ENV_AGENT_BIN,
            "`cargo xtask agent` builds the static agent and prints its path",
        ));
        assert!(
            bin.is_file(),
            "{ENV_AGENT_BIN}={} is not a file",
            bin.display()
        );
        let listen = format!("0.0.0.0:{PORT}");
        let id = docker(&[
            "create",
            "--label",
            "sandbox.test=sdk_debian",
            image.as_str(),
            AGENT_PATH,
            "--listen",
            &listen,
            "--default-user",
            USER,
            "--default-workdir",
            HOME,
        ]);
        // From here on the guard removes the container, even when a step below panics.
        let mut container = DebianAgent {
            id,
            url: String::new(),
        };
        copy_agent(&container.id, &bin);
        docker(&["start", &container.id]);
        let ip = docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &container.id,
        ]);
        let ip: Ipv4Addr = ip
            .parse()
            .unwrap_or_else(|_| panic!("no bridge address for the container: {ip:?}"));
        container.url = format!("http://{ip}:{PORT}");
        container
    }

    /// The agent's log (its stderr) and what Docker says of the container.
    pub(crate) fn context(&self) -> String {
        let logs = Command::new("docker")
            .args(["logs", "--tail", "60", &self.id])
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_else(|e| format!("docker logs: {e}"));
        let state = Command::new("docker")
            .args([
                "inspect",
                "-f",
                "{{.State.Status}} exit {{.State.ExitCode}}",
                &self.id,
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|e| format!("docker inspect: {e}"));
        format!(
            "container {} ({state}), agent at {}\n--- agent log (last lines)\n{logs}",
            self.id, self.url
        )
    }
}

/// Copies the static agent to [`AGENT_PATH`] of the created container: `docker cp` of a
/// directory named like [`AGENT_DIR`] makes the directory, which a plain file copy would not.
fn copy_agent(id: &str, bin: &Path) {
    let staging = tempfile::tempdir().unwrap();
    let dir = staging.path().join(AGENT_DIR.trim_start_matches('/'));
    std::fs::create_dir(&dir).unwrap();
    let copy = dir.join("sandbox-agent");
    std::fs::copy(bin, &copy).unwrap();
    let src = dir.display().to_string();
    docker(&["cp", &src, &format!("{id}:/")]);
}

#[test]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE), the static agent (SANDBOX_AGENT_BIN) and the SDK venv (the e2b sdk stage)"]
fn the_official_python_sdk_passes_its_scenario_in_the_debian_image() {
    sandbox_testkit::e2b_sdk::venv_python();
    let agent = DebianAgent::start();
    let init = docker(&["exec", &agent.id, "cat", "/proc/1/cmdline"]);
    assert!(
        init.starts_with(AGENT_PATH),
        "PID 1 is {init:?}, not the agent"
    );
    docker(&["exec", "-u", USER, &agent.id, "mkdir", "-p", WORK]);
    let expected = sandbox_testkit::e2b_sdk::Expected {
        user: USER,
        home: Some(HOME),
    };
    let stdout =
        sandbox_testkit::e2b_sdk::run_scenario(&agent.url, Path::new(WORK), &expected, &|| {
            agent.context()
        });
    drop(agent);
    // Shown with --nocapture: the SDK's round trip against the agent in the Debian image.
    println!("{stdout}");
}
