//! SSRF-guarded HTTP and WebSocket clients, gateway routing and the envd client.
//!
//! Not built yet: see this crate's README for what will live here.
