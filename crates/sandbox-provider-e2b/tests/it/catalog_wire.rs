//! The standard template ensured against the recording control plane: a ready build its tag
//! names is used as it is; with a build spec (`template_from_image`) a missing, untagged or
//! failed one is rebuilt by exactly one build request and one start from the image, then
//! polled until ready; a build ending in `error` or not ready in time is an error, never the
//! standard template; without a build spec nothing is built and the refusal names the key.

use std::time::Duration;

use sandbox_core::{Checked, ErrorKind, Secret, narrow};
use sandbox_provider_e2b::{E2bConfig, E2bProvider};
use serde_json::{Value, json};

use crate::recorder::{Recorder, Reply};

const IMAGE: &str = "sandbox-debian:test";

/// A provider of the recording plane booting template `template`, with `image` as its build
/// spec when given.
fn catalog(
    rec: &Recorder,
    template: &str,
    image: Option<&str>,
    build_timeout: u64,
) -> Checked<E2bProvider> {
    let mut config = E2bConfig::new(rec.url(), Secret::new("e2b_test_key_0123456789"), template);
    config.allow_private_endpoints = true;
    config.sandbox_domain = "localhost".into();
    config.proxy_url = rec.url();
    config.template_from_image = image.unwrap_or_default().to_owned();
    config.template_build_timeout_seconds = build_timeout;
    E2bProvider::new(config).unwrap()
}

fn detail(builds: Value) -> Value {
    json!({"templateID": "t1", "names": ["std"], "aliases": ["std"], "builds": builds})
}

fn status(word: &str) -> Reply {
    Reply::ok(
        200,
        json!({"templateID": "t1", "buildID": "b9", "status": word, "logs": [], "logEntries": []}),
    )
}

/// The plane's template build routes for a new build `b9` of `t1`, its status answering
/// `statuses` in turn, and the template read back with `b9` ready under the default tag.
fn script_build(rec: &Recorder, statuses: Vec<Reply>) {
    rec.on(
        "POST",
        "/v3/templates",
        vec![Reply::ok(
            202,
            json!({"templateID": "t1", "buildID": "b9", "public": false, "names": ["std"], "tags": ["default"], "aliases": ["std"]}),
        )],
    );
    rec.on(
        "POST",
        "/v2/templates/t1/builds/b9",
        vec![Reply::Raw(202, Vec::new(), bytes::Bytes::new())],
    );
    rec.on("GET", "/templates/t1/builds/b9/status", statuses);
    rec.on(
        "GET",
        "/templates/t1",
        vec![Reply::ok(
            200,
            detail(json!([
                {"buildID": "b1", "status": "ready"},
                {"buildID": "b9", "status": "ready"},
            ])),
        )],
    );
}

/// Every request that is not a read.
fn writes(rec: &Recorder) -> Vec<String> {
    rec.seen()
        .iter()
        .filter(|s| s.method != "GET")
        .map(|s| format!("{} {}", s.method, s.path))
        .collect()
}

#[tokio::test]
async fn a_ready_tagged_build_is_the_standard_template_and_nothing_is_built() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/templates/std",
        vec![Reply::ok(
            200,
            detail(json!([
                {"buildID": "b1", "status": "ready"},
                {"buildID": "b2", "status": "error"},
            ])),
        )],
    );
    rec.on(
        "GET",
        "/templates/t1/tags",
        vec![Reply::ok(200, json!([{"tag": "default", "buildID": "b1"}]))],
    );
    let p = catalog(&rec, "std", Some(IMAGE), 600);
    let standard = narrow::template_catalog(&p)
        .unwrap()
        .ensure_standard_template()
        .await
        .unwrap();
    assert_eq!(
        (
            standard.id.as_str(),
            standard.name.as_str(),
            standard.status.as_str()
        ),
        ("t1", "std", "ready")
    );
    assert!(standard.standard);
    assert!(writes(&rec).is_empty(), "{:?}", writes(&rec));
}

