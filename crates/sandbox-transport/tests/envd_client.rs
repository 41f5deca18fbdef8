//! The envd client against a Connect server written in this test suite (`envd_server`), over
//! loopback, on HTTP/1.1 and on h2c: every call shape, both services, `/files`, deadlines,
//! keepalives, cancellation, and broken streams. Each test runs once per protocol.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod envd_server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use envd_server::{Server, TOKEN};
use hyper::Version;
use sandbox_core::{ErrorCode, ErrorKind, Origin, Provider, Secret};
use sandbox_envd::filesystem as fs;
use sandbox_envd::process::{self as ps, ProcessSelector, process_event::Event};
use sandbox_transport::envd::{
    CallOptions, EnvdClient, EnvdConfig, HttpVersion, ServerStream, UploadFile,
};
use sandbox_transport::gateway::GatewayTarget;
use sandbox_transport::{
    Dial, GatewayPool, GuardedConnector, OutboundPolicy, RelayConnector, TcpDialer,
};
use tokio::net::TcpStream;

const BOTH: [HttpVersion; 2] = [HttpVersion::Http1, HttpVersion::Http2];

fn version_of(http: HttpVersion) -> Version {
    match http {
        HttpVersion::Http1 => Version::HTTP_11,
        HttpVersion::Http2 => Version::HTTP_2,
    }
}

fn config(server: &Server, http: HttpVersion) -> EnvdConfig {
    EnvdConfig::new(&server.url())
        .unwrap()
        .with_access_token(Secret::new(TOKEN))
        .with_user("user")
        .unwrap()
        .with_http(http)
        .with_keepalive(Duration::from_secs(1), Duration::from_secs(3))
}

fn client_with(config: EnvdConfig) -> EnvdClient<GuardedConnector> {
    // Loopback is private: the test server is reached only because the policy allows it.
    let guard = GuardedConnector::new(OutboundPolicy::allow_private());
    EnvdClient::new(guard, config).unwrap()
}

fn client(server: &Server, http: HttpVersion) -> EnvdClient<GuardedConnector> {
    client_with(config(server, http))
}

fn start_request(cmd: &str, args: &[&str]) -> ps::StartRequest {
    ps::StartRequest {
        process: Some(ps::ProcessConfig {
            cmd: cmd.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The event of the next message, failing the test on an error or the end.
async fn next_event(stream: &mut ServerStream<ps::StartResponse>) -> Event {
    stream
        .message()
        .await
        .unwrap()
        .expect("a message")
        .event
        .unwrap()
        .event
        .unwrap()
}

fn stdout_of(event: &Event) -> Option<String> {
    use ps::process_event::data_event::Output;
    match event {
        Event::Data(d) => match d.output.as_ref()? {
            Output::Stdout(b) | Output::Pty(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Output::Stderr(_) => None,
        },
        _ => None,
    }
}

/// Reads events up to and including `end`, skipping keepalives; returns the output and the end.
async fn drain(
    stream: &mut ServerStream<ps::StartResponse>,
) -> (String, ps::process_event::EndEvent, usize) {
    let mut out = String::new();
    let mut keepalives = 0;
    loop {
        let event = next_event(stream).await;
        match event {
            Event::End(end) => {
                assert!(stream.message().await.unwrap().is_none(), "end of stream");
                return (out, end, keepalives);
            }
            Event::Keepalive(_) => keepalives += 1,
            other => out.push_str(&stdout_of(&other).unwrap_or_default()),
        }
    }
}

/// Asserts that the next event is output `text`.
async fn expect_output(stream: &mut ServerStream<ps::StartResponse>, text: &str) {
    let event = next_event(stream).await;
    assert_eq!(stdout_of(&event).as_deref(), Some(text), "{event:?}");
}

async fn pid_of(stream: &mut ServerStream<ps::StartResponse>) -> u32 {
    match next_event(stream).await {
        Event::Start(s) => s.pid,
        other => panic!("expected start, got {other:?}"),
    }
}

#[tokio::test]
async fn start_streams_a_process_with_the_protocol_headers() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let mut stream = client
            .start(
                &start_request("echo", &["hello", "world"]),
                CallOptions::new(),
            )
            .await
            .unwrap();
        let pid = pid_of(&mut stream).await;
        assert!(pid >= 100);
        let (out, end, _) = drain(&mut stream).await;
        assert_eq!(out, "hello world\n");
        assert_eq!((end.exit_code, end.exited), (0, true));
        assert_eq!(end.status, "exit status 0");
        assert_eq!(stream.trailers(), Some(&Default::default()));

        let seen = server.state.seen("/process.Process/Start").pop().unwrap();
        assert_eq!(seen.version, version_of(http));
        let h = |name: &str| {
            seen.headers
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            h("content-type").as_deref(),
            Some("application/connect+json")
        );
        assert_eq!(h("connect-protocol-version").as_deref(), Some("1"));
        assert_eq!(h("connect-content-encoding").as_deref(), Some("identity"));
        assert_eq!(h("connect-accept-encoding").as_deref(), Some("identity"));
        assert_eq!(h("keepalive-ping-interval").as_deref(), Some("1"));
        assert_eq!(h("x-access-token").as_deref(), Some(TOKEN));
        // base64("user:")
        assert_eq!(h("authorization").as_deref(), Some("Basic dXNlcjo="));
        assert!(h("user-agent").unwrap().starts_with("sandbox-transport/"));
        // A stream without a deadline sends none: envd would kill the process at it.
        assert_eq!(h("connect-timeout-ms"), None);
    }
}

/// A client acting as another user sends that user, and only its calls do: the original
/// keeps its own, and both share one connection pool.
#[tokio::test]
async fn as_user_changes_only_the_user_of_its_calls() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let other = client.as_user("root").unwrap();
        for (c, want) in [(&other, "Basic cm9vdDo="), (&client, "Basic dXNlcjo=")] {
            let mut stream = c
                .start(&start_request("echo", &["x"]), CallOptions::new())
                .await
                .unwrap();
            let _ = drain(&mut stream).await;
            let seen = server.state.seen("/process.Process/Start").pop().unwrap();
            let auth = seen.headers.get("authorization").unwrap().to_str().unwrap();
            assert_eq!(auth, want, "{http:?}");
            assert_eq!(
                seen.headers
                    .get("x-access-token")
                    .unwrap()
                    .to_str()
                    .unwrap(),
                TOKEN
            );
        }
        assert_eq!(other.config().base(), client.config().base());
        let refused = client.as_user("a:b").unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::InvalidRequest);
    }
}

