//! The E2B-compatible API over the fake provider, hermetic: the control plane's answers and
//! error shapes, refused options, tenant isolation, paging, deadlines, and the envd router's
//! addressing, authorisation and stripping (with a recording [`EnvdPlane`] in place of a
//! sandbox's agent). The official SDK against the real thing is `tests/it/e2b_sdk.rs`.

#![cfg(feature = "e2b-api")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test file: a failed unwrap is a failed test.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use sandbox_app::auth::{TenantAuth, digest, hex};
use sandbox_app::e2b::ids::{FileOperation, Keys, file_signature};
use sandbox_app::e2b::{E2bApi, EnvdPlane, Settings};
use sandbox_core::{DeadlineStore, Error, SandboxId, SandboxProvider, Secret, TenantId};
use sandbox_session::quota::{Quotas, TenantQuota};
use sandbox_testkit::MemoryDeadlines;
use sandbox_testkit::fake::FakeProvider;
use serde_json::{Value, json};
use tower::ServiceExt as _;

const KEY_A: &str = "e2b_tenant_a_key";
const KEY_B: &str = "e2b_tenant_b_key";
const ENVD_VERSION: &str = "0.6.4";

/// What the router handed the agent: the method, the target and the headers.
#[derive(Debug, Default)]
struct Recording {
    seen: Mutex<Vec<(SandboxId, String, String, HeaderMap)>>,
}

#[async_trait::async_trait]
impl EnvdPlane for Recording {
    async fn envd_version(&self, _id: &SandboxId) -> Result<String, Error> {
        Ok(ENVD_VERSION.to_owned())
    }

    async fn forward(&self, id: &SandboxId, request: Request<Body>) -> Response {
        self.seen.lock().unwrap().push((
            id.clone(),
            request.method().to_string(),
            request.uri().to_string(),
            request.headers().clone(),
        ));
        (StatusCode::OK, "relayed").into_response()
    }
}

struct Harness {
    app: axum::Router,
    metrics: Arc<sandbox_app::http::metrics::Metrics>,
    envd: Arc<Recording>,
    deadlines: Arc<MemoryDeadlines>,
    provider: Arc<dyn SandboxProvider>,
    api: E2bApi,
}

fn harness_with(max_sandboxes: Option<u32>) -> Harness {
    harness_on(Arc::new(FakeProvider::new()), max_sandboxes)
}

fn harness_on(provider: Arc<dyn SandboxProvider>, max_sandboxes: Option<u32>) -> Harness {
    let envd = Arc::new(Recording::default());
    let deadlines = Arc::new(MemoryDeadlines::new());
    let auth = TenantAuth::new([
        (1, hex(&digest(KEY_A)).as_str()),
        (2, hex(&digest(KEY_B)).as_str()),
    ])
    .unwrap();
    let settings = Settings {
        domain: "sbx.test".to_owned(),
        default_timeout: Duration::from_secs(300),
        max_timeout: Duration::from_secs(3600),
        templates: HashMap::from([("base".to_owned(), FakeProvider::template())]),
        cpu_count: 2,
        memory_mb: 2048,
        disk_size_mb: 10240,
        quotas: Quotas {
            default: TenantQuota {
                max_sandboxes,
                ..TenantQuota::default()
            },
            tenants: HashMap::new(),
        },
        build_images: vec![FakeProvider::template().as_str().to_owned()],
        max_tunnels_per_sandbox: 2,
    };
    let api = E2bApi::new(
        Arc::clone(&provider),
        envd.clone(),
        Arc::new(auth),
        Keys::new(Secret::new("a-test-secret-of-at-least-32-bytes!!")),
        deadlines.clone(),
        settings,
    );
    let metrics = Arc::new(sandbox_app::http::metrics::Metrics::new());
    Harness {
        app: sandbox_app::e2b::router(api.clone(), Arc::clone(&metrics)),
        metrics,
        envd,
        deadlines,
        provider,
        api,
    }
}

fn harness() -> Harness {
    harness_with(None)
}

