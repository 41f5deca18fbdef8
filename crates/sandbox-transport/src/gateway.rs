//! Gateway routing: which requests go to the sandbox gateway (the data plane) and how they are
//! rewritten, plus the per-pool registry of inbound traffic tokens.
//!
//! The split rule: a request is data-plane when the first label of its host is
//! `<port>-<sandbox id>` and the host is not the control-plane API host; everything else is
//! control-plane. A data-plane request is dialled at the configured gateway whatever its URL
//! authority says (so `49983-x.evil.example` reaches the gateway, never `evil.example`), with
//! its `Host` preserved for the gateway's own routing, and its scheme rewritten when the gateway
//! speaks plain HTTP. The caller's request is never mutated: [`Gateway::route`] builds a new one.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use hyper::header::{HOST, HeaderName, HeaderValue};
use hyper::{Request, Uri};
use sandbox_core::{Error, Operation, Secret};

use crate::transported;

const OP_ROUTE: Operation = Operation::new("route");

/// The header that carries a sandbox's inbound traffic token.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// A DNS label is at most 63 octets.
const MAX_LABEL: usize = 63;

fn invalid(message: String) -> Error {
    transported(Error::invalid_request(OP_ROUTE, message))
}

/// Where a gateway listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewayTarget {
    /// `http` or `https`.
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl GatewayTarget {
    /// From a URL such as `https://gw.example.com` or `http://10.0.0.5:8080`; the port defaults
    /// to the scheme's.
    pub fn parse(raw: &str) -> Result<Self, Error> {
        let url = url::Url::parse(raw.trim())
            .map_err(|e| invalid(format!("gateway URL {raw:?}: {e}")))?;
        let scheme = url.scheme().to_owned();
        if scheme != "http" && scheme != "https" {
            return Err(invalid(format!(
                "gateway URL {raw:?}: scheme must be http or https"
            )));
        }
        let host = url
            .host_str()
            .ok_or_else(|| invalid(format!("gateway URL {raw:?} has no host")))?
            .to_owned();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| invalid(format!("gateway URL {raw:?} has no port")))?;
        Ok(GatewayTarget { scheme, host, port })
    }
}

/// Which plane a request belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plane {
    Control,
    Data { port: u16, sandbox_id: String },
}

/// The `<port>-<sandbox id>` of a data-plane host's first label, if it has that shape.
/// Errors on a label too long for DNS (a host that cannot exist must not be routed).
pub fn data_label(host: &str) -> Result<Option<(u16, String)>, Error> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let Some(first) = host.split('.').next() else {
        return Ok(None);
    };
    let Some((digits, id)) = first.split_once('-') else {
        return Ok(None);
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || id.is_empty() {
        return Ok(None);
    }
    if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Ok(None);
    }
    if first.len() > MAX_LABEL {
        return Err(invalid(format!(
            "data-plane host label {first:?} is {} characters; a DNS label holds at most {MAX_LABEL}",
            first.len()
        )));
    }
    let Ok(port) = digits.parse::<u16>() else {
        return Ok(None);
    };
    if port == 0 {
        return Ok(None);
    }
    Ok(Some((port, id.to_owned())))
}

/// Inbound traffic tokens by sandbox ID (lower-cased), one registry per pool.
#[derive(Debug, Default, Clone)]
pub struct InboundTokens {
    map: Arc<RwLock<HashMap<String, Secret>>>,
}

impl InboundTokens {
    /// Records `token` for `sandbox_id`; empty values are ignored.
    pub fn put(&self, sandbox_id: &str, token: &Secret) {
        if sandbox_id.trim().is_empty() || token.is_empty() {
            return;
        }
        self.map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(sandbox_id.to_ascii_lowercase(), token.clone());
    }

    /// The token of `sandbox_id`.
    pub fn get(&self, sandbox_id: &str) -> Option<Secret> {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&sandbox_id.to_ascii_lowercase())
            .cloned()
    }

    /// Forgets `sandbox_id`'s token.
    pub fn remove(&self, sandbox_id: &str) {
        self.map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&sandbox_id.to_ascii_lowercase());
    }
}

