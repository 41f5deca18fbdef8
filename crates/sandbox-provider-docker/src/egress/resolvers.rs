//! The upstream DNS servers dockerd's embedded resolver forwards to, which both chains let
//! through (the module docs say why the queries cross our chains at all).

use std::collections::HashSet;
use std::net::IpAddr;

/// The upstream DNS servers dockerd's embedded resolver forwards to, as dockerd finds them:
/// `/etc/resolv.conf`, or systemd-resolved's upstream list when that file only names the
/// loopback stub, plus `dns` from `/etc/docker/daemon.json` (read, never written).
pub fn host_resolvers() -> Vec<IpAddr> {
    // Reads of a few hundred bytes of local files: not worth a blocking-pool hop.
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mut list = parse_resolv_conf(&read("/etc/resolv.conf"));
    if !list.is_empty() && list.iter().all(IpAddr::is_loopback) {
        let upstream = parse_resolv_conf(&read("/run/systemd/resolve/resolv.conf"));
        if !upstream.is_empty() {
            list = upstream;
        }
    }
    list.extend(parse_daemon_dns(&read("/etc/docker/daemon.json")));
    dedup(list)
}

fn parse_resolv_conf(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            // Zoned addresses (`fe80::1%eth0`) do not parse and are skipped: a link-local
            // upstream is unreachable from a container anyway.
            (words.next()? == "nameserver").then_some(())?;
            words.next()?.parse().ok()
        })
        .collect()
}

fn parse_daemon_dns(text: &str) -> Vec<IpAddr> {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("dns").and_then(|d| d.as_array()).cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.as_str()?.parse().ok())
        .collect()
}

fn dedup(list: Vec<IpAddr>) -> Vec<IpAddr> {
    let mut seen = HashSet::new();
    list.into_iter().filter(|ip| seen.insert(*ip)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::iptables::IpFamily;
    use crate::egress::network::EgressNames;
    use crate::egress::policy::EgressPolicy;
    use crate::egress::rules::{dns_rules, input_rules};

    #[test]
    fn resolvers_as_dockerd_reads_them() {
        let conf = "# comment\nsearch example\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\n\
                    nameserver 2001:db8::1\noptions ndots:0\nnameserver\n";
        assert_eq!(
            parse_resolv_conf(conf),
            [
                "10.255.255.53".parse::<IpAddr>().unwrap(),
                "2001:db8::1".parse().unwrap()
            ]
        );
        assert_eq!(
            parse_daemon_dns(r#"{"dns": ["9.9.9.9", "bogus"], "ipv6": false}"#),
            ["9.9.9.9".parse::<IpAddr>().unwrap()]
        );
        assert!(parse_daemon_dns("").is_empty());
        let names = EgressNames::new("n", EgressPolicy::STRICT);
        let loopback_only: Vec<IpAddr> = vec!["127.0.0.53".parse().unwrap()];
        assert!(dns_rules(IpFamily::V4, &loopback_only).is_empty());
        assert_eq!(input_rules(IpFamily::V4, &names, &loopback_only).len(), 2);
    }
}
