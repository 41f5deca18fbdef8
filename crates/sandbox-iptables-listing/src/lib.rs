//! The Docker adapter's iptables chain names, and the one reader of `iptables -S` listings.
//!
//! The adapter's egress protection (`sandbox-provider-docker`, `src/egress/`) names every chain,
//! bridge and owner comment it writes with the functions here, and reads listings back with the
//! functions here when it repairs a chain, removes a namespace or sweeps orphans. xtask's cleanup
//! of the egress test (`xtask/src/netclean.rs`) finds and removes the test's leftover chains with
//! the same functions. The writer and both readers therefore cannot disagree about what an
//! adapter chain looks like; two hand-kept copies of this reader once did (one took upper-case
//! hex in a chain's hash, which the adapter never writes, so the cleanup would have removed a
//! chain that is not the adapter's).
//!
//! Why a crate of its own, and not a module of the adapter: xtask must stay a light build
//! (serde and serde_json; no bollard, tokio or anything else the adapter links), and a crate
//! makes the sharing an edge that `cargo metadata` shows and the tidy edge table
//! (`xtask/src/tidy.rs`, `WORKSPACE_EDGES`) polices, where including an adapter file into xtask
//! by path would hide it. This crate has no dependencies and must keep none, since xtask builds
//! it on every run; the tidy rule `shared-with-xtask` fails on any normal dependency.
//!
//! What it reads is the `-S` form (`iptables-save` rules without the table header): `-P` policy
//! lines, `-N <chain>` declarations and `-A <chain> <spec>` rules. iptables-nft prints comments
//! in double quotes, iptables-legacy without them; [`tokens`] gives both the argument form.

/// Every adapter chain name starts with this; its bridge name starts with [`BRIDGE_PREFIX`].
pub const CHAIN_PREFIX: &str = "SBX-";
/// The bridge interface of an adapter network: `sbx` and the same 8 hex digits as its chains.
pub const BRIDGE_PREFIX: &str = "sbx";
/// Every owner comment (`sbx:<namespace>:<policy>`) starts with this.
pub const COMMENT_PREFIX: &str = "sbx:";

/// `SBX-<8 hex>-FWD`: the chain jumped to from `DOCKER-USER`.
pub fn forward_chain(hash: u32) -> String {
    format!("{CHAIN_PREFIX}{hash:08x}-FWD")
}

/// `SBX-<8 hex>-IN`: the chain jumped to from `INPUT`.
pub fn input_chain(hash: u32) -> String {
    format!("{CHAIN_PREFIX}{hash:08x}-IN")
}

/// `sbx<8 hex>`: at most 15 characters, the kernel's limit for interface names.
pub fn bridge_name(hash: u32) -> String {
    format!("{BRIDGE_PREFIX}{hash:08x}")
}

/// `sbx:<namespace>:<policy>`, the comment on the jumps and on each chain's first rule, so a
/// listing says who owns a rule. Namespaces have no spaces, so the comment never needs quoting.
pub fn owner_comment(namespace: &str, policy: &str) -> String {
    format!("{COMMENT_PREFIX}{namespace}:{policy}")
}

/// Whether `chain` is a name [`forward_chain`] or [`input_chain`] gives: exactly 8 lower-case
/// hex digits, as `{:08x}` prints them. An upper-case look-alike was made by someone else and
/// is neither swept nor cleaned up.
pub fn is_adapter_chain(chain: &str) -> bool {
    let Some((hash, kind)) = chain
        .strip_prefix(CHAIN_PREFIX)
        .and_then(|rest| rest.split_once('-'))
    else {
        return false;
    };
    hash.len() == 8
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && matches!(kind, "FWD" | "IN")
}

/// The bridge an adapter chain filters (`SBX-4bf24aa9-IN` → `sbx4bf24aa9`). Only meaningful
/// for a chain [`is_adapter_chain`] accepts.
pub fn bridge_of_chain(chain: &str) -> String {
    let start = CHAIN_PREFIX.len();
    format!(
        "{BRIDGE_PREFIX}{}",
        chain.get(start..start + 8).unwrap_or_default()
    )
}

/// Splits one listing line into arguments. Our comments contain no spaces; iptables-nft prints
/// them in double quotes, which the argument form must not carry (`-D` with the quotes would
/// name another comment).
pub fn tokens(line: &str) -> Vec<String> {
    line.split_whitespace()
        .map(|t| t.trim_matches('"').to_owned())
        .collect()
}

/// The `-N` declarations of a full `-S` listing that are adapter chains, in listing order.
pub fn declared_adapter_chains(listing: &str) -> impl Iterator<Item = &str> {
    listing
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .map(str::trim)
        .filter(|c| is_adapter_chain(c))
}

/// The rules of `listing` (as argument tokens, `-A` first) that jump to `chain` from another
/// chain: what must be deleted before `chain` can be.
pub fn jumps_to(listing: &str, chain: &str) -> Vec<Vec<String>> {
    listing
        .lines()
        .map(tokens)
        .filter(|t| {
            t.first().map(String::as_str) == Some("-A")
                && t.get(1).map(String::as_str) != Some(chain)
                && t.windows(2).any(|w| w[0] == "-j" && w[1] == chain)
        })
        .collect()
}