/// The routing of one pool: the control-plane API host, the gateway (if any) and the pool's
/// token registry.
#[derive(Debug, Clone)]
pub struct Gateway {
    api_host: Option<String>,
    target: Option<GatewayTarget>,
    tokens: InboundTokens,
}

/// A routed request: where to dial, and the request to send there.
#[derive(Debug)]
pub struct Routed<B> {
    pub plane: Plane,
    /// `host:port` to dial (the gateway for the data plane, the URL authority otherwise).
    pub dial_host: String,
    pub dial_port: u16,
    pub request: Request<B>,
}

impl Gateway {
    pub fn new(
        api_host: Option<&str>,
        target: Option<GatewayTarget>,
        tokens: InboundTokens,
    ) -> Self {
        Gateway {
            api_host: api_host.map(|h| h.trim_end_matches('.').to_ascii_lowercase()),
            target,
            tokens,
        }
    }

    /// The pool's token registry.
    pub fn tokens(&self) -> &InboundTokens {
        &self.tokens
    }

    /// The plane of a request to `host`.
    pub fn plane(&self, host: &str) -> Result<Plane, Error> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.api_host.as_deref() == Some(host.as_str()) {
            return Ok(Plane::Control);
        }
        match data_label(&host)? {
            Some((port, sandbox_id)) if self.target.is_some() => {
                Ok(Plane::Data { port, sandbox_id })
            }
            _ => Ok(Plane::Control),
        }
    }

    /// Routes `request` (left untouched): adds the sandbox's inbound token when the request
    /// lacks the header (a header the caller set always wins), and for the data plane points
    /// the dial at the gateway, keeps `Host`, and rewrites the scheme to the gateway's.
    pub fn route<B: Clone>(&self, request: &Request<B>) -> Result<Routed<B>, Error> {
        let uri = request.uri();
        let host = uri
            .host()
            .ok_or_else(|| invalid(format!("request URI {uri} has no host")))?;
        let host_lc = host.trim_end_matches('.').to_ascii_lowercase();
        let request_port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        let plane = self.plane(&host_lc)?;

        let mut builder = Request::builder()
            .method(request.method().clone())
            .version(request.version());
        for (name, value) in request.headers() {
            builder = builder.header(name, value);
        }
        let token_header = HeaderName::from_static(TRAFFIC_TOKEN_HEADER);
        if !request.headers().contains_key(&token_header)
            && let Some((_, sandbox_id)) = data_label(&host_lc)?
            && let Some(token) = self.tokens.get(&sandbox_id)
        {
            let value = HeaderValue::from_str(token.expose())
                .map_err(|_| invalid("the inbound token is not a valid header value".to_owned()))?;
            builder = builder.header(token_header, value);
        }

        let (dial_host, dial_port, uri) = match (&plane, &self.target) {
            (Plane::Data { .. }, Some(gw)) => {
                if !request.headers().contains_key(HOST) {
                    let authority = uri
                        .authority()
                        .map_or_else(|| host.to_owned(), |a| a.as_str().to_owned());
                    builder = builder.header(
                        HOST,
                        HeaderValue::from_str(&authority).map_err(|_| {
                            invalid(format!("host {authority:?} is not a header value"))
                        })?,
                    );
                }
                let mut parts = uri.clone().into_parts();
                parts.scheme = Some(
                    gw.scheme
                        .parse()
                        .map_err(|_| invalid(format!("gateway scheme {:?}", gw.scheme)))?,
                );
                let rewritten = Uri::from_parts(parts)
                    .map_err(|e| invalid(format!("cannot rewrite {uri} for the gateway: {e}")))?;
                (gw.host.clone(), gw.port, rewritten)
            }
            _ => (host.to_owned(), request_port, uri.clone()),
        };
        let request = builder
            .uri(uri)
            .body(request.body().clone())
            .map_err(|e| invalid(format!("cannot build the routed request: {e}")))?;
        Ok(Routed {
            plane,
            dial_host,
            dial_port,
            request,
        })
    }
}
