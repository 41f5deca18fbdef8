//! Lifecycle coordinator, session manager and memory binding store.
//!
//! Not built yet: see this crate's README for what will live here.
