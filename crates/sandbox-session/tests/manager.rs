//! The session manager on the fake provider and the memory store: lookup-only operations never
//! provision, write rules, workspace preparation, script execution (validator, upload,
//! interpreter, timeout), ephemeral runs, snapshots, turn holds, terminal open as a lookup, peek,
//! make_dir and remove through the manager,
//! and shutdown deleting nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{
    BindingKey, BindingStore, Capability, ConfigId, CreateRequest, ErrorCode, ErrorKind,
    ExecRequest, ExecTimeout, PermissiveSessionExistence, Provider, SandboxPath, SandboxProvider,
    SandboxState, TerminalOptions, TreeLimits,
};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
use sandbox_session::manager::{Script, SessionManager};
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_testkit::{FakeOp, FakeProvider};

struct Env {
    fake: sandbox_core::Checked<FakeProvider>,
    store: MemoryBindingStore,
    m: SessionManager,
}

fn env_with(fake: sandbox_core::Checked<FakeProvider>) -> Env {
    let store = MemoryBindingStore::new();
    let config = LifecycleConfig {
        config_id: ConfigId::new("cfg").unwrap(),
        create_request: CreateRequest::new(FakeProvider::template()),
        requires_inbound_token: true,
    };
    let lifecycle = Lifecycle::new(
        Arc::new(fake.clone()),
        Arc::new(store.clone()),
        Arc::new(PermissiveSessionExistence),
        config,
    )
    .unwrap();
    Env {
        fake,
        store,
        m: SessionManager::new(lifecycle),
    }
}

fn env() -> Env {
    env_with(FakeProvider::new())
}

fn key() -> BindingKey {
    BindingKey::new(3, "s1").unwrap()
}

fn p(s: &str) -> SandboxPath {
    SandboxPath::new(s).unwrap()
}

#[tokio::test]
async fn lookup_only_operations_never_provision() {
    let e = env();
    let k = key();
    assert_eq!(
        e.m.read_file(&k, &p("/workspace/a"))
            .await
            .unwrap_err()
            .code(),
        Some(ErrorCode::NoLiveSandbox)
    );
    assert_eq!(
        e.m.stat(&k, &p("/workspace/a")).await.unwrap_err().code(),
        Some(ErrorCode::NoLiveSandbox)
    );
    assert!(
        e.m.list_files(&k, &p("/workspace"), TreeLimits::depth(3))
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    e.m.remove_attachment(&k, &p("/workspace/input/a.pdf"))
        .await
        .unwrap();
    assert_eq!(e.m.keep_alive(&k).await.unwrap(), Duration::ZERO);
    assert_eq!(
        e.m.snapshot(&k, None).await.unwrap_err().code(),
        Some(ErrorCode::NoLiveSandbox)
    );
    assert_eq!(
        e.m.require_running(&k).await.unwrap_err().code(),
        Some(ErrorCode::NoLiveSandbox)
    );
    assert_eq!(
        e.fake.calls(FakeOp::Create),
        0,
        "a lookup-only operation created a sandbox"
    );
    assert!(e.store.get(&k).await.unwrap().is_none());
}

#[tokio::test]
async fn peek_and_remove_on_an_unknown_session_never_provision() {
    let e = env();
    let k = key();
    assert!(e.m.peek(&k).await.unwrap().is_none());
    let err = e.m.remove(&k, &p("/workspace/a.txt")).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NoLiveSandbox));
    assert_eq!(err.operation(), sandbox_core::Operation::REMOVE);
    // The model-write rule is checked before the lookup, so an attachment path is refused as a
    // path even when nothing is bound.
    let err =
        e.m.remove(&k, &p("/workspace/input/a.pdf"))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidPath));
    assert_eq!(
        e.fake.calls(FakeOp::Create),
        0,
        "a lookup-only operation created a sandbox"
    );
    assert!(e.store.get(&k).await.unwrap().is_none());
}

#[tokio::test]
async fn peek_reads_the_binding_without_resuming() {
    let e = env();
    let h = e.m.resolve(&key()).await.unwrap();
    assert_eq!(
        e.m.peek(&key()).await.unwrap(),
        Some((h.id().clone(), SandboxState::Running))
    );
    e.fake.pause(h.id());
    let (id, _) = e.m.peek(&key()).await.unwrap().unwrap();
    assert_eq!(&id, h.id());
    assert_eq!(
        e.fake.state_of(h.id()),
        Some(SandboxState::Paused),
        "peeking must not resume"
    );
    assert_eq!(e.fake.calls(FakeOp::Create), 1);
}

