//! The agent channel on real parts: a `sandbox-busybox:test` container (network `none`) whose
//! entrypoint is the static agent (`SANDBOX_AGENT_BIN`, uploaded through the archive endpoint)
//! listening on `/.sandbox/agent.sock`, reached through `channel::Channel`.
//!
//! The adapter's bollard client talks to the engine through a counting proxy (a unix socket in
//! front of the engine's), so the tests see every `POST /containers/{id}/exec`: a command
//! through the channel must not make one.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test module: a failed unwrap is a failed test.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{CreateContainerOptions, UploadToContainerOptions};
use futures_util::StreamExt;
use sandbox_core::{ErrorCode, ErrorKind};
use sandbox_envd::process::process_event::Event;
use sandbox_envd::process::process_event::data_event::Output;
use sandbox_envd::process::{ProcessConfig, StartRequest};
use sandbox_provider_docker::channel::{
    AGENT_PATH, AGENT_SOCKET, Channel, ChannelConfig, ChannelObserver, Channels, Lease, OpenReason,
};
use sandbox_transport::envd::CallOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::support::IMAGE;

const ENGINE_SOCKET: &str = "/var/run/docker.sock";

/// Kills every relay in the container (busybox has no `pkill`). The scanning shell's own
/// command line holds the pattern, but not at its start, so it never matches itself.
const KILL_RELAY: &str = "for d in /proc/[0-9]*; do \
     if tr '\\000' ' ' < \"$d/cmdline\" 2>/dev/null | grep -q '^/.sandbox/sandbox-agent relay'; then \
     kill -9 \"${d#/proc/}\"; fi; done";

pub(crate) use crate::support::agent_bin as agent_binary;

/// A unix socket in front of the engine's that counts exec creations (`POST
/// /v*/containers/<id>/exec`). Request heads are read off each connection's client side until
/// the connection is hijacked (an exec start), after which bytes only pass through. Shared with
/// `agent_exec` and `agent_files`, whose providers reach the engine through it
/// (`DockerConfig.host`).
pub(crate) struct CountingProxy {
    pub(crate) path: PathBuf,
    exec_creates: Arc<AtomicUsize>,
    inspects: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
}

impl CountingProxy {
    pub(crate) async fn start() -> CountingProxy {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let exec_creates = Arc::new(AtomicUsize::new(0));
        let inspects = Arc::new(AtomicUsize::new(0));
        let counts = (Arc::clone(&exec_creates), Arc::clone(&inspects));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counts = (Arc::clone(&counts.0), Arc::clone(&counts.1));
                tokio::spawn(async move {
                    let Ok(engine) = UnixStream::connect(ENGINE_SOCKET).await else {
                        return;
                    };
                    proxy(client, engine, counts).await;
                });
            }
        });
        CountingProxy {
            path,
            exec_creates,
            inspects,
            _dir: dir,
        }
    }

    pub(crate) fn exec_creates(&self) -> usize {
        self.exec_creates.load(Ordering::SeqCst)
    }

    /// Container inspects (`GET /containers/<id>/json`) the engine was asked for.
    pub(crate) fn inspects(&self) -> usize {
        self.inspects.load(Ordering::SeqCst)
    }

    /// The proxy's socket.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    async fn docker(&self) -> Docker {
        Docker::connect_with_unix(
            self.path.to_str().unwrap(),
            120,
            bollard::API_DEFAULT_VERSION,
        )
        .unwrap()
        .negotiate_version()
        .await
        .unwrap()
    }
}

