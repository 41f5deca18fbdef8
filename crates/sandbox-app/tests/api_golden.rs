//! The API's golden corpus: every entry of `tests/golden/api.jsonl` (a request of every route
//! and its canonical answer, see `http_support/golden.rs`) is replayed against the router over
//! the fake provider, and the answer must equal the recorded one: status, `Content-Type` and
//! canonical body. It pins today's HTTP API so a rewrite of the handlers or of how bodies are
//! typed cannot change an answer unnoticed.
//!
//! The corpus changes only by `cargo xtask api-golden --bless`, which runs this test with
//! `SANDBOX_API_GOLDEN_BLESS=1`: the requests are generated again (fixed seeds) and the file is
//! rewritten from the answers; review its diff like code.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod http_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use http_support::clip;
use http_support::golden::{
    CORPUS, corpus_text, first_difference, parse_corpus, record, requests, route_key,
};
use http_support::routes;

const BLESS: &str = "SANDBOX_API_GOLDEN_BLESS";

fn corpus_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(CORPUS)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Routes whose success cannot be reached through `Router::oneshot`: the terminal's 101 needs
/// a real connection to upgrade (`http_terminal_docker.rs` covers it).
const NO_SUCCESS_IN_PROCESS: &[&str] = &["GET /v1/sessions/{session}/terminal"];

#[test]
fn every_corpus_entry_answers_as_recorded() {
    let path = corpus_path();
    if std::env::var(BLESS).is_ok_and(|v| v == "1") {
        let entries = runtime().block_on(record(&requests())).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, corpus_text(&entries)).unwrap();
        eprintln!(
            "api-golden: wrote {} entries to {}",
            entries.len(),
            path.display()
        );
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (create it with `cargo xtask api-golden --bless`)",
            path.display()
        )
    });
    let corpus = parse_corpus(&text).unwrap();
    assert!(!corpus.is_empty(), "{} holds no entries", path.display());

    // Coverage: every route is in the corpus, and with a success unless it cannot have one
    // in-process.
    let mut statuses: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for (request, entry) in &corpus {
        let status = entry["response"]["status"].as_u64().unwrap_or(0);
        statuses
            .entry(request.route.clone())
            .or_default()
            .insert(status);
    }
    for route in &routes() {
        let key = route_key(route);
        let seen = statuses.get(&key);
        assert!(
            seen.is_some(),
            "the corpus has no entry for {key}: bless it"
        );
        if !NO_SUCCESS_IN_PROCESS.contains(&key.as_str()) {
            assert!(
                seen.is_some_and(|s| s.iter().any(|st| (200..300).contains(st))),
                "the corpus has no 2xx answer of {key} (statuses {seen:?}): pick a valid request for it"
            );
        }
    }

    let requests: Vec<_> = corpus.iter().map(|(r, _)| r.clone()).collect();
    let answers = runtime().block_on(record(&requests)).unwrap();
    let mut failures = Vec::new();
    for (line, ((request, expected), actual)) in corpus.iter().zip(&answers).enumerate() {
        let (expected, actual) = (&expected["response"], &actual["response"]);
        if let Some((pointer, want, got)) = first_difference(expected, actual) {
            failures.push(format!(
                "line {} ({} {}): {} {}\n  at response{pointer}\n  - recorded: {}\n  + now:      {}",
                line + 1,
                request.route,
                request.case,
                request.method,
                clip(&request.uri),
                clip(&want.to_string()),
                clip(&got.to_string()),
            ));
        }
    }
    let shown: Vec<&String> = failures.iter().take(20).collect();
    assert!(
        failures.is_empty(),
        "{} of {} corpus entries answer differently (first {} below); if the change is meant, \
         run `cargo xtask api-golden --bless` and review the diff of {CORPUS}:\n\n{}",
        failures.len(),
        corpus.len(),
        shown.len(),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    eprintln!(
        "api-golden: {} entries of {} routes answer as recorded",
        corpus.len(),
        statuses.len()
    );
}
