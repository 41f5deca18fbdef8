//! Removal: exactly one namespace's networks, jumps and chains, and the start-up sweep of
//! orphaned chains whose network is gone, whoever created them.

use std::collections::{BTreeSet, HashMap, HashSet};

use sandbox_core::{Error, Operation, Provider};
use sandbox_iptables_listing::{bridge_of_chain, declared_adapter_chains, jumps_to};

use super::guard::EgressGuard;
use super::iptables::{DOCKER_USER, INPUT, IpFamily, Ipt, delete_listed};
use super::network::{check_ours, is_status};
use super::policy::EgressPolicy;

const OP_REMOVE: Operation = Operation::new("remove_egress");
const OP_ORPHANS: Operation = Operation::new("remove_egress_orphans");

impl EgressGuard {
    /// Removes exactly this namespace's networks, jumps and chains.
    ///
    /// Containers must already be gone: if any is still attached to one of the networks,
    /// nothing is removed (the rules protect it) and the error (kind `conflict`) names them.
    pub async fn remove(&self) -> Result<(), Error> {
        let _serial = self.serial.lock().await;
        let fail = |message: String| Error::unavailable(OP_REMOVE, message);
        let mut ours = Vec::new();
        let mut busy = Vec::new();
        for policy in EgressPolicy::BOTH {
            let names = self.names(policy);
            let Some(net) = self.inspect(&names.network).await.map_err(fail)? else {
                continue;
            };
            // A same-named network somebody else created is not ours to delete.
            if check_ours(&net, &names, &self.namespace, policy).is_err() {
                continue;
            }
            let attached = net.containers.as_ref().map_or(0, HashMap::len);
            if attached > 0 {
                busy.push(format!("{} ({attached} container(s))", names.network));
            }
            ours.push(names);
        }
        if !busy.is_empty() {
            return Err(Error::conflict(
                OP_REMOVE,
                format!(
                    "containers are still attached to {}; remove them first (nothing was removed)",
                    busy.join(", ")
                ),
            )
            .with_provider(Provider::Docker));
        }
        // Networks first: once the bridge is gone, removing its rules exposes nothing.
        for names in &ours {
            match self.docker.remove_network(&names.network).await {
                Ok(()) => {}
                Err(e) if is_status(&e, 404) => {}
                Err(e) => {
                    return Err(fail(format!(
                        "cannot remove network {}: {e}",
                        names.network
                    )));
                }
            }
        }
        for policy in EgressPolicy::BOTH {
            let names = self.names(policy);
            for family in [IpFamily::V4, IpFamily::V6] {
                let ipt = Ipt::new(self.runner.as_ref(), family);
                // A host without ip6tables has no IPv6 chains to remove.
                if family == IpFamily::V6 && !ipt.installed().await {
                    continue;
                }
                for chain in [&names.forward, &names.input] {
                    remove_chain(&ipt, chain, &[DOCKER_USER, INPUT])
                        .await
                        .map_err(fail)?;
                }
            }
        }
        Ok(())
    }

