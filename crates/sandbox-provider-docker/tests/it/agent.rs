//! Agent mode on the real engine: the agent copied into every created container and run as its
//! PID 1 (network `none`), a restore from a snapshot getting a fresh agent over the one the
//! snapshot carried, and the start refusing a missing, dynamic or mismatched agent.
//!
//! They need the engine, the `sandbox-busybox:test` image and the static agent, whose path the
//! pipeline's docker engine stage passes as `SANDBOX_AGENT_BIN` (`cargo xtask agent` builds it
//! and prints it). Without the variable the tests fail, naming it: they never skip.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;

use std::path::PathBuf;

use bollard::query_parameters::InspectContainerOptions;
use sandbox_core::{
    CreateRequest, ErrorCode, ErrorKind, ExecRequest, ListFilter, SandboxHandle, SandboxPath,
    SandboxProvider, SandboxUser, Snapshots, TemplateId,
};
use sandbox_provider_docker::agent::{self, AgentBinary};
use sandbox_provider_docker::{DataPlane, DockerConfig, DockerProvider};

use support::{IMAGE, config, engine_sh, exec_config, namespace};

use support::agent_bin;

fn agent_config(ns: &str, path: PathBuf) -> DockerConfig {
    let mut c = config(ns);
    c.data_plane = DataPlane::Agent;
    c.agent_path = Some(path);
    c
}

async fn provider(ns: &str) -> sandbox_core::Checked<DockerProvider> {
    DockerProvider::connect(agent_config(ns, agent_bin()))
        .await
        .expect("connect in agent mode")
}

async fn cleanup(p: &DockerProvider) {
    for s in p.list(&ListFilter::default()).await.unwrap_or_default() {
        let _ = p.delete(&s.id).await;
    }
}

