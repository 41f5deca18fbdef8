//! The idle sweep of a real `sandbox serve` in agent mode, with a short idle TTL and a fast
//! sweep: a session used only through the agent (execs and file writes, at intervals well under
//! the TTL, for several TTLs) is never reaped, while a session abandoned in the same run is;
//! and once the busy session goes quiet it is reaped too, within a few TTLs.
//!
//! In agent mode the service's exec wrapper no longer touches the activity marker: the agent
//! does, on every request it serves. The agent channel is an exec the sweep counts as work
//! while it is open, and it closes after a quarter of the TTL without a call, so between the
//! requests here the sweep judges the busy sandbox by its marker alone; the test checks that
//! it saw the channel closed between requests, so a pass does not rest on the open channel.
//!
//! Needs the engine, the `sandbox-busybox:test` image and the static agent
//! (`SANDBOX_AGENT_BIN`): ignored in a plain `cargo test`, run by `cargo xtask test`.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::time::{Duration, Instant};

use crate::support;
use support::agent_mode::{self, relay_pids};
use support::container_ids;
use support::serve::{START_DEADLINE, Service, temp_dir};

/// The idle TTL, in seconds: short, so the run takes under a minute; long enough that the
/// requests below come well within it on a loaded machine.
const TTL_SECS: u64 = 6;
const TTL: Duration = Duration::from_secs(TTL_SECS);
/// How long the busy session is kept busy: several TTLs.
const BUSY_FOR: Duration = Duration::from_secs(5 * TTL_SECS);
/// The gap between the starts of the busy session's requests: half the TTL (a slow answer on a
/// loaded machine does not stretch it), and longer than the channel's idle close (a quarter of
/// the TTL), so the channel closes between them.
const BUSY_GAP: Duration = Duration::from_secs(TTL_SECS / 2);
/// The bound on reaping an idle session: generous (the TTL, the channel's idle close, a sweep
/// interval, the engine), and still well under the channel's default idle timeout of a minute.
const REAP_WITHIN: Duration = Duration::from_secs(6 * TTL_SECS);

struct Cleanup(String);

