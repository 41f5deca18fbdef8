//! The pooled, guarded HTTP client: gateway routing in front of two connection pools, both
//! dialling only through the guarded connector. Control-plane requests go where their URL
//! says; data-plane requests are dialled at the gateway whatever their authority, with the
//! routed request (Host kept, token added when missing, scheme rewritten). Redirects are never
//! followed: a 3xx is handed to the caller as it is.
//!
//! TLS is rustls on aws-lc-rs around the same connectors (`https` URLs; plain `http` stays
//! plain), trusting the system roots plus any CA the operator adds ([`tls_config`]), or, for a
//! daemon that authenticates its clients (Docker's `tcp://` endpoints), only the operator's CA,
//! with a client certificate ([`tls_client_auth_config`]).

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
use crate::transported;

const OP_REQUEST: Operation = Operation::new("send_request");

/// Dials the gateway for every request, whatever the URI's authority (which stays in the
/// request for the gateway's own routing). Without a gateway it dials the URI's authority,
/// through the same guard.
#[derive(Clone, Debug)]
pub struct GatewayConnector {
    guard: GuardedConnector,
    target: Option<GatewayTarget>,
}

impl GatewayConnector {
    /// Dials `target` (or, without one, each URI's authority) through `guard`.
    pub fn new(guard: GuardedConnector, target: Option<GatewayTarget>) -> Self {
        GatewayConnector { guard, target }
    }
}

impl tower_service::Service<Uri> for GatewayConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (mut guard, target) = (self.guard.clone(), self.target.clone());
        Box::pin(async move {
            let Some(target) = target else {
                return tower_service::Service::call(&mut guard, uri).await;
            };
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
    let mut roots = rustls::RootCertStore::empty();
    if system_roots {
        for cert in rustls_native_certs::load_native_certs().certs {
            // A system root rustls cannot parse is skipped, as every TLS client does.
            let _ = roots.add(cert);
        }
    }
    for pem in extra_ca_pem {
        add_roots(&mut roots, pem, "CA certificate")?;
    }
    if roots.is_empty() {
        return Err(bad_tls("no trust roots".to_owned()));
    }
    Ok(client_builder()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The TLS client settings of a daemon that authenticates its clients by certificate, as
/// `docker --tlsverify` does: the server must present a certificate issued by the CA in
/// `ca_pem` — and by nothing else, since any public CA can issue a certificate for a name, while
/// only the operator's CA issues daemon certificates — and the client presents the chain in
/// `cert_chain_pem` (leaf first) with the private key in `key_pem` (PKCS#8, PKCS#1 or SEC1).
///
/// Errors are `invalid_request` and name the part at fault by its conventional file name
/// (`ca.pem`, `cert.pem`, `key.pem`); they never quote the key's contents.
pub fn tls_client_auth_config(
    ca_pem: &[u8],
    cert_chain_pem: &[u8],
    key_pem: &[u8],
) -> Result<rustls::ClientConfig, Error> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    add_roots(&mut roots, ca_pem, "CA certificate (ca.pem)")?;
    let chain = CertificateDer::pem_slice_iter(cert_chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_tls(format!("client certificate (cert.pem): {e}")))?;
    if chain.is_empty() {
        return Err(bad_tls(
            "client certificate (cert.pem): holds no PEM certificate".to_owned(),
        ));
    }
    // The parser's own message may quote a line or a bad base64 symbol of the key: only the
    // category is reported.
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "holds no unencrypted private key (PKCS#8, PKCS#1 or SEC1 PEM)"
            }
            _ => "is not well-formed PEM",
        };
        bad_tls(format!("client key (key.pem): {why}"))
    })?;
    client_builder()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| {
            bad_tls(format!(
                "client certificate (cert.pem) and key (key.pem) are unusable together: {e}"
            ))
        })
}

fn bad_tls(why: String) -> Error {
    transported(Error::invalid_request(OP_REQUEST, format!("tls: {why}")))
}

/// Adds every certificate of `pem` to `roots`; a file without one is an error.
fn add_roots(roots: &mut rustls::RootCertStore, pem: &[u8], what: &str) -> Result<(), Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut added = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| bad_tls(format!("{what}: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad_tls(format!("{what}: {e}")))?;
        added += 1;
    }
    if added == 0 {
        return Err(bad_tls(format!("{what}: holds no PEM certificate")));
    }
    Ok(())
}

