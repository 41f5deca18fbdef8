//! `sandbox-provider-docker`: the Docker backend of `sandbox_core::SandboxProvider`, on
//! bollard.
//!
//! A Docker socket is root on its host, so the backend is off until an operator enables it
//! ([`config::ensure_enabled`]). Sandboxes are long-lived containers with every capability
//! dropped but a minimal set, `no-new-privileges`, an init process (or, in agent mode, the agent
//! as PID 1: [`agent`]), memory/CPU/PID limits and
//! either no network or the adapter's own egress-protected bridge ([`egress`]) — never
//! `docker0`. Commands run through exec with the timeout enforced inside the container
//! ([`exec`]); files go through exec as an explicit user ([`files`]); terminals are TTY execs
//! whose whole session is hung up on close ([`terminal`]); snapshots are commits into the
//! adapter's own image namespace ([`snapshots`]), and so are tenants' templates built from local
//! images ([`template_builds`]); an idle sweep reclaims abandoned containers of
//! the adapter's namespace only ([`sweeper`]).
//!
//! Map: `config.rs` (settings, opt-in gate), `engine.rs` (endpoint, `tcp://` over mutual TLS
//! through `sandbox-transport`'s guarded connector, API negotiation),
//! `provider.rs` (the provider: lifecycle), `errors.rs` (engine errors → core taxonomy),
//! `labels.rs` (ownership and metadata labels), `channel/` (the kept exec channel to the
//! in-container agent, h2c with the envd client on top; its `mod.rs` says how it lives), `isolation.rs` (what the engine enforces: the
//! writable layer's size limit, user namespaces, the runtime), `egress/` (the protected bridge;
//! its `mod.rs` says which file holds what), `agent/` (agent mode: the agent binary checked at
//! start and copied into every container as its PID 1, and agent mode's exec and terminals
//! through it; its `mod.rs` says what is not routed through it yet).

pub mod agent;
pub mod channel;
pub mod config;
pub mod egress;
pub mod engine;
pub mod errors;
pub mod exec;
pub mod files;
pub mod image_build;
pub mod isolation;
pub mod labels;
pub mod pause;
pub mod provider;
pub mod snapshots;
pub mod sweeper;
pub mod template_builds;
pub mod terminal;

pub use config::{DataPlane, DockerConfig, NetworkMode, PullPolicy};
pub use isolation::{IsolationReport, StorageLimit};
pub use provider::{
    DockerProvider, docker_capabilities, docker_capabilities_for, docker_network_fields,
};
