//! The API's golden corpus (`tests/golden/api.jsonl`): request/response pairs of every route,
//! one canonical JSON object per line, in a stable order. The requests come from the strategies
//! of `http_properties` under fixed seeds (a fixed number per route) plus hand-picked valid
//! requests, so that success bodies are pinned too and not only errors.
//!
//! Each route is replayed on a fresh router over a fresh fake provider, seeded the same way
//! ([`super::seed`]), in corpus order: an entry's answer depends only on the entries of its
//! route before it, so the corpus replays the same way every time.
//!
//! Canonical form: JSON with sorted keys; values that differ run to run (the fake's instance
//! part of sandbox and snapshot IDs, durations, timestamps, ticket strings) replaced by stable
//! placeholders. Bodies that are not JSON are recorded canonically too: NDJSON line by line,
//! the metrics text with its sample values masked, bytes as base64 when small, else length and
//! SHA-256. The OpenAPI document is recorded as its operations (path, method, operation ID and
//! statuses), not its text: how the document is built is free to change, what it declares is
//! not.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Route, routes};
use axum::Router;
use base64::Engine as _;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

use super::{Answer, TOKEN, app, encode, input, seed, send_with, uri};

/// Generated cases per route (on top of the hand-picked ones).
pub(crate) const CASES_PER_ROUTE: usize = 24;
/// Fewer for a route with neither a session nor a body: its input is only a token and a query
/// it ignores.
pub(crate) const CASES_PER_STATIC_ROUTE: usize = 6;

/// Stands for the seeded snapshot's ID in a recorded request; replaced when sent.
const SNAPSHOT: &str = "{{snapshot}}";
/// Stands, in a recorded request's URI, for a terminal ticket of the request's session,
/// issued just before the request is sent (tickets are random).
const TICKET: &str = "{{ticket}}";

/// The corpus file, relative to the crate.
pub(crate) const CORPUS: &str = "tests/golden/api.jsonl";

/// One request of the corpus.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Request {
    /// `METHOD /path/{template}`: the route whose fresh router it runs on.
    pub(crate) route: String,
    /// `valid:<what>` for a hand-picked request, `seed:<n>` for a generated one.
    pub(crate) case: String,
    pub(crate) method: String,
    pub(crate) uri: String,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) body: Vec<u8>,
}

impl Request {
    fn to_json(&self) -> Value {
        let mut request = Map::new();
        request.insert("method".to_owned(), json!(self.method));
        request.insert("uri".to_owned(), json!(self.uri));
        request.insert("headers".to_owned(), json!(self.headers));
        match std::str::from_utf8(&self.body) {
            Ok(text) => request.insert("body".to_owned(), json!(text)),
            Err(_) => request.insert(
                "body_b64".to_owned(),
                json!(base64::engine::general_purpose::STANDARD.encode(&self.body)),
            ),
        };
        json!({ "route": self.route, "case": self.case, "request": request })
    }

    fn from_json(entry: &Value) -> Result<Self, String> {
        let text = |v: &Value, what: &str| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("{what} is not a string"))
        };
        let request = &entry["request"];
        let body = match (&request["body"], &request["body_b64"]) {
            (Value::String(text), Value::Null) => text.clone().into_bytes(),
            (Value::Null, Value::String(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("body_b64: {e}"))?,
            _ => return Err("the request needs exactly one of body, body_b64".to_owned()),
        };
        let headers = request["headers"]
            .as_object()
            .ok_or("headers is not an object")?
            .iter()
            .map(|(k, v)| Ok((k.clone(), text(v, "a header value")?)))
            .collect::<Result<_, String>>()?;
        Ok(Self {
            route: text(&entry["route"], "route")?,
            case: text(&entry["case"], "case")?,
            method: text(&request["method"], "method")?,
            uri: text(&request["uri"], "uri")?,
            headers,
            body,
        })
    }
}

