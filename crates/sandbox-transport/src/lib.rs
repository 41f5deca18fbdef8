//! `sandbox-transport`: every outbound connection to a tenant-supplied endpoint, guarded.
//!
//! Built so far: the address classification ([`ip_class`]) and the one table of cloud metadata
//! and instance-secret addresses it refuses ([`metadata`], also the source of the Docker
//! adapter's egress drops), the outbound policy and URL
//! validation ([`policy`]), the guarded connector ([`connector`]) that judges the concrete
//! address it dials, gateway routing with the inbound-token registry ([`gateway`]), and the
//! pooled client that puts routing and the connector together, with TLS ([`client`]), and the
//! WebSocket dialer on the same routing and guard ([`ws`]), the envd client ([`envd`]):
//! Connect-RPC and `/files` over HTTP/1.1 or h2c on any connector, and a connector over byte
//! streams the caller opens ([`relay`]).
//!
//! Errors: everything this crate builds has origin [`Origin::Transport`] (a refused endpoint
//! with `unsafe_outbound_url`, a failed dial, TLS, a cut connection), made through
//! `transported`. The transport carries a provider's traffic without knowing whose it is,
//! so a provider adapter claims what it passes on with `Error::with_provider` at its boundary
//! (the Docker adapter does so for its `tcp://` daemon). The envd client claims its own errors
//! for the provider its config names ([`envd`]).

pub mod client;
pub mod connector;
pub mod envd;
pub mod gateway;
pub mod ip_class;
pub mod metadata;
pub mod policy;
pub mod pool;
pub mod relay;
pub mod ws;

pub use client::{GuardedClient, tls_client_auth_config, tls_config};
pub use connector::{Dial, GuardedConnector, TcpDialer};
pub use envd::{EnvdClient, EnvdConfig};
pub use ip_class::{IpClass, classify};
pub use policy::{OutboundPolicy, Resolve, SystemResolver, Whitelist, validate_url};
pub use pool::GatewayPool;
pub use relay::RelayConnector;
pub use ws::WsDialer;

use sandbox_core::{Error, Origin};

/// Says that `error` is the transport's. Every error this crate makes goes through here, and
/// so does an envd answer it maps (whose provider, if any, claims it afterwards).
pub(crate) fn transported(error: Error) -> Error {
    error.with_origin(Origin::Transport)
}
