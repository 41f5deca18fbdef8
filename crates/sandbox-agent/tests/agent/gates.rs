//! The envd version the agent reports, proven gate by gate: one check per row of
//! `sandbox_agent::version::GATES`, run against an in-process agent with everything the binary
//! mounts. The table is iterated here and matched exhaustively on its `Feature`, so a row
//! cannot be added without a check, and every row at or below `ENVD_VERSION` must pass.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, StatusCode};
use sandbox_agent::extension::VERSION_INFO;
use sandbox_agent::version::{ENVD_VERSION, Feature, GATES, Gate, envd_version};
use sandbox_envd::filesystem::watch_dir_response::Event as WatchEvent;
use sandbox_envd::filesystem::{
    CreateWatcherRequest, EventType, FileType, FilesystemEvent, WatchDirRequest, WatchDirResponse,
};
use sandbox_envd::process as ps;
use sandbox_envd::process::process_event::Event;
use sandbox_transport::envd::{CallOptions, HttpVersion, ServerStream};

use crate::{TOKEN, TestAgent, body_bytes, client_with, raw_client, start_request};

const WAIT: Duration = Duration::from_secs(10);

/// The agent with a second account `second` of the same uid as `user` (so processes run
/// whether or not the test is root), whose name and home tell who a process ran as.
async fn agent() -> TestAgent {
    TestAgent::with_builtin(|c| {
        let dir = c.accounts.passwd.parent().unwrap().to_owned();
        let second_home = dir.join("second");
        std::fs::create_dir(&second_home).unwrap();
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let mut passwd = std::fs::read_to_string(&c.accounts.passwd).unwrap();
        passwd.push_str(&format!(
            "second:x:{uid}:{gid}::{}:/bin/sh\n",
            second_home.display()
        ));
        std::fs::write(&c.accounts.passwd, passwd).unwrap();
    })
    .await
}

#[tokio::test]
async fn every_gate_up_to_the_reported_version_holds() {
    let claimed = envd_version();
    assert_eq!(claimed.to_string(), ENVD_VERSION);
    let agent = Arc::new(agent().await);
    let mut checked = 0;
    for gate in GATES {
        if !gate.implemented {
            // Not built: it must lie above what the agent claims, and has nothing to prove.
            assert!(gate.version > claimed, "{gate:?} is claimed but not built");
            continue;
        }
        let agent = Arc::clone(&agent);
        let gate: Gate = *gate;
        // Each check in a task of its own, so a failure names its gate.
        let outcome = tokio::spawn(async move { check(&agent, gate.feature).await }).await;
        if let Err(e) = outcome {
            panic!(
                "gate {} {:?} ({}) failed: {e}",
                gate.version, gate.feature, gate.proof
            );
        }
        checked += 1;
    }
    // Everything up to the claim was among the checks.
    let claimed_rows = GATES.iter().filter(|g| g.version <= claimed).count();
    assert!(checked >= claimed_rows && claimed_rows > 0);
}

#[tokio::test]
async fn the_version_extension_reports_both_versions_behind_the_token() {
    let agent = TestAgent::start().await;
    for http in crate::BOTH {
        let raw = raw_client(http);
        let without = crate::get(&raw, &agent.url(), "/sandbox-agent/version").await;
        assert_eq!(without.status(), StatusCode::UNAUTHORIZED);
        let response = raw
            .request(
                Request::get(format!("{}/sandbox-agent/version", agent.url()))
                    .header("x-access-token", TOKEN)
                    .body(Full::default())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "application/json");
        let body: serde_json::Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"agent": env!("CARGO_PKG_VERSION"), "envd": ENVD_VERSION})
        );
        assert_eq!(body["envd"], VERSION_INFO.envd);
        let post = raw
            .request(
                Request::post(format!("{}/sandbox-agent/version", agent.url()))
                    .header("x-access-token", TOKEN)
                    .body(Full::default())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        let unknown = raw
            .request(
                Request::get(format!("{}/sandbox-agent/nothing", agent.url()))
                    .header("x-access-token", TOKEN)
                    .body(Full::default())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    }
}

