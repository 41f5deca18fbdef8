//! The rules of each chain and the two jumps, built from the names, the policy, the resolvers
//! and the connected subnets (pure: nothing runs here).

use std::net::IpAddr;

use ipnet::IpNet;

use super::iptables::{DOCKER_USER, INPUT, IpFamily};
use super::network::EgressNames;
use super::policy::{EgressPolicy, PRIVATE_V4, PRIVATE_V6, always_dropped, connected_drops};
use super::routes::ConnectedRoute;

pub(super) fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

/// The rules of one chain, in order: each is the rule specification after the chain name.
pub(super) fn forward_rules(
    family: IpFamily,
    names: &EgressNames,
    policy: EgressPolicy,
    resolvers: &[IpAddr],
    connected: &[ConnectedRoute],
) -> Vec<Vec<String>> {
    let mut rules = vec![established(names)];
    rules.extend(dns_rules(family, resolvers));
    // Sandbox to sandbox on the same bridge: Docker's icc=false rule already drops it; ours
    // keeps it dropped for an allow-private network even if that rule goes missing.
    rules.push(strings(&["-o", &names.bridge, "-j", "DROP"]));
    let mut dropped = always_dropped(family);
    if !policy.allow_private {
        dropped.extend_from_slice(match family {
            IpFamily::V4 => PRIVATE_V4,
            IpFamily::V6 => PRIVATE_V6,
        });
        let lans = connected_drops(family, names, connected, &dropped);
        dropped.extend(lans);
    }
    rules.extend(dropped.iter().map(drop_rule));
    rules
}

fn drop_rule(net: &IpNet) -> Vec<String> {
    strings(&["-d", &net.to_string(), "-j", "DROP"])
}

pub(super) fn input_rules(
    family: IpFamily,
    names: &EgressNames,
    resolvers: &[IpAddr],
) -> Vec<Vec<String>> {
    let mut rules = vec![established(names)];
    // A resolver may be the host itself (dnsmasq on a LAN address).
    rules.extend(dns_rules(family, resolvers));
    rules.push(strings(&["-j", "DROP"]));
    rules
}

pub(super) fn established(names: &EgressNames) -> Vec<String> {
    strings(&[
        "-m",
        "conntrack",
        "--ctstate",
        "RELATED,ESTABLISHED",
        "-m",
        "comment",
        "--comment",
        &names.comment,
        "-j",
        "RETURN",
    ])
}

pub(super) fn dns_rules(family: IpFamily, resolvers: &[IpAddr]) -> Vec<Vec<String>> {
    let mut rules = Vec::new();
    // Loopback upstreams are dialled from the host namespace, so no packet from the bridge
    // goes to them; a rule for them would only widen the hole.
    for ip in resolvers
        .iter()
        .filter(|ip| family.matches(ip) && !ip.is_loopback() && !ip.is_unspecified())
    {
        let dst = format!("{ip}/{}", family.host_prefix());
        for proto in ["udp", "tcp"] {
            rules.push(strings(&[
                "-d", &dst, "-p", proto, "--dport", "53", "-j", "RETURN",
            ]));
        }
    }
    rules
}

