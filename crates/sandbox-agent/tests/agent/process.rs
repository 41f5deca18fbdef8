//! The process service's semantics, through the workspace's envd client (and raw HTTP for the
//! replay extension, which the client does not send).

use std::time::Duration;

use sandbox_core::ErrorKind;
use sandbox_envd::process::process_event::Event;
use sandbox_envd::process::{self as ps, ProcessInput, ProcessSelector};
use sandbox_transport::envd::CallOptions;

use crate::{
    BOTH, TestAgent, drain, envelope, eventually, kill, pid_of, raw_client, read_stream,
    rpc_request, sh, start_error, start_request,
};

#[tokio::test]
async fn start_streams_output_in_order_and_one_end() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let client = agent.client(http);
        let mut request =
            sh("printf one; printf two >&2; printf three; echo \"$A|$B|$(pwd)\"; exit 3");
        let config = request.process.as_mut().unwrap();
        config.envs.insert("A".into(), "a".into());
        config.envs.insert("B".into(), "b b".into());
        config.cwd = Some("/tmp".into());
        let mut stream = client.start(&request, CallOptions::new()).await.unwrap();
        assert!(pid_of(&mut stream).await > 0);
        let out = drain(&mut stream).await;
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "onethreea|b b|/tmp\n"
        );
        assert_eq!(out.stderr, b"two");
        let end = out.end.unwrap();
        assert_eq!(
            (
                end.exit_code,
                end.exited,
                end.status.as_str(),
                end.error.as_deref()
            ),
            (3, true, "exit status 3", Some("exit status 3"))
        );

        // A cwd that does not exist, and a program that does not.
        let mut request = start_request("/bin/true", &[]);
        request.process.as_mut().unwrap().cwd = Some("/nonexistent/dir".into());
        let e = start_error(&client, &request).await;
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        assert!(
            e.message()
                .contains("cwd '/nonexistent/dir' does not exist"),
            "{e}"
        );
        let e = start_error(&client, &start_request("/nonexistent/prog", &[])).await;
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        assert!(
            e.message()
                .contains("error starting process '/nonexistent/prog'"),
            "{e}"
        );
    }
}

#[tokio::test]
async fn large_output_arrives_whole_in_bounded_chunks() {
    // More than the ring holds, through a reader that keeps up: back-pressure, not loss.
    let agent = TestAgent::with(|c| c.output_ring_bytes = 64 * 1024).await;
    let client = agent.client(BOTH[1]);
    let mut stream = client
        .start(
            &sh("head -c 3000000 /dev/zero | tr '\\0' x"),
            CallOptions::new(),
        )
        .await
        .unwrap();
    pid_of(&mut stream).await;
    let mut total = 0usize;
    loop {
        match crate::next_event(&mut stream).await {
            ps::process_event::Event::Data(d) => {
                let ps::process_event::data_event::Output::Stdout(b) = d.output.unwrap() else {
                    panic!("stdout expected");
                };
                assert!(b.len() <= 32 * 1024, "{}", b.len());
                assert!(b.iter().all(|&c| c == b'x'));
                total += b.len();
            }
            ps::process_event::Event::End(end) => {
                assert_eq!(end.exit_code, 0);
                break;
            }
            _ => {}
        }
    }
    assert_eq!(total, 3_000_000);
}