/// rustls on aws-lc-rs, TLS 1.2 and 1.3.
fn client_builder()
-> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>, Error> {
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    // No ALPN here: the HTTPS connector sets it from the HTTP versions it enables (and refuses
    // a config that already has some).
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad_tls(e.to_string()))
}

pub(crate) fn https<C>(tls: rustls::ClientConfig, inner: C) -> HttpsConnector<C> {
    HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(inner)
}

/// A connection pool dialling where each request's URL says, through `guard`.
pub(crate) fn control_pool<B>(
    guard: GuardedConnector,
    tls: rustls::ClientConfig,
) -> Client<HttpsConnector<GuardedConnector>, B>
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    Client::builder(TokioExecutor::new()).build(https(tls, guard))
}

/// A connection pool dialling the gateway `target` for every request, through `guard`.
pub(crate) fn data_pool<B>(
    guard: GuardedConnector,
    target: Option<GatewayTarget>,
    tls: rustls::ClientConfig,
) -> Client<HttpsConnector<GatewayConnector>, B>
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    Client::builder(TokioExecutor::new()).build(https(tls, GatewayConnector::new(guard, target)))
}

/// Routing over a control-plane pool and a gateway pool.
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
        GuardedClient {
            gateway,
            control: control_pool(guard.clone(), tls.clone()),
            data: data_pool(guard, target, tls),
        }
    }

    /// A client on pools that already exist (shared with other clients of a
    /// [`GatewayPool`](crate::pool::GatewayPool)).
    pub(crate) fn from_pools(
        gateway: Gateway,
        control: Client<HttpsConnector<GuardedConnector>, B>,
        data: Client<HttpsConnector<GatewayConnector>, B>,
    ) -> Self {
        GuardedClient {
            gateway,
            control,
            data,
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
        outcome.map_err(|e| outbound_error(OP_REQUEST, &e))
    }
}

/// The workspace error for a failed outbound request. A refusal by the guard travels inside
/// hyper's error: it surfaces as itself (`unsafe_outbound_url`); anything else is `unavailable`
/// with the whole cause chain in the message.
pub(crate) fn outbound_error(op: Operation, e: &(dyn std::error::Error + 'static)) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(core) = s.downcast_ref::<Error>() {
            return core.clone();
        }
        source = s.source();
    }
    transported(Error::unavailable(
        op,
        format!("request failed: {}", chain(e)),
    ))
}

/// An error and its sources on one line: hyper's own message ("client error (Connect)") says
/// nothing of the cause, such as an untrusted certificate.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA and a client certificate it issued: (CA PEM, client chain PEM, client key PEM).
    fn material() -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["client".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (ca_pem, cert.pem(), key.serialize_pem())
    }

    #[test]
    fn client_auth_settings_name_the_bad_file_and_never_quote_the_key() {
        let (ca, cert, key) = material();
        let (_, _, other_key) = material();
        let ok = tls_client_auth_config(ca.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap();
        assert!(ok.client_auth_cert_resolver.has_certs());
        assert!(
            ok.alpn_protocols.is_empty(),
            "the HTTPS connector sets ALPN"
        );

        let check = |ca: &str, cert: &str, key: &str, names: &str| {
            let err =
                tls_client_auth_config(ca.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap_err();
            assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest, "{err}");
            assert!(err.to_string().contains(names), "{names}: {err}");
            err.to_string()
        };
        check("", &cert, &key, "ca.pem");
        check(&cert[..cert.len() / 2], &cert, &key, "ca.pem");
        check(&ca, "", &key, "cert.pem");
        check(&ca, &cert, "", "key.pem");
        check(&ca, &cert, &other_key, "unusable together");
        // A key whose base64 is damaged: the message must not carry any of its text.
        let body: Vec<&str> = key.lines().filter(|l| !l.starts_with("-----")).collect();
        let damaged = key.replacen(body[0], &format!("{}!", &body[0][1..]), 1);
        let shown = check(&ca, &cert, &damaged, "key.pem");
        for line in body {
            assert!(!shown.contains(&line[..16]), "key material in {shown}");
        }
    }
}
