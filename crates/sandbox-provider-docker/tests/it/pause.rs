//! Pause and resume on the real engine (the cgroup freezer): a running process is frozen, not
//! killed, and counts on from where it stood after the resume (its memory kept); the agent
//! channel re-opens after the resume; the idle sweep pauses a container whose policy pauses
//! (and deletes one whose policy kills), and a connect resumes it with its files.
//!
//! Needs the engine, the `sandbox-busybox:test` image and the static agent
//! (`SANDBOX_AGENT_BIN`, which `cargo xtask test`'s docker engine stage passes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test module: a failed unwrap is a failed test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::models::ContainerStateStatusEnum;
use bollard::query_parameters::InspectContainerOptions;
use sandbox_core::{
    Checked, ConnectRequest, CreateRequest, ErrorCode, ExecRequest, IdleTimeout, ListFilter,
    ManualClock, ProcessSpec, ProcessStatus, SandboxHandle, SandboxPath, SandboxProvider,
    SandboxState, TemplateId, TimeoutAction, TimeoutPolicy,
};
use sandbox_provider_docker::{DockerProvider, labels, sweeper};

use crate::support::{IMAGE, config, engine_sh, namespace};

/// Counts in memory (the shell variable `i`) and writes each value to a file: after a resume
/// the file goes on from the value in memory, which a restarted process could not know.
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 1; done";

async fn provider(ns: &str) -> Checked<DockerProvider> {
    DockerProvider::connect(config(ns))
        .await
        .expect("connect in agent mode")
}

async fn cleanup(p: &DockerProvider) {
    for s in p.list(&ListFilter::default()).await.unwrap_or_default() {
        let _ = p.delete(&s.id).await;
    }
}

async fn counter(p: &DockerProvider, h: &SandboxHandle) -> u64 {
    let read = p
        .read_file(h, &SandboxPath::new("/tmp/counter").unwrap())
        .await
        .unwrap();
    String::from_utf8_lossy(&read).trim().parse().unwrap()
}