#[tokio::test]
async fn input_list_connect_and_close_stdin() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let client = agent.client(http);
        let mut request = start_request("/bin/cat", &[]);
        request.tag = Some(format!("cat-{http:?}"));
        let mut stream = client.start(&request, CallOptions::new()).await.unwrap();
        let pid = pid_of(&mut stream).await;

        let listed = client.list(CallOptions::new()).await.unwrap();
        let info = listed.iter().find(|p| p.pid == pid).expect("listed");
        assert_eq!(info.tag.as_deref(), Some(format!("cat-{http:?}").as_str()));
        assert_eq!(info.config.as_ref().unwrap().cmd, "/bin/cat");

        client
            .send_input(
                ProcessSelector::pid(pid),
                ProcessInput::stdin(b"hello ".to_vec()),
                CallOptions::new(),
            )
            .await
            .unwrap();
        let mut input = client
            .stream_input(
                ProcessSelector::tag(format!("cat-{http:?}")),
                CallOptions::new(),
            )
            .await
            .unwrap();
        input
            .send(ProcessInput::stdin(b"from ".to_vec()))
            .await
            .unwrap();
        input.keepalive().await.unwrap();
        input
            .send(ProcessInput::stdin(b"a stream".to_vec()))
            .await
            .unwrap();
        input.finish().await.unwrap();

        // A second client attaches by tag and sees live output.
        let mut attached = client
            .connect(
                ProcessSelector::tag(format!("cat-{http:?}")),
                CallOptions::new(),
            )
            .await
            .unwrap();
        assert_eq!(pid_of(&mut attached).await, pid);

        client
            .close_stdin(ProcessSelector::pid(pid), CallOptions::new())
            .await
            .unwrap();
        let out = drain(&mut stream).await;
        assert_eq!(out.stdout, b"hello from a stream");
        assert_eq!(out.end.unwrap().exit_code, 0);
        let seen = drain(&mut attached).await;
        assert_eq!(seen.end.unwrap().status, "exit status 0");

        // Gone from List; still connectable for a while after its exit (start + end).
        eventually(
            Duration::from_secs(5),
            "the list to drop the process",
            || true,
        )
        .await;
        let listed = client.list(CallOptions::new()).await.unwrap();
        assert!(listed.iter().all(|p| p.pid != pid), "{listed:?}");
        let mut late = client
            .connect(ProcessSelector::pid(pid), CallOptions::new())
            .await
            .unwrap();
        assert_eq!(pid_of(&mut late).await, pid);
        let late = drain(&mut late).await;
        assert!(late.stdout.is_empty());
        assert_eq!(late.end.unwrap().exit_code, 0);

        // An exited process takes no input and no signal.
        let e = client
            .send_input(
                ProcessSelector::pid(pid),
                ProcessInput::stdin(b"x".to_vec()),
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert!(
            e.message()
                .contains(&format!("process with pid {pid} not found")),
            "{e}"
        );
    }
}

#[tokio::test]
async fn stdin_false_reads_dev_null_and_refuses_input() {
    let agent = TestAgent::start().await;
    let client = agent.client(BOTH[0]);
    let mut request = sh("cat; echo read-eof; sleep 1");
    request.stdin = Some(false);
    let mut stream = client.start(&request, CallOptions::new()).await.unwrap();
    let pid = pid_of(&mut stream).await;
    let e = client
        .send_input(
            ProcessSelector::pid(pid),
            ProcessInput::stdin(b"x".to_vec()),
            CallOptions::new(),
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("stdin not enabled"), "{e}");
    // Closing an absent stdin is not an error (as envd).
    client
        .close_stdin(ProcessSelector::pid(pid), CallOptions::new())
        .await
        .unwrap();
    let out = drain(&mut stream).await;
    assert_eq!(out.stdout, b"read-eof\n");
}

#[tokio::test]
async fn signals_reach_the_process_group() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let client = agent.client(http);
        for (signal, status) in [
            (ps::Signal::Sigterm, "signal: terminated"),
            (ps::Signal::Sigkill, "signal: killed"),
        ] {
            // The shell's child would outlive a signal to the shell alone.
            let mut stream = client
                .start(&sh("sleep 30 & echo child $!; wait"), CallOptions::new())
                .await
                .unwrap();
            let pid = pid_of(&mut stream).await;
            let line = match crate::next_event(&mut stream).await {
                ps::process_event::Event::Data(d) => match d.output.unwrap() {
                    ps::process_event::data_event::Output::Stdout(b) => {
                        String::from_utf8(b).unwrap()
                    }
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            };
            let child: i32 = line.trim().strip_prefix("child ").unwrap().parse().unwrap();
            client
                .send_signal(ProcessSelector::pid(pid), signal, CallOptions::new())
                .await
                .unwrap();
            let end = drain(&mut stream).await.end.unwrap();
            assert_eq!(
                (end.exit_code, end.exited, end.status.as_str()),
                (-1, false, status)
            );
            eventually(Duration::from_secs(5), "the grandchild to die", || {
                !alive(child)
            })
            .await;
        }
        let e = client
            .send_signal(
                ProcessSelector::pid(999_999),
                ps::Signal::Sigkill,
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert!(
            e.message().contains("process with pid 999999 not found"),
            "{e}"
        );
        // A stream's error travels in its end-of-stream message.
        let e = match client
            .connect(ProcessSelector::tag("nope"), CallOptions::new())
            .await
        {
            Ok(mut s) => s.message().await.unwrap_err(),
            Err(e) => e,
        };
        assert!(
            e.message().contains("process with tag nope not found"),
            "{e}"
        );
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }
}

