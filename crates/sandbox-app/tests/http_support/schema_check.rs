//! Checks an answer against the OpenAPI document a router serves: the operation must declare
//! the status, the content type must be one the response declares, and the body must validate
//! against that content's schema (JSON Schema 2020-12, OpenAPI 3.1's dialect), with `$ref`s into
//! `#/components/...` resolved against the document.
//!
//! The document is taken as served (`GET /v1/openapi.json`), never from the code that builds
//! it, so the check keeps working whoever builds it.
//!
//! Bodies by media type:
//! - `application/json` (and `*+json`): the body must be JSON valid against `schema`.
//! - `application/x-ndjson`: each line must be JSON valid against the content's `itemSchema`
//!   (OpenAPI 3.2's keyword for sequential media) or, when the document has none, against
//!   `schema`, read as the schema of ONE line (OpenAPI 3.1 has no item keyword; adapt
//!   [`ndjson_item_schema`] if a document says it another way).
//! - anything else (metrics text, file bytes): the body, as a string, against `schema`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use jsonschema::Validator;
use serde_json::{Value, json};

/// What the check found wrong with one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// The document has no operation for the method and path template.
    NoOperation { method: String, path: String },
    /// The operation does not declare the status (nor a `default` or `4XX`-style range).
    UndeclaredStatus { status: u16, declared: Vec<String> },
    /// The answer has a body but the response declares no content.
    UndeclaredBody { status: u16 },
    /// The response declares content but the answer's body is empty.
    MissingBody { status: u16 },
    /// The answer's content type is not one the response declares.
    UndeclaredMediaType {
        media: String,
        declared: Vec<String>,
    },
    /// The body (or an NDJSON line) is not JSON although the media type says so.
    NotJson { line: Option<usize>, why: String },
    /// The declared schema does not compile.
    BadSchema { why: String },
    /// The body (or an NDJSON line) does not validate: one message per violation, each with its
    /// instance path.
    Invalid {
        line: Option<usize>,
        errors: Vec<String>,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NoOperation { method, path } => {
                write!(f, "the document has no operation {method} {path}")
            }
            Problem::UndeclaredStatus { status, declared } => write!(
                f,
                "status {status} is not declared (declared: {})",
                declared.join(", ")
            ),
            Problem::UndeclaredBody { status } => {
                write!(f, "{status} declares no content but the answer has a body")
            }
            Problem::MissingBody { status } => {
                write!(f, "{status} declares content but the body is empty")
            }
            Problem::UndeclaredMediaType { media, declared } => write!(
                f,
                "content type {media:?} is not declared (declared: {})",
                declared.join(", ")
            ),
            Problem::NotJson { line, why } => match line {
                Some(n) => write!(f, "NDJSON line {n} is not JSON: {why}"),
                None => write!(f, "the body is not JSON: {why}"),
            },
            Problem::BadSchema { why } => write!(f, "the declared schema does not compile: {why}"),
            Problem::Invalid { line, errors } => {
                match line {
                    Some(n) => write!(f, "NDJSON line {n} violates its schema: ")?,
                    None => write!(f, "the body violates its schema: ")?,
                }
                write!(f, "{}", errors.join("; "))
            }
        }
    }
}

/// The checker over one document; compiled schemas are cached per response content.
#[derive(Debug)]
pub(crate) struct SchemaCheck {
    doc: Value,
    validators: Mutex<HashMap<String, Arc<Validator>>>,
}

impl SchemaCheck {
    pub(crate) fn new(doc: Value) -> Self {
        Self {
            doc,
            validators: Mutex::default(),
        }
    }