async fn call(
    h: &Harness,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, HeaderMap, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let body = match body {
        Some(v) => {
            request = request.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let response = h
        .app
        .clone()
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    (status, headers, value)
}

async fn create(h: &Harness, key: &str, body: Value) -> Value {
    let (status, _, answer) = call(
        h,
        "POST",
        "/v2/sandboxes",
        &[("x-api-key", key)],
        Some(body),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    answer
}

/// Every error answer is `{"code": <its status>, "message": <text>}`.
fn assert_error(status: StatusCode, body: &Value, expected: StatusCode) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["code"], json!(expected.as_u16()), "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn create_answers_201_with_a_token_and_the_agents_envd_version() {
    let h = harness();
    let answer = create(
        &h,
        KEY_A,
        json!({"templateID": "base", "timeout": 120, "metadata": {"app": "x"}, "envVars": {"FOO": "bar"}}),
    )
    .await;
    let id = answer["sandboxID"].as_str().unwrap();
    assert!(id.starts_with('i') && id.len() == 20, "{answer}");
    assert_eq!(answer["templateID"], "base");
    assert_eq!(answer["envdVersion"], ENVD_VERSION);
    assert_eq!(answer["clientID"], "6532622b");
    assert_eq!(answer["domain"], "sbx.test");
    let token = answer["envdAccessToken"].as_str().unwrap();
    assert!(token.starts_with("ea1.1."), "{token}");

    // The deadline was stored before the answer: about two minutes from now.
    let deadline = h.deadlines.deadline(id).await.unwrap().expect("a deadline");
    let left = deadline - time::OffsetDateTime::now_utc();
    assert!(
        left > time::Duration::seconds(100) && left <= time::Duration::seconds(121),
        "{left}"
    );

    // The sandbox carries our marks and the caller's metadata, and no session ownership.
    let (status, _, detail) = call(
        &h,
        "GET",
        &format!("/sandboxes/{id}"),
        &[("x-api-key", KEY_A)],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(
        detail["metadata"],
        json!({"app": "x"}),
        "callers see their own keys only"
    );
    assert_eq!(detail["state"], "running");
    assert_eq!(detail["envdAccessToken"], token);
    assert_eq!(detail["allowInternetAccess"], true);
    // A backend that cannot enforce a closed network refuses it, naming the field, and makes
    // nothing (the fake, like E2B, does not enforce it).
    let (status, _, refused) = call(
        &h,
        "POST",
        "/v2/sandboxes",
        &[("x-api-key", KEY_A)],
        Some(json!({"templateID": "base", "allow_internet_access": false})),
    )
    .await;
    assert_error(status, &refused, StatusCode::NOT_IMPLEMENTED);
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("allow_internet_access"),
        "{refused}"
    );
    let all = h
        .provider
        .list(&sandbox_core::ListFilter::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    let stamped = &all[0].metadata;
    assert_eq!(stamped["sandbox.api"], "e2b");
    assert_eq!(stamped["sandbox.e2b.id"], id);
    assert_eq!(stamped["sandbox.tenant"], "1");
    // The tenant's ownership key (snapshots of it are the tenant's), and no session key: the
    // session layer's recovery never adopts an E2B sandbox.
    assert_eq!(stamped[sandbox_core::owner_metadata::TENANT], "1");
    assert!(
        !stamped.contains_key(sandbox_core::owner_metadata::SESSION),
        "no session ownership metadata: {stamped:?}"
    );
}

#[tokio::test]
async fn a_missing_or_wrong_key_is_401_before_the_body_is_read() {
    let h = harness();
    for headers in [
        vec![],
        vec![("x-api-key", "e2b_wrong")],
        vec![("authorization", "Bearer e2b_wrong")],
    ] {
        let (status, _, body) = call(
            &h,
            "POST",
            "/v2/sandboxes",
            &headers,
            Some(json!("not even an object")),
        )
        .await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED);
    }
    // The bearer form of a right key works too.
    let (status, _, _) = call(
        &h,
        "GET",
        "/v2/sandboxes",
        &[("authorization", &format!("Bearer {KEY_A}"))],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn options_that_cannot_be_honoured_are_400_naming_them_and_create_nothing() {
    let h = harness();
    for (body, field) in [
        (
            json!({"templateID": "base", "volumeMounts": [{"name": "v", "path": "/v"}]}),
            "volumeMounts",
        ),
        (json!({"templateID": "base", "mcp": {"srv": {}}}), "mcp"),
        (json!({"templateID": "base", "iam": {"tokens": {}}}), "iam"),
        (
            json!({"templateID": "base", "network": {"egressProxy": {"address": "p:1"}}}),
            "egressProxy",
        ),
        (
            json!({"templateID": "base", "network": {"allowOut": ["example.com"]}}),
            "allowOut",
        ),
        (
            json!({"templateID": "base", "network": {"rules": {"h": [{"transform": {}}]}}}),
            "rules",
        ),
        (
            json!({"templateID": "base", "metadata": {"sandbox_session_id": "s"}}),
            "sandbox_session_id",
        ),
        (
            json!({"templateID": "base", "envVars": {"1BAD": "x"}}),
            "envVars",
        ),
        (json!({"templateID": "base", "timeout": 0}), "Timeout"),
        (json!({"templateID": "base", "timeout": 7200}), "Timeout"),
    ] {
        let (status, _, answer) = call(
            &h,
            "POST",
            "/v2/sandboxes",
            &[("x-api-key", KEY_A)],
            Some(body.clone()),
        )
        .await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST);
        assert!(
            answer["message"].as_str().unwrap().contains(field),
            "{body}: {answer}"
        );
    }
    let (status, _, answer) = call(
        &h,
        "POST",
        "/v2/sandboxes",
        &[("x-api-key", KEY_A)],
        Some(json!({"templateID": "no-such-template"})),
    )
    .await;
    assert_error(status, &answer, StatusCode::NOT_FOUND);
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("no-such-template")
    );
    assert!(
        h.provider
            .list(&sandbox_core::ListFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        h.deadlines
            .due(
                time::OffsetDateTime::now_utc() + time::Duration::days(1),
                10
            )
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn another_tenant_gets_404_for_every_route_of_a_sandbox_not_its_own() {
    let h = harness();
    let answer = create(
        &h,
        KEY_A,
        json!({"templateID": "base", "metadata": {"who": "a"}}),
    )
    .await;
    let id = answer["sandboxID"].as_str().unwrap().to_owned();
    let b = [("x-api-key", KEY_B)];
    for (method, uri, body) in [
        ("GET", format!("/sandboxes/{id}"), None),
        ("DELETE", format!("/sandboxes/{id}"), None),
        (
            "POST",
            format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 10})),
        ),
        (
            "POST",
            format!("/sandboxes/{id}/refreshes"),
            Some(json!({"duration": 10})),
        ),
        (
            "POST",
            format!("/v2/sandboxes/{id}/connect"),
            Some(json!({})),
        ),
        (
            "POST",
            format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 10})),
        ),
        ("POST", format!("/sandboxes/{id}/pause"), Some(json!({}))),
        ("POST", format!("/sandboxes/{id}/resume"), Some(json!({}))),
    ] {
        let (status, _, answer) = call(&h, method, &uri, &b, body).await;
        assert_error(status, &answer, StatusCode::NOT_FOUND);
        assert!(
            answer["message"].as_str().unwrap().contains(&id),
            "{answer}"
        );
    }
    let (status, _, listed) = call(&h, "GET", "/v2/sandboxes", &b, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed, json!([]), "B lists none of A's");
    let (_, _, listed) = call(&h, "GET", "/sandboxes", &b, None).await;
    assert_eq!(listed, json!([]));
    // A still has it, untouched.
    let (status, _, _) = call(
        &h,
        "GET",
        &format!("/sandboxes/{id}"),
        &[("x-api-key", KEY_A)],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // And B cannot reach its envd: B's own sandbox's token does not open A's.
    let b_sandbox = create(&h, KEY_B, json!({"templateID": "base"})).await;
    let b_token = b_sandbox["envdAccessToken"].as_str().unwrap();
    let (status, _, answer) = call(
        &h,
        "POST",
        "/process.Process/List",
        &[
            ("e2b-sandbox-id", &id),
            ("e2b-sandbox-port", "49983"),
            ("x-access-token", b_token),
        ],
        Some(json!({})),
    )
    .await;
    assert_error(status, &answer, StatusCode::NOT_FOUND);
    assert!(
        h.envd.seen.lock().unwrap().is_empty(),
        "nothing reached an agent"
    );
}

