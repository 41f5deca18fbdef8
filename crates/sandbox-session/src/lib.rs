//! `sandbox-session`: the lifecycle coordinator, the session manager and the memory binding
//! store — the heart of the workspace, embeddable by other services without any HTTP server.

pub mod lifecycle;
pub mod manager;
pub mod memory_store;
pub mod observer;
pub mod policy;
pub mod quota;
