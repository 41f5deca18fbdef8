//! The production stack (`Metered(Checked(Docker))`, wired by `serve::build_state`) on the real
//! engine: a snapshot create and a terminal open each land in the provider's latency
//! histogram, because the metrics layer's `as_*` accessors hand out its own wrappers.

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
