//! The fake provider's own behaviour: its declared capability set, failure injection,
//! narrowing, and the state it models.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sandbox_core::{
    Capabilities, Capability, ConnectRequest, CreateRequest, Error, ErrorKind, ExecRequest,
    ExecTimeout, ListFilter, Metadata, Provider, SandboxPath, SandboxProvider, SandboxState,
    narrow,
};
use sandbox_testkit::fake::{FAKE_TEMPLATE, FakeCall};
use sandbox_testkit::{FakeOp, FakeProvider, fake_capabilities};

fn request() -> CreateRequest {
    CreateRequest::new(FakeProvider::template())
}

#[test]
fn capability_set_is_exactly_everything_but_shell_pty_desktop_volumes() {
    let expected = Capability::ALL
        .into_iter()
        .filter(|c| {
            !matches!(
                c,
                Capability::PosixShell
                    | Capability::Pty
                    | Capability::Desktop
                    | Capability::Volumes
                    | Capability::TerminalReattach
            )
        })
        .fold(Capabilities::NONE, |set, c| set.with(c, true));
    assert_eq!(fake_capabilities(), expected);
    assert_eq!(FakeProvider::new().capabilities(), expected);
    assert_eq!(FakeProvider::template().as_str(), FAKE_TEMPLATE);
}

