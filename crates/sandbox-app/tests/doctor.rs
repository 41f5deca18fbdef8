//! `sandbox doctor` explains what is wrong and exits non-zero: with the Docker backend
//! disabled, pointed at a socket that does not exist, or not compiled in at all. (Hermetic: no
//! case touches an engine.)

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::process::Command;

fn doctor(env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandbox"));
    cmd.arg("doctor")
        .env_remove("SANDBOX_CONFIG")
        .env_remove("DOCKER_HOST")
        .env_remove("SANDBOX_DOCKER_ENABLED");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[cfg(feature = "docker")]
#[test]
fn a_disabled_backend_names_the_setting_and_fails() {
    let (code, out) = doctor(&[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("[FAIL] docker backend"), "{out}");
    assert!(out.contains("SANDBOX_DOCKER_ENABLED=true"), "{out}");
}

#[cfg(feature = "docker")]
#[test]
fn a_dead_socket_says_how_to_fix_it_and_fails() {
    let (code, out) = doctor(&[
        ("SANDBOX_DOCKER_ENABLED", "true"),
        ("SANDBOX_DOCKER_HOST", "unix:///nonexistent/docker.sock"),
    ]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("[FAIL] docker engine"), "{out}");
    assert!(out.contains("/nonexistent/docker.sock"), "{out}");
    assert!(out.contains("fix:"), "{out}");
}

/// A build without the Docker feature has no backend to check, and says how to get one instead
/// of passing.
#[cfg(not(feature = "docker"))]
#[test]
fn a_build_without_a_backend_says_so_and_fails() {
    let (code, out) = doctor(&[]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("[FAIL] backend: this build has no backend"),
        "{out}"
    );
    assert!(
        out.contains("fix: build with the `docker` feature"),
        "{out}"
    );
}

#[test]
fn a_bad_config_value_fails_with_the_variable_named() {
    let (code, out) = doctor(&[("SANDBOX_LISTEN", "not-an-address")]);
    assert_ne!(code, 0);
    assert!(out.contains("SANDBOX_LISTEN"), "{out}");
}

#[test]
fn a_bad_disk_bound_fails_with_the_variable_named() {
    for name in [
        "SANDBOX_DOCKER_LOG_MAX_BYTES",
        "SANDBOX_DOCKER_STORAGE_LIMIT_BYTES",
    ] {
        let (code, out) = doctor(&[(name, "10G")]);
        assert_ne!(code, 0, "{out}");
        assert!(out.contains(name) && out.contains("byte count"), "{out}");
    }
}
