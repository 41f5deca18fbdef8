//! The CubeSandbox backend of `sandbox_core::SandboxProvider`.
//!
//! Not built yet: see this crate's README for what will live here.