#[tokio::test]
async fn listing_filters_by_metadata_as_the_sdk_encodes_it_and_pages() {
    let h = harness();
    let mut ids = Vec::new();
    for _ in 0..5 {
        let a = create(
            &h,
            KEY_A,
            json!({"templateID": "base", "metadata": {"user": "a b&c=d"}}),
        )
        .await;
        ids.push(a["sandboxID"].as_str().unwrap().to_owned());
    }
    create(
        &h,
        KEY_A,
        json!({"templateID": "base", "metadata": {"user": "other"}}),
    )
    .await;
    // What SDK 2.63 sends for {"user": "a b&c=d"}, limit 2.
    let mut seen = Vec::new();
    let mut next: Option<String> = None;
    for _ in 0..10 {
        let mut uri = "/v2/sandboxes?metadata=user%3Da%252520b%252526c%25253Dd&state=running%2Cpaused&limit=2".to_owned();
        if let Some(token) = &next {
            uri.push_str(&format!("&nextToken={token}"));
        }
        let (status, headers, page) = call(&h, "GET", &uri, &[("x-api-key", KEY_A)], None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let items = page.as_array().unwrap();
        assert!(items.len() <= 2);
        for item in items {
            for key in [
                "templateID",
                "sandboxID",
                "clientID",
                "startedAt",
                "endAt",
                "cpuCount",
                "memoryMB",
                "diskSizeMB",
                "state",
                "envdVersion",
            ] {
                assert!(item.get(key).is_some(), "{key}: {item}");
            }
            seen.push(item["sandboxID"].as_str().unwrap().to_owned());
        }
        next = headers
            .get("x-next-token")
            .map(|v| v.to_str().unwrap().to_owned());
        if next.is_none() {
            break;
        }
    }
    assert!(next.is_none(), "paging ends");
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "no sandbox twice: {seen:?}");
    ids.sort();
    assert_eq!(sorted, ids);
    // Both orders, by start time.
    for (order, newest_first) in [("asc", false), ("desc", true)] {
        let (status, _, page) = call(
            &h,
            "GET",
            &format!("/v2/sandboxes?order={order}"),
            &[("x-api-key", KEY_A)],
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let started: Vec<time::OffsetDateTime> = page
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                time::OffsetDateTime::parse(
                    i["startedAt"].as_str().unwrap(),
                    &time::format_description::well_known::Rfc3339,
                )
                .unwrap()
            })
            .collect();
        let mut sorted = started.clone();
        sorted.sort();
        if newest_first {
            sorted.reverse();
        }
        assert_eq!(started, sorted, "order={order}");
    }
    // A bad filter, state or cursor is a 400, not an empty list; so is a filter this server
    // does not support (answering a wider set than asked would be worse).
    for uri in [
        "/v2/sandboxes?metadata=novalue",
        "/v2/sandboxes?state=exploded",
        "/v2/sandboxes?limit=0",
        "/v2/sandboxes?limit=101",
        "/v2/sandboxes?nextToken=forged",
        "/v2/sandboxes?order=sideways",
        "/v2/sandboxes?startedAfter=2026-01-01T00:00:00Z",
        "/v2/sandboxes?template=base",
        "/sandboxes?state=running",
    ] {
        let (status, _, answer) = call(&h, "GET", uri, &[("x-api-key", KEY_A)], None).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST);
    }
}

