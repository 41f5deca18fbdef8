//! The exact requests the adapter sends, against a recording control plane on loopback
//! (`recorder.rs`), and what it makes of scripted answers: bodies, headers, the metadata
//! encoding, paging, token restore, retries and every kind of failure.

use std::collections::BTreeMap;
use std::time::Duration;

use sandbox_core::{
    Checked, ConnectRequest, CreateRequest, E2bHostRule, ErrorKind, IdleTimeout, ListFilter,
    Metadata, SandboxId, SandboxProvider, SandboxState, Secret, TemplateId, TimeoutAction,
};
use sandbox_provider_e2b::{E2bConfig, E2bProvider};
use serde_json::{Value, json};

use crate::recorder::{Recorder, Reply};

const KEY: &str = "e2b_test_key_0123456789";

fn provider_with(recorder: &Recorder, edit: impl FnOnce(&mut E2bConfig)) -> Checked<E2bProvider> {
    let mut config = E2bConfig::new(recorder.url(), Secret::new(KEY), "base");
    config.allow_private_endpoints = true;
    config.sandbox_domain = "localhost".into();
    config.proxy_url = recorder.url();
    edit(&mut config);
    E2bProvider::new(config).unwrap()
}

pub(crate) fn provider(recorder: &Recorder) -> Checked<E2bProvider> {
    provider_with(recorder, |_| {})
}

pub(crate) fn answer(id: &str, traffic: Option<&str>) -> Value {
    json!({
        "sandboxID": id,
        "templateID": "base",
        "clientID": "c",
        "envdVersion": "0.2.0",
        "envdAccessToken": "envd-token",
        "trafficAccessToken": traffic,
        "domain": "localhost",
    })
}

fn listed(id: &str, state: &str, metadata: Value) -> Value {
    json!({
        "sandboxID": id,
        "templateID": "base",
        "clientID": "c",
        "startedAt": "2026-12-02T10:00:00Z",
        "endAt": "2026-12-02T10:05:00Z",
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": state,
        "envdVersion": "0.2.0",
        "metadata": metadata,
    })
}

fn id(raw: &str) -> SandboxId {
    SandboxId::new(raw).unwrap()
}

