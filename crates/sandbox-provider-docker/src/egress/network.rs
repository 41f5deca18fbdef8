//! The Docker network of one (namespace, policy) pair: every name derived from the pair, its
//! creation with inter-container traffic off and an explicit bridge name, and the checks that
//! refuse a same-named network that is not ours.

use std::collections::{HashMap, HashSet};

use bollard::errors::Error as DockerError;
use bollard::models::{Ipam, IpamConfig, NetworkCreateRequest, NetworkInspect};
use sandbox_core::{Error, Operation, Provider};
use sandbox_iptables_listing::{bridge_name, forward_chain, input_chain, owner_comment};

use super::guard::EgressGuard;
use super::policy::EgressPolicy;

/// The label every adapter-owned network carries.
pub const LABEL_MANAGED: &str = "sandbox.managed";
/// The namespace that owns a network.
pub const LABEL_NAMESPACE: &str = "sandbox.namespace";
/// The policy a network enforces (`strict` or `private`).
pub const LABEL_EGRESS: &str = "sandbox.egress";

const OPT_BRIDGE_NAME: &str = "com.docker.network.bridge.name";
const OPT_ICC: &str = "com.docker.network.bridge.enable_icc";
const OPT_MASQUERADE: &str = "com.docker.network.bridge.enable_ip_masquerade";

const NAMESPACE_MAX: usize = 24;

/// The network sandboxes of one policy join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressNetwork {
    /// The Docker network name (`sbx-<namespace>-<strict|private>`).
    pub name: String,
    /// The bridge interface on the host (`sbx<8 hex>`).
    pub bridge: String,
    /// The IPv4 subnet Docker allocated, e.g. `172.18.0.0/16`.
    pub subnet: String,
    /// Whether the network has IPv6 (only when the daemon already has it).
    pub ipv6: bool,
}

/// Everything one (namespace, policy) pair owns, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressNames {
    /// `sbx-<namespace>-<strict|private>`.
    pub network: String,
    /// `sbx<8 hex>`: at most 15 characters, the kernel's limit for interface names.
    pub bridge: String,
    /// `SBX-<8 hex>-FWD`, jumped to from `DOCKER-USER`.
    pub forward: String,
    /// `SBX-<8 hex>-IN`, jumped to from `INPUT`.
    pub input: String,
    /// `sbx:<namespace>:<policy>`, the comment on the jumps and on each chain's first rule, so
    /// `iptables -S` says who owns a rule.
    pub comment: String,
    hash: u32,
}

impl EgressNames {
    pub(super) fn new(namespace: &str, policy: EgressPolicy) -> Self {
        let label = policy.label();
        // A stable hash (not std's, whose output may change between releases): a rename
        // would orphan every chain on upgrade.
        let hash = fnv1a32(format!("{namespace}\n{label}").as_bytes());
        // The chain and bridge names come from the crate that also reads them back (the
        // orphan sweep here, the egress test's cleanup in xtask), so they cannot drift apart.
        EgressNames {
            network: format!("sbx-{namespace}-{label}"),
            bridge: bridge_name(hash),
            forward: forward_chain(hash),
            input: input_chain(hash),
            comment: owner_comment(namespace, label),
            hash,
        }
    }

    fn ipv6_subnet(&self) -> String {
        format!(
            "fd5b:{:04x}:{:04x}::/64",
            self.hash >> 16,
            self.hash & 0xffff
        )
    }
}

pub(super) fn validate_namespace(namespace: &str) -> Result<(), Error> {
    let ok = (1..=NAMESPACE_MAX).contains(&namespace.len())
        && namespace
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_request(
            Operation::VALIDATE,
            format!(
                "egress namespace {:?} must be 1-{NAMESPACE_MAX} characters of [a-z0-9-]",
                namespace.chars().take(40).collect::<String>()
            ),
        )
        .with_provider(Provider::Docker))
    }
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

