//! Shared by the hermetic HTTP tests (`http_properties`, `api_golden`): the router over the
//! in-memory fake provider, the seeded sessions, the proptest strategies of random input for
//! every route of the generated OpenAPI document (`sandbox_app::http::openapi::document`, read
//! into [`Route`]s), and a request sender. Each test binary uses a part of it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub(crate) mod golden;
pub(crate) mod schema_check;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http_body_util::BodyExt;
use proptest::prelude::*;
use sandbox_app::api::errors::CODES_EXTENSION;
use sandbox_app::auth::{TenantAuth, digest, hex};
use sandbox_app::config::Limits;
use sandbox_app::http::metrics::Metrics;
use sandbox_app::http::openapi::document;
use sandbox_app::http::{AppState, router};
use sandbox_core::{ConfigId, CreateRequest, PermissiveSessionExistence, SandboxProvider};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
use sandbox_session::manager::SessionManager;
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_testkit::fake::FakeProvider;
use serde_json::{Value, json};
use tower::ServiceExt as _;

pub(crate) const TOKEN: &str = "token-properties";

/// One operation of the generated document, with what these tests read of it.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// Upper case (`GET`).
    pub(crate) method: String,
    /// The router's path (`{name}` parameters, also OpenAPI's syntax).
    pub(crate) path: String,
    /// Names of the query parameters, in declaration order.
    pub(crate) query: Vec<String>,
    /// The component name of the JSON request body's schema, if there is one.
    pub(crate) request: Option<String>,
    /// Per documented status, the error codes its body can carry (empty: not an error answer).
    pub(crate) responses: std::collections::BTreeMap<u16, Vec<String>>,
    /// Per documented status, the media types of its body (empty: no body).
    pub(crate) media: std::collections::BTreeMap<u16, Vec<String>>,
}

impl Route {
    /// The path's `{name}` parameters.
    pub(crate) fn path_params(&self) -> impl Iterator<Item = &str> {
        self.path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
    }
}

/// The first `#/components/schemas/NAME` in `value`.
fn first_ref(value: &Value) -> Option<String> {
    let text = value.to_string();
    let at = text.find("#/components/schemas/")? + "#/components/schemas/".len();
    Some(
        text[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect(),
    )
}

/// Every operation of the generated document, in the document's order (paths sorted, then
/// methods), the same facts the served `GET /v1/openapi.json` has.
pub(crate) fn routes() -> Vec<Route> {
    let doc = document();
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            let query = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .map(|p| p["name"].as_str().expect("a name").to_owned())
                .collect();
            let request = first_ref(&op["requestBody"]["content"]["application/json"]);
            let responses = op["responses"]
                .as_object()
                .expect("responses")
                .iter()
                .map(|(status, r)| {
                    let codes = r[CODES_EXTENSION]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|c| c.as_str().expect("a code").to_owned())
                        .collect();
                    (status.parse().expect("a status"), codes)
                })
                .collect();
            let media = op["responses"]
                .as_object()
                .expect("responses")
                .iter()
                .map(|(status, r)| {
                    let media = r["content"]
                        .as_object()
                        .map(|c| c.keys().cloned().collect())
                        .unwrap_or_default();
                    (status.parse().expect("a status"), media)
                })
                .collect();
            out.push(Route {
                method: method.to_uppercase(),
                path: path.clone(),
                query,
                request,
                responses,
                media,
            });
        }
    }
    // A route missing here would go untested.
    assert!(out.len() >= 20, "{} operations", out.len());
    out
}

