//! The interactive terminal over a WebSocket, end to end over the real Docker engine: tickets
//! (single use, bound to the session, expiring), the lookup-only refusals answered before the
//! upgrade, typing and output, resize, the exit frame, the idle disconnect, no shell left
//! behind after a close; and (agent plane, the default) reattaching by pid after a dropped
//! socket with the shell's state intact, `cwd`/`env`/`user` on open, and a detached terminal
//! killed after the idle limit.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`. Containers are counted by this test's namespace label.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use sandbox_app::tickets::TerminalTickets;
use sandbox_core::ManualClock;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

const TOKEN_A: &str = "token-tenant-a";

type Ws = WebSocketStream<TcpStream>;

/// The shared server, plus the clock its tickets run on.
struct Server {
    app: support::Server,
    clock: ManualClock,
}

impl std::ops::Deref for Server {
    type Target = support::Server;
    fn deref(&self) -> &support::Server {
        &self.app
    }
}

async fn start() -> Server {
    // Tickets on a clock the test moves, to expire one.
    let clock = ManualClock::new(time::OffsetDateTime::now_utc());
    let ticket_clock = clock.clone();
    let app = support::start_with(
        "tterm",
        &[TOKEN_A],
        |_| {},
        |state| {
            state.tickets = Arc::new(TerminalTickets::with_clock(
                Duration::from_secs(60),
                Arc::new(ticket_clock),
            ));
        },
    )
    .await;
    Server { app, clock }
}

impl Server {
    async fn ticket(&self, session: &str) -> String {
        let (status, v) = self
            .call(
                "POST",
                &format!("/v1/sessions/{session}/terminal/ticket"),
                "",
            )
            .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["expires_in_ms"], 60_000, "{v}");
        v["ticket"].as_str().unwrap().to_owned()
    }

    /// Shell processes of any terminal in `session`'s sandbox (every process of a Docker
    /// terminal carries `SANDBOX_TERMINAL_ID`; the scanning exec does not).
    async fn terminal_processes(&self, session: &str) -> usize {
        let script =
            "grep -l SANDBOX_TERMINAL_ID= /proc/[0-9]*/environ 2>/dev/null | grep -vc self || true";
        let (status, r) = self
            .call(
                "POST",
                &format!("/v1/sessions/{session}/exec"),
                &serde_json::json!({ "command": script, "shell": true }).to_string(),
            )
            .await;
        assert_eq!(status, 200, "{r}");
        r["stdout"].as_str().unwrap().trim().parse().unwrap()
    }

    async fn no_shell_left(&self, session: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let n = self.terminal_processes(session).await;
            if n == 0 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} terminal process(es) still running 15 s after the close"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Dials the terminal route: the socket, or the refusal's status and JSON body.
async fn connect(addr: SocketAddr, path_and_query: &str) -> Result<Ws, (u16, Value)> {
    // A test client dialling its own loopback server, not a tenant-supplied endpoint.
    #[allow(clippy::disallowed_methods)]
    let tcp = TcpStream::connect(addr).await.unwrap();
    match tokio_tungstenite::client_async(format!("ws://{addr}{path_and_query}"), tcp).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let status = resp.status().as_u16();
            let body = resp.body().clone().unwrap_or_default();
            Err((
                status,
                serde_json::from_slice(&body)
                    .unwrap_or(Value::String(String::from_utf8_lossy(&body).into_owned())),
            ))
        }
        Err(e) => panic!("handshake failed: {e}"),
    }
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<no code>")
}

async fn refused(addr: SocketAddr, path_and_query: &str) -> (u16, String) {
    match connect(addr, path_and_query).await {
        Ok(_) => panic!("{path_and_query}: upgraded, expected a refusal"),
        Err((status, v)) => (status, code(&v).to_owned()),
    }
}

/// What the server sent until the wait ended.
#[derive(Debug, Default)]
struct Seen {
    output: String,
    texts: Vec<Value>,
    close: Option<(u16, String)>,
    ended: bool,
}

