//! The process-wide pool: one control-plane connection pool shared by every tenant, one
//! gateway pool per gateway endpoint (configs naming the same gateway share its connections),
//! and one inbound-token registry.
//!
//! A process runs one [`GatewayPool`] per outbound policy (private endpoints allowed or not).
//! Clients and WebSocket dialers are handed out by the pool ([`GatewayPool::client_for`],
//! [`GatewayPool::ws_dialer_for`]) rather than built from a config alone, because only the pool
//! knows which token registry its sandboxes' tokens were put in: a dialer reading another
//! registry finds no token, and the gateway answers 401, a failure that looks exactly like a
//! replica-affinity problem.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};

use hyper::body::Body;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;

use crate::client::{GatewayConnector, GuardedClient, control_pool, data_pool, https};
use crate::connector::GuardedConnector;
use crate::gateway::{Gateway, GatewayTarget, InboundTokens};
use crate::ws::WsDialer;

/// See the module docs. Cheap to share behind an `Arc`; safe for concurrent use.
pub struct GatewayPool<B> {
    guard: GuardedConnector,
    tls: rustls::ClientConfig,
    tokens: InboundTokens,
    control: Client<HttpsConnector<GuardedConnector>, B>,
    gateways: Mutex<HashMap<GatewayTarget, Client<HttpsConnector<GatewayConnector>, B>>>,
}

impl<B> fmt::Debug for GatewayPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewayPool")
            .field("policy", self.guard.policy())
            .field("gateways", &self.gateway_pools())
            .finish_non_exhaustive()
    }
}

impl<B> GatewayPool<B> {
    /// The connector for an [`EnvdClient`](crate::envd::EnvdClient) of one config: it dials
    /// `gateway` (when the config has one) whatever the sandbox host in the envd URL, or
    /// else the URL's own host, always through the pool's guard; TLS for `https` URLs.
    pub fn envd_connector(
        &self,
        gateway: Option<&GatewayTarget>,
    ) -> HttpsConnector<GatewayConnector> {
        let connector = GatewayConnector::new(self.guard.clone(), gateway.cloned());
        https(self.tls.clone(), connector)
    }

    /// How many gateway endpoints have a pool.
    pub fn gateway_pools(&self) -> usize {
        self.gateways
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl<B> GatewayPool<B>
where
    B: Body + Clone + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A pool whose every connection goes through `guard`, with `tls` for `https` and `wss`.
    pub fn new(guard: GuardedConnector, tls: rustls::ClientConfig) -> Self {
        GatewayPool {
            control: control_pool(guard.clone(), tls.clone()),
            guard,
            tls,
            tokens: InboundTokens::default(),
            gateways: Mutex::new(HashMap::new()),
        }
    }

    /// The pool's inbound-token registry: put a sandbox's token here when it is created or
    /// connected, and every client and dialer of this pool sends it.
    pub fn tokens(&self) -> &InboundTokens {
        &self.tokens
    }

    /// The client for one config: control-plane requests to `api_host` (or any host not shaped
    /// like a sandbox host) on the shared control pool; data-plane requests at `gateway` on
    /// that gateway's shared pool. Without a gateway, everything rides the control pool.
    pub fn client_for(
        &self,
        api_host: Option<&str>,
        gateway: Option<&GatewayTarget>,
    ) -> GuardedClient<B> {
        let data = match gateway {
            Some(target) => self
                .gateways
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(target.clone())
                .or_insert_with(|| {
                    data_pool(self.guard.clone(), Some(target.clone()), self.tls.clone())
                })
                .clone(),
            // Never used: without a gateway every request routes to the control plane.
            None => data_pool(self.guard.clone(), None, self.tls.clone()),
        };
        let routing = Gateway::new(api_host, gateway.cloned(), self.tokens.clone());
        GuardedClient::from_pools(routing, self.control.clone(), data)
    }

    /// The WebSocket dialer for one config: the same gateway, guard and token registry as
    /// [`client_for`](Self::client_for).
    pub fn ws_dialer_for(
        &self,
        api_host: Option<&str>,
        gateway: Option<&GatewayTarget>,
    ) -> WsDialer {
        let routing = Gateway::new(api_host, gateway.cloned(), self.tokens.clone());
        WsDialer::new(
            self.guard.clone(),
            routing,
            gateway.cloned(),
            self.tls.clone(),
        )
    }
}