    /// Start-up hygiene: removes `SBX-*` chains (and their jumps) whose Docker network no
    /// longer exists, whatever namespace created them. Returns how many chains were removed
    /// (IPv4 and IPv6 counted separately).
    pub async fn remove_orphans(&self) -> Result<usize, Error> {
        let _serial = self.serial.lock().await;
        let fail = |message: String| Error::unavailable(OP_ORPHANS, message);
        let mut removed = 0;
        for family in [IpFamily::V4, IpFamily::V6] {
            let ipt = Ipt::new(self.runner.as_ref(), family);
            if family == IpFamily::V6 && !ipt.installed().await {
                continue;
            }
            let live = self.live_bridges().await.map_err(fail)?;
            let listing = ipt.ok(&["-S"]).await.map_err(fail)?.stdout;
            let candidates = orphan_chains(&listing, &live);
            if candidates.is_empty() {
                continue;
            }
            // Read the networks again right before deleting: another process's ensure installs
            // its chains before it creates its network, and must keep them.
            let live = self.live_bridges().await.map_err(fail)?;
            for chain in candidates {
                if live.contains(&bridge_of_chain(&chain)) {
                    continue;
                }
                let refs = jumps_to(&listing, &chain);
                delete_chain(&ipt, &chain, &refs).await.map_err(fail)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// Removes `chain` and every jump to it from `parents`, if the chain exists.
pub(super) async fn remove_chain(
    ipt: &Ipt<'_>,
    chain: &str,
    parents: &[&str],
) -> Result<bool, String> {
    if !ipt.probe(&["-S", chain]).await? {
        return Ok(false);
    }
    let mut refs = Vec::new();
    for parent in parents {
        let listing = ipt.ok(&["-S", parent]).await?.stdout;
        refs.extend(jumps_to(&listing, chain));
    }
    delete_chain(ipt, chain, &refs).await?;
    Ok(true)
}

/// Deletes the listed jumps, then flushes and deletes `chain` (ours: the only chain this
/// module ever flushes).
async fn delete_chain(ipt: &Ipt<'_>, chain: &str, refs: &[Vec<String>]) -> Result<(), String> {
    for r in refs {
        delete_listed(ipt, r).await?;
    }
    ipt.ok(&["-F", chain]).await?;
    ipt.ok(&["-X", chain]).await?;
    Ok(())
}

/// `SBX-<8 hex>-FWD|IN` chains of a full `-S` listing whose bridge is not in `live`.
fn orphan_chains(listing: &str, live: &HashSet<String>) -> BTreeSet<String> {
    declared_adapter_chains(listing)
        .filter(|c| !live.contains(&bridge_of_chain(c)))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::testing::*;

    #[test]
    fn removal_touches_only_our_jumps_and_chains() {
        let fake = FakeIptables::docker_host();
        let rt = rt();
        let pristine = fake.table(IpFamily::V4);
        rt.block_on(install(
            &fake,
            IpFamily::V4,
            EgressPolicy::ALLOW_PRIVATE,
            &resolvers(),
        ))
        .unwrap();
        let with_private = fake.table(IpFamily::V4);
        install_strict_v4(&fake).unwrap();
        // A duplicate jump (two processes installing at once) goes too.
        fake.lock()
            .tables
            .get_mut(&IpFamily::V4)
            .unwrap()
            .get_mut("DOCKER-USER")
            .unwrap()
            .insert(
                0,
                "-i sbx4bf24aa9 -m comment --comment sbx:team-a:strict -j SBX-4bf24aa9-FWD".into(),
            );
        fake.calls();
        rt.block_on(remove(&fake, IpFamily::V4, EgressPolicy::STRICT));
        let changes = mutating(&fake.calls());
        assert_eq!(
            changes,
            [
                "iptables -w -D DOCKER-USER -i sbx4bf24aa9 -m comment --comment sbx:team-a:strict -j SBX-4bf24aa9-FWD",
                "iptables -w -D DOCKER-USER -i sbx4bf24aa9 -m comment --comment sbx:team-a:strict -j SBX-4bf24aa9-FWD",
                "iptables -w -F SBX-4bf24aa9-FWD",
                "iptables -w -X SBX-4bf24aa9-FWD",
                "iptables -w -D INPUT -i sbx4bf24aa9 -m comment --comment sbx:team-a:strict -j SBX-4bf24aa9-IN",
                "iptables -w -F SBX-4bf24aa9-IN",
                "iptables -w -X SBX-4bf24aa9-IN",
            ]
        );
        assert_eq!(fake.table(IpFamily::V4), with_private);
        rt.block_on(remove(&fake, IpFamily::V4, EgressPolicy::ALLOW_PRIVATE));
        assert_eq!(fake.table(IpFamily::V4), pristine);
        // Removing again is a no-op that only looks.
        fake.calls();
        rt.block_on(remove(&fake, IpFamily::V4, EgressPolicy::STRICT));
        assert_eq!(mutating(&fake.calls()), Vec::<String>::new());
    }

    #[test]
    fn orphans_are_our_chains_without_a_bridge() {
        let listing = "-P INPUT ACCEPT\n-N DOCKER\n-N SBX-4bf24aa9-FWD\n-N SBX-4bf24aa9-IN\n\
                       -N SBX-74676aaf-FWD\n-N SBX-74676aaf-IN\n-N SBX-nothex00-FWD\n-N SBX-0123-IN\n\
                       -A INPUT -i sbx74676aaf -m comment --comment \"sbx:team-a:private\" -j SBX-74676aaf-IN\n\
                       -A SBX-74676aaf-IN -j DROP\n";
        let live = HashSet::from(["sbx4bf24aa9".to_owned(), "docker0".to_owned()]);
        let orphans: Vec<String> = orphan_chains(listing, &live).into_iter().collect();
        assert_eq!(orphans, ["SBX-74676aaf-FWD", "SBX-74676aaf-IN"]);
        // Every bridge live: nothing is an orphan.
        let all = HashSet::from(["sbx4bf24aa9".to_owned(), "sbx74676aaf".to_owned()]);
        assert!(orphan_chains(listing, &all).is_empty());
    }
}
