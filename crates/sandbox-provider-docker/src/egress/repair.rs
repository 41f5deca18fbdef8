//! Installing a rule set: the chains created and filled and the jumps added, each step checked
//! first, so a second run changes nothing and a partial or stale chain is repaired in order.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use sandbox_iptables_listing::tokens;

use super::iptables::{DOCKER_USER, FORWARD, IpFamily, Ipt, IptablesRunner, delete_listed};
use super::network::EgressNames;
use super::policy::EgressPolicy;
use super::routes::ConnectedRoute;
use super::rules::{forward_rules, input_rules, jumps};

/// The rules of one (namespace, policy) pair, ready to install.
pub(super) struct RuleSet<'a> {
    pub(super) runner: &'a dyn IptablesRunner,
    pub(super) names: &'a EgressNames,
    pub(super) policy: EgressPolicy,
    pub(super) resolvers: &'a [IpAddr],
    pub(super) connected: &'a [ConnectedRoute],
}

impl RuleSet<'_> {
    /// Creates the chains, fills them, then adds the jumps: each step checked with `-C`/`-S`
    /// first, so a second run changes nothing.
    pub(super) async fn install(&self, family: IpFamily) -> Result<(), String> {
        let ipt = Ipt::new(self.runner, family);
        let program = family.program();
        // Also the capability probe: it is the first command, so "not found" and "not root"
        // surface here with their own messages.
        if !ipt.probe(&["-S", DOCKER_USER]).await? {
            return Err(format!(
                "{program} has no {DOCKER_USER} chain: dockerd must manage {program} \
                 (\"iptables\": true{}) for egress protection",
                if family == IpFamily::V6 {
                    ", \"ip6tables\": true"
                } else {
                    ""
                }
            ));
        }
        if !ipt.probe(&["-C", FORWARD, "-j", DOCKER_USER]).await? {
            return Err(format!(
                "{program} {FORWARD} does not jump to {DOCKER_USER}, so rules there would never run"
            ));
        }
        let chains = [
            (
                &self.names.forward,
                forward_rules(
                    family,
                    self.names,
                    self.policy,
                    self.resolvers,
                    self.connected,
                ),
            ),
            (
                &self.names.input,
                input_rules(family, self.names, self.resolvers),
            ),
        ];
        for (chain, rules) in &chains {
            self.fill_chain(&ipt, chain, rules).await?;
        }
        // Jumps last: until our chains are complete, nothing sends packets into them.
        for (builtin, spec) in jumps(self.names) {
            let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
            if !ipt.probe(&[&["-C", builtin][..], &spec].concat()).await? {
                // Position 1: ahead of Docker's final RETURN in DOCKER-USER and of any host
                // ACCEPT in INPUT that would otherwise let a sandbox reach host services.
                ipt.ok(&[&["-I", builtin][..], &spec].concat()).await?;
            }
        }
        Ok(())
    }

    async fn fill_chain(
        &self,
        ipt: &Ipt<'_>,
        chain: &str,
        rules: &[Vec<String>],
    ) -> Result<(), String> {
        // Stale rules go first, so that the chain holds only wanted rules in the wanted
        // order before anything is inserted: a position counted past a stale exemption could
        // otherwise put a drop ahead of an exemption that is still wanted.
        match ipt.listing(chain).await? {
            Some(listing) => prune_stale(ipt, chain, &listing, rules).await?,
            None => {
                let (full, out) = ipt.call(&["-N", chain]).await?;
                // Another process may have created it between our check and ours.
                if out.status != 0 && !out.stderr.contains("already exists") {
                    return Err(ipt.failure(&full, &out));
                }
            }
        }
        for (i, rule) in rules.iter().enumerate() {
            let spec: Vec<&str> = rule.iter().map(String::as_str).collect();
            if ipt.probe(&[&["-C", chain][..], &spec].concat()).await? {
                continue;
            }
            // Rules before `i` are all present and nothing stale is left, so position `i + 1`
            // exists and keeps the intended order (exemptions ahead of drops) even when
            // repairing a chain.
            let pos = (i + 1).to_string();
            ipt.ok(&[&["-I", chain, &pos][..], &spec].concat()).await?;
        }
        Ok(())
    }
}