    /// Checks one answer of `method path` (`path` is the template, as in the document's
    /// `paths`). Answers how many JSON documents it validated (0 for a body-less answer, one
    /// per line of NDJSON).
    pub(crate) fn check(
        &self,
        method: &str,
        path: &str,
        status: u16,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<usize, Problem> {
        let operation = &self.doc["paths"][path][method.to_ascii_lowercase()];
        if !operation.is_object() {
            return Err(Problem::NoOperation {
                method: method.to_owned(),
                path: path.to_owned(),
            });
        }
        let responses = &operation["responses"];
        let range = format!("{}XX", status / 100);
        let response = [status.to_string(), range, "default".to_owned()]
            .into_iter()
            .find_map(|key| responses.get(&key))
            .ok_or_else(|| Problem::UndeclaredStatus {
                status,
                declared: responses
                    .as_object()
                    .map(|r| r.keys().cloned().collect())
                    .unwrap_or_default(),
            })?;
        let response = self.resolve(response);
        let content = response.get("content").and_then(Value::as_object);
        let Some(content) = content.filter(|c| !c.is_empty()) else {
            return if body.is_empty() {
                Ok(0)
            } else {
                Err(Problem::UndeclaredBody { status })
            };
        };
        if body.is_empty() {
            return Err(Problem::MissingBody { status });
        }
        let media = content_type
            .and_then(|c| c.split(';').next())
            .map(|m| m.trim().to_ascii_lowercase())
            .unwrap_or_default();
        let Some(declared) = content.get(&media) else {
            return Err(Problem::UndeclaredMediaType {
                media,
                declared: content.keys().cloned().collect(),
            });
        };
        let key = format!("{method} {path} {status} {media}");
        if media == "application/x-ndjson" {
            let schema = ndjson_item_schema(declared);
            let validator = self.validator(&format!("{key} item"), schema)?;
            let text = std::str::from_utf8(body).map_err(|e| Problem::NotJson {
                line: Some(1),
                why: e.to_string(),
            })?;
            let mut count = 0;
            for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
                let value: Value = serde_json::from_str(line).map_err(|e| Problem::NotJson {
                    line: Some(i + 1),
                    why: e.to_string(),
                })?;
                validate(&validator, &value, Some(i + 1))?;
                count += 1;
            }
            return Ok(count);
        }
        let schema = declared.get("schema").cloned().unwrap_or(json!({}));
        let validator = self.validator(&key, schema)?;
        let value = if media == "application/json" || media.ends_with("+json") {
            serde_json::from_slice(body).map_err(|e| Problem::NotJson {
                line: None,
                why: e.to_string(),
            })?
        } else {
            Value::String(String::from_utf8_lossy(body).into_owned())
        };
        validate(&validator, &value, None)?;
        Ok(1)
    }

    /// A response object, following one `$ref` into `#/components/responses/...`.
    fn resolve<'a>(&'a self, response: &'a Value) -> &'a Value {
        match response["$ref"].as_str().and_then(|r| r.strip_prefix('#')) {
            Some(pointer) => self.doc.pointer(pointer).unwrap_or(response),
            None => response,
        }
    }

    fn validator(&self, key: &str, schema: Value) -> Result<Arc<Validator>, Problem> {
        let mut cache = self
            .validators
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = cache.get(key) {
            return Ok(v.clone());
        }
        // The schema sits in a root that carries the document's `components`, so its
        // `#/components/schemas/...` references resolve as they do in the document.
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": self.doc["components"],
            "allOf": [schema],
        });
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .map_err(|e| Problem::BadSchema { why: e.to_string() })?;
        let validator = Arc::new(validator);
        cache.insert(key.to_owned(), validator.clone());
        Ok(validator)
    }
}

/// The schema of one NDJSON line: `itemSchema` when the content has one, else `schema`.
fn ndjson_item_schema(content: &Value) -> Value {
    content
        .get("itemSchema")
        .or_else(|| content.get("schema"))
        .cloned()
        .unwrap_or(json!({}))
}

fn validate(validator: &Validator, value: &Value, line: Option<usize>) -> Result<(), Problem> {
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("at {:?}: {e}", e.instance_path().to_string()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Problem::Invalid { line, errors })
    }
}

/// The family of a route for the per-family counts: the segment after
/// `/v1/sessions/{session}/` (`exec`, `files`, `terminal`, ...), `sessions` for the session
/// itself, else the path's last segment (`healthz`, `metrics`, `openapi.json`, `execute`).
pub(crate) fn family(path: &str) -> String {
    if let Some(rest) = path.strip_prefix("/v1/sessions/{session}") {
        return match rest.trim_start_matches('/').split('/').next() {
            Some("") | None => "sessions".to_owned(),
            Some(first) => first.to_owned(),
        };
    }
    path.rsplit('/').next().unwrap_or(path).to_owned()
}
