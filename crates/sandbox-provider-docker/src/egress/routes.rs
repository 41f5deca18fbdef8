//! The subnets the host is directly connected to, read from the kernel's routing tables: the
//! strict policy drops them (see [`super::policy`]).

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A route the kernel has straight onto a link, without a gateway: a subnet the host sits on
/// (its LAN, a Docker bridge, a VPN's link).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnectedRoute {
    /// The subnet.
    pub net: IpNet,
    /// The interface it is reached through.
    pub device: String,
}

impl ConnectedRoute {
    /// `net` (e.g. `203.0.113.0/24`) on `device`.
    pub fn new(net: IpNet, device: impl Into<String>) -> Self {
        ConnectedRoute {
            net,
            device: device.into(),
        }
    }
}

// Route flags of `/proc/net/route` and `/proc/net/ipv6_route` (linux/route.h,
// linux/ipv6_route.h).
const RTF_UP: u32 = 0x0001;
const RTF_GATEWAY: u32 = 0x0002;
const RTF_REJECT: u32 = 0x0200;
const RTF_ANYCAST: u32 = 0x0010_0000;
const RTF_CACHE: u32 = 0x0100_0000;
const RTF_LOCAL: u32 = 0x8000_0000;

/// The subnets this host is directly connected to, from the kernel: `/proc/net/route` (the
/// IPv4 main table) and `/proc/net/ipv6_route` (every IPv6 table; a connected route of another
/// table only ever adds a drop). Read from `/proc` rather than through `ip` or netlink: the
/// files exist on every Linux kernel this module runs on, need no extra program or crate, and
/// are in the network namespace of the process, the one whose iptables it edits.
///
/// Fails when the IPv4 table cannot be read, so strict egress never runs blind to the host's
/// LANs; a kernel without IPv6 has no `ipv6_route` and no IPv6 LAN.
pub fn host_connected_routes() -> io::Result<Vec<ConnectedRoute>> {
    let v4 = std::fs::read_to_string("/proc/net/route")
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read /proc/net/route: {e}")))?;
    let v6 = match std::fs::read_to_string("/proc/net/ipv6_route") {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot read /proc/net/ipv6_route: {e}"),
            ));
        }
    };
    let mut routes = parse_proc_route(&v4);
    routes.extend(parse_proc_ipv6_route(&v6));
    Ok(routes)
}

/// `Iface Destination Gateway Flags RefCnt Use Metric Mask ...`: addresses and masks are the
/// raw network-order words printed as host-order hex.
fn parse_proc_route(text: &str) -> Vec<ConnectedRoute> {
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [
                device,
                dst,
                _gateway,
                flags,
                _refcnt,
                _use,
                _metric,
                mask,
                ..,
            ] = fields.as_slice()
            else {
                return None;
            };
            let flags = u32::from_str_radix(flags, 16).ok()?;
            if flags & RTF_UP == 0 || flags & (RTF_GATEWAY | RTF_REJECT) != 0 || *device == "lo" {
                return None;
            }
            let mask = u32::from_be_bytes(word(mask)?);
            let prefix = mask.leading_ones();
            // A mask with holes is no prefix; the kernel never prints one.
            if mask.checked_shl(prefix).unwrap_or(0) != 0 {
                return None;
            }
            let net = Ipv4Net::new(Ipv4Addr::from(word(dst)?), u8::try_from(prefix).ok()?).ok()?;
            Some(ConnectedRoute::new(IpNet::V4(net.trunc()), *device))
        })
        .collect()
}

/// `dst plen src splen nexthop metric refcnt use flags device`, addresses as 32 hex digits.
fn parse_proc_ipv6_route(text: &str) -> Vec<ConnectedRoute> {
    let skip = RTF_GATEWAY | RTF_REJECT | RTF_ANYCAST | RTF_CACHE | RTF_LOCAL;
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [
                dst,
                plen,
                _src,
                _splen,
                nexthop,
                _metric,
                _refcnt,
                _use,
                flags,
                device,
            ] = fields.as_slice()
            else {
                return None;
            };
            let flags = u32::from_str_radix(flags, 16).ok()?;
            let nexthop = u128::from_str_radix(nexthop, 16).ok()?;
            if flags & RTF_UP == 0 || flags & skip != 0 || nexthop != 0 || *device == "lo" {
                return None;
            }
            let dst = Ipv6Addr::from(u128::from_str_radix(dst, 16).ok()?);
            if dst.is_multicast() {
                return None;
            }
            let net = Ipv6Net::new(dst, u8::from_str_radix(plen, 16).ok()?).ok()?;
            Some(ConnectedRoute::new(IpNet::V6(net.trunc()), *device))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/net/route` and `/proc/net/ipv6_route` as this kernel prints them (a Docker host
    /// with a public-addressed LAN), plus the kinds of route that are not a connected subnet:
    /// through a gateway, rejected, local, multicast, loopback, malformed.
    #[test]
    fn connected_routes_are_read_from_the_kernel_tables() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
                  eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  eth0\t0000000A\t010200C0\t0003\t0\t0\t0\t000000FF\t0\t0\t0\n\
                  *\t0064A8C0\t00000000\t0201\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  wg0\t0101A8C0\t00000000\t0005\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n\
                  tun0\t00000000\t00000000\t0001\t0\t0\t0\t00000080\t0\t0\t0\n\
                  eth1\t000200C0\t00000000\t0001\t0\t0\t0\t00FF00FF\t0\t0\t0\n\
                  bogus\tzz\n";
        let got: Vec<(String, String)> = parse_proc_route(v4)
            .into_iter()
            .map(|r| (r.net.to_string(), r.device))
            .collect();
        assert_eq!(
            got,
            [
                ("172.17.0.0/16".to_owned(), "docker0".to_owned()),
                ("192.0.2.0/24".into(), "eth0".into()),
                ("192.168.1.1/32".into(), "wg0".into()),
                ("0.0.0.0/1".into(), "tun0".into()),
            ]
        );
        let v6 = "\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000002 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0
00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo
fd000000000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000003 00000000 80200001     eth0
ff000000000000000000000000000000 08 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000003 00000000 00000001     eth0
20010db8000100000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth1
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
";
        let got: Vec<(String, String)> = parse_proc_ipv6_route(v6)
            .into_iter()
            .map(|r| (r.net.to_string(), r.device))
            .collect();
        assert_eq!(
            got,
            [
                ("fd00::/64".to_owned(), "eth0".to_owned()),
                ("fe80::/64".into(), "eth0".into()),
                ("2001:db8:1::/64".into(), "eth1".into()),
            ]
        );
    }
}
