//! The cloud metadata and instance-secret endpoints: one table, read by the SSRF guard
//! ([`crate::ip_class`] classifies every entry as [`crate::IpClass::Metadata`], in every
//! encoding) and by the Docker adapter's egress rules (a DROP for every entry, whatever the
//! policy).
//!
//! An entry belongs here when a process on the instance can reach it at a fixed address and it
//! answers with instance data: credentials, user data, keys, or the platform's control channel.
//! Many of them sit inside ranges some policy reopens (CGNAT `100.64/10` and unique-local
//! `fc00::/7` under allow-private) or in public space (Azure's WireServer), so a range-based
//! verdict alone would let them through; the table names each one so neither consumer depends on
//! where an address happens to fall. Entries inside link-local ranges that are refused anyway are
//! listed too: the table is the inventory, and a later change to a range rule must not lose them.
//!
//! Left out on purpose: AWS's Route 53 Resolver (169.254.169.253, `fd00:ec2::253`) and Time Sync
//! (169.254.169.123, `fd00:ec2::123`) endpoints. They answer DNS and NTP, not instance data,
//! and a host may name the resolver as its upstream (the egress rules then exempt it for DNS).
//!
//! Only the address counts, never a host name: names such as `metadata.google.internal`,
//! `metadata.tencentyun.com` or `instance-data` resolve to entries of this table, and the guard
//! judges every address a name resolves to, at validation and again at connect time.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One metadata or instance-secret endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataEndpoint {
    /// The address the service answers on.
    pub addr: IpAddr,
    /// Who serves it.
    pub providers: &'static str,
    /// What it hands out.
    pub service: &'static str,
}

const fn v4(octets: [u8; 4], providers: &'static str, service: &'static str) -> MetadataEndpoint {
    let [a, b, c, d] = octets;
    MetadataEndpoint {
        addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
        providers,
        service,
    }
}

const fn v6(
    segments: [u16; 8],
    providers: &'static str,
    service: &'static str,
) -> MetadataEndpoint {
    let [a, b, c, d, e, f, g, h] = segments;
    MetadataEndpoint {
        addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
        providers,
        service,
    }
}