/// Whether `pid` exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

#[tokio::test]
async fn unsupported_signals_are_unimplemented() {
    let agent = TestAgent::start().await;
    let client = agent.client(BOTH[0]);
    let mut stream = client
        .start(&sh("sleep 30"), CallOptions::new())
        .await
        .unwrap();
    let pid = pid_of(&mut stream).await;
    let raw = raw_client(BOTH[0]);
    let body =
        serde_json::json!({"process": {"pid": pid}, "signal": "SIGNAL_UNSPECIFIED"}).to_string();
    let response = raw
        .request(rpc_request(
            &agent.url(),
            "/process.Process/SendSignal",
            "application/json",
            &[],
            body,
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), hyper::StatusCode::NOT_IMPLEMENTED);
    // By number, a signal outside the provider port's set is invalid_argument.
    let response = raw
        .request(rpc_request(
            &agent.url(),
            "/process.Process/SendSignal",
            "application/json",
            &[],
            serde_json::json!({"process": {"pid": pid}, "signal": 40}).to_string(),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), hyper::StatusCode::BAD_REQUEST);
    kill(&client, pid).await;
    assert_eq!(
        drain(&mut stream).await.end.unwrap().status,
        "signal: killed"
    );
}

#[tokio::test]
async fn every_signal_of_the_port_is_sent_by_number() {
    let agent = TestAgent::start().await;
    let client = agent.client(BOTH[1]);
    for (number, status) in [
        (1, "signal: hangup"),
        (2, "signal: interrupt"),
        (3, "signal: quit"),
        (10, "signal: user defined signal 1"),
        (12, "signal: user defined signal 2"),
    ] {
        let mut stream = client
            .start(&start_request("sleep", &["30"]), CallOptions::new())
            .await
            .unwrap();
        let pid = pid_of(&mut stream).await;
        client
            .send_signal(
                ProcessSelector::pid(pid),
                ps::Signal::from_i32(number),
                CallOptions::new(),
            )
            .await
            .unwrap();
        let end = drain(&mut stream).await.end.unwrap();
        assert_eq!((number, end.status.as_str()), (number, status));
    }
}

async fn listing(agent: &TestAgent) -> Vec<serde_json::Value> {
    let answer: serde_json::Value = agent
        .client(BOTH[1])
        .get_json(
            sandbox_core::Operation::new("list"),
            "/sandbox-agent/processes",
            1 << 20,
            CallOptions::new(),
        )
        .await
        .unwrap();
    answer["processes"].as_array().unwrap().clone()
}

