//! [`EgressGuard`]: one namespace's egress protection on one Docker host, tying the network,
//! the rule set and the host's resolvers and subnets together.

use std::net::IpAddr;
use std::sync::Arc;

use bollard::Docker;
use sandbox_core::{Error, ErrorCode, Operation, Provider};

use super::iptables::{CommandRunner, IpFamily, IptablesRunner};
use super::network::{
    EgressNames, EgressNetwork, bridged_traffic_filtered, check_ours, describe_network,
    validate_namespace,
};
use super::policy::EgressPolicy;
use super::repair::RuleSet;
use super::resolvers::host_resolvers;
use super::routes::{ConnectedRoute, host_connected_routes};

const OP_ENSURE: Operation = Operation::new("ensure_egress");

/// Installs, checks and removes the egress protection of one namespace on one Docker host.
///
/// Cheap to clone; clones share one lock, so concurrent calls through clones of one guard
/// install every rule exactly once.
#[derive(Debug, Clone)]
pub struct EgressGuard {
    pub(super) docker: Docker,
    pub(super) namespace: String,
    pub(super) runner: Arc<dyn IptablesRunner>,
    /// Overrides the discovered upstream DNS servers (see [`host_resolvers`]).
    pub(super) resolvers: Option<Vec<IpAddr>>,
    /// Overrides the discovered connected routes (see [`host_connected_routes`]).
    pub(super) connected: Option<Vec<ConnectedRoute>>,
    pub(super) serial: Arc<tokio::sync::Mutex<()>>,
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
}

/// Every failure of `ensure` is the same decision for the caller: do not start the sandbox.
pub(super) fn ensure_error(message: String) -> Error {
    Error::unavailable(OP_ENSURE, message)
        .with_code(ErrorCode::EgressProtectionUnavailable)
        .with_provider(Provider::Docker)
}
