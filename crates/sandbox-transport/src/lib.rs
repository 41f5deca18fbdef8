//! `sandbox-transport`: every outbound connection to a tenant-supplied endpoint, guarded.
//!
//! Built so far: the address classification ([`ip_class`]), the outbound policy and URL
//! validation ([`policy`]), and the guarded connector ([`connector`]) that judges the concrete
//! address it dials. Still to come (issue "sandbox-transport and sandbox-envd"): gateway
//! routing, inbound tokens, the WebSocket dialer, TLS, and the envd client.

pub mod connector;
pub mod ip_class;
pub mod policy;

pub use connector::{Dial, GuardedConnector, TcpDialer};
pub use ip_class::{IpClass, classify};
pub use policy::{OutboundPolicy, Resolve, SystemResolver, Whitelist, validate_url};