#[tokio::test]
async fn the_processes_extension_lists_live_and_recently_ended_processes() {
    let agent = TestAgent::start().await;
    let client = agent.client(BOTH[1]);
    // Behind the token, like every extension.
    let raw = raw_client(BOTH[1]);
    let refused = crate::get(&raw, &agent.url(), "/sandbox-agent/processes").await;
    assert_eq!(refused.status(), hyper::StatusCode::UNAUTHORIZED);

    let mut request = start_request("sleep", &["30"]);
    request.tag = Some("sleeper".into());
    request.stdin = Some(false);
    let mut sleeper = client.start(&request, CallOptions::new()).await.unwrap();
    let sleeper_pid = pid_of(&mut sleeper).await;
    let mut ended = client
        .start(&sh("printf abc; exit 3"), CallOptions::new())
        .await
        .unwrap();
    let ended_pid = pid_of(&mut ended).await;
    drain(&mut ended).await;
    let mut with_stdin = client
        .start(&start_request("cat", &[]), CallOptions::new())
        .await
        .unwrap();
    let cat_pid = pid_of(&mut with_stdin).await;

    let all = listing(&agent).await;
    let find = |all: &[serde_json::Value], pid: u32| {
        all.iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} not in {all:?}"))
            .clone()
    };
    let live = find(&all, sleeper_pid);
    assert_eq!(live["tag"], "sleeper");
    assert_eq!(live["cmd"], "sleep");
    assert_eq!(live["args"], serde_json::json!(["30"]));
    assert_eq!(live["running"], true);
    assert_eq!(live["stdin"], false);
    assert!(live.get("exit_code").is_none() && live.get("signal").is_none());
    assert_eq!(find(&all, cat_pid)["stdin"], true);
    let done = find(&all, ended_pid);
    assert_eq!(done["running"], false);
    assert_eq!(done["exit_code"], 3);
    assert_eq!(done["status"], "exit status 3");
    assert_eq!(done["output_bytes"], 3);
    assert!(done["ring_bytes"].as_u64().unwrap() >= 64 * 1024);
    // envd's own List stays faithful: live processes only.
    let envd: Vec<u32> = client
        .list(CallOptions::new())
        .await
        .unwrap()
        .iter()
        .map(|p| p.pid)
        .collect();
    assert!(envd.contains(&sleeper_pid) && !envd.contains(&ended_pid));

    // Closing stdin shows; a kill lists the signal.
    client
        .close_stdin(ProcessSelector::pid(cat_pid), CallOptions::new())
        .await
        .unwrap();
    drain(&mut with_stdin).await;
    kill(&client, sleeper_pid).await;
    drain(&mut sleeper).await;
    let all = listing(&agent).await;
    let killed = find(&all, sleeper_pid);
    assert_eq!(killed["running"], false);
    assert_eq!(killed["signal"], 9);
    assert!(killed.get("exit_code").is_none());
    assert_eq!(find(&all, cat_pid)["exit_code"], 0);
}

#[tokio::test]
async fn the_processes_extension_keeps_only_the_latest_ended() {
    let agent = TestAgent::start().await;
    let client = agent.client(BOTH[1]);
    let mut pids = Vec::new();
    for _ in 0..sandbox_agent::process::LISTED_EXITED + 5 {
        let mut stream = client
            .start(&start_request("true", &[]), CallOptions::new())
            .await
            .unwrap();
        pids.push(pid_of(&mut stream).await);
        drain(&mut stream).await;
    }
    let listed: Vec<u64> = listing(&agent)
        .await
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    let newest: Vec<u64> = pids[5..].iter().map(|p| u64::from(*p)).collect();
    assert_eq!(listed, newest, "the newest ended ones, oldest ended first");
}

#[tokio::test]
async fn the_clients_connect_from_sends_the_replay_offset_and_reads_the_answer() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let client = agent.client(http);
        let mut started = client
            .start(&sh("printf abcdef; exec sleep 30"), CallOptions::new())
            .await
            .unwrap();
        let pid = pid_of(&mut started).await;
        drop(started);
        let target = || ProcessSelector::pid(pid);
        eventually(Duration::from_secs(5), "the output", || {
            agent
                .agent
                .process()
                .listing()
                .processes
                .iter()
                .any(|p| p.pid == pid && p.output_bytes == 6)
        })
        .await;
        // From an offset: the answer names where the replay starts, and the bytes follow.
        let (mut stream, start) = client
            .connect_from(target(), Some(2), CallOptions::new())
            .await
            .unwrap();
        assert_eq!(start, Some(2));
        pid_of(&mut stream).await;
        match crate::next_event(&mut stream).await {
            Event::Data(d) => assert_eq!(
                d.output,
                Some(ps::process_event::data_event::Output::Stdout(
                    b"cdef".to_vec()
                ))
            ),
            other => panic!("{other:?}"),
        }
        drop(stream);
        // Live only: no header either way.
        let (stream, start) = client
            .connect_from(target(), None, CallOptions::new())
            .await
            .unwrap();
        assert_eq!(start, None);
        drop(stream);
        // Past the output: out_of_range, at the stream's first message.
        let (mut stream, _) = client
            .connect_from(target(), Some(7), CallOptions::new())
            .await
            .unwrap();
        let e = stream.message().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        kill(&client, pid).await;
    }
}