pub(super) fn is_status(e: &DockerError, status: u16) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, .. } if *status_code == status)
}

/// Refuses a network that carries our name but not our settings: joining it would start a
/// sandbox without the isolation the caller asked for.
pub(super) fn check_ours(
    net: &NetworkInspect,
    names: &EgressNames,
    namespace: &str,
    policy: EgressPolicy,
) -> Result<(), String> {
    let label = |k: &str| {
        net.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    let option = |k: &str| {
        net.options
            .as_ref()
            .and_then(|o| o.get(k))
            .map(String::as_str)
    };
    let mut wrong = Vec::new();
    if net.driver.as_deref() != Some("bridge") {
        wrong.push(format!("driver {:?}", net.driver.as_deref().unwrap_or("")));
    }
    if label(LABEL_MANAGED) != Some("true")
        || label(LABEL_NAMESPACE) != Some(namespace)
        || label(LABEL_EGRESS) != Some(policy.label())
    {
        wrong.push(format!(
            "labels are not {LABEL_MANAGED}=true, {LABEL_NAMESPACE}={namespace}, {LABEL_EGRESS}={}",
            policy.label()
        ));
    }
    if option(OPT_BRIDGE_NAME) != Some(names.bridge.as_str()) {
        wrong.push(format!("bridge interface is not {}", names.bridge));
    }
    if option(OPT_ICC) != Some("false") {
        wrong.push("inter-container traffic is not disabled".to_owned());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "network {} exists but was not created by this adapter ({}); remove it",
            names.network,
            wrong.join("; ")
        ))
    }
}

/// Sandbox-to-sandbox traffic on one bridge is switched, not routed: iptables (Docker's
/// icc=false rule and our `-o <bridge>` drop) only sees it through br_netfilter. Docker turns
/// that on when it creates an icc=false network; if it is off, sandboxes of one network could
/// reach each other, so refuse rather than change a global sysctl ourselves.
pub(super) fn bridged_traffic_filtered(ipv6: bool) -> Result<(), String> {
    let families: &[&str] = if ipv6 {
        &["iptables", "ip6tables"]
    } else {
        &["iptables"]
    };
    for family in families {
        let path = format!("/proc/sys/net/bridge/bridge-nf-call-{family}");
        let value = std::fs::read_to_string(&path).unwrap_or_default();
        if value.trim() != "1" {
            return Err(format!(
                "{path} is {:?}, not 1 (br_netfilter not loaded?): traffic between sandboxes \
                 on one bridge would bypass {family}",
                value.trim()
            ));
        }
    }
    Ok(())
}

pub(super) fn describe_network(
    net: &NetworkInspect,
    names: &EgressNames,
) -> Result<EgressNetwork, String> {
    let subnet = net
        .ipam
        .as_ref()
        .and_then(|i| i.config.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.subnet.clone())
        .find(|s| !s.contains(':'))
        .ok_or_else(|| format!("network {} has no IPv4 subnet", names.network))?;
    Ok(EgressNetwork {
        name: names.network.clone(),
        bridge: names.bridge.clone(),
        subnet,
        ipv6: net.enable_ipv6.unwrap_or(false),
    })
}

impl EgressGuard {
    pub(super) async fn inspect(&self, name: &str) -> Result<Option<NetworkInspect>, String> {
        match self.docker.inspect_network(name, None).await {
            Ok(net) => Ok(Some(net)),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(format!("cannot inspect network {name}: {e}")),
        }
    }

    /// Whether the daemon runs IPv6 on its default bridge (`"ipv6": true`): only then do our
    /// networks get IPv6, so enabling this module never gives a sandbox a path the host did
    /// not already route.
    pub(super) async fn daemon_has_ipv6(&self) -> Result<bool, String> {
        Ok(self
            .inspect("bridge")
            .await?
            .and_then(|n| n.enable_ipv6)
            .unwrap_or(false))
    }