/// The key of a route in the corpus.
pub(crate) fn route_key(route: &Route) -> String {
    format!("{} {}", route.method.as_str(), route.path)
}

/// A route's fixed seed: the SHA-256 of its key, so adding a route changes no other route's
/// cases.
fn route_seed(route: &Route) -> [u8; 32] {
    Sha256::digest(format!("api-golden {}", route_key(route)).as_bytes()).into()
}

/// The requests of the corpus, route by route: hand-picked ones first (the seeded sessions
/// are intact then), then the generated ones.
pub(crate) fn requests() -> Vec<Request> {
    let mut out = Vec::new();
    for route in &routes() {
        out.extend(hand_picked(route));
        let mut runner = TestRunner::new_with_rng(
            Config {
                failure_persistence: None,
                ..Config::default()
            },
            TestRng::from_seed(RngAlgorithm::ChaCha, &route_seed(route)),
        );
        let strategy = input(route, SNAPSHOT);
        let cases = if route.path_params().next().is_none() && route.request.is_none() {
            CASES_PER_STATIC_ROUTE
        } else {
            CASES_PER_ROUTE
        };
        for n in 0..cases {
            let input = strategy
                .new_tree(&mut runner)
                .unwrap_or_else(|why| panic!("{}: no input: {why}", route_key(route)))
                .current();
            let headers = input
                .authorization
                .iter()
                .map(|v| ("authorization".to_owned(), v.clone()))
                .collect();
            out.push(Request {
                route: route_key(route),
                case: format!("seed:{n}"),
                method: route.method.as_str().to_owned(),
                uri: uri(route, &input),
                headers,
                body: input.body,
            });
        }
    }
    out
}