#[tokio::test]
async fn the_start_deadline_kills_the_process() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let client = agent.client(http);
        let mut stream = client
            .start(
                &sh("sleep 30"),
                CallOptions::new().timeout(Duration::from_millis(500)),
            )
            .await
            .unwrap();
        let pid = pid_of(&mut stream).await;
        let began = std::time::Instant::now();
        let e = loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without the deadline"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(began.elapsed() < Duration::from_secs(5));
        eventually(Duration::from_secs(5), "the process to be killed", || {
            !alive(pid as i32)
        })
        .await;
        let mut after = client
            .connect(ProcessSelector::pid(pid), CallOptions::new())
            .await
            .unwrap();
        pid_of(&mut after).await;
        assert_eq!(
            drain(&mut after).await.end.unwrap().status,
            "signal: killed"
        );
    }
}

#[tokio::test]
async fn closing_the_stream_early_does_not_kill_the_process() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let client = agent.client(http);
        let mut stream = client
            .start(&sh("read line; echo got $line"), CallOptions::new())
            .await
            .unwrap();
        let pid = pid_of(&mut stream).await;
        drop(stream);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(alive(pid as i32));
        let mut attached = client
            .connect(ProcessSelector::pid(pid), CallOptions::new())
            .await
            .unwrap();
        pid_of(&mut attached).await;
        client
            .send_input(
                ProcessSelector::pid(pid),
                ProcessInput::stdin(b"it\n".to_vec()),
                CallOptions::new(),
            )
            .await
            .unwrap();
        let out = drain(&mut attached).await;
        assert_eq!(out.stdout, b"got it\n");
        assert_eq!(out.end.unwrap().exit_code, 0);
    }
}

#[tokio::test]
async fn keepalives_fill_idle_streams() {
    let agent = TestAgent::start().await;
    let client = agent.client(BOTH[0]);
    let mut stream = client
        .start(&sh("sleep 2.5; echo late"), CallOptions::new())
        .await
        .unwrap();
    pid_of(&mut stream).await;
    let out = drain(&mut stream).await;
    assert!(out.keepalives >= 2, "{}", out.keepalives);
    assert_eq!(out.stdout, b"late\n");
}

