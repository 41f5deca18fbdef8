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
//!
//! Each answer is also checked against the OpenAPI document the router serves
//! (`http_support/schema_check.rs`): its status and content type declared, its body valid against
//! the declared schema. The golden corpus' requests (valid ones included) go through the same
//! check, and a count per route family proves each family had bodies validated.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod http_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use axum::Router;
use http_support::schema_check::{SchemaCheck, family};
use http_support::{
    Answer, Input, Route, TOKEN, app, clip, golden, input, routes, seed, send_with, uri,
};
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

/// Bodies validated against the served document, per route family.
type Validated = Mutex<BTreeMap<String, usize>>;

/// [`judge`], then the answer against the served document (status declared, content type
/// declared, body valid against its schema); counts what it validated in `validated`.
fn judge_all(
    route: &Route,
    schema: &SchemaCheck,
    answer: &Answer,
    validated: &Validated,
) -> Result<Option<String>, String> {
    let code = judge(route, answer.status, &answer.body)?;
    let documents = schema
        .check(
            route.method.as_str(),
            &route.path,
            answer.status,
            answer.content_type.as_deref(),
            &answer.body,
        )
        .map_err(|problem| format!("{}: against the document: {problem}", answer.status))?;
    if documents > 0 {
        *validated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(family(&route.path))
            .or_default() += 1;
    }
    Ok(code)
}

/// The served document (whatever builds it).
async fn served_document(app: &Router) -> SchemaCheck {
    let answer = send_with(app.clone(), "GET", "/v1/openapi.json", &[], Vec::new())
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    SchemaCheck::new(serde_json::from_slice(&answer.body).unwrap())
}

/// The route families of the document.
fn all_families() -> BTreeSet<String> {
    routes().iter().map(|r| family(&r.path)).collect()
}

/// Each of `families` had at least one body validated; prints the counts (`--nocapture`).
#[allow(clippy::print_stderr)] // A test's helper: what it prints is the test's report.
fn assert_every_family_validated(what: &str, validated: &Validated, families: BTreeSet<String>) {
    let validated = validated.lock().unwrap();
    eprintln!("{what}: bodies validated against the document, per route family:");
    for (family, n) in validated.iter() {
        eprintln!("  {family:14} {n}");
    }
    let missing: BTreeSet<String> = families
        .into_iter()
        .filter(|f| !validated.contains_key(f))
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: no body of these route families was validated: {missing:?}"
    );
}

type Seen = Mutex<BTreeMap<(String, u16, String), usize>>;

struct Checks<'a> {
    seen: &'a Seen,
    schema: &'a SchemaCheck,
    validated: &'a Validated,
}

async fn check(
    app: Router,
    route: &Route,
    input: Input,
    checks: &Checks<'_>,
) -> Result<(), TestCaseError> {
    let uri = uri(route, &input);
    let headers: Vec<(&str, &str)> = input
        .authorization
        .as_deref()
        .map(|v| ("authorization", v))
        .into_iter()
        .collect();
    let answer = send_with(
        app,
        route.method.as_str(),
        &uri,
        &headers,
        input.body.clone(),
    )
    .await
    .map_err(TestCaseError::fail)?;
    let code = judge_all(route, checks.schema, &answer, checks.validated).map_err(|why| {
        TestCaseError::fail(format!(
            "{why}: {} {} body={:?} -> {}",
            route.method.as_str(),
            clip(&uri),
            clip(&String::from_utf8_lossy(&input.body)),
            clip(&String::from_utf8_lossy(&answer.body))
        ))
    })?;
    let key = (
        format!("{} {}", route.method.as_str(), route.path),
        answer.status,
        code.unwrap_or_default(),
    );
    *checks
        .seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(key)
        .or_default() += 1;
    Ok(())
}

#[test]
fn every_route_answers_only_what_the_document_declares() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let app = app();
    let seen = Seen::default();
    let schema = rt.block_on(served_document(&app));
    let validated = Validated::default();
    let checks = Checks {
        seen: &seen,
        schema: &schema,
        validated: &validated,
    };
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
            rt.block_on(check(app.clone(), route, input, &checks))
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
    assert_every_family_validated("random input", &validated, all_families());
}

/// The golden corpus' requests (hand-picked valid ones and fixed-seed generated ones, see
/// `http_support/golden.rs`): every answer, successes included, against the document; every
/// family with at least one validated body, and with a validated 2xx body wherever the table
/// declares one with content.
#[test]
fn golden_requests_answer_what_the_document_declares() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let all = routes();
    let requests = golden::requests();
    let answers = rt.block_on(golden::answers(&requests)).unwrap();
    let schema = rt.block_on(served_document(&app()));
    let validated = Validated::default();
    let successes = Validated::default();
    let mut failures = Vec::new();
    for (request, answer) in requests.iter().zip(&answers) {
        let route = all
            .iter()
            .find(|r| golden::route_key(r) == request.route)
            .unwrap();
        match judge_all(route, &schema, answer, &validated) {
            Ok(_) if (200..300).contains(&answer.status) && !answer.body.is_empty() => {
                *successes
                    .lock()
                    .unwrap()
                    .entry(family(&route.path))
                    .or_default() += 1;
            }
            Ok(_) => {}
            Err(why) => failures.push(format!(
                "{} {}: {why}: {} {} -> {}",
                request.route,
                request.case,
                request.method,
                clip(&request.uri),
                clip(&String::from_utf8_lossy(&answer.body))
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_every_family_validated("golden requests", &validated, all_families());
    let with_success_body = all
        .iter()
        .filter(|r| {
            r.media
                .iter()
                .any(|(status, media)| (200..300).contains(status) && !media.is_empty())
        })
        .map(|r| family(&r.path))
        .collect();
    assert_every_family_validated(
        "golden requests, 2xx with a body",
        &successes,
        with_success_body,
    );
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
    let schema = rt.block_on(served_document(&app));
    let validated = Validated::default();
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
            let answer = rt
                .block_on(send_with(
                    app.clone(),
                    route.method.as_str(),
                    &uri,
                    &[("authorization", auth.as_str())],
                    body,
                ))
                .unwrap();
            if let Err(why) = judge_all(route, &schema, &answer, &validated) {
                failures.push(format!(
                    "{name} with {what}: {why}: {}",
                    clip(&String::from_utf8_lossy(&answer.body))
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