/// The sessions' containers carry no test label for the pipeline's final sweep.
impl Drop for Cleanup {
    fn drop(&mut self) {
        support::remove_namespace(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_sandbox_used_only_through_the_agent_survives_sweeps_and_is_reaped_once_quiet() {
    let namespace = format!("tagidle-{:08x}", fastrand::u32(..));
    let _cleanup = Cleanup(namespace.clone());
    let dir = temp_dir();
    let token_file = dir.join("dev-token");
    let log = dir.join("serve.log");
    let mut env = agent_mode::env();
    env.push(("SANDBOX_DOCKER_IDLE_TTL_SECONDS", TTL_SECS.to_string()));
    env.push(("SANDBOX_DOCKER_SWEEP_INTERVAL_SECONDS", "1".to_owned()));
    let mut service = Service::spawn(&namespace, &token_file, &log, &agent_mode::borrowed(&env));
    let ready = service.ready(START_DEADLINE).await;
    assert!(
        ready.is_ok(),
        "sandbox serve did not start: {ready:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim().to_owned();
    let s = Session {
        service: &service,
        token: &token,
    };

    // One session used once and abandoned; one kept busy.
    s.exec_ok("abandoned", r#"{"command":"true"}"#).await;
    let abandoned = s.sandbox("abandoned").await;
    s.exec_ok(
        "busy",
        r#"{"command":"echo kept > state.txt","shell":true}"#,
    )
    .await;
    let busy = s.sandbox("busy").await;
    let started = Instant::now();

    // Busy: an exec or a file write every BUSY_GAP, for BUSY_FOR and at least until the
    // abandoned session is reaped (proof, in the same run, that sweeps run and the TTL bites).
    let mut abandoned_reaped_after = None;
    let mut closed_between = 0;
    let mut n = 0_u32;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + BUSY_GAP, BUSY_GAP);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while started.elapsed() < BUSY_FOR || abandoned_reaped_after.is_none() {
        ticks.tick().await;
        if relay_pids(&busy).is_empty() {
            closed_between += 1;
        }
        n += 1;
        if n.is_multiple_of(2) {
            let (status, out) = s
                .service
                .call(
                    "PUT",
                    &format!("/v1/sessions/busy/files/content?path=/workspace/note-{n}.txt"),
                    &token,
                    &format!("note {n}"),
                )
                .await;
            assert_eq!(status, 204, "file write {n}: {out}");
        } else {
            let out = s
                .exec_ok("busy", &format!(r#"{{"command":"echo","args":["{n}"]}}"#))
                .await;
            assert_eq!(out["stdout"], format!("{n}\n"), "{out}");
        }
        assert_eq!(
            s.sandbox("busy").await,
            busy,
            "the busy session kept its sandbox"
        );
        let ids = container_ids(&namespace).await;
        assert!(listed(&ids, &busy), "the busy sandbox was reaped: {ids:?}");
        if abandoned_reaped_after.is_none() && !listed(&ids, &abandoned) {
            abandoned_reaped_after = Some(started.elapsed());
        }
        assert!(
            abandoned_reaped_after.is_some() || started.elapsed() < REAP_WITHIN,
            "the abandoned sandbox was not reaped within {REAP_WITHIN:?}"
        );
    }
    println!(
        "busy for {:?} ({n} requests, the channel closed before {closed_between} of them); \
         the abandoned sandbox reaped after {abandoned_reaped_after:?}",
        started.elapsed()
    );
    assert!(
        closed_between >= 2,
        "the channel never closed between requests ({closed_between}): the sweep may have \
         kept the busy sandbox for its open channel, not for its marker"
    );
    let out = s
        .exec_ok("busy", r#"{"command":"cat","args":["state.txt"]}"#)
        .await;
    assert_eq!(out["stdout"], "kept\n", "the busy sandbox's files: {out}");

    // Quiet: the busy session's last request is behind; another session's requests (not a
    // create: its first) keep the service's sweep running.
    let quiet = Instant::now();
    s.exec_ok("other", r#"{"command":"true"}"#).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.exec_ok("other", r#"{"command":"true"}"#).await;
        if !listed(&container_ids(&namespace).await, &busy) {
            break;
        }
        assert!(
            quiet.elapsed() < REAP_WITHIN,
            "the quiet sandbox was not reaped within {REAP_WITHIN:?}; the service's log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    println!(
        "the quiet sandbox reaped {:?} after its last request (TTL {TTL:?})",
        quiet.elapsed()
    );
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log_text.contains("idle sweep reclaimed a container"),
        "the service's own sweep reaped it: {log_text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether `id` (the service's full ID) is among `ids` (the engine's short ones).
fn listed(ids: &[String], id: &str) -> bool {
    ids.iter().any(|short| id.starts_with(short.as_str()))
}

struct Session<'a> {
    service: &'a Service,
    token: &'a str,
}

impl Session<'_> {
    async fn exec_ok(&self, session: &str, body: &str) -> serde_json::Value {
        let (status, out) = self
            .service
            .call(
                "POST",
                &format!("/v1/sessions/{session}/exec"),
                self.token,
                body,
            )
            .await;
        assert_eq!(
            (status, out["exit_code"].as_i64()),
            (200, Some(0)),
            "{session}: {out}"
        );
        out
    }

    /// The sandbox bound to `session`, by the service's account.
    async fn sandbox(&self, session: &str) -> String {
        let (status, out) = self
            .service
            .call("GET", &format!("/v1/sessions/{session}"), self.token, "")
            .await;
        assert_eq!(status, 200, "{session}: {out}");
        out["sandbox_id"].as_str().unwrap().to_owned()
    }
}
