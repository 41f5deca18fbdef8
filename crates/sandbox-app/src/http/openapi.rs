//! The OpenAPI 3.1 document (`GET /v1/openapi.json`), generated from the same declaration the
//! router is built from (`super::declared`): each handler's `#[utoipa::path]`, the API types
//! of `crate::api` and the error lists of `crate::api::errors`. Which routes require a bearer
//! token is read from the router they sit in (the one behind the authentication layer), so the
//! document cannot claim a route is public that the router authenticates, or the reverse.

use std::sync::Arc;

use axum::Json;
use axum::extract::Extension;
use serde_json::Value;
use utoipa::OpenApi as _;
use utoipa::openapi::schema::{SchemaType, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{OpenApi, PathItem, RefOr, Schema};

use crate::api;

/// The name of the bearer security scheme.
pub const BEARER: &str = "bearer";

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "sandbox service",
        description = "One persistent, isolated sandbox per (tenant, session). Every error is `{\"error\":{\"code\",\"message\"}}`; each response lists the codes it can carry (also as `x-error-codes`). An unknown route is 404 `route_not_found`. The terminal route's WebSocket text frames are the components `TerminalClientFrame` and `TerminalServerFrame`; binary frames carry raw PTY bytes both ways.",
    ),
    components(schemas(
        api::ErrorResponse,
        api::TerminalClientFrame,
        api::TerminalServerFrame,
    )),
    tags(
        (name = "service", description = "Health, metrics and this document"),
        (name = "sessions", description = "A session's sandbox"),
        (name = "exec", description = "Commands and scripts"),
        (name = "snapshots", description = "Snapshots and restores"),
        (name = "files", description = "Files of a session's sandbox"),
        (name = "terminal", description = "The interactive terminal"),
        (name = "processes", description = "Background processes: start, list, attach with replay, stdin, signals"),
    ),
)]
struct ApiDoc;

/// The document's frame: info, tags, the shared components and the security scheme.
pub(super) fn base() -> OpenApi {
    let mut doc = ApiDoc::openapi();
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
    );
    doc.security = Some(vec![bearer()]);
    doc
}

fn bearer() -> SecurityRequirement {
    SecurityRequirement::new(BEARER, Vec::<String>::new())
}

/// Finishes the operations of one of the declared routers: each requires the bearer token
/// (`authenticated`) or none, and an optional request body is described as what it is, a body
/// that may be absent, not a JSON `null` (which the routes refuse).
pub(super) fn finish(doc: &mut OpenApi, authenticated: bool) {
    for item in doc.paths.paths.values_mut() {
        for op in operations(item) {
            op.security = Some(if authenticated {
                vec![bearer()]
            } else {
                Vec::new()
            });
            let Some(body) = op.request_body.as_mut() else {
                continue;
            };
            for content in body.content.values_mut() {
                if let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema
                    && let [null, schema] = one_of.items.as_slice()
                    && is_null(null)
                {
                    content.schema = Some(schema.clone());
                }
            }
        }
    }
}

fn is_null(schema: &RefOr<Schema>) -> bool {
    matches!(
        schema,
        RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null)
    )
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

/// The document, as served.
pub fn document() -> Value {
    let (public, authenticated) = super::declared();
    let mut doc = public.into_openapi();
    doc.merge(authenticated.into_openapi());
    serde_json::to_value(doc).unwrap_or(Value::Null)
}

/// The served document, computed once when the router is built.
#[derive(Debug, Clone)]
pub struct Document(pub Arc<Value>);