async fn proxy(
    client: UnixStream,
    engine: UnixStream,
    (count, inspects): (Arc<AtomicUsize>, Arc<AtomicUsize>),
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut engine_read, mut engine_write) = engine.into_split();
    let up = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut hijacked = false;
        loop {
            let n = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !hijacked {
                // bollard writes each request head in one piece.
                let text = String::from_utf8_lossy(&buffer[..n]);
                for line in text.split("\r\n") {
                    let mut words = line.split(' ');
                    let (Some(method), Some(path)) = (words.next(), words.next()) else {
                        continue;
                    };
                    // `/v1.47/containers/<id>/exec`, or unversioned.
                    let path = path.split('?').next().unwrap_or("");
                    let mut parts: Vec<&str> = path.split('/').skip(1).collect();
                    if parts.first().is_some_and(|p| p.starts_with('v')) {
                        parts.remove(0);
                    }
                    match (method, parts.as_slice()) {
                        ("POST", ["containers", _, "exec"]) => {
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        ("GET", ["containers", _, "json"]) => {
                            inspects.fetch_add(1, Ordering::SeqCst);
                        }
                        ("POST", ["exec", _, "start"]) => hijacked = true,
                        _ => {}
                    }
                }
            }
            if engine_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
        let _ = engine_write.shutdown().await;
    };
    let down = async move {
        let _ = tokio::io::copy(&mut engine_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(up, down);
}

/// A container whose entrypoint is the agent on its unix socket; removed on drop.
struct AgentContainer {
    id: String,
}

impl Drop for AgentContainer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.id])
            .output();
    }
}

/// A tar of `/.sandbox/` (its directory entry, the agent, account files for root).
fn agent_tar(agent: &Path) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o700);
    dir.set_size(0);
    tar.append_data(&mut dir, ".sandbox/", std::io::empty())
        .unwrap();
    let mut file = |name: &str, mode: u32, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        tar.append_data(&mut h, name, data).unwrap();
    };
    file(
        ".sandbox/sandbox-agent",
        0o755,
        &std::fs::read(agent).unwrap(),
    );
    file(".sandbox/passwd", 0o644, b"root:x:0:0:root:/:/bin/sh\n");
    file(".sandbox/group", 0o644, b"root:x:0:\n");
    tar.into_inner().unwrap()
}

impl AgentContainer {
    /// Created through `docker` (the engine's own socket: setup is not what is counted).
    async fn start(docker: &Docker) -> AgentContainer {
        let agent = [
            AGENT_PATH,
            "--listen-unix",
            AGENT_SOCKET,
            "--activity-marker",
            "/.sandbox/activity",
            "--passwd",
            "/.sandbox/passwd",
            "--group",
            "/.sandbox/group",
            "--default-workdir",
            "/",
        ];
        AgentContainer::start_with(docker, &agent).await
    }

    /// The agent's files are in place, but `entrypoint` runs instead of it.
    async fn start_with(docker: &Docker, entrypoint: &[&str]) -> AgentContainer {
        let name = format!("sbx-channel-test-{:08x}", fastrand::u32(..));
        let body = ContainerCreateBody {
            image: Some(IMAGE.to_owned()),
            user: Some("0".to_owned()),
            entrypoint: Some(entrypoint.iter().map(|s| (*s).to_owned()).collect()),
            cmd: Some(Vec::new()),
            labels: Some([("sandbox.test".to_owned(), "1".to_owned())].into()),
            host_config: Some(HostConfig {
                network_mode: Some("none".to_owned()),
                init: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name),
                    ..Default::default()
                }),
                body,
            )
            .await
            .unwrap();
        let container = AgentContainer { id: created.id };
        let tar = agent_tar(&agent_binary());
        docker
            .upload_to_container(
                &container.id,
                Some(UploadToContainerOptions {
                    path: "/".to_owned(),
                    ..Default::default()
                }),
                bollard::body_full(tar.into()),
            )
            .await
            .unwrap();
        docker.start_container(&container.id, None).await.unwrap();
        container
    }
}

/// The engine's own socket (for setup, pause and the comparison's raw execs).
async fn engine() -> Docker {
    Docker::connect_with_unix(ENGINE_SOCKET, 120, bollard::API_DEFAULT_VERSION)
        .unwrap()
        .negotiate_version()
        .await
        .unwrap()
}

fn command(cmd: &str, args: &[&str]) -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: cmd.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs `cmd args` through `lease` to its end: (stdout, exit code).
pub(crate) async fn run(lease: &Lease, cmd: &str, args: &[&str]) -> (String, i32) {
    let options = CallOptions::new().timeout(Duration::from_secs(30));
    let mut stream = lease
        .client()
        .start(&command(cmd, args), options)
        .await
        .unwrap();
    let mut stdout = Vec::new();
    loop {
        let message = stream.message().await.unwrap().expect("an end event");
        match message.event.and_then(|e| e.event) {
            Some(Event::Data(d)) => {
                if let Some(Output::Stdout(b)) = d.output {
                    stdout.extend(b);
                }
            }
            Some(Event::End(end)) => return (String::from_utf8(stdout).unwrap(), end.exit_code),
            _ => {}
        }
    }
}