#[tokio::test]
async fn interactive_process_input_list_connect_and_close() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let tag = format!("cat-{http:?}");
        let mut request = start_request("cat", &[]);
        request.tag = Some(tag.clone());
        request.stdin = Some(true);
        let mut stream = client.start(&request, CallOptions::new()).await.unwrap();
        let pid = pid_of(&mut stream).await;

        let listed = client.list(CallOptions::new()).await.unwrap();
        let me = listed.iter().find(|p| p.pid == pid).expect("listed");
        assert_eq!(me.tag.as_deref(), Some(tag.as_str()));
        assert_eq!(me.config.as_ref().unwrap().cmd, "cat");

        // Client streaming input, then a unary send by tag.
        let mut input = client
            .stream_input(ProcessSelector::pid(pid), CallOptions::new())
            .await
            .unwrap();
        input
            .send(ps::ProcessInput::stdin(b"abc".to_vec()))
            .await
            .unwrap();
        expect_output(&mut stream, "abc").await;
        input.keepalive().await.unwrap();
        input
            .send(ps::ProcessInput::stdin(b"def".to_vec()))
            .await
            .unwrap();
        expect_output(&mut stream, "def").await;
        input.finish().await.unwrap();
        client
            .send_input(
                ProcessSelector::tag(tag.clone()),
                ps::ProcessInput::stdin(b"ghi".to_vec()),
                CallOptions::new(),
            )
            .await
            .unwrap();
        expect_output(&mut stream, "ghi").await;

        // A second attachment sees the live events from now on.
        let mut attached = client
            .connect(ProcessSelector::pid(pid), CallOptions::new())
            .await
            .unwrap();
        match attached
            .message()
            .await
            .unwrap()
            .unwrap()
            .event
            .unwrap()
            .event
        {
            Some(Event::Start(s)) => assert_eq!(s.pid, pid),
            other => panic!("expected start, got {other:?}"),
        }

        client
            .close_stdin(ProcessSelector::pid(pid), CallOptions::new())
            .await
            .unwrap();
        let (rest, end, _) = drain(&mut stream).await;
        assert_eq!(rest, "");
        assert_eq!((end.exit_code, end.exited), (0, true));
        loop {
            let m = attached
                .message()
                .await
                .unwrap()
                .expect("the end reaches Connect too");
            if let Some(Event::End(e)) = m.event.unwrap().event {
                assert_eq!(e.exit_code, 0);
                break;
            }
        }
        assert!(attached.message().await.unwrap().is_none());
        let listed = client.list(CallOptions::new()).await.unwrap();
        assert!(
            listed.iter().all(|p| p.pid != pid),
            "an ended process is not listed"
        );
    }
}

#[tokio::test]
async fn signals_pty_resize_and_unknown_processes() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let mut request = start_request("cat", &[]);
        request.pty = Some(ps::Pty {
            size: Some(ps::pty::Size { cols: 80, rows: 24 }),
        });
        let mut stream = client.start(&request, CallOptions::new()).await.unwrap();
        let pid = pid_of(&mut stream).await;
        let me = ProcessSelector::pid(pid);
        client
            .resize_pty(me.clone(), 100, 40, CallOptions::new())
            .await
            .unwrap();
        expect_output(&mut stream, "resized 100x40").await;
        client
            .send_input(
                me.clone(),
                ps::ProcessInput::pty(b"ls\r".to_vec()),
                CallOptions::new(),
            )
            .await
            .unwrap();
        expect_output(&mut stream, "ls\r").await;

        let refused = client
            .send_signal(me.clone(), ps::Signal::Unspecified, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Unsupported, "{refused}");
        assert_eq!(refused.http_status(), Some(501));
        client
            .send_signal(me.clone(), ps::Signal::Sigkill, CallOptions::new())
            .await
            .unwrap();
        let (_, end, _) = drain(&mut stream).await;
        assert_eq!((end.exit_code, end.exited), (-1, false));
        assert_eq!(end.status, "signal: killed");

        // Unknown processes are not_found on every call shape.
        let ghost = ProcessSelector::pid(999_999);
        let e = client
            .send_input(
                ghost.clone(),
                ps::ProcessInput::stdin(b"x".to_vec()),
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(
            (e.kind(), e.http_status()),
            (ErrorKind::NotFound, Some(404)),
            "{e}"
        );
        let e = client
            .close_stdin(ghost.clone(), CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let mut attached = client
            .connect(ghost.clone(), CallOptions::new())
            .await
            .unwrap();
        let e = attached.message().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        let input = client
            .stream_input(ghost.clone(), CallOptions::new())
            .await
            .unwrap();
        let e = input.finish().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }
}

