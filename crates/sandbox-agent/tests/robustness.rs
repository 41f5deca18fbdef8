//! The agent's HTTP service in-process against arbitrary requests: any method, path and
//! headers, Connect envelopes that are truncated, oversized or carry wrong flags, and bodies
//! cut mid-stream, on envd's paths and the agent's own (`/metrics`, `/sandbox-agent/`). No
//! panic; every answer is a well-formed Connect (or envd HTTP) success or error; and after all
//! the cases the runtime's tasks and the process's descriptors are back to where they were.
//!
//! A test binary of its own: descriptors are counted for the whole process, so no other test
//! may run beside it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Request, Response, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use sandbox_agent::config::Config;
use sandbox_agent::connect::{Body, BoxError};
use sandbox_agent::pid1::Children;
use sandbox_agent::server::{Agent, Services};
use sandbox_envd::{DecoderConfig, EnvelopeDecoder, all_methods};

use sandbox_agent::users::AccountFiles;

const CASES: u32 = 10_000;
const MAX_MESSAGE: usize = 1024;

#[derive(Debug, Clone)]
enum BodyKind {
    Empty,
    Bytes(Vec<u8>),
    /// One envelope with these flags, this declared length and this payload (the declared
    /// length may lie).
    Envelope {
        flags: u8,
        declared: u32,
        payload: Vec<u8>,
    },
    /// Some bytes, then the body fails (the client's connection broke).
    Cut(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Case {
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: BodyKind,
}

fn paths() -> impl Strategy<Value = String> {
    let known: Vec<String> = all_methods()
        .map(|m| m.path.to_owned())
        .chain(["/health", "/files", "/", "/process.Process/"].map(str::to_owned))
        .chain(
            [
                "/metrics",
                "/sandbox-agent/",
                "/sandbox-agent/version",
                "/sandbox-agent/tunnel/",
                "/sandbox-agent/tunnel/0",
                "/sandbox-agent/tunnel/49983",
                "/sandbox-agent/tunnel/99999",
                // Port 1 is privileged and unused: the cases reach the dial and its refusal
                // (502), never a live stream.
                "/sandbox-agent/tunnel/1",
            ]
            .map(str::to_owned),
        )
        .collect();
    prop_oneof![
        3 => proptest::sample::select(known),
        1 => "/[a-zA-Z./_-]{0,30}",
    ]
}

fn header_value() -> impl Strategy<Value = String> {
    "[ -~]{0,24}"
}

fn headers() -> impl Strategy<Value = Vec<(&'static str, String)>> {
    let content_type = prop_oneof![
        Just("application/json".to_owned()),
        Just("application/connect+json".to_owned()),
        Just("application/json; charset=utf-8".to_owned()),
        Just("application/proto".to_owned()),
        header_value(),
    ];
    let token = prop_oneof![Just("t".to_owned()), header_value()];
    let auth = prop_oneof![
        Just("Basic dXNlcjo=".to_owned()),
        Just("Basic Z2hvc3Q6".to_owned()),
        header_value(),
    ];
    (
        proptest::option::of(content_type),
        proptest::option::weighted(0.9, token),
        proptest::option::of(auth),
        proptest::option::of(prop_oneof![Just("100".to_owned()), header_value()]),
        proptest::option::of(prop_oneof![
            Just("gzip".to_owned()),
            Just("identity".to_owned())
        ]),
        proptest::option::of(header_value()),
        proptest::option::of(header_value()),
        proptest::option::of(prop_oneof![
            Just("sandbox-tunnel".to_owned()),
            header_value()
        ]),
    )
        .prop_map(
            |(ct, token, auth, timeout, encoding, keepalive, replay, upgrade)| {
                let mut h = Vec::new();
                let mut push = |name: &'static str, v: Option<String>| {
                    if let Some(v) = v {
                        h.push((name, v));
                    }
                };
                push("content-type", ct);
                push("x-access-token", token);
                push("authorization", auth);
                push("connect-timeout-ms", timeout);
                push("connect-content-encoding", encoding.clone());
                push("content-encoding", encoding);
                push("keepalive-ping-interval", keepalive);
                push("sandbox-replay-offset", replay);
                // The tunnel's HTTP/1.1 upgrade asks with both headers.
                push("connection", upgrade.as_ref().map(|_| "Upgrade".to_owned()));
                push("upgrade", upgrade);
                h
            },
        )
}

fn bodies() -> impl Strategy<Value = BodyKind> {
    let json = prop_oneof![
        Just(b"{}".to_vec()),
        Just(br#"{"process":{"pid":1}}"#.to_vec()),
        Just(br#"{"start":{"process":{"tag":"x"}}}"#.to_vec()),
        proptest::collection::vec(any::<u8>(), 0..64),
    ];
    prop_oneof![
        Just(BodyKind::Empty),
        proptest::collection::vec(any::<u8>(), 0..256).prop_map(BodyKind::Bytes),
        json.clone().prop_map(BodyKind::Bytes),
        (any::<u8>(), json.clone(), 0u32..8).prop_map(|(flags, payload, lie)| {
            let flags = flags & 0x83;
            let declared = payload.len() as u32 + lie.saturating_sub(4);
            BodyKind::Envelope {
                flags,
                declared,
                payload,
            }
        }),
        (Just(0u8), Just(b"{}".to_vec())).prop_map(|(flags, payload)| BodyKind::Envelope {
            flags,
            declared: (MAX_MESSAGE * 4) as u32,
            payload,
        }),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(BodyKind::Cut),
    ]
}

fn cases() -> impl Strategy<Value = Case> {
    let method =
        proptest::sample::select(vec!["GET", "POST", "POST", "POST", "PUT", "DELETE", "HEAD"]);
    (method, paths(), headers(), bodies()).prop_map(|(method, path, headers, body)| Case {
        method,
        path,
        headers,
        body,
    })
}

async fn body_of(kind: &BodyKind) -> Body {
    match kind {
        BodyKind::Empty => sandbox_agent::connect::empty(),
        BodyKind::Bytes(b) => sandbox_agent::connect::full(b.clone()),
        BodyKind::Envelope {
            flags,
            declared,
            payload,
        } => {
            let mut bytes = vec![*flags];
            bytes.extend_from_slice(&declared.to_be_bytes());
            bytes.extend_from_slice(payload);
            sandbox_agent::connect::full(bytes)
        }
        BodyKind::Cut(prefix) => {
            let (mut sender, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(2);
            let prefix = Bytes::from(prefix.clone());
            // The body yields the prefix, then an error, as a broken connection does.
            let _ = sender.send_data(prefix).await;
            sender.abort("the connection broke".into());
            body.boxed_unsync()
        }
    }
}

async fn check(response: Response<Body>) -> Result<(), String> {
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = tokio::time::timeout(Duration::from_secs(5), response.into_body().collect())
        .await
        .map_err(|_| "the answer never ended".to_owned())?
        .map_err(|e| format!("the answer's body failed: {e}"))?
        .to_bytes();
    if status == StatusCode::NO_CONTENT {
        return if body.is_empty() {
            Ok(())
        } else {
            Err("a 204 with a body".into())
        };
    }
    if content_type == "application/connect+json" {
        if status != StatusCode::OK {
            return Err(format!("a stream answered {status}"));
        }
        let mut decoder = EnvelopeDecoder::new(DecoderConfig::response());
        decoder.push(&body);
        loop {
            match decoder.decode() {
                Ok(Some(e)) if e.end_stream => {
                    e.parse_end_stream().map_err(|e| e.to_string())?;
                    decoder.finish().map_err(|e| e.to_string())?;
                    return Ok(());
                }
                Ok(Some(e)) => {
                    serde_json::from_slice::<serde_json::Value>(&e.payload)
                        .map_err(|e| e.to_string())?;
                }
                Ok(None) => return Err("a stream without its end-of-stream envelope".into()),
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    if content_type.starts_with("application/json") {
        let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        if status != StatusCode::OK {
            let code = &value["code"];
            let connect = code
                .as_str()
                .is_some_and(|c| sandbox_envd::Code::from_wire(c).is_some());
            let envd = code.as_u64() == Some(u64::from(status.as_u16()));
            if !(connect || envd) || !value["message"].is_string() {
                return Err(format!("{status} with a body that is no error: {value}"));
            }
        }
        return Ok(());
    }
    Err(format!("{status} with content type {content_type:?}"))
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn arbitrary_requests_get_valid_answers_and_leak_nothing() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The test's own uid as `user`, so Basic `user:` resolves (nothing is started here).
    let dir = tempfile::tempdir().unwrap();
    let accounts = AccountFiles {
        passwd: dir.path().join("passwd"),
        group: dir.path().join("group"),
    };
    let uid = rustix::process::getuid().as_raw();
    std::fs::write(&accounts.passwd, format!("user:x:{uid}:{uid}::/:/bin/sh\n")).unwrap();
    std::fs::write(&accounts.group, "user:x:0:\n").unwrap();
    let agent = runtime.block_on(async {
        let config = Config {
            default_user: "user".into(),
            access_token: Some("t".into()),
            accounts,
            max_message_bytes: MAX_MESSAGE,
            reap_orphans: false,
            ..Config::default()
        };
        Agent::new(config, Services::default(), Children::new(false))
    });
    let tasks = || runtime.metrics().num_alive_tasks();
    let (tasks_before, fds_before) = (tasks(), open_fds());

    let mut runner = TestRunner::new(ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&cases(), |case| {
            let mut builder = Request::builder()
                .method(case.method)
                .uri(case.path.as_str());
            for (name, value) in &case.headers {
                builder = builder.header(*name, value.as_str());
            }
            let agent = Arc::clone(&agent);
            runtime.block_on(async move {
                let request = builder
                    .body(body_of(&case.body).await)
                    .map_err(|e| TestCaseError::reject(e.to_string()))?;
                check(agent.handle(request).await)
                    .await
                    .map_err(TestCaseError::fail)
            })
        })
        .unwrap();

    // Whatever the cases started has finished: the same tasks and descriptors as before.
    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
    assert_eq!(tasks(), tasks_before, "tasks left running");
    assert_eq!(open_fds(), fds_before, "descriptors left open");
    assert_eq!(agent.process().live(), 0);
}