#[tokio::test]
async fn create_sends_the_documented_body_with_the_key() {
    let rec = Recorder::start().await;
    rec.on(
        "POST",
        "/sandboxes",
        vec![Reply::ok(201, answer("i1", Some("traffic-1")))],
    );
    let p = provider(&rec);
    let mut request = CreateRequest::new(TemplateId::new("base").unwrap());
    request.timeout.idle = IdleTimeout::after(Duration::from_millis(90_200)).unwrap();
    request.timeout.on_timeout = TimeoutAction::Pause;
    request.timeout.auto_resume = true;
    request.metadata = Metadata::from([
        ("sandbox_session_id".to_owned(), "chat-1".to_owned()),
        ("team".to_owned(), "a".to_owned()),
    ]);
    request.env = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
    request.network.allow_out = vec!["1.1.1.1".to_owned()];
    request.network.deny_out = vec!["10.0.0.0/8".to_owned()];
    request.network.e2b_host_rules = vec![E2bHostRule {
        host: "api.example.com".to_owned(),
        headers: BTreeMap::from([("Authorization".to_owned(), Secret::new("Bearer z"))]),
    }];
    let handle = p.create(request).await.unwrap();

    assert_eq!(handle.id().as_str(), "i1");
    assert_eq!(
        handle.traffic_token().map(Secret::expose),
        Some("traffic-1")
    );
    assert_eq!(handle.metadata().get("team").map(String::as_str), Some("a"));
    let seen = rec.seen_at("POST", "/sandboxes");
    assert_eq!(seen.len(), 1);
    let sent = &seen[0];
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("content-type"), Some("application/json"));
    let mut body = sent.json();
    // The create marker: random, 32 hex digits, under an escaped key.
    let marker = body["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("sbx.sandbox_e2b_create")
        .expect("the create marker");
    let marker = marker.as_str().unwrap();
    assert!(
        marker.len() == 32 && marker.bytes().all(|b| b.is_ascii_hexdigit()),
        "{marker}"
    );
    assert_eq!(
        body,
        json!({
            "templateID": "base",
            // 90.2 s rounds up to whole seconds.
            "timeout": 91,
            "autoPause": true,
            "autoPauseMemory": true,
            "autoResume": {"enabled": true},
            "secure": true,
            "allow_internet_access": true,
            "network": {
                // Closed unless opened: the plane issues a traffic token.
                "allowPublicTraffic": false,
                "allowOut": ["1.1.1.1"],
                "denyOut": ["10.0.0.0/8"],
                "rules": {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer z"}}}]},
            },
            // The session layer's keys start with `sandbox`, which planes may reserve.
            "metadata": {"sbx.sandbox_session_id": "chat-1", "team": "a"},
            "envVars": {"A": "1"},
        })
    );
}

#[tokio::test]
async fn create_timeouts_default_to_the_ttl_and_never_is_refused_unsent() {
    let rec = Recorder::start().await;
    rec.on(
        "POST",
        "/sandboxes",
        vec![Reply::ok(201, answer("i1", None))],
    );
    let p = provider_with(&rec, |c| c.ttl_seconds = 420);
    p.create(CreateRequest::new(TemplateId::new("base").unwrap()))
        .await
        .unwrap();
    let body = rec.seen_at("POST", "/sandboxes")[0].json();
    assert_eq!(body["timeout"], 420);
    assert_eq!(body.get("autoPause"), None);
    assert_eq!(body.get("autoResume"), None);

    let mut never = CreateRequest::new(TemplateId::new("base").unwrap());
    never.timeout.idle = IdleTimeout::Never;
    let e = p.create(never).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let mut short = CreateRequest::new(TemplateId::new("base").unwrap());
    short.timeout.idle = IdleTimeout::after(Duration::from_millis(400)).unwrap();
    let e = p.create(short).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert_eq!(
        rec.seen_at("POST", "/sandboxes").len(),
        1,
        "refused creates are never sent"
    );
}

#[tokio::test]
async fn a_create_refused_twice_with_503_then_made_makes_one_sandbox() {
    let rec = Recorder::start().await;
    rec.on(
        "POST",
        "/sandboxes",
        vec![
            Reply::Json(
                503,
                vec![("retry-after", "0".to_owned())],
                json!({"code": 503, "message": "busy"}),
            ),
            Reply::error(503, "busy"),
            Reply::ok(201, answer("i7", None)),
        ],
    );
    rec.on("GET", "/v2/sandboxes", vec![Reply::ok(200, json!([]))]);
    let p = provider(&rec);
    let handle = p
        .create(CreateRequest::new(TemplateId::new("base").unwrap()))
        .await
        .unwrap();
    assert_eq!(handle.id().as_str(), "i7");
    let creates = rec.seen_at("POST", "/sandboxes");
    assert_eq!(creates.len(), 3);
    let marker = creates[0].json()["metadata"]["sbx.sandbox_e2b_create"].clone();
    // Every attempt is the same create: the same marker.
    for c in &creates {
        assert_eq!(c.json()["metadata"]["sbx.sandbox_e2b_create"], marker);
    }
    // Before each resend, a list by the marker made sure nothing was made.
    let lists = rec.seen_at("GET", "/v2/sandboxes");
    assert_eq!(lists.len(), 2);
    for l in &lists {
        let params = l.params();
        let want = format!("sbx.sandbox_e2b_create={}", marker.as_str().unwrap());
        assert!(
            params.contains(&("metadata".to_owned(), want)),
            "{params:?}"
        );
    }
}

#[tokio::test]
async fn a_refused_create_that_did_make_its_sandbox_is_adopted_not_repeated() {
    let rec = Recorder::start().await;
    rec.on(
        "POST",
        "/sandboxes",
        vec![Reply::Json(
            503,
            vec![("retry-after", "0".to_owned())],
            json!({"code": 503, "message": "busy"}),
        )],
    );
    // The plane did make it: its listing has a sandbox carrying the create's own marker.
    rec.on_fn("GET", "/v2/sandboxes", |_, before| {
        let create = before.iter().find(|s| s.method == "POST").unwrap().json();
        let marker = create["metadata"]["sbx.sandbox_e2b_create"].clone();
        Reply::ok(
            200,
            json!([listed(
                "i9",
                "running",
                json!({"sbx.sandbox_e2b_create": marker})
            )]),
        )
    });
    rec.on(
        "POST",
        "/sandboxes/i9/connect",
        vec![Reply::ok(200, answer("i9", None))],
    );
    let p = provider(&rec);
    let handle = p
        .create(CreateRequest::new(TemplateId::new("base").unwrap()))
        .await
        .unwrap();
    assert_eq!(handle.id().as_str(), "i9");
    assert_eq!(
        rec.seen_at("POST", "/sandboxes").len(),
        1,
        "never made twice"
    );
}

#[tokio::test]
async fn a_create_that_timed_out_is_not_sent_again() {
    let rec = Recorder::start().await;
    rec.on(
        "POST",
        "/sandboxes",
        vec![Reply::Hang(Duration::from_secs(10))],
    );
    let p = provider_with(&rec, |c| c.create_timeout_seconds = 1);
    let e = p
        .create(CreateRequest::new(TemplateId::new("base").unwrap()))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(!e.can_replace_binding());
    assert_eq!(rec.seen_at("POST", "/sandboxes").len(), 1);
}

#[tokio::test]
async fn list_asks_for_one_pair_pages_and_filters_the_rest_locally() {
    let rec = Recorder::start().await;
    let mine = json!({"sbx.sandbox_session_id": "chat-1", "team": "a"});
    let other_team = json!({"sbx.sandbox_session_id": "chat-1", "team": "b"});
    rec.on(
        "GET",
        "/v2/sandboxes",
        vec![
            Reply::Json(
                200,
                vec![("x-next-token", "page-2".to_owned())],
                json!([
                    listed("i1", "running", mine.clone()),
                    listed("i2", "running", other_team)
                ]),
            ),
            Reply::ok(200, json!([listed("i3", "running", mine)])),
        ],
    );
    let p = provider(&rec);
    let filter = ListFilter {
        metadata: Metadata::from([
            ("sandbox_session_id".to_owned(), "chat-1".to_owned()),
            ("team".to_owned(), "a".to_owned()),
        ]),
        states: vec![SandboxState::Running],
    };
    let found = p.list(&filter).await.unwrap();
    let ids: Vec<&str> = found.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["i1", "i3"]);
    // The port sees its own keys back.
    assert_eq!(
        found[0]
            .metadata
            .get("sandbox_session_id")
            .map(String::as_str),
        Some("chat-1")
    );
    assert_eq!(found[0].state, SandboxState::Running);
    let calls = rec.seen_at("GET", "/v2/sandboxes");
    assert_eq!(calls.len(), 2);
    let first = calls[0].params();
    assert!(first.contains(&("limit".into(), "100".into())), "{first:?}");
    assert!(
        first.contains(&("state".into(), "running".into())),
        "{first:?}"
    );
    assert!(
        first.contains(&("metadata".into(), "sbx.sandbox_session_id=chat-1".into())),
        "{first:?}"
    );
    // `=` inside the metadata parameter travels escaped.
    assert!(
        calls[0]
            .query
            .contains("metadata=sbx.sandbox_session_id%3Dchat-1"),
        "{}",
        calls[0].query
    );
    assert!(
        calls[1]
            .params()
            .contains(&("nextToken".into(), "page-2".into()))
    );
    assert_eq!(calls[0].header("x-api-key"), Some(KEY));
}

