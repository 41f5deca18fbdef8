//! `sandbox serve` as a real process over the real Docker engine, in each data plane: killed
//! with SIGKILL mid-life (no drain, no cleanup, the memory store gone with it), a new process
//! (a new PID) on the same namespace adopts the session's container through its labels instead
//! of creating a second one, and the files written before the crash are still there. Then
//! SIGTERM drains and exits 0.
//!
//! In agent mode the new process also re-opens the agent channel: the service keeps no count
//! of channel opens it could show, so the engine says it. The channel is one exec running
//! `sandbox-agent relay` in the container; the engine's process list shows the dead process's
//! relay gone (the engine ended its exec with the connection) and a new relay serving the next
//! exec.
//!
//! Needs the engine and the `sandbox-busybox:test` image (agent mode: also the static agent,
//! `SANDBOX_AGENT_BIN`): ignored in a plain `cargo test`, run by `cargo xtask test`.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support;
use support::agent_mode::{self, relay_pids};
use support::container_ids;
use support::serve::{START_DEADLINE, Service, signal, temp_dir};

/// Generous: the engine notices the killed process's connection and ends its exec.
const RELAY_EXIT_DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_restarted_service_adopts_the_sessions_container() {
    restart_adopts("trestart", &agent_mode::exec_env(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_restarted_service_reopens_the_agent_channel_to_the_same_sandbox() {
    restart_adopts("trestarta", &agent_mode::env(), true).await;
}

async fn start(namespace: &str, token_file: &Path, log: &Path, env: &[(&str, &str)]) -> Service {
    let mut service = Service::spawn(namespace, token_file, log, env);
    if let Err(status) = service.ready(START_DEADLINE).await {
        panic!(
            "sandbox serve exited with {status} before answering; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    service
}

async fn restart_adopts(prefix: &str, env: &[(&'static str, String)], agent: bool) {
    let env = agent_mode::borrowed(env);
    let namespace = format!("{prefix}-{:08x}", fastrand::u32(..));
    let dir = temp_dir();
    let token_file = dir.join("dev-token");
    let log = dir.join("serve.log");
    let exec = "/v1/sessions/survivor/exec";

    let mut first = start(&namespace, &token_file, &log, &env).await;
    // The token file is created on first start, private, and reused by the next process.
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim().to_owned();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the development token file is private");

    let (status, out) = first
        .call(
            "POST",
            exec,
            &token,
            r#"{"command":"echo before-crash > state.txt && cat state.txt","shell":true}"#,
        )
        .await;
    assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    assert_eq!(out["stdout"], "before-crash\n");
    let before = container_ids(&namespace).await;
    assert_eq!(before.len(), 1, "one container for the session: {before:?}");
    let container = before[0].clone();
    let first_relays = relay_pids(&container);
    if agent {
        assert_eq!(first_relays.len(), 1, "one open channel: {first_relays:?}");
    } else {
        assert!(
            first_relays.is_empty(),
            "no channel in exec mode: {first_relays:?}"
        );
    }

    let first_pid = first.child.id();
    signal(&first.child, "KILL");
    let status = first.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the first service died of SIGKILL: {status}"
    );
    // The dead process's relay does not linger in the sandbox: its exec ends with the
    // connection.
    let start_wait = Instant::now();
    while !relay_pids(&container).is_empty() {
        assert!(
            start_wait.elapsed() < RELAY_EXIT_DEADLINE,
            "the killed service's relay still runs: {:?}",
            relay_pids(&container)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut second = start(&namespace, &token_file, &log, &env).await;
    assert_ne!(second.child.id(), first_pid, "a new process");
    let (status, out) = second
        .call(
            "POST",
            exec,
            &token,
            r#"{"command":"cat","args":["state.txt"]}"#,
        )
        .await;
    assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    assert_eq!(
        out["stdout"], "before-crash\n",
        "the files written before the crash"
    );
    assert_eq!(
        container_ids(&namespace).await,
        before,
        "the same container was adopted, no second one created"
    );
    let second_relays = relay_pids(&container);
    if agent {
        assert_eq!(
            second_relays.len(),
            1,
            "the new process re-opened one channel: {second_relays:?}"
        );
        assert_ne!(
            second_relays, first_relays,
            "a new relay exec, not the old one"
        );
    } else {
        assert!(second_relays.is_empty(), "{second_relays:?}");
    }

    let (status, _) = second
        .call("DELETE", "/v1/sessions/survivor", &token, "")
        .await;
    assert_eq!(status, 204);
    assert!(
        container_ids(&namespace).await.is_empty(),
        "destroy removed it"
    );

    // SIGTERM drains and exits cleanly.
    signal(&second.child, "TERM");
    let status = second.wait();
    assert!(
        status.success(),
        "SIGTERM ends sandbox serve with 0: {status}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a background process printed before the crash: 5 lines of 7 bytes.
const SURVIVOR_OUTPUT: &str = "line-1\nline-2\nline-3\nline-4\nline-5\n";

/// A background process started through the API runs on while `sandbox serve` is SIGKILLed and
/// restarted (the agent, PID 1 of the sandbox, owns it; the service holds nothing of it). The
/// new process lists it, an attach from offset 0 replays everything it printed before the
/// crash and one from offset 14 exactly the rest, and a KILL through the API ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_background_process_survives_a_restart_of_the_service() {
    let env = agent_mode::env();
    let env = agent_mode::borrowed(&env);
    let namespace = format!("tprocrst-{:08x}", fastrand::u32(..));
    let dir = temp_dir();
    let token_file = dir.join("dev-token");
    let log = dir.join("serve.log");
    let processes = "/v1/sessions/bg/processes";

    let mut first = start(&namespace, &token_file, &log, &env).await;
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim().to_owned();
    let body = serde_json::json!({
        "command": format!("printf '{}'; exec sleep 3600", SURVIVOR_OUTPUT.replace('\n', "\\n")),
        "shell": true,
        "tag": "survivor",
    });
    let (status, started) = first
        .call("POST", processes, &token, &body.to_string())
        .await;
    assert_eq!(status, 201, "{started}");
    let pid = started["pid"].as_u64().unwrap();
    let listed = wait_for_output(&first, &token, SURVIVOR_OUTPUT.len() as u64).await;
    assert_eq!(listed["state"], "running", "{listed}");

    let first_pid = first.child.id();
    signal(&first.child, "KILL");
    let status = first.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status}"
    );

    let mut second = start(&namespace, &token_file, &log, &env).await;
    assert_ne!(second.child.id(), first_pid, "a new service process");
    let (status, list) = second.call("GET", processes, &token, "").await;
    assert_eq!(status, 200, "{list}");
    let survivor = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("the process is listed after the restart: {list}"))
        .clone();
    assert_eq!(survivor["tag"], "survivor", "{survivor}");
    assert_eq!(survivor["state"], "running", "{survivor}");
    assert_eq!(
        survivor["output_bytes"].as_u64(),
        Some(SURVIVOR_OUTPUT.len() as u64),
        "{survivor}"
    );

    let replay = attach(&second.base, &token, pid, 0, SURVIVOR_OUTPUT.len()).await;
    assert_eq!(replay, (0, SURVIVOR_OUTPUT.to_owned()), "the replay from 0");
    let replay = attach(&second.base, &token, pid, 14, SURVIVOR_OUTPUT.len() - 14).await;
    assert_eq!(
        replay,
        (14, SURVIVOR_OUTPUT[14..].to_owned()),
        "the replay from offset 14"
    );

    let (status, out) = second
        .call(
            "POST",
            &format!("{processes}/survivor/signal"),
            &token,
            r#"{"signal":"KILL"}"#,
        )
        .await;
    assert_eq!(status, 204, "{out}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, list) = second.call("GET", processes, &token, "").await;
        let ended = list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"].as_u64() == Some(pid))
            .cloned();
        if let Some(p) = &ended
            && p["state"] == "exited"
        {
            assert_eq!(p["signal"], "KILL", "{p}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the killed process still runs: {list}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = second.call("DELETE", "/v1/sessions/bg", &token, "").await;
    assert_eq!(status, 204);
    signal(&second.child, "TERM");
    assert!(second.wait().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Polls the listing until the `survivor` process has printed `bytes`; its entry.
async fn wait_for_output(service: &Service, token: &str, bytes: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, list) = service
            .call("GET", "/v1/sessions/bg/processes", token, "")
            .await;
        assert_eq!(status, 200, "{list}");
        if let Some(p) = list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["tag"] == "survivor" && p["output_bytes"].as_u64() == Some(bytes))
        {
            return p.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the process never printed {bytes} bytes: {list}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Attaches to `pid` from `from` and reads NDJSON lines until `want` bytes of output arrived
/// (the process runs on, so the stream would not end); the first data offset and the text.
async fn attach(base: &str, token: &str, pid: u64, from: u64, want: usize) -> (u64, String) {
    use http_body_util::BodyExt as _;
    #[expect(
        clippy::disallowed_methods,
        reason = "a test dialling its own loopback service, not a tenant-supplied endpoint"
    )]
    let client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Empty<hyper::body::Bytes>,
    > = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let request = hyper::Request::get(format!(
        "{base}/v1/sessions/bg/processes/{pid}/attach?from={from}"
    ))
    .header("authorization", format!("Bearer {token}"))
    .body(http_body_util::Empty::new())
    .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut pending = Vec::new();
    let mut text = String::new();
    let mut first = None;
    let read = async {
        while text.len() < want {
            let frame = body.frame().await.expect("the attach ended early").unwrap();
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let event: serde_json::Value = serde_json::from_slice(&line).unwrap();
                assert_eq!(
                    event["type"], "data",
                    "only output before the kill: {event}"
                );
                first.get_or_insert(event["offset"].as_u64().unwrap());
                text.push_str(event["data"].as_str().unwrap());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the replay arrived within 30 s");
    (first.unwrap(), text)
}