/// Reads until `done(seen)` holds; panics after 30 s.
async fn read_until(ws: &mut Ws, seen: &mut Seen, what: &str, done: impl Fn(&Seen) -> bool) {
    let read = async {
        while !done(seen) {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => seen.output.push_str(&String::from_utf8_lossy(&b)),
                Some(Ok(Message::Text(t))) => seen.texts.push(serde_json::from_str(&t).unwrap()),
                Some(Ok(Message::Close(frame))) => {
                    seen.close = frame.map(|f| (u16::from(f.code), f.reason.to_string()));
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => {
                    seen.ended = true;
                    return;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .unwrap_or_else(|_| panic!("waiting for {what}: {seen:?}"));
    assert!(done(seen), "the socket ended before {what}: {seen:?}");
}

async fn type_text(ws: &mut Ws, text: &str) {
    ws.send(Message::binary(text.as_bytes().to_vec()))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn terminal_over_websocket() {
    let s = start().await;
    let session = "term-1";
    let route = format!("/v1/sessions/{session}/terminal");
    let (status, r) = s
        .call(
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            r#"{"command":"true"}"#,
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(s.containers().await, 1);

    // Typing, output, resize.
    let ticket = s.ticket(session).await;
    let mut ws = connect(s.addr, &format!("{route}?ticket={ticket}"))
        .await
        .unwrap();
    let mut seen = Seen::default();
    // The quotes keep the typed line (echoed by the TTY) from matching.
    type_text(&mut ws, "echo tok\"\"en-9\n").await;
    read_until(&mut ws, &mut seen, "token-9", |s| {
        s.output.contains("token-9")
    })
    .await;
    ws.send(Message::text(r#"{"type":"resize","cols":123,"rows":45}"#))
        .await
        .unwrap();
    type_text(&mut ws, "stty size\n").await;
    read_until(&mut ws, &mut seen, "45 123", |s| {
        s.output.contains("45 123")
    })
    .await;
    // A malformed control message is answered, not fatal.
    ws.send(Message::text(r#"{"type":"paste"}"#)).await.unwrap();
    read_until(&mut ws, &mut seen, "an error frame", |s| {
        s.texts.iter().any(|t| t["code"] == "invalid_message")
    })
    .await;
    // A background job of the session, which the close must not strand.
    type_text(&mut ws, "sleep 4321 & echo bg\"\"-started\n").await;
    read_until(&mut ws, &mut seen, "bg-started", |s| {
        s.output.contains("bg-started")
    })
    .await;
    assert!(s.terminal_processes(session).await >= 2);

    // The ticket was used up.
    assert_eq!(
        refused(s.addr, &format!("{route}?ticket={ticket}")).await,
        (401, "invalid_ticket".to_owned())
    );

    // Closing the socket with 1000 (the client is done) hangs up the shell and its jobs.
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
    .await
    .unwrap();
    drop(ws);
    s.no_shell_left(session).await;

    // Refusals, all before the upgrade.
    assert_eq!(
        refused(s.addr, &route).await,
        (401, "invalid_ticket".to_owned()),
        "no ticket"
    );
    assert_eq!(
        refused(s.addr, &format!("{route}?ticket=")).await,
        (401, "invalid_ticket".to_owned())
    );
    assert_eq!(
        refused(s.addr, &format!("{route}?ticket={}", "ab".repeat(32))).await,
        (401, "invalid_ticket".to_owned()),
        "made-up ticket"
    );
    let expired = s.ticket(session).await;
    s.clock.advance(Duration::from_secs(61));
    assert_eq!(
        refused(s.addr, &format!("{route}?ticket={expired}")).await,
        (401, "invalid_ticket".to_owned()),
        "expired ticket"
    );
    // Tickets are issued only for a session with a running sandbox: a ticket for nothing
    // would take pool space for nothing.
    let (status, v) = s
        .call("POST", "/v1/sessions/term-unbound/terminal/ticket", "")
        .await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &json!("no_live_sandbox")),
        "{v}"
    );
    let (status, v) = s
        .call(
            "POST",
            "/v1/sessions/term-other/exec",
            r#"{"command":"true"}"#,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let other = s.ticket("term-other").await;
    assert_eq!(
        refused(s.addr, &format!("{route}?ticket={other}")).await,
        (401, "invalid_ticket".to_owned()),
        "a ticket for another session"
    );
    // That attempt did not use it up.
    assert!(
        s.state
            .tickets
            .check(&other, &sandbox_core::SessionId::new("term-other").unwrap())
            .is_some(),
        "a refused upgrade used up the ticket"
    );
    assert_eq!(s.containers().await, 2, "the terminal never provisions");
    let ticket = s.ticket(session).await;
    assert_eq!(
        refused(s.addr, &format!("{route}?ticket={ticket}&token=x")).await,
        (400, "invalid_query".to_owned()),
        "no token in a query string"
    );

    // The exit frame carries the shell's status.
    let ticket = s.ticket(session).await;
    let mut ws = connect(s.addr, &format!("{route}?ticket={ticket}&cols=100&rows=30"))
        .await
        .unwrap();
    let mut seen = Seen::default();
    type_text(&mut ws, "stty size; exit 7\n").await;
    read_until(&mut ws, &mut seen, "the exit frame", |s| {
        s.texts.iter().any(|t| t["type"] == "exit")
    })
    .await;
    assert!(seen.output.contains("30 100"), "{seen:?}");
    let exit = seen.texts.iter().find(|t| t["type"] == "exit").unwrap();
    assert_eq!(exit["code"], 7, "{seen:?}");
    read_until(&mut ws, &mut seen, "the close", |s| {
        s.close.is_some() || s.ended
    })
    .await;
    assert_eq!(seen.close.as_ref().map(|c| c.0), Some(1000), "{seen:?}");
    s.no_shell_left(session).await;

    // Idle disconnect: the same service with a 2 s limit.
    let mut idle_state = s.state.clone();
    idle_state.limits.terminal_idle_seconds = 2;
    let idle_addr = support::serve(idle_state).await;
    let ticket = s.ticket(session).await;
    let mut ws = connect(idle_addr, &format!("{route}?ticket={ticket}"))
        .await
        .unwrap();
    let mut seen = Seen::default();
    type_text(&mut ws, "echo id\"\"le-1\n").await;
    read_until(&mut ws, &mut seen, "idle-1", |s| {
        s.output.contains("idle-1")
    })
    .await;
    let started = tokio::time::Instant::now();
    read_until(&mut ws, &mut seen, "the idle close", |s| {
        s.close.is_some() || s.ended
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "closed early: {seen:?}"
    );
    assert_eq!(
        seen.close,
        Some((1000, "idle timeout".to_owned())),
        "{seen:?}"
    );
    s.no_shell_left(session).await;

    for gone in [session, "term-other"] {
        let (status, _) = s.call("DELETE", &format!("/v1/sessions/{gone}"), "").await;
        assert_eq!(status, 204);
    }
    assert_eq!(s.containers().await, 0);
}

/// The pid of the `opened` frame, the first text frame the service sends.
async fn opened_pid(ws: &mut Ws, seen: &mut Seen) -> u64 {
    read_until(ws, seen, "the opened frame", |s| !s.texts.is_empty()).await;
    let first = &seen.texts[0];
    assert_eq!(first["type"], "opened", "{seen:?}");
    first["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid: {seen:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn terminal_reattaches_by_pid_and_a_detached_one_dies_when_left_alone() {
    let s = start().await;
    if !s.state.manager.supports_terminal_reattach() {
        // The exec data plane cannot reattach: a pid is refused before the upgrade.
        let session = "term-re";
        let (status, r) = s
            .call(
                "POST",
                &format!("/v1/sessions/{session}/exec"),
                r#"{"command":"true"}"#,
            )
            .await;
        assert_eq!(status, 200, "{r}");
        let ticket = s.ticket(session).await;
        assert_eq!(
            refused(
                s.addr,
                &format!("/v1/sessions/{session}/terminal?ticket={ticket}&pid=1")
            )
            .await,
            (501, "terminal_reattach_unsupported".to_owned())
        );
        let (status, _) = s
            .call("DELETE", &format!("/v1/sessions/{session}"), "")
            .await;
        assert_eq!(status, 204);
        return;
    }
    let session = "term-re";
    let other = "term-re-other";
    let route = format!("/v1/sessions/{session}/terminal");
    for sess in [session, other] {
        let (status, r) = s
            .call(
                "POST",
                &format!("/v1/sessions/{sess}/exec"),
                r#"{"command":"true"}"#,
            )
            .await;
        assert_eq!(status, 200, "{r}");
    }

    // Open, set a variable, then drop the socket without a close frame (a browser refresh).
    let ticket = s.ticket(session).await;
    let mut ws = connect(s.addr, &format!("{route}?ticket={ticket}"))
        .await
        .unwrap();
    let mut seen = Seen::default();
    let pid = opened_pid(&mut ws, &mut seen).await;
    type_text(&mut ws, "export FOO=bar; echo rea\"\"dy-1\n").await;
    read_until(&mut ws, &mut seen, "ready-1", |s| {
        s.output.contains("ready-1")
    })
    .await;
    drop(ws);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        s.terminal_processes(session).await >= 1,
        "the detached shell must keep running"
    );

    // A new ticket and `pid=N` reattach: the recent output is replayed, the variable is there,
    // and resizes and input work.
    let ticket = s.ticket(session).await;
    let mut ws = connect(
        s.addr,
        &format!("{route}?ticket={ticket}&pid={pid}&cols=91&rows=27"),
    )
    .await
    .unwrap();
    let mut seen = Seen::default();
    assert_eq!(opened_pid(&mut ws, &mut seen).await, pid);
    read_until(&mut ws, &mut seen, "the replayed ready-1", |s| {
        s.output.contains("ready-1")
    })
    .await;
    type_text(&mut ws, "echo \"[$FOO\"']'; stty size\n").await;
    read_until(&mut ws, &mut seen, "[bar]", |s| s.output.contains("[bar]")).await;
    read_until(&mut ws, &mut seen, "27 91", |s| s.output.contains("27 91")).await;

    // Refusals of a reattach, all before the upgrade (and without using up the ticket).
    let ticket = s.ticket(session).await;
    assert_eq!(
        refused(s.addr, &format!("{route}?ticket={ticket}&pid=4999999")).await,
        (404, "terminal_not_found".to_owned()),
        "no such terminal"
    );
    let ticket = s.ticket(session).await;
    assert_eq!(
        refused(
            s.addr,
            &format!("{route}?ticket={ticket}&pid={pid}&cwd=/tmp")
        )
        .await,
        (400, "invalid_query".to_owned()),
        "a reattach takes no options"
    );
    // Another session's terminal cannot be named: its pid is looked up in this session's
    // sandbox only.
    // PIDs are per sandbox, so the other sandbox's shell may carry the very number of this
    // session's terminal, which then names this session's own terminal: open shells there until
    // one's pid is not that number (each new shell gets a new pid).
    let mut others = Vec::new();
    let other_pid = loop {
        let other_ticket = s.ticket(other).await;
        let mut other_ws = connect(
            s.addr,
            &format!("/v1/sessions/{other}/terminal?ticket={other_ticket}"),
        )
        .await
        .unwrap();
        let mut other_seen = Seen::default();
        let other_pid = opened_pid(&mut other_ws, &mut other_seen).await;
        others.push(other_ws);
        if other_pid != pid {
            break other_pid;
        }
        assert!(others.len() < 4, "every new shell got pid {pid}");
    };
    let ticket = s.ticket(session).await;
    let (status, code) = refused(s.addr, &format!("{route}?ticket={ticket}&pid={other_pid}")).await;
    assert_eq!(
        (status, code.as_str()),
        (404, "terminal_not_found"),
        "another session's pid {other_pid}"
    );
    for mut other_ws in others {
        other_ws
            .close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            }))
            .await
            .unwrap();
    }

    // Done with it: a 1000 close ends the shell.
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
    .await
    .unwrap();
    drop(ws);
    s.no_shell_left(session).await;

    // cwd, env and user on open; malformed ones are refused before the upgrade.
    let (status, r) = s
        .call(
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            r#"{"command":"mkdir -p /workspace/tdir","shell":true}"#,
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let ticket = s.ticket(session).await;
    let env = "%7B%22GREETING%22%3A%22hi%22%7D"; // {"GREETING":"hi"}
    let mut ws = connect(
        s.addr,
        &format!("{route}?ticket={ticket}&cwd=/workspace/tdir&user=root&env={env}"),
    )
    .await
    .unwrap();
    let mut seen = Seen::default();
    opened_pid(&mut ws, &mut seen).await;
    type_text(&mut ws, "echo \"<$GREETING|$(pwd)|$(id -u)\"'>'\n").await;
    read_until(&mut ws, &mut seen, "<hi|/workspace/tdir|0>", |s| {
        s.output.contains("<hi|/workspace/tdir|0>")
    })
    .await;
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
    .await
    .unwrap();
    drop(ws);
    for (query, expected) in [
        ("cwd=relative", (400, "invalid_path")),
        ("env=%5B1%5D", (400, "invalid_query")),
        ("env=%7B%22A%20B%22%3A%221%22%7D", (400, "invalid_command")),
        ("user=-x", (400, "invalid_command")),
    ] {
        let ticket = s.ticket(session).await;
        let (status, code) = refused(s.addr, &format!("{route}?ticket={ticket}&{query}")).await;
        assert_eq!((status, code.as_str()), expected, "{query}");
    }
    s.no_shell_left(session).await;

    // Left alone: the same service with a 2 s terminal idle limit (below the config's 60 s
    // floor, which only the config file and environment enforce) kills a detached terminal,
    // its background job included, and the pid no longer reattaches.
    let mut idle_state = s.state.clone();
    idle_state.limits.terminal_idle_seconds = 2;
    let idle_addr = support::serve(idle_state).await;
    let ticket = s.ticket(session).await;
    let mut ws = connect(idle_addr, &format!("{route}?ticket={ticket}"))
        .await
        .unwrap();
    let mut seen = Seen::default();
    let pid = opened_pid(&mut ws, &mut seen).await;
    type_text(&mut ws, "sleep 4321 & echo bg\"\"-up\n").await;
    read_until(&mut ws, &mut seen, "bg-up", |s| s.output.contains("bg-up")).await;
    assert!(s.terminal_processes(session).await >= 2);
    drop(ws);
    s.no_shell_left(session).await;
    let ticket = s.ticket(session).await;
    assert_eq!(
        refused(idle_addr, &format!("{route}?ticket={ticket}&pid={pid}")).await,
        (404, "terminal_not_found".to_owned()),
        "a killed terminal does not reattach"
    );

    for gone in [session, other] {
        let (status, _) = s.call("DELETE", &format!("/v1/sessions/{gone}"), "").await;
        assert_eq!(status, 204);
    }
    assert_eq!(s.containers().await, 0);
}