#[tokio::test]
async fn a_next_token_that_repeats_is_an_error_not_a_loop() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/v2/sandboxes",
        vec![Reply::Json(
            200,
            vec![("x-next-token", "same".to_owned())],
            json!([]),
        )],
    );
    let p = provider(&rec);
    let e = p.list(&ListFilter::default()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Internal, "{e}");
    assert_eq!(rec.seen_at("GET", "/v2/sandboxes").len(), 2);
}

#[tokio::test]
async fn a_state_the_plane_has_no_word_for_lists_nothing_unasked() {
    let rec = Recorder::start().await;
    let p = provider(&rec);
    let filter = ListFilter {
        metadata: Metadata::new(),
        states: vec![SandboxState::Terminal],
    };
    assert!(p.list(&filter).await.unwrap().is_empty());
    assert!(rec.seen().is_empty());
}

#[tokio::test]
async fn connect_resumes_reads_and_restores_the_traffic_token() {
    let rec = Recorder::start().await;
    rec.on(
        "POST",
        "/sandboxes/i1/connect",
        vec![Reply::ok(201, answer("i1", None))],
    );
    rec.on(
        "GET",
        "/sandboxes/i1",
        vec![Reply::ok(
            200,
            listed(
                "i1",
                "running",
                json!({"team": "a", "sbx.sandbox_e2b_create": "m"}),
            ),
        )],
    );
    let p = provider_with(&rec, |c| c.ttl_seconds = 600);
    let mut request = ConnectRequest::new(id("i1"));
    request.traffic_token = Some(Secret::new("kept-token"));
    let handle = p.connect(request).await.unwrap();
    assert_eq!(
        handle.traffic_token().map(Secret::expose),
        Some("kept-token")
    );
    // The marker is the adapter's own and never shown.
    assert_eq!(
        handle.metadata(),
        &Metadata::from([("team".to_owned(), "a".to_owned())])
    );
    let connect = &rec.seen_at("POST", "/sandboxes/i1/connect")[0];
    assert_eq!(connect.json(), json!({"timeout": 600}));
    assert_eq!(connect.header("x-api-key"), Some(KEY));

    // An answer that has a token wins over the stored one.
    rec.on(
        "POST",
        "/sandboxes/i1/connect",
        vec![Reply::ok(200, answer("i1", Some("fresh")))],
    );
    let mut request = ConnectRequest::new(id("i1"));
    request.traffic_token = Some(Secret::new("kept-token"));
    let handle = p.connect(request).await.unwrap();
    assert_eq!(handle.traffic_token().map(Secret::expose), Some("fresh"));

    // An answer about another sandbox is refused.
    rec.on(
        "POST",
        "/sandboxes/i1/connect",
        vec![Reply::ok(200, answer("i2", None))],
    );
    let e = p.connect(ConnectRequest::new(id("i1"))).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Internal, "{e}");
}

