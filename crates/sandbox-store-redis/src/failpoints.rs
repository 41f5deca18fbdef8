//! Test hooks, compiled only with the `failpoints` cargo feature (off by default; never in a
//! release build). They let a multi-process test learn the moment a replica holds a session's
//! lifecycle lock, and keep it holding, so the test can kill it exactly there.
//!
//! - `SANDBOX_FAILPOINT_SESSION`: the session (`<tenant>/<session>`) the hooks apply to; unset,
//!   they do nothing.
//! - `SANDBOX_FAILPOINT_LOCK_HELD_FILE`: after taking that session's lock, append a line
//!   `locked <tenant>/<session> pid <pid>` to this file.
//! - `SANDBOX_FAILPOINT_LOCK_HELD_PAUSE_MS`: then wait this long before going on.

use std::io::Write as _;
use std::time::Duration;

use sandbox_core::BindingKey;

/// Called right after the lifecycle lock of `key` was taken.
pub(crate) async fn lock_held(key: &BindingKey) {
    let Ok(session) = std::env::var("SANDBOX_FAILPOINT_SESSION") else {
        return;
    };
    if session != key.to_string() {
        return;
    }
    if let Ok(path) = std::env::var("SANDBOX_FAILPOINT_LOCK_HELD_FILE") {
        let line = format!("locked {key} pid {}\n", std::process::id());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            tracing::error!(path, error = %e, "failpoint: cannot write the lock-held file");
        }
    }
    let pause = std::env::var("SANDBOX_FAILPOINT_LOCK_HELD_PAUSE_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok());
    if let Some(ms) = pause {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