/// Valid requests of `route` (and a few near-valid ones) that random input rarely builds.
fn hand_picked(route: &Route) -> Vec<Request> {
    let auth = format!("Bearer {TOKEN}");
    let make = |what: &str, uri: &str, headers: &[(&str, &str)], body: &str| Request {
        route: route_key(route),
        case: format!("valid:{what}"),
        method: route.method.as_str().to_owned(),
        uri: uri.to_owned(),
        headers: headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        body: body.as_bytes().to_vec(),
    };
    let a: &[(&str, &str)] = &[("authorization", auth.as_str())];
    let aj: &[(&str, &str)] = &[
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let p = |path: &str| format!("/v1/sessions/{path}");
    match (route.method.as_str(), route.path.as_str()) {
        ("GET", "/healthz") => vec![make("health", "/healthz", &[], "")],
        ("GET", "/metrics") => vec![make("metrics", "/metrics", &[], "")],
        ("GET", "/v1/openapi.json") => vec![make("document", "/v1/openapi.json", &[], "")],
        ("GET", "/v1/sessions/{session}") => vec![
            make("bound", &p("bound-1"), a, ""),
            make("unbound", &p("golden-unbound"), a, ""),
            make("no-token", &p("bound-1"), &[], ""),
        ],
        ("DELETE", "/v1/sessions/{session}") => vec![
            make("bound", &p("bound-2"), a, ""),
            make("again", &p("bound-2"), a, ""),
            make("unbound", &p("golden-unbound"), a, ""),
        ],
        ("POST", "/v1/sessions/{session}/exec") => vec![
            make(
                "echo",
                &p("bound-1/exec"),
                aj,
                r#"{"command":"echo","args":["hello","world"]}"#,
            ),
            make(
                "shell",
                &p("golden-new/exec"),
                aj,
                r#"{"command":"echo hi | wc -c","shell":true}"#,
            ),
            make(
                "stdin",
                &p("bound-1/exec"),
                a,
                r#"{"command":"cat","stdin":"piped"}"#,
            ),
            make("exit-1", &p("bound-1/exec"), a, r#"{"command":"false"}"#),
            make(
                "env-cwd",
                &p("bound-1/exec"),
                a,
                r#"{"command":"env","env":{"GOLDEN":"1"},"cwd":"/workspace","timeout_ms":5000}"#,
            ),
            make(
                "stream",
                &p("bound-1/exec?stream=true"),
                a,
                r#"{"command":"echo","args":["streamed"]}"#,
            ),
            make(
                "stream-false",
                &p("bound-1/exec?stream=true"),
                a,
                r#"{"command":"false"}"#,
            ),
            make("empty-body", &p("bound-1/exec"), a, ""),
        ],
        ("POST", "/v1/sessions/{session}/keepalive") => vec![
            make("bound", &p("bound-1/keepalive"), a, ""),
            make("unbound", &p("golden-unbound/keepalive"), a, ""),
        ],
        ("POST", "/v1/sessions/{session}/snapshots") => vec![
            make("named", &p("bound-1/snapshots"), aj, r#"{"name":"golden"}"#),
            make("unnamed", &p("bound-2/snapshots"), a, ""),
            make("unbound", &p("golden-unbound/snapshots"), a, ""),
        ],
        ("POST", "/v1/sessions/{session}/restore") => {
            let body = format!(r#"{{"snapshot_id":"{SNAPSHOT}"}}"#);
            vec![
                make("fresh", &p("golden-restored/restore"), aj, &body),
                make("again", &p("golden-restored/restore"), aj, &body),
                make(
                    "unknown",
                    &p("golden-other/restore"),
                    aj,
                    r#"{"snapshot_id":"snap-unknown"}"#,
                ),
            ]
        }
        ("POST", "/v1/execute") => vec![
            make(
                "sh",
                "/v1/execute",
                aj,
                r#"{"file_name":"job.sh","content":"echo hi","args":["a"],"timeout_ms":5000}"#,
            ),
            make(
                "unknown-extension",
                "/v1/execute",
                aj,
                r#"{"file_name":"job","content":"echo hi"}"#,
            ),
        ],
        ("GET", "/v1/sessions/{session}/files") => vec![
            make("workspace", &p("bound-1/files?path=/workspace"), a, ""),
            make("root-depth-2", &p("bound-1/files?path=/&depth=2"), a, ""),
            make("unbound", &p("golden-unbound/files?path=/workspace"), a, ""),
        ],
        ("DELETE", "/v1/sessions/{session}/files") => vec![
            make("file", &p("bound-1/files?path=/workspace/out.txt"), a, ""),
            make(
                "missing",
                &p("bound-1/files?path=/workspace/out.txt"),
                a,
                "",
            ),
        ],
        ("GET", "/v1/sessions/{session}/files/content") => vec![
            make(
                "file",
                &p("bound-1/files/content?path=/workspace/out.txt"),
                a,
                "",
            ),
            make("dir", &p("bound-1/files/content?path=/workspace"), a, ""),
            make(
                "missing",
                &p("bound-1/files/content?path=/workspace/none"),
                a,
                "",
            ),
        ],
        ("PUT", "/v1/sessions/{session}/files/content") => vec![
            make(
                "text",
                &p("bound-1/files/content?path=/workspace/new.txt"),
                a,
                "new content\n",
            ),
            make(
                "fresh-session",
                &p("golden-new/files/content?path=/workspace/a/b.txt"),
                a,
                "x",
            ),
            make(
                "input-dir",
                &p("bound-1/files/content?path=/workspace/input/x.txt"),
                a,
                "x",
            ),
        ],
        ("GET", "/v1/sessions/{session}/files/stat") => vec![
            make(
                "file",
                &p("bound-1/files/stat?path=/workspace/out.txt"),
                a,
                "",
            ),
            make("dir", &p("bound-1/files/stat?path=/workspace"), a, ""),
            make(
                "missing",
                &p("bound-1/files/stat?path=/workspace/none"),
                a,
                "",
            ),
        ],
        ("POST", "/v1/sessions/{session}/files/mkdir") => vec![
            make(
                "nested",
                &p("bound-1/files/mkdir?path=/workspace/d/e"),
                a,
                "",
            ),
            make(
                "again",
                &p("bound-1/files/mkdir?path=/workspace/d/e"),
                a,
                "",
            ),
        ],
        ("PUT", "/v1/sessions/{session}/attachments") => vec![
            make(
                "input",
                &p("bound-1/attachments?path=/workspace/input/data.csv"),
                a,
                "a,b\n1,2\n",
            ),
            make(
                "outside-input",
                &p("bound-1/attachments?path=/workspace/data.csv"),
                a,
                "a,b\n",
            ),
        ],
        ("DELETE", "/v1/sessions/{session}/attachments") => vec![make(
            "missing",
            &p("bound-1/attachments?path=/workspace/input/data.csv"),
            a,
            "",
        )],
        ("POST", "/v1/sessions/{session}/terminal/ticket") => vec![
            make("bound", &p("bound-1/terminal/ticket"), a, ""),
            make("unbound", &p("golden-unbound/terminal/ticket"), a, ""),
        ],
        ("GET", "/v1/sessions/{session}/terminal") => vec![
            make("no-ticket", &p("bound-1/terminal"), &[], ""),
            // A valid ticket, but `Router::oneshot` has no connection to upgrade: the
            // upgrade is refused after the ticket is checked, before it is used up.
            make(
                "ticket-no-upgrade-headers",
                &p(&format!("bound-1/terminal?ticket={TICKET}")),
                &[],
                "",
            ),
            make(
                "ticket-upgrade-headers",
                &p(&format!(
                    "bound-1/terminal?ticket={TICKET}&cols=100&rows=30"
                )),
                &[
                    ("connection", "upgrade"),
                    ("upgrade", "websocket"),
                    ("sec-websocket-version", "13"),
                    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ],
                "",
            ),
            make(
                "ticket-bad-cols",
                &p(&format!("bound-1/terminal?ticket={TICKET}&cols=wide")),
                &[],
                "",
            ),
            make(
                "bogus-ticket-upgrade",
                &p("bound-1/terminal?ticket=bogus"),
                &[
                    ("connection", "upgrade"),
                    ("upgrade", "websocket"),
                    ("sec-websocket-version", "13"),
                    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ],
                "",
            ),
        ],
        // Background processes (the seed started `seeded`, an `echo`, and `reader`, a `cat`
        // with stdin open, in bound-1).
        ("POST", "/v1/sessions/{session}/processes") => vec![
            make(
                "tagged",
                &p("bound-1/processes"),
                aj,
                r#"{"command":"echo","args":["golden"],"tag":"golden"}"#,
            ),
            make(
                "fresh-session",
                &p("golden-new/processes"),
                aj,
                r#"{"command":"cat","stdin":true,"env":{"A":"1"},"cwd":"/workspace"}"#,
            ),
            make(
                "tag-in-use",
                &p("bound-1/processes"),
                aj,
                r#"{"command":"cat","stdin":true,"tag":"reader"}"#,
            ),
            make(
                "bad-tag",
                &p("bound-1/processes"),
                aj,
                r#"{"command":"ls","tag":"a b"}"#,
            ),
        ],
        ("GET", "/v1/sessions/{session}/processes") => vec![
            make("bound", &p("bound-1/processes"), a, ""),
            make("unbound", &p("golden-unbound/processes"), a, ""),
        ],
        ("GET", "/v1/sessions/{session}/processes/{process}/attach") => vec![
            make(
                "replay",
                &p("bound-1/processes/seeded/attach?from=0"),
                a,
                "",
            ),
            make("by-pid", &p("bound-1/processes/1001/attach?from=3"), a, ""),
            make(
                "ahead",
                &p("bound-1/processes/seeded/attach?from=99999"),
                a,
                "",
            ),
            make(
                "bad-offset",
                &p("bound-1/processes/seeded/attach?from=x"),
                a,
                "",
            ),
            make("unknown", &p("bound-1/processes/nope/attach"), a, ""),
            make("unbound", &p("golden-unbound/processes/1/attach"), a, ""),
        ],
        ("POST", "/v1/sessions/{session}/processes/{process}/stdin") => vec![
            make("reader", &p("bound-1/processes/reader/stdin"), a, "line\n"),
            make("exited", &p("bound-1/processes/seeded/stdin"), a, "x"),
            make("unknown", &p("bound-1/processes/4242/stdin"), a, "x"),
        ],
        ("DELETE", "/v1/sessions/{session}/processes/{process}/stdin") => vec![
            make("reader", &p("bound-1/processes/reader/stdin"), a, ""),
            make("unknown", &p("bound-1/processes/nope/stdin"), a, ""),
        ],
        ("POST", "/v1/sessions/{session}/processes/{process}/signal") => vec![
            make(
                "kill",
                &p("bound-1/processes/reader/signal"),
                aj,
                r#"{"signal":"KILL"}"#,
            ),
            make("exited", &p("bound-1/processes/seeded/signal"), a, ""),
            make(
                "bad-signal",
                &p("bound-1/processes/seeded/signal"),
                aj,
                r#"{"signal":"STOP"}"#,
            ),
        ],
        // Streamed files, rename, watch.
        ("GET", "/v1/sessions/{session}/files/stream") => vec![
            make(
                "file",
                &p("bound-1/files/stream?path=/workspace/out.txt"),
                a,
                "",
            ),
            make("dir", &p("bound-1/files/stream?path=/workspace"), a, ""),
            make(
                "unbound",
                &p("golden-unbound/files/stream?path=/workspace/out.txt"),
                a,
                "",
            ),
        ],
        ("PUT", "/v1/sessions/{session}/files/stream") => vec![
            make(
                "text",
                &p("bound-1/files/stream?path=/workspace/streamed.txt"),
                a,
                "streamed content\n",
            ),
            make(
                "input-dir",
                &p("bound-1/files/stream?path=/workspace/input/x.txt"),
                a,
                "x",
            ),
        ],
        ("POST", "/v1/sessions/{session}/files/rename") => vec![
            make(
                "file",
                &p("bound-1/files/rename"),
                aj,
                r#"{"from":"/workspace/out.txt","to":"/workspace/moved/out.txt"}"#,
            ),
            make(
                "missing",
                &p("bound-1/files/rename"),
                aj,
                r#"{"from":"/workspace/none","to":"/workspace/x"}"#,
            ),
        ],
        ("GET", "/v1/sessions/{session}/watch") => vec![
            make(
                "workspace",
                &p("bound-1/watch?path=/workspace&recursive=true"),
                a,
                "",
            ),
            make("file", &p("bound-1/watch?path=/workspace/out.txt"), a, ""),
            make("unbound", &p("golden-unbound/watch?path=/workspace"), a, ""),
        ],
        // A route added to the table gets generated cases only until someone picks its valid
        // requests here.
        _ => Vec::new(),
    }
}

/// The canonical text of a JSON value: sorted keys, no whitespace.
pub(crate) fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Keys whose values differ run to run (or by timing): replaced by `<volatile:TYPE>`.
const VOLATILE_KEYS: &[&str] = &["duration_ms", "modified", "ticket"];

/// `value` with its volatile parts replaced by placeholders.
pub(crate) fn scrub(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if VOLATILE_KEYS.contains(&k.as_str()) && !v.is_null() {
                        Value::String(format!("<volatile:{}>", kind(v)))
                    } else {
                        scrub(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(scrub).collect()),
        Value::String(text) => Value::String(scrub_text(text)),
        other => other.clone(),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The fake provider's IDs are `fake-<instance>-<n>` and `snap-<instance>-<n>` with a random
/// 8-hex-digit instance per provider: the instance becomes `<i>`, the sequence number stays
/// (it is deterministic and shows which sandbox an answer names).
pub(crate) fn scrub_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = ["fake-", "snap-"]
        .iter()
        .filter_map(|p| rest.find(p).map(|i| (i, p.len())))
        .min()
    {
        let (i, prefix) = at;
        let after = &rest[i + prefix..];
        let hex = after.len() >= 9
            && after.as_bytes()[..8].iter().all(u8::is_ascii_hexdigit)
            && after.as_bytes()[8] == b'-';
        out.push_str(&rest[..i + prefix]);
        if hex {
            out.push_str("<i>");
            rest = &after[8..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The canonical record of a response body.
pub(crate) fn canonical_body(route: &str, content_type: Option<&str>, body: &[u8]) -> Value {
    if body.is_empty() {
        return json!({ "empty": true });
    }
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(str::trim)
        .unwrap_or("");
    if route == "GET /v1/openapi.json"
        && let Ok(doc) = serde_json::from_slice::<Value>(body)
    {
        return json!({ "openapi_operations": operations(&doc) });
    }
    match media {
        "application/json" => match serde_json::from_slice::<Value>(body) {
            Ok(v) => json!({ "json": scrub(&v) }),
            Err(_) => bytes(body),
        },
        "application/x-ndjson" => {
            let lines: Vec<Value> = String::from_utf8_lossy(body)
                .lines()
                .map(|line| match serde_json::from_str::<Value>(line) {
                    Ok(v) => scrub(&v),
                    Err(_) => json!({ "not_json": scrub_text(line) }),
                })
                .collect();
            json!({ "ndjson": lines })
        }
        m if m.starts_with("application/openmetrics-text") || m.starts_with("text/plain") => {
            json!({ "text_lines": metrics_lines(&String::from_utf8_lossy(body)) })
        }
        _ => bytes(body),
    }
}

/// Metrics text with each sample's value masked, sorted: the families, their types and label
/// sets are the contract; the counts depend on timing (durations, histograms) and the order of
/// label sets within a family on a hash map.
fn metrics_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with('#') {
                return line.to_owned();
            }
            match line.rsplit_once(' ') {
                Some((sample, _value)) => format!("{sample} <value>"),
                None => line.to_owned(),
            }
        })
        .collect();
    lines.sort();
    lines
}

fn bytes(body: &[u8]) -> Value {
    if body.len() <= 256 {
        json!({ "bytes": body.len(), "base64": base64::engine::general_purpose::STANDARD.encode(body) })
    } else {
        let digest = Sha256::digest(body);
        let mut hex = String::new();
        for b in digest {
            let _ = write!(hex, "{b:02x}");
        }
        json!({ "bytes": body.len(), "sha256": hex })
    }
}

/// `{"METHOD /path": {"operationId", "statuses"}}` of an OpenAPI document.
fn operations(doc: &Value) -> Value {
    let mut out = Map::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            let Some(item) = item.as_object() else {
                continue;
            };
            for (method, op) in item {
                let mut statuses: Vec<String> = op["responses"]
                    .as_object()
                    .map(|r| r.keys().cloned().collect())
                    .unwrap_or_default();
                statuses.sort();
                out.insert(
                    format!("{} {path}", method.to_uppercase()),
                    json!({ "operationId": op["operationId"], "statuses": statuses }),
                );
            }
        }
    }
    Value::Object(out)
}

/// The canonical record of one answer.
pub(crate) fn response_json(route: &str, answer: &Answer) -> Value {
    json!({
        "status": answer.status,
        "content_type": answer.content_type,
        "body": canonical_body(route, answer.content_type.as_deref(), &answer.body),
    })
}

/// Sends `requests` (grouped by route, each route on a fresh seeded router), in order; the
/// answers as they came.
pub(crate) async fn answers(requests: &[Request]) -> Result<Vec<Answer>, String> {
    let mut out = Vec::with_capacity(requests.len());
    let mut current: Option<(String, Router, String)> = None;
    for request in requests {
        let fresh = !matches!(&current, Some((route, _, _)) if *route == request.route);
        if fresh {
            let app = app();
            let snapshot = seed(&app).await;
            current = Some((request.route.clone(), app, snapshot));
        }
        let Some((_, app, snapshot)) = &current else {
            return Err("no router".to_owned());
        };
        let mut uri = request.uri.replace(SNAPSHOT, &encode(snapshot));
        if uri.contains(TICKET) {
            let ticket = ticket_for(app, &uri).await?;
            uri = uri.replace(TICKET, &encode(&ticket));
        }
        let body = String::from_utf8(request.body.clone())
            .map(|text| text.replace(SNAPSHOT, snapshot).into_bytes())
            .unwrap_or_else(|e| e.into_bytes());
        let headers: Vec<(&str, &str)> = request
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let answer = send_with(app.clone(), &request.method, &uri, &headers, body)
            .await
            .map_err(|e| format!("{} {}: {e}", request.route, request.case))?;
        out.push(answer);
    }
    Ok(out)
}

/// A fresh terminal ticket of the session `uri` names (`/v1/sessions/<session>/...`).
async fn ticket_for(app: &Router, uri: &str) -> Result<String, String> {
    let session = uri
        .strip_prefix("/v1/sessions/")
        .and_then(|rest| rest.split(['/', '?']).next())
        .ok_or_else(|| format!("{uri}: {TICKET} needs a session path"))?;
    let auth = format!("Bearer {TOKEN}");
    let answer = send_with(
        app.clone(),
        "POST",
        &format!("/v1/sessions/{session}/terminal/ticket"),
        &[("authorization", auth.as_str())],
        Vec::new(),
    )
    .await?;
    serde_json::from_slice::<Value>(&answer.body)
        .ok()
        .and_then(|v| v["ticket"].as_str().map(str::to_owned))
        .ok_or_else(|| {
            format!(
                "{uri}: no ticket for {session}: {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            )
        })
}

/// The corpus entries of `requests`: each request with its canonical answer, in order.
pub(crate) async fn record(requests: &[Request]) -> Result<Vec<Value>, String> {
    let answers = answers(requests).await?;
    Ok(requests
        .iter()
        .zip(&answers)
        .map(|(request, answer)| {
            let mut entry = request.to_json();
            entry["response"] = response_json(&request.route, answer);
            entry
        })
        .collect())
}

/// The corpus text of `entries`: one canonical line each.
pub(crate) fn corpus_text(entries: &[Value]) -> String {
    let mut out = String::new();
    for entry in entries {
        out.push_str(&canonical(entry));
        out.push('\n');
    }
    out
}

/// The requests of a corpus text, and its entries as written.
pub(crate) fn parse_corpus(text: &str) -> Result<Vec<(Request, Value)>, String> {
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let entry: Value =
                serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
            let request = Request::from_json(&entry).map_err(|e| format!("line {}: {e}", i + 1))?;
            Ok((request, entry))
        })
        .collect()
}

/// Where `expected` and `actual` first differ: a JSON pointer and both values there.
pub(crate) fn first_difference(expected: &Value, actual: &Value) -> Option<(String, Value, Value)> {
    match (expected, actual) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let (x, y) = (
                    a.get(k).cloned().unwrap_or(Value::Null),
                    b.get(k).cloned().unwrap_or(Value::Null),
                );
                if a.contains_key(k) != b.contains_key(k) {
                    let missing = |present: bool, v: Value| {
                        if present { v } else { json!("<absent>") }
                    };
                    return Some((
                        format!("/{k}"),
                        missing(a.contains_key(k), x),
                        missing(b.contains_key(k), y),
                    ));
                }
                first_difference(&x, &y).map(|(p, x, y)| (format!("/{k}{p}"), x, y))
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            a.iter().zip(b).enumerate().find_map(|(i, (x, y))| {
                first_difference(x, y).map(|(p, x, y)| (format!("/{i}{p}"), x, y))
            })
        }
        (a, b) if a == b => None,
        (a, b) => Some((String::new(), a.clone(), b.clone())),
    }
}
