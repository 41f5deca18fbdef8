//! The envd requests behind background processes and terminals, against the recording server
//! as the gateway: the `Start` envelope with its tag, stdin and PTY, the agent's headers
//! (detach timer, replay offset), the coalesced terminal input, and the fallback to envd's
//! own `Process/List` when the agent's listing is missing.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use sandbox_core::{
    CreateRequest, ErrorCode, ErrorKind, ProcessEvent, ProcessSelector, ProcessSpec, ProcessStatus,
    ProcessTag, SandboxHandle, SandboxProvider, Signal, TemplateId, TerminalOptions, TerminalSize,
    narrow,
};
use sandbox_envd::process::SendInputRequest;
use sandbox_envd::process::process_input::Input;
use serde_json::{Value, json};

use crate::recorder::{Recorder, Reply, Seen};
use crate::wire::{answer, provider};

fn envelope(flags: u8, message: &Value) -> Bytes {
    let payload = message.to_string();
    let mut out = BytesMut::new();
    out.put_u8(flags);
    out.put_u32(u32::try_from(payload.len()).unwrap());
    out.put_slice(payload.as_bytes());
    out.freeze()
}

/// The one envelope of a server-stream request's body, as JSON.
fn request_message(seen: &Seen) -> Value {
    let body = &seen.body[..];
    assert!(body.len() >= 5, "{body:?}");
    let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
    assert_eq!(body.len(), 5 + len, "one envelope only: {body:?}");
    serde_json::from_slice(&body[5..]).unwrap()
}

/// A Connect server stream of `events`, then its end, with `headers`.
fn stream(headers: Vec<(&'static str, String)>, events: &[Value]) -> Reply {
    let mut body = BytesMut::new();
    for event in events {
        body.put(envelope(0, &json!({ "event": event })));
    }
    body.put(envelope(2, &json!({})));
    let mut headers = headers;
    headers.push(("content-type", "application/connect+json".to_owned()));
    Reply::Raw(200, headers, body.freeze())
}

fn connect_error(status: u16, code: &str, message: &str) -> Reply {
    Reply::Json(
        status,
        Vec::new(),
        json!({"code": code, "message": message}),
    )
}

async fn sandbox(
    rec: &Recorder,
) -> (
    sandbox_core::Checked<sandbox_provider_e2b::E2bProvider>,
    SandboxHandle,
) {
    rec.on(
        "POST",
        "/sandboxes",
        vec![Reply::ok(201, answer("i1", None))],
    );
    let p = provider(rec);
    let handle = p
        .create(CreateRequest::new(TemplateId::new("base").unwrap()))
        .await
        .unwrap();
    (p, handle)
}

#[tokio::test]
async fn a_tagged_start_checks_the_tag_and_sends_it_with_stdin_and_no_deadline() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec).await;
    // The listing names the new process only once it has been started.
    rec.on_fn("GET", "/sandbox-agent/processes", |_, before| {
        let mut processes =
            vec![json!({"pid": 7, "tag": "other", "cmd": "sleep", "running": true})];
        if before.iter().any(|s| s.path == "/process.Process/Start") {
            processes.push(
                json!({"pid": 42, "tag": "job-1", "cmd": "/bin/bash", "running": true,
                                  "output_bytes": 0, "ring_bytes": 1_048_576, "stdin": true}),
            );
        }
        Reply::ok(200, json!({ "processes": processes }))
    });
    rec.on(
        "POST",
        "/process.Process/Start",
        vec![stream(Vec::new(), &[json!({"start": {"pid": 42}})])],
    );
    let processes = narrow::processes(&p).unwrap();
    let mut spec = ProcessSpec::shell("echo $HOME").tagged(ProcessTag::new("job-1").unwrap());
    spec.stdin = true;
    spec.env.insert("K".to_owned(), "v".to_owned());
    let info = processes.start_process(&h, spec).await.unwrap();
    assert_eq!(info.pid, 42);
    assert_eq!(info.tag.as_ref().map(ProcessTag::as_str), Some("job-1"));
    assert_eq!(info.argv, ["/bin/bash", "-l", "-c", "echo $HOME"]);
    assert_eq!(info.status, ProcessStatus::Running);
    // The ring's size is the agent's, read from its listing after the start.
    assert_eq!(info.ring_bytes, 1_048_576);

    let order: Vec<String> = rec
        .seen()
        .iter()
        .filter(|s| s.path != "/sandboxes")
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert_eq!(
        order,
        [
            "GET /sandbox-agent/processes",
            "POST /process.Process/Start",
            "GET /sandbox-agent/processes"
        ]
    );
    let start = &rec.seen_at("POST", "/process.Process/Start")[0];
    // No deadline: envd would kill the process at it.
    assert_eq!(start.header("connect-timeout-ms"), None, "{start:?}");
    assert_eq!(start.header("authorization"), Some("Basic cm9vdDo="));
    let message = request_message(start);
    assert_eq!(message["tag"], "job-1");
    assert_eq!(message["stdin"], true);
    assert!(message.get("pty").is_none(), "{message}");
    assert_eq!(message["process"]["cmd"], "/bin/bash");
    assert_eq!(
        message["process"]["args"],
        json!(["-l", "-c", "echo $HOME"])
    );
    assert_eq!(message["process"]["envs"]["K"], "v");

    // A running holder of the tag refuses a second start, which sends nothing.
    let again = processes
        .start_process(
            &h,
            ProcessSpec::argv("sleep", ["1"]).tagged(ProcessTag::new("other").unwrap()),
        )
        .await
        .unwrap_err();
    assert_eq!(again.code(), Some(ErrorCode::ProcessTagInUse));
    assert_eq!(rec.seen_at("POST", "/process.Process/Start").len(), 1);
}