#[tokio::test]
async fn timeouts_set_extend_and_kill_clears_the_deadline() {
    let h = harness();
    let a = create(&h, KEY_A, json!({"templateID": "base", "timeout": 60})).await;
    let id = a["sandboxID"].as_str().unwrap().to_owned();
    let key = [("x-api-key", KEY_A)];
    let now = time::OffsetDateTime::now_utc;
    let (status, _, _) = call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        &key,
        Some(json!({"timeout": 1800})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let d = h.deadlines.deadline(&id).await.unwrap().unwrap();
    assert!(d - now() > time::Duration::seconds(1700), "{d}");
    // Set-timeout overwrites, shorter too; connect and refreshes only extend.
    call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        &key,
        Some(json!({"timeout": 30})),
    )
    .await;
    let short = h.deadlines.deadline(&id).await.unwrap().unwrap();
    assert!(short - now() <= time::Duration::seconds(31));
    let (status, _, answer) = call(
        &h,
        "POST",
        &format!("/v2/sandboxes/{id}/connect"),
        &key,
        Some(json!({"timeout": 10})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "running: 200 {answer}");
    assert_eq!(answer["sandboxID"], json!(id));
    assert_eq!(
        h.deadlines.deadline(&id).await.unwrap().unwrap(),
        short,
        "a shorter connect timeout does not cut it"
    );
    call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/refreshes"),
        &key,
        Some(json!({"duration": 600})),
    )
    .await;
    assert!(
        h.deadlines.deadline(&id).await.unwrap().unwrap() - now() > time::Duration::seconds(590)
    );
    let (status, _, body) = call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/refreshes"),
        &key,
        Some(json!({"duration": 3601})),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, _, body) = call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        &key,
        Some(json!({})),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);

    let (status, _, _) = call(&h, "DELETE", &format!("/sandboxes/{id}"), &key, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(h.deadlines.deadline(&id).await.unwrap(), None);
    let (status, _, body) = call(&h, "DELETE", &format!("/sandboxes/{id}"), &key, None).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, _, body) = call(&h, "GET", "/sandboxes/not-an-id", &key, None).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_tenants_sandbox_limit_is_429() {
    let h = harness_with(Some(2));
    create(&h, KEY_A, json!({"templateID": "base"})).await;
    create(&h, KEY_A, json!({"templateID": "base"})).await;
    let (status, headers, body) = call(
        &h,
        "POST",
        "/v2/sandboxes",
        &[("x-api-key", KEY_A)],
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_error(status, &body, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.get("retry-after").is_some());
    // Another tenant has its own count.
    create(&h, KEY_B, json!({"templateID": "base"})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_creates_cannot_race_past_the_limit() {
    let h = Arc::new(harness_with(Some(3)));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let h = Arc::clone(&h);
            tokio::spawn(async move {
                call(
                    &h,
                    "POST",
                    "/v2/sandboxes",
                    &[("x-api-key", KEY_A)],
                    Some(json!({"templateID": "base"})),
                )
                .await
                .0
            })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::CREATED => created += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("{other}"),
        }
    }
    assert_eq!(created, 3);
    assert_eq!(
        h.provider
            .list(&sandbox_core::ListFilter::default())
            .await
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test]
async fn the_router_relays_authorised_requests_without_credentials() {
    let h = harness();
    let a = create(&h, KEY_A, json!({"templateID": "base"})).await;
    let id = a["sandboxID"].as_str().unwrap().to_owned();
    let token = a["envdAccessToken"].as_str().unwrap().to_owned();
    let route = |extra: &[(&'static str, String)]| {
        let mut v: Vec<(&str, String)> = vec![
            ("e2b-sandbox-id", id.clone()),
            ("e2b-sandbox-port", "49983".to_owned()),
        ];
        v.extend(extra.iter().cloned());
        v
    };
    let call_with =
        |h: &Harness, method: &'static str, uri: String, headers: Vec<(&'static str, String)>| {
            let app = h.app.clone();
            async move {
                let mut r = Request::builder().method(method).uri(uri);
                for (k, v) in &headers {
                    r = r.header(*k, v);
                }
                let response = app.oneshot(r.body(Body::empty()).unwrap()).await.unwrap();
                let status = response.status();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        };

    // The right token: relayed, without the routing and credential headers.
    let (status, body) = call_with(
        &h,
        "POST",
        "/process.Process/List".into(),
        route(&[
            ("x-access-token", token.clone()),
            ("authorization", "Basic dXNlcjo=".into()),
        ]),
    )
    .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "relayed"));
    {
        let seen = h.envd.seen.lock().unwrap();
        let (_, method, uri, headers) = seen.last().unwrap();
        assert_eq!(
            (method.as_str(), uri.as_str()),
            ("POST", "/process.Process/List")
        );
        for gone in ["x-access-token", "e2b-sandbox-id", "e2b-sandbox-port"] {
            assert!(headers.get(gone).is_none(), "{gone} relayed");
        }
        assert!(
            headers.get("authorization").is_some(),
            "the user selection passes"
        );
    }
    // By Host instead of headers.
    let (status, _) = call_with(
        &h,
        "GET",
        "/envs".into(),
        vec![
            ("host", format!("49983-{id}.sbx.test:3000")),
            ("x-access-token", token.clone()),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    // A wrong, tampered or missing token: 401 in envd's JSON shape, nothing relayed.
    let before = h.envd.seen.lock().unwrap().len();
    let tampered = format!("{}x", &token[..token.len() - 1]);
    for t in [Some("nonsense".to_owned()), Some(tampered), None] {
        let extra: Vec<(&'static str, String)> =
            t.into_iter().map(|t| ("x-access-token", t)).collect();
        let (status, body) = call_with(
            &h,
            "POST",
            "/filesystem.Filesystem/Stat".into(),
            route(&extra),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["code"], 401);
    }
    // A token of the same tenant's other sandbox is a wrong token here: 401.
    let other = create(&h, KEY_A, json!({"templateID": "base"})).await;
    let other_token = other["envdAccessToken"].as_str().unwrap().to_owned();
    let (status, _) = call_with(
        &h,
        "POST",
        "/filesystem.Filesystem/Stat".into(),
        route(&[("x-access-token", other_token)]),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Another port is a preview port: nothing listens on 8080 (502); an absent sandbox is
    // 404 (502 for /health).
    let (status, _) = call_with(
        &h,
        "GET",
        "/".into(),
        vec![
            ("e2b-sandbox-id", id.clone()),
            ("e2b-sandbox-port", "8080".into()),
            ("x-access-token", token.clone()),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let (status, _) = call_with(
        &h,
        "POST",
        "/process.Process/List".into(),
        vec![
            ("e2b-sandbox-id", "i0000000000000000000".into()),
            ("e2b-sandbox-port", "49983".into()),
            ("x-access-token", token.clone()),
        ],
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a genuine token, and no such sandbox"
    );
    let (status, _) = call_with(
        &h,
        "GET",
        "/health".into(),
        vec![
            ("e2b-sandbox-id", "i0000000000000000000".into()),
            ("e2b-sandbox-port", "49983".into()),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(h.envd.seen.lock().unwrap().len(), before);
    // /health needs no token.
    let (status, _) = call_with(&h, "GET", "/health".into(), route(&[])).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn signed_file_urls_open_their_path_until_they_expire() {
    let h = harness();
    let a = create(&h, KEY_A, json!({"templateID": "base"})).await;
    let id = a["sandboxID"].as_str().unwrap().to_owned();
    let token = a["envdAccessToken"].as_str().unwrap().to_owned();
    let go = |uri: String, method: &'static str| {
        let app = h.app.clone();
        let id = id.clone();
        async move {
            let r = Request::builder()
                .method(method)
                .uri(uri)
                .header("e2b-sandbox-id", id)
                .header("e2b-sandbox-port", "49983")
                .body(Body::empty())
                .unwrap();
            app.oneshot(r).await.unwrap().status()
        }
    };
    let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let later = time::OffsetDateTime::now_utc().unix_timestamp() + 600;
    let read = file_signature(
        "/home/user/a.txt",
        FileOperation::Read,
        Some("user"),
        &token,
        Some(later),
    );
    let ok = format!(
        "/files?path={}&username=user&signature={}&signature_expiration={later}",
        enc("/home/user/a.txt"),
        enc(&read)
    );
    assert_eq!(go(ok.clone(), "GET").await, StatusCode::OK);
    {
        let seen = h.envd.seen.lock().unwrap();
        let uri = &seen.last().unwrap().2;
        assert!(
            !uri.contains("signature"),
            "the signature stays at the router: {uri}"
        );
        assert!(uri.contains("username=user"), "{uri}");
    }
    // The same URL for writing, another path, a stretched expiry, or an expired one: 401.
    assert_eq!(go(ok.clone(), "POST").await, StatusCode::UNAUTHORIZED);
    let other = ok.replace("a.txt", "b.txt");
    assert_eq!(go(other, "GET").await, StatusCode::UNAUTHORIZED);
    let stretched = ok.replace(&later.to_string(), &(later + 1).to_string());
    assert_eq!(go(stretched, "GET").await, StatusCode::UNAUTHORIZED);
    let past = later - 1200;
    let old = file_signature(
        "/home/user/a.txt",
        FileOperation::Read,
        Some("user"),
        &token,
        Some(past),
    );
    let expired = format!(
        "/files?path={}&username=user&signature={}&signature_expiration={past}",
        enc("/home/user/a.txt"),
        enc(&old)
    );
    assert_eq!(go(expired, "GET").await, StatusCode::UNAUTHORIZED);
    // A signature opens /files only.
    assert_eq!(
        go(format!("/envs?signature={}", enc(&read)), "GET").await,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn an_oversized_body_is_413_and_creates_nothing() {
    let h = harness();
    let huge = "x".repeat(sandbox_app::e2b::MAX_BODY_BYTES + 1);
    let (status, _, body) = call(
        &h,
        "POST",
        "/v2/sandboxes",
        &[("x-api-key", KEY_A)],
        Some(json!({"templateID": "base", "metadata": {"big": huge}})),
    )
    .await;
    assert_error(status, &body, StatusCode::PAYLOAD_TOO_LARGE);
    let many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let (status, _, body) = call(
        &h,
        "POST",
        "/v2/sandboxes",
        &[("x-api-key", KEY_A)],
        Some(json!({"templateID": "base", "metadata": many})),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert!(
        h.provider
            .list(&sandbox_core::ListFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn the_control_plane_health_and_unknown_routes_answer_json() {
    let h = harness();
    let (status, _, body) = call(&h, "GET", "/health", &[], None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!("Health check successful"));
    let (status, _, body) = call(&h, "GET", "/v2/nothing", &[("x-api-key", KEY_A)], None).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let _ = TenantId::new(1).unwrap();
}

/// The sandbox's state as the provider reports it.
async fn provider_state(h: &Harness, e2b_id: &str) -> sandbox_core::SandboxState {
    let all = h
        .provider
        .list(&sandbox_core::ListFilter::default())
        .await
        .unwrap();
    all.iter()
        .find(|s| s.metadata.get("sandbox.e2b.id").map(String::as_str) == Some(e2b_id))
        .map(|s| s.state)
        .unwrap()
}

fn listed_ids(listed: &Value) -> Vec<String> {
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandboxID"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn pause_connect_and_the_legacy_resume_answer_as_the_api_does() {
    let h = harness();
    let a = create(&h, KEY_A, json!({"templateID": "base", "timeout": 60})).await;
    let id = a["sandboxID"].as_str().unwrap().to_owned();
    let key = [("x-api-key", KEY_A)];
    let now = time::OffsetDateTime::now_utc;

    let (status, _, body) = call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/pause"),
        &key,
        Some(json!({"memory": false})),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert!(
        body["message"].as_str().unwrap().contains("memory"),
        "{body}"
    );
    assert_eq!(
        provider_state(&h, &id).await,
        sandbox_core::SandboxState::Running
    );

    // The SDK's body, then none at all for the second.
    let (status, _, body) = call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/pause"),
        &key,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(
        provider_state(&h, &id).await,
        sandbox_core::SandboxState::Paused
    );
    assert_eq!(
        h.deadlines.deadline(&id).await.unwrap(),
        None,
        "a paused sandbox has no deadline"
    );
    let (status, _, body) = call(&h, "POST", &format!("/sandboxes/{id}/pause"), &key, None).await;
    assert_error(status, &body, StatusCode::CONFLICT);
    assert_eq!(
        body["message"],
        json!(format!(
            "Error pausing sandbox - sandbox '{id}' is already paused"
        ))
    );
    let (status, _, detail) = call(&h, "GET", &format!("/sandboxes/{id}"), &key, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(detail["state"], json!("paused"), "{detail}");
    let (_, _, paused) = call(&h, "GET", "/v2/sandboxes?state=paused", &key, None).await;
    assert_eq!(listed_ids(&paused), vec![id.clone()]);
    let (_, _, running) = call(&h, "GET", "/v2/sandboxes?state=running", &key, None).await;
    assert!(listed_ids(&running).is_empty(), "{running}");
    let (_, _, legacy) = call(&h, "GET", "/sandboxes", &key, None).await;
    assert!(
        listed_ids(&legacy).is_empty(),
        "the legacy list shows running ones only"
    );

    // Connect resumes it: 201, and the deadline is now + the connect's timeout.
    let (status, _, answer) = call(
        &h,
        "POST",
        &format!("/v2/sandboxes/{id}/connect"),
        &key,
        Some(json!({"timeout": 120})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "paused: 201 {answer}");
    assert_eq!(answer["sandboxID"], json!(id));
    assert_eq!(answer["envdVersion"], json!(ENVD_VERSION));
    assert_eq!(
        provider_state(&h, &id).await,
        sandbox_core::SandboxState::Running
    );
    let d = h.deadlines.deadline(&id).await.unwrap().unwrap() - now();
    assert!(
        d > time::Duration::seconds(110) && d <= time::Duration::seconds(121),
        "{d}"
    );
    let (status, _, _) = call(
        &h,
        "POST",
        &format!("/v2/sandboxes/{id}/connect"),
        &key,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "running: 200");

    // The legacy resume: 409 while it runs, 201 (and a 15 s default) once paused.
    let (status, _, body) = call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/resume"),
        &key,
        Some(json!({})),
    )
    .await;
    assert_error(status, &body, StatusCode::CONFLICT);
    let (status, _, _) = call(&h, "POST", &format!("/sandboxes/{id}/pause"), &key, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, body) = call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/resume"),
        &key,
        Some(json!({"autoPause": true})),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let (status, _, answer) = call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/resume"),
        &key,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["sandboxID"], json!(id));
    let d = h.deadlines.deadline(&id).await.unwrap().unwrap() - now();
    assert!(d <= time::Duration::seconds(16), "{d}");
    assert_eq!(
        provider_state(&h, &id).await,
        sandbox_core::SandboxState::Running
    );

    // The old connect route resumes too.
    call(&h, "POST", &format!("/sandboxes/{id}/pause"), &key, None).await;
    let (status, _, _) = call(
        &h,
        "POST",
        &format!("/sandboxes/{id}/connect"),
        &key,
        Some(json!({"timeout": 30})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);

    for uri in ["/sandboxes/inosuch/pause", "/sandboxes/inosuch/resume"] {
        let (status, _, body) = call(&h, "POST", uri, &key, Some(json!({}))).await;
        assert_error(status, &body, StatusCode::NOT_FOUND);
    }
}

#[tokio::test]
async fn auto_pause_pauses_at_the_timeout_instead_of_killing() {
    let h = harness();
    let key = [("x-api-key", KEY_A)];
    let pausing = create(
        &h,
        KEY_A,
        json!({"templateID": "base", "timeout": 60, "autoPause": true, "autoPauseMemory": true}),
    )
    .await;
    let pausing = pausing["sandboxID"].as_str().unwrap().to_owned();
    let killing = create(&h, KEY_A, json!({"templateID": "base", "timeout": 60})).await;
    let killing = killing["sandboxID"].as_str().unwrap().to_owned();
    let (_, _, detail) = call(&h, "GET", &format!("/sandboxes/{pausing}"), &key, None).await;
    assert_eq!(detail["lifecycle"]["onTimeout"], json!("pause"), "{detail}");
    let (_, _, detail) = call(&h, "GET", &format!("/sandboxes/{killing}"), &key, None).await;
    assert_eq!(detail["lifecycle"]["onTimeout"], json!("kill"), "{detail}");
    let (status, _, body) = call(
        &h,
        "POST",
        "/v2/sandboxes",
        &key,
        Some(json!({"templateID": "base", "autoPause": true, "autoPauseMemory": false})),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("autoPauseMemory"),
        "{body}"
    );

    let expiry = sandbox_app::e2b::expiry::Expiry::new(
        h.api.deadlines(),
        h.api.expiry_target(),
        Duration::from_secs(300),
    );
    let later = time::OffsetDateTime::now_utc() + time::Duration::seconds(61);
    let report = expiry.sweep_once(later).await.unwrap();
    let keys =
        |v: &[sandbox_app::e2b::expiry::Kill]| v.iter().map(|k| k.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&report.paused), vec![pausing.clone()], "{report:?}");
    assert_eq!(keys(&report.killed), vec![killing.clone()], "{report:?}");
    assert_eq!(
        provider_state(&h, &pausing).await,
        sandbox_core::SandboxState::Paused
    );
    assert_eq!(h.deadlines.deadline(&pausing).await.unwrap(), None);
    let (status, _, _) = call(&h, "GET", &format!("/sandboxes/{killing}"), &key, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the other one was killed");
    // A restart's reconcile gives the paused one no deadline back.
    let reconciled = expiry.reconcile(later).await.unwrap();
    assert!(reconciled.assigned.is_empty(), "{reconciled:?}");
    assert_eq!(h.deadlines.deadline(&pausing).await.unwrap(), None);

    let (status, _, _) = call(
        &h,
        "POST",
        &format!("/v2/sandboxes/{pausing}/connect"),
        &key,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(h.deadlines.deadline(&pausing).await.unwrap().is_some());
}

/// The `sandbox_http_requests_total` series of `api`, as `(labels, value)` lines.
fn request_series(h: &Harness, api: &str) -> Vec<String> {
    let text = h.metrics.encode().unwrap();
    text.lines()
        .filter(|l| l.starts_with("sandbox_http_requests_total{"))
        .filter(|l| l.contains(&format!("api=\"{api}\"")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn every_request_is_counted_by_route_template_with_the_e2b_api_label() {
    let h = harness();
    let a = create(&h, KEY_A, json!({"templateID": "base"})).await;
    let id = a["sandboxID"].as_str().unwrap().to_owned();
    let token = a["envdAccessToken"].as_str().unwrap().to_owned();
    let (status, _, _) = call(
        &h,
        "GET",
        "/sandboxes/inope0000000000000000",
        &[("x-api-key", KEY_A)],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = call(
        &h,
        "GET",
        &format!("/sandboxes/{id}"),
        &[("x-api-key", "wrong")],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let envd = [
        ("e2b-sandbox-id", id.as_str()),
        ("e2b-sandbox-port", "49983"),
        ("x-access-token", token.as_str()),
    ];
    let (status, _, _) = call(&h, "POST", "/process.Process/List", &envd, None).await;
    assert_eq!(status, StatusCode::OK);

    let series = request_series(&h, "e2b");
    let has = |needle: &str| series.iter().any(|l| l.contains(needle));
    for expected in [
        r#"method="POST",route="/v2/sandboxes",status="201"} 1"#,
        r#"method="GET",route="/sandboxes/{id}",status="404"} 1"#,
        r#"method="GET",route="/sandboxes/{id}",status="401"} 1"#,
        r#"method="POST",route="envd /process.Process",status="200"} 1"#,
    ] {
        assert!(has(expected), "no series with {expected} in {series:#?}");
    }
    // The latency family carries the label too.
    let text = h.metrics.encode().unwrap();
    assert!(
        text.contains(
            r#"sandbox_http_request_duration_seconds_count{api="e2b",route="/v2/sandboxes"} 1"#
        ),
        "{text}"
    );
    // Nothing is labelled with a path a caller chose: a thousand made-up paths, on both
    // planes, add at most a handful of series.
    let before = request_series(&h, "e2b").len();
    for i in 0..500 {
        let path = format!("/made-up/{i}");
        call(&h, "GET", &path, &[("x-api-key", KEY_A)], None).await;
        call(&h, "GET", &path, &envd, None).await;
    }
    let after = request_series(&h, "e2b").len();
    assert!(after <= before + 4, "{before} series before, {after} after");
    assert!(
        request_series(&h, "e2b")
            .iter()
            .all(|l| !l.contains("made-up")),
        "a raw path became a label"
    );
}

/// A writer the test's subscriber logs into.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test]
async fn api_keys_and_tokens_never_reach_the_logs() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let h = harness();
    let a = create(&h, KEY_A, json!({"templateID": "base", "timeout": 60})).await;
    let id = a["sandboxID"].as_str().unwrap().to_owned();
    let token = a["envdAccessToken"].as_str().unwrap().to_owned();
    let wrong_token = format!("{token}x");
    // Successes, refusals and failures, on both planes, each carrying a credential.
    call(
        &h,
        "GET",
        &format!("/sandboxes/{id}"),
        &[("x-api-key", KEY_A)],
        None,
    )
    .await;
    call(
        &h,
        "GET",
        "/sandboxes",
        &[("authorization", &format!("Bearer {KEY_B}"))],
        None,
    )
    .await;
    call(
        &h,
        "GET",
        "/v2/sandboxes",
        &[("x-api-key", "e2b_not_a_key_of_anyone")],
        None,
    )
    .await;
    call(
        &h,
        "POST",
        "/v2/sandboxes",
        &[("x-api-key", KEY_A)],
        Some(json!({"templateID": "nope"})),
    )
    .await;
    for t in [token.as_str(), wrong_token.as_str()] {
        call(
            &h,
            "POST",
            "/process.Process/List",
            &[
                ("e2b-sandbox-id", id.as_str()),
                ("e2b-sandbox-port", "49983"),
                ("x-access-token", t),
            ],
            None,
        )
        .await;
    }
    call(
        &h,
        "DELETE",
        &format!("/sandboxes/{id}"),
        &[("x-api-key", KEY_A)],
        None,
    )
    .await;

    // A closed sandbox's traffic token, on a preview port with and without it.
    let closed = create(
        &h,
        KEY_A,
        json!({"templateID": "base", "network": {"allowPublicTraffic": false}}),
    )
    .await;
    let closed_id = closed["sandboxID"].as_str().unwrap().to_owned();
    let traffic = closed["trafficAccessToken"].as_str().unwrap().to_owned();
    for t in [Some(traffic.as_str()), Some("et1.1.forged.mac"), None] {
        let mut headers = vec![("host", format!("8000-{closed_id}.sbx.test"))];
        if let Some(t) = t {
            headers.push(("e2b-traffic-access-token", t.to_owned()));
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        call(&h, "GET", "/index.html", &headers, None).await;
    }

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    // The log did see these requests: the create, the kill and the refused key.
    for seen in ["sandbox created", "sandbox killed", "no valid API key"] {
        assert!(text.contains(seen), "{seen} not logged:\n{text}");
    }
    for secret in [
        KEY_A,
        KEY_B,
        "e2b_not_a_key_of_anyone",
        token.as_str(),
        traffic.as_str(),
        traffic.rsplit('.').next().unwrap(),
    ] {
        assert!(!text.contains(secret), "{secret} was logged:\n{text}");
    }
    // The token's MAC is what makes it secret: not even that part appears.
    let mac = token.rsplit('.').next().unwrap();
    assert!(mac.len() >= 16 && !text.contains(mac), "{text}");
}

/// Ports of every sandbox that read what they are sent and never answer (port 9000 only;
/// every other port is the fake's own), counting the tunnels open to them.
#[derive(Debug, Default)]
struct SilentPorts {
    live: Arc<std::sync::atomic::AtomicUsize>,
}

#[derive(Debug)]
struct Swallow;

#[async_trait::async_trait]
impl sandbox_core::TunnelSink for Swallow {
    async fn send(&mut self, _data: Vec<u8>) -> Result<(), Error> {
        Ok(())
    }
    async fn finish(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

#[derive(Debug)]
struct Silent(Arc<std::sync::atomic::AtomicUsize>);

#[async_trait::async_trait]
impl sandbox_core::TunnelSource for Silent {
    async fn recv(&mut self) -> Option<Result<Vec<u8>, Error>> {
        std::future::pending().await
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl sandbox_testkit::forward::ProviderHooks for SilentPorts {
    async fn open_tunnel(
        &self,
        next: &dyn sandbox_core::Tunnels,
        sandbox: &sandbox_core::SandboxHandle,
        port: u16,
    ) -> Result<sandbox_core::Tunnel, Error> {
        if port != 9000 {
            return next.open_tunnel(sandbox, port).await;
        }
        self.live.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(sandbox_core::Tunnel {
            sink: Box::new(Swallow),
            source: Box::new(Silent(Arc::clone(&self.live))),
        })
    }
}

fn preview_harness() -> (Harness, Arc<std::sync::atomic::AtomicUsize>) {
    let hooks = SilentPorts::default();
    let live = Arc::clone(&hooks.live);
    let fake: Arc<dyn SandboxProvider> = Arc::new(FakeProvider::new());
    let provider = sandbox_testkit::forward::Forward::new(fake, hooks);
    (harness_on(Arc::new(provider), None), live)
}

fn preview_request(id: &str, port: u16, token: Option<&str>) -> Request<Body> {
    let mut request = Request::builder()
        .method("GET")
        .uri("/index.html")
        .header("host", format!("{port}-{id}.sbx.test"));
    if let Some(token) = token {
        request = request.header("e2b-traffic-access-token", token);
    }
    request.body(Body::empty()).unwrap()
}

async fn preview(
    h: &Harness,
    id: &str,
    port: u16,
    token: Option<&str>,
) -> (StatusCode, HeaderMap, Value) {
    let response = h
        .app
        .clone()
        .oneshot(preview_request(id, port, token))
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, headers, value)
}

/// The backend's handle of E2B sandbox `id`.
async fn backend_handle(h: &Harness, id: &str) -> sandbox_core::SandboxHandle {
    let listed = h
        .provider
        .list(&sandbox_core::ListFilter::default())
        .await
        .unwrap();
    let summary = listed
        .into_iter()
        .find(|s| s.metadata.get("sandbox.e2b.id").map(String::as_str) == Some(id))
        .expect("the sandbox is listed");
    sandbox_core::SandboxHandle::new(summary.id, h.provider.provider())
}

async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn preview_ports_want_the_traffic_token_when_public_traffic_is_closed() {
    let (h, _) = preview_harness();
    let closed = create(
        &h,
        KEY_A,
        json!({"templateID": "base", "network": {"allowPublicTraffic": false}}),
    )
    .await;
    let open = create(&h, KEY_A, json!({"templateID": "base"})).await;
    let id = closed["sandboxID"].as_str().unwrap().to_owned();
    let open_id = open["sandboxID"].as_str().unwrap().to_owned();
    let token = closed["trafficAccessToken"]
        .as_str()
        .expect("a traffic token")
        .to_owned();
    assert!(token.starts_with("et1.1."), "{token}");
    assert_ne!(closed["envdAccessToken"].as_str(), Some(token.as_str()));
    assert_eq!(open["trafficAccessToken"], Value::Null, "{open}");
    // The echo server busybox runs as `nc -ll -p 8000 -e cat`, on the closed sandbox.
    let handle = backend_handle(&h, &id).await;
    sandbox_core::narrow::processes(&*h.provider)
        .unwrap()
        .start_process(
            &handle,
            sandbox_core::ProcessSpec::argv(
                "nc",
                ["-ll", "-p", "8000", "-e", "cat"].map(str::to_owned),
            ),
        )
        .await
        .unwrap();

    // Closed: no token, the envd token, another sandbox's traffic token, junk: all 403.
    let other = create(
        &h,
        KEY_A,
        json!({"templateID": "base", "network": {"allowPublicTraffic": false}}),
    )
    .await;
    let envd_token = closed["envdAccessToken"].as_str().unwrap().to_owned();
    let other_token = other["trafficAccessToken"].as_str().unwrap().to_owned();
    for wrong in [
        None,
        Some(envd_token.as_str()),
        Some(other_token.as_str()),
        Some("et1.1.x.y"),
    ] {
        let (status, _, body) = preview(&h, &id, 8000, wrong).await;
        assert_error(status, &body, StatusCode::FORBIDDEN);
    }
    // With its token the request is relayed: nothing listens on 8001 (502, said so), and the
    // echo on 8000 is reached but answers no HTTP (its answer is the request itself).
    let (status, _, body) = preview(&h, &id, 8001, Some(&token)).await;
    assert_error(status, &body, StatusCode::BAD_GATEWAY);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("nothing listens on port 8001"),
        "{body}"
    );
    // The server listens once its task first runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let (status, _, body) = preview(&h, &id, 8000, Some(&token)).await;
        let closed = body["message"]
            .as_str()
            .unwrap_or("")
            .contains("nothing listens");
        if !closed || std::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_error(status, &body, StatusCode::BAD_GATEWAY);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("did not answer an HTTP request"),
        "{body}"
    );
    // An open sandbox wants no token; an absent one is 404.
    let (status, _, body) = preview(&h, &open_id, 8001, None).await;
    assert_error(status, &body, StatusCode::BAD_GATEWAY);
    let (status, _, body) = preview(&h, "i0000000000000000000", 8000, Some(&token)).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    // The envd port keeps its own rules: the traffic token is not an access token.
    let (status, _, _) = preview(&h, &id, 49983, Some(&token)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Nothing of this reached the envd plane.
    assert!(h.envd.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn preview_requests_past_the_bound_are_429_and_a_gone_caller_frees_its_place() {
    let (h, live) = preview_harness();
    let open = create(&h, KEY_A, json!({"templateID": "base"})).await;
    let id = open["sandboxID"].as_str().unwrap().to_owned();
    // The harness bounds a sandbox to 2: two requests whose program never answers hold them.
    let hang = |h: &Harness| {
        let app = h.app.clone();
        let request = preview_request(&id, 9000, None);
        tokio::spawn(async move { app.oneshot(request).await })
    };
    let first = hang(&h);
    let second = hang(&h);
    wait_until("two tunnels open", || {
        live.load(std::sync::atomic::Ordering::SeqCst) == 2
    })
    .await;
    let (status, headers, body) = preview(&h, &id, 9000, None).await;
    assert_error(status, &body, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    // The bound is per sandbox: another sandbox is not held back.
    let other = create(&h, KEY_A, json!({"templateID": "base"})).await;
    let (status, _, _) = preview(&h, other["sandboxID"].as_str().unwrap(), 8001, None).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    // Callers that go away close their tunnels and free their places.
    first.abort();
    second.abort();
    wait_until("the tunnels closed", || {
        live.load(std::sync::atomic::Ordering::SeqCst) == 0
    })
    .await;
    let third = hang(&h);
    wait_until("a tunnel open again", || {
        live.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    third.abort();
    wait_until("closed again", || {
        live.load(std::sync::atomic::Ordering::SeqCst) == 0
    })
    .await;
}
