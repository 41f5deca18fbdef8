//! The E2B-compatible API of `sandbox serve`, as a real process over the real Docker engine,
//! proven with the official Python SDK and with raw HTTP.
//!
//! Each test writes a config file (a namespace of its own, network `none`, agent mode, a data
//! directory in a temp dir, two tenants whose tokens only the test knows, `[e2b]` on a free
//! loopback port with the Debian image as the `base` template), spawns the `sandbox` binary
//! with `serve`, and waits for both listeners. The E2B listener serves the control plane and
//! the envd router, so `E2B_API_URL` and `E2B_SANDBOX_URL` are the same URL, and the API key
//! is the tenant's bearer token.
//!
//! - The SDK scenario (`tests/e2b/scenario.py`, normal mode) asserts each SDK result itself;
//!   the driver asserts its summary line, then that every sandbox it killed is gone from the
//!   engine.
//! - Tenant isolation: a second tenant's key can neither see, connect, time out nor delete the
//!   first tenant's sandbox (404 each), and its sandbox's access token does not open the first
//!   tenant's envd (nor does no token, nor a signature made with it).
//! - Every error the API and the router answer is JSON `{"code": <status>, "message": ...}`,
//!   which the SDK needs to raise its own exceptions.
//!
//! Whatever happens, the namespace's containers are removed when a test ends.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`, `cargo xtask debian-image`),
//! the static agent (`SANDBOX_AGENT_BIN`, `cargo xtask agent`) and the SDK's venv
//! (`SANDBOX_TEST_E2B_PYTHON`, `cargo xtask sdk-venv`): the e2b sdk stage of `cargo xtask test`.

// Needs the Docker backend and the E2B API compiled in.
#![cfg(all(feature = "docker", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use hyper::body::Bytes;
use sandbox_testkit::e2b_sdk::{run_script, venv_python};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::support::container_ids;
use crate::support::e2b::{DOMAIN, E2bServe, ENVD_PORT};

/// The whole scenario, five Debian sandboxes created and killed, on a slow machine.
const SCENARIO_DEADLINE: Duration = Duration::from_secs(600);

/// The `/files` URL signature the SDK makes: `v1_` and the unpadded base64 of the SHA-256 of
/// `<path>:<operation>:<user>:<token>[:<expiration>]` (the default user: empty).
fn file_signature(path: &str, operation: &str, token: &str, expiration: Option<&str>) -> String {
    let mut raw = format!("{path}:{operation}::{token}");
    if let Some(at) = expiration {
        raw.push(':');
        raw.push_str(at);
    }
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    )
}

