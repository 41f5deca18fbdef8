//! The conformance suite against the real Docker engine (adapter `docker`).
//!
//! `cargo xtask conformance docker` (and `cargo xtask test`) start the engine, build the local
//! `sandbox-busybox:test` image and select this adapter with `SANDBOX_CONFORMANCE_ADAPTER=docker`.
//! Without that selection (a plain `cargo test`, perhaps on a machine with no engine) every case
//! is listed as ignored with the command that runs it.
//!
//! The suite runs once per data plane (`SANDBOX_DOCKER_DATA_PLANE`, `exec` or `agent`; xtask's
//! variants `docker (exec)` and `docker (agent)`). The agent run installs the static agent that
//! `SANDBOX_AGENT_BIN` names as every container's PID 1; commands, files and terminals still go
//! through `docker exec` in both.

use std::process::ExitCode;
use std::sync::Arc;

use sandbox_core::{Capabilities, Capability, TemplateId};
use sandbox_provider_docker::{DataPlane, DockerConfig, DockerProvider, NetworkMode, PullPolicy};
use sandbox_testkit::conformance::Target;
use sandbox_testkit::conformance::harness::run_main_when_selected;

/// The per-sandbox process cap of this run (`docker.processes_per_sandbox`).
const PROCESS_CAP: usize = 24;

/// The image xtask builds without a registry (`FROM scratch` + Debian's busybox-static).
const TEST_IMAGE: &str = "sandbox-busybox:test";

/// Which data plane this run tests, and the agent binary for the agent plane. An unknown mode
/// or an agent run without the agent's path is an error, never a quiet exec-mode run.
fn data_plane() -> Result<(DataPlane, Option<std::path::PathBuf>), String> {
    let plane = match std::env::var("SANDBOX_DOCKER_DATA_PLANE") {
        Ok(raw) => DataPlane::parse(&raw).map_err(|e| e.to_string())?,
        Err(_) => DataPlane::Exec,
    };
    let agent = match plane {
        DataPlane::Exec => None,
        DataPlane::Agent => Some(std::env::var_os("SANDBOX_AGENT_BIN").map(Into::into).ok_or(
            "the agent data plane needs SANDBOX_AGENT_BIN (the static agent `cargo xtask agent` builds)",
        )?),
    };
    Ok((plane, agent))
}

/// The capability set this adapter must declare on `plane`, written out here rather than read
/// from the adapter: every flag except `timeout_refresh`, `volumes`, `desktop`, and issue 17's
/// `processes`, `streamed_files` and `watch`; the agent plane adds those three. Cases are
/// registered from this set, so an adapter declaring less fails `declared_capabilities_match`
/// instead of quietly dropping cases.
///
/// The exec fallback is pinned without the three issue-17 capabilities: it cannot honestly
/// serve them (a background process there would be a `docker exec` whose output nobody keeps
/// once the call that started it ends, there is no event stream for a watch, and its writes
/// are whole buffers). Nor `terminal_reattach`: a `docker exec` PTY dies with its stream, so
/// there is nothing to reattach to. Nor `default_user`: its execs each name an engine user,
/// root unless the call names one. The agent plane serves all five: its agent keeps background
/// processes and their output, the PTYs it runs outlive their stream, and it is told the
/// sandbox's default user. Only the agent plane serves `tunnels` too: the agent's tunnel
/// extension reaches a port with no network at all, which a `docker exec` cannot.
fn required(plane: DataPlane) -> Capabilities {
    let base = Capability::ALL
        .into_iter()
        .filter(|c| {
            !matches!(
                c,
                Capability::TimeoutRefresh
                    | Capability::Volumes
                    | Capability::Desktop
                    | Capability::Processes
                    | Capability::StreamedFiles
                    | Capability::Watch
                    | Capability::TerminalReattach
                    | Capability::DefaultUser
                    | Capability::Tunnels
            )
        })
        .fold(Capabilities::NONE, |set, c| set.with(c, true));
    match plane {
        DataPlane::Exec => base,
        DataPlane::Agent => base
            .with(Capability::Processes, true)
            .with(Capability::StreamedFiles, true)
            .with(Capability::Watch, true)
            .with(Capability::TerminalReattach, true)
            .with(Capability::DefaultUser, true)
            .with(Capability::Tunnels, true),
    }
}

/// The plane the pinned set is for: the selected one (a bad selection fails in the factory).
fn pinned_plane() -> DataPlane {
    std::env::var("SANDBOX_DOCKER_DATA_PLANE")
        .ok()
        .and_then(|raw| DataPlane::parse(&raw).ok())
        .unwrap_or(DataPlane::Exec)
}

fn main() -> ExitCode {
    run_main_when_selected(
        "docker",
        required(pinned_plane()),
        Arc::new(|namespace: String| {
            Box::pin(async move {
                let image = TemplateId::new(TEST_IMAGE).map_err(|e| e.to_string())?;
                let mut config = DockerConfig::new(image.clone(), &namespace);
                // The test acts as the operator who opts in.
                config.enabled = true;
                config.pull_policy = PullPolicy::Never;
                config.network = NetworkMode::None;
                config.idle_sweep = false;
                // Small, so `process_cap_is_enforced` reaches the cap quickly; above the 20
                // concurrent commands of `exec_concurrent_calls`, which count too.
                config.processes_per_sandbox = PROCESS_CAP;
                (config.data_plane, config.agent_path) = data_plane()?;
                let declared = required(config.data_plane);
                config
                    .extra_labels
                    .insert("sandbox.test".to_owned(), "1".to_owned());
                let provider = DockerProvider::connect(config)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Target {
                    provider: Arc::new(provider),
                    template: image,
                    declared,
                })
            })
        }),
    )
}
