//! The guarded connector: the only way the service dials a tenant-supplied endpoint.
//!
//! It judges the concrete socket address it is about to connect to — after resolution, after
//! unmapping IPv4-mapped IPv6 — so IP literals in odd encodings (`0x7f.1`, `2130706433`,
//! `[::ffff:169.254.169.254]`) and DNS rebinding are caught at the last moment. The resolver and
//! the dialer are injectable: verdicts are tested without DNS and without opening a socket.
//! Usable directly ([`GuardedConnector::connect`]) or as hyper-util's connector (it is a
//! `tower_service::Service<Uri>`).

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use hyper::Uri;
use hyper_util::rt::TokioIo;
use sandbox_core::{Error, Operation};
use tokio::net::TcpStream;
use url::Host;

use crate::policy::{HostCheck, OutboundPolicy, Resolve, SystemResolver, refused, unmap};
use crate::transported;

const OP_CONNECT: Operation = Operation::new("dial");

/// Opens a TCP connection to an address the connector has already judged.
#[async_trait]
pub trait Dial: Send + Sync + fmt::Debug {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<TcpStream>;
}

/// The real dialer: TCP with a connect timeout and `TCP_NODELAY`.
#[derive(Debug, Clone, Copy)]
pub struct TcpDialer {
    pub connect_timeout: Duration,
}

impl Default for TcpDialer {
    fn default() -> Self {
        TcpDialer {
            connect_timeout: Duration::from_secs(10),
        }
    }
}

#[async_trait]
impl Dial for TcpDialer {
    #[expect(
        clippy::disallowed_methods,
        reason = "the guarded connector's one dial, of an address the policy has just judged"
    )]
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connecting to {addr} timed out"),
                )
            })??;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// Resolves, judges and dials.
#[derive(Clone)]
pub struct GuardedConnector {
    policy: Arc<OutboundPolicy>,
    resolver: Arc<dyn Resolve>,
    dialer: Arc<dyn Dial>,
}

impl fmt::Debug for GuardedConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedConnector")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl GuardedConnector {
    /// The system resolver and real TCP.
    pub fn new(policy: OutboundPolicy) -> Self {
        GuardedConnector::with(
            policy,
            Arc::new(SystemResolver),
            Arc::new(TcpDialer::default()),
        )
    }

    /// With an injected resolver and dialer.
    pub fn with(policy: OutboundPolicy, resolver: Arc<dyn Resolve>, dialer: Arc<dyn Dial>) -> Self {
        GuardedConnector {
            policy: Arc::new(policy),
            resolver,
            dialer,
        }
    }

    /// The policy it enforces.
    pub fn policy(&self) -> &OutboundPolicy {
        &self.policy
    }

    /// Connects to `host:port` (`host` as in a URL: a name, an IPv4 literal in any WHATWG
    /// form, or a bracketed IPv6 literal). Only addresses that pass the policy are dialled,
    /// in the resolver's order; if none does, nothing is dialled.
    pub async fn connect(&self, host: &str, port: u16) -> Result<TcpStream, Error> {
        let parsed = Host::parse(host).map_err(|e| refused(format!("host {host:?}: {e}")))?;
        let candidates: Vec<IpAddr> = match self.policy.check_host(&parsed)? {
            HostCheck::Address(ip) => vec![ip],
            HostCheck::Localhost | HostCheck::Name(_) => {
                let name = match &parsed {
                    Host::Domain(d) => d.trim_end_matches('.').to_ascii_lowercase(),
                    Host::Ipv4(_) | Host::Ipv6(_) => parsed.to_string(),
                };
                self.resolver
                    .resolve(&name)
                    .await
                    .map_err(|e| refused(format!("host {name} does not resolve ({e})")))?
            }
        };
        let mut last_refusal = None;
        let mut last_io = None;
        for ip in candidates {
            let ip = unmap(ip);
            if let Err(e) = self.policy.judge_ip(ip) {
                last_refusal = Some(e);
                continue;
            }
            match self.dialer.dial(SocketAddr::new(ip, port)).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last_io = Some((ip, e)),
            }
        }
        if let Some((ip, e)) = last_io {
            return Err(transported(Error::unavailable(
                OP_CONNECT,
                format!("cannot connect to {ip}:{port}: {e}"),
            )));
        }
        Err(last_refusal.unwrap_or_else(|| refused(format!("host {host} resolves to no address"))))
    }
}

/// The error hyper-util sees.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for GuardedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| Box::new(refused(format!("URI {uri} has no host"))) as BoxError)?;
            let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                Some("https") | Some("wss") => 443,
                _ => 80,
            });
            let stream = me
                .connect(host, port)
                .await
                .map_err(|e| Box::new(e) as BoxError)?;
            Ok(TokioIo::new(stream))
        })
    }
}
