//! The envd client: Connect-RPC (JSON codec) over HTTP/1.1 or HTTP/2, plus envd's `/files`
//! endpoints, on any connection a hyper connector can make.
//!
//! The client is generic over its connector, so the same code talks to envd through the
//! guarded TCP connector (E2B, Cube), through TLS around it, or tomorrow over a relay stream
//! into a container: anything that is a `tower_service::Service<Uri>` yielding a hyper
//! connection. Connections are pooled per client; clone the client to share the pool.
//!
//! What the client adds to the bare protocol (`docs/envd.md` states the protocol):
//! - **Errors are the workspace's.** A unary error status, an end-of-stream error, a cut
//!   connection or a malformed envelope all come back as [`sandbox_core::Error`] classified by
//!   kind (Connect `not_found` ⇒ `not_found`, `unauthenticated` ⇒ `authentication`, a stream
//!   cut inside an envelope ⇒ `unavailable`, a malformed message ⇒ `internal`).
//! - **Whose errors.** envd runs inside a provider's sandbox: it is that provider's data plane.
//!   With a provider in the config ([`EnvdConfig::with_provider`]) every error the client
//!   returns is the provider's ([`Origin::Provider`]) — an envd that cannot be reached, or that
//!   answers `unavailable`, is the provider's sandbox failing, which the service reports as
//!   `provider_unavailable`, not as a fault of the transport it travelled on. Without one they
//!   stay [`Origin::Transport`]. A caller's or a store's error passing through keeps its origin.
//! - **Deadlines.** A call's deadline is sent as `Connect-Timeout-Ms` and enforced here too, for
//!   the whole call including every message of a stream (for `Start`, envd also kills the
//!   process at that deadline).
//! - **Keepalives.** Streaming calls that envd keeps alive ask for a ping interval
//!   (`Keepalive-Ping-Interval`); a stream silent for longer than the idle limit (no message and
//!   no keepalive) is declared dead rather than waited on forever.
//! - **Cancellation.** Dropping a [`ServerStream`] closes it: the HTTP/2 stream is reset, an
//!   HTTP/1.1 connection is closed (never returned to the pool half-read).
//! - **Forwarding.** [`EnvdClient::forward`] relays a caller's own HTTP request (an SDK's, through
//!   a router) to envd, streamed both ways (`forward.rs`).
//! - **Tunnels.** [`EnvdClient::open_tunnel`] opens the sandbox agent's tunnel extension, a
//!   full-duplex byte stream to a port inside the sandbox (`tunnel.rs`).
//! - **Authentication.** The access token goes in `X-Access-Token` on every request; the Unix
//!   user in `Authorization: Basic base64("<user>:")` on RPCs and in `username` on `/files`.

mod call;
mod config;
mod files;
mod forward;
mod get;
mod services;
mod stream;
mod tunnel;

pub use call::{CallOptions, ClientStream, EnvdClient};
pub use config::{ENVD_PORT, EnvdConfig, HttpVersion};
pub use files::{Download, StagedUploadError, UploadFile, staging_path};
pub use forward::{
    AGENT_EXTENSION_PREFIX, AGENT_PROCESS_LISTING, ForwardBody, HOP_BY_HOP, OP_FORWARD,
    error_response, status_and_code, strip_hop_by_hop,
};
pub use services::{InputStream, REPLAY_OFFSET_HEADER};
pub use stream::ServerStream;
pub use tunnel::{TunnelDownstream, TunnelUpstream};

use sandbox_core::{Error, Origin, Provider};

/// The provider this envd belongs to claims `error` (see "Whose errors" above): what the
/// transport built, or what nobody attributed. A caller's or a store's error is left alone.
pub(crate) fn claim(provider: Option<Provider>, error: Error) -> Error {
    match (provider, error.origin()) {
        (Some(p), Origin::Transport | Origin::Unspecified) => error.with_provider(p),
        _ => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::Operation;

    #[test]
    fn the_configured_provider_claims_what_nobody_else_owns() {
        let check = |provider: Option<Provider>, origin: Origin, want: Origin| {
            let e = Error::unavailable(Operation::EXEC, "x").with_origin(origin);
            assert_eq!(claim(provider, e).origin(), want, "{provider:?} {origin:?}");
        };
        let e2b = Some(Provider::E2b);
        check(e2b, Origin::Transport, Origin::Provider(Provider::E2b));
        check(e2b, Origin::Unspecified, Origin::Provider(Provider::E2b));
        // A caller's or a store's error stays theirs; a provider's stays that provider's.
        check(e2b, Origin::Caller, Origin::Caller);
        check(e2b, Origin::Store, Origin::Store);
        check(
            e2b,
            Origin::Provider(Provider::Cube),
            Origin::Provider(Provider::Cube),
        );
        check(None, Origin::Transport, Origin::Transport);
    }
}