#[tokio::test]
async fn keepalives_keep_a_quiet_stream_alive_and_silence_ends_it() {
    let server = Server::start().await;
    let runs = BOTH.map(|http| {
        let client = client(&server, http);
        async move {
            // Quiet for 4 s, with an idle limit of 3 s: only envd's pings (every 1 s) keep
            // the stream alive.
            let mut stream = client
                .start(&start_request("sleep", &["4000"]), CallOptions::new())
                .await
                .unwrap();
            pid_of(&mut stream).await;
            let (out, end, keepalives) = drain(&mut stream).await;
            assert_eq!(out, "done\n");
            assert_eq!(end.exit_code, 0);
            assert!(keepalives >= 2, "{keepalives} keepalives in 4 s at 1 s");

            // A server that ignores the interval and stays silent is declared dead.
            let began = Instant::now();
            let mut stream = client
                .start(&start_request("mute", &[]), CallOptions::new())
                .await
                .unwrap();
            pid_of(&mut stream).await;
            let e = stream.message().await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
            assert!(e.message().contains("keepalive"), "{e}");
            assert!(
                began.elapsed() < Duration::from_secs(25),
                "ended by the idle limit"
            );
            // Sticky.
            assert_eq!(stream.message().await.unwrap_err().message(), e.message());
        }
    });
    let [a, b] = runs;
    tokio::join!(a, b);
}

#[tokio::test]
async fn deadlines_are_sent_and_enforced() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let began = Instant::now();
        let mut stream = client
            .start(
                &start_request("mute", &[]),
                CallOptions::new().timeout(Duration::from_millis(700)),
            )
            .await
            .unwrap();
        pid_of(&mut stream).await;
        let e = stream.message().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(began.elapsed() < Duration::from_secs(20));
        let seen = server.state.seen("/process.Process/Start").pop().unwrap();
        let ms: u64 = seen.headers["connect-timeout-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=700).contains(&ms), "{ms}");

        // Unary: the deadline covers the answer; the default deadline is sent too.
        let e = client
            .stat(
                "/slow",
                CallOptions::new().timeout(Duration::from_millis(300)),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        client
            .make_dir("/deadline", CallOptions::new())
            .await
            .unwrap();
        let seen = server
            .state
            .seen("/filesystem.Filesystem/MakeDir")
            .pop()
            .unwrap();
        let ms: u64 = seen.headers["connect-timeout-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60_000).contains(&ms), "{ms}");
        assert_eq!(seen.headers["content-type"], "application/json");
        assert_eq!(seen.headers.get("keepalive-ping-interval"), None);
        client
            .remove("/deadline", CallOptions::new())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn dropping_a_stream_cancels_it_and_the_client_goes_on() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let before = server.state.cancelled.load(Ordering::SeqCst);
        let mut stream = client
            .start(&start_request("forever", &[]), CallOptions::new())
            .await
            .unwrap();
        pid_of(&mut stream).await;
        for _ in 0..3 {
            assert!(matches!(next_event(&mut stream).await, Event::Keepalive(_)));
        }
        drop(stream);
        let deadline = Instant::now() + Duration::from_secs(15);
        while server.state.cancelled.load(Ordering::SeqCst) == before {
            assert!(
                Instant::now() < deadline,
                "the server never saw the stream close ({http:?})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The pool is still good.
        client.list(CallOptions::new()).await.unwrap();
    }
}

#[tokio::test]
async fn broken_streams_give_clear_errors() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let cases: [(&str, ErrorKind, &str); 6] = [
            ("truncate", ErrorKind::Unavailable, "cut"),
            ("garbage", ErrorKind::Internal, "malformed message"),
            ("badflags", ErrorKind::Internal, "reserved bits"),
            ("oversize", ErrorKind::Internal, "exceeds the limit"),
            (
                "noeos",
                ErrorKind::Unavailable,
                "without envd's end-of-stream",
            ),
            ("fail", ErrorKind::Capacity, "too many processes"),
        ];
        for (cmd, kind, text) in cases {
            let mut stream = client
                .start(&start_request(cmd, &[]), CallOptions::new())
                .await
                .unwrap();
            pid_of(&mut stream).await;
            let e = loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("{cmd}: ended cleanly"),
                    Err(e) => break e,
                }
            };
            assert_eq!(e.kind(), kind, "{cmd} ({http:?}): {e}");
            assert!(e.message().contains(text), "{cmd} ({http:?}): {e}");
            let again = stream.message().await.unwrap_err();
            assert_eq!(again.message(), e.message(), "errors are sticky");
        }
        // Bytes after the end-of-stream message break the protocol.
        let mut stream = client
            .start(&start_request("trailing", &[]), CallOptions::new())
            .await
            .unwrap();
        pid_of(&mut stream).await;
        assert!(matches!(next_event(&mut stream).await, Event::End(_)));
        let e = stream.message().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Internal, "{e}");
        assert!(e.message().contains("after the end-of-stream"), "{e}");

        // A body that stays open after a complete answer costs the connection, not the answer.
        let began = Instant::now();
        let mut stream = client
            .start(&start_request("linger", &[]), CallOptions::new())
            .await
            .unwrap();
        pid_of(&mut stream).await;
        assert!(matches!(next_event(&mut stream).await, Event::End(_)));
        assert!(stream.message().await.unwrap().is_none());
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "{:?}",
            began.elapsed()
        );

        // The client is still usable after all of that.
        client.list(CallOptions::new()).await.unwrap();
    }
}

