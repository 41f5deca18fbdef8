//! Egress protection for bridge-mode sandboxes.
//!
//! Bridge-mode sandboxes never join `docker0`. They join a network this module creates per
//! (namespace, policy), with inter-container traffic disabled and an explicit bridge interface
//! name, and two chains of our own filter every packet that enters the host from that bridge:
//!
//! - `SBX-<hash>-FWD`, jumped to from `DOCKER-USER` (`-i <bridge>`): traffic the sandbox routes
//!   through the host. Established flows and DNS to the resolvers pass; link-local, reserved
//!   ranges, the sandbox's own bridge and every address of `sandbox_transport`'s metadata table
//!   (the one the SSRF guard refuses; a host route each where no dropped range covers it, and
//!   for IPv6 also each IPv4 entry's NAT64 form) are dropped whatever the policy; the strict
//!   policy also drops private ranges, CGNAT and every subnet the host is directly connected to
//!   (below).
//! - `SBX-<hash>-IN`, jumped to from `INPUT` (`-i <bridge>`): traffic addressed to the host
//!   itself. Established flows and DNS to the resolvers pass; everything else is dropped, so a
//!   sandbox cannot open connections to host services (published ports of other services
//!   included).
//!
//! The host's connected subnets: a host LAN with public addresses is still the host's LAN, and
//! no private range covers it, so the strict policy drops each subnet the kernel routes
//! straight onto a link ([`host_connected_routes`]: `/proc/net/route`, `/proc/net/ipv6_route`),
//! except the sandbox's own bridge (its `-o` rule covers it) and default-like routes through a
//! tunnel (shorter than /8, /16 for IPv6), which are the internet rather than a LAN. The DNS
//! exemptions come first, so a resolver on such a LAN keeps answering. Allow-private drops none
//! of them, by design: it is the setting for tenants that may reach the networks around the
//! host, it already opens a 10/8 LAN, and a LAN numbered from public space is no less the
//! host's; metadata and the host itself stay blocked. The set is read at every
//! [`EgressGuard::ensure`] (every bridge-mode create) and the strict chain converges to it: a
//! drop for a subnet that went away is deleted, one for a new subnet inserted; between two
//! creates a new LAN is not yet dropped.
//!
//! Our chains only ever `RETURN` or `DROP`: they can take traffic away, never permit something
//! Docker's or the host's own rules would refuse. "Accept established" therefore means "exempt
//! from our drops" and lets the rest of `FORWARD`/`INPUT` decide as it would without us.
//!
//! The only edits outside our chains are those two jumps, each matching only our bridge. Nothing
//! here flushes or restores another chain, changes a policy or a sysctl, or touches the daemon's
//! configuration, so a bug in this module cannot cut the host's own network.
//!
//! DNS, measured on Docker 20.10 (the engine of this workspace's CI): on a user-defined network
//! the container talks to Docker's embedded resolver at 127.0.0.11 inside its own namespace, but
//! dockerd forwards the query to the upstream server *from the container's namespace* (libnetwork
//! `resolver.go` dials through the sandbox's netns unless the upstream is a host loopback
//! address). The query therefore leaves through the bridge and crosses `FORWARD` with the
//! container's source address: with `nameserver 10.255.255.53` in the host's resolv.conf, the
//! counters of a chain jumped from `DOCKER-USER -i <bridge>` saw the udp/53 packets of a busybox
//! `nslookup`. With the strict chain installed, `nslookup` from a protected container got its
//! answer; with the two DNS exemptions deleted it printed "connection timed out; no servers
//! could be reached" while the 10/8 drop counted the queries. So both chains let udp/tcp 53
//! through to exactly the upstream resolvers dockerd uses (see [`host_resolvers`]). Loopback
//! upstreams (a systemd-resolved stub) are dialled from the host namespace and need no rule.
//!
//! The module must run on the Docker host itself (it runs `iptables` locally) and as root
//! (CAP_NET_ADMIN); where it cannot install its rules, [`EgressGuard::ensure`] fails closed with
//! [`ErrorCode::EgressProtectionUnavailable`](sandbox_core::ErrorCode::EgressProtectionUnavailable)
//! and bridge mode must not start the sandbox.
//!
//! Where things are: `policy.rs` says what is allowed and denied (the policies, the ranges
//! every policy drops, the private ranges the strict one adds, which connected subnets it
//! drops); `network.rs` creates and checks the Docker network and derives every name of a
//! (namespace, policy) pair; `rules.rs` builds the rules of each chain and the two jumps (pure);
//! `iptables.rs` runs `iptables`/`ip6tables` and words their failures; `repair.rs` installs a
//! rule set idempotently, repairing a partial or stale chain in order; `sweep.rs` removes a
//! namespace's networks and chains and sweeps orphaned chains; `guard.rs` is [`EgressGuard`],
//! which ties them together; `resolvers.rs` and `routes.rs` read the host's DNS upstreams and
//! connected subnets; `testing.rs` is the unit tests' in-memory iptables. The chain names and
//! the reader of `iptables -S` listings live in the `sandbox-iptables-listing` crate, shared
//! with xtask's cleanup of the egress test.

mod guard;
mod iptables;
mod network;
mod policy;
mod repair;
mod resolvers;
mod routes;
mod rules;
mod sweep;
#[cfg(test)]
mod testing;

pub use guard::EgressGuard;
pub use iptables::{CommandRunner, IpFamily, IptablesRunner, RunOutput};
pub use network::{EgressNames, EgressNetwork, LABEL_EGRESS, LABEL_MANAGED, LABEL_NAMESPACE};
pub use policy::EgressPolicy;
pub use resolvers::host_resolvers;
pub use routes::{ConnectedRoute, host_connected_routes};
