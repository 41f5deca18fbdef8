//! Ports the lifecycle needs from the application: does the session still exist, how is a
//! session's first sandbox bootstrapped, where do named configs come from.

use async_trait::async_trait;

use crate::binding::BindingKey;
use crate::config::TenantSandboxConfig;
use crate::error::Error;
use crate::ids::{ConfigId, TemplateId, TenantId};
use crate::ports::provider::SandboxProvider;
use crate::sandbox::SandboxHandle;

/// Checks the durable session record.
#[async_trait]
pub trait SessionExistence: Send + Sync + std::fmt::Debug {
    /// Whether the session still exists. An error means "cannot tell" and fails the resolve;
    /// it never counts as "gone" (which destroys the sandbox).
    async fn session_exists(&self, key: &BindingKey) -> Result<bool, Error>;
}

/// Accepts every session. Safe only where this service's own destroy is the only way a
/// session ends (a single process with the memory store); a shared deployment must consult the
/// real session records.
#[derive(Debug, Clone, Copy, Default)]
pub struct PermissiveSessionExistence;

#[async_trait]
impl SessionExistence for PermissiveSessionExistence {
    async fn session_exists(&self, _key: &BindingKey) -> Result<bool, Error> {
        Ok(true)
    }
}

/// Customises how one session's first sandbox is created (session fork: boot from a snapshot of
/// the parent, then roll the workspace back to the fork point). Called inside the session's
/// lifecycle lock, which is not reentrant: implementations talk to the given provider and
/// handle directly, never back through the session manager.
#[async_trait]
pub trait Bootstrapper: Send + Sync + std::fmt::Debug {
    /// A template to create this session's sandbox from instead of the config's; `None` for no
    /// override. An error aborts the create: "cannot tell" must not boot a plain sandbox for a
    /// session the user expects to carry forked state.
    async fn template_override(&self, key: &BindingKey) -> Result<Option<TemplateId>, Error>;

    /// Runs once, right after the binding is written. An error makes the lifecycle destroy the
    /// sandbox and delete the binding: a half-bootstrapped fork looks normal but has the wrong
    /// baseline.
    async fn after_create(
        &self,
        key: &BindingKey,
        provider: &dyn SandboxProvider,
        sandbox: &SandboxHandle,
    ) -> Result<(), Error>;

    /// Called when a create that used an override failed, so a snapshot the provider will never
    /// boot can be retired instead of failing every later resolve. Runs on a context immune to
    /// caller cancellation.
    async fn on_create_failed(&self, _key: &BindingKey, _error: &Error) {}
}

/// What a [`ConfigLoader`] reports about one named config.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadedConfig {
    /// The config, ready to resolve.
    Found(Box<TenantSandboxConfig>),
    /// No config by that ID (deleted or never existed). Callers must surface this rather than
    /// fall back to a default backend: running a tenant's code somewhere it did not choose is a
    /// security-relevant substitution.
    NotFound,
    /// The config's identity fields are mid-change; retriable.
    Cordoned,
}

/// Fetches one stored config of a tenant. Implemented by the application, so the session layer
/// knows no repository or file format.
#[async_trait]
pub trait ConfigLoader: Send + Sync + std::fmt::Debug {
    /// Loads `config` of `tenant`.
    async fn load(&self, tenant: TenantId, config: &ConfigId) -> Result<LoadedConfig, Error>;
}