/// The adapter chains of `listing` with a rule whose owner comment names a namespace starting
/// with `namespace_prefix`, sorted and without repeats. Every chain the adapter fills starts with
/// such a rule, so an emptied chain is not found (nor is anything else's).
pub fn chains_owned_by(listing: &str, namespace_prefix: &str) -> Vec<String> {
    let owner = format!("{COMMENT_PREFIX}{namespace_prefix}");
    let mut chains: Vec<String> = listing
        .lines()
        .map(tokens)
        .filter(|t| t.first().map(String::as_str) == Some("-A"))
        .filter(|t| t.get(1).is_some_and(|c| is_adapter_chain(c)))
        .filter(|t| {
            t.windows(2)
                .any(|w| w[0] == "--comment" && w[1].starts_with(&owner))
        })
        .filter_map(|t| t.get(1).cloned())
        .collect();
    chains.sort();
    chains.dedup();
    chains
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full `iptables -S` of a Docker host: Docker's own chains as iptables-nft 1.8.9 prints
    /// them on this workspace's CI engine, two namespaces' adapter chains in the shapes the
    /// adapter writes (comments quoted as iptables-nft prints them, and unquoted as
    /// iptables-legacy does), and the look-alikes neither reader may take: an upper-case hash
    /// (the case the two old copies disagreed on), a hash that is not hex, one too short, and an
    /// unknown kind. Both users read it here: the adapter's orphan sweep and removal
    /// (declarations, jumps), xtask's cleanup (owned chains, jumps).
    const DOCKER_HOST: &str = include_str!("../fixtures/docker-host.rules");

    #[test]
    fn the_captured_listing_reads_the_same_for_the_adapter_and_the_cleanup() {
        // The adapter's sweep: every adapter chain declared, and only those.
        let declared: Vec<&str> = declared_adapter_chains(DOCKER_HOST).collect();
        assert_eq!(
            declared,
            [
                "SBX-4bf24aa9-FWD",
                "SBX-4bf24aa9-IN",
                "SBX-0a1b2c3d-FWD",
                "SBX-0a1b2c3d-IN",
            ]
        );
        let bridges: Vec<String> = declared.iter().map(|c| bridge_of_chain(c)).collect();
        assert_eq!(
            bridges,
            ["sbx4bf24aa9", "sbx4bf24aa9", "sbx0a1b2c3d", "sbx0a1b2c3d"]
        );

        // The cleanup: the test namespace's chains, found through their owner comment, quoted
        // (nft) or not (legacy); the upper-case look-alike with a test comment is not one.
        assert_eq!(
            chains_owned_by(DOCKER_HOST, "sbxt-"),
            ["SBX-0a1b2c3d-FWD", "SBX-0a1b2c3d-IN"]
        );
        assert_eq!(
            chains_owned_by(DOCKER_HOST, "team-a"),
            ["SBX-4bf24aa9-FWD", "SBX-4bf24aa9-IN"]
        );
        assert!(chains_owned_by(DOCKER_HOST, "prod").is_empty());

        // Both: the jumps to delete first, as arguments without iptables-nft's quotes, and
        // never a chain's own rules.
        let joined = |chain: &str| -> Vec<String> {
            jumps_to(DOCKER_HOST, chain)
                .iter()
                .map(|t| t.join(" "))
                .collect()
        };
        assert_eq!(
            joined("SBX-0a1b2c3d-FWD"),
            [
                "-A DOCKER-USER -i sbx0a1b2c3d -m comment --comment sbx:sbxt-abc123:strict -j SBX-0a1b2c3d-FWD"
            ]
        );
        assert_eq!(
            joined("SBX-0a1b2c3d-IN"),
            [
                "-A INPUT -i sbx0a1b2c3d -m comment --comment sbx:sbxt-abc123:strict -j SBX-0a1b2c3d-IN"
            ]
        );
        // A duplicate jump (two installs at once) is listed twice, so both get deleted.
        assert_eq!(
            joined("SBX-4bf24aa9-FWD"),
            [
                "-A DOCKER-USER -i sbx4bf24aa9 -m comment --comment sbx:team-a:strict -j SBX-4bf24aa9-FWD",
                "-A DOCKER-USER -i sbx4bf24aa9 -m comment --comment sbx:team-a:strict -j SBX-4bf24aa9-FWD",
            ]
        );
        assert_eq!(joined("DOCKER-USER"), ["-A FORWARD -j DOCKER-USER"]);
    }

    #[test]
    fn names_are_what_the_readers_accept() {
        for hash in [0, 0x4bf2_4aa9, 0x0a1b_2c3d, u32::MAX] {
            let (fwd, input, bridge) = (forward_chain(hash), input_chain(hash), bridge_name(hash));
            assert!(
                is_adapter_chain(&fwd) && is_adapter_chain(&input),
                "{fwd} {input}"
            );
            assert_eq!(bridge_of_chain(&fwd), bridge);
            assert_eq!(bridge_of_chain(&input), bridge);
            assert!(bridge.len() <= 15, "IFNAMSIZ: {bridge}");
            // Upper-case hex is never ours: only a hash of digits alone reads the same.
            let upper = fwd.to_uppercase();
            assert_eq!(is_adapter_chain(&upper), upper == fwd, "{upper}");
        }
        assert_eq!(forward_chain(0x4bf2_4aa9), "SBX-4bf24aa9-FWD");
        assert_eq!(input_chain(0x4bf2_4aa9), "SBX-4bf24aa9-IN");
        assert_eq!(bridge_name(0x4bf2_4aa9), "sbx4bf24aa9");
        assert_eq!(owner_comment("team-a", "strict"), "sbx:team-a:strict");
        for not_ours in [
            "SBX-4BF24AA9-FWD",
            "SBX-nothex00-FWD",
            "SBX-0123-IN",
            "SBX-4bf24aa9-OUT",
            "SBX-4bf24aa9",
            "DOCKER-USER",
        ] {
            assert!(!is_adapter_chain(not_ours), "{not_ours}");
        }
    }
}