/// `GET /v1/openapi.json` (no auth).
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    tag = "service",
    summary = "This document (no auth)",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object)),
)]
pub async fn serve(Extension(Document(doc)): Extension<Document>) -> Json<Value> {
    Json(Value::clone(&doc))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeSet;
    use std::sync::Arc;

    use axum::body::Body;
    use http_body_util::BodyExt;
    use sandbox_core::{ConfigId, CreateRequest, PermissiveSessionExistence, SandboxProvider};
    use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
    use sandbox_session::manager::SessionManager;
    use sandbox_session::memory_store::MemoryBindingStore;
    use sandbox_testkit::fake::FakeProvider;
    use tower::ServiceExt as _;

    use super::*;
    use crate::http::AppState;
    use crate::http::metrics::Metrics;

    fn app() -> axum::Router {
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
        crate::http::router(AppState {
            auth: Arc::new(crate::auth::TenantAuth::default()),
            manager: SessionManager::new(lifecycle),
            provider,
            metrics: Arc::new(Metrics::new()),
            limits: crate::config::Limits::default(),
            tickets: Arc::new(crate::tickets::TerminalTickets::default()),
            store: crate::http::StoreInfo::memory(),
            budget: crate::http::body::InflightBudget::new(1 << 30),
        })
    }

    /// `(METHOD, path, operation)` of every operation of `doc`.
    fn operations_of(doc: &Value) -> Vec<(String, String, Value)> {
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                out.push((method.to_uppercase(), path.clone(), op.clone()));
            }
        }
        out
    }

    /// Every documented operation is routed (no 405, no `route_not_found`), and its first
    /// answer to an empty request is one it documents.
    #[tokio::test]
    async fn every_documented_route_is_served() {
        let app = app();
        let doc = document();
        let ops = operations_of(&doc);
        assert!(ops.len() >= 20, "{} operations", ops.len());
        for (method, path, op) in ops {
            let uri = path.replace("{session}", "probe");
            let request = axum::http::Request::builder()
                .method(method.as_str())
                .uri(&uri)
                .body(Body::empty())
                .unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let code = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
            let body = String::from_utf8_lossy(&body);
            assert_ne!(status, 405, "{method} {uri}: {body}");
            assert_ne!(code.as_deref(), Some("route_not_found"), "{method} {uri}");
            assert!(
                op["responses"].get(status.to_string()).is_some(),
                "{method} {uri} answered an undocumented {status}: {body}"
            );
        }
    }

    #[tokio::test]
    async fn the_served_document_is_the_generated_one() {
        let response = app()
            .oneshot(
                axum::http::Request::builder()
                    .uri("/v1/openapi.json")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let served: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(served, document());
        assert!(served["openapi"].as_str().unwrap().starts_with("3.1"));
        // An optional body may be absent; it is never a JSON null.
        let snapshot = &served["paths"]["/v1/sessions/{session}/snapshots"]["post"]["requestBody"];
        assert_eq!(
            snapshot["content"]["application/json"]["schema"],
            serde_json::json!({ "$ref": "#/components/schemas/SnapshotRequest" })
        );
        assert_ne!(snapshot["required"], true);
        assert_eq!(
            served["components"]["securitySchemes"]["bearer"],
            serde_json::json!({ "type": "http", "scheme": "bearer" })
        );
    }

    #[test]
    fn every_operation_is_complete() {
        let doc = document();
        let mut ids = BTreeSet::new();
        for (method, path, op) in operations_of(&doc) {
            let name = format!("{method} {path}");
            assert!(
                ids.insert(op["operationId"].as_str().unwrap().to_owned()),
                "{name}: operationId twice"
            );
            assert!(!op["summary"].as_str().unwrap_or("").is_empty(), "{name}");
            assert!(
                op["tags"].as_array().is_some_and(|t| !t.is_empty()),
                "{name}"
            );
            assert!(op["security"].is_array(), "{name}: no security");
            for (status, r) in op["responses"].as_object().unwrap() {
                let status: u16 = status.parse().unwrap();
                let codes = r.get(api::errors::CODES_EXTENSION);
                assert!(
                    codes.is_some() || status < 400 || path == "/healthz",
                    "{name}: {status} documents no error code"
                );
            }
            for segment in path.split('/') {
                if let Some(param) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    assert!(
                        op["parameters"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|p| p["name"] == param && p["in"] == "path"),
                        "{name}: path parameter {param}"
                    );
                }
            }
        }
        // Every schema reference resolves.
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for (i, _) in text.match_indices("#/components/schemas/") {
            let name: String = text[i + "#/components/schemas/".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric())
                .collect();
            assert!(schemas.contains_key(&name), "unresolved schema {name}");
        }
    }

    /// Which routes need a token is the router's fact: a public route answers without one,
    /// and the document says so; an authenticated one answers 401 without one.
    #[tokio::test]
    async fn the_documented_security_is_the_routers() {
        let app = app();
        for (method, path, op) in operations_of(&document()) {
            let public = op["security"].as_array().unwrap().is_empty();
            let uri = path.replace("{session}", "probe");
            let request = axum::http::Request::builder()
                .method(method.as_str())
                .uri(&uri)
                .body(Body::empty())
                .unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let code = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
            assert_eq!(
                code.as_deref() == Some("unauthorized"),
                !public,
                "{method} {path}"
            );
        }
    }

    /// Every path segment is required and constrained, so a route added later states its
    /// rules or fails here; and the rules are the validators' own patterns.
    #[test]
    fn parameters_and_bodies_carry_the_validators_patterns() {
        use sandbox_core::patterns;
        let doc = document();
        for (method, path, op) in operations_of(&doc) {
            for param in op["parameters"].as_array().into_iter().flatten() {
                let name = &param["name"];
                if param["in"] == "path" {
                    assert_eq!(param["required"], true, "{method} {path} {name}");
                    assert!(
                        param["schema"]["pattern"].is_string(),
                        "{method} {path}: path parameter {name} states no pattern"
                    );
                }
                if param["in"] == "query" && name == "path" {
                    assert_eq!(param["required"], true, "{method} {path}");
                    assert_eq!(param["schema"]["pattern"], patterns::SANDBOX_PATH);
                }
                if name == "session" {
                    assert_eq!(param["schema"]["pattern"], patterns::SESSION_ID);
                }
            }
        }
        let schemas = &doc["components"]["schemas"];
        for (component, field, pattern) in [
            ("ExecSpec", "command", patterns::PROGRAM),
            ("ProcessStartRequest", "command", patterns::PROGRAM),
            ("RenameRequest", "from", patterns::SANDBOX_PATH),
            ("RenameRequest", "to", patterns::SANDBOX_PATH),
            ("RestoreRequest", "snapshot_id", patterns::TEXT_ID),
            ("ScriptRequest", "file_name", patterns::SCRIPT_FILE_NAME),
        ] {
            assert_eq!(
                schemas[component]["properties"][field]["pattern"], pattern,
                "{component}.{field}"
            );
        }
        assert_eq!(
            schemas["ExecSpec"]["properties"]["env"]["propertyNames"]["pattern"],
            patterns::ENV_NAME
        );
        let terminal = &doc["paths"]["/v1/sessions/{session}/terminal"]["get"]["parameters"];
        let headers: Vec<&Value> = terminal
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["in"] == "header" && p["required"] == true)
            .map(|p| &p["name"])
            .collect();
        assert_eq!(
            headers,
            [
                "Connection",
                "Upgrade",
                "Sec-WebSocket-Version",
                "Sec-WebSocket-Key"
            ],
            "the upgrade's handshake headers"
        );
    }
}