/// A plane that fails (5xx, silence, a cut connection) never says the sandbox is gone; only its
/// 404 does.
#[tokio::test]
async fn failures_of_the_plane_never_let_a_binding_be_replaced() {
    let rec = Recorder::start().await;
    let p = provider_with(&rec, |c| {
        c.connect_timeout_seconds = 1;
        c.http_timeout_seconds = 1;
    });
    for (reply, kind) in [
        (Reply::error(500, "boom"), ErrorKind::Unavailable),
        (Reply::error(502, "bad gateway"), ErrorKind::Unavailable),
        (Reply::Hang(Duration::from_secs(10)), ErrorKind::Timeout),
        (Reply::Reset, ErrorKind::Unavailable),
        (Reply::error(401, "bad key"), ErrorKind::Authentication),
    ] {
        rec.on("POST", "/sandboxes/i1/connect", vec![reply.clone()]);
        rec.on("GET", "/sandboxes/i1", vec![reply.clone()]);
        let e = p.connect(ConnectRequest::new(id("i1"))).await.unwrap_err();
        assert_eq!(e.kind(), kind, "connect after {reply:?}: {e}");
        assert!(!e.can_replace_binding(), "{reply:?}: {e}");
        let e = p.get(&id("i1")).await.unwrap_err();
        assert_eq!(e.kind(), kind, "get after {reply:?}: {e}");
        assert!(!e.can_replace_binding(), "{reply:?}: {e}");
    }
    rec.on(
        "POST",
        "/sandboxes/i1/connect",
        vec![Reply::error(404, "sandbox i1 not found")],
    );
    let e = p.connect(ConnectRequest::new(id("i1"))).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.can_replace_binding());
}

#[tokio::test]
async fn health_is_a_v2_list_of_one_and_proves_the_key() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/v2/sandboxes",
        vec![Reply::ok(200, json!([])), Reply::error(401, "invalid key")],
    );
    let p = provider(&rec);
    p.health().await.unwrap();
    let call = &rec.seen_at("GET", "/v2/sandboxes")[0];
    assert_eq!(call.params(), [("limit".to_owned(), "1".to_owned())]);
    let e = p.health().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Authentication);
}

#[tokio::test]
async fn idempotent_calls_honour_retry_after_and_delete_kills() {
    let rec = Recorder::start().await;
    rec.on(
        "DELETE",
        "/sandboxes/i1",
        vec![
            Reply::Json(
                429,
                vec![("retry-after", "0".to_owned())],
                json!({"code": 429, "message": "slow down"}),
            ),
            Reply::Json(204, Vec::new(), Value::Null),
        ],
    );
    let p = provider(&rec);
    p.delete(&id("i1")).await.unwrap();
    assert_eq!(rec.seen_at("DELETE", "/sandboxes/i1").len(), 2);
    rec.on(
        "DELETE",
        "/sandboxes/i2",
        vec![Reply::error(404, "not found")],
    );
    assert_eq!(
        p.delete(&id("i2")).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[tokio::test]
async fn pausing_a_paused_sandbox_is_a_coded_conflict() {
    let rec = Recorder::start().await;
    rec.on(
        "POST",
        "/sandboxes/i1/pause",
        vec![Reply::error(
            409,
            "Error pausing sandbox - sandbox 'i1' is already paused",
        )],
    );
    let p = provider(&rec);
    let e = p
        .as_pause_resume()
        .unwrap()
        .pause(&id("i1"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert_eq!(e.code(), Some(sandbox_core::ErrorCode::SandboxPaused));
    assert_eq!(e.message(), "sandbox 'i1' is already paused");
}

/// An answer over the bound fails the call instead of being buffered whole.
#[tokio::test]
async fn an_oversized_answer_is_refused_not_buffered() {
    let rec = Recorder::start().await;
    let huge = "x".repeat(sandbox_provider_e2b::control::ANSWER_LIMIT + 1);
    rec.on(
        "GET",
        "/sandboxes/i1",
        vec![Reply::ok(200, json!({"sandboxID": "i1", "padding": huge}))],
    );
    let p = provider(&rec);
    let e = p.get(&id("i1")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(!e.can_replace_binding());
    assert!(
        e.message().contains("reading the control plane's answer"),
        "{e}"
    );
}
