//! `sandbox serve` on a host without the sandbox image: the first start builds it locally from
//! the host's busybox-static with progress in the log, then serves execs in it; a host whose
//! busybox is missing or not statically linked fails the start with a message naming the
//! package, and nothing is pulled from any registry.
//!
//! Needs the engine and Debian's busybox-static: ignored in a plain `cargo test`, run by
//! `cargo xtask test`. Each case builds an image under a tag of its own and removes it.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::container_ids;
use support::serve::{EXIT_DEADLINE, START_DEADLINE, Service, temp_dir};

use std::process::Command;

/// A fresh recipe tag, so the image is certainly missing at start.
fn fresh_tag(case: &str) -> String {
    format!("sandbox-busybox:{case}-{:08x}", fastrand::u32(..))
}

fn image_exists(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", image])
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap()
        .status
        .success()
}

/// Removes the image (and the containers of the namespace) however the test ends.
struct Cleanup {
    image: String,
    namespace: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let ids = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=sandbox.namespace={}", self.namespace))
            .env_remove("DOCKER_HOST")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for id in ids.split_whitespace() {
            let _ = Command::new("docker").args(["rm", "-f", id]).output();
        }
        let _ = Command::new("docker")
            .args(["rmi", "-f", &self.image])
            .env_remove("DOCKER_HOST")
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and busybox-static: cargo xtask test runs it"]
async fn the_first_start_builds_the_missing_image_with_progress() {
    let image = fresh_tag("first-start");
    let namespace = format!("timage-{:08x}", fastrand::u32(..));
    let _cleanup = Cleanup {
        image: image.clone(),
        namespace: namespace.clone(),
    };
    assert!(!image_exists(&image));
    let dir = temp_dir();
    let (token_file, log) = (dir.join("dev-token"), dir.join("serve.log"));

    let mut service = Service::spawn(
        &namespace,
        &token_file,
        &log,
        &[("SANDBOX_DOCKER_IMAGE", image.as_str())],
    );
    // The build is part of the start: generous, but bounded.
    let ready = service.ready(START_DEADLINE * 2).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(ready.is_ok(), "serve did not come up: {ready:?}\n{text}");
    assert!(image_exists(&image), "the image was built");
    for progress in [
        "building it locally",
        "build | Step 1/",
        "FROM scratch",
        "build | Successfully tagged",
        "the sandbox image is built",
    ] {
        assert!(
            text.contains(progress),
            "no {progress:?} in the log:\n{text}"
        );
    }
    assert!(
        !text.contains('\u{1b}'),
        "the log file carries no colour codes"
    );

    // The built image serves execs: a shell, the workspace, busybox applets.
    let token = std::fs::read_to_string(&token_file).unwrap();
    let (status, out) = service
        .call(
            "POST",
            "/v1/sessions/fresh/exec",
            token.trim(),
            r#"{"command":"pwd && echo built-ok | tr a-z A-Z","shell":true}"#,
        )
        .await;
    assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    assert_eq!(out["stdout"], "/workspace\nBUILT-OK\n");
    assert_eq!(container_ids(&namespace).await.len(), 1);

    // A second start finds the image and builds nothing.
    let (status, _) = service
        .call("DELETE", "/v1/sessions/fresh", token.trim(), "")
        .await;
    assert_eq!(status, 204);
    drop(service);
    let log2 = dir.join("serve2.log");
    let mut second = Service::spawn(
        &namespace,
        &token_file,
        &log2,
        &[("SANDBOX_DOCKER_IMAGE", image.as_str())],
    );
    let ready = second.ready(START_DEADLINE).await;
    let text = std::fs::read_to_string(&log2).unwrap();
    assert!(ready.is_ok(), "{text}");
    assert!(!text.contains("build |"), "nothing rebuilt:\n{text}");
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts serve with `busybox` as the build input; it must exit non-zero, name the package, and
/// leave no image under the tag.
async fn start_fails_naming_the_package(case: &str, busybox: &str) -> String {
    let image = fresh_tag(case);
    let namespace = format!("timage-{:08x}", fastrand::u32(..));
    let _cleanup = Cleanup {
        image: image.clone(),
        namespace: namespace.clone(),
    };
    let dir = temp_dir();
    let log = dir.join("serve.log");
    let mut service = Service::spawn(
        &namespace,
        &dir.join("dev-token"),
        &log,
        &[
            ("SANDBOX_DOCKER_IMAGE", image.as_str()),
            ("SANDBOX_DOCKER_BUSYBOX", busybox),
        ],
    );
    let outcome = service.ready(START_DEADLINE + EXIT_DEADLINE).await;
    let text = std::fs::read_to_string(&log).unwrap();
    let status = outcome.expect_err(&format!("serve came up without an image:\n{text}"));
    assert!(!status.success(), "{status}");
    assert!(
        text.contains("sandbox: cannot build the sandbox image")
            && text.contains("apt-get install busybox-static"),
        "the failure names the package:\n{text}"
    );
    assert!(!image_exists(&image), "no image under {image}");
    for step in step_images(&text) {
        assert!(
            !image_exists(&step),
            "the failed build's step image {step} was left behind:\n{text}"
        );
    }
    assert!(
        !text.contains('\u{1b}'),
        "the log file carries no colour codes"
    );
    let _ = std::fs::remove_dir_all(&dir);
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine: cargo xtask test runs it"]
async fn a_missing_busybox_fails_the_start_naming_the_package() {
    let text = start_fails_naming_the_package("no-busybox", "/nonexistent/busybox").await;
    assert!(text.contains("cannot read /nonexistent/busybox"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine: cargo xtask test runs it"]
async fn a_dynamically_linked_busybox_fails_the_start_naming_the_package() {
    // Any dynamically linked program stands in for Debian's non-static `busybox` package: in a
    // `FROM scratch` image it has no loader, so the build's RUN step fails. A few random bytes
    // after the ELF make this run's COPY layer its own: a cache hit from an earlier build would
    // commit nothing, and this case is about what a failed build commits.
    let dir = temp_dir();
    let busybox = dir.join("busybox");
    let mut binary = std::fs::read("/bin/ls").unwrap();
    binary.extend(fastrand::u64(..).to_le_bytes());
    std::fs::write(&busybox, binary).unwrap();
    let text = start_fails_naming_the_package("dynamic-busybox", busybox.to_str().unwrap()).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(text.contains("must be statically linked"), "{text}");
    // The COPY step committed an image before RUN failed, and it was removed (checked above).
    assert!(!step_images(&text).is_empty(), "no step image in:\n{text}");
    assert!(!text.contains("Using cache"), "the COPY step ran:\n{text}");
}

/// The images the build steps committed, from the build output in the log (` ---> <id>`).
fn step_images(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.split("---> ").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or("").to_owned())
        .filter(|id| id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect()
}

fn doctor(env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .arg("doctor")
        .env_remove("SANDBOX_CONFIG")
        .env_remove("DOCKER_HOST")
        .env("SANDBOX_DOCKER_ENABLED", "true")
        .env("SANDBOX_DOCKER_AGENT_PATH", crate::support::agent_bin())
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Doctor judges whether `serve` will be able to build a missing image, and builds nothing.
#[test]
#[ignore = "needs a Docker engine: cargo xtask test runs it"]
fn doctor_says_whether_the_missing_image_can_be_built() {
    let image = fresh_tag("doctor");
    let (ok, out) = doctor(&[("SANDBOX_DOCKER_IMAGE", image.as_str())]);
    assert!(ok, "busybox-static is here, so serve can build it:\n{out}");
    assert!(
        out.contains("builds it on start from /bin/busybox"),
        "{out}"
    );

    let (ok, out) = doctor(&[
        ("SANDBOX_DOCKER_IMAGE", image.as_str()),
        ("SANDBOX_DOCKER_BUSYBOX", "/nonexistent/busybox"),
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains("[FAIL] image"), "{out}");
    assert!(out.contains("apt-get install busybox-static"), "{out}");

    let (ok, out) = doctor(&[("SANDBOX_DOCKER_IMAGE", "not-a-recipe:missing")]);
    assert!(!ok, "{out}");
    assert!(out.contains("load or build that image"), "{out}");
    assert!(!image_exists(&image), "doctor built nothing");
}
