//! The E2B adapter ensuring its standard template against the E2B API of `sandbox serve` over
//! the real Docker engine (`support::e2b::E2bServe`): with a build spec (the Debian image as
//! `template_from_image`, an image the server allows because it is the `base` template's),
//! the first `ensure_standard_template` builds a template of the configured name under the
//! default tag, the second finds it ready and builds nothing (the server's builds list says
//! so), and a sandbox created from it runs `true`. Once the tag is removed on the server, the
//! next ensure builds exactly one replacement, which the tag then names; the superseded build
//! is left to the server, which drops the image no tag names.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`, `cargo xtask debian-image`)
//! and the static agent (`SANDBOX_AGENT_BIN`, `cargo xtask agent`): the e2b sdk stage.

// Needs the Docker backend and the E2B API (the server) and the E2B backend (the adapter).
#![cfg(all(feature = "docker", feature = "e2b", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::process::Command;

use sandbox_core::{
    Checked, CreateRequest, ExecRequest, SandboxProvider, Secret, TemplateId, narrow,
};
use sandbox_provider_e2b::{E2bConfig, E2bProvider};
use serde_json::{Value, json};

use crate::support::e2b::{DOMAIN, E2bServe, debian_image};

/// The adapter pointed at `serve` as tenant A, booting `template`, built from the Debian
/// image.
fn adapter(serve: &E2bServe, template: &str) -> Checked<E2bProvider> {
    let mut config = E2bConfig::new(
        serve.e2b.clone(),
        Secret::new(serve.key_a.clone()),
        template,
    );
    config.proxy_url = serve.e2b.clone();
    config.sandbox_domain = DOMAIN.to_owned();
    // The server listens on loopback; the test is the operator who allows it.
    config.allow_private_endpoints = true;
    config.template_from_image = debian_image();
    E2bProvider::new(config).unwrap()
}

/// The template's builds as the server lists them (`GET /templates/{id}`).
async fn builds(serve: &E2bServe, id: &str) -> Vec<Value> {
    let a = serve
        .cp("GET", &format!("/templates/{id}"), &serve.key_a, "")
        .await;
    assert_eq!(a.status, 200, "{}\n{}", a.text(), serve.context());
    a.json()["builds"].as_array().cloned().unwrap_or_default()
}

/// The build the server's tag `default` names.
async fn tagged(serve: &E2bServe, id: &str) -> Option<String> {
    let a = serve
        .cp("GET", &format!("/templates/{id}/tags"), &serve.key_a, "")
        .await;
    assert_eq!(a.status, 200, "{}\n{}", a.text(), serve.context());
    a.json()
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["tag"] == "default")
        .and_then(|t| t["buildID"].as_str().map(str::to_owned))
}

/// The images of the namespace's template repository.
fn template_images(namespace: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "images",
            "--quiet",
            "--no-trunc",
            &format!("sandbox-template-{namespace}"),
        ])
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE) and the static agent (SANDBOX_AGENT_BIN): the e2b sdk stage"]
async fn the_adapter_builds_its_standard_template_once_and_boots_it() {
    let serve = E2bServe::start("te2bstd").await;
    let name = format!("std-{:08x}", fastrand::u32(..));
    let provider = adapter(&serve, &name);
    let catalog = narrow::template_catalog(&provider).expect("template_catalog declared");

    // Absent: built from the image, under the default tag.
    let first = catalog
        .ensure_standard_template()
        .await
        .unwrap_or_else(|e| panic!("the first ensure: {e}\n{}", serve.context()));
    assert_eq!(
        (first.status.as_str(), first.name.as_str()),
        ("ready", name.as_str())
    );
    assert!(first.standard);
    let built = builds(&serve, &first.id).await;
    assert_eq!(built.len(), 1, "{built:?}");
    assert_eq!(built[0]["status"], "ready", "{built:?}");
    let first_build = built[0]["buildID"].as_str().unwrap().to_owned();
    assert_eq!(
        tagged(&serve, &first.id).await.as_deref(),
        Some(first_build.as_str())
    );

    // Ready under its tag: nothing more is built.
    let second = catalog
        .ensure_standard_template()
        .await
        .unwrap_or_else(|e| panic!("the second ensure: {e}\n{}", serve.context()));
    assert_eq!(second.id, first.id);
    let again = builds(&serve, &first.id).await;
    assert_eq!(again.len(), 1, "a second build: {again:?}");
    assert_eq!(again[0]["buildID"], first_build.as_str());
    let listed = catalog.list_templates().await.unwrap();
    assert!(
        listed.iter().any(|t| t.id == first.id && t.standard),
        "{listed:?}"
    );

    // It boots, and runs a command.
    let handle = provider
        .create(CreateRequest::new(TemplateId::new(name.clone()).unwrap()))
        .await
        .unwrap_or_else(|e| panic!("create from {name}: {e}\n{}", serve.context()));
    let ran = provider
        .exec(&handle, ExecRequest::argv("true", Vec::<String>::new()))
        .await
        .unwrap_or_else(|e| panic!("exec: {e}\n{}", serve.context()));
    assert_eq!(ran.exit_code, 0, "{ran:?}");
    provider.delete(handle.id()).await.unwrap();

    // The tag removed: the next ensure builds exactly one replacement, which the tag names.
    let untag = serve
        .cp(
            "DELETE",
            "/templates/tags",
            &serve.key_a,
            &json!({"name": name, "tags": ["default"]}).to_string(),
        )
        .await;
    assert_eq!(untag.status, 204, "{}\n{}", untag.text(), serve.context());
    let third = catalog
        .ensure_standard_template()
        .await
        .unwrap_or_else(|e| panic!("the ensure after the untag: {e}\n{}", serve.context()));
    assert_eq!(third.id, first.id, "the same template, a new build");
    let replaced = tagged(&serve, &first.id).await.expect("the tag is back");
    assert_ne!(replaced, first_build);
    let now = builds(&serve, &first.id).await;
    let ready: Vec<&Value> = now
        .iter()
        .filter(|b| b["buildID"] == replaced.as_str())
        .collect();
    assert_eq!(ready.len(), 1, "{now:?}");
    assert_eq!(ready[0]["status"], "ready", "{now:?}");
    // The superseded build's image is the server's to drop, and it did: one image is left.
    assert_eq!(
        template_images(&serve.namespace).len(),
        1,
        "{now:?}\n{}",
        serve.context()
    );
}
