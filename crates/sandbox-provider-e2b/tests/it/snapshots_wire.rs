//! Snapshots and the template catalog against the recording control plane: the requests they
//! send (routes, bodies, the snapshot filter and paging), the delete that takes a 404 as done
//! and a still-used snapshot as a conflict, and the standard template that only a ready,
//! tagged build satisfies.

use sandbox_core::{ErrorKind, SandboxId, SnapshotId, narrow};
use serde_json::json;

use crate::recorder::{Recorder, Reply};
use crate::wire::provider;

fn detail(id: &str, metadata: serde_json::Value) -> serde_json::Value {
    json!({
        "sandboxID": id,
        "templateID": "base",
        "clientID": "c",
        "startedAt": "2026-12-02T10:00:00Z",
        "endAt": "2026-12-02T10:05:00Z",
        "state": "running",
        "envdVersion": "0.2.0",
        "metadata": metadata,
    })
}

#[tokio::test]
async fn a_snapshot_is_one_post_with_the_name_and_carries_the_sources_tenant() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/sandboxes/i1",
        vec![Reply::ok(
            200,
            detail("i1", json!({"sbx.sandbox_tenant_id": "7", "team": "a"})),
        )],
    );
    rec.on(
        "POST",
        "/sandboxes/i1/snapshots",
        vec![Reply::ok(
            201,
            json!({"snapshotID": "mine:default", "names": ["team/mine:default"]}),
        )],
    );
    let p = provider(&rec);
    let snapshots = narrow::snapshots(&p).expect("snapshots declared");
    let id = SandboxId::new("i1").unwrap();
    let snap = snapshots.create_snapshot(&id, Some("mine")).await.unwrap();
    assert_eq!(snap.id.as_str(), "mine:default");
    assert_eq!(snap.name.as_deref(), Some("mine"));
    assert_eq!(snap.source.as_ref(), Some(&id));
    assert_eq!(snap.tenant.map(|t| t.get()), Some(7));
    let posts = rec.seen_at("POST", "/sandboxes/i1/snapshots");
    assert_eq!(posts.len(), 1);
    // The name carries the source's tenant, so a listing can tell whose it is.
    assert_eq!(posts[0].json(), json!({"name": "sbx-t7-mine"}));
    assert_eq!(
        posts[0].header("x-api-key"),
        Some("e2b_test_key_0123456789")
    );

    // No name and a source without a tenant: the name says it has none.
    rec.on(
        "GET",
        "/sandboxes/i1",
        vec![Reply::ok(200, detail("i1", json!({})))],
    );
    let snap = snapshots.create_snapshot(&id, None).await.unwrap();
    assert_eq!(snap.tenant, None);
    assert_eq!(
        rec.seen_at("POST", "/sandboxes/i1/snapshots")[1].json(),
        json!({"name": "sbx-t-"})
    );
}

#[tokio::test]
async fn a_snapshot_of_a_missing_sandbox_is_not_found_and_never_posted() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/sandboxes/i9",
        vec![Reply::error(404, "sandbox i9 not found")],
    );
    let p = provider(&rec);
    let snapshots = narrow::snapshots(&p).unwrap();
    let e = snapshots
        .create_snapshot(&SandboxId::new("i9").unwrap(), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(rec.seen_at("POST", "/sandboxes/i9/snapshots").is_empty());
}

#[tokio::test]
async fn a_failed_snapshot_is_not_sent_again() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/sandboxes/i1",
        vec![Reply::ok(200, detail("i1", json!({})))],
    );
    rec.on(
        "POST",
        "/sandboxes/i1/snapshots",
        vec![Reply::Json(
            503,
            vec![("retry-after", "0".to_owned())],
            json!({"code": 503, "message": "busy"}),
        )],
    );
    let p = provider(&rec);
    let e = narrow::snapshots(&p)
        .unwrap()
        .create_snapshot(&SandboxId::new("i1").unwrap(), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(rec.seen_at("POST", "/sandboxes/i1/snapshots").len(), 1);
}

#[tokio::test]
async fn list_filters_by_the_source_and_pages_with_the_next_token() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/snapshots",
        vec![
            Reply::Json(
                200,
                vec![("x-next-token", "page-2".to_owned())],
                json!([{"snapshotID": "a:default", "names": ["team/a:default"]}]),
            ),
            Reply::ok(
                200,
                json!([{"snapshotID": "b:default", "names": ["b:default"]}]),
            ),
        ],
    );
    let p = provider(&rec);
    let source = SandboxId::new("i1").unwrap();
    let listed = narrow::snapshots(&p)
        .unwrap()
        .list_snapshots(Some(&source))
        .await
        .unwrap();
    let ids: Vec<&str> = listed.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["a:default", "b:default"]);
    assert_eq!(listed[0].name.as_deref(), Some("team/a:default"));
    assert_eq!(listed[1].name, None, "a name that is the ID is no name");
    assert!(listed.iter().all(|s| s.source.as_ref() == Some(&source)));
    let calls = rec.seen_at("GET", "/snapshots");
    assert_eq!(calls.len(), 2);
    let first = calls[0].params();
    assert!(
        first.contains(&("sandboxID".to_owned(), "i1".to_owned())),
        "{first:?}"
    );
    assert!(
        first.contains(&("limit".to_owned(), "100".to_owned())),
        "{first:?}"
    );
    assert!(!first.iter().any(|(k, _)| k == "nextToken"), "{first:?}");
    assert!(
        calls[1]
            .params()
            .contains(&("nextToken".to_owned(), "page-2".to_owned()))
    );

    // Unfiltered: no sandboxID, and no source claimed.
    rec.on("GET", "/snapshots", vec![Reply::ok(200, json!([]))]);
    let all = narrow::snapshots(&p)
        .unwrap()
        .list_snapshots(None)
        .await
        .unwrap();
    assert!(all.is_empty());
    let last = rec.seen_at("GET", "/snapshots").pop().unwrap().params();
    assert!(!last.iter().any(|(k, _)| k == "sandboxID"), "{last:?}");
}

