//! The E2B API's template builds over the fake provider, hermetic: a build from an image on
//! the backend reaches `ready` and boots by name, tag and ID; what a build cannot honour is
//! 400 naming it; an absent image is a failed build with the reason; another tenant's
//! template is 404 everywhere; a template in use is 409 until its sandbox is gone; tags move.
//! The official SDK against Docker is `tests/it/e2b_templates.rs`.

#![cfg(feature = "e2b-api")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test file: a failed unwrap is a failed test.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use sandbox_app::auth::{TenantAuth, digest, hex};
use sandbox_app::e2b::ids::Keys;
use sandbox_app::e2b::{E2bApi, EnvdPlane, Settings};
use sandbox_core::{Error, SandboxId, SandboxProvider, Secret};
use sandbox_session::quota::Quotas;
use sandbox_testkit::MemoryDeadlines;
use sandbox_testkit::fake::FakeProvider;
use serde_json::{Value, json};
use tower::ServiceExt as _;

const KEY_A: &str = "e2b_tenant_a_key";
const KEY_B: &str = "e2b_tenant_b_key";
/// Allowed by `e2b.build_images` but not on the backend.
const ABSENT_IMAGE: &str = "sandbox-absent:1";

#[derive(Debug)]
struct NoEnvd;

#[async_trait::async_trait]
impl EnvdPlane for NoEnvd {
    async fn envd_version(&self, _id: &SandboxId) -> Result<String, Error> {
        Ok("0.6.4".to_owned())
    }
    async fn forward(&self, _id: &SandboxId, _request: Request<Body>) -> Response {
        (StatusCode::BAD_GATEWAY, "no envd here").into_response()
    }
}

fn app() -> axum::Router {
    app_with_base(FakeProvider::template())
}

fn app_with_base(base: sandbox_core::TemplateId) -> axum::Router {
    let provider: Arc<dyn SandboxProvider> = Arc::new(FakeProvider::new());
    let auth = TenantAuth::new([
        (1, hex(&digest(KEY_A)).as_str()),
        (2, hex(&digest(KEY_B)).as_str()),
    ])
    .unwrap();
    let source = FakeProvider::template().as_str().to_owned();
    let settings = Settings {
        domain: "sbx.test".to_owned(),
        default_timeout: Duration::from_secs(300),
        max_timeout: Duration::from_secs(3600),
        templates: HashMap::from([("base".to_owned(), base)]),
        cpu_count: 2,
        memory_mb: 2048,
        disk_size_mb: 10240,
        quotas: Quotas::default(),
        build_images: vec![source, ABSENT_IMAGE.to_owned()],
        max_tunnels_per_sandbox: 16,
    };
    let api = E2bApi::new(
        provider,
        Arc::new(NoEnvd),
        Arc::new(auth),
        Keys::new(Secret::new("a-test-secret-of-at-least-32-bytes!!")),
        Arc::new(MemoryDeadlines::new()),
        settings,
    );
    let metrics = Arc::new(sandbox_app::http::metrics::Metrics::new());
    sandbox_app::e2b::router(api, metrics)
}

async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    key: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("x-api-key", key);
    let body = match body {
        Some(v) => {
            request = request.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let response = app
        .clone()
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    (status, value)
}

/// Every error answer is `{"code": <its status>, "message": <text>}`.
fn assert_error(status: StatusCode, body: &Value, expected: StatusCode, needle: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["code"], json!(expected.as_u16()), "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{needle:?} not in {body}");
}

