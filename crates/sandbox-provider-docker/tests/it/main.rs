//! The Docker adapter's own tests beyond conformance, one test binary with a module per topic
//! so they link once. `agent`, `agent_exec`, `agent_files`, `agent_process`, `channel`, `engine`, `image_env`, `pause`, `registry` and `tcp_tls` need the Docker engine (and
//! `agent`, `agent_exec`, `agent_files`, `agent_process`, `channel` and `pause` the static agent, `SANDBOX_AGENT_BIN`) (`#[ignore]`d
//! without it; `cargo xtask test` runs them in its docker engine stage); `egress` needs root and
//! iptables besides, and runs alone in the egress stage (`-E 'test(/^egress::/)' -j 1`);
//! `tcp_guard` is hermetic and runs with the hermetic tier; `sdk_channel` needs the E2B SDK's
//! venv and the Debian image besides, and runs in the e2b sdk stage.

mod support;

mod agent;
mod agent_exec;
mod agent_files;
mod agent_process;
mod channel;
mod egress;
mod engine;
mod image_env;
mod pause;
mod registry;
mod sdk_channel;
mod tcp_guard;
mod tcp_tls;
