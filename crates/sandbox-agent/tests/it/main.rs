//! The agent's tests that need a service, one test binary with a module per topic. `pid1_docker`
//! needs the Docker engine and a static build of the agent (`SANDBOX_AGENT_BIN`); it is
//! `#[ignore]`d in plain `cargo test` and run by the pipeline's docker engine stage.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod pid1_docker;
