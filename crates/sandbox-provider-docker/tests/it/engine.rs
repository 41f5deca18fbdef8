//! Docker-specific behaviour on the real engine, beyond the conformance suite: isolation
//! defaults, ownership scoping, resuming stopped and paused containers, the kill of a dropped
//! exec, the idle sweeper, and bad input.
//!
//! These need a Docker engine and the locally built `sandbox-busybox:test` image, so they are
//! ignored in a plain `cargo test`; `cargo xtask test` starts both and runs them with
//! `--run-ignored ignored-only`. Every container is labelled `sandbox.test=1` and scoped to a
//! namespace unique to the test, which is also what every count below is taken over.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, RemoveContainerOptions,
};
use sandbox_core::{
    ConnectRequest, CreateRequest, ErrorCode, ErrorKind, ExecRequest, ExecTimeout, IdleTimeout,
    ListFilter, ManualClock, NetworkPolicy, SandboxPath, SandboxProvider, SandboxState, TemplateId,
    TimeoutAction, TimeoutPolicy, VolumeMount,
};
use sandbox_provider_docker::{DockerProvider, NetworkMode, labels, sweeper};

use support::{IMAGE, config, namespace};

async fn provider(ns: &str) -> sandbox_core::Checked<DockerProvider> {
    DockerProvider::connect(config(ns))
        .await
        .expect("connect to the local engine")
}

fn request() -> CreateRequest {
    CreateRequest::new(TemplateId::new(IMAGE).unwrap())
}

/// Removes every container of `ns` (the test's own namespace only).
async fn cleanup(p: &DockerProvider) {
    for s in p.list(&ListFilter::default()).await.unwrap_or_default() {
        let _ = p.delete(&s.id).await;
    }
}

