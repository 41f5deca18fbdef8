//! The agent as PID 1 of a container (the `FROM scratch` busybox test image): 200 commands of
//! the form `sh -c 'sleep 0.05 & exit 0'` leave no process in state `Z`, and with the reaper
//! limited to the agent's own children (`--no-reap-orphans`) every orphan stays a zombie. In a
//! container held to `--memory 256m --cpus 1`, `GET /metrics` reports the cgroup's figures,
//! and without limits the machine's.
//!
//! The image has no libc, so the agent must be a static build: `SANDBOX_AGENT_BIN` names it
//! (the pipeline builds it with `-C target-feature=+crt-static`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use sandbox_envd::process::process_event::Event;
use sandbox_envd::process::process_event::data_event::Output;
use sandbox_envd::process::{ProcessConfig, StartRequest};
use sandbox_transport::envd::{CallOptions, EnvdClient, EnvdConfig};
use sandbox_transport::{GuardedConnector, OutboundPolicy};

const IMAGE: &str = "sandbox-busybox:test";
const COMMANDS: usize = 200;

fn agent_binary() -> PathBuf {
    let path = std::env::var_os("SANDBOX_AGENT_BIN")
        .map(PathBuf::from)
        .expect(
            "SANDBOX_AGENT_BIN must name a static build of sandbox-agent \
         (cargo build -p sandbox-agent --release --target x86_64-unknown-linux-gnu with \
         CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS='-C target-feature=+crt-static')",
        );
    assert!(
        path.is_file(),
        "SANDBOX_AGENT_BIN={} is not a file",
        path.display()
    );
    path
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A container whose PID 1 is the agent; removed on drop.
struct Container {
    id: String,
    addr: SocketAddr,
    _etc: tempfile::TempDir,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.id]).output();
    }
}

impl Container {
    fn start(flags: &[&str]) -> Container {
        Container::start_with(&[], flags)
    }

