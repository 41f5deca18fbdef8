//! Agent mode's background processes on the real engine, across a "service restart": a process
//! started through one provider value keeps running after that value (and its channel) is
//! dropped; a new provider value, with a new channel, lists it, replays its output from offset
//! 0 exactly, and a KILL ends it, listed afterwards as ended by KILL.
//!
//! Needs the engine, the `sandbox-busybox:test` image and the static agent
//! (`SANDBOX_AGENT_BIN`, which `cargo xtask test`'s docker engine stage passes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test module: a failed unwrap is a failed test.

use std::time::{Duration, Instant};

use sandbox_core::{
    Checked, CreateRequest, ListFilter, ProcessEvent, ProcessSelector, ProcessSpec, ProcessStatus,
    ProcessStream, ProcessTag, SandboxProvider, Signal, TemplateId,
};
use sandbox_provider_docker::DockerProvider;

use crate::support::{IMAGE, config, engine_sh, namespace};

/// The script's whole output: 300 numbered lines, then `ready`; then it sleeps, silent.
const SCRIPT: &str = "i=0; while [ $i -lt 300 ]; do echo \"line $i of the survivor\"; i=$((i+1)); done; echo ready; exec sleep 600";

fn expected_output() -> Vec<u8> {
    let mut out = String::new();
    for i in 0..300 {
        out.push_str(&format!("line {i} of the survivor\n"));
    }
    out.push_str("ready\n");
    out.into_bytes()
}

async fn provider(ns: &str) -> Checked<DockerProvider> {
    DockerProvider::connect(config(ns))
        .await
        .expect("connect in agent mode")
}

/// Reads `stream` until `len` bytes came, checking each `Data` starts where the last ended.
async fn read_bytes(stream: &mut ProcessStream, len: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while bytes.len() < len {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next_event()).await {
            Ok(Some(ProcessEvent::Data { offset, data, .. })) => {
                assert_eq!(offset, bytes.len() as u64, "contiguous offsets");
                bytes.extend_from_slice(&data);
            }
            Ok(other) => panic!("after {} bytes: {other:?}", bytes.len()),
            Err(_) => panic!("only {} of {len} bytes within 60 s", bytes.len()),
        }
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_background_process_outlives_its_provider_and_a_new_channel_replays_and_kills_it() {
    let ns = namespace("aproc");
    let expected = expected_output();
    let tag = ProcessTag::new("survivor").unwrap();

    let first = provider(&ns).await;
    let h = first
        .create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap();
    let processes = first
        .as_processes()
        .expect("the agent plane serves processes");
    let info = processes
        .start_process(&h, ProcessSpec::shell(SCRIPT).tagged(tag.clone()))
        .await
        .unwrap();
    assert_eq!(info.status, ProcessStatus::Running);
    assert_eq!(info.argv, ["/bin/sh", "-c", SCRIPT]);
    // Its whole output, then drop the attach, the provider and with it the channel.
    let mut attach = processes
        .attach_process(&h, &ProcessSelector::Pid(info.pid), Some(0))
        .await
        .unwrap();
    assert_eq!(read_bytes(&mut attach, expected.len()).await, expected);
    drop(attach);
    let first_channel = first.channel(h.id().as_str()).unwrap();
    assert_eq!(first_channel.execs_opened(), 1);
    drop(first);
    drop(first_channel);

    // The process runs on, as the engine (not the agent) sees it.
    let second = provider(&ns).await;
    let alive = format!(
        "kill -0 {} 2>/dev/null && echo alive || echo gone",
        info.pid
    );
    assert_eq!(engine_sh(&second, &h, &alive).await, "alive");

    // The new provider value opens a new channel and finds it, by pid and by tag.
    let processes = second.as_processes().unwrap();
    let listed = processes.list_processes(&h).await.unwrap();
    let entry = listed
        .iter()
        .find(|p| p.pid == info.pid)
        .unwrap_or_else(|| panic!("pid {} not in {listed:?}", info.pid));
    assert_eq!(entry.status, ProcessStatus::Running);
    assert_eq!(entry.tag.as_ref(), Some(&tag));
    assert_eq!(entry.argv, info.argv);
    assert_eq!(entry.output_bytes, expected.len() as u64);
    assert_eq!(second.channel(h.id().as_str()).unwrap().execs_opened(), 1);

    // Offset 0 replays the earlier output exactly, and KILL (by tag) ends the attach.
    let mut replay = processes
        .attach_process(&h, &ProcessSelector::Tag(tag.clone()), Some(0))
        .await
        .unwrap();
    assert_eq!(read_bytes(&mut replay, expected.len()).await, expected);
    processes
        .signal_process(&h, &ProcessSelector::Tag(tag.clone()), Signal::Kill)
        .await
        .unwrap();
    let killed = ProcessStatus::Exited {
        exit_code: None,
        signal: Some(Signal::Kill),
    };
    match tokio::time::timeout(Duration::from_secs(30), replay.next_event()).await {
        Ok(Some(ProcessEvent::Exited(status))) => assert_eq!(status, killed),
        other => panic!("after the kill the attach gave {other:?}"),
    }
    assert!(replay.next_event().await.is_none());

    // Listed as ended by KILL; the engine sees it gone.
    let entry = processes
        .list_processes(&h)
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.pid == info.pid)
        .expect("an ended process stays listed");
    assert_eq!(entry.status, killed);
    assert_eq!(engine_sh(&second, &h, &alive).await, "gone");

    for s in second
        .list(&ListFilter::default())
        .await
        .unwrap_or_default()
    {
        let _ = second.delete(&s.id).await;
    }
}