#[tokio::test]
async fn narrowing_removes_the_flag_and_the_operations() {
    let fake = FakeProvider::builder()
        .without(Capability::Snapshots)
        .without(Capability::List)
        .without(Capability::Metadata)
        .build();
    assert!(!fake.capabilities().snapshots);
    // The trait is still implemented, but both signals must agree before a caller may use it.
    assert!(fake.as_snapshots().is_some());
    assert!(narrow::snapshots(&fake).is_none());
    assert!(narrow::keep_alive(&fake).is_some());
    let err = fake.list(&ListFilter::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    let mut with_metadata = request();
    with_metadata.metadata.insert("k".into(), "v".into());
    assert_eq!(
        fake.create(with_metadata).await.unwrap_err().kind(),
        ErrorKind::Unsupported
    );
}

#[tokio::test]
async fn failure_injection_next_always_per_sandbox_and_hooks() {
    let fake = FakeProvider::new();
    fake.fail_next(
        FakeOp::Create,
        Error::unavailable(sandbox_core::Operation::CREATE, "injected"),
    );
    assert_eq!(
        fake.create(request()).await.unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    assert!(
        fake.sandbox_ids().is_empty(),
        "a failed create must create nothing"
    );
    let h = fake.create(request()).await.unwrap();
    assert_eq!(fake.calls(FakeOp::Create), 2);

    fake.fail_for(
        FakeOp::Connect,
        h.id(),
        Error::new(
            ErrorKind::Internal,
            sandbox_core::Operation::CONNECT,
            "boom",
        ),
    );
    let err = fake
        .connect(ConnectRequest::new(h.id().clone()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(!err.can_replace_binding());

    fake.fail_always(
        FakeOp::Health,
        Error::unavailable(sandbox_core::Operation::HEALTH, "down"),
    );
    assert!(fake.health().await.is_err());
    assert!(fake.health().await.is_err());
    fake.clear_faults();
    assert!(fake.health().await.is_ok());

    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    fake.set_hook(
        FakeOp::Get,
        Arc::new(move |call: FakeCall| {
            let counter = counter.clone();
            Box::pin(async move {
                assert_eq!(call.op, FakeOp::Get);
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        }),
    );
    fake.get(h.id()).await.unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn pause_connect_resume_terminal_and_tokens() {
    let fake = FakeProvider::builder().provider(Provider::Cube).build();
    let h = fake.create(request()).await.unwrap();
    assert_eq!(h.provider(), Provider::Cube);
    let issued = h.traffic_token().cloned().expect("a token at create");
    assert_eq!(fake.issued_token(h.id()), Some(issued.clone()));

    assert!(fake.pause(h.id()));
    let err = fake
        .exec(&h, ExecRequest::argv("true", Vec::<String>::new()))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Conflict,
        "exec on a paused sandbox: {err}"
    );
    let listed = fake
        .list(&ListFilter {
            states: vec![SandboxState::Paused],
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);

    // Connect resumes, and carries the caller's stored token (connect answers have none).
    let c = fake
        .connect(ConnectRequest {
            sandbox_id: h.id().clone(),
            traffic_token: Some(issued.clone()),
        })
        .await
        .unwrap();
    assert_eq!(c.traffic_token(), Some(&issued));
    assert_eq!(fake.state_of(h.id()), Some(SandboxState::Running));
    let without = fake
        .connect(ConnectRequest::new(h.id().clone()))
        .await
        .unwrap();
    assert!(without.traffic_token().is_none());

    assert!(fake.terminate(h.id()));
    let err = fake
        .connect(ConnectRequest::new(h.id().clone()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Terminal);
    assert!(err.can_replace_binding());
    let probe = narrow::connect_probe(&fake).unwrap();
    assert!(
        probe
            .connect_session(ConnectRequest::new(h.id().clone()))
            .await
            .unwrap_err()
            .can_replace_binding()
    );
}

#[tokio::test]
async fn dropped_exec_stops_its_process() {
    let fake = FakeProvider::new();
    let h = fake.create(request()).await.unwrap();
    let running = fake.exec(&h, ExecRequest::argv("sleep", ["30"]));
    let outcome = tokio::time::timeout(Duration::from_millis(200), running).await;
    assert!(outcome.is_err(), "sleep 30 finished early");
    assert_eq!(
        fake.running_processes(h.id()),
        0,
        "the dropped exec left a process counted as running"
    );

    let fake2 = fake.clone();
    let h2 = h.clone();
    let task =
        tokio::spawn(async move { fake2.exec(&h2, ExecRequest::argv("sleep", ["30"])).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fake.running_processes(h.id()), 1);
    task.abort();
    let _ = task.await;
    assert_eq!(fake.running_processes(h.id()), 0);
}

#[tokio::test]
async fn vocabulary_and_refusals() {
    let fake = FakeProvider::new();
    let mut req = request();
    req.env.insert("FROM_CREATE".into(), "1".into());
    let h = fake.create(req).await.unwrap();
    let run = |r: ExecRequest| fake.exec(&h, r);
    let out = run(ExecRequest::argv("echo", ["-n", "a", "b"]))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"a b");
    let out = run(ExecRequest::argv("head", ["-c", "3"]).stdin("abcdef"))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"abc");
    let out = run(ExecRequest::argv("env", Vec::<String>::new()))
        .await
        .unwrap();
    assert!(out.stdout_lossy().contains("FROM_CREATE=1\n"));
    let out = run(ExecRequest::argv("no-such-tool", Vec::<String>::new()))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 127);
    assert!(out.stderr_lossy().contains("command not found"));
    let out = run(ExecRequest::argv("sleep", ["5"])
        .timeout(ExecTimeout::new(Duration::from_millis(50)).unwrap()))
    .await
    .unwrap();
    assert!(out.killed && out.exit_code == -1);
    let err = run(ExecRequest::shell("echo hi")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    let err =
        run(ExecRequest::argv("pwd", Vec::<String>::new()).cwd(SandboxPath::new("/nope").unwrap()))
            .await
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    let err = run(ExecRequest::argv("", Vec::<String>::new()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);

    let file = SandboxPath::new("/workspace/f").unwrap();
    fake.write_file(&h, &file, b"x").await.unwrap();
    let err = fake
        .make_dir(&h, &file.join("sub").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    let err = fake
        .read_file(&h, &SandboxPath::new("/workspace").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}

#[tokio::test]
async fn snapshots_boot_and_metadata_filters() {
    let fake = FakeProvider::new();
    let mut req = request();
    let meta: Metadata = [("owner".to_owned(), "t1".to_owned())].into();
    req.metadata = meta.clone();
    let h = fake.create(req).await.unwrap();
    let f = SandboxPath::new("/workspace/keep.txt").unwrap();
    fake.write_file(&h, &f, b"kept").await.unwrap();
    let snaps = narrow::snapshots(&fake).unwrap();
    let snap = snaps.create_snapshot(h.id(), None).await.unwrap();
    fake.write_file(&h, &f, b"changed after").await.unwrap();
    let mut from = CreateRequest::new(sandbox_core::TemplateId::new(snap.id.as_str()).unwrap());
    from.from_snapshot = true;
    let restored = fake.create(from).await.unwrap();
    assert_eq!(fake.read_file(&restored, &f).await.unwrap(), b"kept");
    snaps.delete_snapshot(&snap.id).await.unwrap();
    snaps.delete_snapshot(&snap.id).await.unwrap();
    assert!(fake.snapshot_ids().is_empty());
    let only_owner = fake
        .list(&ListFilter {
            metadata: meta,
            states: vec![],
        })
        .await
        .unwrap();
    assert_eq!(only_owner.len(), 1);
    assert_eq!(&only_owner[0].id, h.id());
}

/// A watcher that never reads is not a growing queue: past the bound its stream ends in
/// `watch_overflow`, after the events it holds.
#[tokio::test]
async fn a_watch_that_falls_behind_ends_in_watch_overflow() {
    use sandbox_core::watch::WATCH_QUEUE_EVENTS;
    let fake = FakeProvider::new();
    let h = fake.create(request()).await.unwrap();
    let dir = SandboxPath::new("/workspace").unwrap();
    let mut events = narrow::watch(&fake)
        .unwrap()
        .watch_dir(&h, &dir, false)
        .await
        .unwrap();
    // Each new file is two events (create, write).
    for i in 0..WATCH_QUEUE_EVENTS {
        let f = dir.join(&format!("f{i}")).unwrap();
        fake.write_file(&h, &f, b"x").await.unwrap();
    }
    let mut delivered = 0;
    let last = loop {
        match events.next_event().await {
            Some(Ok(_)) => delivered += 1,
            Some(Err(e)) => break Some(e),
            None => break None,
        }
    };
    assert_eq!(delivered, WATCH_QUEUE_EVENTS);
    let err = last.expect("the stream ends with an error");
    assert_eq!(err.code(), Some(sandbox_core::ErrorCode::WatchOverflow));
    assert_eq!(err.kind(), ErrorKind::Capacity);
    assert!(events.next_event().await.is_none());
}

/// Background processes die with their sandbox, and an attach then ends.
#[tokio::test]
async fn background_processes_end_with_their_sandbox() {
    use sandbox_core::{ProcessEvent, ProcessSelector, ProcessSpec, ProcessStatus, Signal};
    let fake = FakeProvider::new();
    let h = fake.create(request()).await.unwrap();
    let procs = narrow::processes(&fake).unwrap();
    let info = procs
        .start_process(&h, ProcessSpec::argv("sleep", ["300"]))
        .await
        .unwrap();
    let mut attach = procs
        .attach_process(&h, &ProcessSelector::Pid(info.pid), None)
        .await
        .unwrap();
    fake.delete(h.id()).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), attach.next_event())
        .await
        .unwrap();
    match ended {
        Some(ProcessEvent::Exited(ProcessStatus::Exited {
            exit_code: None,
            signal: Some(Signal::Kill),
        })) => {}
        other => panic!("after the sandbox went: {other:?}"),
    }
    assert!(attach.next_event().await.is_none());
}

/// The ring keeps exactly its size: a reader that asks for the start of a long output gets
/// the gap up to the ring's start, and the ring holds `RING_BYTES`.
#[tokio::test]
async fn the_replay_ring_is_bounded() {
    use sandbox_core::{ProcessEvent, ProcessSelector, ProcessSpec};
    use sandbox_testkit::fake::RING_BYTES;
    let fake = FakeProvider::new();
    let h = fake.create(request()).await.unwrap();
    let file = SandboxPath::new("/workspace/big").unwrap();
    let total = RING_BYTES as usize * 3 + 17;
    fake.write_file(&h, &file, &vec![7_u8; total])
        .await
        .unwrap();
    let procs = narrow::processes(&fake).unwrap();
    let info = procs
        .start_process(&h, ProcessSpec::argv("cat", [file.as_str()]))
        .await
        .unwrap();
    let mut attach = procs
        .attach_process(&h, &ProcessSelector::Pid(info.pid), Some(0))
        .await
        .unwrap();
    let (mut gap, mut bytes) = (None, 0_u64);
    loop {
        match attach.next_event().await {
            Some(ProcessEvent::Gap { from, to }) => gap = Some((from, to)),
            Some(ProcessEvent::Data { data, .. }) => bytes += data.len() as u64,
            Some(ProcessEvent::Exited(_)) | None => break,
            Some(ProcessEvent::Failed(e)) => panic!("{e}"),
        }
    }
    assert_eq!(gap, Some((0, total as u64 - RING_BYTES)));
    assert_eq!(bytes, RING_BYTES);
}

/// `[create.user]` as the fake models it: what names no user runs as the default user and
/// starts in its workdir (created at create); a call's own user and cwd win.
#[tokio::test]
async fn the_default_user_applies_to_what_names_none() {
    use sandbox_core::{ProcessEvent, ProcessSelector, ProcessSpec, SandboxUser};
    let fake = FakeProvider::new();
    let run = |h: sandbox_core::SandboxHandle, request: ExecRequest| {
        let fake = fake.clone();
        async move {
            let r = fake.exec(&h, request).await.unwrap();
            assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
            String::from_utf8(r.stdout).unwrap()
        }
    };
    let plain = fake.create(request()).await.unwrap();
    assert_eq!(
        run(plain.clone(), ExecRequest::argv("id", ["-un"])).await,
        "root\n"
    );
    assert_eq!(
        run(plain, ExecRequest::argv("pwd", [] as [&str; 0])).await,
        "/workspace\n"
    );

    let mut named = request();
    let workdir = SandboxPath::new("/home/agent/work").unwrap();
    named.user = Some(SandboxUser::new("agent", workdir.clone()).unwrap());
    let h = fake.create(named).await.unwrap();
    assert!(fake.stat(&h, &workdir).await.is_ok(), "the workdir exists");
    assert_eq!(
        run(h.clone(), ExecRequest::argv("whoami", [] as [&str; 0])).await,
        "agent\n"
    );
    assert_eq!(
        run(h.clone(), ExecRequest::argv("id", ["-un"])).await,
        "agent\n"
    );
    assert_eq!(
        run(h.clone(), ExecRequest::argv("pwd", [] as [&str; 0])).await,
        "/home/agent/work\n"
    );
    let env = run(h.clone(), ExecRequest::argv("env", [] as [&str; 0])).await;
    assert!(env.contains("HOME=/home/agent\n"), "{env}");
    let mut explicit = ExecRequest::argv("id", ["-un"]);
    explicit.user = Some("root".to_owned());
    assert_eq!(run(h.clone(), explicit).await, "root\n");
    let mut elsewhere = ExecRequest::argv("pwd", [] as [&str; 0]);
    elsewhere.cwd = Some(SandboxPath::new("/workspace").unwrap());
    assert_eq!(run(h.clone(), elsewhere).await, "/workspace\n");

    // A background process too.
    let procs = narrow::processes(&fake).unwrap();
    let info = procs
        .start_process(&h, ProcessSpec::argv("id", ["-un"]))
        .await
        .unwrap();
    let mut attach = procs
        .attach_process(&h, &ProcessSelector::Pid(info.pid), Some(0))
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(event) = attach.next_event().await {
        match event {
            ProcessEvent::Data { data, .. } => out.extend_from_slice(&data),
            ProcessEvent::Exited(_) => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(out, b"agent\n");
}