/// Requests a template `name` and returns (templateID, buildID).
async fn request_build(app: &axum::Router, key: &str, name: &str) -> (String, String) {
    let (status, answer) = call(
        app,
        "POST",
        "/v3/templates",
        key,
        Some(json!({"name": name, "cpuCount": 2, "memoryMB": 1024})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    for field in ["public", "names", "tags", "aliases"] {
        assert!(answer.get(field).is_some(), "{field}: {answer}");
    }
    (
        answer["templateID"].as_str().unwrap().to_owned(),
        answer["buildID"].as_str().unwrap().to_owned(),
    )
}

async fn wait_finished(app: &axum::Router, key: &str, id: &str, build: &str) -> Value {
    for _ in 0..200 {
        let (status, answer) = call(
            app,
            "GET",
            &format!("/templates/{id}/builds/{build}/status"),
            key,
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        match answer["status"].as_str().unwrap() {
            "building" | "waiting" => tokio::time::sleep(Duration::from_millis(10)).await,
            _ => return answer,
        }
    }
    panic!("build {build} never finished");
}

async fn build_ready(app: &axum::Router, key: &str, name: &str) -> (String, String) {
    let (id, build) = request_build(app, key, name).await;
    let source = FakeProvider::template().as_str().to_owned();
    let (status, answer) = call(
        app,
        "POST",
        &format!("/v2/templates/{id}/builds/{build}"),
        key,
        Some(json!({"fromImage": source, "steps": [], "force": false})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let done = wait_finished(app, key, &id, &build).await;
    assert_eq!(done["status"], "ready", "{done}");
    assert!(
        done["logEntries"].as_array().is_some() && done["logs"].as_array().is_some(),
        "{done}"
    );
    (id, build)
}

async fn create(app: &axum::Router, key: &str, template: &str) -> (StatusCode, Value) {
    call(
        app,
        "POST",
        "/v2/sandboxes",
        key,
        Some(json!({"templateID": template})),
    )
    .await
}

#[tokio::test]
async fn a_build_from_a_backend_image_boots_by_name_tag_and_id() {
    let app = app();
    let (id, build) = build_ready(&app, KEY_A, "my-env").await;
    for name in ["my-env", "my-env:default", id.as_str(), "MY-ENV"] {
        let (status, answer) = create(&app, KEY_A, name).await;
        assert_eq!(status, StatusCode::CREATED, "{name}: {answer}");
    }
    let (status, answer) = create(&app, KEY_A, "my-env:nope").await;
    assert_error(status, &answer, StatusCode::NOT_FOUND, "not found");

    let (status, listed) = call(&app, "GET", "/v2/templates", KEY_A, None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let item = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["templateID"] == id.as_str())
        .expect("listed");
    assert_eq!(item["buildStatus"], "ready");
    assert_eq!(item["aliases"], json!(["my-env"]));
    for field in [
        "cpuCount",
        "memoryMB",
        "diskSizeMB",
        "createdAt",
        "updatedAt",
        "createdBy",
        "lastSpawnedAt",
        "spawnCount",
        "buildCount",
        "envdVersion",
        "names",
        "public",
        "buildID",
    ] {
        assert!(item.get(field).is_some(), "{field}: {item}");
    }
    let (status, legacy) = call(&app, "GET", "/templates", KEY_A, None).await;
    assert_eq!(
        (status, legacy.as_array().unwrap().len()),
        (StatusCode::OK, 1)
    );
    let (status, one) = call(&app, "GET", &format!("/templates/{id}"), KEY_A, None).await;
    assert_eq!(status, StatusCode::OK, "{one}");
    assert_eq!(one["builds"][0]["buildID"], build.as_str());
    let (status, alias) = call(&app, "GET", "/templates/aliases/my-env", KEY_A, None).await;
    assert_eq!(
        (status, alias["templateID"].as_str()),
        (StatusCode::OK, Some(id.as_str()))
    );
    let (status, alias) = call(&app, "GET", "/templates/aliases/free-name", KEY_A, None).await;
    assert_error(status, &alias, StatusCode::NOT_FOUND, "free-name");
    // The operator's template is every tenant's public one, under its default tag only.
    for key in [KEY_A, KEY_B] {
        let (status, alias) = call(&app, "GET", "/templates/aliases/base", key, None).await;
        assert_eq!(status, StatusCode::OK, "{alias}");
        assert_eq!(alias, json!({"templateID": "base", "public": true}));
    }
    let (status, alias) = call(&app, "GET", "/templates/aliases/base:v2", KEY_A, None).await;
    assert_error(status, &alias, StatusCode::NOT_FOUND, "base:v2");

    // A second request with the same name is a new build of the same template.
    let (again, second) = request_build(&app, KEY_A, "my-env").await;
    assert_eq!(again, id);
    assert_ne!(second, build);
}

#[tokio::test]
async fn what_a_build_cannot_honour_is_400_naming_it_and_an_absent_image_fails_with_the_reason() {
    let app = app();
    let source = FakeProvider::template().as_str().to_owned();
    let (id, build) = request_build(&app, KEY_A, "strict").await;
    let uri = format!("/v2/templates/{id}/builds/{build}");
    for (body, needle) in [
        (json!({"fromImage": "ubuntu:22.04"}), "e2b.build_images"),
        (json!({"fromTemplate": "base"}), "fromTemplate"),
        (
            json!({"fromImage": source, "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}}),
            "fromImageRegistry",
        ),
        (
            json!({"fromImage": source, "steps": [{"type": "RUN", "args": ["echo hi"], "force": false}]}),
            "steps",
        ),
        (
            json!({"fromImage": source, "startCmd": "sleep 1", "readyCmd": "true"}),
            "Cmd",
        ),
    ] {
        let (status, answer) = call(&app, "POST", &uri, KEY_A, Some(body.clone())).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, needle);
    }
    // Refusals left the build waiting; an allowed image the backend lacks fails the build.
    let (status, answer) = call(
        &app,
        "POST",
        &uri,
        KEY_A,
        Some(json!({"fromImage": ABSENT_IMAGE, "steps": []})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let done = wait_finished(&app, KEY_A, &id, &build).await;
    assert_eq!(done["status"], "error", "{done}");
    let reason = done["reason"]["message"].as_str().unwrap();
    assert!(reason.contains(ABSENT_IMAGE), "{reason}");
    // A build starts once.
    let (status, answer) = call(
        &app,
        "POST",
        &uri,
        KEY_A,
        Some(json!({"fromImage": source})),
    )
    .await;
    assert_error(status, &answer, StatusCode::CONFLICT, "already");
    // Nothing to boot, and the listing says the build failed.
    let (status, answer) = create(&app, KEY_A, "strict").await;
    assert_error(status, &answer, StatusCode::NOT_FOUND, "strict");
    let (_, listed) = call(&app, "GET", "/v2/templates", KEY_A, None).await;
    assert_eq!(listed[0]["buildStatus"], "error", "{listed}");
    // COPY uploads are refused: builds take no steps.
    let (status, answer) = call(
        &app,
        "GET",
        &format!("/templates/{id}/files/abc"),
        KEY_A,
        None,
    )
    .await;
    assert_error(status, &answer, StatusCode::BAD_REQUEST, "COPY");
    // Bad names are 400.
    let (status, answer) = call(
        &app,
        "POST",
        "/v3/templates",
        KEY_A,
        Some(json!({"name": "team/x"})),
    )
    .await;
    assert_error(status, &answer, StatusCode::BAD_REQUEST, "namespace");
    let (status, answer) = call(
        &app,
        "POST",
        "/v3/templates",
        KEY_A,
        Some(json!({"name": "x", "tags": ["Bad Tag"]})),
    )
    .await;
    assert_error(status, &answer, StatusCode::BAD_REQUEST, "tag");
}

#[tokio::test]
async fn another_tenants_template_is_404_everywhere() {
    let app = app();
    let (id, build) = build_ready(&app, KEY_A, "mine").await;
    let source = FakeProvider::template().as_str().to_owned();
    for (method, uri, body) in [
        ("GET", format!("/templates/{id}"), None),
        ("DELETE", format!("/templates/{id}"), None),
        (
            "GET",
            format!("/templates/{id}/builds/{build}/status"),
            None,
        ),
        ("GET", format!("/templates/{id}/tags"), None),
        ("GET", "/templates/aliases/mine".to_owned(), None),
        (
            "POST",
            format!("/v2/templates/{id}/builds/{build}"),
            Some(json!({"fromImage": source})),
        ),
        (
            "POST",
            "/templates/tags".to_owned(),
            Some(json!({"target": "mine:default", "tags": ["x"]})),
        ),
        (
            "DELETE",
            "/templates/tags".to_owned(),
            Some(json!({"name": "mine", "tags": ["default"]})),
        ),
    ] {
        let (status, answer) = call(&app, method, &uri, KEY_B, body).await;
        assert_error(status, &answer, StatusCode::NOT_FOUND, "not found");
    }
    for name in ["mine", id.as_str()] {
        let (status, answer) = create(&app, KEY_B, name).await;
        assert_error(status, &answer, StatusCode::NOT_FOUND, "not found");
    }
    let (_, listed) = call(&app, "GET", "/v2/templates", KEY_B, None).await;
    assert_eq!(listed, json!([]));
    // B's own template of the same name is B's, apart from A's.
    let (b_id, _) = build_ready(&app, KEY_B, "mine").await;
    assert_ne!(b_id, id);
    let (status, _) = call(&app, "GET", &format!("/templates/{id}"), KEY_A, None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_template_in_use_is_409_until_its_sandbox_is_killed() {
    let app = app();
    let (id, _) = build_ready(&app, KEY_A, "busy").await;
    let (status, sandbox) = create(&app, KEY_A, "busy").await;
    assert_eq!(status, StatusCode::CREATED, "{sandbox}");
    let sandbox_id = sandbox["sandboxID"].as_str().unwrap();
    let (status, answer) = call(&app, "DELETE", &format!("/templates/{id}"), KEY_A, None).await;
    assert_error(status, &answer, StatusCode::CONFLICT, sandbox_id);
    let (status, _) = call(
        &app,
        "DELETE",
        &format!("/sandboxes/{sandbox_id}"),
        KEY_A,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, answer) = call(&app, "DELETE", "/templates/busy", KEY_A, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{answer}");
    let (status, answer) = call(&app, "GET", &format!("/templates/{id}"), KEY_A, None).await;
    assert_error(status, &answer, StatusCode::NOT_FOUND, "not found");
    let (status, answer) = create(&app, KEY_A, "busy").await;
    assert_error(status, &answer, StatusCode::NOT_FOUND, "busy");
}

#[tokio::test]
async fn tags_are_assigned_listed_and_removed() {
    let app = app();
    let (id, build) = build_ready(&app, KEY_A, "tagged").await;
    let (status, answer) = call(
        &app,
        "POST",
        "/templates/tags",
        KEY_A,
        Some(json!({"target": "tagged:default", "tags": ["v2", "Stable"]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(answer, json!({"tags": ["v2", "stable"], "buildID": build}));
    let (status, tags) = call(&app, "GET", &format!("/templates/{id}/tags"), KEY_A, None).await;
    assert_eq!(status, StatusCode::OK, "{tags}");
    let mut names: Vec<&str> = tags
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tag"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["default", "stable", "v2"]);
    assert!(
        tags.as_array()
            .unwrap()
            .iter()
            .all(|t| t["buildID"] == build.as_str() && t["createdAt"].is_string())
    );
    let (status, answer) = create(&app, KEY_A, "tagged:v2").await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) = call(
        &app,
        "DELETE",
        "/templates/tags",
        KEY_A,
        Some(json!({"name": "tagged", "tags": ["v2"]})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{answer}");
    let (status, answer) = create(&app, KEY_A, "tagged:v2").await;
    assert_error(status, &answer, StatusCode::NOT_FOUND, "tagged:v2");
    let (status, answer) = call(
        &app,
        "POST",
        "/templates/tags",
        KEY_A,
        Some(json!({"target": "tagged:nope", "tags": ["x"]})),
    )
    .await;
    assert_error(status, &answer, StatusCode::NOT_FOUND, "tagged:nope");
}

#[tokio::test]
async fn an_absent_default_base_image_says_how_to_build_it() {
    let base = sandbox_core::TemplateId::new(sandbox_app::config::DEFAULT_E2B_BASE_IMAGE).unwrap();
    let app = app_with_base(base);
    let (status, answer) = create(&app, KEY_A, "base").await;
    assert_error(
        status,
        &answer,
        StatusCode::BAD_REQUEST,
        "cargo xtask debian-image",
    );
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains(sandbox_app::config::DEFAULT_E2B_BASE_IMAGE),
        "{answer}"
    );
}
