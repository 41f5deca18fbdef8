//! sandbox-agent's tests that need more than the crate: one test binary, a module per topic, so
//! it links once. Each is `#[ignore]`d in a plain `cargo test`; the pipeline stage that provides
//! what it needs runs it.
//!
//! - `pid1_docker`: the Docker engine and a static build of the agent (`SANDBOX_AGENT_BIN`); run
//!   by the docker engine stage.
//! - `sdk`: the official E2B Python SDK (from the hashed lock's venv, `cargo xtask sdk-venv`)
//!   runs its scenario against the agent started on the host.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod pid1_docker;
mod sdk;