    /// [`Container::start`] with `docker run` options of its own (`--memory 256m`).
    fn start_with(docker_options: &[&str], flags: &[&str]) -> Container {
        let bin = agent_binary();
        // The image has no account files of its own: the agent gets root's from a mount.
        let etc = tempfile::tempdir().unwrap();
        std::fs::write(etc.path().join("passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
        std::fs::write(etc.path().join("group"), "root:x:0:\n").unwrap();
        let bin_mount = format!("{}:/sandbox-agent:ro", bin.display());
        let etc_mount = format!("{}:/agent-etc:ro", etc.path().display());
        let mut args = vec!["run", "-d"];
        args.extend_from_slice(docker_options);
        args.extend_from_slice(&[
            "-v",
            &bin_mount,
            "-v",
            &etc_mount,
            "-p",
            "127.0.0.1::49983",
            IMAGE,
            "/sandbox-agent",
            "--listen",
            "0.0.0.0:49983",
            "--passwd",
            "/agent-etc/passwd",
            "--group",
            "/agent-etc/group",
            "--default-workdir",
            "/",
        ]);
        args.extend_from_slice(flags);
        let id = docker(&args);
        let port = docker(&["port", &id, "49983/tcp"]);
        let addr = port
            .lines()
            .find_map(|l| l.parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("no published port in {port:?}"));
        Container {
            id,
            addr,
            _etc: etc,
        }
    }

    fn client(&self) -> EnvdClient<GuardedConnector> {
        let config = EnvdConfig::new(&format!("http://{}", self.addr)).unwrap();
        EnvdClient::new(
            GuardedConnector::new(OutboundPolicy::allow_private()),
            config,
        )
        .unwrap()
    }
}

fn sh(script: &str) -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs `script` to its end; its stdout.
async fn run(client: &EnvdClient<GuardedConnector>, script: &str) -> String {
    let mut stream = client.start(&sh(script), CallOptions::new()).await.unwrap();
    let mut stdout = Vec::new();
    loop {
        let message = stream.message().await.unwrap().expect("an end event");
        match message.event.and_then(|e| e.event) {
            Some(Event::Data(d)) => {
                if let Some(Output::Stdout(b)) = d.output {
                    stdout.extend(b);
                }
            }
            Some(Event::End(end)) => {
                assert_eq!(end.exit_code, 0, "{script}: {end:?}");
                return String::from_utf8(stdout).unwrap();
            }
            _ => {}
        }
    }
}

async fn wait_healthy(client: &EnvdClient<GuardedConnector>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.list(CallOptions::new()).await.is_err() {
        assert!(Instant::now() < deadline, "the agent never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Processes in state `Z`, from every `/proc/<pid>/stat` of the container.
async fn zombies(client: &EnvdClient<GuardedConnector>) -> usize {
    let stats = run(client, "cat /proc/[0-9]*/stat 2>/dev/null; true").await;
    stats
        .lines()
        .filter_map(|l| l.rsplit_once(')'))
        .filter(|(_, rest)| rest.trim_start().starts_with('Z'))
        .count()
}

async fn make_orphans(client: &EnvdClient<GuardedConnector>) {
    for _ in 0..COMMANDS {
        run(client, "sleep 0.05 & exit 0").await;
    }
    // Every `sleep 0.05` has ended by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

#[tokio::test]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn as_pid_1_the_agent_leaves_no_zombie() {
    let container = Container::start(&[]);
    let client = container.client();
    wait_healthy(&client).await;
    let init = run(&client, "tr '\\0' ' ' < /proc/1/cmdline").await;
    assert!(init.starts_with("/sandbox-agent "), "PID 1 is {init:?}");
    make_orphans(&client).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while zombies(&client).await > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(zombies(&client).await, 0);
}

#[tokio::test]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn without_the_reaper_the_orphans_stay_zombies() {
    let container = Container::start(&["--no-reap-orphans"]);
    let client = container.client();
    wait_healthy(&client).await;
    make_orphans(&client).await;
    // Every orphan (the `sh` of each command was reaped as the agent's own child), once its
    // `sleep 0.05` has ended, later on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while zombies(&client).await < COMMANDS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(zombies(&client).await, COMMANDS);
}

/// `GET /metrics`, asked from inside the container (busybox's `wget`, to the agent's port).
async fn metrics(client: &EnvdClient<GuardedConnector>) -> serde_json::Value {
    let body = run(client, "wget -qO- http://127.0.0.1:49983/metrics").await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
}

fn figure(metrics: &serde_json::Value, key: &str) -> f64 {
    metrics[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is a number in {metrics}"))
}

/// The machine's memory and CPUs, as its `/proc` shows them (a container's too).
fn machine() -> (f64, f64) {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let cpus = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    (kb * 1024.0, cpus as f64)
}

#[tokio::test]
#[ignore = "needs the Docker engine and SANDBOX_AGENT_BIN (the docker engine stage)"]
async fn in_a_limited_container_the_metrics_are_the_cgroups() {
    let (machine_memory, machine_cpus) = machine();
    let limited = Container::start_with(&["--memory", "256m", "--cpus", "1"], &[]);
    let client = limited.client();
    wait_healthy(&client).await;
    let m = metrics(&client).await;
    assert_eq!(figure(&m, "mem_total"), 256.0 * 1024.0 * 1024.0, "{m}");
    assert_eq!(figure(&m, "mem_total_mib"), 256.0, "{m}");
    let used = figure(&m, "mem_used");
    assert!(used > 0.0 && used < 256.0 * 1024.0 * 1024.0, "{m}");
    assert_eq!(figure(&m, "cpu_count"), 1.0, "the quota is one CPU: {m}");
    // One busy loop for a second and a half is most of a one-CPU quota (of a loaded machine's
    // share, at least a tenth), however many CPUs the machine has.
    run(
        &client,
        "sh -c 'while :; do :; done' & p=$!; sleep 1.5; kill $p; wait $p; true",
    )
    .await;
    let m = metrics(&client).await;
    let pct = figure(&m, "cpu_used_pct");
    assert!((10.0..=100.0).contains(&pct), "{m}");
    drop(limited);

    // Without limits, the machine's figures, as on a machine of its own.
    let free = Container::start(&[]);
    let client = free.client();
    wait_healthy(&client).await;
    let m = metrics(&client).await;
    assert_eq!(figure(&m, "mem_total"), machine_memory, "{m}");
    assert_eq!(figure(&m, "cpu_count"), machine_cpus, "{m}");
}