#[tokio::test]
async fn the_ring_is_bounded_and_replay_resumes_where_asked() {
    let ring = 64 * 1024;
    let agent = TestAgent::with(|c| c.output_ring_bytes = ring).await;
    let client = agent.client(BOTH[0]);
    // 200000 bytes, a marker per 10 bytes so any offset's content is known, then a pause.
    let script = "i=0; while [ $i -lt 20000 ]; do printf '%09d\\n' $i; i=$((i+1)); done; sleep 30";
    let mut stream = client.start(&sh(script), CallOptions::new()).await.unwrap();
    let pid = pid_of(&mut stream).await;
    // Read the first 1000 bytes, then detach: the rest goes only to the ring.
    let mut seen = Vec::new();
    while seen.len() < 1000 {
        if let ps::process_event::Event::Data(d) = crate::next_event(&mut stream).await
            && let Some(ps::process_event::data_event::Output::Stdout(b)) = d.output
        {
            seen.extend(b);
        }
    }
    drop(stream);
    let raw = raw_client(BOTH[0]);
    let connect = |offset: Option<u64>| {
        let headers: Vec<(&str, String)> = offset
            .map(|o| vec![("sandbox-replay-offset", o.to_string())])
            .unwrap_or_default();
        rpc_request(
            &agent.url(),
            "/process.Process/Connect",
            "application/connect+json",
            &headers,
            envelope(&ps::ConnectRequest {
                process: Some(ProcessSelector::pid(pid)),
            }),
        )
    };
    // Wait for the whole output to be written (the script then sleeps): until then offset
    // 200000 is beyond the end, refused (in the stream's end) without the answer header.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let probe = raw.request(connect(Some(200_000))).await.unwrap();
        if probe.headers().contains_key("sandbox-replay-offset") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the output was never written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Asking for a byte long gone starts at the oldest byte held, and says so: the ring holds
    // at most its capacity, evicting whole chunks (at most 32 KiB each).
    let response = raw.request(connect(Some(0))).await.unwrap();
    let start: u64 = response.headers()["sandbox-replay-offset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(start >= 200_000 - ring as u64, "{start}");
    assert!(start < 200_000 - ring as u64 + 32 * 1024, "{start}");
    // Kill the process so the replay ends, then read what came.
    let reader = tokio::spawn(read_stream(response));
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill(&agent.client(BOTH[0]), pid).await;
    let (messages, end) = reader.await.unwrap();
    assert_eq!(end, sandbox_envd::EndStreamMessage::ok());
    let replayed: Vec<u8> = messages
        .iter()
        .filter_map(|m| m["event"]["data"]["stdout"].as_str())
        .flat_map(|b64| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap()
        })
        .collect();
    let whole: Vec<u8> = (0..20_000)
        .flat_map(|i| format!("{i:09}\n").into_bytes())
        .collect();
    assert_eq!(
        replayed,
        whole[start as usize..],
        "exactly the bytes from the offset on"
    );
    assert_eq!(&seen[..1000], &whole[..1000]);

    // A replay inside the ring starts exactly where asked; beyond the end is out_of_range.
    let response = raw.request(connect(Some(199_995))).await.unwrap();
    assert_eq!(response.headers()["sandbox-replay-offset"], "199995");
    let (messages, _) = read_stream(response).await;
    // "9999\n", the last five bytes.
    assert_eq!(
        messages[1]["event"]["data"]["stdout"], "OTk5OQo=",
        "{messages:?}"
    );
    let response = raw.request(connect(Some(300_000))).await.unwrap();
    let (_, end) = read_stream(response).await;
    assert_eq!(end.error.unwrap().code, sandbox_envd::Code::OutOfRange);
    // Without the header: no replay, and no header in the answer.
    let response = raw.request(connect(None)).await.unwrap();
    assert!(response.headers().get("sandbox-replay-offset").is_none());
    let (messages, _) = read_stream(response).await;
    assert_eq!(messages.len(), 2, "start and end only: {messages:?}");
}

