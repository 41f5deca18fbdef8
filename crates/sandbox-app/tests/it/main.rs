//! The service's tests that need the Docker engine (some also start a `redis-server`): one test
//! binary with a module per topic, so they link once instead of once per file. Each test is
//! `#[ignore]`d where no engine runs; `cargo xtask test` runs them in its docker engine stage
//! (`cargo nextest run -p sandbox-app --test it --run-ignored only`). The failover test is a
//! binary of its own (`tests/failover_docker.rs`): it needs the store's failpoints.

mod support;

mod agent_idle_docker;
mod cli_docker;
mod doctor_docker;
mod e2b_expiry;
mod e2b_js;
mod e2b_no_leaks;
mod e2b_older;
mod e2b_preview;
mod e2b_provider_e2e;
mod e2b_provider_faults;
mod e2b_sdk;
mod e2b_snapshots;
mod e2b_standard_template;
mod e2b_templates;
mod engine_fault_docker;
mod hardening_docker;
mod http_docker;
mod http_files_docker;
mod http_snapshots_docker;
mod http_streams_docker;
mod http_terminal_docker;
mod layers_docker;
mod replicas_docker;
mod serve_image_docker;
mod serve_restart_docker;
