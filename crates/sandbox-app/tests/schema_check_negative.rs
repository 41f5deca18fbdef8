//! The schema check `http_properties` applies (`http_support/schema_check.rs`) must catch what
//! it exists for: routers whose handlers answer a body without a required field, or a status
//! the document does not declare. Each case serves a tiny router and checks its answers
//! against a document, a tiny one of its own or the service's real one, fetched as served.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod http_support;

use axum::Json;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use http_support::schema_check::{Problem, SchemaCheck};
use http_support::{Answer, TOKEN, app, send_with};
use serde_json::{Value, json};

/// A document of two operations whose 200 bodies are a `$ref` into `components`.
fn tiny_document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": { "title": "tiny", "version": "0" },
        "paths": {
            "/things/{id}": {
                "get": {
                    "responses": {
                        "200": {
                            "description": "The thing",
                            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Thing" } } }
                        },
                        "404": {
                            "description": "No such thing",
                            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } }
                        }
                    }
                }
            },
            "/good": {
                "get": {
                    "responses": {
                        "200": {
                            "description": "A whole thing",
                            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Thing" } } }
                        }
                    }
                }
            }
        },
        "components": {
            "schemas": {
                "Thing": {
                    "type": "object",
                    "required": ["id", "name"],
                    "properties": { "id": { "type": "string" }, "name": { "type": "string" } }
                },
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": { "error": { "type": "object", "required": ["code"] } }
                }
            }
        }
    })
}

/// Serves the tiny document and three handlers: one omits `name`, one answers an undeclared
/// 418 and one answers what the document declares.
fn tiny_router() -> Router {
    Router::new()
        .route("/v1/openapi.json", get(|| async { Json(tiny_document()) }))
        .route(
            "/things/{id}",
            get(|| async { Json(json!({ "id": "t-1" })) }),
        )
        .route(
            "/things/{id}/teapot",
            get(|| async {
                (
                    StatusCode::IM_A_TEAPOT,
                    Json(json!({ "error": { "code": "teapot" } })),
                )
            }),
        )
        .route(
            "/good",
            get(|| async { Json(json!({ "id": "t-1", "name": "kettle" })) }),
        )
}

async fn get_from(app: &Router, uri: &str, auth: bool) -> Answer {
    let bearer = format!("Bearer {TOKEN}");
    let headers: Vec<(&str, &str)> = if auth {
        vec![("authorization", bearer.as_str())]
    } else {
        Vec::new()
    };
    send_with(app.clone(), "GET", uri, &headers, Vec::new())
        .await
        .unwrap()
}

async fn served(app: &Router) -> SchemaCheck {
    let answer = get_from(app, "/v1/openapi.json", false).await;
    assert_eq!(answer.status, 200);
    SchemaCheck::new(serde_json::from_slice(&answer.body).unwrap())
}

fn check(schema: &SchemaCheck, path: &str, answer: &Answer) -> Result<usize, Problem> {
    schema.check(
        "GET",
        path,
        answer.status,
        answer.content_type.as_deref(),
        &answer.body,
    )
}

#[tokio::test]
async fn a_missing_required_field_and_an_undeclared_status_are_reported() {
    let app = tiny_router();
    let schema = served(&app).await;

    let answer = get_from(&app, "/things/1", false).await;
    match check(&schema, "/things/{id}", &answer) {
        Err(Problem::Invalid { line: None, errors }) => {
            assert!(
                errors.len() == 1 && errors[0].contains("\"name\" is a required property"),
                "{errors:?}"
            );
        }
        other => panic!("the missing field was not reported: {other:?}"),
    }

    let answer = get_from(&app, "/things/1/teapot", false).await;
    // The document has no `/things/{id}/teapot`: checked as the operation the handler
    // pretends to be, its 418 is undeclared.
    match check(&schema, "/things/{id}", &answer) {
        Err(Problem::UndeclaredStatus { status, declared }) => {
            assert_eq!(status, 418);
            assert_eq!(declared, ["200", "404"]);
        }
        other => panic!("the undeclared status was not reported: {other:?}"),
    }

    // The control: a whole body of a declared status passes, so the reports above are about
    // the answers, not the check refusing everything.
    let answer = get_from(&app, "/good", false).await;
    assert_eq!(check(&schema, "/good", &answer), Ok(1));
}

/// The same two defects against the service's real document, on the real path of
/// `GET /v1/sessions/{session}`: its `$ref`s resolve and its `Session` schema requires
/// `sandbox_id`.
#[tokio::test]
async fn the_real_document_reports_both_too() {
    let schema = served(&app()).await;
    let broken = Router::new()
        .route(
            "/v1/sessions/{session}",
            get(|| async {
                Json(json!({ "session": "s-1", "provider": "fake", "state": "running" }))
            }),
        )
        .route(
            "/v1/sessions/{session}/teapot",
            get(|| async { (StatusCode::IM_A_TEAPOT, Json(json!({ "session": "s-1" }))) }),
        );

    let answer = get_from(&broken, "/v1/sessions/s-1", true).await;
    match check(&schema, "/v1/sessions/{session}", &answer) {
        Err(Problem::Invalid { errors, .. }) => assert!(
            errors
                .iter()
                .any(|e| e.contains("\"sandbox_id\" is a required property")),
            "{errors:?}"
        ),
        other => panic!("the missing sandbox_id was not reported: {other:?}"),
    }

    let answer = get_from(&broken, "/v1/sessions/s-1/teapot", true).await;
    match check(&schema, "/v1/sessions/{session}", &answer) {
        Err(Problem::UndeclaredStatus {
            status: 418,
            declared,
        }) => {
            assert!(declared.iter().any(|s| s == "200"), "{declared:?}");
        }
        other => panic!("the undeclared 418 was not reported: {other:?}"),
    }

    // The control: the real router's own answer for a bound session passes.
    let real = app();
    http_support::seed(&real).await;
    let answer = get_from(&real, "/v1/sessions/bound-1", true).await;
    assert_eq!(answer.status, 200);
    assert_eq!(check(&schema, "/v1/sessions/{session}", &answer), Ok(1));
}
