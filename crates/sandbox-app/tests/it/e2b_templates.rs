//! Template builds of the E2B API of `sandbox serve` over the real Docker engine, proven with
//! the official Python SDK (`tests/e2b/templates.py`): a build from the local Debian image
//! reaches `ready` and `Sandbox.create(<alias>)` boots it and runs a command; a build from an
//! image the engine lacks raises the SDK's build error with the reason; deleting a template a
//! sandbox uses is 409 until the sandbox is killed. Then the engine holds neither the
//! sandboxes nor the template's image.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`), the static agent
//! (`SANDBOX_AGENT_BIN`) and the SDK's venv (`SANDBOX_TEST_E2B_PYTHON`): the e2b sdk stage of
//! `cargo xtask test`.

#![cfg(all(feature = "docker", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sandbox_testkit::e2b_sdk::{run_script, venv_python};

use crate::support::e2b::{E2bOptions, E2bServe, debian_image};

/// Four builds and five Debian sandboxes, on a slow machine.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(600);

/// The images of the namespace's template repository (`sandbox-template-<namespace>`).
fn template_images(namespace: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["images", "--quiet", &format!("sandbox-template-{namespace}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Removes the namespace's template images, whatever the test left.
struct TemplateImages(String);

impl Drop for TemplateImages {
    fn drop(&mut self) {
        let images = template_images(&self.0);
        if !images.is_empty() {
            let _ = Command::new("docker")
                .args(["rmi", "--force"])
                .args(&images)
                .output();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE), the static agent (SANDBOX_AGENT_BIN) and the SDK venv (the e2b sdk stage)"]
async fn the_official_python_sdk_builds_boots_and_deletes_a_template_from_a_local_image() {
    let python = venv_python();
    let image = debian_image();
    // Allowed, and certainly not on the engine: the build must fail without a pull.
    let absent = format!("sandbox-absent-{:08x}:none", fastrand::u32(..));
    let options = E2bOptions {
        env: vec![(
            "SANDBOX_E2B_BUILD_IMAGES".to_owned(),
            format!("{image},{absent}"),
        )],
        ..E2bOptions::default()
    };
    let serve = E2bServe::start_with("te2btpl", options).await;
    let _cleanup = TemplateImages(serve.namespace.clone());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/templates.py");
    let mut run = Command::new(&python);
    run.arg(&script)
        .env("E2B_API_KEY", &serve.key_a)
        .env("E2B_API_URL", &serve.e2b)
        .env("E2B_SANDBOX_URL", &serve.e2b)
        .env("SANDBOX_TEMPLATES_IMAGE", &image)
        .env("SANDBOX_TEMPLATES_ABSENT", &absent)
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_ACCESS_TOKEN")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    let context = || serve.context();
    let stdout = tokio::task::block_in_place(|| run_script(run, SCRIPT_DEADLINE, &context));
    println!("{stdout}");
    // The script killed its sandboxes and deleted its template: neither is left on the engine.
    serve.wait_no_containers().await;
    assert_eq!(
        template_images(&serve.namespace),
        Vec::<String>::new(),
        "the deleted template's image is still on the engine"
    );
    // Nothing was pulled: the absent image is still absent.
    let inspect = Command::new("docker")
        .args(["image", "inspect", &absent])
        .output()
        .unwrap();
    assert!(!inspect.status.success(), "{absent} appeared on the engine");
}