#[tokio::test]
async fn a_missing_untagged_or_failed_template_is_built_once_from_the_image_and_polled_to_ready() {
    // (what the team has, the tags it shows before the build)
    let cases: [(&str, Option<Value>, Value); 3] = [
        ("missing", None, json!([])),
        (
            "untagged",
            Some(detail(json!([{"buildID": "b1", "status": "ready"}]))),
            json!([{"tag": "v1", "buildID": "b1"}]),
        ),
        (
            "failed",
            Some(detail(json!([{"buildID": "b2", "status": "error"}]))),
            json!([{"tag": "default", "buildID": "b2"}]),
        ),
    ];
    for (case, team, tags) in cases {
        let rec = Recorder::start().await;
        match team {
            Some(team) => rec.on("GET", "/templates/std", vec![Reply::ok(200, team)]),
            None => rec.on(
                "GET",
                "/templates/std",
                vec![Reply::error(404, "template 'std' not found")],
            ),
        }
        // Before the build (a missing template has none to read), then after it: the tag
        // now names the new build.
        let after = Reply::ok(
            200,
            json!([{"tag": "v1", "buildID": "b1"}, {"tag": "default", "buildID": "b9"}]),
        );
        let replies = if case == "missing" {
            vec![after]
        } else {
            vec![Reply::ok(200, tags), after]
        };
        rec.on("GET", "/templates/t1/tags", replies);
        script_build(
            &rec,
            vec![status("waiting"), status("building"), status("ready")],
        );
        let p = catalog(&rec, "std", Some(IMAGE), 600);
        let standard = narrow::template_catalog(&p)
            .unwrap()
            .ensure_standard_template()
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(
            (standard.id.as_str(), standard.status.as_str()),
            ("t1", "ready"),
            "{case}"
        );
        assert!(standard.standard, "{case}");

        let requested = rec.seen_at("POST", "/v3/templates");
        assert_eq!(requested.len(), 1, "{case}");
        assert_eq!(
            requested[0].json(),
            json!({"name": "std", "tags": ["default"]}),
            "{case}"
        );
        let started = rec.seen_at("POST", "/v2/templates/t1/builds/b9");
        assert_eq!(started.len(), 1, "{case}");
        assert_eq!(started[0].json(), json!({"fromImage": IMAGE}), "{case}");
        assert_eq!(
            rec.seen_at("GET", "/templates/t1/builds/b9/status").len(),
            3,
            "{case}: polled until ready, then no more"
        );
        // Nothing deleted, no tag moved by hand: the build carries its tag.
        assert_eq!(
            writes(&rec),
            ["POST /v3/templates", "POST /v2/templates/t1/builds/b9"],
            "{case}"
        );
        if case == "missing" {
            // The alias lookup found no public template of the name first.
            assert_eq!(rec.seen_at("GET", "/templates/aliases/std").len(), 1);
        }
    }
}

#[tokio::test]
async fn a_build_ending_in_error_is_an_error_and_never_the_standard_template() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/templates/std",
        vec![Reply::ok(200, detail(json!([])))],
    );
    rec.on("GET", "/templates/t1/tags", vec![Reply::ok(200, json!([]))]);
    script_build(
        &rec,
        vec![
            status("building"),
            Reply::ok(
                200,
                json!({"templateID": "t1", "buildID": "b9", "status": "error", "logs": [],
                       "reason": {"message": "image sandbox-debian:test is not present", "logEntries": []}}),
            ),
        ],
    );
    let p = catalog(&rec, "std", Some(IMAGE), 600);
    let e = narrow::template_catalog(&p)
        .unwrap()
        .ensure_standard_template()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Internal, "{e}");
    assert!(
        e.message().contains("b9") && e.message().contains("is not present"),
        "{e}"
    );
    assert_eq!(rec.seen_at("POST", "/v3/templates").len(), 1);
    assert_eq!(
        rec.seen_at("GET", "/templates/t1/builds/b9/status").len(),
        2
    );
    // The failed build is never read back as the standard template.
    assert!(rec.seen_at("GET", "/templates/t1").is_empty());
}