/// Processes in the container whose command line contains `needle` (the scan's own command
/// line holds `[s]leep`-style patterns, which do not match).
async fn count(p: &DockerProvider, h: &sandbox_core::SandboxHandle, needle: &str) -> usize {
    let (first, rest) = needle.split_at(1);
    let script = format!(
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < \"$f\" 2>/dev/null; echo; done | grep -c '[{first}]{rest}' || true"
    );
    let r = p.exec(h, ExecRequest::shell(script)).await.unwrap();
    r.stdout_lossy().trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn create_applies_isolation_defaults_and_ownership_labels() {
    let ns = namespace("iso");
    let p = provider(&ns).await;
    let mut req = request();
    req.metadata.insert("owner".into(), "t-42".into());
    let h = p.create(req).await.unwrap();
    let inspect = p
        .docker()
        .inspect_container(h.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let host = inspect.host_config.clone().unwrap();
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
    let added = host.cap_add.unwrap();
    for cap in [
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "SETGID",
        "SETUID",
        "KILL",
    ] {
        assert!(
            added.iter().any(|c| c == cap || c == &format!("CAP_{cap}")),
            "{cap} missing from {added:?}"
        );
    }
    assert_eq!(
        added.len(),
        7,
        "only the minimal set is added back: {added:?}"
    );
    assert_eq!(
        host.security_opt,
        Some(vec!["no-new-privileges".to_owned()])
    );
    // The default data plane runs the agent as PID 1, so the engine's init is off (the agent
    // reaps orphans itself); exec mode keeps it (`agent::the_agent_is_pid_1…` and the exec
    // conformance run cover both).
    assert_eq!(host.init, Some(false));
    assert_eq!(
        inspect
            .config
            .as_ref()
            .and_then(|c| c.entrypoint.as_ref())
            .and_then(|e| e.first())
            .map(String::as_str),
        Some(sandbox_provider_docker::agent::AGENT_PATH)
    );
    assert_eq!(
        host.memory,
        Some(sandbox_provider_docker::config::DEFAULT_MEMORY_BYTES)
    );
    assert_eq!(
        host.memory_swap, host.memory,
        "swap must be off (memory == memory+swap)"
    );
    assert_eq!(
        host.pids_limit,
        Some(sandbox_provider_docker::config::DEFAULT_PIDS_LIMIT)
    );
    assert_eq!(host.nano_cpus, Some(2_000_000_000));
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    let container_labels = inspect.config.unwrap().labels.unwrap();
    assert_eq!(
        container_labels.get(labels::MANAGED).map(String::as_str),
        Some("true")
    );
    assert_eq!(container_labels.get(labels::NAMESPACE), Some(&ns));
    assert_eq!(
        container_labels.get(labels::IDLE_TTL).map(String::as_str),
        Some("1800")
    );
    assert_eq!(
        container_labels
            .get("sandbox.meta.owner")
            .map(String::as_str),
        Some("t-42")
    );
    // The sandbox really is capability-less: changing the hostname needs CAP_SYS_ADMIN.
    let r = p
        .exec(&h, ExecRequest::shell("hostname sandbox-escape"))
        .await
        .unwrap();
    assert_ne!(
        r.exit_code,
        0,
        "hostname change succeeded: {}",
        r.stdout_lossy()
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn no_egress_policy_means_no_network() {
    let ns = namespace("net");
    let mut c = config(&ns);
    // Even a bridge-mode config gives a deny-by-default policy no network at all.
    c.network = NetworkMode::Bridge;
    let p = DockerProvider::connect(c).await.unwrap();
    let mut req = request();
    req.network = NetworkPolicy {
        allow_internet_access: Some(false),
        ..NetworkPolicy::default()
    };
    let h = p.create(req).await.unwrap();
    let inspect = p
        .docker()
        .inspect_container(h.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap();
    assert_eq!(
        inspect.host_config.unwrap().network_mode.as_deref(),
        Some("none")
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_deny_list_the_network_cannot_apply_is_refused_by_name() {
    let ns = namespace("deny");
    let mut c = config(&ns);
    c.network = NetworkMode::Bridge;
    let p = DockerProvider::connect(c).await.unwrap();
    // Once accepted and silently not applied: a Docker network cannot deny one subnet.
    let mut req = request();
    req.network = NetworkPolicy {
        deny_out: vec!["10.0.0.0/8".to_owned()],
        ..NetworkPolicy::default()
    };
    let err = p.create(req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("deny_out"), "{err}");
    assert_eq!(
        err.origin(),
        sandbox_core::Origin::Provider(sandbox_core::Provider::Docker)
    );
    let mut allow = request();
    allow.network.allow_out = vec!["192.0.2.0/24".to_owned()];
    let err = p.create(allow).await.unwrap_err();
    assert!(err.to_string().contains("allow_out"), "{err}");
    // Nothing was created for either request.
    assert!(p.list(&ListFilter::default()).await.unwrap().is_empty());
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn foreign_containers_are_invisible_and_untouchable() {
    let ns = namespace("own");
    let p = provider(&ns).await;
    let other = provider(&namespace("oth")).await;
    let theirs = other.create(request()).await.unwrap();
    // A plain container nobody labelled, as the host's own services would be.
    let plain = p
        .docker()
        .create_container(
            Some(CreateContainerOptions {
                name: Some(format!("sbxt-plain-{ns}")),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(IMAGE.to_owned()),
                cmd: Some(vec!["sleep".into(), "60".into()]),
                labels: Some(HashMap::from([("sandbox.test".to_owned(), "1".to_owned())])),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    for id in [
        theirs.id().clone(),
        sandbox_core::SandboxId::new(plain.id.clone()).unwrap(),
    ] {
        assert_eq!(p.get(&id).await.unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(p.delete(&id).await.unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(
            p.connect(ConnectRequest::new(id.clone()))
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
        // Still there: the refused delete did not remove it.
        assert!(
            p.docker()
                .inspect_container(id.as_str(), None::<InspectContainerOptions>)
                .await
                .is_ok()
        );
    }
    assert!(
        p.list(&ListFilter::default()).await.unwrap().is_empty(),
        "another namespace's containers leaked into list"
    );
    let _ = p
        .docker()
        .remove_container(
            &plain.id,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    cleanup(&other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn connect_resumes_stopped_and_paused_containers() {
    let ns = namespace("res");
    let p = provider(&ns).await;
    let h = p.create(request()).await.unwrap();
    let file = SandboxPath::new("/workspace/kept.txt").unwrap();
    p.write_file(&h, &file, b"kept").await.unwrap();

    p.docker()
        .stop_container(
            h.id().as_str(),
            None::<bollard::query_parameters::StopContainerOptions>,
        )
        .await
        .unwrap();
    let s = p.get(h.id()).await.unwrap();
    assert_eq!(
        s.state,
        SandboxState::Paused,
        "an exited container counts as paused, not terminal ({})",
        s.raw_state
    );
    // An exec on the stale handle restarts it (retry once when the container was not running).
    let r = p
        .exec(&h, ExecRequest::argv("cat", [file.as_str()]))
        .await
        .unwrap();
    assert_eq!(r.stdout, b"kept");

    p.docker().pause_container(h.id().as_str()).await.unwrap();
    assert_eq!(p.get(h.id()).await.unwrap().state, SandboxState::Paused);
    let c = p
        .connect(ConnectRequest::new(h.id().clone()))
        .await
        .unwrap();
    assert_eq!(p.get(c.id()).await.unwrap().state, SandboxState::Running);
    assert_eq!(p.read_file(&c, &file).await.unwrap(), b"kept");

    p.docker()
        .stop_container(
            h.id().as_str(),
            None::<bollard::query_parameters::StopContainerOptions>,
        )
        .await
        .unwrap();
    let c = p
        .connect(ConnectRequest::new(h.id().clone()))
        .await
        .unwrap();
    assert_eq!(
        p.read_file(&c, &file).await.unwrap(),
        b"kept",
        "files survive a stop and restart"
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_dropped_exec_leaves_no_process_behind() {
    let ns = namespace("drop");
    let p = provider(&ns).await;
    let h = p.create(request()).await.unwrap();
    let long = ExecRequest::argv("sleep", ["300"])
        .timeout(ExecTimeout::new(Duration::from_secs(600)).unwrap());
    let running = p.exec(&h, long);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), running)
            .await
            .is_err(),
        "sleep 300 returned early"
    );
    // The caller's future is gone; within 10 s no such process may be left.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = count(&p, &h, "sleep 300").await;
        if n == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} `sleep 300` process(es) still running 10 s after the caller went away"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cleanup(&p).await;
}

/// Dates the activity marker through a plain engine exec that has ended when this returns:
/// neither a command through the agent (a request it serves touches the marker) nor a running
/// exec (the channel's relay, which the sweeper counts as work) is left to blur the sweep.
async fn set_marker(p: &DockerProvider, h: &sandbox_core::SandboxHandle, date: &str) {
    let script = format!(
        "touch -d '{date}' {marker} && date -r {marker} +%Y",
        marker = sandbox_provider_docker::exec::ACTIVITY_MARKER
    );
    let year = support::engine_sh(p, h, &script).await;
    assert_eq!(year, &date[..4], "{script}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn idle_sweeper_reaps_only_idle_containers_of_its_namespace() {
    let ns = namespace("swp");
    let p = provider(&ns).await;
    let with_ttl = |secs: u64| {
        let mut r = request();
        r.timeout = TimeoutPolicy {
            idle: IdleTimeout::after_secs(secs as i64).unwrap(),
            on_timeout: TimeoutAction::Kill,
            auto_resume: false,
        };
        r
    };
    let idle = p.create(with_ttl(2)).await.unwrap();
    set_marker(&p, &idle, "2001-01-01 00:00:00").await;
    let forged = p.create(with_ttl(3600)).await.unwrap();
    set_marker(&p, &forged, "2099-01-01 00:00:00").await;
    let forged_short = p.create(with_ttl(2)).await.unwrap();
    set_marker(&p, &forged_short, "2099-01-01 00:00:00").await;
    let mut never = request();
    never.timeout.idle = IdleTimeout::Never;
    let never = p.create(never).await.unwrap();
    set_marker(&p, &never, "2001-01-01 00:00:00").await;
    let busy = p.create(with_ttl(3600)).await.unwrap();
    // Another namespace's idle container must never be touched by this namespace's sweep.
    let other_ns = namespace("oth");
    let other = provider(&other_ns).await;
    let foreign = other.create(with_ttl(2)).await.unwrap();
    set_marker(&other, &foreign, "2001-01-01 00:00:00").await;

    // The sweep judges by a clock ten seconds ahead, so the 2 s TTLs have certainly run out
    // without the test sleeping for them.
    let mut c = config(&ns);
    let clock = ManualClock::new(time::OffsetDateTime::now_utc());
    clock.advance(Duration::from_secs(10));
    c.clock = Arc::new(clock);
    let sweeping = DockerProvider::connect(c).await.unwrap();
    let report = sweeper::sweep(&sweeping).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let mut reaped: Vec<_> = report
        .reaped
        .iter()
        .map(|id| id.as_str().to_owned())
        .collect();
    reaped.sort();
    let mut want = vec![
        idle.id().as_str().to_owned(),
        forged_short.id().as_str().to_owned(),
    ];
    want.sort();
    assert_eq!(
        reaped, want,
        "only the idle container and the one whose forged marker fell back to its creation time"
    );
    for kept in [&forged, &never, &busy] {
        assert!(p.get(kept.id()).await.is_ok(), "{} was reaped", kept.id());
    }
    assert!(
        other.get(foreign.id()).await.is_ok(),
        "another namespace's container was reaped"
    );
    assert_eq!(
        p.list(&ListFilter::default()).await.unwrap().len(),
        3,
        "counted by this test's namespace label"
    );
    cleanup(&p).await;
    cleanup(&other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn bad_input_is_refused_with_clear_errors() {
    // The operator gate comes first, before any socket is touched.
    let mut disabled = config(&namespace("bad"));
    disabled.enabled = false;
    let err = DockerProvider::connect(disabled).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BackendDisabled));
    assert!(err.to_string().contains("SANDBOX_DOCKER_ENABLED"), "{err}");

    let mut tcp = config(&namespace("bad"));
    tcp.host = Some("tcp://127.0.0.1:2375".into());
    let err = DockerProvider::connect(tcp).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("TLS client certificates"), "{err}");
    assert!(NetworkMode::parse("host").is_err());

    let ns = namespace("bad");
    let p = provider(&ns).await;
    let mut missing = request();
    missing.template = TemplateId::new("sandbox-no-such-image:never").unwrap();
    let err = p.create(missing).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert_eq!(err.code(), Some(ErrorCode::ImageNotPresent));
    assert!(err.to_string().contains("pull policy is never"), "{err}");

    let mut volumes = request();
    volumes
        .volumes
        .push(VolumeMount::new("data", SandboxPath::new("/data").unwrap()).unwrap());
    assert_eq!(
        p.create(volumes).await.unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    let mut bad_meta = request();
    bad_meta.metadata.insert("a=b".into(), "x".into());
    assert_eq!(
        p.create(bad_meta).await.unwrap_err().kind(),
        ErrorKind::InvalidRequest
    );

    let h = p.create(request()).await.unwrap();
    for reserved in [
        "/proc/1/environ",
        "/sys/kernel",
        "/dev/null",
        sandbox_provider_docker::exec::ACTIVITY_MARKER,
    ] {
        let err = p
            .write_file(&h, &SandboxPath::new(reserved).unwrap(), b"x")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{reserved}");
        assert_eq!(err.code(), Some(ErrorCode::InvalidPath), "{reserved}");
    }
    assert_eq!(
        p.remove(&h, &SandboxPath::root()).await.unwrap_err().kind(),
        ErrorKind::InvalidRequest
    );
    assert_eq!(
        p.exec(&h, ExecRequest::argv("", Vec::<String>::new()))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidRequest
    );
    // The wire forms refuse what cannot even be built: relative paths, shell with args, bad
    // timeouts (their parsers are unit-tested in sandbox-core; here the same values meet the
    // adapter's entry points).
    assert!(SandboxPath::new("workspace/x").is_err());
    let spec: sandbox_core::ExecSpec =
        serde_json::from_str(r#"{"command":"ls","args":["-l"],"shell":true}"#).unwrap();
    assert_eq!(
        sandbox_core::ExecRequest::try_from(spec)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidRequest
    );
    for ms in [0, -1, i64::MAX] {
        assert_eq!(
            ExecTimeout::from_millis(ms).unwrap_err().code(),
            Some(ErrorCode::InvalidTimeout)
        );
    }
    assert!(TemplateId::new("").is_err());
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn negotiated_api_version_matches_the_engine() {
    let p = provider(&namespace("api")).await;
    let minor = |v: &str| v.split_once('.').unwrap().1.parse::<u32>().unwrap();
    let engine_api = minor(&p.engine().api_version);
    // The adapter speaks the engine's version when it is older than bollard's, else bollard's.
    let want = engine_api.min(bollard::API_DEFAULT_VERSION.minor_version as u32);
    assert_eq!(
        minor(&p.api_version()),
        want,
        "engine speaks 1.{engine_api}"
    );
    p.health().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn exec_output_is_capped_and_flagged() {
    let ns = namespace("cap");
    let mut c = config(&ns);
    c.max_output_bytes = 1024 * 1024;
    let p = DockerProvider::connect(c).await.unwrap();
    let h = p.create(request()).await.unwrap();
    // 3 MB of output: the command runs to completion, the result keeps the first 1 MiB.
    let r = p
        .exec(
            &h,
            ExecRequest::shell("yes | head -c 3000000; echo done >&2"),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0);
    assert!(r.truncated);
    assert_eq!(r.stdout.len(), 1024 * 1024);
    assert_eq!(r.stderr_lossy(), "done\n", "the other stream is kept whole");
    let small = p
        .exec(&h, ExecRequest::argv("echo", ["small"]))
        .await
        .unwrap();
    assert!(!small.truncated);
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_container_removed_mid_exec_is_sandbox_gone() {
    let ns = namespace("gone");
    let p = Arc::new(provider(&ns).await);
    let h = p.create(request()).await.unwrap();
    // A command that dies of SIGKILL by itself, in a live container, is still a result.
    let r = p.exec(&h, ExecRequest::shell("kill -9 $$")).await.unwrap();
    assert_eq!((r.exit_code, r.killed), (137, false), "{r:?}");
    let r = p.exec(&h, ExecRequest::shell("exit 137")).await.unwrap();
    assert_eq!((r.exit_code, r.killed), (137, false), "{r:?}");

    let (provider, handle) = (p.clone(), h.clone());
    let running = tokio::spawn(async move {
        let long = ExecRequest::argv("sleep", ["30"])
            .timeout(ExecTimeout::new(Duration::from_secs(60)).unwrap());
        provider.exec(&handle, long).await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    // What `docker rm -f` does.
    p.docker()
        .remove_container(
            h.id().as_str(),
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the exec outlived its container by 20 s")
        .unwrap();
    let err = outcome.expect_err("an exec whose container was removed returned a result");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(err.code(), Some(ErrorCode::SandboxGone), "{err}");
    cleanup(&p).await;
}

/// The process's resident set, in bytes, as the kernel counts it.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Waits (10 s at most) until no reading `cat` runs in the sandbox.
async fn no_reader_left(p: &DockerProvider, h: &sandbox_core::SandboxHandle, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = count(p, h, "cat").await;
        if n == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} reading process(es) still run 10 s {when}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_1000_mib_file_streams_through_a_few_chunks_of_memory() {
    const SIZE: u64 = 1000 * 1024 * 1024;
    let ns = namespace("big");
    let p = provider(&ns).await;
    let h = p.create(request()).await.unwrap();
    // Sparse: a gigabyte to read, no gigabyte on disk.
    let r = p
        .exec(
            &h,
            ExecRequest::shell(format!("mkdir -p /w && truncate -s {SIZE} /w/big")),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr_lossy());
    let file = SandboxPath::new("/w/big").unwrap();
    let baseline = resident_bytes();
    let mut peak = baseline;
    let mut stream = p.read_file_stream(&h, &file, SIZE).await.unwrap();
    let (mut total, mut chunks, mut largest) = (0u64, 0u64, 0usize);
    while let Some(chunk) = stream.next_chunk().await {
        let chunk = chunk.unwrap();
        assert!(
            chunk.iter().all(|b| *b == 0),
            "a sparse file reads as zeros"
        );
        total += chunk.len() as u64;
        largest = largest.max(chunk.len());
        chunks += 1;
        if chunks % 256 == 0 {
            peak = peak.max(resident_bytes());
            // A slow consumer: whatever the adapter reads ahead would pile up now.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    peak = peak.max(resident_bytes());
    assert_eq!(total, SIZE, "the whole file, and nothing more");
    let growth = peak.saturating_sub(baseline);
    println!(
        "streamed {total} bytes in {chunks} chunks (largest {largest}); resident growth {} KiB",
        growth / 1024
    );
    assert!(
        growth < 64 * 1024 * 1024,
        "streaming 1000 MiB grew the process by {} MiB: it was buffered, not streamed",
        growth / (1024 * 1024)
    );

    // Past its cap the stream ends in file_too_large, and the reader is killed then: left
    // alone, it would sit on a full pipe for the stream's whole timeout.
    let cap = 10 * 1024 * 1024;
    let mut stream = p.read_file_stream(&h, &file, cap).await.unwrap();
    let mut got = 0u64;
    let err = loop {
        match stream
            .next_chunk()
            .await
            .expect("the stream ended without an error")
        {
            Ok(chunk) => got += chunk.len() as u64,
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Some(ErrorCode::FileTooLarge), "{err}");
    assert!(got <= cap, "{got} bytes handed out under a {cap}-byte cap");
    assert!(
        stream.next_chunk().await.is_none(),
        "an error ends the stream"
    );
    no_reader_left(&p, &h, "past its cap").await;
    // So is a reader whose stream is dropped half-way.
    let mut stream = p.read_file_stream(&h, &file, SIZE).await.unwrap();
    stream.next_chunk().await.unwrap().unwrap();
    drop(stream);
    no_reader_left(&p, &h, "after the stream was dropped").await;
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn devices_and_fifos_behind_a_path_are_refused_at_once() {
    let ns = namespace("odd");
    let p = provider(&ns).await;
    let h = p.create(request()).await.unwrap();
    let r = p
        .exec(
            &h,
            ExecRequest::shell(
                "mkdir -p /w/d && mkfifo /w/fifo && ln -s /dev/zero /w/zero && ln -s /proc/1 /w/d/init",
            ),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr_lossy());
    for (leaf, code) in [
        ("/w/zero", ErrorCode::InvalidPath),
        ("/w/d/init/environ", ErrorCode::InvalidPath),
        ("/w/fifo", ErrorCode::NotARegularFile),
        ("/w/d", ErrorCode::NotARegularFile),
    ] {
        let path = SandboxPath::new(leaf).unwrap();
        let started = Instant::now();
        let err = p.read_file(&h, &path).await.unwrap_err();
        assert_eq!(
            (err.kind(), err.code()),
            (ErrorKind::InvalidRequest, Some(code)),
            "{leaf}: {err}"
        );
        let err = p
            .read_file_stream(&h, &path, u64::MAX)
            .await
            .map(drop)
            .unwrap_err();
        assert_eq!(
            (err.kind(), err.code()),
            (ErrorKind::InvalidRequest, Some(code)),
            "{leaf}: {err}"
        );
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "{leaf}: two refusals took {took:?}: the read waited on the file"
        );
    }
    // The buffered read keeps its cap, and says so by code.
    let r = p
        .exec(&h, ExecRequest::shell("head -c 5000 /dev/zero > /w/small"))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0);
    let small = SandboxPath::new("/w/small").unwrap();
    // Chunks that stay under the cap may arrive first (how the engine frames the output
    // decides that); the stream must still end in the refusal, never in a short success.
    let mut stream = p.read_file_stream(&h, &small, 4096).await.unwrap();
    let mut delivered = 0usize;
    let err = loop {
        match stream.next_chunk().await {
            Some(Ok(chunk)) => delivered += chunk.len(),
            Some(Err(err)) => break err,
            None => panic!("a 5000-byte file under a 4096-byte cap ended without a refusal"),
        }
    };
    assert_eq!(err.code(), Some(ErrorCode::FileTooLarge), "{err}");
    assert!(
        delivered <= 4096,
        "{delivered} bytes passed a 4096-byte cap"
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_tree_of_1000_directories_is_one_quick_walk() {
    let ns = namespace("tree");
    let p = provider(&ns).await;
    let h = p.create(request()).await.unwrap();
    let r = p
        .exec(
            &h,
            ExecRequest::shell(
                "mkdir -p /w/t && cd /w/t && i=0; while [ $i -lt 1000 ]; do mkdir d$i; i=$((i+1)); done; touch d7/leaf",
            ),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr_lossy());
    let root = SandboxPath::new("/w/t").unwrap();
    let started = Instant::now();
    let all = p
        .list_tree(&h, &root, sandbox_core::TreeLimits::depth(4))
        .await
        .unwrap();
    let took = started.elapsed();
    println!("listed {} entries in {took:?}", all.entries.len());
    assert_eq!(all.entries.len(), 1001);
    assert!(!all.truncated);
    assert!(
        all.entries.windows(2).all(|w| w[0].path < w[1].path),
        "entries are sorted by path"
    );
    assert!(
        all.entries
            .iter()
            .any(|e| e.path.as_str() == "/w/t/d7/leaf" && e.name == "leaf"),
        "the second level is listed"
    );
    assert!(
        took < Duration::from_secs(20),
        "1,000 directories took {took:?} (one exec per directory took 49 s)"
    );
    // Depth 0 is the root's own entries, as the port's walking default has it.
    let top = p
        .list_tree(&h, &root, sandbox_core::TreeLimits::depth(0))
        .await
        .unwrap();
    assert_eq!(top.entries.len(), 1000);
    let mut capped = sandbox_core::TreeLimits::depth(4);
    capped.max_entries = 10;
    let cut = p.list_tree(&h, &root, capped).await.unwrap();
    assert!(cut.truncated);
    assert_eq!(cut.entries.len(), 10);
    // A deadline stops the walk too, with what it had.
    let mut hurried = sandbox_core::TreeLimits::depth(4);
    hurried.deadline = Duration::from_millis(1);
    let started = Instant::now();
    let cut = p.list_tree(&h, &root, hurried).await.unwrap();
    assert!(cut.truncated, "a 1 ms walk of 1,001 entries was complete");
    assert!(cut.entries.len() < 1001);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    cleanup(&p).await;
}

/// The refusal every restore of something that is not this tenant's snapshot in this namespace
/// must give: `not_found`, code `snapshot_not_found`, and a message naming nothing.
fn assert_snapshot_not_found(
    what: &str,
    got: Result<sandbox_core::SandboxHandle, sandbox_core::Error>,
) -> String {
    let err = match got {
        Ok(h) => panic!("restoring {what} created {}", h.id()),
        Err(e) => e,
    };
    assert_eq!(
        (err.kind(), err.code()),
        (ErrorKind::NotFound, Some(ErrorCode::SnapshotNotFound)),
        "restoring {what}: {err}"
    );
    err.message().to_owned()
}

/// A restore as tenant `tenant` (`None`: no ownership metadata) of `template`.
fn restore_request(tenant: Option<&str>, template: &str) -> CreateRequest {
    let mut r = request();
    r.template = TemplateId::new(template).unwrap();
    r.from_snapshot = true;
    if let Some(t) = tenant {
        r.metadata.insert(
            sandbox_core::owner_metadata::TENANT.to_owned(),
            t.to_owned(),
        );
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn restore_takes_only_this_tenants_snapshots_of_this_namespace() {
    use sandbox_core::{Snapshots, owner_metadata};
    let ns = namespace("rst");
    let p = provider(&ns).await;
    let other_ns = namespace("rso");
    let other = provider(&other_ns).await;
    let file = SandboxPath::new("/workspace/secret.txt").unwrap();

    let mut source = request();
    source
        .metadata
        .insert(owner_metadata::TENANT.to_owned(), "7".to_owned());
    let src = p.create(source.clone()).await.unwrap();
    p.write_file(&src, &file, b"tenant 7's file").await.unwrap();
    let snap = p.create_snapshot(src.id(), Some("mine")).await.unwrap();
    let listed = p.list_snapshots(Some(src.id())).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .find(|s| s.id == snap.id)
            .and_then(|s| s.tenant)
            .map(|t| t.get()),
        Some(7),
        "the snapshot records its source's tenant: {listed:?}"
    );
    let tag = snap.id.as_str().rsplit_once('-').unwrap().1;
    assert_eq!(tag.len(), 32, "128 random bits in hex: {}", snap.id);
    // Another deployment's snapshot, of a sandbox of the same tenant number.
    let theirs_src = other.create(source).await.unwrap();
    let theirs = other
        .create_snapshot(theirs_src.id(), Some("theirs"))
        .await
        .unwrap();
    let image_id = p
        .docker()
        .inspect_image(snap.id.as_str())
        .await
        .unwrap()
        .id
        .unwrap();

    let before = p.list(&ListFilter::default()).await.unwrap().len();
    let missing = format!("sandbox-snapshot-{ns}:no-such-snapshot");
    let mut messages = vec![
        assert_snapshot_not_found(
            "another tenant's snapshot",
            p.create(restore_request(Some("8"), snap.id.as_str())).await,
        ),
        assert_snapshot_not_found(
            "a tenant's snapshot without a tenant",
            p.create(restore_request(None, snap.id.as_str())).await,
        ),
        assert_snapshot_not_found(
            "another namespace's snapshot",
            p.create(restore_request(Some("7"), theirs.id.as_str()))
                .await,
        ),
        assert_snapshot_not_found(
            "an image that is not a snapshot",
            p.create(restore_request(Some("7"), IMAGE)).await,
        ),
        assert_snapshot_not_found(
            "a missing snapshot",
            p.create(restore_request(Some("7"), &missing)).await,
        ),
        assert_snapshot_not_found(
            "a snapshot named by its image ID",
            p.create(restore_request(Some("8"), &image_id)).await,
        ),
    ];
    // Naming a snapshot as a plain template is no way around the check.
    let mut plain = restore_request(Some("8"), &image_id);
    plain.from_snapshot = false;
    messages.push(assert_snapshot_not_found(
        "a snapshot's image ID as a plain template",
        p.create(plain).await,
    ));
    let mut plain = restore_request(Some("8"), snap.id.as_str());
    plain.from_snapshot = false;
    messages.push(assert_snapshot_not_found(
        "a snapshot as a plain template",
        p.create(plain).await,
    ));
    // Whatever the pull policy, a restore never asks a registry: a name on a registry that is
    // not there is refused as a missing snapshot, not tried.
    let mut pulling = config(&ns);
    pulling.pull_policy = sandbox_provider_docker::PullPolicy::Always;
    let pulling = DockerProvider::connect(pulling).await.unwrap();
    messages.push(assert_snapshot_not_found(
        "a registry image under pull policy always",
        pulling
            .create(restore_request(
                Some("7"),
                "127.0.0.1:9/sbx-pull-probe:latest",
            ))
            .await,
    ));
    assert!(
        messages.windows(2).all(|w| w[0] == w[1]),
        "the refusals differ, which tells a caller what exists: {messages:?}"
    );
    for m in &messages {
        assert!(
            !m.contains("sandbox-snapshot") && !m.contains("sha256") && !m.contains(IMAGE),
            "the refusal names an image: {m}"
        );
    }
    assert_eq!(
        p.list(&ListFilter::default()).await.unwrap().len(),
        before,
        "a refused restore created a container"
    );

    // The owner restores it (also under pull policy always: snapshots are local).
    let restored = pulling
        .create(restore_request(Some("7"), snap.id.as_str()))
        .await
        .unwrap();
    assert_eq!(
        p.read_file(&restored, &file).await.unwrap(),
        b"tenant 7's file"
    );

    cleanup(&p).await;
    cleanup(&other).await;
    p.delete_snapshot(&snap.id).await.unwrap();
    other.delete_snapshot(&theirs.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn the_idle_sweeper_keeps_a_container_whose_command_still_runs() {
    let ns = namespace("live");
    let p = provider(&ns).await;
    let mut short = request();
    short.timeout = TimeoutPolicy {
        idle: IdleTimeout::after_secs(2).unwrap(),
        on_timeout: TimeoutAction::Kill,
        auto_resume: false,
    };
    let busy = p.create(short.clone()).await.unwrap();
    let idle = p.create(short).await.unwrap();
    // A command that outlives the 2 s TTL.
    let running = {
        let (p, h) = (p.clone(), busy.clone());
        tokio::spawn(async move {
            p.exec(&h, ExecRequest::shell("sleep 6; echo finished"))
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&p, &busy, "sleep 6").await == 0 {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Judged by a clock ten seconds ahead: both markers are past the TTL.
    let mut c = config(&ns);
    let clock = ManualClock::new(time::OffsetDateTime::now_utc());
    clock.advance(Duration::from_secs(10));
    c.clock = Arc::new(clock);
    let sweeping = DockerProvider::connect(c).await.unwrap();
    let report = sweeper::sweep(&sweeping).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let reaped: Vec<_> = report.reaped.iter().map(|id| id.as_str()).collect();
    assert_eq!(
        reaped,
        vec![idle.id().as_str()],
        "only the idle container goes; the one running a command stays"
    );
    let r = running
        .await
        .unwrap()
        .expect("the command survives the sweep");
    assert_eq!((r.exit_code, r.stdout_lossy().as_str()), (0, "finished\n"));

    // Its command done, its channel still open: the channel's relay is an exec the engine
    // reports running, so the container is kept (at most the channel's idle timeout longer
    // than its TTL: the channel closes after that long without a call).
    let report = sweeper::sweep(&sweeping).await.unwrap();
    assert!(report.reaped.is_empty(), "{report:?}");
    // Its channel closed, the same container is idle like any other.
    p.channel(busy.id().as_str())
        .expect("agent mode")
        .invalidate()
        .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let report = sweeper::sweep(&sweeping).await.unwrap();
        let reaped: Vec<_> = report.reaped.iter().map(|id| id.as_str()).collect();
        if !reaped.is_empty() {
            assert_eq!(reaped, vec![busy.id().as_str()]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a closed channel's relay still held the container"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_flood_on_pid1_stdout_does_not_grow_the_log_past_its_bound() {
    let ns = namespace("log");
    let p = provider(&ns).await;
    let h = p.create(request()).await.unwrap();
    let inspect = p
        .docker()
        .inspect_container(h.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let log = inspect.host_config.unwrap().log_config.unwrap();
    assert_eq!(log.typ.as_deref(), Some("json-file"));
    let max = sandbox_provider_docker::config::DEFAULT_LOG_MAX_BYTES;
    assert_eq!(
        log.config.unwrap().get("max-size"),
        Some(&max.to_string()),
        "one file, rotated at the configured size"
    );
    let log_path = std::path::PathBuf::from(inspect.log_path.expect("a json-file log"));
    // 50 MB on the container's own stdout, which the engine logs (exec output is not logged),
    // then a line to find afterwards: the log is live, only bounded.
    let r = p
        .exec(
            &h,
            ExecRequest::shell(
                "head -c 50000000 /dev/zero | tr '\\0' a > /proc/1/fd/1; echo; echo end-of-flood > /proc/1/fd/1",
            ),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr_lossy());
    // The engine copies the stream into the file on its own time: watch it for a while.
    // One message is at most 16 KiB of output, a little more as a JSON line.
    let bound = max + 64 * 1024;
    let mut largest = 0;
    let mut seen_end = false;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let size = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        largest = largest.max(size);
        seen_end |= std::fs::read(&log_path)
            .map(|b| b.windows(12).any(|w| w == b"end-of-flood"))
            .unwrap_or(false);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        largest <= bound,
        "the log grew to {largest} bytes (bound {bound})"
    );
    assert!(
        seen_end,
        "the log stopped recording: the last line never arrived"
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn the_disk_limit_is_reported_as_the_engine_enforces_it_and_never_fails_a_create() {
    use sandbox_provider_docker::StorageLimit;
    let ns = namespace("dsk");
    let p = provider(&ns).await;
    let report = p.isolation_report().await.unwrap();
    let info = p.docker().info().await.unwrap();
    let backing = sandbox_provider_docker::isolation::backing_filesystem(&info).map(str::to_owned);
    let h = p.create(request()).await.unwrap();
    let host = p
        .docker()
        .inspect_container(h.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap()
        .host_config
        .unwrap();
    let size = host
        .storage_opt
        .as_ref()
        .and_then(|o| o.get("size"))
        .cloned();
    let limit = sandbox_provider_docker::config::DEFAULT_STORAGE_LIMIT_BYTES;
    match (info.driver.as_deref(), backing.as_deref()) {
        // This engine (and any overlay2 on ext4): not enforceable, so not asked for.
        (Some("overlay2"), Some("extfs")) => {
            match &report.storage {
                StorageLimit::NotEnforced(why) => {
                    assert!(why.contains("overlay2 on extfs"), "{why}")
                }
                other => panic!("overlay2 on extfs reported as {other:?}"),
            }
            assert_eq!(
                size, None,
                "the create asked for a limit the engine refuses"
            );
        }
        // Drivers that enforce it get it on every container.
        (Some("btrfs" | "zfs" | "devicemapper"), _) => {
            assert!(matches!(report.storage, StorageLimit::Enforced(_)));
            assert_eq!(size, Some(limit.to_string()));
        }
        // Elsewhere the first create decided: whatever it learnt, the body agrees with it.
        _ => {
            let after = p.isolation_report().await.unwrap();
            let enforced = matches!(after.storage, StorageLimit::Enforced(_));
            assert_eq!(size.is_some(), enforced, "{:?}", after.storage);
        }
    }
    assert_eq!(report.storage_limit_bytes, limit);
    assert_eq!(
        report.userns_remap,
        info.security_options
            .iter()
            .flatten()
            .any(|o| o.contains("name=userns"))
    );
    // Off means off: no limit asked for, whatever the engine.
    let mut c = config(&namespace("dsk"));
    c.storage_limit_bytes = 0;
    let off = DockerProvider::connect(c).await.unwrap();
    assert_eq!(
        off.isolation_report().await.unwrap().storage,
        StorageLimit::Off
    );
    let h = off.create(request()).await.unwrap();
    let host = off
        .docker()
        .inspect_container(h.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap()
        .host_config
        .unwrap();
    assert!(host.storage_opt.unwrap_or_default().is_empty());
    cleanup(&off).await;
    cleanup(&p).await;
}