/// Waits until the agent answers on its socket (the first lease opens the channel; the agent
/// may still be binding its socket just after the container started).
pub(crate) async fn first_lease(channel: &Arc<Channel>) -> Lease {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match channel.lease().await {
            Ok(lease) => return lease,
            Err(e) => {
                assert!(Instant::now() < deadline, "the channel never opened: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn commands_run_through_one_exec_sequentially_and_concurrently() {
    let container = AgentContainer::start(&engine().await).await;
    let proxy = CountingProxy::start().await;
    let channels = Channels::new(proxy.docker().await, ChannelConfig::default());
    let channel = channels.get(&container.id);
    // Waiting for the agent may take a few failed opens: count from the first success.
    let lease = first_lease(&channel).await;
    let before = proxy.exec_creates();
    let opened = channel.execs_opened();
    // Every exec the engine was asked for is one the channel opened (a few while the agent
    // was still binding its socket, then the one that answered).
    assert!(before >= 1, "the channel's exec went around the proxy");
    assert_eq!(before as u64, opened);

    assert_eq!(run(&lease, "echo", &["hi"]).await, ("hi\n".to_owned(), 0));
    assert_eq!(run(&lease, "sh", &["-c", "exit 3"]).await.1, 3);

    for i in 0..100 {
        let lease = channel.lease().await.unwrap();
        let (out, code) = run(&lease, "echo", &[&i.to_string()]).await;
        assert_eq!((out.trim(), code), (i.to_string().as_str(), 0));
    }
    assert_eq!(
        proxy.exec_creates(),
        before,
        "100 commands through the channel created execs"
    );

    let calls = (0..50).map(|i| {
        let channel = Arc::clone(&channel);
        tokio::spawn(async move {
            let lease = channel.lease().await.unwrap();
            run(&lease, "sh", &["-c", &format!("sleep 0.2; echo {i}")]).await
        })
    });
    let started = Instant::now();
    let answers = futures_util::future::join_all(calls).await;
    let took = started.elapsed();
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer.unwrap(), (format!("{i}\n"), 0));
    }
    assert_eq!(
        proxy.exec_creates(),
        before,
        "concurrent calls created execs"
    );
    assert_eq!(channel.execs_opened(), opened, "the channel reopened");
    // 50 commands of 0.2 s each, one at a time, would take 10 s: they ran side by side.
    assert!(
        took < Duration::from_secs(8),
        "50 concurrent calls took {took:?}"
    );
    assert!(channel.relay_stderr().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn a_killed_relay_is_noticed_and_the_next_call_reopens() {
    let container = AgentContainer::start(&engine().await).await;
    let proxy = CountingProxy::start().await;
    let heard = Arc::new(Heard::default());
    let mut config = ChannelConfig::default();
    config.observer = Some(heard.clone());
    let channel = Channel::new(proxy.docker().await, &container.id, config);
    let lease = first_lease(&channel).await;
    assert_eq!(run(&lease, "echo", &["before"]).await.1, 0);
    drop(lease);
    let opened = channel.execs_opened();
    let creates = proxy.exec_creates();

    let out = std::process::Command::new("docker")
        .args(["exec", &container.id, "sh", "-c", KILL_RELAY])
        .output()
        .unwrap();
    assert!(out.status.success(), "pkill: {out:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while channel.is_open().await {
        assert!(
            Instant::now() < deadline,
            "the channel did not notice its relay died"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let lease = channel.lease().await.unwrap();
    assert_eq!(
        run(&lease, "echo", &["after"]).await,
        ("after\n".to_owned(), 0)
    );
    assert_eq!(channel.execs_opened(), opened + 1);
    assert_eq!(proxy.exec_creates(), creates + 1);
    assert_eq!(
        heard.opens(),
        [(OpenReason::First, true), (OpenReason::ExecEnded, true)],
        "the observer heard the first open and the reopen after the relay died"
    );
}

/// Every health check is a round trip the observer hears; opening is not one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn health_checks_are_heard_as_agent_round_trips() {
    let engine = engine().await;
    let container = AgentContainer::start(&engine).await;
    let heard = Arc::new(Heard::default());
    let mut config = ChannelConfig::default();
    // Every lease after the first checks the channel.
    config.health_after = Duration::ZERO;
    config.observer = Some(heard.clone());
    let channel = Channel::new(engine, &container.id, config);
    let round_trips = || heard.round_trips.load(std::sync::atomic::Ordering::Relaxed);
    let lease = first_lease(&channel).await;
    drop(lease);
    assert_eq!(
        round_trips(),
        0,
        "opening is the version exchange, not a health call"
    );
    for n in 1..=3 {
        let lease = channel.lease().await.unwrap();
        assert_eq!(run(&lease, "true", &[]).await.1, 0);
        assert_eq!(round_trips(), n);
    }
    assert_eq!(heard.opens(), [(OpenReason::First, true)]);
}

/// An observer that keeps what it hears.
#[derive(Debug, Default)]
struct Heard {
    opens: std::sync::Mutex<Vec<(OpenReason, bool)>>,
    round_trips: std::sync::atomic::AtomicUsize,
}

impl Heard {
    fn opens(&self) -> Vec<(OpenReason, bool)> {
        self.opens.lock().unwrap().clone()
    }
}

impl ChannelObserver for Heard {
    fn channel_opened(&self, reason: OpenReason, opened: bool) {
        self.opens.lock().unwrap().push((reason, opened));
    }
    fn agent_round_trip(&self, _elapsed: Duration) {
        self.round_trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn a_paused_container_is_reported_paused_promptly() {
    let engine = engine().await;
    let container = AgentContainer::start(&engine).await;
    let mut config = ChannelConfig::default();
    config.health_after = Duration::from_millis(100);
    config.health_timeout = Duration::from_secs(1);
    let open = Channel::new(engine.clone(), &container.id, config.clone());
    let lease = first_lease(&open).await;
    assert_eq!(run(&lease, "true", &[]).await.1, 0);
    drop(lease);

    engine.pause_container(&container.id).await.unwrap();
    let check = |e: sandbox_core::Error, took: Duration| {
        assert_eq!(e.code(), Some(ErrorCode::SandboxPaused), "{e}");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.message().contains("paused"), "{e}");
        assert!(took < Duration::from_secs(5), "paused took {took:?}");
    };
    // A channel opening on a paused container: the engine refuses the exec at once.
    let fresh = Channel::new(engine.clone(), &container.id, config);
    let started = Instant::now();
    let e = fresh.lease().await.unwrap_err();
    check(e, started.elapsed());
    // A channel that was open: its idle health check fails, and the reopen says why.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let e = open.lease().await.unwrap_err();
    check(e, started.elapsed());

    engine.unpause_container(&container.id).await.unwrap();
    let lease = open.lease().await.unwrap();
    assert_eq!(run(&lease, "echo", &["back"]).await.0, "back\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn an_agent_of_another_version_is_refused_with_the_fix_named() {
    let engine = engine().await;
    let container = AgentContainer::start(&engine).await;
    // The real agent is this workspace's version; the channel is told to expect another.
    let config = ChannelConfig::default().with_expected_agent_version("0.0.0-elsewhere");
    let channel = Channel::new(engine.clone(), &container.id, config);
    let deadline = Instant::now() + Duration::from_secs(20);
    let e = loop {
        let e = channel.lease().await.unwrap_err();
        if e.message().contains("version") || Instant::now() > deadline {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = e.message();
    for needle in [
        env!("CARGO_PKG_VERSION"),
        "0.0.0-elsewhere",
        "cargo xtask agent",
    ] {
        assert!(text.contains(needle), "{needle} missing from: {text}");
    }
    assert!(
        !channel.is_open().await,
        "a refused agent's channel stays closed"
    );
    // The right version opens on the same container.
    let ok = Channel::new(engine, &container.id, ChannelConfig::default());
    let lease = first_lease(&ok).await;
    assert_eq!(run(&lease, "true", &[]).await.1, 0);
}

fn p50(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

/// `true` round trips: through the channel and as a raw exec (create, start, read to the end,
/// inspect for the exit code: what the exec data plane does per command), in the same run.
/// Prints `BENCH` lines; asserts outcomes only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn bench_true_round_trip_channel_vs_exec() {
    let engine = engine().await;
    let container = AgentContainer::start(&engine).await;
    let channel = Channel::new(engine.clone(), &container.id, ChannelConfig::default());
    let lease = first_lease(&channel).await;
    for _ in 0..10 {
        assert_eq!(run(&lease, "true", &[]).await.1, 0);
    }
    let mut health = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        let lease = channel.lease().await.unwrap();
        lease.client().health(CallOptions::new()).await.unwrap();
        health.push(started.elapsed());
    }
    let mut over_channel = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        let lease = channel.lease().await.unwrap();
        assert_eq!(run(&lease, "true", &[]).await.1, 0);
        over_channel.push(started.elapsed());
    }
    let mut raw = Vec::new();
    for _ in 0..100 {
        let started = Instant::now();
        let created = engine
            .create_exec(
                &container.id,
                CreateExecOptions {
                    cmd: Some(vec!["true".to_owned()]),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        if let StartExecResults::Attached { mut output, .. } =
            engine.start_exec(&created.id, None).await.unwrap()
        {
            while output.next().await.is_some() {}
        }
        let inspect = engine.inspect_exec(&created.id).await.unwrap();
        assert_eq!(inspect.exit_code, Some(0));
        raw.push(started.elapsed());
    }
    assert_eq!(channel.execs_opened(), 1);
    println!(
        "BENCH docker channel_exec_true_p50_ms={:.3}",
        p50(over_channel)
    );
    println!("BENCH docker raw_exec_true_p50_ms={:.3}", p50(raw));
    println!("BENCH docker channel_health_p50_ms={:.3}", p50(health));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn the_agent_touches_the_activity_marker_it_serves_through() {
    let engine = engine().await;
    let container = AgentContainer::start(&engine).await;
    let channel = Channel::new(engine.clone(), &container.id, ChannelConfig::default());
    let lease = first_lease(&channel).await;
    // The marker's mtime, read through the agent itself (busybox `stat`).
    let mtime = |lease: Lease| async move {
        let (out, code) = run(&lease, "stat", &["-c", "%Y", "/.sandbox/activity"]).await;
        assert_eq!(code, 0, "{out}");
        out.trim().parse::<u64>().unwrap()
    };
    // The version exchange that opened the channel created the marker (off its request path).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = mtime(lease.clone()).await;
    let out = std::process::Command::new("docker")
        .args([
            "exec",
            &container.id,
            "touch",
            "-d",
            "2000-01-01 00:00:00",
            "/.sandbox/activity",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // Past the throttle, a request touches it again; the read that follows is inside the
    // throttle, so it only reads.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    lease.client().health(CallOptions::new()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = mtime(lease).await;
    assert!(first > 946_684_800, "{first}");
    assert!(
        again > 946_684_800 + 3600,
        "the request did not touch the marker: {again}"
    );
}

/// How many relays run in the container (read through a separate exec, not the channel).
fn relays_running(container: &str) -> usize {
    let script = "for d in /proc/[0-9]*; do \
         if tr '\\000' ' ' < \"$d/cmdline\" 2>/dev/null | grep -q '^/.sandbox/sandbox-agent relay'; then \
         echo \"${d#/proc/}\"; fi; done";
    let out = std::process::Command::new("docker")
        .args(["exec", container, "sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn an_idle_channel_closes_its_exec_unless_leased_and_reopens_on_use() {
    let engine = engine().await;
    let container = AgentContainer::start(&engine).await;
    let mut config = ChannelConfig::default();
    config.idle_timeout = Duration::from_millis(300);
    let heard = Arc::new(Heard::default());
    config.observer = Some(heard.clone());
    let channel = Channel::new(engine, &container.id, config);
    let lease = first_lease(&channel).await;
    assert_eq!(relays_running(&container.id), 1);
    let opened = channel.execs_opened();

    // A held lease (a long call) keeps the channel open past the idle timeout.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        channel.is_open().await,
        "a leased channel was closed as idle"
    );
    assert_eq!(run(&lease, "true", &[]).await.1, 0);
    drop(lease);

    // Without a lease it closes, and the relay in the container ends with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while channel.is_open().await || relays_running(&container.id) > 0 {
        assert!(
            Instant::now() < deadline,
            "the idle channel stayed open ({} relays)",
            relays_running(&container.id)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lease = channel.lease().await.unwrap();
    assert_eq!(run(&lease, "echo", &["again"]).await.0, "again\n");
    assert_eq!(channel.execs_opened(), opened + 1);
    assert_eq!(
        heard.opens(),
        [(OpenReason::First, true), (OpenReason::Closed, true)]
    );
}

/// Two replicas of the service reach one sandbox, each through its own exec: their calls
/// interleave without either seeing the other's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn two_replicas_channels_to_one_sandbox_do_not_mix() {
    let engine = engine().await;
    let container = AgentContainer::start(&engine).await;
    let one = Channel::new(engine.clone(), &container.id, ChannelConfig::default());
    let two = Channel::new(engine, &container.id, ChannelConfig::default());
    first_lease(&one).await;
    first_lease(&two).await;
    assert_eq!(relays_running(&container.id), 2);
    for i in 0..50 {
        for (name, channel) in [("one", &one), ("two", &two)] {
            let lease = channel.lease().await.unwrap();
            let want = format!("{name}-{i}");
            assert_eq!(
                run(&lease, "echo", &[&want]).await,
                (format!("{want}\n"), 0)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn a_container_without_a_listening_agent_fails_with_the_relays_words() {
    let engine = engine().await;
    // The agent binary is there (the relay runs), but nothing listens on its socket.
    let container = AgentContainer::start_with(&engine, &["sleep", "3600"]).await;
    let channel = Channel::new(engine, &container.id, ChannelConfig::default());
    let started = Instant::now();
    let e = channel.lease().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(
        e.message().contains("cannot connect to the agent's socket"),
        "{e}"
    );
    assert!(e.message().contains(AGENT_SOCKET), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!channel.is_open().await);
}

/// A caller's request forwarded on the channel (`Channel::forward`, what a router in front of
/// the sandbox calls): a `Start` server stream whose answer is read slowly keeps the channel
/// open past its idle timeout, because the answer's body holds the lease, and lets it close
/// once the body is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn a_forwarded_stream_holds_its_lease_past_the_idle_timeout() {
    use http_body_util::BodyExt;
    let engine = engine().await;
    let container = AgentContainer::start(&engine).await;
    let mut config = ChannelConfig::default();
    config.idle_timeout = Duration::from_millis(300);
    let channel = Channel::new(engine, &container.id, config);
    drop(first_lease(&channel).await);
    let opened = channel.execs_opened();

    let start = command("sh", &["-c", "sleep 2; echo held"]);
    let body = sandbox_envd::Envelope::from_message(&start)
        .unwrap()
        .to_bytes()
        .unwrap();
    let request = hyper::Request::builder()
        .method("POST")
        .uri("/process.Process/Start")
        .header("content-type", sandbox_envd::CONTENT_TYPE_CONNECT_JSON)
        .header(
            sandbox_envd::HEADER_PROTOCOL_VERSION,
            sandbox_envd::PROTOCOL_VERSION,
        )
        .body(http_body_util::Full::new(body))
        .unwrap();
    let response = channel.forward(request).await;
    assert_eq!(response.status(), 200);
    // Well past the idle timeout, with only the answer's body holding the channel.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        channel.is_open().await,
        "the channel was closed under a stream being read"
    );
    let mut body = response.into_body();
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            read.extend_from_slice(&data);
        }
    }
    let text = String::from_utf8_lossy(&read);
    // `held\n` in the Connect JSON codec's base64.
    assert!(text.contains("aGVsZAo="), "{text}");
    assert_eq!(
        channel.execs_opened(),
        opened,
        "the stream ran on the kept exec"
    );
    drop(body);
    let deadline = Instant::now() + Duration::from_secs(10);
    while channel.is_open().await {
        assert!(
            Instant::now() < deadline,
            "the idle channel stayed open after the stream's body was dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