#[tokio::test]
async fn delete_is_the_templates_delete_a_404_is_done_and_a_used_one_a_conflict() {
    let rec = Recorder::start().await;
    let p = provider(&rec);
    let snapshots = narrow::snapshots(&p).unwrap();
    let id = SnapshotId::new("mine:default").unwrap();
    // The ID is one escaped path segment.
    let path = "/templates/mine%3Adefault";
    rec.on(
        "DELETE",
        path,
        vec![Reply::Raw(204, Vec::new(), bytes::Bytes::new())],
    );
    snapshots.delete_snapshot(&id).await.unwrap();
    rec.on(
        "DELETE",
        path,
        vec![Reply::error(404, "template not found")],
    );
    snapshots
        .delete_snapshot(&id)
        .await
        .expect("an absent snapshot is deleted already");
    for reply in [
        Reply::error(409, "template 'mine' is in use by sandbox i2"),
        // E2B's own words for it, on a 400.
        Reply::error(
            400,
            "cannot delete template 'mine': there are paused sandboxes using it",
        ),
    ] {
        rec.on("DELETE", path, vec![reply]);
        let e = snapshots.delete_snapshot(&id).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    }
    let e = {
        rec.on("DELETE", path, vec![Reply::error(500, "boom")]);
        snapshots.delete_snapshot(&id).await.unwrap_err()
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(rec.seen_at("DELETE", path).len() >= 5);
}

#[tokio::test]
async fn templates_list_and_mark_the_configured_one_standard() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/templates",
        vec![Reply::ok(
            200,
            json!([
                {"templateID": "t1", "buildID": "b1", "names": ["base"], "aliases": ["base"], "buildStatus": "ready", "public": false},
                {"templateID": "t2", "buildID": "b2", "aliases": ["other"], "buildStatus": "error"},
            ]),
        )],
    );
    let p = provider(&rec);
    let listed = narrow::template_catalog(&p)
        .expect("template_catalog declared")
        .list_templates()
        .await
        .unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(
        (
            listed[0].id.as_str(),
            listed[0].name.as_str(),
            listed[0].status.as_str()
        ),
        ("t1", "base", "ready")
    );
    assert!(listed[0].standard);
    assert_eq!(
        (listed[1].name.as_str(), listed[1].status.as_str()),
        ("other", "error")
    );
    assert!(!listed[1].standard);
}

#[tokio::test]
async fn the_standard_template_is_only_a_ready_build_of_its_tag() {
    let rec = Recorder::start().await;
    rec.on(
        "GET",
        "/templates/base",
        vec![Reply::ok(
            200,
            json!({
                "templateID": "t1",
                "names": ["base"],
                "builds": [
                    {"buildID": "b1", "status": "ready"},
                    {"buildID": "b2", "status": "error"},
                    {"buildID": "b3", "status": "ready"},
                ],
            }),
        )],
    );
    rec.on(
        "GET",
        "/templates/t1/tags",
        vec![Reply::ok(
            200,
            json!([{"tag": "default", "buildID": "b1"}, {"tag": "v2", "buildID": "b2"}]),
        )],
    );
    let p = provider(&rec);
    let catalog = narrow::template_catalog(&p).unwrap();
    let standard = catalog.ensure_standard_template().await.unwrap();
    assert_eq!(
        (
            standard.id.as_str(),
            standard.name.as_str(),
            standard.status.as_str()
        ),
        ("t1", "base", "ready")
    );
    assert!(standard.standard);

    // The default tag on a failed build; then no default tag at all (b3 is ready, untagged).
    for tags in [
        json!([{"tag": "default", "buildID": "b2"}]),
        json!([{"tag": "v2", "buildID": "b1"}]),
    ] {
        rec.on(
            "GET",
            "/templates/t1/tags",
            vec![Reply::ok(200, tags.clone())],
        );
        let e = catalog.ensure_standard_template().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{tags}: {e}");
        assert!(
            e.message().contains("base") && e.message().contains("build spec"),
            "{e}"
        );
    }

    // Absent: the same refusal, naming it.
    rec.on(
        "GET",
        "/templates/base",
        vec![Reply::error(404, "template 'base' not found")],
    );
    let e = catalog.ensure_standard_template().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.message().contains("not on the plane"), "{e}");
    // Nothing was ever built or deleted.
    assert!(
        rec.seen().iter().all(|s| s.method == "GET"),
        "{:?}",
        rec.seen()
            .iter()
            .map(|s| format!("{} {}", s.method, s.path))
            .collect::<Vec<_>>()
    );
}