#[tokio::test]
async fn an_attach_asks_for_its_offset_and_reports_the_lost_bytes_as_a_gap() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec).await;
    rec.on(
        "GET",
        "/sandbox-agent/processes",
        vec![Reply::ok(
            200,
            json!({"processes": [{"pid": 42, "cmd": "cat", "running": false,
                                  "output_bytes": 13, "ring_bytes": 10, "exit_code": 0}]}),
        )],
    );
    let replay = |from: &str| {
        stream(
            vec![("sandbox-replay-offset", from.to_owned())],
            &[
                json!({"start": {"pid": 42}}),
                json!({"data": {"stdout": "aGkK"}}),
                json!({"end": {"exitCode": 0, "exited": true, "status": "exit status 0"}}),
            ],
        )
    };
    rec.on(
        "POST",
        "/process.Process/Connect",
        vec![replay("10"), replay("13")],
    );
    let processes = narrow::processes(&p).unwrap();
    let mut attach = processes
        .attach_process(&h, &ProcessSelector::Pid(42), Some(0))
        .await
        .unwrap();
    let mut events = Vec::new();
    while let Some(event) = attach.next_event().await {
        events.push(format!("{event:?}"));
    }
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(
        events[0],
        format!("{:?}", ProcessEvent::Gap { from: 0, to: 10 })
    );
    assert!(
        events[1].contains("offset: 10") && events[1].contains("[104, 105, 10]"),
        "{events:?}"
    );
    assert!(events[2].contains("exit_code: Some(0)"), "{events:?}");
    let connect = &rec.seen_at("POST", "/process.Process/Connect")[0];
    assert_eq!(connect.header("sandbox-replay-offset"), Some("0"));
    assert_eq!(request_message(connect)["process"]["pid"], 42);

    // From "what comes next": the offset the listing reported, so no gap.
    let mut next = processes
        .attach_process(&h, &ProcessSelector::Pid(42), None)
        .await
        .unwrap();
    match next.next_event().await {
        Some(ProcessEvent::Data { offset, data, .. }) => {
            assert_eq!((offset, &data[..]), (13, &b"hi\n"[..]))
        }
        other => panic!("expected data at 13, got {other:?}"),
    }
    let connect = &rec.seen_at("POST", "/process.Process/Connect")[1];
    assert_eq!(connect.header("sandbox-replay-offset"), Some("13"));
}

#[tokio::test]
async fn without_the_agents_listing_envds_live_list_answers() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec).await;
    // E2B's own envd: no such path.
    rec.on(
        "GET",
        "/sandbox-agent/processes",
        vec![Reply::Raw(
            404,
            Vec::new(),
            Bytes::from_static(b"404 page not found"),
        )],
    );
    rec.on(
        "POST",
        "/process.Process/List",
        vec![Reply::ok(
            200,
            json!({"processes": [{"pid": 5, "tag": "job-1",
                                  "config": {"cmd": "sleep", "args": ["30"]}}]}),
        )],
    );
    let processes = narrow::processes(&p).unwrap();
    let listed = processes.list_processes(&h).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let info = &listed[0];
    assert_eq!(info.pid, 5);
    assert_eq!(info.tag.as_ref().map(ProcessTag::as_str), Some("job-1"));
    assert_eq!(info.argv, ["sleep", "30"]);
    assert_eq!(info.status, ProcessStatus::Running);
    // Nothing is known of its output there.
    assert_eq!((info.output_bytes, info.ring_bytes), (0, 0));
    assert_eq!(rec.seen_at("GET", "/sandbox-agent/processes").len(), 1);
    assert_eq!(rec.seen_at("POST", "/process.Process/List").len(), 1);

    // A signal envd refuses as not found: missing from the live list, so a Connect asks
    // whether envd still knows it. It does not: unknown.
    rec.on(
        "POST",
        "/process.Process/SendSignal",
        vec![connect_error(
            404,
            "not_found",
            "process with pid 9 not found",
        )],
    );
    rec.on(
        "POST",
        "/process.Process/Connect",
        vec![connect_error(
            404,
            "not_found",
            "process with pid 9 not found",
        )],
    );
    let unknown = processes
        .signal_process(&h, &ProcessSelector::Pid(9), Signal::Term)
        .await
        .unwrap_err();
    assert_eq!(unknown.kind(), ErrorKind::NotFound);
    assert_eq!(unknown.code(), Some(ErrorCode::ProcessNotFound));
    let signal = &rec.seen_at("POST", "/process.Process/SendSignal")[0].json();
    assert_eq!(signal["process"]["pid"], 9);
    assert_eq!(signal["signal"], "SIGNAL_SIGTERM");
    // It does (an ended process, still connectable): it has exited.
    rec.on(
        "POST",
        "/process.Process/Connect",
        vec![stream(
            Vec::new(),
            &[
                json!({"start": {"pid": 9}}),
                json!({"end": {"exitCode": 0, "exited": true, "status": "exit status 0"}}),
            ],
        )],
    );
    let ended = processes
        .signal_process(&h, &ProcessSelector::Pid(9), Signal::Kill)
        .await
        .unwrap_err();
    assert_eq!(ended.code(), Some(ErrorCode::ProcessExited));
    assert_eq!(rec.seen_at("POST", "/process.Process/Connect").len(), 2);
}