async fn check(agent: &TestAgent, feature: Feature) {
    match feature {
        Feature::Base => base(agent).await,
        Feature::RecursiveWatch => recursive_watch(agent).await,
        Feature::Metrics => metrics(agent).await,
        Feature::DiskMetrics => disk_metrics(agent).await,
        Feature::StdinFalse => stdin_false(agent).await,
        Feature::DefaultUser => default_user(agent).await,
        Feature::CloseStdin => close_stdin(agent).await,
        Feature::OctetStreamUpload => octet_stream_upload(agent).await,
        Feature::FileMetadata => file_metadata(agent).await,
        Feature::EventEntry => event_entry(agent).await,
        Feature::WatchNetworkMounts => watch_network_mounts(agent).await,
    }
}

async fn base(agent: &TestAgent) {
    let raw = raw_client(HttpVersion::Http1);
    let health = crate::get(&raw, &agent.url(), "/health").await;
    assert_eq!(health.status(), StatusCode::NO_CONTENT);
    let client = agent.client(HttpVersion::Http2);
    let mut stream = client
        .start(&crate::sh("echo base; exit 3"), CallOptions::new())
        .await
        .unwrap();
    crate::pid_of(&mut stream).await;
    let out = crate::drain(&mut stream).await;
    assert_eq!(out.stdout, b"base\n");
    assert_eq!(out.end.unwrap().exit_code, 3);
}

/// The next filesystem event of a watch, skipping keepalives.
async fn next_change(stream: &mut ServerStream<WatchDirResponse>) -> FilesystemEvent {
    loop {
        let message = tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("a watch event in time")
            .unwrap()
            .expect("the watch goes on");
        match message.event {
            Some(WatchEvent::Filesystem(e)) => return e,
            Some(WatchEvent::Keepalive(_)) => {}
            other => panic!("unexpected watch message {other:?}"),
        }
    }
}

/// Opens a watch and checks its first message is `start`.
async fn watch(agent: &TestAgent, request: WatchDirRequest) -> ServerStream<WatchDirResponse> {
    let client = agent.client(HttpVersion::Http2);
    let mut stream = client
        .watch_dir(&request, CallOptions::new().no_timeout())
        .await
        .unwrap();
    let first = stream.message().await.unwrap().unwrap();
    assert!(
        matches!(first.event, Some(WatchEvent::Start(_))),
        "{first:?}"
    );
    stream
}

/// Waits for a `kind` event named `name`.
async fn change_named(
    stream: &mut ServerStream<WatchDirResponse>,
    name: &str,
    kind: EventType,
) -> FilesystemEvent {
    loop {
        let event = next_change(stream).await;
        if event.name == name && event.r#type == kind {
            return event;
        }
    }
}

async fn recursive_watch(agent: &TestAgent) {
    let root = agent.accounts.home().join("recursive");
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    let mut stream = watch(
        agent,
        WatchDirRequest {
            path: root.to_str().unwrap().to_owned(),
            recursive: true,
            ..Default::default()
        },
    )
    .await;
    std::fs::write(root.join("a/b/deep.txt"), b"x").unwrap();
    let event = change_named(&mut stream, "a/b/deep.txt", EventType::Create).await;
    assert_eq!(event.entry, None, "no entry unless asked for");
}

async fn get_metrics(agent: &TestAgent) -> serde_json::Value {
    let raw = raw_client(HttpVersion::Http1);
    let without = crate::get(&raw, &agent.url(), "/metrics").await;
    assert_eq!(without.status(), StatusCode::UNAUTHORIZED);
    let response = raw
        .request(
            Request::get(format!("{}/metrics", agent.url()))
                .header("x-access-token", TOKEN)
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.headers()["cache-control"], "no-store");
    serde_json::from_slice(&body_bytes(response).await).unwrap()
}

