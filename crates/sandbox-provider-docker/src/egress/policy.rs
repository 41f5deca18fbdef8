//! What egress is allowed and denied: the two policies, the ranges every policy drops (with
//! the metadata table of `sandbox_transport`), the private ranges the strict policy adds, and
//! which of the host's connected subnets it drops.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use sandbox_transport::metadata::{metadata_v4, metadata_v6};

use super::iptables::IpFamily;
use super::network::EgressNames;
use super::routes::ConnectedRoute;

/// Ranges dropped for every policy. 169.254/16 is link-local, where most clouds put their
/// metadata services; 0/8, 127/8, multicast and 240/4 are never a legitimate destination of a
/// forwarded connection. The metadata addresses outside these ranges (Azure's public
/// WireServer, Alibaba's inside CGNAT, Oracle's inside 192.0.0/24, which only the strict policy
/// drops) come from `sandbox_transport`'s table, see [`always_dropped`].
const ALWAYS_DROP_V4: &[IpNet] = &[
    net4([169, 254, 0, 0], 16),
    net4([0, 0, 0, 0], 8),
    net4([127, 0, 0, 0], 8),
    net4([224, 0, 0, 0], 4),
    net4([240, 0, 0, 0], 4),
];

/// Private, shared (CGNAT), benchmarking and IETF-protocol ranges: the operator's and the
/// cloud's internal networks. Dropped unless the tenant config allows private endpoints.
pub(super) const PRIVATE_V4: &[IpNet] = &[
    net4([10, 0, 0, 0], 8),
    net4([172, 16, 0, 0], 12),
    net4([192, 168, 0, 0], 16),
    net4([100, 64, 0, 0], 10),
    net4([198, 18, 0, 0], 15),
    net4([192, 0, 0, 0], 24),
];

/// `64:ff9b::a9fe:0/112` is 169.254/16 through the NAT64 well-known prefix. The rest is
/// link-local, loopback, unspecified, multicast and IPv4-mapped, none of which a sandbox may
/// reach through the host. The IPv6 metadata addresses (all unique-local or link-local) come
/// from `sandbox_transport`'s table, see [`always_dropped`].
const ALWAYS_DROP_V6: &[IpNet] = &[
    net6([0x64, 0xff9b, 0, 0, 0, 0, 0xa9fe, 0], 112),
    net6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
    net6([0, 0, 0, 0, 0, 0, 0, 1], 128),
    net6([0, 0, 0, 0, 0, 0, 0, 0], 128),
    net6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
    net6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
];

/// Unique-local (includes the sandbox networks themselves), deprecated site-local, discard-only
/// and local-use NAT64.
pub(super) const PRIVATE_V6: &[IpNet] = &[
    net6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
    net6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
    net6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
    net6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
];

/// The NAT64 well-known prefix (RFC 6052): an IPv4 destination through a translator.
const NAT64_WELL_KNOWN: [u16; 6] = [0x64, 0xff9b, 0, 0, 0, 0];

const fn net4(octets: [u8; 4], prefix: u8) -> IpNet {
    let [a, b, c, d] = octets;
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix))
}

const fn net6(segments: [u16; 8], prefix: u8) -> IpNet {
    let [a, b, c, d, e, f, g, h] = segments;
    IpNet::V6(Ipv6Net::new_assert(
        Ipv6Addr::new(a, b, c, d, e, f, g, h),
        prefix,
    ))
}

/// Every destination dropped whatever the policy: the family's ranges, then each address of
/// the metadata table not already inside one of them, as a host route (for IPv6 also the
/// NAT64 form of each IPv4 entry). The table is the one the SSRF guard refuses, so the two can
/// never disagree about what is metadata.
pub(super) fn always_dropped(family: IpFamily) -> Vec<IpNet> {
    let (mut nets, hosts): (Vec<IpNet>, Vec<IpAddr>) = match family {
        IpFamily::V4 => (
            ALWAYS_DROP_V4.to_vec(),
            metadata_v4().map(IpAddr::V4).collect(),
        ),
        IpFamily::V6 => (
            ALWAYS_DROP_V6.to_vec(),
            metadata_v6()
                .chain(metadata_v4().map(nat64))
                .map(IpAddr::V6)
                .collect(),
        ),
    };
    for host in hosts.into_iter().map(IpNet::from) {
        if !nets.iter().any(|n| n.contains(&host)) {
            nets.push(host);
        }
    }
    nets
}

fn nat64(v4: Ipv4Addr) -> Ipv6Addr {
    let [a, b, c, d, e, f] = NAT64_WELL_KNOWN;
    let [w, x, y, z] = v4.octets();
    Ipv6Addr::new(
        a,
        b,
        c,
        d,
        e,
        f,
        u16::from_be_bytes([w, x]),
        u16::from_be_bytes([y, z]),
    )
}

/// Which egress policy a network enforces. Two policies → two networks, because allow-private
/// is per tenant config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EgressPolicy {
    /// Whether sandboxes may reach private ranges and CGNAT (metadata stays blocked).
    pub allow_private: bool,
}

impl EgressPolicy {
    /// Public destinations only: private ranges, CGNAT and the host's own subnets are dropped.
    pub const STRICT: EgressPolicy = EgressPolicy {
        allow_private: false,
    };
    /// Public and private destinations, the host's LANs included; metadata and the host itself
    /// stay blocked.
    pub const ALLOW_PRIVATE: EgressPolicy = EgressPolicy {
        allow_private: true,
    };

