//! The pooled, guarded HTTP client: gateway routing in front of two connection pools, both
//! dialling only through the guarded connector. Control-plane requests go where their URL
//! says; data-plane requests are dialled at the gateway whatever their authority, with the
//! routed request (Host kept, token added when missing, scheme rewritten). Redirects are never
//! followed: a 3xx is handed to the caller as it is.
//!
//! TLS is rustls on aws-lc-rs around the same connectors (`https` URLs; plain `http` stays
//! plain), trusting the system roots plus any CA the operator adds ([`tls_config`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Incoming};
use hyper::{Request, Response, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
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

/// The TLS client settings: the system's roots (when `system_roots`) plus the PEM CA
/// certificates in `extra_ca_pem`; TLS 1.2 and 1.3.
pub fn tls_config(
    system_roots: bool,
    extra_ca_pem: &[&[u8]],
) -> Result<rustls::ClientConfig, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let bad = |why: String| Error::invalid_request(OP_REQUEST, format!("tls: {why}"));
    let mut roots = rustls::RootCertStore::empty();
    if system_roots {
        for cert in rustls_native_certs::load_native_certs().certs {
            // A system root rustls cannot parse is skipped, as every TLS client does.
            let _ = roots.add(cert);
        }
    }
    for pem in extra_ca_pem {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| bad(format!("CA certificate: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| bad(format!("CA certificate: {e}")))?;
            added += 1;
        }
        if added == 0 {
            return Err(bad("a CA file holds no certificate".to_owned()));
        }
    }
    if roots.is_empty() {
        return Err(bad("no trust roots".to_owned()));
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    // No ALPN here: the HTTPS connector sets it from the HTTP versions it enables (and refuses
    // a config that already has some).
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

fn https<C>(tls: rustls::ClientConfig, inner: C) -> HttpsConnector<C> {
    HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(inner)
}

/// One pool of a process: routing, the control-plane pool and the gateway pool.
#[derive(Clone, Debug)]
pub struct GuardedClient<B> {
    gateway: Gateway,
    control: Client<HttpsConnector<GuardedConnector>, B>,
    data: Client<HttpsConnector<GatewayConnector>, B>,
}

impl<B> GuardedClient<B>
where
    B: Body + Clone + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A client whose every connection goes through `guard`, with `tls` for `https`.
    pub fn new(
        guard: GuardedConnector,
        gateway: Gateway,
        target: Option<GatewayTarget>,
        tls: rustls::ClientConfig,
    ) -> Self {
        let data_connector = GatewayConnector {
            guard: guard.clone(),
            target,
        };
        GuardedClient {
            gateway,
            control: Client::builder(TokioExecutor::new()).build(https(tls.clone(), guard)),
            data: Client::builder(TokioExecutor::new()).build(https(tls, data_connector)),
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
            Error::unavailable(OP_REQUEST, format!("request failed: {}", chain(&e)))
        })
    }
}

/// An error and its sources on one line: hyper's own message ("client error (Connect)") says
/// nothing of the cause, such as an untrusted certificate.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
