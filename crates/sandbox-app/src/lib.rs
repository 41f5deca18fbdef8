//! `sandbox-app`: the composition root — configuration, the HTTP API, the `sandbox` CLI and
//! metrics. Adapters are behind cargo features (`docker` by default).
//!
//! Built so far: configuration (file + environment), bearer-token tenants, exec (buffered and
//! NDJSON streaming), files and attachments, WebSocket terminals behind single-use tickets,
//! snapshots and ephemeral execution, session inspect/destroy/keep-alive, `/healthz`,
//! `/metrics`, the OpenAPI document (`/v1/openapi.json`, generated from the same declaration as
//! the router, over the wire types of [`api`]), and
//! the `serve` and `doctor` commands, and the client commands (`exec`, `files get|put|ls`,
//! `shell`) in [`client`].

pub mod api;
pub mod auth;
pub mod client;
pub mod config;
pub mod doctor;
#[cfg(feature = "e2b-api")]
pub mod e2b;
pub mod http;
pub mod image;
pub mod metered;
pub mod serve;
pub mod server;
pub mod tickets;
