//! The session manager over the real Docker adapter (no HTTP): first use creates the container;
//! files, exec and a terminal work; a snapshot seeds a new session; destroy removes the
//! container; a second manager with a fresh store (a restart) adopts the existing container;
//! a really paused container makes terminal open answer "paused" (terminal open is a lookup:
//! without `allow_resume` it never resumes the container).
//!
//! Needs the Docker engine and the `sandbox-busybox:test` image, so ignored in a plain
//! `cargo test`; `cargo xtask test` runs it. Containers are counted by this test's namespace.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{
    BindingKey, ConfigId, CreateRequest, ErrorCode, ExecRequest, ListFilter,
    PermissiveSessionExistence, SandboxPath, SandboxProvider, TemplateId, TerminalEvent,
    TerminalOptions, TimeoutAction, TimeoutPolicy, TreeLimits,
};
use sandbox_provider_docker::{DockerConfig, DockerProvider, NetworkMode, PullPolicy};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
use sandbox_session::manager::SessionManager;
use sandbox_session::memory_store::MemoryBindingStore;

const IMAGE: &str = "sandbox-busybox:test";

async fn docker(namespace: &str) -> sandbox_core::Checked<DockerProvider> {
    let mut c = DockerConfig::new(TemplateId::new(IMAGE).unwrap(), namespace);
    c.enabled = true;
    // The default data plane: the static agent the docker engine stage built.
    c.agent_path = Some(sandbox_testkit::static_agent::agent_bin());
    c.pull_policy = PullPolicy::Never;
    c.network = NetworkMode::None;
    c.idle_sweep = false;
    c.extra_labels
        .insert("sandbox.test".to_owned(), "1".to_owned());
    DockerProvider::connect(c).await.unwrap()
}

fn manager(provider: &DockerProvider, store: MemoryBindingStore) -> SessionManager {
    let mut request = CreateRequest::new(TemplateId::new(IMAGE).unwrap());
    // Docker reclaims idle containers rather than pausing them.
    request.timeout = TimeoutPolicy {
        on_timeout: TimeoutAction::Kill,
        ..TimeoutPolicy::default()
    };
    let config = LifecycleConfig {
        config_id: ConfigId::new("cfg-docker").unwrap(),
        create_request: request,
        requires_inbound_token: false,
    };
    let lifecycle = Lifecycle::new(
        Arc::new(provider.clone()),
        Arc::new(store),
        Arc::new(PermissiveSessionExistence),
        config,
    )
    .unwrap();
    SessionManager::new(lifecycle)
}

async fn containers(provider: &DockerProvider) -> usize {
    provider.list(&ListFilter::default()).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn the_manager_over_docker_end_to_end() {
    let ns = format!("tsess-{:08x}", fastrand::u32(..));
    let provider = docker(&ns).await;
    let m = manager(&provider, MemoryBindingStore::new());
    let key = BindingKey::new(1, "chat-docker").unwrap();

    // Lookup-only operations provision nothing.
    assert!(
        m.list_files(
            &key,
            &SandboxPath::new("/workspace").unwrap(),
            TreeLimits::depth(2)
        )
        .await
        .unwrap()
        .entries
        .is_empty()
    );
    let err = m
        .open_terminal(&key, TerminalOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NoLiveSandbox));
    assert_eq!(containers(&provider).await, 0);

    // First use creates the container; files and exec work through it.
    let file = SandboxPath::new("/workspace/notes/hello.txt").unwrap();
    m.write_file(&key, &file, b"hello from the session")
        .await
        .unwrap();
    assert_eq!(containers(&provider).await, 1);
    let r = m
        .exec(&key, ExecRequest::argv("cat", [file.as_str()]))
        .await
        .unwrap();
    assert_eq!(r.stdout, b"hello from the session");
    let listed = m
        .list_files(
            &key,
            &SandboxPath::new("/workspace").unwrap(),
            TreeLimits::depth(3),
        )
        .await
        .unwrap();
    assert!(listed.entries.iter().any(|e| e.path == file), "{listed:?}");
    let attachment = SandboxPath::new("/workspace/input/data.csv").unwrap();
    m.write_attachment(&key, &attachment, b"a,b\n1,2\n")
        .await
        .unwrap();
    assert!(
        m.write_file(&key, &attachment, b"overwrite").await.is_err(),
        "model writes never land in input"
    );
    assert_eq!(m.read_file(&key, &attachment).await.unwrap(), b"a,b\n1,2\n");

    // A terminal on the live sandbox.
    let mut t = m
        .open_terminal(&key, TerminalOptions::default())
        .await
        .unwrap();
    t.terminal
        .input
        .write(b"echo term\"\"inal-ok\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&seen).contains("terminal-ok") {
        match tokio::time::timeout_at(deadline, t.terminal.output.next_event())
            .await
            .expect("terminal output")
        {
            Some(TerminalEvent::Data(d)) => seen.extend(d),
            other => panic!("terminal ended: {other:?}"),
        }
    }
    t.terminal.input.close().await.unwrap();

    // A really paused container: terminal open answers "paused" without resuming it.
    let bound = m.lifecycle().lookup(&key).await.unwrap().unwrap();
    provider
        .docker()
        .pause_container(bound.id().as_str())
        .await
        .unwrap();
    let err = m
        .open_terminal(&key, TerminalOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SandboxPaused));
    let state = provider.get(bound.id()).await.unwrap();
    assert_eq!(
        state.raw_state, "paused",
        "the refused open must not resume the container"
    );
    // Resume allowed explicitly: connects (unpausing), never creates.
    let t = m
        .open_terminal(
            &key,
            TerminalOptions {
                allow_resume: true,
                ..TerminalOptions::default()
            },
        )
        .await
        .unwrap();
    t.terminal.input.close().await.unwrap();
    assert_eq!(containers(&provider).await, 1);

    // Snapshot → a new session from it sees the file.
    let snapshot = m.snapshot(&key, Some("e2e")).await.unwrap();
    let forked = BindingKey::new(1, "chat-forked").unwrap();
    m.create_from_snapshot(&forked, &snapshot.id).await.unwrap();
    assert_eq!(
        m.read_file(&forked, &file).await.unwrap(),
        b"hello from the session"
    );
    assert_eq!(containers(&provider).await, 2);

    // Restart: a second manager with a fresh store adopts the existing container.
    let restarted = manager(&provider, MemoryBindingStore::new());
    let adopted = restarted.resolve(&key).await.unwrap();
    assert_eq!(
        adopted.id(),
        bound.id(),
        "metadata recovery adopts instead of creating a second"
    );
    assert_eq!(containers(&provider).await, 2);

    // Destroy removes the container (and is idempotent).
    restarted.destroy(&key).await.unwrap();
    restarted.destroy(&key).await.unwrap();
    m.destroy(&forked).await.unwrap();
    assert_eq!(containers(&provider).await, 0);
    sandbox_core::narrow::snapshots(&provider)
        .unwrap()
        .delete_snapshot(&snapshot.id)
        .await
        .unwrap();
}