/// Every metadata and instance-secret endpoint, each with the public document it comes from.
pub const METADATA_ENDPOINTS: &[MetadataEndpoint] = &[
    // AWS EC2 User Guide, "Retrieve instance metadata"; Google Compute Engine, "About VM
    // metadata"; Microsoft Learn, "Azure Instance Metadata Service"; OCI documentation,
    // "Getting Instance Metadata"; OpenStack Nova admin guide, "Metadata service"; Huawei Cloud
    // ECS user guide, "Obtaining Metadata"; Akamai (Linode) docs, "Metadata service API".
    v4(
        [169, 254, 169, 254],
        "AWS, GCP, Azure, Oracle Cloud, OpenStack, Huawei Cloud, Akamai (Linode)",
        "instance metadata service (credentials, user data)",
    ),
    // AWS ECS Developer Guide, "Amazon ECS task metadata endpoint version 2" (the same address
    // serves the task IAM role credentials).
    v4(
        [169, 254, 170, 2],
        "AWS ECS",
        "task metadata and task role credentials",
    ),
    // AWS EKS User Guide, "Set up the Amazon EKS Pod Identity Agent" (IPv4 and IPv6 addresses).
    v4(
        [169, 254, 170, 23],
        "AWS EKS",
        "Pod Identity Agent (pod credentials)",
    ),
    // Tencent Cloud CVM documentation, "Querying instance metadata" (metadata.tencentyun.com,
    // which answers on 169.254.0.23).
    v4(
        [169, 254, 0, 23],
        "Tencent Cloud",
        "instance metadata service",
    ),
    // cloud-init documentation, "Scaleway" datasource (IPv4 and IPv6 addresses).
    v4([169, 254, 42, 42], "Scaleway", "instance metadata service"),
    // Alibaba Cloud ECS documentation, "Overview of ECS instance metadata"; cloud-init
    // documentation, "Alibaba Cloud (AliYun)" datasource. Inside CGNAT 100.64/10.
    v4(
        [100, 100, 100, 200],
        "Alibaba Cloud",
        "instance metadata service",
    ),
    // Microsoft Learn, "What is IP address 168.63.129.16?": the host node's virtual IP through
    // which the VM agent talks to the platform (WireServer), and DHCP and DNS. A public address.
    v4([168, 63, 129, 16], "Azure", "WireServer platform channel"),
    // Oracle Cloud Infrastructure Compute Classic, "Retrieving Instance Metadata"; Oracle Cloud
    // at Customer, "Retrieve Predefined Instance Metadata". Inside 192.0.0.0/24.
    v4(
        [192, 0, 0, 192],
        "Oracle Cloud (Classic, Cloud at Customer)",
        "instance metadata service",
    ),
    // AWS EC2 User Guide, "Retrieve instance metadata" (IPv6 endpoint, Nitro instances).
    v6(
        [0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254],
        "AWS",
        "instance metadata service over IPv6",
    ),
    // AWS EKS User Guide, "Set up the Amazon EKS Pod Identity Agent".
    v6(
        [0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0023],
        "AWS EKS",
        "Pod Identity Agent over IPv6",
    ),
    // The Compute Engine metadata server's IPv6 address, for IPv6-only workloads; Google's own
    // Config Connector operator (GoogleCloudPlatform/k8s-config-connector) takes it as
    // GCE_METADATA_HOST.
    v6(
        [0xfd20, 0x00ce, 0, 0, 0, 0, 0, 0x0254],
        "GCP",
        "metadata server over IPv6",
    ),
    // cloud-init documentation, "Scaleway" datasource.
    v6(
        [0xfd00, 0x0042, 0, 0, 0, 0, 0, 0x0042],
        "Scaleway",
        "instance metadata service over IPv6",
    ),
    // Akamai (Linode) docs, "Metadata service API"; cloud-init documentation, "Akamai"
    // datasource.
    v6(
        [0xfd00, 0xa9fe, 0xa9fe, 0, 0, 0, 0, 1],
        "Akamai (Linode)",
        "metadata service over IPv6",
    ),
    // Alibaba Cloud's IPv6 metadata server, as the cloud-init AliYun datasource change that
    // adds it describes it (canonical/cloud-init pull request 6893).
    v6(
        [0xfd00, 0x0100, 0, 0, 0, 0, 0x0100, 0x0200],
        "Alibaba Cloud",
        "instance metadata service over IPv6",
    ),
    // OpenStack Nova admin guide, "Metadata service" (IPv6 since Victoria). Link-local.
    v6(
        [0xfe80, 0, 0, 0, 0, 0, 0xa9fe, 0xa9fe],
        "OpenStack",
        "metadata service over IPv6",
    ),
];

/// Whether `ip` is one of the table's addresses (exactly; other encodings are
/// [`crate::ip_class`]'s business).
pub fn is_metadata(ip: IpAddr) -> bool {
    METADATA_ENDPOINTS.iter().any(|e| e.addr == ip)
}

/// The table's IPv4 addresses.
pub fn metadata_v4() -> impl Iterator<Item = Ipv4Addr> {
    METADATA_ENDPOINTS.iter().filter_map(|e| match e.addr {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    })
}

/// The table's IPv6 addresses.
pub fn metadata_v6() -> impl Iterator<Item = Ipv6Addr> {
    METADATA_ENDPOINTS.iter().filter_map(|e| match e.addr {
        IpAddr::V6(v6) => Some(v6),
        IpAddr::V4(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn the_table_has_no_duplicates_and_names_every_provider() {
        let mut seen = HashSet::new();
        for e in METADATA_ENDPOINTS {
            assert!(seen.insert(e.addr), "{} is listed twice", e.addr);
            assert!(!e.providers.is_empty() && !e.service.is_empty(), "{e:?}");
            // An IPv4-mapped entry would never match: the guard unmaps before it looks.
            if let IpAddr::V6(v6) = e.addr {
                assert!(v6.to_ipv4_mapped().is_none(), "{v6} is IPv4-mapped");
            }
        }
        assert_eq!(
            metadata_v4().count() + metadata_v6().count(),
            METADATA_ENDPOINTS.len()
        );
    }
}
