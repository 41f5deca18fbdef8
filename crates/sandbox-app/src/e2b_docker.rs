//! The E2B API's envd plane on the Docker backend: every sandbox's agent, through the
//! adapter's kept exec channel (`DockerProvider::channel`). Outside `src/e2b/`, which names
//! no backend adapter.
//!
//! A paused sandbox's channel cannot open (the engine refuses exec on a frozen container), so
//! its envd traffic is answered at once with 409 `session_sandbox_paused`, never held. The
//! adapter's pause drops the channel's generation, so after a resume (a connect) the first call
//! here opens a fresh one: the connect's own envd-version call does, before it answers.

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use sandbox_core::{Error, ErrorKind, Operation, SandboxId};
use sandbox_provider_docker::DockerProvider;

use crate::e2b::{ApiError, EnvdPlane};

/// [`EnvdPlane`] over the Docker adapter's agent channels.
#[derive(Debug, Clone)]
pub struct DockerEnvd(pub DockerProvider);

const OP: Operation = Operation::new("envd_relay");

impl DockerEnvd {
    fn channel(
        &self,
        id: &SandboxId,
    ) -> Result<std::sync::Arc<sandbox_provider_docker::channel::Channel>, Error> {
        self.0.channel(id.as_str()).ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                OP,
                "the E2B API needs docker.data_plane = \"agent\": exec mode has no envd to relay to",
            )
        })
    }
}

#[async_trait::async_trait]
impl EnvdPlane for DockerEnvd {
    async fn envd_version(&self, id: &SandboxId) -> Result<String, Error> {
        let lease = self.channel(id)?.lease().await?;
        Ok(lease.envd_version().to_owned())
    }

    async fn forward(&self, id: &SandboxId, request: Request<Body>) -> Response {
        match self.channel(id) {
            Ok(channel) => channel.forward(request).await.map(Body::new),
            Err(e) => ApiError::from_core(e).into_response(),
        }
    }
}
