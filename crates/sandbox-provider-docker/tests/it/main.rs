//! The Docker adapter's own tests beyond conformance, one test binary with a module per topic
//! so they link once. `agent`, `agent_exec`, `channel`, `engine`, `registry` and `tcp_tls` need the Docker engine (and
//! `agent`, `agent_exec` and `channel` the static agent, `SANDBOX_AGENT_BIN`) (`#[ignore]`d
//! without it; `cargo xtask test` runs them in its docker engine stage); `egress` needs root and
//! iptables besides, and runs alone in the egress stage (`-E 'test(/^egress::/)' -j 1`);
//! `tcp_guard` is hermetic and runs with the hermetic tier.

mod support;

mod agent;
mod agent_exec;
mod channel;
mod egress;
mod engine;
mod registry;
mod tcp_guard;
mod tcp_tls;
