//! `sandbox doctor` against the real engine: a working setup passes (exit 0) and says, as
//! warnings, what this engine does not enforce — the writable-layer limit where the storage
//! cannot hold it, and root not remapped when neither userns-remap nor gVisor is active.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`. Doctor creates nothing, so there is nothing to clean up.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::process::Command;

use serde_json::Value;

fn doctor(namespace: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .arg("doctor")
        .env_remove("SANDBOX_CONFIG")
        .env_remove("DOCKER_HOST")
        .env("SANDBOX_DOCKER_ENABLED", "true")
        .env("SANDBOX_DOCKER_IMAGE", "sandbox-busybox:test")
        .env("SANDBOX_DOCKER_AGENT_PATH", crate::support::agent_bin())
        .env("SANDBOX_DOCKER_NAMESPACE", namespace)
        .env("SANDBOX_DOCKER_NETWORK", "none")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The report's line for check `name`.
fn line<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.contains(&format!("] {name}: ")))
        .unwrap_or_else(|| panic!("no {name} check in:\n{out}"))
}

/// The engine's own `docker info`, which the expectations below are read from.
fn engine_info() -> Value {
    let out = Command::new("docker")
        .args(["info", "--format", "{{json .}}"])
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap();
    assert!(out.status.success(), "docker info failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
fn doctor_warns_of_what_the_engine_does_not_enforce_and_still_passes() {
    let info = engine_info();
    let backing = info["DriverStatus"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|pair| pair[0] == "Backing Filesystem")
        .and_then(|pair| pair[1].as_str().map(str::to_owned));
    let remapped = info["SecurityOptions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|o| o.contains("name=userns") || o.contains("name=rootless"));
    let gvisor = info["DefaultRuntime"] == "runsc";

    let (code, out) = doctor(&format!("tdoc-{:08x}", fastrand::u32(..)));
    assert_eq!(code, 0, "warnings must not fail a working setup:\n{out}");
    assert!(out.contains("all checks passed"), "{out}");
    assert!(line(&out, "docker logs").contains("1048576 bytes"), "{out}");
    let disk = line(&out, "docker disk");
    if info["Driver"] == "overlay2" && backing.as_deref() == Some("extfs") {
        assert!(disk.starts_with("[warn]"), "{out}");
        assert!(disk.contains("not enforced"), "{out}");
        assert!(disk.contains("overlay2 on extfs"), "{out}");
    }
    let isolation = line(&out, "docker isolation");
    if remapped || gvisor {
        assert!(isolation.starts_with("[ ok ]"), "{out}");
    } else {
        assert!(isolation.starts_with("[warn]"), "{out}");
        assert!(isolation.contains("userns-remap is not active"), "{out}");
        assert!(isolation.contains("runsc (gVisor)"), "{out}");
        assert!(
            out.contains("\"userns-remap\": \"default\"")
                && out.contains("docker.runtime = \"runsc\""),
            "the fix names both remedies:\n{out}"
        );
    }
}

#[test]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
fn doctor_fails_a_runtime_the_engine_does_not_have() {
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .arg("doctor")
        .env_remove("SANDBOX_CONFIG")
        .env_remove("DOCKER_HOST")
        .env("SANDBOX_DOCKER_ENABLED", "true")
        .env("SANDBOX_DOCKER_IMAGE", "sandbox-busybox:test")
        .env("SANDBOX_DOCKER_AGENT_PATH", crate::support::agent_bin())
        .env(
            "SANDBOX_DOCKER_NAMESPACE",
            format!("tdoc-{:08x}", fastrand::u32(..)),
        )
        .env("SANDBOX_DOCKER_NETWORK", "none")
        .env("SANDBOX_DOCKER_RUNTIME", "sbx-no-such-runtime")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_ne!(out.status.code(), Some(0), "{text}");
    let runtime = line(&text, "docker runtime");
    assert!(runtime.starts_with("[FAIL]"), "{text}");
    assert!(runtime.contains("sbx-no-such-runtime"), "{text}");
}

/// `sandbox doctor` in agent mode with the agent at `agent_path`.
fn doctor_agent_mode(agent_path: &std::path::Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .arg("doctor")
        .env_remove("SANDBOX_CONFIG")
        .env_remove("DOCKER_HOST")
        .env("SANDBOX_DOCKER_ENABLED", "true")
        .env("SANDBOX_DOCKER_IMAGE", "sandbox-busybox:test")
        .env(
            "SANDBOX_DOCKER_NAMESPACE",
            format!("tdoc-{:08x}", fastrand::u32(..)),
        )
        .env("SANDBOX_DOCKER_NETWORK", "none")
        .env("SANDBOX_DOCKER_DATA_PLANE", "agent")
        .env("SANDBOX_DOCKER_AGENT_PATH", agent_path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
fn doctor_reports_the_agent_data_plane_and_fails_an_agent_that_is_not_this_one() {
    let agent = crate::support::agent_bin();
    let (code, out) = doctor_agent_mode(&agent);
    assert_eq!(code, 0, "{out}");
    let plane = line(&out, "docker data plane");
    assert!(plane.starts_with("[ ok ]"), "{out}");
    assert!(
        plane.contains(&format!("agent: {}", agent.display()))
            && plane.contains(env!("CARGO_PKG_VERSION"))
            && plane.contains("go over one kept exec channel"),
        "{out}"
    );

    // Static, but not this agent: busybox answers `--version` with no version.
    let dir = std::env::temp_dir().join(format!("sbx-doctor-agent-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let impostor = dir.join("sandbox-agent");
    std::fs::copy("/bin/busybox", &impostor).unwrap();
    let (code, out) = doctor_agent_mode(&impostor);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_ne!(code, 0, "{out}");
    let plane = line(&out, "docker data plane");
    assert!(
        plane.starts_with("[FAIL]") && plane.contains("--version"),
        "{out}"
    );
    assert!(out.contains("fix: run `cargo xtask agent`"), "{out}");
    // The engine is still checked, so one run shows every problem.
    assert!(line(&out, "docker engine").starts_with("[ ok ]"), "{out}");
}