/// `(built-in chain, rule spec)` of the two jumps.
pub(super) fn jumps(names: &EgressNames) -> [(&'static str, Vec<String>); 2] {
    let jump = |target: &str| {
        strings(&[
            "-i",
            &names.bridge,
            "-m",
            "comment",
            "--comment",
            &names.comment,
            "-j",
            target,
        ])
    };
    [
        (DOCKER_USER, jump(&names.forward)),
        (INPUT, jump(&names.input)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::testing::*;

    /// Allow-private keeps every metadata and reserved drop and loses exactly the private ones.
    #[test]
    fn golden_allow_private_rules() {
        let names = EgressNames::new("team-a", EgressPolicy::ALLOW_PRIVATE);
        let got: Vec<String> = forward_rules(
            IpFamily::V4,
            &names,
            EgressPolicy::ALLOW_PRIVATE,
            &resolvers(),
            &routes(),
        )
        .iter()
        .map(|r| r.join(" "))
        .collect();
        assert_eq!(
            got,
            [
                "-m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment sbx:team-a:private -j RETURN",
                "-d 10.255.255.53/32 -p udp --dport 53 -j RETURN",
                "-d 10.255.255.53/32 -p tcp --dport 53 -j RETURN",
                "-o sbx74676aaf -j DROP",
                "-d 169.254.0.0/16 -j DROP",
                "-d 0.0.0.0/8 -j DROP",
                "-d 127.0.0.0/8 -j DROP",
                "-d 224.0.0.0/4 -j DROP",
                "-d 240.0.0.0/4 -j DROP",
                "-d 100.100.100.200/32 -j DROP",
                "-d 168.63.129.16/32 -j DROP",
                "-d 192.0.0.192/32 -j DROP",
            ]
        );
        assert_eq!(
            metadata_not_dropped(&got, IpFamily::V4),
            Vec::<IpAddr>::new()
        );
        let input: Vec<String> = input_rules(IpFamily::V4, &names, &resolvers())
            .iter()
            .map(|r| r.join(" "))
            .collect();
        assert_eq!(input.last().map(String::as_str), Some("-j DROP"));
    }

    #[test]
    fn golden_ipv6_rules() {
        let names = EgressNames::new("team-a", EgressPolicy::STRICT);
        let strict: Vec<String> = forward_rules(
            IpFamily::V6,
            &names,
            EgressPolicy::STRICT,
            &resolvers(),
            &routes(),
        )
        .iter()
        .map(|r| r.join(" "))
        .collect();
        assert_eq!(
            strict,
            [
                "-m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment sbx:team-a:strict -j RETURN",
                "-d 2001:db8::53/128 -p udp --dport 53 -j RETURN",
                "-d 2001:db8::53/128 -p tcp --dport 53 -j RETURN",
                "-o sbx4bf24aa9 -j DROP",
                "-d 64:ff9b::a9fe:0/112 -j DROP",
                "-d fe80::/10 -j DROP",
                "-d ::1/128 -j DROP",
                "-d ::/128 -j DROP",
                "-d ff00::/8 -j DROP",
                "-d ::ffff:0.0.0.0/96 -j DROP",
                "-d fd00:ec2::254/128 -j DROP",
                "-d fd00:ec2::23/128 -j DROP",
                "-d fd20:ce::254/128 -j DROP",
                "-d fd00:42::42/128 -j DROP",
                "-d fd00:a9fe:a9fe::1/128 -j DROP",
                "-d fd00:100::100:200/128 -j DROP",
                "-d 64:ff9b::6464:64c8/128 -j DROP",
                "-d 64:ff9b::a83f:8110/128 -j DROP",
                "-d 64:ff9b::c000:c0/128 -j DROP",
                "-d fc00::/7 -j DROP",
                "-d fec0::/10 -j DROP",
                "-d 100::/64 -j DROP",
                "-d 64:ff9b:1::/48 -j DROP",
                "-d 2001:db8:1::/64 -j DROP",
            ]
        );
        assert_eq!(
            metadata_not_dropped(&strict, IpFamily::V6),
            Vec::<IpAddr>::new()
        );
        let private: Vec<String> = forward_rules(
            IpFamily::V6,
            &EgressNames::new("team-a", EgressPolicy::ALLOW_PRIVATE),
            EgressPolicy::ALLOW_PRIVATE,
            &resolvers(),
            &routes(),
        )
        .iter()
        .map(|r| r.join(" "))
        .collect();
        // Allow-private loses exactly the private ranges and the connected subnet; every
        // metadata drop stays.
        let private_only = [
            "fc00::/7",
            "fec0::/10",
            "100::/64",
            "64:ff9b:1::/48",
            "2001:db8:1::/64",
        ]
        .map(|net| format!("-d {net} -j DROP"));
        assert_eq!(
            private[4..],
            strict[4..]
                .iter()
                .filter(|r| !private_only.contains(r))
                .cloned()
                .collect::<Vec<_>>()
        );
        assert_eq!(
            metadata_not_dropped(&private, IpFamily::V6),
            Vec::<IpAddr>::new()
        );
    }

    /// Exemptions come before any drop, in every chain, so a drop can never be bypassed by
    /// a later rule and an exemption never widens beyond DNS and established flows.
    #[test]
    fn only_return_or_drop_and_exemptions_first() {
        for family in [IpFamily::V4, IpFamily::V6] {
            for policy in EgressPolicy::BOTH {
                let names = EgressNames::new("n", policy);
                for rules in [
                    forward_rules(family, &names, policy, &resolvers(), &routes()),
                    input_rules(family, &names, &resolvers()),
                ] {
                    let verdicts: Vec<&str> =
                        rules.iter().map(|r| r.last().unwrap().as_str()).collect();
                    let first_drop = verdicts.iter().position(|v| *v == "DROP").unwrap();
                    assert!(verdicts[..first_drop].iter().all(|v| *v == "RETURN"));
                    assert!(verdicts[first_drop..].iter().all(|v| *v == "DROP"));
                }
            }
        }
    }
}
