//! Classifying the address about to be dialled, and the verdict of the outbound policy on it.
//!
//! The class is judged on the *concrete* address, after resolution, so every way of spelling an
//! address reaches the same verdict: IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is the IPv4 address
//! itself; IPv4-compatible (`::a.b.c.d`), IPv4-translated (`::ffff:0:a.b.c.d`), 6to4
//! (`2002:AABB:CCDD::/48`) and NAT64 well-known (`64:ff9b::/96`) carry an IPv4 address that is
//! judged, and anything but a public one makes the carrier [`IpClass::Translated`] (refused even
//! with private endpoints allowed: a gateway could relay it anywhere). Teredo (`2001::/32`) and
//! NAT64 local-use (`64:ff9b:1::/48`) are refused outright: their embedded address is obfuscated
//! or network-specific. Every address of the metadata table ([`crate::metadata`]) is
//! [`IpClass::Metadata`] before any range is looked at, so it is refused also where its range
//! would pass (WireServer is public, Alibaba's address is CGNAT, the IPv6 ones are unique-local)
//! and where private endpoints are allowed; an IPv4 entry stays metadata in every embedding
//! above, transparent or translated.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::metadata::is_metadata;

/// What an address is, as far as the outbound policy cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpClass {
    /// A globally routable address.
    Public,
    /// Documentation ranges (192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32): not
    /// routable, harmless, used by tests and examples.
    Documentation,
    /// 127/8, `::1`.
    Loopback,
    /// RFC 1918 and IPv6 unique-local (`fc00::/7`).
    Private,
    /// Carrier-grade NAT, 100.64/10.
    Cgnat,
    /// A cloud metadata or instance-secret endpoint: an address of
    /// [`crate::metadata::METADATA_ENDPOINTS`] (169.254.169.254, 168.63.129.16, `fd20:ce::254`, ...).
    Metadata,
    /// 169.254/16, `fe80::/10`, link-local multicast.
    LinkLocal,
    /// Other multicast.
    Multicast,
    /// 0.0.0.0, `::`.
    Unspecified,
    /// Reserved or special-purpose ranges (0/8, 240/4, 198.18/15, 192.0.0/24, `100::/64`, ...).
    Reserved,
    /// Deprecated IPv6 site-local, `fec0::/10`.
    SiteLocalV6,
    /// An IPv6 address carrying a non-public IPv4 address, or a Teredo / local-use NAT64 one.
    Translated,
}

impl IpClass {
    /// A stable name for messages and tests.
    pub fn as_str(self) -> &'static str {
        match self {
            IpClass::Public => "public",
            IpClass::Documentation => "documentation",
            IpClass::Loopback => "loopback",
            IpClass::Private => "private",
            IpClass::Cgnat => "cgnat",
            IpClass::Metadata => "cloud metadata",
            IpClass::LinkLocal => "link-local",
            IpClass::Multicast => "multicast",
            IpClass::Unspecified => "unspecified",
            IpClass::Reserved => "reserved",
            IpClass::SiteLocalV6 => "site-local",
            IpClass::Translated => "translated",
        }
    }

    /// Whether the policy lets a connection to this class through.
    pub fn allowed(self, allow_private: bool) -> bool {
        match self {
            IpClass::Public | IpClass::Documentation => true,
            IpClass::Loopback | IpClass::Private | IpClass::Cgnat => allow_private,
            IpClass::Metadata
            | IpClass::LinkLocal
            | IpClass::Multicast
            | IpClass::Unspecified
            | IpClass::Reserved
            | IpClass::SiteLocalV6
            | IpClass::Translated => false,
        }
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    (u32::from(ip) & mask) == (u32::from(Ipv4Addr::from(net)) & mask)
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    let net = Ipv6Addr::new(
        net[0], net[1], net[2], net[3], net[4], net[5], net[6], net[7],
    );
    (u128::from(ip) & mask) == (u128::from(net) & mask)
}

