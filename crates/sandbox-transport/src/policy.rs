//! The outbound policy: which tenant-supplied endpoints the service may dial.
//!
//! Two checks, both required:
//! - [`validate_url`] at configuration time: scheme, host shape, the optional whitelist (before
//!   any DNS lookup), and every resolved address;
//! - the guarded connector ([`crate::connector`]) at connect time, on the concrete socket
//!   address it is about to dial — which is what defeats DNS rebinding: a name that resolved to
//!   a public address at validation and to 169.254.169.254 a minute later is refused before any
//!   socket is opened.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use async_trait::async_trait;
use ipnet::IpNet;
use sandbox_core::{Error, ErrorCode, Operation};
use url::{Host, Url};

use crate::ip_class::{IpClass, classify};
use crate::transported;

const OP_VALIDATE: Operation = Operation::new("validate_endpoint");

/// A refusal: an `invalid_request` with code `unsafe_outbound_url`.
pub fn refused(what: impl fmt::Display) -> Error {
    transported(Error::invalid_request(
        OP_VALIDATE,
        format!("outbound endpoint refused: {what}"),
    ))
    .with_code(ErrorCode::UnsafeOutboundUrl)
}

/// Hosts an operator allows in whitelist-only mode: names match by exact name
/// (case-insensitive), CIDR entries match IP literals and resolved addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Whitelist {
    names: BTreeSet<String>,
    nets: Vec<IpNet>,
}

impl Whitelist {
    /// From entries such as `api.example.com`, `10.0.0.0/8`, `192.0.2.7`.
    pub fn new<I, S>(entries: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut list = Whitelist::default();
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry.is_empty() {
                continue;
            }
            if let Ok(net) = entry.parse::<IpNet>() {
                list.nets.push(net);
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                list.nets.push(IpNet::from(ip));
            } else if entry
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            {
                list.names
                    .insert(entry.trim_end_matches('.').to_ascii_lowercase());
            } else {
                return Err(transported(Error::invalid_request(
                    OP_VALIDATE,
                    format!(
                        "whitelist entry {entry:?} is neither a host name nor an address or CIDR"
                    ),
                ))
                .with_code(ErrorCode::ConfigIncomplete));
            }
        }
        Ok(list)
    }

    fn has_name(&self, name: &str) -> bool {
        self.names
            .contains(&name.trim_end_matches('.').to_ascii_lowercase())
    }

    fn has_ip(&self, ip: IpAddr) -> bool {
        let ip = unmap(ip);
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

/// What the service may dial.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboundPolicy {
    /// Loopback, private and CGNAT addresses (and `localhost`) are allowed. Link-local,
    /// metadata, reserved and translated addresses never are.
    pub allow_private: bool,
    /// Whitelist-only mode: a host not on the list is refused before any DNS lookup, and
    /// `allow_private` does not reopen it.
    pub whitelist: Option<Whitelist>,
}

/// An IPv4-mapped IPv6 address is the IPv4 address.
pub fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// A host as the policy sees it, before any resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostCheck {
    /// An address literal, judged already.
    Address(IpAddr),
    /// `localhost`, allowed without a lookup (only with private endpoints allowed).
    Localhost,
    /// A name to resolve; every address it resolves to must pass [`OutboundPolicy::judge_ip`].
    Name(String),
}

impl OutboundPolicy {
    /// Refuses private, loopback and CGNAT endpoints (the fail-closed default).
    pub fn deny_private() -> Self {
        OutboundPolicy::default()
    }

    /// Allows private, loopback and CGNAT endpoints (self-hosted control planes).
    pub fn allow_private() -> Self {
        OutboundPolicy {
            allow_private: true,
            whitelist: None,
        }
    }

    /// The verdict on one concrete address (the whitelist is a matter of names and literals,
    /// judged by [`OutboundPolicy::check_host`]; here only the address class counts).
    pub fn judge_ip(&self, ip: IpAddr) -> Result<(), Error> {
        self.verdict(ip).map_err(refused)
    }

    fn verdict(&self, ip: IpAddr) -> Result<(), String> {
        let ip = unmap(ip);
        let class = classify(ip);
        if class.allowed(self.allow_private) {
            Ok(())
        } else if matches!(class, IpClass::Loopback | IpClass::Private | IpClass::Cgnat) {
            Err(format!(
                "address {ip} is {} and private endpoints are not allowed",
                class.as_str()
            ))
        } else {
            Err(format!("address {ip} is {}", class.as_str()))
        }
    }

    /// Judges a URL host before any resolution: literals fully, names by shape and whitelist.
    pub fn check_host<S: AsRef<str>>(&self, host: &Host<S>) -> Result<HostCheck, Error> {
        let ip = match host {
            Host::Ipv4(v4) => IpAddr::V4(*v4),
            Host::Ipv6(v6) => IpAddr::V6(*v6),
            Host::Domain(name) => {
                let name = name.as_ref().trim_end_matches('.').to_ascii_lowercase();
                if name.is_empty() {
                    return Err(refused("empty host"));
                }
                if let Some(list) = &self.whitelist
                    && !list.has_name(&name)
                {
                    return Err(refused(format!("host {name} is not on the whitelist")));
                }
                if name == "local" || name.ends_with(".local") {
                    return Err(refused(format!("host {name} is an mDNS (.local) name")));
                }
                if name == "localhost" || name.ends_with(".localhost") {
                    return if self.allow_private {
                        Ok(HostCheck::Localhost)
                    } else {
                        Err(refused(format!(
                            "host {name} is loopback and private endpoints are not allowed"
                        )))
                    };
                }
                return Ok(HostCheck::Name(name));
            }
        };
        if let Some(list) = &self.whitelist
            && !list.has_ip(ip)
        {
            return Err(refused(format!("address {ip} is not on the whitelist")));
        }
        self.judge_ip(ip)?;
        Ok(HostCheck::Address(ip))
    }
}

/// Name resolution, injectable so verdicts are tested without DNS and without sockets.
#[async_trait]
pub trait Resolve: Send + Sync + fmt::Debug {
    /// Every address `host` resolves to.
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>>;
}

/// The system resolver (`getaddrinfo` on a blocking thread, through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        let addrs = tokio::net::lookup_host((host, 0)).await?;
        Ok(addrs.map(|a| a.ip()).collect())
    }
}

/// Validates a tenant-supplied endpoint URL: `http`/`https` only, a host, the host checks of
/// [`OutboundPolicy::check_host`], and every address the host resolves to. A lookup failure or
/// an empty answer is a refusal (fail closed).
pub async fn validate_url(
    raw: &str,
    policy: &OutboundPolicy,
    resolver: &dyn Resolve,
) -> Result<Url, Error> {
    let url = Url::parse(raw.trim()).map_err(|e| refused(format!("not a URL ({e})")))?;
    match url.scheme() {
        "http" | "https" => {}
        other => return Err(refused(format!("scheme {other:?} (only http and https)"))),
    }
    let host = url.host().ok_or_else(|| refused("the URL has no host"))?;
    if let HostCheck::Name(name) = policy.check_host(&host)? {
        let addrs = resolver
            .resolve(&name)
            .await
            .map_err(|e| refused(format!("host {name} does not resolve ({e})")))?;
        if addrs.is_empty() {
            return Err(refused(format!("host {name} resolves to no address")));
        }
        for ip in addrs {
            policy
                .verdict(ip)
                .map_err(|why| refused(format!("host {name} resolves to {why}")))?;
        }
    }
    Ok(url)
}