pub(crate) fn app() -> Router {
    let provider: Arc<dyn SandboxProvider> = Arc::new(FakeProvider::new());
    let lifecycle = Lifecycle::new(
        provider.clone(),
        Arc::new(MemoryBindingStore::new()),
        Arc::new(PermissiveSessionExistence),
        LifecycleConfig {
            config_id: ConfigId::default_config(),
            create_request: CreateRequest::new(FakeProvider::template()),
            requires_inbound_token: false,
        },
    )
    .unwrap();
    router(AppState {
        auth: Arc::new(TenantAuth::new([(7, hex(&digest(TOKEN)).as_str())]).unwrap()),
        manager: SessionManager::new(lifecycle),
        provider,
        metrics: Arc::new(Metrics::new()),
        limits: Limits::default(),
        tickets: Arc::new(sandbox_app::tickets::TerminalTickets::default()),
        store: sandbox_app::http::StoreInfo::memory(),
        budget: sandbox_app::http::body::InflightBudget::new(1 << 30),
    })
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub(crate) fn encode(raw: &str) -> String {
    let mut out = String::new();
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Debug, Clone)]
pub(crate) struct Input {
    pub(crate) authorization: Option<String>,
    pub(crate) session: String,
    pub(crate) query: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

pub(crate) fn authorization() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        14 => Just(Some(format!("Bearer {TOKEN}"))),
        1 => Just(None),
        1 => Just(Some("Bearer wrong-token".to_owned())),
        1 => Just(Some(TOKEN.to_owned())),
        1 => Just(Some("Bearer ".to_owned())),
        1 => Just(Some(format!("Basic {TOKEN}"))),
    ]
}

/// Session IDs; never empty (an empty segment addresses no route at all). `bound-*` sessions
/// have a sandbox (see [`seed`]).
pub(crate) fn session() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(BOUND.to_vec()).prop_map(str::to_owned),
        3 => "[a-z0-9-]{1,12}",
        1 => "[a-z]{0,4}[{}][a-z]{0,4}",
        1 => "[a-z]{0,4}[\\x00-\\x1f\\x7f][a-z]{0,4}",
        1 => "\\PC{1,12}",
        1 => any::<String>(),
        1 => "[a-z]{500,700}",
        1 => prop::sample::select(vec![" ", "..", ".", "a/b", "%", "?x=1", "#"]).prop_map(str::to_owned),
    ]
    .prop_filter("a non-empty segment", |s| !s.is_empty())
}

pub(crate) fn sandbox_path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("../etc/passwd".to_owned()),
        Just("relative/file.txt".to_owned()),
        Just("/workspace/../../etc/shadow".to_owned()),
        Just("/workspace/out.txt".to_owned()),
        Just("/workspace".to_owned()),
        "/workspace/[a-z]{1,8}",
        "/[a-z]{300,5000}",
        any::<String>(),
    ]
}

/// Query pairs, mostly the route's own parameters (and `path`) with odd values.
pub(crate) fn query(route: &Route) -> impl Strategy<Value = Vec<(String, String)>> + use<> {
    let mut names: Vec<String> = route.query.clone();
    names.push("path".to_owned());
    let value = prop_oneof![
        3 => sandbox_path(),
        1 => prop::sample::select(vec!["true", "false", "maybe", "1", "0", "-1", "99999", ""])
            .prop_map(str::to_owned),
        1 => any::<String>(),
    ];
    let pair = prop_oneof![
        6 => (prop::sample::select(names), value),
        1 => ("\\PC{0,8}", "\\PC{0,8}"),
        1 => (any::<String>(), any::<String>()),
    ];
    prop_oneof![
        2 => Just(Vec::new()),
        1 => prop::collection::vec(pair, 1..3),
    ]
}

pub(crate) fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        "\\PC{0,16}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,10}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

pub(crate) fn timeout_ms() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(Value::Null),
        Just(Value::Null),
        Just(Value::Null),
        Just(json!(0)),
        Just(json!(-5)),
        Just(json!(1)),
        Just(json!(5000)),
        Just(json!(i64::MAX)),
        Just(json!(1.5)),
        Just(json!("100")),
    ]
}