/// The class of an IPv4 address.
pub fn classify_v4(ip: Ipv4Addr) -> IpClass {
    if is_metadata(IpAddr::V4(ip)) {
        return IpClass::Metadata;
    }
    let table: &[([u8; 4], u32, IpClass)] = &[
        ([0, 0, 0, 0], 32, IpClass::Unspecified),
        ([0, 0, 0, 0], 8, IpClass::Reserved),
        ([10, 0, 0, 0], 8, IpClass::Private),
        ([100, 64, 0, 0], 10, IpClass::Cgnat),
        ([127, 0, 0, 0], 8, IpClass::Loopback),
        ([169, 254, 0, 0], 16, IpClass::LinkLocal),
        ([172, 16, 0, 0], 12, IpClass::Private),
        ([192, 0, 0, 0], 24, IpClass::Reserved),
        ([192, 0, 2, 0], 24, IpClass::Documentation),
        ([192, 88, 99, 0], 24, IpClass::Reserved), // deprecated 6to4 relay anycast
        ([192, 168, 0, 0], 16, IpClass::Private),
        ([198, 18, 0, 0], 15, IpClass::Reserved),
        ([198, 51, 100, 0], 24, IpClass::Documentation),
        ([203, 0, 113, 0], 24, IpClass::Documentation),
        ([224, 0, 0, 0], 24, IpClass::LinkLocal), // link-local multicast
        ([224, 0, 0, 0], 4, IpClass::Multicast),
        ([240, 0, 0, 0], 4, IpClass::Reserved), // includes 255.255.255.255
    ];
    table
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map_or(IpClass::Public, |(_, _, class)| *class)
}

/// The IPv4 address an IPv6 address carries, and how: `Some((v4, true))` for a transparent
/// encoding (IPv4-mapped: the same address), `Some((v4, false))` for an embedding that a relay
/// translates (IPv4-compatible, IPv4-translated, 6to4, NAT64 well-known).
fn embedded_v4(ip: Ipv6Addr) -> Option<(Ipv4Addr, bool)> {
    let o = ip.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some((v4, true));
    }
    // ::a.b.c.d (but not :: and ::1, which are their own classes).
    if o[..12].iter().all(|&b| b == 0) && u32::from(tail) > 1 {
        return Some((tail, false));
    }
    if in_v6(ip, [0, 0, 0, 0, 0xffff, 0, 0, 0], 96) {
        return Some((tail, false)); // ::ffff:0:a.b.c.d (RFC 2765)
    }
    if in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        return Some((tail, false));
    }
    if in_v6(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        return Some((Ipv4Addr::new(o[2], o[3], o[4], o[5]), false));
    }
    None
}

/// The class of an IPv6 address.
pub fn classify_v6(ip: Ipv6Addr) -> IpClass {
    if is_metadata(IpAddr::V6(ip)) {
        return IpClass::Metadata;
    }
    if ip.is_unspecified() {
        return IpClass::Unspecified;
    }
    if ip.is_loopback() {
        return IpClass::Loopback;
    }
    if let Some((v4, transparent)) = embedded_v4(ip) {
        let inner = classify_v4(v4);
        return match (transparent, inner) {
            (true, class) => class,
            // A metadata address stays one, however it is carried.
            (false, IpClass::Metadata) => IpClass::Metadata,
            (false, IpClass::Public) => IpClass::Public,
            (false, _) => IpClass::Translated,
        };
    }
    let table: &[([u16; 8], u32, IpClass)] = &[
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, IpClass::Translated), // NAT64 local use
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, IpClass::Translated),    // Teredo
        (
            [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
            32,
            IpClass::Documentation,
        ),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, IpClass::Documentation), // RFC 9637
        ([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28, IpClass::Reserved),   // ORCHID
        ([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28, IpClass::Reserved),   // ORCHIDv2
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, IpClass::Reserved),       // discard-only
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, IpClass::LinkLocal),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, IpClass::SiteLocalV6),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, IpClass::Private),
        ([0xff02, 0, 0, 0, 0, 0, 0, 0], 16, IpClass::LinkLocal), // link-local multicast
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, IpClass::Multicast),
        ([0, 0, 0, 0, 0, 0, 0, 0], 8, IpClass::Reserved), // the rest of ::/8
    ];
    table
        .iter()
        .find(|(net, prefix, _)| in_v6(ip, *net, *prefix))
        .map_or(IpClass::Public, |(_, _, class)| *class)
}

/// The class of any address.
pub fn classify(ip: IpAddr) -> IpClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn embedded_forms_are_found() {
        let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        assert_eq!(
            embedded_v4(v6("::ffff:1.2.3.4")),
            Some((Ipv4Addr::new(1, 2, 3, 4), true))
        );
        assert_eq!(
            embedded_v4(v6("::1.2.3.4")),
            Some((Ipv4Addr::new(1, 2, 3, 4), false))
        );
        assert_eq!(
            embedded_v4(v6("2002:0102:0304::1")),
            Some((Ipv4Addr::new(1, 2, 3, 4), false))
        );
        assert_eq!(
            embedded_v4(v6("64:ff9b::102:304")),
            Some((Ipv4Addr::new(1, 2, 3, 4), false))
        );
        assert_eq!(embedded_v4(v6("::1")), None);
        assert_eq!(embedded_v4(v6("2606:4700::1")), None);
    }
}
