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
//! [`ErrorCode::EgressProtectionUnavailable`] and bridge mode must not start the sandbox.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{Ipam, IpamConfig, NetworkCreateRequest, NetworkInspect};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use sandbox_core::{Error, ErrorCode, Operation, Provider};
use sandbox_transport::metadata::{metadata_v4, metadata_v6};

/// The label every adapter-owned network carries.
pub const LABEL_MANAGED: &str = "sandbox.managed";
/// The namespace that owns a network.
pub const LABEL_NAMESPACE: &str = "sandbox.namespace";
/// The policy a network enforces (`strict` or `private`).
pub const LABEL_EGRESS: &str = "sandbox.egress";

const OPT_BRIDGE_NAME: &str = "com.docker.network.bridge.name";
const OPT_ICC: &str = "com.docker.network.bridge.enable_icc";
const OPT_MASQUERADE: &str = "com.docker.network.bridge.enable_ip_masquerade";

const DOCKER_USER: &str = "DOCKER-USER";
const INPUT: &str = "INPUT";
const FORWARD: &str = "FORWARD";

const OP_ENSURE: Operation = Operation::new("ensure_egress");
const OP_REMOVE: Operation = Operation::new("remove_egress");
const OP_ORPHANS: Operation = Operation::new("remove_egress_orphans");

const NAMESPACE_MAX: usize = 24;

/// A wedged iptables (a lock held by a hung process under the legacy backend) must fail a
/// create with a message instead of hanging it.
const IPTABLES_DEADLINE: Duration = Duration::from_secs(60);

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
const PRIVATE_V4: &[IpNet] = &[
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
const PRIVATE_V6: &[IpNet] = &[
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
fn always_dropped(family: IpFamily) -> Vec<IpNet> {
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

    const BOTH: [EgressPolicy; 2] = [EgressPolicy::STRICT, EgressPolicy::ALLOW_PRIVATE];

    /// The value of the `sandbox.egress` label and the network name's suffix.
    pub fn label(self) -> &'static str {
        if self.allow_private {
            "private"
        } else {
            "strict"
        }
    }
}

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

/// Which address family a rule belongs to, i.e. which program installs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// `iptables`.
    V4,
    /// `ip6tables`.
    V6,
}

impl IpFamily {
    /// The program that edits this family's rules.
    pub fn program(self) -> &'static str {
        match self {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        }
    }

    fn host_prefix(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }

    fn matches(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (IpFamily::V4, IpAddr::V4(_)) | (IpFamily::V6, IpAddr::V6(_))
        )
    }
}

/// How one iptables invocation ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunOutput {
    /// The exit status; `-1` when the process was killed by a signal.
    pub status: i32,
    /// Standard output (the listings of `-S`).
    pub stdout: String,
    /// Standard error (the reason of a failure).
    pub stderr: String,
}