/// Exec specs close to valid: the fake's commands (never `sleep`), odd args, cwd, env, timeouts.
pub(crate) fn exec_spec() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just("echo"),
            Just("true"),
            Just("false"),
            Just("pwd"),
            Just("env"),
            Just("cat"),
            Just("exit"),
            Just("no-such-cmd"),
            Just(""),
            Just("echo hi | wc -c"),
        ],
        prop::collection::vec("\\PC{0,8}", 0..3),
        prop::option::of(any::<bool>()),
        prop::option::of(sandbox_path()),
        prop::collection::btree_map("[A-Za-z_=0-9 ]{0,6}", "\\PC{0,6}", 0..2),
        timeout_ms(),
        prop::option::of("\\PC{0,8}"),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(command, args, shell, cwd, env, timeout, stdin, extra)| {
            let mut spec =
                json!({ "command": command, "args": args, "env": env, "timeout_ms": timeout });
            if let Some(shell) = shell {
                spec["shell"] = json!(shell);
            }
            if let Some(cwd) = cwd {
                spec["cwd"] = json!(cwd);
            }
            if let Some(stdin) = stdin {
                spec["stdin"] = json!(stdin);
            }
            if extra {
                spec["unexpected"] = json!(1);
            }
            spec
        })
}

/// Script bodies close to valid, some the validator refuses.
pub(crate) fn script() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just("job.sh"),
            Just("job.py"),
            Just("job.js"),
            Just("job"),
            Just("../job.sh"),
            Just(".hidden.sh"),
            Just(""),
            Just("a/b.sh"),
        ],
        prop_oneof![
            Just("echo hi".to_owned()),
            Just("rm -rf / --no-preserve-root".to_owned()),
            Just("curl http://169.254.169.254/latest/meta-data".to_owned()),
            "\\PC{0,40}",
        ],
        prop::collection::vec("\\PC{0,8}", 0..3),
        prop::option::of("\\PC{0,8}"),
        timeout_ms(),
    )
        .prop_map(|(file_name, content, args, stdin, timeout)| {
            json!({ "file_name": file_name, "content": content, "args": args, "stdin": stdin, "timeout_ms": timeout })
        })
}

/// Bodies: anything at all, plus near-valid ones for the route's own request schema.
pub(crate) fn body(route: &Route, snapshot: String) -> impl Strategy<Value = Vec<u8>> + use<> {
    let own = route.request.clone().unwrap_or_default();
    let weight = |schema: &str| if schema == own.as_str() { 12 } else { 1 };
    prop_oneof![
        1 => Just(Vec::new()),
        1 => prop::collection::vec(any::<u8>(), 0..128),
        1 => json_value().prop_map(|v| v.to_string().into_bytes()),
        weight("ExecSpec") => exec_spec().prop_map(|v| v.to_string().into_bytes()),
        weight("ScriptRequest") => script().prop_map(|v| v.to_string().into_bytes()),
        weight("SnapshotRequest") => prop::option::of("\\PC{0,16}")
            .prop_map(|n| json!({ "name": n }).to_string().into_bytes()),
        1 => "\\PC{0,16}".prop_map(|s| json!({ "snapshot_id": s }).to_string().into_bytes()),
        weight("RestoreRequest") => Just(json!({ "snapshot_id": snapshot }).to_string().into_bytes()),
    ]
}

pub(crate) fn input(route: &Route, snapshot: &str) -> impl Strategy<Value = Input> + use<> {
    (
        authorization(),
        session(),
        query(route),
        body(route, snapshot.to_owned()),
    )
        .prop_map(|(authorization, session, query, body)| Input {
            authorization,
            session,
            query,
            body,
        })
}

/// Sessions the seed binds (a file written, a snapshot taken).
pub(crate) const BOUND: &[&str] = &["bound-1", "bound-2", "bound-3"];