/// Deletes the rules of a chain's listing that `wanted` no longer has: DNS exemptions for
/// resolvers the host stopped using, and destination drops for subnets the host is no longer
/// connected to. Addresses are compared as networks, not as text, because iptables prints some
/// of them its own way (`::ffff:0.0.0.0/96`). Every other rule derives from the chain's name
/// and never goes stale; a rule of a shape this module does not write is left alone.
async fn prune_stale(
    ipt: &Ipt<'_>,
    chain: &str,
    listing: &str,
    wanted: &[Vec<String>],
) -> Result<(), String> {
    let destination = |rule: &[String]| {
        rule.windows(2)
            .find(|w| w[0] == "-d")
            .and_then(|w| w[1].parse::<IpNet>().ok())
    };
    let is_dns = |rule: &[String]| rule.windows(2).any(|w| w[0] == "--dport" && w[1] == "53");
    let is_plain_drop = |rule: &[String]| {
        rule.len() == 4 && rule[0] == "-d" && rule[2] == "-j" && rule[3] == "DROP"
    };
    let wanted_dns: HashSet<IpNet> = wanted
        .iter()
        .filter(|r| is_dns(r))
        .filter_map(|r| destination(r))
        .collect();
    let wanted_drops: HashSet<IpNet> = wanted
        .iter()
        .filter(|r| is_plain_drop(r))
        .filter_map(|r| destination(r))
        .collect();
    for line in listing.lines() {
        let tokens = tokens(line);
        let [op, listed_chain, spec @ ..] = tokens.as_slice() else {
            continue;
        };
        if op != "-A" || listed_chain != chain {
            continue;
        }
        let Some(dst) = destination(spec) else {
            continue;
        };
        let stale = if is_dns(spec) {
            !wanted_dns.contains(&dst)
        } else {
            is_plain_drop(spec) && !wanted_drops.contains(&dst)
        };
        if stale {
            delete_listed(ipt, &tokens).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::testing::*;

    /// The exact commands of a first install on a Docker host, strict policy, IPv4.
    #[test]
    fn golden_strict_install() {
        let fake = FakeIptables::docker_host();
        install_strict_v4(&fake).unwrap();
        let est = "-m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment sbx:team-a:strict -j RETURN";
        let dns_udp = "-d 10.255.255.53/32 -p udp --dport 53 -j RETURN";
        let dns_tcp = "-d 10.255.255.53/32 -p tcp --dport 53 -j RETURN";
        let mut want = vec![
            "iptables -w -S DOCKER-USER".to_owned(),
            "iptables -w -C FORWARD -j DOCKER-USER".to_owned(),
            "iptables -w -S SBX-4bf24aa9-FWD".to_owned(),
            "iptables -w -N SBX-4bf24aa9-FWD".to_owned(),
        ];
        let fwd = [
            est,
            dns_udp,
            dns_tcp,
            "-o sbx4bf24aa9 -j DROP",
            "-d 169.254.0.0/16 -j DROP",
            "-d 0.0.0.0/8 -j DROP",
            "-d 127.0.0.0/8 -j DROP",
            "-d 224.0.0.0/4 -j DROP",
            "-d 240.0.0.0/4 -j DROP",
            "-d 100.100.100.200/32 -j DROP",
            "-d 168.63.129.16/32 -j DROP",
            "-d 192.0.0.192/32 -j DROP",
            "-d 10.0.0.0/8 -j DROP",
            "-d 172.16.0.0/12 -j DROP",
            "-d 192.168.0.0/16 -j DROP",
            "-d 100.64.0.0/10 -j DROP",
            "-d 198.18.0.0/15 -j DROP",
            "-d 192.0.0.0/24 -j DROP",
            // The public LAN of routes(); the private one, Docker's bridge, the sandbox's own
            // bridge and the VPN's half add nothing.
            "-d 203.0.113.0/24 -j DROP",
        ];
        for (i, rule) in fwd.iter().enumerate() {
            want.push(format!("iptables -w -C SBX-4bf24aa9-FWD {rule}"));
            want.push(format!("iptables -w -I SBX-4bf24aa9-FWD {} {rule}", i + 1));
        }
        want.push("iptables -w -S SBX-4bf24aa9-IN".into());
        want.push("iptables -w -N SBX-4bf24aa9-IN".into());
        for (i, rule) in [est, dns_udp, dns_tcp, "-j DROP"].iter().enumerate() {
            want.push(format!("iptables -w -C SBX-4bf24aa9-IN {rule}"));
            want.push(format!("iptables -w -I SBX-4bf24aa9-IN {} {rule}", i + 1));
        }
        for (builtin, chain) in [
            ("DOCKER-USER", "SBX-4bf24aa9-FWD"),
            ("INPUT", "SBX-4bf24aa9-IN"),
        ] {
            let jump = format!("-i sbx4bf24aa9 -m comment --comment sbx:team-a:strict -j {chain}");
            want.push(format!("iptables -w -C {builtin} {jump}"));
            want.push(format!("iptables -w -I {builtin} {jump}"));
        }
        assert_eq!(fake.calls(), want);

        // The jumps sit first, ahead of Docker's RETURN and the host's own ACCEPT.
        let t = fake.table(IpFamily::V4);
        assert_eq!(
            t["DOCKER-USER"],
            [
                "-i sbx4bf24aa9 -m comment --comment sbx:team-a:strict -j SBX-4bf24aa9-FWD",
                "-j RETURN"
            ]
        );
        assert_eq!(
            t["INPUT"],
            [
                "-i sbx4bf24aa9 -m comment --comment sbx:team-a:strict -j SBX-4bf24aa9-IN",
                "-p tcp --dport 22 -j ACCEPT"
            ]
        );
        assert_eq!(
            t["FORWARD"],
            ["-j DOCKER-USER", "-j DOCKER-ISOLATION-STAGE-1"]
        );
        assert_eq!(t["SBX-4bf24aa9-FWD"], fwd);
        assert_eq!(
            metadata_not_dropped(&fwd, IpFamily::V4),
            Vec::<IpAddr>::new()
        );
    }

    #[test]
    fn second_install_adds_nothing() {
        let fake = FakeIptables::docker_host();
        install_strict_v4(&fake).unwrap();
        let before = fake.table(IpFamily::V4);
        fake.calls();
        install_strict_v4(&fake).unwrap();
        let calls = fake.calls();
        assert_eq!(mutating(&calls), Vec::<String>::new());
        assert!(
            calls
                .iter()
                .all(|c| c.starts_with("iptables -w -C ") || c.starts_with("iptables -w -S "))
        );
        assert_eq!(fake.table(IpFamily::V4), before);
    }

    #[test]
    fn a_partial_chain_is_repaired_in_order() {
        let fake = FakeIptables::docker_host();
        install_strict_v4(&fake).unwrap();
        let want = fake.table(IpFamily::V4);
        {
            let mut s = fake.lock();
            let t = s.tables.get_mut(&IpFamily::V4).unwrap();
            t.get_mut("SBX-4bf24aa9-FWD").unwrap().drain(1..4);
            t.get_mut("DOCKER-USER").unwrap().remove(0);
        }
        install_strict_v4(&fake).unwrap();
        assert_eq!(fake.table(IpFamily::V4), want);
    }

    #[test]
    fn stale_resolvers_are_pruned() {
        let fake = FakeIptables::docker_host();
        let rt = rt();
        install_strict_v4(&fake).unwrap();
        let new: Vec<IpAddr> = vec!["192.168.1.1".parse().unwrap()];
        rt.block_on(install(&fake, IpFamily::V4, EgressPolicy::STRICT, &new))
            .unwrap();
        let t = fake.table(IpFamily::V4);
        for chain in ["SBX-4bf24aa9-FWD", "SBX-4bf24aa9-IN"] {
            assert!(
                !t[chain].iter().any(|r| r.contains("10.255.255.53")),
                "{chain}"
            );
            assert_eq!(
                t[chain]
                    .iter()
                    .filter(|r| r.contains("192.168.1.1/32"))
                    .count(),
                2
            );
        }
    }

    /// A repair while a resolver went away (its stale exemptions still ahead of the wanted
    /// ones) puts the missing drop after every exemption that stays.
    #[test]
    fn a_repair_after_a_resolver_change_keeps_exemptions_first() {
        let fake = FakeIptables::docker_host();
        let rt = rt();
        let two: Vec<IpAddr> = vec![
            "10.255.255.53".parse().unwrap(),
            "192.168.1.1".parse().unwrap(),
        ];
        rt.block_on(install(&fake, IpFamily::V4, EgressPolicy::STRICT, &two))
            .unwrap();
        fake.lock()
            .tables
            .get_mut(&IpFamily::V4)
            .unwrap()
            .get_mut("SBX-4bf24aa9-FWD")
            .unwrap()
            .retain(|r| r != "-o sbx4bf24aa9 -j DROP");
        let one: Vec<IpAddr> = vec!["192.168.1.1".parse().unwrap()];
        rt.block_on(install(&fake, IpFamily::V4, EgressPolicy::STRICT, &one))
            .unwrap();
        let got = verdicts(&fake, IpFamily::V4, "SBX-4bf24aa9-FWD");
        assert!(
            exemptions_first(&got),
            "{:?}",
            fake.table(IpFamily::V4)["SBX-4bf24aa9-FWD"]
        );
        // And it is exactly what a first install with the new resolver gives.
        let fresh = FakeIptables::docker_host();
        rt.block_on(install(&fresh, IpFamily::V4, EgressPolicy::STRICT, &one))
            .unwrap();
        assert_eq!(fake.table(IpFamily::V4), fresh.table(IpFamily::V4));
    }

    /// A changed set of connected subnets converges: a drop for a subnet that went away is
    /// deleted, one for a new subnet inserted, and the chain is then exactly what a first
    /// install with the new set gives.
    #[test]
    fn changed_connected_subnets_converge() {
        let lan = |net: &str, dev: &str| ConnectedRoute::new(net.parse().unwrap(), dev);
        let before = [
            lan("203.0.113.0/24", "eth1"),
            lan("2001:db8:1::/64", "eth1"),
        ];
        let after = [lan("192.0.2.0/24", "eth3"), lan("2001:db8:3::/64", "eth3")];
        let rt = rt();
        for family in [IpFamily::V4, IpFamily::V6] {
            let fake = FakeIptables::docker_host();
            let install = |connected: &[ConnectedRoute]| {
                rt.block_on(install_with(
                    &fake,
                    family,
                    EgressPolicy::STRICT,
                    &resolvers(),
                    connected,
                ))
                .unwrap()
            };
            install(&before);
            fake.calls();
            install(&after);
            let changes = mutating(&fake.calls());
            let fresh = FakeIptables::docker_host();
            rt.block_on(install_with(
                &fresh,
                family,
                EgressPolicy::STRICT,
                &resolvers(),
                &after,
            ))
            .unwrap();
            assert_eq!(fake.table(family), fresh.table(family), "{family:?}");
            let (gone, new, pos) = match family {
                IpFamily::V4 => ("203.0.113.0/24", "192.0.2.0/24", 19),
                IpFamily::V6 => ("2001:db8:1::/64", "2001:db8:3::/64", 24),
            };
            let program = family.program();
            assert_eq!(
                changes,
                [
                    format!("{program} -w -D SBX-4bf24aa9-FWD -d {gone} -j DROP"),
                    format!("{program} -w -I SBX-4bf24aa9-FWD {pos} -d {new} -j DROP"),
                ]
            );
            // No connected subnet left: no connected drop left.
            install(&[]);
            let fwd = &fake.table(family)["SBX-4bf24aa9-FWD"];
            assert!(!fwd.iter().any(|r| r.contains(new)), "{fwd:?}");
        }
    }

    #[test]
    fn refuses_when_forward_skips_docker_user() {
        let fake = FakeIptables::docker_host();
        fake.lock()
            .tables
            .get_mut(&IpFamily::V4)
            .unwrap()
            .get_mut("FORWARD")
            .unwrap()
            .remove(0);
        let message = install_strict_v4(&fake).unwrap_err();
        assert!(
            message.contains("does not jump to DOCKER-USER"),
            "{message}"
        );
    }
}