#[tokio::test]
async fn a_build_not_ready_in_time_is_a_timeout_and_never_requested_again() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/templates/std",
        vec![Reply::ok(200, detail(json!([])))],
    );
    rec.on("GET", "/templates/t1/tags", vec![Reply::ok(200, json!([]))]);
    script_build(&rec, vec![status("building")]);
    let p = catalog(&rec, "std", Some(IMAGE), 1);
    let started = std::time::Instant::now();
    let e = narrow::template_catalog(&p)
        .unwrap()
        .ensure_standard_template()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        e.message()
            .contains("e2b_provider.template_build_timeout_seconds"),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(rec.seen_at("POST", "/v3/templates").len(), 1);
    assert_eq!(rec.seen_at("POST", "/v2/templates/t1/builds/b9").len(), 1);
    assert!(rec.seen_at("GET", "/templates/t1/builds/b9/status").len() >= 2);
}

#[tokio::test]
async fn a_refused_build_request_is_not_sent_again() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/templates/std",
        vec![Reply::ok(200, detail(json!([])))],
    );
    rec.on("GET", "/templates/t1/tags", vec![Reply::ok(200, json!([]))]);
    rec.on(
        "POST",
        "/v3/templates",
        vec![Reply::Json(
            503,
            vec![("retry-after", "0".to_owned())],
            json!({"code": 503, "message": "busy"}),
        )],
    );
    let p = catalog(&rec, "std", Some(IMAGE), 600);
    let e = narrow::template_catalog(&p)
        .unwrap()
        .ensure_standard_template()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(writes(&rec), ["POST /v3/templates"]);
}

#[tokio::test]
async fn a_tagged_build_still_running_is_waited_for_not_rebuilt() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/templates/std",
        vec![Reply::ok(
            200,
            detail(json!([{"buildID": "b9", "status": "building"}])),
        )],
    );
    rec.on(
        "GET",
        "/templates/t1/tags",
        vec![Reply::ok(200, json!([{"tag": "default", "buildID": "b9"}]))],
    );
    rec.on(
        "GET",
        "/templates/t1/builds/b9/status",
        vec![status("building"), status("ready")],
    );
    rec.on(
        "GET",
        "/templates/t1",
        vec![Reply::ok(
            200,
            detail(json!([{"buildID": "b9", "status": "ready"}])),
        )],
    );
    let p = catalog(&rec, "std", Some(IMAGE), 600);
    let standard = narrow::template_catalog(&p)
        .unwrap()
        .ensure_standard_template()
        .await
        .unwrap();
    assert_eq!(standard.id, "t1");
    assert!(writes(&rec).is_empty(), "{:?}", writes(&rec));
}

#[tokio::test]
async fn a_public_template_needs_no_build() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/templates/base",
        vec![Reply::error(404, "template 'base' not found")],
    );
    rec.on(
        "GET",
        "/templates/aliases/base",
        vec![Reply::ok(
            200,
            json!({"templateID": "base", "public": true}),
        )],
    );
    let p = catalog(&rec, "base", Some(IMAGE), 600);
    let standard = narrow::template_catalog(&p)
        .unwrap()
        .ensure_standard_template()
        .await
        .unwrap();
    assert_eq!(
        (standard.id.as_str(), standard.status.as_str()),
        ("base", "ready")
    );
    assert!(writes(&rec).is_empty(), "{:?}", writes(&rec));
}

#[tokio::test]
async fn without_a_build_spec_nothing_is_built_and_the_refusal_names_the_key() {
    for (case, tags) in [
        ("untagged", json!([])),
        ("failed", json!([{"tag": "default", "buildID": "b2"}])),
    ] {
        let rec = Recorder::start().await;
        rec.on(
            "GET",
            "/templates/std",
            vec![Reply::ok(
                200,
                detail(json!([{"buildID": "b2", "status": "error"}])),
            )],
        );
        rec.on("GET", "/templates/t1/tags", vec![Reply::ok(200, tags)]);
        let p = catalog(&rec, "std", None, 600);
        let e = narrow::template_catalog(&p)
            .unwrap()
            .ensure_standard_template()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{case}: {e}");
        assert!(
            e.message().contains("e2b_provider.template_from_image"),
            "{case}: {e}"
        );
        assert!(writes(&rec).is_empty(), "{case}: {:?}", writes(&rec));
    }
}
