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
        .args([
            "images",
            "--quiet",
            &format!("sandbox-template-{namespace}"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let mut run = serve.sdk_command(&python);
    run.arg(&script)
        .env("SANDBOX_TEMPLATES_IMAGE", &image)
        .env("SANDBOX_TEMPLATES_ABSENT", &absent);
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

/// Polls a build's status until it leaves `building`/`waiting`; its last answer.
async fn finished(serve: &E2bServe, key: &str, id: &str, build: &str) -> serde_json::Value {
    for _ in 0..600 {
        let a = serve
            .cp(
                "GET",
                &format!("/templates/{id}/builds/{build}/status"),
                key,
                "",
            )
            .await;
        assert_eq!(a.status, 200, "status: {}", a.text());
        let v = a.json();
        if !matches!(v["status"].as_str(), Some("building" | "waiting")) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("build {build} never finished\n{}", serve.context());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE) and the static agent (SANDBOX_AGENT_BIN): the e2b sdk stage"]
async fn a_ready_template_survives_a_restart_and_stays_its_tenants() {
    let image = debian_image();
    let mut serve = E2bServe::start("te2btplr").await;
    let _cleanup = TemplateImages(serve.namespace.clone());
    let (a, b) = (serve.key_a.clone(), serve.key_b.clone());
    let name = format!("keep-{:08x}", fastrand::u32(..));
    let requested = serve
        .cp(
            "POST",
            "/v3/templates",
            &a,
            &format!(r#"{{"name":"{name}:v1"}}"#),
        )
        .await;
    assert_eq!(requested.status, 202, "{}", requested.text());
    let v = requested.json();
    let (id, build) = (
        v["templateID"].as_str().unwrap().to_owned(),
        v["buildID"].as_str().unwrap().to_owned(),
    );
    let started = serve
        .cp(
            "POST",
            &format!("/v2/templates/{id}/builds/{build}"),
            &a,
            &serde_json::json!({"fromImage": image, "steps": []}).to_string(),
        )
        .await;
    assert_eq!(started.status, 202, "{}", started.text());
    assert_eq!(finished(&serve, &a, &id, &build).await["status"], "ready");
    // The image is the adapter's own, in its repository, labelled with the tenant.
    assert_eq!(template_images(&serve.namespace).len(), 1);

    serve.stop().await;
    serve.restart().await;

    // The engine's image is the record: after the restart the build is ready, listed, and boots.
    assert_eq!(finished(&serve, &a, &id, &build).await["status"], "ready");
    let listed = serve.cp("GET", "/v2/templates", &a, "").await.json();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["templateID"] == id.as_str() && t["buildStatus"] == "ready"),
        "{listed}"
    );
    let created = serve
        .create_body(
            &a,
            serde_json::json!({"templateID": format!("{name}:v1"), "timeout": 120}),
        )
        .await;
    // Another tenant sees none of it, and cannot boot it by name or by ID.
    for path in [
        format!("/templates/{id}"),
        format!("/templates/{id}/builds/{build}/status"),
    ] {
        serve.cp("GET", &path, &b, "").await.error(&[404], &path);
    }
    for template in [format!("{name}:v1"), id.clone()] {
        serve
            .cp(
                "POST",
                "/v2/sandboxes",
                &b,
                &serde_json::json!({"templateID": template}).to_string(),
            )
            .await
            .error(&[404], "another tenant's create");
    }
    serve
        .cp("DELETE", &format!("/templates/{id}"), &a, "")
        .await
        .error(&[409], "a delete while the sandbox runs");
    let killed = serve
        .cp("DELETE", &format!("/sandboxes/{}", created.id), &a, "")
        .await;
    assert_eq!(killed.status, 204, "{}", killed.text());
    let deleted = serve
        .cp("DELETE", &format!("/templates/{id}"), &a, "")
        .await;
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    serve.wait_no_containers().await;
    assert_eq!(template_images(&serve.namespace), Vec::<String>::new());
}