async fn sh(p: &DockerProvider, h: &SandboxHandle, script: &str) -> String {
    let r = p.exec(h, ExecRequest::shell(script)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{script}: {}", r.stderr_lossy());
    r.stdout_lossy().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn the_agent_is_pid_1_of_a_sandbox_without_network() {
    let ns = namespace("agt");
    let p = provider(&ns).await;
    assert_eq!(p.data_plane(), DataPlane::Agent);
    let size = p.agent().unwrap().bytes().len();
    let h = p
        .create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap();

    assert_eq!(sh(&p, &h, "readlink /proc/1/exe").await, agent::AGENT_PATH);
    let cmdline = sh(&p, &h, "tr '\\000' ' ' < /proc/1/cmdline").await;
    // The image sets no environment besides PATH; the cap is the default setting's.
    let expected = agent::entrypoint_with_env(
        &std::collections::BTreeMap::new(),
        sandbox_provider_docker::config::DEFAULT_PROCESSES_PER_SANDBOX,
        None,
    );
    assert_eq!(cmdline, expected.join(" "));
    assert_eq!(sh(&p, &h, "stat -c '%a %u' /.sandbox").await, "755 0");
    assert_eq!(
        sh(&p, &h, "stat -c '%a %u %s' /.sandbox/sandbox-agent").await,
        format!("755 0 {size}")
    );
    // The bytes are the checked agent's.
    let inside = sh(&p, &h, "cat /.sandbox/sandbox-agent | wc -c").await;
    assert_eq!(inside, size.to_string());
    // The idle marker exists from the start and any account can touch it.
    assert_eq!(
        sh(&p, &h, "stat -c %a /var/lib/sandbox-activity").await,
        "666"
    );
    // Exec still goes through the engine, and works beside the agent.
    assert_eq!(sh(&p, &h, "echo through exec").await, "through exec");
    // The file API refuses the agent's directory.
    let path = SandboxPath::new(agent::AGENT_PATH).unwrap();
    let err = p.write_file(&h, &path, b"replaced").await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidPath), "{err}");
    let err = p.read_file(&h, &path).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidPath), "{err}");

    let inspect = p
        .docker()
        .inspect_container(h.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let host = inspect.host_config.unwrap();
    assert_eq!(
        host.init,
        Some(false),
        "the agent is PID 1, not the engine's init"
    );
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    let logs = host.log_config.unwrap();
    assert_eq!(logs.typ.as_deref(), Some("json-file"));
    let opts = logs.config.unwrap();
    assert_eq!(
        opts.get("max-size").map(String::as_str),
        Some("1048576"),
        "the agent's log is bounded: {opts:?}"
    );
    assert_eq!(opts.get("max-file").map(String::as_str), Some("1"));
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_restore_gets_a_fresh_agent_over_the_one_its_snapshot_carried() {
    let ns = namespace("agr");
    let p = provider(&ns).await;
    let size = p.agent().unwrap().bytes().len();
    let src = p
        .create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap();
    // Code in the sandbox replaces the agent's file (the running binary can be unlinked, not
    // written) and the marker; the snapshot carries both.
    sh(
        &p,
        &src,
        "rm -f /.sandbox/sandbox-agent && echo planted > /.sandbox/sandbox-agent && \
         chmod 755 /.sandbox/sandbox-agent && touch -d '2001-01-01' /var/lib/sandbox-activity",
    )
    .await;
    assert_eq!(sh(&p, &src, "cat /.sandbox/sandbox-agent").await, "planted");
    let snap = p.create_snapshot(src.id(), Some("agent")).await.unwrap();
    let mut restore = CreateRequest::new(TemplateId::new(snap.id.as_str()).unwrap());
    restore.from_snapshot = true;
    let restored = p.create(restore).await.unwrap();
    assert_eq!(
        sh(&p, &restored, "stat -c %s /.sandbox/sandbox-agent").await,
        size.to_string(),
        "the planted file was replaced by the current agent"
    );
    assert_eq!(
        sh(&p, &restored, "readlink /proc/1/exe").await,
        agent::AGENT_PATH
    );
    let year = sh(&p, &restored, "date -r /var/lib/sandbox-activity +%Y").await;
    assert_ne!(year, "2001", "a restore starts with a fresh idle marker");
    cleanup(&p).await;
    p.delete_snapshot(&snap.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn agent_mode_refuses_to_start_without_a_usable_agent() {
    let ns = namespace("agf");
    let refused = |what: &str, err: sandbox_core::Error| {
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{what}: {err}");
        assert_eq!(
            err.code(),
            Some(ErrorCode::ConfigIncomplete),
            "{what}: {err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("cargo xtask agent") && text.contains("docker.agent_path"),
            "{what}: the refusal names the fix: {text}"
        );
        text
    };
    let missing = DockerProvider::connect(agent_config(&ns, "/nonexistent/sandbox-agent".into()))
        .await
        .unwrap_err();
    assert!(refused("missing", missing).contains("there is no agent"));
    // The host's /bin/true is dynamically linked.
    let dynamic = DockerProvider::connect(agent_config(&ns, "/bin/true".into()))
        .await
        .unwrap_err();
    assert!(refused("dynamic", dynamic).contains("dynamically linked"));
    // A static executable that is not this agent: busybox answers --version with no version
    // (its applet is named by the file name, which is `sandbox-agent` here).
    let dir = std::env::temp_dir().join(format!("sbx-agent-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let impostor = dir.join("sandbox-agent");
    std::fs::copy("/bin/busybox", &impostor).unwrap();
    let other = DockerProvider::connect(agent_config(&ns, impostor.clone()))
        .await
        .unwrap_err();
    assert!(refused("not the agent", other).contains("--version"));
    std::fs::remove_dir_all(&dir).unwrap();
    // The real agent, held to another version.
    let real = agent_bin();
    let mismatch = AgentBinary::load_expecting(&real, "0.0.0-other")
        .await
        .unwrap_err();
    let text = refused("another version", mismatch);
    assert!(
        text.contains(&format!("is version {}", agent::VERSION))
            && text.contains("this service is 0.0.0-other"),
        "{text}"
    );
    // And at its own version it loads, never switching modes behind the operator's back.
    let p = provider(&ns).await;
    assert_eq!(p.data_plane(), DataPlane::Agent);
    assert_eq!(p.agent().unwrap().version(), agent::VERSION);
    assert_eq!(p.agent().unwrap().path(), real.as_path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_stopped_sandbox_restarts_with_the_current_agent() {
    let ns = namespace("ags");
    let p = provider(&ns).await;
    let size = p.agent().unwrap().bytes().len();
    let h = p
        .create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap();
    // Without the fresh copy, the restart would exec this file as PID 1 and the container
    // would exit at once.
    sh(
        &p,
        &h,
        "rm -f /.sandbox/sandbox-agent && echo planted > /.sandbox/sandbox-agent && \
         chmod 755 /.sandbox/sandbox-agent",
    )
    .await;
    p.docker()
        .stop_container(
            h.id().as_str(),
            None::<bollard::query_parameters::StopContainerOptions>,
        )
        .await
        .unwrap();
    // The next exec finds the container stopped and starts it again.
    assert_eq!(sh(&p, &h, "readlink /proc/1/exe").await, agent::AGENT_PATH);
    assert_eq!(
        sh(&p, &h, "stat -c %s /.sandbox/sandbox-agent").await,
        size.to_string()
    );
    cleanup(&p).await;
}

/// The two halves of agent mode meet: a sandbox the provider created (the default busybox
/// image, which has no `/etc/passwd`: the agent's built-in root serves it) answers through the
/// kept channel on the socket its entrypoint names, as root, with the activity marker touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_created_sandbox_answers_through_the_channel() {
    let ns = namespace("agc");
    let p = provider(&ns).await;
    let h = p
        .create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap();
    // An old marker, so the channel's touch is visible. Set through the engine, not through
    // the agent: a command through the agent is a request it serves, and its touches are
    // throttled, so the one to observe must be the first.
    engine_sh(
        &p,
        &h,
        "touch -d '2000-01-01 00:00:00' /var/lib/sandbox-activity",
    )
    .await;
    let channel = p.channel(h.id().as_str()).expect("agent mode has channels");
    // One channel per container: asking again hands out the same one.
    assert!(std::sync::Arc::ptr_eq(
        &channel,
        &p.channel(h.id().as_str()).unwrap()
    ));
    let lease = crate::channel::first_lease(&channel).await;
    let (out, code) = crate::channel::run(&lease, "/bin/sh", &["-c", "id -u; echo $HOME"]).await;
    assert_eq!((out.as_str(), code), ("0\n/\n", 0));
    drop(lease);
    assert_eq!(channel.execs_opened(), 1);
    // The touch runs off the request's path: give it a moment.
    let mut year = String::new();
    for _ in 0..40 {
        year = engine_sh(&p, &h, "date -r /var/lib/sandbox-activity +%Y").await;
        if year != "2000" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_ne!(
        year, "2000",
        "serving through the channel touches the marker"
    );
    // Exec mode has no channels at all.
    let exec_mode = DockerProvider::connect(exec_config(&ns)).await.unwrap();
    assert_eq!(exec_mode.data_plane(), DataPlane::Exec);
    assert!(exec_mode.channel(h.id().as_str()).is_none());
    // And keeps the engine's init as PID 1.
    let plain = exec_mode
        .create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap();
    let inspect = exec_mode
        .docker()
        .inspect_container(plain.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap();
    assert_eq!(inspect.host_config.and_then(|h| h.init), Some(true));
    cleanup(&p).await;
}

/// `[create.user]` on the agent plane: the agent is started with the user and its workdir,
/// which is the container's working directory too (made by the engine). Before the image has
/// the account, a call naming no user fails naming it (the agent resolves accounts per call;
/// the error is the agent's `unauthenticated`, so its kind is `authentication`); once it has
/// it, commands and file writes naming no user act as it, in its workdir, also after the
/// container was stopped and started again (the same entrypoint runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn the_default_user_holds_for_commands_and_files_across_a_restart() {
    let ns = namespace("agu");
    let p = provider(&ns).await;
    let workdir = SandboxPath::new("/home/nobody").unwrap();
    let mut request = CreateRequest::new(TemplateId::new(IMAGE).unwrap());
    request.user = Some(SandboxUser::new("nobody", workdir.clone()).unwrap());
    let h = p.create(request).await.unwrap();
    let inspect = p
        .docker()
        .inspect_container(h.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let config = inspect.config.unwrap();
    assert_eq!(config.working_dir.as_deref(), Some(workdir.as_str()));
    let entrypoint = config.entrypoint.unwrap().join(" ");
    assert!(
        entrypoint.contains("--default-user nobody --default-workdir /home/nobody"),
        "{entrypoint}"
    );

    // The busybox image has no /etc/passwd: nobody is unknown, and each call says so.
    let err = p
        .exec(&h, ExecRequest::argv("true", Vec::<String>::new()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Authentication, "{err}");
    assert!(
        err.message().contains("invalid default user: 'nobody'"),
        "{err}"
    );
    let mut provision = ExecRequest::shell(
        "echo 'root:x:0:0:root:/:/bin/sh' > /etc/passwd; \
         echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >> /etc/passwd; \
         printf 'root:x:0:\\nnogroup:x:65534:\\n' > /etc/group; \
         mkdir -p /shared && chmod 777 /shared",
    );
    provision.user = Some("root".to_owned());
    let r = p.exec(&h, provision).await.unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr_lossy());

    let check = |label: &'static str| {
        let p = &p;
        let h = &h;
        async move {
            assert_eq!(
                sh(p, h, "id -un; pwd").await,
                "nobody\n/home/nobody",
                "{label}"
            );
            let file = SandboxPath::new(&format!("/shared/{label}")).unwrap();
            p.write_file(h, &file, b"x").await.unwrap();
            let owner = sh(p, h, &format!("stat -c %U {file}")).await;
            assert_eq!(owner, "nobody", "{label}: a file written naming no user");
            // A call naming root still runs as root.
            let mut as_root = ExecRequest::shell("id -un");
            as_root.user = Some("root".to_owned());
            let r = p.exec(h, as_root).await.unwrap();
            assert_eq!(r.stdout_lossy(), "root\n", "{label}");
        }
    };
    check("created").await;
    p.docker()
        .stop_container(
            h.id().as_str(),
            None::<bollard::query_parameters::StopContainerOptions>,
        )
        .await
        .unwrap();
    // The next call starts it again, with the same entrypoint.
    check("restarted").await;
    cleanup(&p).await;
}