/// Binds [`BOUND`], writes a file into each, and answers a snapshot ID of the first.
pub(crate) async fn seed(app: &Router) -> String {
    let auth = format!("Bearer {TOKEN}");
    for session in BOUND {
        let (status, body) = send(
            app.clone(),
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            Some(&auth),
            br#"{"command":"true"}"#.to_vec(),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let (status, body) = send(
            app.clone(),
            "PUT",
            &format!("/v1/sessions/{session}/files/content?path=/workspace/out.txt"),
            Some(&auth),
            b"hello".to_vec(),
        )
        .await
        .unwrap();
        assert!(status < 300, "{status} {}", String::from_utf8_lossy(&body));
    }
    // Background processes of the first session: one that ended, one that waits on its
    // stdin. A reseed of the same router finds `reader` still running (409: already there).
    for spec in [
        r#"{"command":"echo","args":["seeded"],"tag":"seeded"}"#,
        r#"{"command":"cat","stdin":true,"tag":"reader"}"#,
    ] {
        let (status, body) = send(
            app.clone(),
            "POST",
            &format!("/v1/sessions/{}/processes", BOUND[0]),
            Some(&auth),
            spec.as_bytes().to_vec(),
        )
        .await
        .unwrap();
        assert!(
            status == 201 || status == 409,
            "{status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    let (status, body) = send(
        app.clone(),
        "POST",
        &format!("/v1/sessions/{}/snapshots", BOUND[0]),
        Some(&auth),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    v["snapshot_id"].as_str().unwrap().to_owned()
}

pub(crate) fn uri(route: &Route, input: &Input) -> String {
    let path: Vec<String> = route
        .path
        .split('/')
        .map(|seg| {
            if seg.starts_with('{') && seg.ends_with('}') {
                encode(&input.session)
            } else {
                seg.to_owned()
            }
        })
        .collect();
    let mut uri = path.join("/");
    if !input.query.is_empty() {
        let pairs: Vec<String> = input
            .query
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect();
        uri.push('?');
        uri.push_str(&pairs.join("&"));
    }
    uri
}

/// At most 300 characters of `text`, for failure messages.
pub(crate) fn clip(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}…[{} bytes]", &text[..i], text.len()),
        None => text.to_owned(),
    }
}

/// Sends one request; the status and the whole body.
pub(crate) async fn send(
    app: Router,
    method: &str,
    uri: &str,
    authorization: Option<&str>,
    body: Vec<u8>,
) -> Result<(u16, Vec<u8>), String> {
    let headers: Vec<(&str, &str)> = authorization
        .map(|v| ("authorization", v))
        .into_iter()
        .collect();
    let answer = send_with(app, method, uri, &headers, body).await?;
    Ok((answer.status, answer.body))
}

/// One answer: status, `Content-Type` (if any) and the whole body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: Option<String>,
    pub(crate) body: Vec<u8>,
}

/// Sends one request with these headers.
pub(crate) async fn send_with(
    app: Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Answer, String> {
    let mut request = axum::http::Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Body::from(body)).map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(20), app.oneshot(request))
        .await
        .map_err(|_| format!("{method} {}: no answer", clip(uri)))?
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if open_ended(uri) && status == 200 {
        return Ok(Answer {
            status,
            content_type,
            body: until_quiet(response.into_body()).await?,
        });
    }
    let bytes = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
        .await
        .map_err(|_| format!("{method} {}: the body never ended", clip(uri)))?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Answer {
        status,
        content_type,
        body: bytes.to_vec(),
    })
}

/// How long an open-ended stream may stay silent before the test stops reading it.
pub(crate) const QUIET: Duration = Duration::from_millis(500);

/// Whether `uri` is a route whose success is a stream that ends only when something happens
/// (an attach to a running process, a watch): its body is read until it stays quiet.
pub(crate) fn open_ended(uri: &str) -> bool {
    let path = uri.split('?').next().unwrap_or(uri);
    path.ends_with("/attach") || path.ends_with("/watch")
}

/// The frames of `body` until it ends or stays silent for [`QUIET`] (then the stream is
/// dropped, as a client going away does).
pub(crate) async fn until_quiet(body: Body) -> Result<Vec<u8>, String> {
    let mut body = body;
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(QUIET, body.frame()).await {
            Err(_) | Ok(None) => return Ok(out),
            Ok(Some(Err(e))) => return Err(e.to_string()),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
        }
    }
}