fn number(metrics: &serde_json::Value, key: &str) -> f64 {
    metrics[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is a number in {metrics}"))
}

async fn metrics(agent: &TestAgent) {
    let m = get_metrics(agent).await;
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    let count = number(&m, "cpu_count");
    // At least what this process may use, and a whole number.
    assert!(count >= cpus.min(1.0) && count.fract() == 0.0, "{m}");
    let pct = number(&m, "cpu_used_pct");
    assert!((0.0..=100.0).contains(&pct), "{m}");
    let total = number(&m, "mem_total");
    let used = number(&m, "mem_used");
    assert!(
        total > 16.0 * 1024.0 * 1024.0 && used > 0.0 && used <= total,
        "{m}"
    );
    assert_eq!(
        number(&m, "mem_total_mib"),
        (total / 1048576.0).floor(),
        "{m}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as f64;
    assert!((number(&m, "ts") - now).abs() <= 60.0, "{m}");
}

async fn disk_metrics(agent: &TestAgent) {
    let m = get_metrics(agent).await;
    let fs = rustix::fs::statvfs("/").unwrap();
    let total = (fs.f_blocks * fs.f_frsize) as f64;
    let unavailable = total - (fs.f_bavail * fs.f_frsize) as f64;
    assert_eq!(number(&m, "disk_total"), total, "{m}");
    let used = number(&m, "disk_used");
    assert!(used > 0.0 && used <= total, "{m}");
    // Other tests write meanwhile: the same figure within 256 MiB.
    assert!((used - unavailable).abs() < 256.0 * 1024.0 * 1024.0, "{m}");
}

async fn stdin_false(agent: &TestAgent) {
    let client = agent.client(HttpVersion::Http2);
    let mut request = start_request("/bin/cat", &[]);
    request.stdin = Some(false);
    let mut stream = client.start(&request, CallOptions::new()).await.unwrap();
    let pid = crate::pid_of(&mut stream).await;
    // No input pipe: cat reads end of file at once and exits by itself.
    let out = tokio::time::timeout(WAIT, crate::drain(&mut stream))
        .await
        .expect("cat ends without input");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert_eq!(out.end.unwrap().exit_code, 0);
    let e = client
        .send_input(
            ps::ProcessSelector::pid(pid),
            ps::ProcessInput::stdin(b"x".to_vec()),
            CallOptions::new(),
        )
        .await
        .unwrap_err();
    assert!(!e.message().is_empty());
}

async fn default_user(agent: &TestAgent) {
    let whoami = |config: sandbox_transport::envd::EnvdConfig| async move {
        let client = client_with(config);
        let mut stream = client
            .start(&crate::sh("echo $USER $HOME"), CallOptions::new())
            .await
            .unwrap();
        crate::pid_of(&mut stream).await;
        String::from_utf8(crate::drain(&mut stream).await.stdout).unwrap()
    };
    // No Authorization header at all (what SDKs send from 0.4.0): the default user.
    let config = agent.config(HttpVersion::Http1);
    let home = agent.accounts.home();
    assert_eq!(
        whoami(config.clone()).await,
        format!("user {}\n", home.display())
    );
    // Naming a user still selects it.
    let named = whoami(config.with_user("second").unwrap()).await;
    assert!(named.starts_with("second "), "{named}");
    assert!(named.trim_end().ends_with("/second"), "{named}");
}

async fn close_stdin(agent: &TestAgent) {
    let client = agent.client(HttpVersion::Http2);
    let mut stream = client
        .start(&start_request("/bin/cat", &[]), CallOptions::new())
        .await
        .unwrap();
    let pid = crate::pid_of(&mut stream).await;
    client
        .send_input(
            ps::ProcessSelector::pid(pid),
            ps::ProcessInput::stdin(b"hello".to_vec()),
            CallOptions::new(),
        )
        .await
        .unwrap();
    // The echo first, so the close cannot overtake the input.
    match tokio::time::timeout(WAIT, crate::next_event(&mut stream))
        .await
        .unwrap()
    {
        Event::Data(d) => assert_eq!(
            d.output,
            Some(ps::process_event::data_event::Output::Stdout(
                b"hello".to_vec()
            ))
        ),
        other => panic!("expected the echo, got {other:?}"),
    }
    client
        .close_stdin(ps::ProcessSelector::pid(pid), CallOptions::new())
        .await
        .unwrap();
    let out = tokio::time::timeout(WAIT, crate::drain(&mut stream))
        .await
        .expect("cat ends once its stdin is closed");
    assert_eq!(out.end.unwrap().exit_code, 0);
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// `POST /files?path=<path>` as `application/octet-stream`, gzip-encoded, with `headers`.
async fn upload_octets(
    agent: &TestAgent,
    path: &str,
    data: &[u8],
    headers: &[(&str, &str)],
) -> serde_json::Value {
    let raw = raw_client(HttpVersion::Http1);
    let mut request = Request::post(format!("{}/files?path={path}", agent.url()))
        .header("x-access-token", TOKEN)
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = raw
        .request(request.body(Full::new(Bytes::from(gzip(data)))).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = body_bytes(response).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

async fn octet_stream_upload(agent: &TestAgent) {
    // 1 MiB that does not compress away.
    let mut data = Vec::with_capacity(1 << 20);
    let mut x: u32 = 0x9E37_79B9;
    while data.len() < 1 << 20 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        data.extend_from_slice(&x.to_le_bytes());
    }
    let answer = upload_octets(agent, "octets/data.bin", &data, &[]).await;
    let entries = answer.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{answer}");
    let written = agent.accounts.home().join("octets/data.bin");
    assert_eq!(entries[0]["path"], written.to_str().unwrap());
    assert_eq!(entries[0]["name"], "data.bin");
    let client = agent.client(HttpVersion::Http1);
    let back = client
        .read_file("octets/data.bin", 2 << 20, CallOptions::new())
        .await
        .unwrap();
    assert!(back == data, "the bytes read back differ");
}

async fn file_metadata(agent: &TestAgent) {
    let answer = upload_octets(
        agent,
        "meta/tagged.txt",
        b"tagged",
        &[("x-metadata-owner", "alice"), ("x-metadata-Stage", "draft")],
    )
    .await;
    assert_eq!(
        answer[0]["metadata"],
        serde_json::json!({"owner": "alice", "stage": "draft"}),
        "{answer}"
    );
    let entry = agent
        .client(HttpVersion::Http2)
        .stat("meta/tagged.txt", CallOptions::new())
        .await
        .unwrap();
    assert_eq!(
        entry.metadata.get("owner").map(String::as_str),
        Some("alice")
    );
    assert_eq!(
        entry.metadata.get("stage").map(String::as_str),
        Some("draft")
    );
    assert_eq!(entry.metadata.len(), 2);
}

async fn event_entry(agent: &TestAgent) {
    let root = agent.accounts.home().join("entries");
    std::fs::create_dir_all(&root).unwrap();
    let mut stream = watch(
        agent,
        WatchDirRequest {
            path: root.to_str().unwrap().to_owned(),
            include_entry: true,
            ..Default::default()
        },
    )
    .await;
    std::fs::write(root.join("new.txt"), b"12345").unwrap();
    let event = change_named(&mut stream, "new.txt", EventType::Create).await;
    let entry = event.entry.expect("the create event carries the entry");
    assert_eq!(entry.name, "new.txt");
    assert_eq!(entry.path, root.join("new.txt").to_str().unwrap());
    assert_eq!(entry.r#type, FileType::File);
}

async fn watch_network_mounts(agent: &TestAgent) {
    let root = agent.accounts.home().join("mounts");
    std::fs::create_dir_all(&root).unwrap();
    // The streamed watch accepts the option (sent as `allowNetworkMounts`) and works.
    let mut stream = watch(
        agent,
        WatchDirRequest {
            path: root.to_str().unwrap().to_owned(),
            allow_network_mounts: true,
            ..Default::default()
        },
    )
    .await;
    std::fs::write(root.join("streamed.txt"), b"s").unwrap();
    change_named(&mut stream, "streamed.txt", EventType::Create).await;
    // So does the polled watcher.
    let client = agent.client(HttpVersion::Http1);
    let id = client
        .create_watcher(
            &CreateWatcherRequest {
                path: root.to_str().unwrap().to_owned(),
                allow_network_mounts: true,
                ..Default::default()
            },
            CallOptions::new(),
        )
        .await
        .unwrap();
    std::fs::write(root.join("polled.txt"), b"p").unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let events = client
            .watcher_events(&id, CallOptions::new())
            .await
            .unwrap();
        if events
            .iter()
            .any(|e| e.name == "polled.txt" && e.r#type == EventType::Create)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no polled event");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client
        .remove_watcher(&id, CallOptions::new())
        .await
        .unwrap();
    // On the wire: the JSON name envd reads.
    let raw = raw_client(HttpVersion::Http1);
    let response = raw
        .request(crate::rpc_request(
            &agent.url(),
            "/filesystem.Filesystem/CreateWatcher",
            "application/json",
            &[],
            format!(
                r#"{{"path":{:?},"allowNetworkMounts":true}}"#,
                root.to_str().unwrap()
            ),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: serde_json::Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
    let id = body["watcherId"].as_str().expect("a watcher id").to_owned();
    client
        .remove_watcher(&id, CallOptions::new())
        .await
        .unwrap();
}
