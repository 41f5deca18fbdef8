//! sandbox-agent's tests that need more than the crate: one test binary, a module per topic, so
//! it links once. Each is `#[ignore]`d in a plain `cargo test`; the pipeline stage that provides
//! what it needs runs it.
//!
//! - `fs_edges`: `POST /files` on a `ramfs` (no user xattrs) and a full `tmpfs` that the test
//!   mounts in a mount namespace of its own; root only, run by the agent filesystems stage.
//! - `pid1_docker`: the Docker engine and a static build of the agent (`SANDBOX_AGENT_BIN`); run
//!   by the docker engine stage.
//! - `sdk`: the official E2B Python SDK (from the hashed lock's venv, `cargo xtask sdk-venv`)
//!   runs its scenario against the agent started on the host.
//! - `sdk_debian`: the same scenario against the static agent as PID 1 of a container of the
//!   Debian sandbox image (`SANDBOX_TEST_DEBIAN_IMAGE`, `SANDBOX_AGENT_BIN`); run, with `sdk`,
//!   by the e2b sdk stage.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod fs_edges;
mod pid1_docker;
mod sdk;
mod sdk_debian;
