//! `sandbox-app`: the composition root — configuration, the HTTP API, the `sandbox` CLI and
//! metrics. Adapters are behind cargo features (`docker` by default).
//!
//! Built so far: configuration (file + environment), bearer-token tenants, the exec route
//! (buffered and NDJSON streaming), session inspect/destroy/keep-alive, `/healthz`, `/metrics`,
//! and `sandbox serve`. Files, terminals, snapshots, the OpenAPI document and the client
//! commands arrive in the following increments of the service issue.

pub mod auth;
pub mod config;
pub mod doctor;
pub mod http;
pub mod image;
pub mod serve;
