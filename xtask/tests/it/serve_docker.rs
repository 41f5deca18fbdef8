//! The README's run command, `cargo xtask serve`, as a user runs it: it prepares the engine and
//! the image, builds `sandbox`, becomes `sandbox serve` with the Docker backend on, and the
//! `sandbox` CLI gets an exec through it. SIGTERM then ends the service cleanly.
//!
//! Needs the engine (it starts dockerd only when none answers): ignored in a plain `cargo test`,
//! run by the docker stage of `cargo xtask test`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: the command may build `sandbox` before it serves.
const START_DEADLINE: Duration = Duration::from_secs(600);
const EXIT_DEADLINE: Duration = Duration::from_secs(30);

fn remove_namespace_containers(namespace: &str) {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label=sandbox.namespace={namespace}"))
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap();
    for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let _ = Command::new("docker").args(["rm", "-f", id]).output();
    }
}

fn exec(sandbox: &Path, server: &str, token_file: &Path, argv: &[&str]) -> Option<String> {
    let out = Command::new(sandbox)
        .args(["exec", "probe", "--"])
        .args(argv)
        .env("SANDBOX_SERVER", server)
        .env("SANDBOX_TOKEN_FILE", token_file)
        .env_remove("SANDBOX_TOKEN")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
#[ignore = "needs a Docker engine: cargo xtask test runs it"]
fn the_readme_run_command_serves_on_the_embedded_defaults() {
    assert_eq!(serve_and_exec(&[], &["echo", "served"]), "served\n");
}

/// `--debian`: the sandboxes boot the Debian sandbox image (built by the fixtures stage, or
/// here when missing), with the `user` account the SDKs expect.
#[test]
#[ignore = "needs a Docker engine and the Debian image: cargo xtask test runs it"]
fn serve_debian_boots_the_debian_sandbox_image() {
    let answer = serve_and_exec(
        &["--debian"],
        &["sh", "-c", "test -f /etc/debian_version && id -u user"],
    );
    assert_eq!(answer, "1000\n");
}

/// Runs `cargo xtask serve <args>` in a namespace of its own, execs `argv` in a sandbox through
/// the `sandbox` CLI once it serves, SIGTERMs it (it must exit 0), and returns the output.
fn serve_and_exec(args: &[&str], argv: &[&str]) -> String {
    let root = xtask::workspace::root();
    let target = xtask::workspace::target_dir(&root, &xtask::workspace::cargo());
    let sandbox = target.join("debug").join("sandbox");
    let dir = std::env::temp_dir().join(format!("xtask-serve-{:08x}", fastrand_u32()));
    std::fs::create_dir_all(&dir).unwrap();
    let (token_file, log) = (dir.join("dev-token"), dir.join("serve.log"));
    let namespace = format!("txserve-{:08x}", fastrand_u32());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("http://127.0.0.1:{port}");
    let log_file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("serve")
        .args(args)
        .current_dir(&root)
        .env("SANDBOX_LISTEN", format!("127.0.0.1:{port}"))
        .env("SANDBOX_DOCKER_NAMESPACE", &namespace)
        .env("SANDBOX_DOCKER_NETWORK", "none")
        .env("SANDBOX_DEV_TOKEN_FILE", &token_file)
        .env_remove("SANDBOX_CONFIG")
        .env_remove("SANDBOX_DOCKER_ENABLED")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .unwrap();

    let start = Instant::now();
    let answer = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "cargo xtask serve exited with {status}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if token_file.exists()
            && let Some(out) = exec(&sandbox, &server, &token_file, argv)
        {
            break out;
        }
        if start.elapsed() > START_DEADLINE {
            let _ = child.kill();
            panic!(
                "cargo xtask serve did not serve within {START_DEADLINE:?}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("xtask serve: exec"), "{text}");
    assert!(text.contains("sandbox service listening"), "{text}");

    // The process is now `sandbox serve` itself: SIGTERM drains it and it exits 0.
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < EXIT_DEADLINE,
            "serve did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    remove_namespace_containers(&namespace);
    let _ = std::fs::remove_dir_all(&dir);
    answer
}

/// A random tag without a dependency (xtask keeps its dependencies to JSON).
fn fastrand_u32() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}
