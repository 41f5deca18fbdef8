//! The pooled, guarded HTTP client: gateway routing in front of two connection pools, both
//! dialling only through the guarded connector. Control-plane requests go where their URL
//! says; data-plane requests are dialled at the gateway whatever their authority, with the
//! routed request (Host kept, token added when missing, scheme rewritten). Redirects are never
//! followed: a 3xx is handed to the caller as it is.
//!
//! Plain HTTP so far; TLS (rustls on aws-lc-rs around the same connector) comes next.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Incoming};
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sandbox_core::{Error, Operation};
use tokio::net::TcpStream;

use crate::connector::{BoxError, GuardedConnector};
use crate::gateway::{Gateway, GatewayTarget, Plane};

const OP_REQUEST: Operation = Operation::new("outbound.request");

/// Dials the gateway for every request, whatever the URI's authority (which stays in the
/// request for the gateway's own routing).
#[derive(Clone, Debug)]
pub struct GatewayConnector {
    guard: GuardedConnector,
    target: Option<GatewayTarget>,
}

impl tower_service::Service<Uri> for GatewayConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let (guard, target) = (self.guard.clone(), self.target.clone());
        Box::pin(async move {
            let target = target.ok_or_else(|| {
                Box::new(Error::internal(
                    OP_REQUEST,
                    "a data-plane request without a gateway",
                )) as BoxError
            })?;
            let stream = guard
                .connect(&target.host, target.port)
                .await
                .map_err(|e| Box::new(e) as BoxError)?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// One pool of a process: routing, the control-plane pool and the gateway pool.
#[derive(Clone, Debug)]
pub struct GuardedClient<B> {
    gateway: Gateway,
    control: Client<GuardedConnector, B>,
    data: Client<GatewayConnector, B>,
}

impl<B> GuardedClient<B>
where
    B: Body + Clone + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A client whose every connection goes through `guard`.
    pub fn new(guard: GuardedConnector, gateway: Gateway, target: Option<GatewayTarget>) -> Self {
        let data_connector = GatewayConnector {
            guard: guard.clone(),
            target,
        };
        GuardedClient {
            gateway,
            control: Client::builder(TokioExecutor::new()).build(guard),
            data: Client::builder(TokioExecutor::new()).build(data_connector),
        }
    }

    /// The routing (and its token registry).
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// Sends `request` (never mutated) on the plane it belongs to.
    pub async fn request(&self, request: &Request<B>) -> Result<Response<Incoming>, Error> {
        let routed = self.gateway.route(request)?;
        let outcome = match routed.plane {
            Plane::Data { .. } => self.data.request(routed.request).await,
            Plane::Control => self.control.request(routed.request).await,
        };
        outcome.map_err(|e| {
            // A refusal by the guard travels inside hyper's error: surface it as itself.
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(s) = source {
                if let Some(core) = s.downcast_ref::<Error>() {
                    return core.clone();
                }
                source = s.source();
            }
            Error::unavailable(OP_REQUEST, format!("request failed: {e}"))
        })
    }
}