#[tokio::test]
async fn errors_map_to_core_kinds() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let e = client.stat("/nope", CallOptions::new()).await.unwrap_err();
        assert_eq!(
            (e.kind(), e.http_status()),
            (ErrorKind::NotFound, Some(404)),
            "{e}"
        );
        assert!(e.message().contains("file not found"), "{e}");
        let twice = format!("/twice-{http:?}");
        client.make_dir(&twice, CallOptions::new()).await.unwrap();
        let e = client
            .make_dir(&twice, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");

        // envd's HTTP middleware answers a bad token with its own JSON 401.
        let intruder = client_with(config(&server, http).with_access_token(Secret::new("wrong")));
        let e = intruder.stat("/", CallOptions::new()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
        assert!(e.message().contains("unauthorized access"), "{e}");
        let e = intruder
            .start(&start_request("echo", &[]), CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
        let e = intruder
            .read_file("/x", 10, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");

        // An unknown user: unary error status, and in a stream's end-of-stream message.
        let stranger = client_with(config(&server, http).with_user("nobody").unwrap());
        let e = stranger.list(CallOptions::new()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
        assert!(e.message().contains("invalid username: 'nobody'"), "{e}");
        let mut stream = stranger
            .start(&start_request("echo", &[]), CallOptions::new())
            .await
            .unwrap();
        let e = stream.message().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
        let seen = server.state.seen("/files");
        let e = stranger
            .read_file("/x", 10, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
        let after = server.state.seen("/files");
        assert_eq!(after.len(), seen.len() + 1);
        assert!(after.last().unwrap().query.contains("username=nobody"));
    }
}

/// An envd client configured with a provider is that provider's data plane: its answers, a
/// refused endpoint and a failed dial are all the provider's errors. Without a provider they
/// are the transport's.
#[tokio::test]
async fn errors_say_whose_they_are() {
    let server = Server::start().await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    for (provider, want) in [
        (None, Origin::Transport),
        (Some(Provider::E2b), Origin::Provider(Provider::E2b)),
    ] {
        let claimed = |c: EnvdConfig| match provider {
            Some(p) => c.with_provider(p),
            None => c,
        };
        let client = client_with(claimed(config(&server, HttpVersion::Http1)));
        // envd's own answer, unary and at a stream's end.
        let e = client.stat("/nope", CallOptions::new()).await.unwrap_err();
        assert_eq!((e.kind(), e.origin()), (ErrorKind::NotFound, want), "{e}");
        let stranger = client_with(claimed(
            config(&server, HttpVersion::Http1)
                .with_user("nobody")
                .unwrap(),
        ));
        let mut stream = stranger
            .start(&start_request("echo", &[]), CallOptions::new())
            .await
            .unwrap();
        let e = stream.message().await.unwrap_err();
        assert_eq!(e.origin(), want, "{e}");
        let e = stranger
            .read_file("/x", 10, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.origin(), want, "{e}");
        // The guard's refusal keeps its code, and is claimed like the rest.
        let metadata = claimed(EnvdConfig::new("http://169.254.169.254:49983").unwrap());
        let e = client_with(metadata)
            .stat("/", CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl), "{e}");
        assert_eq!(e.origin(), want, "{e}");
        // Nothing listens: a dial that fails.
        let refused = claimed(EnvdConfig::new(&format!("http://{closed}")).unwrap());
        let e = client_with(refused)
            .list(CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(
            (e.kind(), e.origin()),
            (ErrorKind::Unavailable, want),
            "{e}"
        );
    }
}

#[tokio::test]
async fn filesystem_service() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let root = format!("/fs-{http:?}");
        let dir = client
            .make_dir(&format!("{root}/a/b"), CallOptions::new())
            .await
            .unwrap();
        assert_eq!(dir.r#type, fs::FileType::Directory);
        assert_eq!(dir.name, "b");
        client
            .write_file(&format!("{root}/a/b/f.txt"), "hi", CallOptions::new())
            .await
            .unwrap();
        let f = client
            .stat(&format!("{root}/a/b/f.txt"), CallOptions::new())
            .await
            .unwrap();
        assert_eq!((f.r#type, f.size), (fs::FileType::File, 2));

        let names = |entries: Vec<fs::EntryInfo>| -> Vec<String> {
            entries.into_iter().map(|e| e.path).collect()
        };
        let shallow = client.list_dir(&root, 0, CallOptions::new()).await.unwrap();
        assert_eq!(names(shallow), [format!("{root}/a")]);
        let deep = client.list_dir(&root, 3, CallOptions::new()).await.unwrap();
        assert_eq!(
            names(deep),
            [
                format!("{root}/a"),
                format!("{root}/a/b"),
                format!("{root}/a/b/f.txt")
            ]
        );
        let e = client
            .list_dir(&format!("{root}/a/b/f.txt"), 1, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");

        let moved = client
            .rename(
                &format!("{root}/a/b/f.txt"),
                &format!("{root}/c/g.txt"),
                CallOptions::new(),
            )
            .await
            .unwrap();
        assert_eq!((moved.name.as_str(), moved.size), ("g.txt", 2));
        client
            .remove(&format!("{root}/a"), CallOptions::new())
            .await
            .unwrap();
        let e = client
            .stat(&format!("{root}/a"), CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        // Removing what is not there is not an error.
        client
            .remove(&format!("{root}/a"), CallOptions::new())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn health_and_streams_as_futures_streams() {
    use futures_util::StreamExt as _;
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        client.health(CallOptions::new()).await.unwrap();
        // Health needs no token.
        let anonymous = client_with(EnvdConfig::new(&server.url()).unwrap().with_http(http));
        anonymous.health(CallOptions::new()).await.unwrap();

        let stream = client
            .start(
                &start_request("echo", &["as", "stream"]),
                CallOptions::new(),
            )
            .await
            .unwrap();
        let events: Vec<_> = stream.into_stream().collect().await;
        assert!(events.iter().all(Result::is_ok));
        let out: String = events
            .iter()
            .filter_map(|e| stdout_of(e.as_ref().unwrap().event.as_ref()?.event.as_ref()?))
            .collect();
        assert_eq!(out, "as stream\n");
        assert!(matches!(
            events
                .last()
                .unwrap()
                .as_ref()
                .unwrap()
                .event
                .as_ref()
                .unwrap()
                .event,
            Some(Event::End(_))
        ));
        // A failing stream yields its error, then ends.
        let stream = client
            .start(&start_request("fail", &[]), CallOptions::new())
            .await
            .unwrap();
        let items: Vec<_> = stream.into_stream().collect().await;
        assert_eq!(items.len(), 2, "start, then the error");
        let e = items[1].as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    }
    let refused = client_with(
        EnvdConfig::new("http://127.0.0.1:9")
            .unwrap()
            .with_unary_timeout(None),
    );
    let e = refused.health(CallOptions::new()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

#[tokio::test]
async fn polled_watchers_drain_their_events() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let dir = format!("/polled-{http:?}");
        client.make_dir(&dir, CallOptions::new()).await.unwrap();
        let request = fs::CreateWatcherRequest {
            path: dir.clone(),
            ..Default::default()
        };
        let id = client
            .create_watcher(&request, CallOptions::new())
            .await
            .unwrap();
        assert!(!id.is_empty());
        let seen = server
            .state
            .seen("/filesystem.Filesystem/CreateWatcher")
            .pop()
            .unwrap();
        assert_eq!(seen.headers["keepalive-ping-interval"], "1");
        client
            .write_file(&format!("{dir}/a"), "1", CallOptions::new())
            .await
            .unwrap();
        client
            .write_file(&format!("{dir}/a"), "2", CallOptions::new())
            .await
            .unwrap();
        let mut events = Vec::new();
        for _ in 0..100 {
            events.extend(
                client
                    .watcher_events(&id, CallOptions::new())
                    .await
                    .unwrap(),
            );
            if events.len() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let kinds: Vec<_> = events.iter().map(|e| (e.name.as_str(), e.r#type)).collect();
        assert_eq!(
            kinds,
            [("a", fs::EventType::Create), ("a", fs::EventType::Write)]
        );
        // Drained: nothing new since.
        assert!(
            client
                .watcher_events(&id, CallOptions::new())
                .await
                .unwrap()
                .is_empty()
        );
        client
            .remove_watcher(&id, CallOptions::new())
            .await
            .unwrap();
        let e = client
            .watcher_events(&id, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }
}

#[tokio::test]
async fn watch_dir_streams_changes() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let dir = format!("/watched-{http:?}");
        client.make_dir(&dir, CallOptions::new()).await.unwrap();
        let request = fs::WatchDirRequest {
            path: dir.clone(),
            ..Default::default()
        };
        let mut watch = client
            .watch_dir(&request, CallOptions::new())
            .await
            .unwrap();
        use fs::watch_dir_response::Event as W;
        assert!(matches!(
            watch.message().await.unwrap().unwrap().event,
            Some(W::Start(_))
        ));
        let seen = server
            .state
            .seen("/filesystem.Filesystem/WatchDir")
            .pop()
            .unwrap();
        assert_eq!(seen.headers["keepalive-ping-interval"], "1");
        client
            .write_file(&format!("{dir}/x"), "1", CallOptions::new())
            .await
            .unwrap();
        client
            .remove(&format!("{dir}/x"), CallOptions::new())
            .await
            .unwrap();
        let mut events = Vec::new();
        while events.len() < 2 {
            match watch.message().await.unwrap().unwrap().event {
                Some(W::Filesystem(e)) => events.push((e.name, e.r#type)),
                Some(W::Keepalive(_)) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            events,
            [
                ("x".to_owned(), fs::EventType::Create),
                ("x".to_owned(), fs::EventType::Remove)
            ]
        );
        let e = client
            .watch_dir(
                &fs::WatchDirRequest {
                    path: "/no/such/dir".to_owned(),
                    ..Default::default()
                },
                CallOptions::new(),
            )
            .await
            .unwrap()
            .message()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }
}

#[tokio::test]
async fn files_upload_and_download() {
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        // 5 MiB of varied bytes (CRLFs and dashes included) round trip exactly.
        let mut rng = fastrand::Rng::with_seed(7);
        let mut data: Vec<u8> = (0..5 * 1024 * 1024).map(|_| rng.u8(..)).collect();
        data[1000..1008].copy_from_slice(b"\r\n--\r\n--");
        let path = format!("/up/{http:?}/big.bin");
        let written = client
            .write_file(&path, data.clone(), CallOptions::new())
            .await
            .unwrap();
        assert_eq!(
            (written.path.as_str(), written.name.as_str()),
            (path.as_str(), "big.bin")
        );
        assert_eq!(written.kind, "file");
        let mut download = client.download(&path, CallOptions::new()).await.unwrap();
        assert_eq!(download.content_length(), Some(data.len() as u64));
        let mut got = Vec::new();
        let mut chunks = 0;
        while let Some(chunk) = download.chunk().await.unwrap() {
            got.extend_from_slice(&chunk);
            chunks += 1;
        }
        assert!(got == data, "download differs from upload");
        assert!(chunks > 1, "streamed in chunks");

        // Several files in one request, each named by its part; odd names survive.
        let files = [
            UploadFile::new("/up/odd name ä.txt", "odd"),
            UploadFile::new("relative.txt", "rel"),
        ];
        let written = client.upload(&files, CallOptions::new()).await.unwrap();
        let paths: Vec<&str> = written.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(paths, ["/up/odd name ä.txt", "/home/user/relative.txt"]);
        let odd = client
            .read_file("/up/odd name ä.txt", 100, CallOptions::new())
            .await
            .unwrap();
        assert_eq!(&odd[..], b"odd");
        let seen = server.state.seen("/files").pop().unwrap();
        assert!(seen.query.contains("username=user"), "{}", seen.query);

        let e = client
            .read_file("/up/missing", 10, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(
            (e.kind(), e.http_status()),
            (ErrorKind::NotFound, Some(404)),
            "{e}"
        );
        assert!(e.message().contains("does not exist"), "{e}");
        let e = client
            .read_file("/up", 10, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        let e = client
            .read_file(&path, 1024, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        assert!(e.message().contains("over the limit"), "{e}");
        // A download cut short is an error, never a short file.
        let e = client
            .read_file("/cut", 10_000, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        let e = client.upload(&[], CallOptions::new()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest);
        let e = client
            .write_file("/bad\nname", "x", CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest);
    }
}

/// The byte at `at` of the streamed-upload test's content: varied, and cheap to check again.
fn pattern_byte(at: u64) -> u8 {
    (at.wrapping_mul(31) ^ (at >> 13)) as u8
}

#[tokio::test]
async fn a_streamed_upload_sends_64_mib_holding_a_few_chunks_never_the_file() {
    use futures_util::StreamExt as _;
    use std::sync::atomic::AtomicU64;
    const TOTAL: u64 = 64 * 1024 * 1024;
    const CHUNK: u64 = 64 * 1024;
    let server = Server::start().await;
    for http in BOTH {
        server.state.octet_received.store(0, Ordering::SeqCst);
        let client = client(&server, http);
        // How far the source ever ran ahead of what the server had written: what the client
        // side (hyper, the socket buffers) held at once.
        let max_lead = Arc::new(AtomicU64::new(0));
        let (state, lead) = (Arc::clone(&server.state), Arc::clone(&max_lead));
        let chunks = futures_util::stream::iter(0..TOTAL / CHUNK).map(move |i| {
            let produced = i * CHUNK;
            let landed = state.octet_received.load(Ordering::SeqCst);
            lead.fetch_max(produced.saturating_sub(landed), Ordering::SeqCst);
            let data: Vec<u8> = (produced..produced + CHUNK).map(pattern_byte).collect();
            Ok(bytes::Bytes::from(data))
        });
        let path = format!("/up/{http:?}/streamed.bin");
        let written = client
            .upload_stream(&path, chunks, TOTAL, CallOptions::new())
            .await
            .unwrap();
        assert_eq!(written.path, path);
        assert_eq!(server.state.octet_received.load(Ordering::SeqCst), TOTAL);
        let seen = server.state.seen("/files").pop().unwrap();
        assert_eq!(
            seen.headers.get("content-type").unwrap(),
            "application/octet-stream"
        );
        assert!(seen.query.contains("path="), "{}", seen.query);
        let lead = max_lead.load(Ordering::SeqCst);
        eprintln!("{http:?}: the source ran at most {lead} bytes ahead of the server");
        assert!(
            lead < TOTAL / 4,
            "{http:?}: the source ran {lead} bytes ahead of the server: the upload was buffered"
        );
        // Every byte arrived, in order.
        let mut download = client.download(&path, CallOptions::new()).await.unwrap();
        let mut at = 0u64;
        while let Some(chunk) = download.chunk().await.unwrap() {
            let expected: Vec<u8> = (at..at + chunk.len() as u64).map(pattern_byte).collect();
            assert!(
                chunk[..] == expected[..],
                "{http:?}: bytes from {at} differ"
            );
            at += chunk.len() as u64;
        }
        assert_eq!(at, TOTAL);
    }
}

#[tokio::test]
async fn a_streamed_upload_past_its_limit_or_with_a_failing_source_is_refused() {
    use futures_util::StreamExt as _;
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let three_kib =
            futures_util::stream::iter(0..3).map(|_| Ok(bytes::Bytes::from(vec![b'x'; 1024])));
        let e = client
            .upload_stream("/up/over.bin", three_kib, 2048, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        assert_eq!(e.code(), Some(ErrorCode::FileTooLarge), "{e}");
        assert!(e.message().contains("over the limit of 2048"), "{e}");
        let failing = futures_util::stream::iter([
            Ok(bytes::Bytes::from_static(b"first")),
            Err(std::io::Error::other("disk gone")),
        ]);
        let e = client
            .upload_stream("/up/broken.bin", failing, 1 << 20, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.message().contains("disk gone"), "{e}");
        let e = client
            .upload_stream(
                "/bad\nname",
                futures_util::stream::empty::<std::io::Result<bytes::Bytes>>(),
                1,
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest);
    }
}

#[tokio::test]
async fn connections_are_pooled() {
    let server = Server::start().await;
    let h1 = client(&server, HttpVersion::Http1);
    let before = server.state.connections.load(Ordering::SeqCst);
    for _ in 0..20 {
        h1.list(CallOptions::new()).await.unwrap();
    }
    let used = server.state.connections.load(Ordering::SeqCst) - before;
    assert_eq!(
        used, 1,
        "20 sequential HTTP/1.1 calls on one kept-alive connection"
    );

    // Streams read to their end give their connection back too.
    let before = server.state.connections.load(Ordering::SeqCst);
    for _ in 0..5 {
        let mut stream = h1
            .start(&start_request("echo", &["again"]), CallOptions::new())
            .await
            .unwrap();
        pid_of(&mut stream).await;
        drain(&mut stream).await;
    }
    let used = server.state.connections.load(Ordering::SeqCst) - before;
    assert_eq!(used, 0, "5 finished streams on the pooled connection");

    // HTTP/2: concurrent calls share one connection.
    let h2 = client(&server, HttpVersion::Http2);
    h2.list(CallOptions::new()).await.unwrap();
    let before = server.state.connections.load(Ordering::SeqCst);
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let c = h2.clone();
            tokio::spawn(async move { c.list(CallOptions::new()).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(server.state.connections.load(Ordering::SeqCst), before);
}

/// Counts dials and dials for real (loopback only in these tests).
#[derive(Debug, Default)]
struct Counting {
    dials: AtomicUsize,
}

#[async_trait]
impl Dial for Counting {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        self.dials.fetch_add(1, Ordering::SeqCst);
        TcpDialer::default().dial(addr).await
    }
}

#[tokio::test]
async fn the_client_dials_only_through_the_guard() {
    let dialer = Arc::new(Counting::default());
    let guard = GuardedConnector::with(
        OutboundPolicy::allow_private(),
        Arc::new(sandbox_transport::SystemResolver),
        dialer.clone(),
    );
    for base in [
        "http://169.254.169.254:49983",
        "http://[::ffff:169.254.169.254]:49983",
        "http://0xa9fea9fe:49983",
    ] {
        let config = EnvdConfig::new(base).unwrap();
        let client = EnvdClient::new(guard.clone(), config).unwrap();
        let e = client.stat("/", CallOptions::new()).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl), "{base}: {e}");
        let e = client
            .start(&start_request("echo", &[]), CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl), "{base}: {e}");
    }
    assert_eq!(
        dialer.dials.load(Ordering::SeqCst),
        0,
        "no socket was opened"
    );

    // The same guard reaches an allowed address.
    let server = Server::start().await;
    let config = config(&server, HttpVersion::Http1);
    let client = EnvdClient::new(guard, config).unwrap();
    client.list(CallOptions::new()).await.unwrap();
    assert_eq!(dialer.dials.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_client_runs_over_any_byte_stream() {
    // In-memory pipes stand in for a relay stream into a container: no socket at all.
    let server = Arc::new(Server::start().await);
    for http in BOTH {
        let opened = Arc::new(AtomicUsize::new(0));
        let connector = {
            let (server, opened) = (Arc::clone(&server), Arc::clone(&opened));
            RelayConnector::new(move || {
                let (client_end, server_end) = tokio::io::duplex(64 * 1024);
                server.serve_stream(server_end);
                opened.fetch_add(1, Ordering::SeqCst);
                async move { Ok(client_end) }
            })
        };
        let config = EnvdConfig::new("http://sandbox.internal:49983")
            .unwrap()
            .with_access_token(Secret::new(TOKEN))
            .with_http(http);
        let client = EnvdClient::new(connector, config).unwrap();
        let mut stream = client
            .start(&start_request("echo", &["relayed"]), CallOptions::new())
            .await
            .unwrap();
        pid_of(&mut stream).await;
        let (out, end, _) = drain(&mut stream).await;
        assert_eq!((out.as_str(), end.exit_code), ("relayed\n", 0));
        let path = format!("/relay-{http:?}.txt");
        client
            .write_file(&path, "over a pipe", CallOptions::new())
            .await
            .unwrap();
        let back = client
            .read_file(&path, 100, CallOptions::new())
            .await
            .unwrap();
        assert_eq!(&back[..], b"over a pipe");
        let seen = server.state.seen("/process.Process/Start").pop().unwrap();
        assert_eq!(seen.version, version_of(http));
        assert_eq!(seen.authority, "sandbox.internal:49983");
        assert!(opened.load(Ordering::SeqCst) >= 1);
    }
}

#[tokio::test]
async fn the_pools_envd_connector_dials_the_gateway_with_the_sandbox_host_kept() {
    let server = Server::start().await;
    let ca = rcgen::generate_simple_self_signed(vec!["unused.test".to_owned()]).unwrap();
    let tls = sandbox_transport::tls_config(false, &[ca.cert.pem().as_bytes()]).unwrap();
    let pool: GatewayPool<http_body_util::Empty<bytes::Bytes>> =
        GatewayPool::new(GuardedConnector::new(OutboundPolicy::allow_private()), tls);
    let gateway = GatewayTarget::parse(&server.url()).unwrap();

    // The sandbox host does not resolve anywhere: only the gateway is dialled.
    let config = EnvdConfig::new("http://49983-sbx1.cube.test")
        .unwrap()
        .with_access_token(Secret::new(TOKEN));
    let client = EnvdClient::new(pool.envd_connector(Some(&gateway)), config).unwrap();
    client.list(CallOptions::new()).await.unwrap();
    let seen = server.state.seen("/process.Process/List").pop().unwrap();
    assert_eq!(seen.authority, "49983-sbx1.cube.test");

    // Without a gateway the URL's own host is dialled, through the same guard.
    let config = EnvdConfig::new(&server.url())
        .unwrap()
        .with_access_token(Secret::new(TOKEN));
    let client = EnvdClient::new(pool.envd_connector(None), config).unwrap();
    client.list(CallOptions::new()).await.unwrap();
    // A refusal keeps its code through the TLS wrapper too.
    for base in ["http://169.254.169.254", "https://169.254.169.254"] {
        let metadata = EnvdConfig::new(base).unwrap();
        let client = EnvdClient::new(pool.envd_connector(None), metadata).unwrap();
        let e = client.list(CallOptions::new()).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl), "{base}: {e}");
    }
}

#[tokio::test]
async fn get_json_reads_a_bounded_typed_answer() {
    #[derive(Debug, serde::Deserialize)]
    struct Version {
        agent: String,
    }
    let op = sandbox_core::Operation::new("version");
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let v: Version = client
            .get_json(op, "/extension/version", 4096, CallOptions::new())
            .await
            .unwrap();
        assert_eq!(v.agent, "1.2.3");
        // Past the caller's limit: refused, not read whole.
        let e = client
            .get_json::<Version>(op, "/extension/big", 4096, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Internal, "{e}");
        assert!(e.message().contains("larger than 4096"), "{e}");
        let e = client
            .get_json::<Version>(op, "/extension/html", 4096, CallOptions::new())
            .await
            .unwrap_err();
        assert!(e.message().contains("content type"), "{e}");
        let e = client
            .get_json::<Version>(op, "relative", 4096, CallOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest);
    }
}

/// A source of `chunks`, then an error instead of the end when `fail` is set.
struct Chunks(std::collections::VecDeque<&'static [u8]>, bool);

#[async_trait]
impl sandbox_core::ByteStream for Chunks {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, sandbox_core::Error>> {
        match self.0.pop_front() {
            Some(chunk) => Some(Ok(chunk.to_vec())),
            None if std::mem::take(&mut self.1) => Some(Err(sandbox_core::Error::unavailable(
                sandbox_core::Operation::new("upload"),
                "the caller went away",
            ))),
            None => None,
        }
    }
}

fn chunks(parts: &[&'static [u8]], fail: bool) -> sandbox_core::ReadStream {
    Box::new(Chunks(parts.iter().copied().collect(), fail))
}

#[tokio::test]
async fn an_atomic_upload_replaces_the_target_only_when_its_source_ends_cleanly() {
    use sandbox_transport::envd::StagedUploadError;
    let server = Server::start().await;
    for http in BOTH {
        let client = client(&server, http);
        let dir = format!("/atomic/{http:?}");
        let target = sandbox_core::SandboxPath::new(&format!("{dir}/t.bin")).unwrap();
        client
            .write_file(target.as_str(), "old", CallOptions::new())
            .await
            .unwrap();
        let names = || async {
            let mut names: Vec<String> = client
                .list_dir(&dir, 1, CallOptions::new())
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.name)
                .collect();
            names.sort();
            names
        };
        let read = || client.read_file(target.as_str(), 1 << 20, CallOptions::new());

        // A source that fails: its own error, the old content, no sibling left.
        let failed = client
            .upload_atomic(
                &target,
                chunks(&[b"new ", b"half"], true),
                1 << 20,
                CallOptions::new(),
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        let StagedUploadError::Source(e) = failed else {
            panic!("{http:?}: expected the source's error, got {failed:?}");
        };
        assert!(e.message().contains("went away"), "{e}");
        assert_eq!(&read().await.unwrap()[..], b"old");
        assert_eq!(names().await, ["t.bin"], "{http:?}");

        // Past the bound: file_too_large, the old content, no sibling left.
        let over = client
            .upload_atomic(
                &target,
                chunks(&[b"0123", b"4567", b"89"], false),
                9,
                CallOptions::new(),
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        let StagedUploadError::Refused(e) = over else {
            panic!("{http:?}: expected the bound's refusal, got {over:?}");
        };
        assert_eq!(e.code(), Some(ErrorCode::FileTooLarge), "{e}");
        assert_eq!(&read().await.unwrap()[..], b"old");
        assert_eq!(names().await, ["t.bin"], "{http:?}");

        // A clean source: the new content, its length, no sibling left.
        let written = client
            .upload_atomic(
                &target,
                chunks(&[b"new ", b"content"], false),
                11,
                CallOptions::new(),
                CallOptions::new(),
            )
            .await
            .unwrap();
        assert_eq!(written, 11);
        assert_eq!(&read().await.unwrap()[..], b"new content");
        assert_eq!(names().await, ["t.bin"], "{http:?}");

        // `/` has no sibling to stage in.
        let root = client
            .upload_atomic(
                &sandbox_core::SandboxPath::root(),
                chunks(&[b"x"], false),
                1,
                CallOptions::new(),
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&root, StagedUploadError::Refused(e) if e.kind() == ErrorKind::InvalidRequest),
            "{root:?}"
        );
    }
    // The move went through the filesystem service, after each clean upload only.
    assert_eq!(server.state.seen("/filesystem.Filesystem/Move").len(), 2);
}
