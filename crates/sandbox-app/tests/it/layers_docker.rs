//! The production stack (`Metered(Checked(Docker))`, wired by `serve::build_state`) on the real
//! engine: a snapshot create and a terminal open each land in the provider's latency
//! histogram, because the metrics layer's `as_*` accessors hand out its own wrappers; the agent
//! channel's opens and round trips and the calls by data plane are exposed too.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;

use sandbox_core::{BindingKey, ExecRequest, TerminalOptions};

/// The `_count` sample of the provider histogram for `operation` (0 when never observed).
fn observed(text: &str, operation: &str) -> f64 {
    let series =
        format!("sandbox_provider_operation_duration_seconds_count{{operation=\"{operation}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn snapshot_create_and_terminal_open_are_timed_through_the_stack() {
    let s = support::start("layers", &["token-layers"]).await;
    let key = BindingKey::new(1, "layers-1").unwrap();
    let manager = &s.state.manager;
    manager
        .exec(&key, ExecRequest::argv("true", Vec::<String>::new()))
        .await
        .unwrap();
    let before = s.state.metrics.encode().unwrap();
    assert!(observed(&before, "exec") >= 1.0, "{before}");
    assert_eq!(observed(&before, "create_snapshot"), 0.0, "{before}");
    assert_eq!(observed(&before, "open_terminal"), 0.0, "{before}");

    manager.snapshot(&key, None).await.unwrap();
    let terminal = manager
        .open_terminal(&key, TerminalOptions::default())
        .await
        .unwrap();
    drop(terminal);

    let after = s.state.metrics.encode().unwrap();
    assert_eq!(observed(&after, "create_snapshot"), 1.0, "{after}");
    assert_eq!(observed(&after, "open_terminal"), 1.0, "{after}");
    // The snapshot image goes with the namespace when `s` drops.
    manager.destroy(&key).await.unwrap();
}

/// The value of the sample line `series` (its name and labels, exactly), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// In agent mode (the default) the first exec opens the sandbox's channel once, a resolve after
/// a full connect is a health call on it (round trips in the histogram), and every backend call is counted
/// under the agent plane; in exec mode the calls say exec and no channel opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn the_agent_channel_and_the_data_plane_are_in_the_metrics() {
    let s = support::start("chanmetrics", &["token-chanmetrics"]).await;
    let key = BindingKey::new(1, "chanmetrics-1").unwrap();
    for _ in 0..3 {
        s.state
            .manager
            .exec(&key, ExecRequest::argv("true", Vec::<String>::new()))
            .await
            .unwrap();
    }
    let text = s.state.metrics.encode().unwrap();
    assert_eq!(
        sample(
            &text,
            r#"sandbox_agent_channel_opens_total{reason="first",outcome="ok"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        !text.contains(r#"outcome="error""#),
        "no open failed:\n{text}"
    );
    let round_trips = sample(&text, "sandbox_agent_round_trip_seconds_count").unwrap_or(0.0);
    assert!(
        round_trips >= 1.0,
        "a resolve after the first full connect is a health call:\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"sandbox_provider_calls_total{operation="exec",data_plane="agent"}"#
        ),
        Some(3.0),
        "{text}"
    );
    s.state.manager.destroy(&key).await.unwrap();

    let exec = support::start_with(
        "chanexec",
        &["token-chanmetrics"],
        |c| c.docker.data_plane = sandbox_provider_docker::DataPlane::Exec,
        |_| {},
    )
    .await;
    exec.state
        .manager
        .exec(&key, ExecRequest::argv("true", Vec::<String>::new()))
        .await
        .unwrap();
    let text = exec.state.metrics.encode().unwrap();
    assert_eq!(
        sample(
            &text,
            r#"sandbox_provider_calls_total{operation="exec",data_plane="exec"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        !text.contains("sandbox_agent_channel_opens_total{"),
        "exec mode opens no channel:\n{text}"
    );
    exec.state.manager.destroy(&key).await.unwrap();
}
