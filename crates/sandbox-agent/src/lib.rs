//! `sandbox-agent`: the in-sandbox daemon that speaks envd (see the README for its status).
//!
//! The library holds everything the binary runs, so tests can drive the agent in-process.

pub mod files;
pub mod fs;
pub mod users;