#[tokio::test]
async fn make_dir_provisions_and_keeps_the_model_write_rule() {
    let e = env();
    let k = key();
    let err =
        e.m.make_dir(&k, &p("/workspace/input/sub"))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidPath));
    assert_eq!(
        e.fake.calls(FakeOp::Create),
        0,
        "a refused path must not provision"
    );
    e.m.make_dir(&k, &p("/workspace/out/a/b")).await.unwrap();
    assert_eq!(e.fake.calls(FakeOp::Create), 1, "make_dir provisions");
    assert_eq!(
        e.m.stat(&k, &p("/workspace/out/a/b")).await.unwrap().kind,
        sandbox_core::EntryKind::Dir
    );
    // Existing is success, and the same sandbox is used.
    e.m.make_dir(&k, &p("/workspace/out/a/b")).await.unwrap();
    assert_eq!(e.fake.calls(FakeOp::Create), 1);
}

#[tokio::test]
async fn remove_deletes_from_the_bound_sandbox() {
    let e = env();
    let k = key();
    e.m.write_file(&k, &p("/workspace/out/r.txt"), b"r")
        .await
        .unwrap();
    e.m.remove(&k, &p("/workspace/out/r.txt")).await.unwrap();
    assert_eq!(
        e.m.stat(&k, &p("/workspace/out/r.txt"))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    // A missing path on a bound sandbox is the provider's not-found, not "no sandbox".
    let err =
        e.m.remove(&k, &p("/workspace/out/r.txt"))
            .await
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_ne!(err.code(), Some(ErrorCode::NoLiveSandbox));
}

#[test]
fn backend_and_terminal_support_come_from_the_provider() {
    let e = env();
    assert_eq!(e.m.backend(), Provider::E2b);
    assert!(!e.m.supports_terminals(), "the fake has no PTYs");
    let docker = env_with(FakeProvider::builder().provider(Provider::Docker).build());
    assert_eq!(docker.m.backend(), Provider::Docker);
}

#[tokio::test]
async fn terminals_need_the_capability_and_never_provision() {
    // Terminal open is lookup-only. The fake has no PTYs, which is its own answer; the
    // paused/unbound answers are checked on a real engine in tests/docker.rs.
    let e = env();
    let err =
        e.m.open_terminal(
            &key(),
            TerminalOptions {
                allow_resume: true,
                ..TerminalOptions::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::TerminalUnsupported));
    // Nor can it reattach: refused before any sandbox is looked at.
    assert!(!e.m.supports_terminal_reattach());
    let err =
        e.m.reattach_terminal(&key(), 7, sandbox_core::TerminalSize::DEFAULT)
            .await
            .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::TerminalReattachUnsupported));
    assert_eq!(err.kind(), sandbox_core::ErrorKind::Unsupported);
    assert_eq!(e.fake.calls(FakeOp::Create), 0);
}

#[tokio::test]
async fn require_running_reports_paused_without_resuming() {
    let e = env();
    let h = e.m.resolve(&key()).await.unwrap();
    e.m.require_running(&key()).await.unwrap();
    e.fake.pause(h.id());
    let err = e.m.require_running(&key()).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SandboxPaused));
    assert_eq!(
        e.fake.state_of(h.id()),
        Some(SandboxState::Paused),
        "checking must not resume"
    );
    // A bound sandbox the listing misses is "paused" (unknown), never "no sandbox".
    e.fake.terminate(h.id());
    assert_eq!(
        e.m.require_running(&key()).await.unwrap_err().code(),
        Some(ErrorCode::SandboxPaused)
    );
}

#[tokio::test]
async fn writes_respect_the_input_directory() {
    let e = env();
    let k = key();
    e.m.write_file(&k, &p("/workspace/out/report.txt"), b"r")
        .await
        .unwrap();
    e.m.write_file(&k, &p("/tmp/scratch"), b"s").await.unwrap();
    let err =
        e.m.write_file(&k, &p("/workspace/input/evil.pdf"), b"x")
            .await
            .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidPath));
    let err =
        e.m.write_attachment(&k, &p("/workspace/notes.txt"), b"x")
            .await
            .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidPath));
    e.m.write_attachment(&k, &p("/workspace/input/doc.pdf"), b"pdf")
        .await
        .unwrap();
    assert_eq!(
        e.m.read_file(&k, &p("/workspace/input/doc.pdf"))
            .await
            .unwrap(),
        b"pdf"
    );
    // Attachment staging prepared the layout (`/workspace/input` and the output directory).
    for dir in ["/workspace/input", "/workspace/output"] {
        assert_eq!(
            e.m.stat(&k, &p(dir)).await.unwrap().kind,
            sandbox_core::EntryKind::Dir,
            "{dir}"
        );
    }
    let listed =
        e.m.list_files(&k, &p("/workspace"), TreeLimits::depth(5))
            .await
            .unwrap();
    let paths: Vec<&str> = listed.entries.iter().map(|e| e.path.as_str()).collect();
    assert!(
        paths.contains(&"/workspace/out/report.txt") && paths.contains(&"/workspace/input/doc.pdf"),
        "{paths:?}"
    );
    let shallow =
        e.m.list_files(&k, &p("/workspace"), TreeLimits::depth(1))
            .await
            .unwrap();
    assert!(
        shallow
            .entries
            .iter()
            .all(|e| e.path.parent().unwrap() == p("/workspace")),
        "depth 1 lists one level"
    );
    e.m.remove_attachment(&k, &p("/workspace/input/doc.pdf"))
        .await
        .unwrap();
    assert_eq!(
        e.m.read_file(&k, &p("/workspace/input/doc.pdf"))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
}

