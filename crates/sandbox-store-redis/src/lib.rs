//! The Redis `sandbox_core::BindingStore`.
//!
//! Not built yet: see this crate's README for what will live here.