#[tokio::test]
async fn a_terminal_is_a_pty_start_with_the_detach_timer_and_coalesced_input() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec).await;
    rec.on(
        "POST",
        "/process.Process/Start",
        vec![stream(Vec::new(), &[json!({"start": {"pid": 77}})])],
    );
    rec.on(
        "POST",
        "/process.Process/SendInput",
        vec![Reply::ok(200, json!({}))],
    );
    rec.on(
        "POST",
        "/process.Process/Update",
        vec![Reply::ok(200, json!({}))],
    );
    let terminals = narrow::terminals(&p).unwrap();
    let mut options = TerminalOptions {
        size: TerminalSize {
            cols: 120,
            rows: 40,
        },
        detach_timeout: Some(Duration::from_secs(90)),
        ..TerminalOptions::default()
    };
    options.env.insert("TERM".to_owned(), "dumb".to_owned());
    options.env.insert("K".to_owned(), "v".to_owned());
    let terminal = terminals.open_terminal(&h, options).await.unwrap();
    assert_eq!(terminal.pid, Some(77));

    let start = &rec.seen_at("POST", "/process.Process/Start")[0];
    assert_eq!(start.header("sandbox-detach-timeout-ms"), Some("90000"));
    assert_eq!(start.header("connect-timeout-ms"), None);
    let message = request_message(start);
    assert_eq!(message["pty"]["size"], json!({"cols": 120, "rows": 40}));
    assert!(
        message["tag"]
            .as_str()
            .unwrap()
            .starts_with("sandbox-terminal-"),
        "{message}"
    );
    let process = &message["process"];
    assert_eq!(process["cmd"], "/bin/bash");
    assert_eq!(process["args"], json!(["-i", "-l"]));
    assert_eq!(process["envs"]["TERM"], "xterm-256color");
    assert_eq!(process["envs"]["K"], "v");
    assert_eq!(
        process["envs"]["SANDBOX_TERMINAL_ID"]
            .as_str()
            .map(str::len),
        Some(32)
    );

    // 100 small writes and one large one: sent in order, in few calls of at most 4096 bytes.
    let mut typed = Vec::new();
    for n in 0..100 {
        let line = format!("echo line-{n:03} ........................................\n");
        terminal.input.write(line.as_bytes()).await.unwrap();
        typed.extend_from_slice(line.as_bytes());
    }
    let paste = vec![b'x'; 10_000];
    terminal.input.write(&paste).await.unwrap();
    typed.extend_from_slice(&paste);
    terminal
        .input
        .resize(TerminalSize { cols: 90, rows: 30 })
        .await
        .unwrap();
    // A detach still sends what was typed.
    terminal.input.detach().await.unwrap();
    let sent = |rec: &Recorder| -> Vec<Vec<u8>> {
        rec.seen_at("POST", "/process.Process/SendInput")
            .iter()
            .map(|s| {
                let request: SendInputRequest = serde_json::from_slice(&s.body).unwrap();
                assert_eq!(
                    request.process.unwrap(),
                    sandbox_envd::process::ProcessSelector::pid(77)
                );
                match request.input.and_then(|i| i.input) {
                    Some(Input::Pty(bytes)) => bytes,
                    other => panic!("not PTY input: {other:?}"),
                }
            })
            .collect()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sent(&rec).concat().len() < typed.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = sent(&rec);
    assert_eq!(calls.concat(), typed, "every byte, in order");
    assert!(
        calls.iter().all(|c| c.len() <= 4096),
        "{:?}",
        calls.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(
        calls.len() <= 10,
        "{} calls for {} writes: not coalesced",
        calls.len(),
        101
    );
    let update = &rec.seen_at("POST", "/process.Process/Update")[0].json();
    assert_eq!(update["pty"]["size"], json!({"cols": 90, "rows": 30}));
    // Detached: no more input.
    assert!(terminal.input.write(b"late").await.is_err());
}