async fn engine_state(p: &DockerProvider, h: &SandboxHandle) -> Option<ContainerStateStatusEnum> {
    p.docker()
        .inspect_container(h.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap()
        .state
        .and_then(|s| s.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_running_process_is_frozen_by_pause_and_counts_on_after_resume() {
    let ns = namespace("pause");
    let p = provider(&ns).await;
    let h = p
        .create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap();
    let file = SandboxPath::new("/tmp/kept.txt").unwrap();
    p.write_file(&h, &file, b"written before the pause")
        .await
        .unwrap();
    let processes = p.as_processes().expect("the agent plane serves processes");
    let info = processes
        .start_process(&h, ProcessSpec::shell(COUNTER))
        .await
        .unwrap();
    // Let it count a little, so the value in memory is not where a restart would begin.
    let deadline = Instant::now() + Duration::from_secs(20);
    while p
        .read_file(&h, &SandboxPath::new("/tmp/counter").unwrap())
        .await
        .map_or(true, |b| {
            String::from_utf8_lossy(&b)
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
                < 3
        })
    {
        assert!(Instant::now() < deadline, "the counter did not reach 3");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let channel = p.channel(h.id().as_str()).expect("agent mode");
    let opened_before = channel.execs_opened();
    let before = counter(&p, &h).await;

    let pauser = p.as_pause_resume().expect("docker implements pause_resume");
    pauser.pause(h.id()).await.unwrap();
    assert_eq!(
        engine_state(&p, &h).await,
        Some(ContainerStateStatusEnum::PAUSED),
        "the engine's freezer holds it"
    );
    assert_eq!(p.get(h.id()).await.unwrap().state, SandboxState::Paused);
    // Refused at once, on the channel that was open before the pause too.
    let started = Instant::now();
    let err = p
        .exec(&h, ExecRequest::argv("true", Vec::<String>::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SandboxPaused), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the refusal took {:?}",
        started.elapsed()
    );
    let second = pauser.pause(h.id()).await.unwrap_err();
    assert_eq!(second.code(), Some(ErrorCode::SandboxPaused), "{second}");
    assert!(
        second
            .message()
            .contains(&format!("sandbox '{}' is already paused", h.id())),
        "{second}"
    );
    // Five seconds frozen: a counter that ran on would have moved by about five; the slack
    // below covers the ticks between the last read and the pause taking hold.
    tokio::time::sleep(Duration::from_secs(5)).await;

    pauser.resume(h.id()).await.unwrap();
    assert_eq!(p.get(h.id()).await.unwrap().state, SandboxState::Running);
    let thawed = counter(&p, &h).await;
    assert!(
        thawed >= before && thawed <= before + 2,
        "frozen means no counting: {before} before the pause, {thawed} right after the resume"
    );
    assert!(
        channel.execs_opened() > opened_before,
        "the channel re-opened after the resume"
    );
    let listed = processes.list_processes(&h).await.unwrap();
    let same = listed
        .iter()
        .find(|i| i.pid == info.pid)
        .expect("the process started before the pause is listed");
    assert_eq!(same.status, ProcessStatus::Running);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let later = counter(&p, &h).await;
    assert!(
        later > thawed,
        "the process counts on after the resume: {thawed} then {later}"
    );
    assert_eq!(
        p.read_file(&h, &file).await.unwrap(),
        b"written before the pause"
    );
    // Resuming a running sandbox changes nothing.
    pauser.resume(h.id()).await.unwrap();
    assert_eq!(
        engine_state(&p, &h).await,
        Some(ContainerStateStatusEnum::RUNNING)
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn the_idle_sweep_pauses_a_container_whose_policy_pauses_and_connect_resumes_it() {
    let ns = namespace("pswp");
    let p = provider(&ns).await;
    let with = |on_timeout: TimeoutAction, auto_resume: bool| {
        let mut r = CreateRequest::new(TemplateId::new(IMAGE).unwrap());
        r.timeout = TimeoutPolicy {
            idle: IdleTimeout::after_secs(2).unwrap(),
            on_timeout,
            auto_resume,
        };
        r
    };
    let pausing = p.create(with(TimeoutAction::Pause, true)).await.unwrap();
    let killing = p.create(with(TimeoutAction::Kill, false)).await.unwrap();
    let file = SandboxPath::new("/tmp/kept.txt").unwrap();
    p.write_file(&pausing, &file, b"kept through the idle pause")
        .await
        .unwrap();
    let labels_of = p
        .docker()
        .inspect_container(pausing.id().as_str(), None::<InspectContainerOptions>)
        .await
        .unwrap()
        .config
        .and_then(|c| c.labels)
        .unwrap_or_default();
    assert_eq!(
        labels_of.get(labels::ON_IDLE).map(String::as_str),
        Some(labels::ON_IDLE_PAUSE)
    );
    for h in [&pausing, &killing] {
        p.channel(h.id().as_str())
            .expect("agent mode")
            .invalidate()
            .await;
        let year = engine_sh(
            &p,
            h,
            &format!(
                "touch -d '2001-01-01 00:00:00' {m} && date -r {m} +%Y",
                m = sandbox_provider_docker::exec::ACTIVITY_MARKER
            ),
        )
        .await;
        assert_eq!(year, "2001");
    }

    // The sweep judges by a clock ten seconds ahead, so the 2 s TTLs have run out.
    let mut c = config(&ns);
    let clock = ManualClock::new(time::OffsetDateTime::now_utc());
    clock.advance(Duration::from_secs(10));
    c.clock = Arc::new(clock);
    let sweeping = DockerProvider::connect(c).await.unwrap();
    // The closed channels' relay execs may take a moment to end; until then they hold both.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut paused, mut reaped) = (Vec::new(), Vec::new());
    while paused.is_empty() || reaped.is_empty() {
        let report = sweeper::sweep(&sweeping).await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        paused.extend(report.paused);
        reaped.extend(report.reaped);
        assert!(
            Instant::now() < deadline,
            "paused {paused:?}, reaped {reaped:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        paused,
        vec![pausing.id().clone()],
        "the pause policy pauses"
    );
    assert_eq!(
        reaped,
        vec![killing.id().clone()],
        "the kill policy deletes"
    );
    assert_eq!(
        engine_state(&p, &pausing).await,
        Some(ContainerStateStatusEnum::PAUSED)
    );
    // A paused container of the pause policy is left alone by later sweeps.
    let again = sweeper::sweep(&sweeping).await.unwrap();
    assert!(
        again.paused.is_empty() && again.reaped.is_empty(),
        "{again:?}"
    );
    assert_eq!(
        p.get(pausing.id()).await.unwrap().state,
        SandboxState::Paused
    );

    let resumed = p
        .connect(ConnectRequest::new(pausing.id().clone()))
        .await
        .unwrap();
    assert_eq!(
        p.get(pausing.id()).await.unwrap().state,
        SandboxState::Running
    );
    assert_eq!(
        p.read_file(&resumed, &file).await.unwrap(),
        b"kept through the idle pause"
    );
    cleanup(&p).await;
}