impl RunOutput {
    /// A successful run printing `stdout`.
    pub fn ok(stdout: impl Into<String>) -> Self {
        RunOutput {
            status: 0,
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }
    /// A failed run with `status` and `stderr`.
    pub fn failed(status: i32, stderr: impl Into<String>) -> Self {
        RunOutput {
            status,
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }
}

/// Runs `iptables`/`ip6tables`. Injectable so rule generation is testable without root.
#[async_trait]
pub trait IptablesRunner: fmt::Debug + Send + Sync {
    /// Runs the family's program with `args` (which already include `-w`). An `Err` means the
    /// program could not be started at all (`NotFound` when it is not installed).
    async fn run(&self, family: IpFamily, args: &[String]) -> io::Result<RunOutput>;
}

/// The real runner: spawns the program found on `PATH`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommandRunner;

#[async_trait]
impl IptablesRunner for CommandRunner {
    async fn run(&self, family: IpFamily, args: &[String]) -> io::Result<RunOutput> {
        let mut cmd = tokio::process::Command::new(family.program());
        cmd.args(args)
            // Messages are matched (permission, missing chain) and end up in errors: keep them
            // in the untranslated form.
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(IPTABLES_DEADLINE, cmd.output())
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} did not finish within {}s",
                        family.program(),
                        IPTABLES_DEADLINE.as_secs()
                    ),
                )
            })??;
        Ok(RunOutput {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Installs, checks and removes the egress protection of one namespace on one Docker host.
///
/// Cheap to clone; clones share one lock, so concurrent calls through clones of one guard
/// install every rule exactly once.
#[derive(Debug, Clone)]
pub struct EgressGuard {
    docker: Docker,
    namespace: String,
    runner: Arc<dyn IptablesRunner>,
    /// Overrides the discovered upstream DNS servers (see [`host_resolvers`]).
    resolvers: Option<Vec<IpAddr>>,
    /// Overrides the discovered connected routes (see [`host_connected_routes`]).
    connected: Option<Vec<ConnectedRoute>>,
    serial: Arc<tokio::sync::Mutex<()>>,
}

impl EgressGuard {
    /// A guard for `namespace` (1–24 characters of `[a-z0-9-]`), running the real `iptables`.
    pub fn new(docker: Docker, namespace: &str) -> Result<Self, Error> {
        validate_namespace(namespace)?;
        Ok(EgressGuard {
            docker,
            namespace: namespace.to_owned(),
            runner: Arc::new(CommandRunner),
            resolvers: None,
            connected: None,
            serial: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// Replaces the iptables runner (tests, or a wrapper that logs every command).
    pub fn with_runner(mut self, runner: Arc<dyn IptablesRunner>) -> Self {
        self.runner = runner;
        self
    }

    /// Fixes the upstream DNS servers the rules let through instead of reading them from the
    /// host (needed when dockerd runs with `--dns` on its command line, which we cannot see).
    pub fn with_resolvers(mut self, resolvers: Vec<IpAddr>) -> Self {
        self.resolvers = Some(resolvers);
        self
    }

    /// Fixes the host's connected subnets the strict policy drops instead of reading them from
    /// the kernel (tests, or a host whose LANs are known better than its routing table says).
    pub fn with_connected_routes(mut self, routes: Vec<ConnectedRoute>) -> Self {
        self.connected = Some(routes);
        self
    }

    /// The namespace every name of this guard derives from.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The network, bridge and chain names of `policy` (pure; nothing is created).
    pub fn names(&self, policy: EgressPolicy) -> EgressNames {
        EgressNames::new(&self.namespace, policy)
    }

    /// Creates the network if missing, then (re)installs the chains and the two jumps, each
    /// exactly once. Returns the network to put containers on.
    ///
    /// Idempotent and safe to call concurrently. The rules go in before the network is
    /// created (the bridge name is known up front), so no packet from the bridge ever meets a
    /// host without them, and are checked again after creation, so an orphan sweep by another
    /// process that ran in between cannot leave the new network bare.
    ///
    /// Fails closed: kind `unavailable`, code [`ErrorCode::EgressProtectionUnavailable`], and a
    /// message naming the cause ("iptables not found", "permission denied: egress rules need
    /// root (CAP_NET_ADMIN)", iptables' own stderr, a network that is not ours, a routing table
    /// the strict policy cannot read).
    ///
    /// Cancel-safety: dropping the future can leave a network without containers and a
    /// partially filled chain; the next call completes both.
    pub async fn ensure(&self, policy: EgressPolicy) -> Result<EgressNetwork, Error> {
        let _serial = self.serial.lock().await;
        self.ensure_locked(policy).await.map_err(ensure_error)
    }

    async fn ensure_locked(&self, policy: EgressPolicy) -> Result<EgressNetwork, String> {
        let names = self.names(policy);
        let existing = self.inspect(&names.network).await?;
        let ipv6 = match &existing {
            Some(net) => {
                check_ours(net, &names, &self.namespace, policy)?;
                net.enable_ipv6.unwrap_or(false)
            }
            None => self.daemon_has_ipv6().await?,
        };
        let resolvers = self.resolvers();
        let connected = self.connected_routes(policy)?;
        let rules = RuleSet {
            runner: self.runner.as_ref(),
            names: &names,
            policy,
            resolvers: &resolvers,
            connected: &connected,
        };
        rules.install(IpFamily::V4).await?;
        if ipv6 {
            rules.install(IpFamily::V6).await?;
        }
        let net = match existing {
            Some(net) => net,
            None => {
                let net = self.create(&names, policy, ipv6).await?;
                let has_v6 = net.enable_ipv6.unwrap_or(false);
                rules.install(IpFamily::V4).await?;
                if has_v6 {
                    rules.install(IpFamily::V6).await?;
                }
                net
            }
        };
        bridged_traffic_filtered(net.enable_ipv6.unwrap_or(false))?;
        describe_network(&net, &names)
    }

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
                let refs = references(&listing, &chain);
                delete_chain(&ipt, &chain, &refs).await.map_err(fail)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The routes the strict policy drops; allow-private drops none, so it does not read them.
    fn connected_routes(&self, policy: EgressPolicy) -> Result<Vec<ConnectedRoute>, String> {
        if policy.allow_private {
            return Ok(Vec::new());
        }
        match &self.connected {
            Some(list) => Ok(list.clone()),
            None => host_connected_routes().map_err(|e| {
                format!("{e}: strict egress drops the host's connected subnets and must see them")
            }),
        }
    }

    fn resolvers(&self) -> Vec<IpAddr> {
        match &self.resolvers {
            Some(list) => list.clone(),
            None => host_resolvers(),
        }
    }

    async fn inspect(&self, name: &str) -> Result<Option<NetworkInspect>, String> {
        match self.docker.inspect_network(name, None).await {
            Ok(net) => Ok(Some(net)),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(format!("cannot inspect network {name}: {e}")),
        }
    }

    /// Whether the daemon runs IPv6 on its default bridge (`"ipv6": true`): only then do our
    /// networks get IPv6, so enabling this module never gives a sandbox a path the host did
    /// not already route.
    async fn daemon_has_ipv6(&self) -> Result<bool, String> {
        Ok(self
            .inspect("bridge")
            .await?
            .and_then(|n| n.enable_ipv6)
            .unwrap_or(false))
    }

    async fn create(
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
    async fn live_bridges(&self) -> Result<HashSet<String>, String> {
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
    fn new(namespace: &str, policy: EgressPolicy) -> Self {
        let label = policy.label();
        // A stable hash (not std's, whose output may change between releases): a rename
        // would orphan every chain on upgrade.
        let hash = fnv1a32(format!("{namespace}\n{label}").as_bytes());
        EgressNames {
            network: format!("sbx-{namespace}-{label}"),
            bridge: format!("sbx{hash:08x}"),
            forward: format!("SBX-{hash:08x}-FWD"),
            input: format!("SBX-{hash:08x}-IN"),
            comment: format!("sbx:{namespace}:{label}"),
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

fn validate_namespace(namespace: &str) -> Result<(), Error> {
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

/// Every failure of `ensure` is the same decision for the caller: do not start the sandbox.
fn ensure_error(message: String) -> Error {
    Error::unavailable(OP_ENSURE, message)
        .with_code(ErrorCode::EgressProtectionUnavailable)
        .with_provider(Provider::Docker)
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

fn is_status(e: &DockerError, status: u16) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, .. } if *status_code == status)
}

/// Refuses a network that carries our name but not our settings: joining it would start a
/// sandbox without the isolation the caller asked for.
fn check_ours(
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
fn bridged_traffic_filtered(ipv6: bool) -> Result<(), String> {
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

fn describe_network(net: &NetworkInspect, names: &EgressNames) -> Result<EgressNetwork, String> {
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

/// A connected route broader than this is taken for "everything through this link" (a
/// point-to-point default, a VPN's `0.0.0.0/1` pair), not a LAN.
const MIN_LAN_PREFIX_V4: u8 = 8;
const MIN_LAN_PREFIX_V6: u8 = 16;

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

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

/// The rules of one chain, in order: each is the rule specification after the chain name.
fn forward_rules(
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

/// The subnets the host is connected to that the strict policy drops on top of `dropped`: each
/// of `family`, but not the sandbox's own bridge (the `-o <bridge>` rule covers it and its
/// route appears only once the network exists), not a default-like route through a link (a
/// tunnel's `0.0.0.0/1`: dropping it would cut the sandbox from the internet, and it is no
/// LAN), and nothing a dropped range or another connected subnet already covers. Sorted, so
/// a reordered routing table changes no rule.
fn connected_drops(
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

fn drop_rule(net: &IpNet) -> Vec<String> {
    strings(&["-d", &net.to_string(), "-j", "DROP"])
}

fn input_rules(family: IpFamily, names: &EgressNames, resolvers: &[IpAddr]) -> Vec<Vec<String>> {
    let mut rules = vec![established(names)];
    // A resolver may be the host itself (dnsmasq on a LAN address).
    rules.extend(dns_rules(family, resolvers));
    rules.push(strings(&["-j", "DROP"]));
    rules
}

fn established(names: &EgressNames) -> Vec<String> {
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

fn dns_rules(family: IpFamily, resolvers: &[IpAddr]) -> Vec<Vec<String>> {
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
fn jumps(names: &EgressNames) -> [(&'static str, Vec<String>); 2] {
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

/// One family's iptables, with the failure messages every caller needs.
struct Ipt<'a> {
    runner: &'a dyn IptablesRunner,
    family: IpFamily,
}

impl<'a> Ipt<'a> {
    fn new(runner: &'a dyn IptablesRunner, family: IpFamily) -> Self {
        Ipt { runner, family }
    }

    /// Runs `-w <args>`; `Err` only when the program could not run.
    async fn call(&self, args: &[&str]) -> Result<(Vec<String>, RunOutput), String> {
        let mut full = vec!["-w".to_owned()];
        full.extend(args.iter().map(|a| (*a).to_owned()));
        match self.runner.run(self.family, &full).await {
            Ok(out) => Ok((full, out)),
            Err(e) => Err(self.spawn_failure(&e)),
        }
    }

    /// Runs and requires success.
    async fn ok(&self, args: &[&str]) -> Result<RunOutput, String> {
        let (full, out) = self.call(args).await?;
        if out.status == 0 {
            Ok(out)
        } else {
            Err(self.failure(&full, &out))
        }
    }

    /// For `-C` and `-S <chain>`: status 0 is yes, 1 is no (rule or chain missing), anything
    /// else (2 bad arguments, 4 permission or resource problem) is an error.
    async fn probe(&self, args: &[&str]) -> Result<bool, String> {
        let (full, out) = self.call(args).await?;
        match out.status {
            0 => Ok(true),
            1 if !denied(&out.stderr) => Ok(false),
            _ => Err(self.failure(&full, &out)),
        }
    }

    /// The `-S <chain>` listing, `None` when the chain does not exist.
    async fn listing(&self, chain: &str) -> Result<Option<String>, String> {
        let (full, out) = self.call(&["-S", chain]).await?;
        match out.status {
            0 => Ok(Some(out.stdout)),
            1 if !denied(&out.stderr) => Ok(None),
            _ => Err(self.failure(&full, &out)),
        }
    }

    /// Whether the program exists at all (any answer counts; only a failed spawn does not).
    async fn installed(&self) -> bool {
        !matches!(
            self.runner
                .run(self.family, &strings(&["-w", "-S", DOCKER_USER]))
                .await,
            Err(e) if e.kind() == io::ErrorKind::NotFound
        )
    }

    fn spawn_failure(&self, e: &io::Error) -> String {
        let program = self.family.program();
        match e.kind() {
            io::ErrorKind::NotFound => format!(
                "{program} not found: egress protection of bridge-mode sandboxes needs it \
                 (apt-get install iptables)"
            ),
            io::ErrorKind::PermissionDenied => format!(
                "permission denied: egress rules need root (CAP_NET_ADMIN): cannot run {program}: {e}"
            ),
            _ => format!("cannot run {program}: {e}"),
        }
    }

    fn failure(&self, args: &[String], out: &RunOutput) -> String {
        let command = format!("{} {}", self.family.program(), args.join(" "));
        let stderr = out.stderr.trim();
        if denied(stderr) {
            format!(
                "permission denied: egress rules need root (CAP_NET_ADMIN): `{command}`: {stderr}"
            )
        } else {
            format!("`{command}` failed (exit {}): {stderr}", out.status)
        }
    }
}

fn denied(stderr: &str) -> bool {
    [
        "Permission denied",
        "you must be root",
        "Operation not permitted",
    ]
    .iter()
    .any(|m| stderr.contains(m))
}

/// The rules of one (namespace, policy) pair, ready to install.
struct RuleSet<'a> {
    runner: &'a dyn IptablesRunner,
    names: &'a EgressNames,
    policy: EgressPolicy,
    resolvers: &'a [IpAddr],
    connected: &'a [ConnectedRoute],
}

impl RuleSet<'_> {
    /// Creates the chains, fills them, then adds the jumps: each step checked with `-C`/`-S`
    /// first, so a second run changes nothing.
    async fn install(&self, family: IpFamily) -> Result<(), String> {
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

/// Splits one line of `iptables -S`. Our comments contain no spaces; iptables-nft prints them
/// in double quotes, which the argument form must not carry.
fn tokens(line: &str) -> Vec<String> {
    line.split_whitespace()
        .map(|t| t.trim_matches('"').to_owned())
        .collect()
}

/// Deletes the rule an `-A <chain> <spec>` listing line describes. A rule that is already gone
/// (status 1) is fine: a concurrent remover got there first.
async fn delete_listed(ipt: &Ipt<'_>, tokens: &[String]) -> Result<(), String> {
    let mut args = vec!["-D"];
    args.extend(tokens.iter().skip(1).map(String::as_str));
    let (full, out) = ipt.call(&args).await?;
    if out.status == 0 || (out.status == 1 && !denied(&out.stderr)) {
        Ok(())
    } else {
        Err(ipt.failure(&full, &out))
    }
}

/// Lines of a listing that jump to `chain` from another chain.
fn references(listing: &str, chain: &str) -> Vec<Vec<String>> {
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

/// Removes `chain` and every jump to it from `parents`, if the chain exists.
async fn remove_chain(ipt: &Ipt<'_>, chain: &str, parents: &[&str]) -> Result<bool, String> {
    if !ipt.probe(&["-S", chain]).await? {
        return Ok(false);
    }
    let mut refs = Vec::new();
    for parent in parents {
        let listing = ipt.ok(&["-S", parent]).await?.stdout;
        refs.extend(references(&listing, chain));
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
    listing
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .map(str::trim)
        .filter(|c| is_our_chain(c) && !live.contains(&bridge_of_chain(c)))
        .map(str::to_owned)
        .collect()
}

fn is_our_chain(chain: &str) -> bool {
    let Some(rest) = chain.strip_prefix("SBX-") else {
        return false;
    };
    let Some((hash, kind)) = rest.split_once('-') else {
        return false;
    };
    hash.len() == 8
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && matches!(kind, "FWD" | "IN")
}

fn bridge_of_chain(chain: &str) -> String {
    format!("sbx{}", chain.get(4..12).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use sandbox_core::ErrorKind;

    use super::*;

    /// A small in-memory iptables: enough of `-S`, `-C`, `-N`, `-I`, `-A`, `-D`, `-F`, `-X` for
    /// the rule layer, per family, plus a log of every command line.
    #[derive(Debug, Default)]
    struct FakeIptables {
        state: Mutex<FakeState>,
    }

    #[derive(Debug, Default)]
    struct FakeState {
        tables: HashMap<IpFamily, BTreeMap<String, Vec<String>>>,
        calls: Vec<String>,
        spawn_error: Option<io::ErrorKind>,
        answer: Option<RunOutput>,
    }

    const BUILTINS: [&str; 3] = ["INPUT", "FORWARD", "OUTPUT"];

    impl FakeIptables {
        /// What Docker leaves on a host, plus one host rule in INPUT that must survive.
        fn docker_host() -> Self {
            let fake = FakeIptables::default();
            for family in [IpFamily::V4, IpFamily::V6] {
                let mut t = BTreeMap::new();
                t.insert("INPUT".into(), vec!["-p tcp --dport 22 -j ACCEPT".into()]);
                t.insert(
                    "FORWARD".into(),
                    vec![
                        "-j DOCKER-USER".into(),
                        "-j DOCKER-ISOLATION-STAGE-1".into(),
                    ],
                );
                t.insert("OUTPUT".into(), vec![]);
                t.insert("DOCKER-USER".into(), vec!["-j RETURN".into()]);
                t.insert("DOCKER-ISOLATION-STAGE-1".into(), vec!["-j RETURN".into()]);
                fake.lock().tables.insert(family, t);
            }
            fake
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
            self.state.lock().unwrap()
        }

        fn calls(&self) -> Vec<String> {
            std::mem::take(&mut self.lock().calls)
        }

        fn table(&self, family: IpFamily) -> BTreeMap<String, Vec<String>> {
            self.lock().tables.get(&family).cloned().unwrap_or_default()
        }

        fn exec(t: &mut BTreeMap<String, Vec<String>>, args: &[String]) -> RunOutput {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let [wait, op, rest @ ..] = args.as_slice() else {
                return RunOutput::failed(2, "usage");
            };
            assert_eq!(*wait, "-w", "every command waits for the xtables lock");
            let missing = |c: &str| RunOutput::failed(1, format!("Chain '{c}' does not exist"));
            let listing = |t: &BTreeMap<String, Vec<String>>, c: &str| {
                let head = if BUILTINS.contains(&c) {
                    format!("-P {c} ACCEPT")
                } else {
                    format!("-N {c}")
                };
                let mut out = vec![head];
                out.extend(t[c].iter().map(|r| format!("-A {c} {r}")));
                out.join("\n") + "\n"
            };
            match (*op, rest) {
                ("-S", []) => RunOutput::ok(t.keys().map(|c| listing(t, c)).collect::<String>()),
                ("-S", [c]) if t.contains_key(*c) => RunOutput::ok(listing(t, c)),
                ("-S", [c]) => missing(c),
                ("-N", [c]) if t.contains_key(*c) => {
                    RunOutput::failed(1, "iptables: Chain already exists.")
                }
                ("-N", [c]) => {
                    t.insert((*c).to_owned(), vec![]);
                    RunOutput::ok("")
                }
                ("-F", [c]) => match t.get_mut(*c) {
                    Some(rules) => {
                        rules.clear();
                        RunOutput::ok("")
                    }
                    None => missing(c),
                },
                ("-X", [c]) => {
                    let referenced = t
                        .values()
                        .flatten()
                        .any(|r| r.ends_with(&format!("-j {c}")));
                    match t.get(*c) {
                        None => missing(c),
                        Some(rules) if !rules.is_empty() || referenced => {
                            RunOutput::failed(1, "Directory not empty / Too many links")
                        }
                        Some(_) => {
                            t.remove(*c);
                            RunOutput::ok("")
                        }
                    }
                }
                (op @ ("-C" | "-A" | "-D" | "-I"), [c, spec @ ..]) => {
                    let Some(rules) = t.get_mut(*c) else {
                        return missing(c);
                    };
                    let (pos, spec) = match (op, spec) {
                        ("-I", [n, rest @ ..]) if n.parse::<usize>().is_ok() => {
                            (n.parse::<usize>().unwrap(), rest)
                        }
                        _ => (1, spec),
                    };
                    let rule = spec.join(" ");
                    let found = rules.iter().position(|r| *r == rule);
                    match (op, found) {
                        ("-C", Some(_)) => RunOutput::ok(""),
                        ("-C" | "-D", None) => RunOutput::failed(
                            1,
                            "iptables: Bad rule (does a matching rule exist in that chain?).",
                        ),
                        ("-D", Some(i)) => {
                            rules.remove(i);
                            RunOutput::ok("")
                        }
                        ("-A", _) => {
                            rules.push(rule);
                            RunOutput::ok("")
                        }
                        _ if pos > rules.len() + 1 => {
                            RunOutput::failed(1, "iptables: Index of insertion too big.")
                        }
                        _ => {
                            rules.insert(pos - 1, rule);
                            RunOutput::ok("")
                        }
                    }
                }
                _ => RunOutput::failed(2, format!("fake: unsupported {args:?}")),
            }
        }
    }

    #[async_trait]
    impl IptablesRunner for FakeIptables {
        async fn run(&self, family: IpFamily, args: &[String]) -> io::Result<RunOutput> {
            let mut s = self.lock();
            s.calls
                .push(format!("{} {}", family.program(), args.join(" ")));
            if let Some(kind) = s.spawn_error {
                return Err(io::Error::new(kind, "spawn failed"));
            }
            if let Some(answer) = s.answer.clone() {
                return Ok(answer);
            }
            let table = s.tables.entry(family).or_default();
            Ok(FakeIptables::exec(table, args))
        }
    }

    fn resolvers() -> Vec<IpAddr> {
        ["10.255.255.53", "127.0.0.53", "2001:db8::53"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect()
    }

    /// The host's connected routes in most tests: a LAN with public addresses (TEST-NET-3)
    /// and a private one, Docker's default bridge, the sandbox network's own bridge, a VPN's
    /// default-like half, and IPv6 LANs (a public one, a unique-local one, link-local).
    fn routes() -> Vec<ConnectedRoute> {
        [
            ("203.0.113.0/24", "eth1"),
            ("10.1.0.0/24", "eth0"),
            ("172.17.0.0/16", "docker0"),
            ("172.18.0.0/16", "sbx4bf24aa9"),
            ("0.0.0.0/1", "tun0"),
            ("2001:db8:1::/64", "eth1"),
            ("fd00::/64", "eth0"),
            ("fe80::/64", "eth0"),
        ]
        .iter()
        .map(|(net, dev)| ConnectedRoute::new(net.parse().unwrap(), *dev))
        .collect()
    }

    async fn install(
        fake: &FakeIptables,
        family: IpFamily,
        policy: EgressPolicy,
        resolvers: &[IpAddr],
    ) -> Result<(), String> {
        install_with(fake, family, policy, resolvers, &routes()).await
    }

    async fn install_with(
        fake: &FakeIptables,
        family: IpFamily,
        policy: EgressPolicy,
        resolvers: &[IpAddr],
        connected: &[ConnectedRoute],
    ) -> Result<(), String> {
        let names = EgressNames::new("team-a", policy);
        RuleSet {
            runner: fake,
            names: &names,
            policy,
            resolvers,
            connected,
        }
        .install(family)
        .await
    }

    async fn remove(fake: &FakeIptables, family: IpFamily, policy: EgressPolicy) {
        let names = EgressNames::new("team-a", policy);
        let ipt = Ipt::new(fake, family);
        for chain in [&names.forward, &names.input] {
            remove_chain(&ipt, chain, &[DOCKER_USER, INPUT])
                .await
                .unwrap();
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    fn mutating(calls: &[String]) -> Vec<String> {
        calls
            .iter()
            .filter(|c| {
                ["-N", "-I", "-A", "-D", "-F", "-X"]
                    .iter()
                    .any(|op| c.contains(&format!(" {op} ")))
            })
            .cloned()
            .collect()
    }

    /// What a chain does with a new connection from the bridge to `dst` (`proto` to `port`)
    /// that leaves by the host's uplink: the first matching rule's verdict, `RETURN` when none
    /// matches. Understands exactly the rule shapes this module writes.
    fn fate<S: AsRef<str>>(rules: &[S], dst: IpAddr, proto: &str, port: u16) -> String {
        for rule in rules {
            let t: Vec<&str> = rule.as_ref().split_whitespace().collect();
            let arg = |flag: &str| t.windows(2).find(|w| w[0] == flag).map(|w| w[1]);
            // Established flows and traffic out through the bridge are other packets.
            if arg("--ctstate").is_some() || arg("-o").is_some() {
                continue;
            }
            if arg("-d").is_some_and(|d| !d.parse::<IpNet>().unwrap().contains(&dst))
                || arg("-p").is_some_and(|p| p != proto)
                || arg("--dport").is_some_and(|p| p != port.to_string())
            {
                continue;
            }
            return arg("-j").unwrap().to_owned();
        }
        "RETURN".to_owned()
    }

    /// Every metadata-table address a family's chain must drop: the table's own addresses,
    /// and for IPv6 also each IPv4 entry IPv4-mapped and through the NAT64 well-known prefix.
    fn metadata_destinations(family: IpFamily) -> Vec<IpAddr> {
        match family {
            IpFamily::V4 => metadata_v4().map(IpAddr::V4).collect(),
            IpFamily::V6 => metadata_v6()
                .chain(metadata_v4().map(|v4| v4.to_ipv6_mapped()))
                .chain(metadata_v4().map(|v4| format!("64:ff9b::{v4}").parse().unwrap()))
                .map(IpAddr::V6)
                .collect(),
        }
    }

    /// The destinations of `metadata_destinations` that `rules` does not drop.
    fn metadata_not_dropped<S: AsRef<str>>(rules: &[S], family: IpFamily) -> Vec<IpAddr> {
        metadata_destinations(family)
            .into_iter()
            .filter(|dst| fate(rules, *dst, "tcp", 80) != "DROP")
            .collect()
    }

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
        assert!(is_our_chain(&longest.forward) && is_our_chain(&longest.input));
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

    /// The exact commands of a first install on a Docker host, strict policy, IPv4.
    #[test]
    fn golden_strict_install() {
        let fake = FakeIptables::docker_host();
        rt().block_on(install(
            &fake,
            IpFamily::V4,
            EgressPolicy::STRICT,
            &resolvers(),
        ))
        .unwrap();
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

    #[test]
    fn second_install_adds_nothing() {
        let fake = FakeIptables::docker_host();
        let rt = rt();
        rt.block_on(install(
            &fake,
            IpFamily::V4,
            EgressPolicy::STRICT,
            &resolvers(),
        ))
        .unwrap();
        let before = fake.table(IpFamily::V4);
        fake.calls();
        rt.block_on(install(
            &fake,
            IpFamily::V4,
            EgressPolicy::STRICT,
            &resolvers(),
        ))
        .unwrap();
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
        let rt = rt();
        rt.block_on(install(
            &fake,
            IpFamily::V4,
            EgressPolicy::STRICT,
            &resolvers(),
        ))
        .unwrap();
        let want = fake.table(IpFamily::V4);
        {
            let mut s = fake.lock();
            let t = s.tables.get_mut(&IpFamily::V4).unwrap();
            t.get_mut("SBX-4bf24aa9-FWD").unwrap().drain(1..4);
            t.get_mut("DOCKER-USER").unwrap().remove(0);
        }
        rt.block_on(install(
            &fake,
            IpFamily::V4,
            EgressPolicy::STRICT,
            &resolvers(),
        ))
        .unwrap();
        assert_eq!(fake.table(IpFamily::V4), want);
    }

    #[test]
    fn stale_resolvers_are_pruned() {
        let fake = FakeIptables::docker_host();
        let rt = rt();
        rt.block_on(install(
            &fake,
            IpFamily::V4,
            EgressPolicy::STRICT,
            &resolvers(),
        ))
        .unwrap();
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

    /// The verdicts of a chain in the fake, in order.
    fn verdicts(fake: &FakeIptables, family: IpFamily, chain: &str) -> Vec<String> {
        fake.table(family)[chain]
            .iter()
            .map(|r| r.rsplit(' ').next().unwrap_or_default().to_owned())
            .collect()
    }

    fn exemptions_first(verdicts: &[String]) -> bool {
        let first_drop = verdicts.iter().position(|v| v == "DROP");
        first_drop.is_none_or(|i| verdicts[i..].iter().all(|v| v == "DROP"))
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
        rt.block_on(install(
            &fake,
            IpFamily::V4,
            EgressPolicy::STRICT,
            &resolvers(),
        ))
        .unwrap();
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
        assert_eq!(
            references(listing, "SBX-74676aaf-IN"),
            [tokens(
                "-A INPUT -i sbx74676aaf -m comment --comment sbx:team-a:private -j SBX-74676aaf-IN"
            )]
        );
    }

    #[test]
    fn fails_closed_with_the_reason() {
        let cases: [(Option<io::ErrorKind>, Option<RunOutput>, &str); 4] = [
            (Some(io::ErrorKind::NotFound), None, "iptables not found"),
            (
                None,
                Some(RunOutput::failed(
                    4,
                    "iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)",
                )),
                "permission denied: egress rules need root (CAP_NET_ADMIN)",
            ),
            (
                None,
                Some(RunOutput::failed(
                    3,
                    "iptables v1.8.9: can't initialize iptables table `filter': Table does not exist (do you need to insmod?)",
                )),
                "Table does not exist",
            ),
            (
                None,
                Some(RunOutput::failed(1, "")),
                "has no DOCKER-USER chain",
            ),
        ];
        for (spawn_error, answer, want) in cases {
            let fake = FakeIptables::docker_host();
            fake.lock().spawn_error = spawn_error;
            fake.lock().answer = answer;
            let message = rt()
                .block_on(install(
                    &fake,
                    IpFamily::V4,
                    EgressPolicy::STRICT,
                    &resolvers(),
                ))
                .unwrap_err();
            assert!(message.contains(want), "{message:?} lacks {want:?}");
            assert_eq!(mutating(&fake.calls()), Vec::<String>::new(), "{want}");
            let e = ensure_error(message);
            assert_eq!(e.kind(), ErrorKind::Unavailable);
            assert_eq!(e.code(), Some(ErrorCode::EgressProtectionUnavailable));
            assert!(!e.can_replace_binding());
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
        let message = rt()
            .block_on(install(
                &fake,
                IpFamily::V4,
                EgressPolicy::STRICT,
                &resolvers(),
            ))
            .unwrap_err();
        assert!(
            message.contains("does not jump to DOCKER-USER"),
            "{message}"
        );
    }

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
