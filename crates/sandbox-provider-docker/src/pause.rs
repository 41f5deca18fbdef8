//! Pausing and resuming containers: the engine's pause, which is the cgroup freezer. Every
//! process of the container is frozen where it stands, its memory kept, and thawed by the
//! unpause; nothing is checkpointed to disk, so a paused sandbox holds its memory on the host
//! for as long as it stays paused (and does not survive a host reboot as paused: the engine
//! brings it back stopped, which a resume starts again, its filesystem kept).
//!
//! - **Channels.** A pause drops the container's agent channel generation: the relay exec is
//!   frozen with the rest, so a call on it would wait for its timeout. The next lease opens a
//!   new exec, which the engine refuses at once while the container is paused (reported with
//!   code `session_sandbox_paused`) and which works again after the resume: the channel
//!   re-opens by itself.
//! - **Stopped containers** are reported paused (a connect restarts them), so pausing one is
//!   the same conflict as pausing a frozen one, and resuming one starts it.

use async_trait::async_trait;
use bollard::models::ContainerStateStatusEnum;
use sandbox_core::{Error, ErrorCode, ErrorKind, Operation, PauseResume, SandboxId};

use crate::errors::{self, provider_error};
use crate::provider::DockerProvider;

/// The conflict of pausing a sandbox that is paused already (the E2B API's words).
pub fn already_paused(op: Operation, id: &str) -> Error {
    provider_error(
        ErrorKind::Conflict,
        op,
        format!("sandbox '{id}' is already paused"),
    )
    .with_code(ErrorCode::SandboxPaused)
}

impl DockerProvider {
    /// Freezes container `id` (owned by this namespace) and drops its agent channel. Used by
    /// the port's pause and by the idle sweep for a sandbox whose policy pauses.
    pub(crate) async fn pause_container(&self, op: Operation, id: &str) -> Result<(), Error> {
        let inspect = self.inspect_owned(op, id).await?;
        let full_id = inspect.id.clone().unwrap_or_else(|| id.to_owned());
        match inspect.state.as_ref().and_then(|s| s.status) {
            Some(ContainerStateStatusEnum::RUNNING) => {}
            Some(
                ContainerStateStatusEnum::PAUSED
                | ContainerStateStatusEnum::EXITED
                | ContainerStateStatusEnum::CREATED,
            ) => return Err(already_paused(op, id)),
            Some(ContainerStateStatusEnum::DEAD) => {
                return Err(provider_error(
                    ErrorKind::Terminal,
                    op,
                    format!("sandbox {id} is dead"),
                ));
            }
            other => {
                let state = other.map_or_else(|| "unknown".to_owned(), |s| s.to_string());
                return Err(provider_error(
                    ErrorKind::Conflict,
                    op,
                    format!("sandbox {id} is {state}; only a running sandbox can be paused"),
                ));
            }
        }
        if let Err(e) = self.docker().pause_container(&full_id).await {
            let mapped = errors::map(op, e);
            // Another caller paused it between the inspect and here.
            if mapped.http_status() == Some(409)
                && mapped
                    .message()
                    .to_ascii_lowercase()
                    .contains("already paused")
            {
                return Err(already_paused(op, id));
            }
            return Err(mapped);
        }
        for key in [id, full_id.as_str()] {
            if let Some(channel) = self.channel(key) {
                channel.invalidate().await;
            }
        }
        tracing::debug!(sandbox = %full_id, "paused a container");
        Ok(())
    }
}

#[async_trait]
impl PauseResume for DockerProvider {
    async fn pause(&self, id: &SandboxId) -> Result<(), Error> {
        self.pause_container(Operation::PAUSE, id.as_str()).await
    }

    /// Unpauses a frozen container, starts a stopped one, and leaves a running one alone.
    async fn resume(&self, id: &SandboxId) -> Result<(), Error> {
        self.ensure_running(Operation::RESUME, id.as_str()).await
    }
}