    pub(super) async fn create(
        &self,
        names: &EgressNames,
        policy: EgressPolicy,
        ipv6: bool,
    ) -> Result<NetworkInspect, String> {
        let request = NetworkCreateRequest {
            name: names.network.clone(),
            driver: Some("bridge".to_owned()),
            internal: Some(false),
            enable_ipv6: Some(ipv6),
            // IPv4 comes from the daemon's pools; IPv6 needs an explicit subnet on 20.10, and a
            // unique-local one derived from the hash keeps networks apart.
            ipam: ipv6.then(|| Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(names.ipv6_subnet()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            options: Some(HashMap::from([
                (OPT_BRIDGE_NAME.to_owned(), names.bridge.clone()),
                (OPT_ICC.to_owned(), "false".to_owned()),
                (OPT_MASQUERADE.to_owned(), "true".to_owned()),
            ])),
            labels: Some(HashMap::from([
                (LABEL_MANAGED.to_owned(), "true".to_owned()),
                (LABEL_NAMESPACE.to_owned(), self.namespace.clone()),
                (LABEL_EGRESS.to_owned(), policy.label().to_owned()),
            ])),
            ..Default::default()
        };
        let created = self.docker.create_network(request).await;
        // API 1.41 has no name uniqueness by default, but the explicit bridge name does it:
        // of racing creates, one wins and the others get "networks have same bridge name"
        // (verified on 20.10), after which they use the winner's network.
        let net = self.inspect(&names.network).await?;
        match (created, net) {
            (_, Some(net)) => {
                check_ours(&net, names, &self.namespace, policy)?;
                Ok(net)
            }
            (Err(e), None) => Err(format!("cannot create network {}: {e}", names.network)),
            (Ok(_), None) => Err(format!(
                "network {} vanished right after it was created",
                names.network
            )),
        }
    }

    /// Bridge interface names of every network on the engine, whoever owns it.
    pub(super) async fn live_bridges(&self) -> Result<HashSet<String>, String> {
        let nets = self
            .docker
            .list_networks(None)
            .await
            .map_err(|e| format!("cannot list networks: {e}"))?;
        Ok(nets
            .into_iter()
            .filter_map(|n| n.options?.remove(OPT_BRIDGE_NAME))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use sandbox_core::ErrorKind;
    use sandbox_iptables_listing::{bridge_of_chain, is_adapter_chain};

    use super::*;

    #[test]
    fn names_derive_from_namespace_and_policy() {
        let strict = EgressNames::new("team-a", EgressPolicy::STRICT);
        assert_eq!(strict.network, "sbx-team-a-strict");
        assert_eq!(strict.bridge, "sbx4bf24aa9");
        assert_eq!(strict.forward, "SBX-4bf24aa9-FWD");
        assert_eq!(strict.input, "SBX-4bf24aa9-IN");
        assert_eq!(strict.comment, "sbx:team-a:strict");
        let private = EgressNames::new("team-a", EgressPolicy::ALLOW_PRIVATE);
        assert_eq!(private.network, "sbx-team-a-private");
        assert_eq!(private.bridge, "sbx74676aaf");
        let longest = EgressNames::new(&"z".repeat(24), EgressPolicy::ALLOW_PRIVATE);
        assert!(longest.bridge.len() <= 15, "IFNAMSIZ");
        assert!(is_adapter_chain(&longest.forward) && is_adapter_chain(&longest.input));
        assert_eq!(bridge_of_chain(&strict.input), strict.bridge);
        assert_eq!(strict.ipv6_subnet(), "fd5b:4bf2:4aa9::/64");
    }

    #[test]
    fn namespace_is_validated() {
        for bad in ["", "Team", "a_b", "a b", "ä", &"a".repeat(25)] {
            let e = validate_namespace(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{bad:?}");
        }
        for good in ["a", "team-a", "0-9", &"a".repeat(24)] {
            validate_namespace(good).unwrap();
        }
    }
}
