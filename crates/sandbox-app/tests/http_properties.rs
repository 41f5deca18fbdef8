//! Every route of the generated OpenAPI document (`sandbox_app::http::openapi::document`, the
//! one `GET /v1/openapi.json` serves) under random input, over
//! the in-memory fake provider (hermetic: no Docker): random bodies (bytes, JSON values,
//! near-valid exec/script/snapshot bodies), random session IDs (braces, control characters,
//! unicode, very long), random query strings and sandbox paths, with and without valid tokens.
//!
//! Each answer must be a status the route documents, and every non-2xx error body must be
//! `{"error":{"code","message"}}` with a code the document lists for that status
//! (`x-error-codes`, from `sandbox_app::api::errors`). A failure here is either a handler
//! answering something undocumented or a declaration missing a documented answer.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod http_support;

use std::collections::BTreeMap;
use std::sync::Mutex;

use axum::Router;
use http_support::{Input, Route, TOKEN, app, clip, input, routes, seed, send, uri};
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;

const CASES_PER_ROUTE: u32 = 64;

/// Whether `status` and `body` are an answer `route` documents; the error code, if any.
fn judge(route: &Route, status: u16, body: &[u8]) -> Result<Option<String>, String> {
    let Some(codes) = route.responses.get(&status) else {
        return Err(format!("undocumented status {status}"));
    };
    if (100..300).contains(&status) || codes.is_empty() {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|_| format!("{status}: the body is not JSON"))?;
    let (Some(code), Some(_message)) = (
        value["error"]["code"].as_str(),
        value["error"]["message"].as_str(),
    ) else {
        return Err(format!("{status}: not the error shape"));
    };
    if !codes.iter().any(|c| c == code) {
        return Err(format!("{status}: code {code} is not documented for it"));
    }
    Ok(Some(code.to_owned()))
}

type Seen = Mutex<BTreeMap<(String, u16, String), usize>>;

async fn check(app: Router, route: &Route, input: Input, seen: &Seen) -> Result<(), TestCaseError> {
    let uri = uri(route, &input);
    let (status, bytes) = send(
        app,
        route.method.as_str(),
        &uri,
        input.authorization.as_deref(),
        input.body.clone(),
    )
    .await
    .map_err(TestCaseError::fail)?;
    let code = judge(route, status, &bytes).map_err(|why| {
        TestCaseError::fail(format!(
            "{why}: {} {} body={:?} -> {}",
            route.method.as_str(),
            clip(&uri),
            clip(&String::from_utf8_lossy(&input.body)),
            clip(&String::from_utf8_lossy(&bytes))
        ))
    })?;
    let key = (
        format!("{} {}", route.method.as_str(), route.path),
        status,
        code.unwrap_or_default(),
    );
    *seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(key)
        .or_default() += 1;
    Ok(())
}

#[test]
fn every_route_answers_only_what_the_table_documents() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let app = app();
    let seen = Seen::default();
    let mut failures = Vec::new();
    for route in &routes() {
        // Re-seeded per route: an earlier route may have destroyed the bound sessions.
        let snapshot = rt.block_on(seed(&app));
        let mut runner = TestRunner::new(Config {
            cases: CASES_PER_ROUTE,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&input(route, &snapshot), |input| {
            rt.block_on(check(app.clone(), route, input, &seen))
        });
        if let Err(e) = result {
            failures.push(format!("{} {}: {e}", route.method.as_str(), route.path));
        }
    }
    // What the random input reached (`--nocapture` shows it): route, status, code, count.
    for ((route, status, code), n) in seen.lock().unwrap().iter() {
        eprintln!("{route:55} {status} {code:28} {n}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The corners random input rarely hits: a 3 MiB body, a session segment that is not UTF-8
/// once decoded.
#[test]
fn edge_inputs_answer_documented_errors() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let app = app();
    let auth = format!("Bearer {TOKEN}");
    let mut failures = Vec::new();
    for route in &routes() {
        let name = format!("{} {}", route.method.as_str(), route.path);
        let mut cases = vec![(
            "a 3 MiB body",
            route.path.replace("{session}", "edge"),
            vec![b' '; 3 * 1024 * 1024],
        )];
        if route.path_params().next().is_some() {
            cases.push((
                "a non-UTF-8 session",
                route.path.replace("{session}", "%FF%FE"),
                Vec::new(),
            ));
        }
        for (what, uri, body) in cases {
            let (status, bytes) = rt
                .block_on(send(
                    app.clone(),
                    route.method.as_str(),
                    &uri,
                    Some(&auth),
                    body,
                ))
                .unwrap();
            if let Err(why) = judge(route, status, &bytes) {
                failures.push(format!(
                    "{name} with {what}: {why}: {}",
                    clip(&String::from_utf8_lossy(&bytes))
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
