//! The E2B backend of `sandbox_core::SandboxProvider`: E2B's control plane (REST) for the
//! lifecycle and envd (Connect-RPC and `/files`) in each sandbox for commands, files,
//! processes and terminals, every byte through `sandbox-transport`'s guarded connector.
//!
//! Isolation is the plane's: E2B runs each sandbox in its own Firecracker microVM. The same
//! adapter speaks to E2B's cloud, to self-hosted planes behind a gateway (`proxy_url`), and to
//! this workspace's own E2B-compatible API, which is what its tests run against.
//!
//! Files:
//! - `config.rs`: [`E2bConfig`], the operator config, and `from_tenant`;
//! - `provider.rs`: [`E2bProvider`], its constructor, capabilities, and the lifecycle;
//! - `control.rs`: the control-plane client (deadlines, retries, bounded answers);
//! - `wire.rs`: the control plane's JSON;
//! - `metadata.rs`: metadata key escaping, states, the server-side list pair;
//! - `envd.rs`: each sandbox's envd client;
//! - `errors.rs`: the one mapping onto `sandbox_core::Error`;
//! - `exec.rs`, `files.rs`: commands and file operations (whole and streamed) through envd;
//! - `watch.rs`: directory watches through envd's `WatchDir` stream.
//! - `process.rs`, `terminal.rs`: background processes and terminals (PTYs) through envd's
//!   process service.
//! - `snapshots.rs`: snapshots (`/sandboxes/{id}/snapshots`, `/snapshots`, deleted as the
//!   templates they are) and the template catalog (`/templates`).

pub mod config;
pub mod control;
pub mod envd;
pub mod errors;
pub mod exec;
mod files;
pub mod metadata;
mod process;
pub mod provider;
mod snapshots;
mod terminal;
mod watch;
pub mod wire;

pub use config::E2bConfig;
pub use provider::{E2bProvider, e2b_capabilities, e2b_network_fields};