/// `path` percent-encoded for a query.
fn query_value(path: &str) -> String {
    url::form_urlencoded::byte_serialize(path.as_bytes()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE), the static agent (SANDBOX_AGENT_BIN) and the SDK venv (the e2b sdk stage)"]
async fn the_official_python_sdk_passes_its_scenario_against_the_e2b_api() {
    let python = venv_python();
    let serve = E2bServe::start("te2bsdk").await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/scenario.py");
    let mut run = serve.sdk_command(&python);
    run.arg(&script).env_remove("SANDBOX_SCENARIO_STEPS");
    let context = || serve.context();
    // The scenario blocks; the service is another process, so nothing here needs the runtime.
    let stdout = tokio::task::block_in_place(|| run_script(run, SCENARIO_DEADLINE, &context));
    println!("{stdout}");
    // The scenario killed every sandbox it made: the engine holds none of them.
    serve.wait_no_containers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE) and the static agent (SANDBOX_AGENT_BIN): the e2b sdk stage"]
async fn a_second_tenant_can_neither_see_nor_reach_the_first_tenants_sandbox() {
    let serve = E2bServe::start("te2biso").await;
    let (a, b) = (serve.key_a.clone(), serve.key_b.clone());
    let pair = format!("iso-{:08x}", fastrand::u32(..));
    let sa = serve.create(&a, json!({"owner": "a", "pair": pair})).await;
    let sb = serve.create(&b, json!({"owner": "b"})).await;
    let before = serve
        .cp("GET", &format!("/sandboxes/{}", sa.id), &a, "")
        .await;
    assert_eq!(before.status, 200, "{}", before.text());
    let end_before = before.json()["endAt"].clone();

    // The control plane: every route that names A's sandbox is 404 for B.
    let routes = [
        ("GET", format!("/sandboxes/{}", sa.id), ""),
        ("POST", format!("/v2/sandboxes/{}/connect", sa.id), "{}"),
        (
            "POST",
            format!("/v2/sandboxes/{}/connect", sa.id),
            r#"{"timeout":30}"#,
        ),
        (
            "POST",
            format!("/sandboxes/{}/timeout", sa.id),
            r#"{"timeout":30}"#,
        ),
        (
            "POST",
            format!("/sandboxes/{}/refreshes", sa.id),
            r#"{"duration":30}"#,
        ),
        ("DELETE", format!("/sandboxes/{}", sa.id), ""),
    ];
    for (method, path, body) in &routes {
        serve
            .cp(method, path, &b, body)
            .await
            .error(&[404], &format!("B: {method} {path}"));
    }
    // B's listings hold B's sandbox and never A's, filtered or not, new and legacy.
    for path in [
        "/v2/sandboxes".to_owned(),
        "/sandboxes".to_owned(),
        format!(
            "/v2/sandboxes?metadata={}",
            query_value(&format!("pair={pair}"))
        ),
    ] {
        let listed = serve.cp("GET", &path, &b, "").await;
        assert_eq!(listed.status, 200, "B: GET {path}: {}", listed.text());
        let ids: Vec<String> = listed
            .json()
            .as_array()
            .unwrap_or_else(|| panic!("B: GET {path}: not a list: {}", listed.text()))
            .iter()
            .filter_map(|s| s["sandboxID"].as_str().map(str::to_owned))
            .collect();
        assert!(
            !ids.contains(&sa.id),
            "B: GET {path} lists A's sandbox: {ids:?}"
        );
        if !path.contains("metadata") {
            assert!(
                ids.contains(&sb.id),
                "B: GET {path} misses B's own: {ids:?}"
            );
        }
    }
    // A's own filtered listing finds it: the filter above matched nothing because of the tenant.
    let listed = serve
        .cp(
            "GET",
            &format!(
                "/v2/sandboxes?metadata={}",
                query_value(&format!("pair={pair}"))
            ),
            &a,
            "",
        )
        .await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    let ids: Vec<String> = listed
        .json()
        .as_array()
        .unwrap_or_else(|| panic!("A: not a list: {}", listed.text()))
        .iter()
        .filter_map(|s| s["sandboxID"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        ids,
        vec![sa.id.clone()],
        "A's filtered listing: {}",
        listed.text()
    );
    // None of B's attempts touched A's sandbox: still there, its end where it was.
    let after = serve
        .cp("GET", &format!("/sandboxes/{}", sa.id), &a, "")
        .await;
    assert_eq!(
        after.status,
        200,
        "B's delete reached A's sandbox: {}",
        after.text()
    );
    assert_eq!(
        after.json()["endAt"],
        end_before,
        "B's timeout or connect moved A's deadline"
    );

    // The envd router: A's token opens A's envd; B's token, B's API key and no token do not.
    let own = serve.envd_list(&sa.id, Some(&sa.token)).await;
    assert_eq!(
        own.status,
        200,
        "A's own envd with A's token: {}",
        own.text()
    );
    assert!(
        own.json()["processes"].is_array() || own.json() == json!({}),
        "{}",
        own.text()
    );
    serve
        .envd_list(&sa.id, Some(&sb.token))
        .await
        .error(&[401, 404], "A's envd with B's sandbox token");
    serve
        .envd_list(&sa.id, Some(&b))
        .await
        .error(&[401, 404], "A's envd with B's API key as the token");
    serve
        .envd_list(&sa.id, None)
        .await
        .error(&[401], "A's envd with no token");
    // Addressed by Host instead of the headers: the same.
    let host = format!("{ENVD_PORT}-{}.{DOMAIN}", sa.id);
    serve
        .e2b_call(
            "POST",
            "/process.Process/List",
            &[
                ("host", &host),
                ("connect-protocol-version", "1"),
                ("x-access-token", &sb.token),
            ],
            "{}",
        )
        .await
        .error(&[401, 404], "A's envd by Host with B's sandbox token");
    let by_host = serve
        .e2b_call(
            "POST",
            "/process.Process/List",
            &[
                ("host", &host),
                ("connect-protocol-version", "1"),
                ("x-access-token", &sa.token),
            ],
            "{}",
        )
        .await;
    assert_eq!(
        by_host.status,
        200,
        "A's envd by Host with A's token: {}",
        by_host.text()
    );

    // `/files` signed with B's token: a write does not land, a read is refused.
    let path = "/home/user/from-b.txt";
    let write = format!(
        "/files?path={}&signature={}",
        query_value(path),
        query_value(&file_signature(path, "write", &sb.token, None))
    );
    let routing = [
        ("e2b-sandbox-id", sa.id.as_str()),
        ("e2b-sandbox-port", ENVD_PORT),
    ];
    let mut upload = routing.to_vec();
    upload.push(("content-type", "application/octet-stream"));
    let a_write = serve
        .try_request(
            &serve.e2b,
            "POST",
            &write,
            &upload,
            Bytes::from_static(b"from b"),
        )
        .await
        .unwrap();
    a_write.error(&[401, 404], "a write to A's envd signed with B's token");
    let read = format!(
        "/files?path={}&signature={}",
        query_value(path),
        query_value(&file_signature(path, "read", &sb.token, None))
    );
    serve
        .e2b_call("GET", &read, &routing, "")
        .await
        .error(&[401, 404], "a read of A's envd signed with B's token");
    let mut own_read = routing.to_vec();
    own_read.push(("x-access-token", &sa.token));
    let absent = serve
        .e2b_call(
            "GET",
            &format!("/files?path={}", query_value(path)),
            &own_read,
            "",
        )
        .await;
    assert_eq!(
        absent.status,
        404,
        "B's write landed in A's sandbox: {}",
        absent.text()
    );

    // Each tenant deletes its own; then the engine holds nothing.
    for (key, sandbox) in [(&a, &sa), (&b, &sb)] {
        let gone = serve
            .cp("DELETE", &format!("/sandboxes/{}", sandbox.id), key, "")
            .await;
        assert_eq!(gone.status, 204, "{}", gone.text());
    }
    serve.wait_no_containers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE) and the static agent (SANDBOX_AGENT_BIN): the e2b sdk stage"]
async fn every_error_answer_is_json_with_an_integer_code_and_a_message() {
    let serve = E2bServe::start("te2berr").await;
    let a = serve.key_a.clone();
    let missing = "i0000000000000000000";

    // Authentication: no key, a wrong key; both header forms of the right one work.
    serve
        .e2b_call("GET", "/v2/sandboxes", &[], "")
        .await
        .error(&[401], "no API key");
    serve
        .cp("GET", "/v2/sandboxes", "e2b_not-a-tenant", "")
        .await
        .error(&[401], "a wrong API key");
    serve
        .e2b_call(
            "GET",
            "/v2/sandboxes",
            &[("authorization", "Bearer e2b_not-a-tenant")],
            "",
        )
        .await
        .error(&[401], "a wrong bearer token");
    let bearer = format!("Bearer {a}");
    let ok = serve
        .e2b_call("GET", "/v2/sandboxes", &[("authorization", &bearer)], "")
        .await;
    assert_eq!(ok.status, 200, "the key as a bearer token: {}", ok.text());
    let ok = serve.cp("GET", "/v2/sandboxes", &a, "").await;
    assert_eq!(ok.status, 200, "the key as X-API-Key: {}", ok.text());

    // A sandbox that does not exist, on every route that names one.
    for (method, path, body) in [
        ("GET", format!("/sandboxes/{missing}"), ""),
        ("DELETE", format!("/sandboxes/{missing}"), ""),
        (
            "POST",
            format!("/sandboxes/{missing}/timeout"),
            r#"{"timeout":60}"#,
        ),
        (
            "POST",
            format!("/sandboxes/{missing}/refreshes"),
            r#"{"duration":60}"#,
        ),
        ("POST", format!("/v2/sandboxes/{missing}/connect"), "{}"),
    ] {
        serve
            .cp(method, &path, &a, body)
            .await
            .error(&[404], &format!("{method} {path}"));
    }

    // Bad create bodies: not JSON, no template, a timeout past the maximum, a reserved
    // metadata key, and each option the service cannot honour, named in the message.
    serve
        .cp("POST", "/v2/sandboxes", &a, "{")
        .await
        .error(&[400], "a create body that is not JSON");
    serve
        .cp(
            "POST",
            "/v2/sandboxes",
            &a,
            r#"{"metadata":{},"envVars":{}}"#,
        )
        .await
        .error(&[400], "a create with no templateID");
    serve
        .cp(
            "POST",
            "/v2/sandboxes",
            &a,
            r#"{"templateID":"base","timeout":86401}"#,
        )
        .await
        .error(&[400], "a timeout past the maximum");
    serve
        .cp(
            "POST",
            "/v2/sandboxes",
            &a,
            r#"{"templateID":"no-such-template"}"#,
        )
        .await
        .error(&[400, 404], "an unknown template");
    let reserved = serve
        .cp(
            "POST",
            "/v2/sandboxes",
            &a,
            r#"{"templateID":"base","metadata":{"Sandbox.api":"x"}}"#,
        )
        .await
        .error(&[400], "a reserved metadata key");
    assert!(reserved.contains("Sandbox.api"), "{reserved}");
    for (field, option) in [
        (
            "volumeMounts",
            json!({"volumeMounts": [{"name": "v", "path": "/mnt/v"}]}),
        ),
        ("mcp", json!({"mcp": {"exa": {"apiKey": "x"}}})),
        (
            "iam",
            json!({"iam": {"tokens": {"aws": {"audience": "sts.amazonaws.com", "tokenType": "JWT-SVID"}}}}),
        ),
        (
            "allowOut",
            json!({"network": {"allowOut": ["api.example.com"]}}),
        ),
        (
            "egressProxy",
            json!({"network": {"egressProxy": {"address": "127.0.0.1:1080"}}}),
        ),
        (
            "rules",
            json!({"network": {"rules": {"api.example.com": [{"transform": {"headers": {"X-A": "b"}}}]}}}),
        ),
    ] {
        let mut body = json!({"templateID": "base", "metadata": {}, "envVars": {}});
        for (k, v) in option.as_object().unwrap() {
            body[k] = v.clone();
        }
        let message = serve
            .cp("POST", "/v2/sandboxes", &a, &body.to_string())
            .await
            .error(&[400], &format!("a create with {field}"));
        assert!(
            message.contains(field),
            "the refusal of {field} does not name it: {message}"
        );
    }
    // None of the refused creates made a container.
    assert_eq!(container_ids(&serve.namespace).await, Vec::<String>::new());

    // The router's own refusals: an unknown sandbox, and a real one without or with a wrong
    // token, or with an expired signature.
    serve
        .envd_list(missing, Some("not-a-token"))
        .await
        .error(&[401, 404, 502], "envd of a sandbox that does not exist");
    let s = serve.create(&a, json!({})).await;
    serve
        .envd_list(&s.id, None)
        .await
        .error(&[401], "envd without a token");
    serve
        .envd_list(&s.id, Some("wrong"))
        .await
        .error(&[401], "envd with a wrong token");
    let path = "/home/user/x.txt";
    // A signed read with an expiration: in the future it passes the router (the file is
    // absent, which the agent answers), long past it is refused, the signature right in both.
    let routing = [
        ("e2b-sandbox-id", s.id.as_str()),
        ("e2b-sandbox-port", ENVD_PORT),
    ];
    let signed_read = |expiration: &str| {
        format!(
            "/files?path={}&signature={}&signature_expiration={expiration}",
            query_value(path),
            query_value(&file_signature(path, "read", &s.token, Some(expiration)))
        )
    };
    let future = (time::OffsetDateTime::now_utc().unix_timestamp() + 600).to_string();
    let passed = serve
        .e2b_call("GET", &signed_read(&future), &routing, "")
        .await;
    assert_eq!(
        passed.status,
        404,
        "a signed read of a missing file, expiring in 10 minutes: {}",
        passed.text()
    );
    serve
        .e2b_call("GET", &signed_read("1000000000"), &routing, "")
        .await
        .error(&[401], "a signature that expired");
    let gone = serve
        .cp("DELETE", &format!("/sandboxes/{}", s.id), &a, "")
        .await;
    assert_eq!(gone.status, 204, "{}", gone.text());
    serve
        .cp("DELETE", &format!("/sandboxes/{}", s.id), &a, "")
        .await
        .error(&[404], "a second delete");
    serve.wait_no_containers().await;
}