    pub(super) const BOTH: [EgressPolicy; 2] = [EgressPolicy::STRICT, EgressPolicy::ALLOW_PRIVATE];

    /// The value of the `sandbox.egress` label and the network name's suffix.
    pub fn label(self) -> &'static str {
        if self.allow_private {
            "private"
        } else {
            "strict"
        }
    }
}

/// A connected route broader than this is taken for "everything through this link" (a
/// point-to-point default, a VPN's `0.0.0.0/1` pair), not a LAN.
const MIN_LAN_PREFIX_V4: u8 = 8;
const MIN_LAN_PREFIX_V6: u8 = 16;

/// The subnets the host is connected to that the strict policy drops on top of `dropped`: each
/// of `family`, but not the sandbox's own bridge (the `-o <bridge>` rule covers it and its
/// route appears only once the network exists), not a default-like route through a link (a
/// tunnel's `0.0.0.0/1`: dropping it would cut the sandbox from the internet, and it is no
/// LAN), and nothing a dropped range or another connected subnet already covers. Sorted, so
/// a reordered routing table changes no rule.
pub(super) fn connected_drops(
    family: IpFamily,
    names: &EgressNames,
    connected: &[ConnectedRoute],
    dropped: &[IpNet],
) -> Vec<IpNet> {
    let min_prefix = match family {
        IpFamily::V4 => MIN_LAN_PREFIX_V4,
        IpFamily::V6 => MIN_LAN_PREFIX_V6,
    };
    let lans: BTreeSet<IpNet> = connected
        .iter()
        .filter(|r| r.device != names.bridge && family.matches(&r.net.addr()))
        .map(|r| r.net.trunc())
        .filter(|net| net.prefix_len() >= min_prefix)
        .filter(|net| !dropped.iter().any(|d| d.contains(net)))
        .collect();
    lans.iter()
        .filter(|net| {
            !lans
                .iter()
                .any(|other| other != *net && other.contains(*net))
        })
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::rules::forward_rules;
    use crate::egress::testing::*;

    /// Every address of the metadata table is dropped, for both policies and both families,
    /// in the rules as generated and as installed.
    #[test]
    fn every_metadata_address_is_dropped_under_both_policies() {
        let mut wrong = Vec::new();
        for policy in EgressPolicy::BOTH {
            let names = EgressNames::new("team-a", policy);
            for family in [IpFamily::V4, IpFamily::V6] {
                let generated: Vec<String> =
                    forward_rules(family, &names, policy, &resolvers(), &routes())
                        .iter()
                        .map(|r| r.join(" "))
                        .collect();
                let fake = FakeIptables::docker_host();
                rt().block_on(install(&fake, family, policy, &resolvers()))
                    .unwrap();
                let installed = fake.table(family)[&names.forward].clone();
                for (what, rules) in [("generated", generated), ("installed", installed)] {
                    for dst in metadata_not_dropped(&rules, family) {
                        wrong.push(format!("{} {what}: {dst} not dropped", policy.label()));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// Strict drops the host's own subnets whatever their addressing, after the DNS
    /// exemptions (a resolver on the LAN keeps answering); allow-private leaves them open, as
    /// it leaves a private LAN open.
    #[test]
    fn strict_drops_the_hosts_connected_subnets() {
        let mut connected = routes();
        connected.extend([
            // A public range on the sandbox's own bridge is the `-o <bridge>` rule's business.
            ConnectedRoute::new("198.51.100.0/24".parse().unwrap(), "sbx4bf24aa9"),
            // Inside the /24 LAN: no rule of its own.
            ConnectedRoute::new("203.0.113.128/25".parse().unwrap(), "eth2"),
        ]);
        let resolvers: Vec<IpAddr> = vec![
            "203.0.113.53".parse().unwrap(),
            "2001:db8:1::53".parse().unwrap(),
        ];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for policy in EgressPolicy::BOTH {
            let names = EgressNames::new("team-a", policy);
            let lan_open = policy.allow_private;
            for family in [IpFamily::V4, IpFamily::V6] {
                let rules: Vec<String> =
                    forward_rules(family, &names, policy, &resolvers, &connected)
                        .iter()
                        .map(|r| r.join(" "))
                        .collect();
                let verdicts: Vec<String> = rules
                    .iter()
                    .map(|r| r.rsplit(' ').next().unwrap().to_owned())
                    .collect();
                assert!(exemptions_first(&verdicts), "{rules:?}");
                assert_eq!(
                    metadata_not_dropped(&rules, family),
                    Vec::<IpAddr>::new(),
                    "{}",
                    policy.label()
                );
                assert!(
                    !rules.iter().any(|r| r.contains("198.51.100.0/24")
                        || r.contains("203.0.113.128/25")
                        || r.contains("0.0.0.0/1")),
                    "{rules:?}"
                );
                let (lan_host, resolver, internet) = match family {
                    IpFamily::V4 => (ip("203.0.113.7"), resolvers[0], ip("8.8.8.8")),
                    IpFamily::V6 => (ip("2001:db8:1::7"), resolvers[1], ip("2606:4700::1111")),
                };
                let want_lan = if lan_open { "RETURN" } else { "DROP" };
                assert_eq!(fate(&rules, lan_host, "tcp", 443), want_lan, "{rules:?}");
                assert_eq!(fate(&rules, resolver, "tcp", 80), want_lan, "{rules:?}");
                assert_eq!(fate(&rules, resolver, "udp", 53), "RETURN", "{rules:?}");
                assert_eq!(fate(&rules, internet, "tcp", 443), "RETURN", "{rules:?}");
            }
        }
    }
}