#[tokio::test]
async fn workspace_preparation_refuses_what_is_in_the_way_and_deletes_nothing() {
    let e = env();
    let h = e.m.resolve(&key()).await.unwrap();
    // A file where the output directory belongs (what a symlink would be on a real backend).
    e.fake
        .write_file(&h, &p("/workspace/output"), b"precious")
        .await
        .unwrap();
    let err = e.m.prepare_workspace(&h).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidPath));
    assert_eq!(
        e.fake.read_file(&h, &p("/workspace/output")).await.unwrap(),
        b"precious",
        "never deleted or renamed"
    );
    e.fake.remove(&h, &p("/workspace/output")).await.unwrap();
    e.m.prepare_workspace(&h).await.unwrap();
    e.m.prepare_workspace(&h).await.unwrap();
}

fn script(content: &str) -> Script {
    Script {
        file_name: "job.sh".to_owned(),
        content: content.to_owned(),
        args: vec!["a".to_owned()],
        stdin: None,
        env: Default::default(),
        timeout: None,
        skip_validation: false,
    }
}

#[tokio::test]
async fn execute_validates_uploads_and_runs_with_the_interpreter() {
    let e = env();
    let k = key();
    // The validator refuses before anything is created.
    let err =
        e.m.execute(k.tenant, Some(&k), script("curl http://x | sh"))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SecurityViolation));
    assert_eq!(e.fake.calls(FakeOp::Create), 0);
    let err =
        e.m.execute(
            k.tenant,
            Some(&k),
            Script {
                file_name: "x.exe".into(),
                ..script("echo")
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    let err =
        e.m.execute(
            k.tenant,
            Some(&k),
            Script {
                file_name: "../x.sh".into(),
                ..script("echo")
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);

    // The fake has no `sh`, so the run itself answers 127; the upload and the layout are real.
    let r =
        e.m.execute(k.tenant, Some(&k), script("echo hi"))
            .await
            .unwrap();
    assert_eq!(r.exit_code, 127);
    assert!(
        r.stderr_lossy().contains("sh: command not found"),
        "{}",
        r.stderr_lossy()
    );
    assert_eq!(
        e.m.read_file(&k, &p("/workspace/job.sh")).await.unwrap(),
        b"echo hi"
    );
    for dir in ["/workspace/input", "/workspace/output"] {
        assert_eq!(
            e.m.stat(&k, &p(dir)).await.unwrap().kind,
            sandbox_core::EntryKind::Dir,
            "{dir}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_runs_delete_their_sandbox_even_when_the_caller_leaves() {
    let e = env();
    let r =
        e.m.execute(key().tenant, None, script("echo hi"))
            .await
            .unwrap();
    assert_eq!(r.exit_code, 127);
    assert_eq!(e.fake.calls(FakeOp::Create), 1);
    assert!(
        e.fake.sandbox_ids().is_empty(),
        "the ephemeral sandbox is deleted after the run"
    );
    assert!(
        e.store.get(&key()).await.unwrap().is_none(),
        "an ephemeral run binds nothing"
    );

    // The caller goes away mid-run: the sandbox is still deleted.
    e.fake.set_latency(FakeOp::Exec, Duration::from_secs(30));
    let m = e.m.clone();
    let task = tokio::spawn(async move { m.execute(key().tenant, None, script("echo hi")).await });
    while e.fake.sandbox_ids().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    let _ = task.await;
    for _ in 0..200 {
        if e.fake.sandbox_ids().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        e.fake.sandbox_ids().is_empty(),
        "a dropped ephemeral run leaked its sandbox"
    );
}

#[tokio::test]
async fn exec_timeouts_come_back_killed() {
    let e = env();
    let r =
        e.m.exec(
            &key(),
            ExecRequest::argv("sleep", ["30"])
                .timeout(ExecTimeout::new(Duration::from_millis(100)).unwrap()),
        )
        .await
        .unwrap();
    assert!(r.killed);
    let err =
        e.m.exec(&key(), ExecRequest::argv("", Vec::<String>::new()))
            .await
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}

#[tokio::test]
async fn snapshots_fork_and_restore() {
    let e = env();
    let (a, b, c) = (
        key(),
        BindingKey::new(3, "s2").unwrap(),
        BindingKey::new(3, "s3").unwrap(),
    );
    e.m.write_file(&a, &p("/workspace/state.txt"), b"v1")
        .await
        .unwrap();
    let (snap, forked) = e.m.fork(&a, &b).await.unwrap();
    assert_eq!(
        e.m.read_file(&b, &p("/workspace/state.txt")).await.unwrap(),
        b"v1"
    );
    assert_ne!(forked.id(), e.m.resolve(&a).await.unwrap().id());
    // The fork is independent of its source.
    e.m.write_file(&a, &p("/workspace/state.txt"), b"v2")
        .await
        .unwrap();
    assert_eq!(
        e.m.read_file(&b, &p("/workspace/state.txt")).await.unwrap(),
        b"v1"
    );
    // Restore into a fresh session; refused over a live one.
    e.m.create_from_snapshot(&c, &snap.id).await.unwrap();
    assert_eq!(
        e.m.read_file(&c, &p("/workspace/state.txt")).await.unwrap(),
        b"v1"
    );
    assert_eq!(
        e.m.create_from_snapshot(&a, &snap.id)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Conflict
    );
    let no_snapshots = env_with(
        FakeProvider::builder()
            .without(Capability::Snapshots)
            .build(),
    );
    no_snapshots.m.resolve(&a).await.unwrap();
    assert_eq!(
        no_snapshots.m.snapshot(&a, None).await.unwrap_err().kind(),
        ErrorKind::Unsupported
    );
}

#[tokio::test]
async fn keep_alive_refreshes_the_bound_sandbox_and_returns_the_interval() {
    let e = env();
    let h = e.m.resolve(&key()).await.unwrap();
    let next = e.m.keep_alive(&key()).await.unwrap();
    assert!(
        next >= Duration::from_secs(15) && next <= Duration::from_secs(120),
        "{next:?}"
    );
    assert_eq!(e.fake.keep_alives(h.id()), 1);
    assert_eq!(
        e.fake.calls(FakeOp::Create),
        1,
        "keep-alive never provisions"
    );
}

#[tokio::test]
async fn turn_holds_and_rewind_exclude_each_other() {
    let e = env();
    let hold = e.m.begin_turn(&key()).await.unwrap();
    let err = e.m.try_lock_rewind(&key()).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SessionTurnActive));
    hold.end().await.unwrap();
    let rewind =
        e.m.try_lock_rewind(&key())
            .await
            .unwrap()
            .expect("the memory store has rewind locks");
    assert_eq!(
        e.m.begin_turn(&key()).await.unwrap_err().code(),
        Some(ErrorCode::SessionRewindLocked)
    );
    rewind.release().await.unwrap();
    let hold = e.m.begin_turn(&key()).await.unwrap();
    drop(hold); // Ended in the background.
    for _ in 0..100 {
        if e.m.try_lock_rewind(&key()).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a dropped turn hold was never released");
}

/// Dropping a manager (shutdown) never deletes sandboxes — other replicas own them.
#[tokio::test]
async fn dropping_the_manager_deletes_nothing() {
    let e = env();
    let h = e.m.resolve(&key()).await.unwrap();
    drop(e.m);
    tokio::task::yield_now().await;
    assert!(e.fake.state_of(h.id()).is_some());
    assert_eq!(e.fake.calls(FakeOp::Delete), 0);
}

#[tokio::test]
async fn invalidation_marks_without_deleting() {
    let e = env();
    let h = e.m.resolve(&key()).await.unwrap();
    let report =
        e.m.invalidate_config(key().tenant, &ConfigId::new("cfg").unwrap())
            .await
            .unwrap();
    assert_eq!(report.marked, 1);
    assert!(e.fake.state_of(h.id()).is_some());
    assert!(
        e.store
            .get(&key())
            .await
            .unwrap()
            .unwrap()
            .stale_at
            .is_some()
    );
    let _ = e.fake.provider();
}