#[tokio::test]
async fn limits_answer_resource_exhausted() {
    let agent = TestAgent::with(|c| {
        c.max_processes = 1;
        c.stdin_buffer_bytes = 4096;
    })
    .await;
    let client = agent.client(BOTH[0]);
    let mut first = client
        .start(&sh("sleep 30"), CallOptions::new())
        .await
        .unwrap();
    let pid = pid_of(&mut first).await;
    let e = start_error(&client, &sh("true")).await;
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    assert!(e.message().contains("--max-processes"), "{e}");

    // `sleep` never reads its stdin: the pipe fills, then the buffer, then sends are refused.
    let chunk = vec![b'x'; 1024];
    let mut refused = None;
    for i in 0..400 {
        match client
            .send_input(
                ProcessSelector::pid(pid),
                ProcessInput::stdin(chunk.clone()),
                CallOptions::new(),
            )
            .await
        {
            Ok(()) => {}
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
        // Let the writer move what it can into the pipe.
        tokio::task::yield_now().await;
    }
    let (sent, e) = refused.expect("the stdin buffer must fill");
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    assert!(e.message().contains("--stdin-buffer-bytes"), "{e}");
    // The pipe (64 KiB on Linux) plus the 4 KiB buffer, give or take a chunk.
    assert!(sent < 200, "{sent} KiB accepted");
    kill(&client, pid).await;
    drain(&mut first).await;
    // Once it is gone, a new process may start.
    eventually(Duration::from_secs(5), "the slot to free", || {
        agent.agent.process().live() == 0
    })
    .await;
    let mut next = client.start(&sh("true"), CallOptions::new()).await.unwrap();
    pid_of(&mut next).await;
    assert_eq!(drain(&mut next).await.end.unwrap().exit_code, 0);
}

#[tokio::test]
async fn pty_processes_take_pty_input_and_resize() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let client = agent.client(http);
        let mut request = sh("stty size; read line; stty size; echo \"line=$line\"");
        request.pty = Some(ps::Pty {
            size: Some(ps::pty::Size {
                cols: 100,
                rows: 40,
            }),
        });
        let mut stream = client.start(&request, CallOptions::new()).await.unwrap();
        let pid = pid_of(&mut stream).await;
        let mut text = String::new();
        while !text.contains("40 100") {
            if let ps::process_event::Event::Data(d) = crate::next_event(&mut stream).await {
                match d.output.unwrap() {
                    ps::process_event::data_event::Output::Pty(b) => {
                        assert!(b.len() <= 16 * 1024);
                        text.push_str(&String::from_utf8_lossy(&b));
                    }
                    other => panic!("a PTY process sends pty data only: {other:?}"),
                }
            }
        }
        client
            .resize_pty(ProcessSelector::pid(pid), 90, 30, CallOptions::new())
            .await
            .unwrap();
        // stdin is the wrong input for a PTY process.
        let e = client
            .send_input(
                ProcessSelector::pid(pid),
                ProcessInput::stdin(b"x\n".to_vec()),
                CallOptions::new(),
            )
            .await
            .unwrap_err();
        assert!(e.message().contains("tty assigned to process"), "{e}");
        let e = client
            .close_stdin(ProcessSelector::pid(pid), CallOptions::new())
            .await
            .unwrap_err();
        assert!(e.message().contains("Ctrl+D"), "{e}");
        client
            .send_input(
                ProcessSelector::pid(pid),
                ProcessInput::pty(b"hello\n".to_vec()),
                CallOptions::new(),
            )
            .await
            .unwrap();
        let out = drain(&mut stream).await;
        let rest = String::from_utf8_lossy(&out.pty);
        assert!(rest.contains("30 90"), "{rest:?}");
        assert!(rest.contains("line=hello"), "{rest:?}");
        assert_eq!(out.end.unwrap().exit_code, 0);

        // Resizing a process without a PTY is an error.
        let mut plain = client
            .start(&sh("sleep 5"), CallOptions::new())
            .await
            .unwrap();
        let pid = pid_of(&mut plain).await;
        let e = client
            .resize_pty(ProcessSelector::pid(pid), 1, 1, CallOptions::new())
            .await
            .unwrap_err();
        assert!(e.message().contains("tty not assigned"), "{e}");
        kill(&client, pid).await;
        drain(&mut plain).await;
    }
}

#[tokio::test]
async fn started_processes_do_not_inherit_the_agents_stdio() {
    let agent = TestAgent::start().await;
    let client = agent.client(BOTH[0]);
    let mut stream = client
        .start(
            &sh("readlink /proc/self/fd/0 /proc/self/fd/1 /proc/self/fd/2; ls -l /proc/self/fd"),
            CallOptions::new(),
        )
        .await
        .unwrap();
    pid_of(&mut stream).await;
    let out = String::from_utf8(drain(&mut stream).await.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("pipe:"), "{out}");
    assert!(
        lines[1].starts_with("pipe:") && lines[2].starts_with("pipe:"),
        "{out}"
    );
    assert_ne!(lines[0], lines[1]);
    // Only 0, 1, 2 and the fd `ls` reads the directory with: nothing of the agent's leaks.
    let fds = lines.iter().filter(|l| l.contains(" -> ")).count();
    assert_eq!(fds, 4, "{out}");
}
