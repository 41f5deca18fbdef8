//! Test machinery shared by the egress modules' unit tests: an in-memory iptables, the
//! resolvers and routes most tests use, and helpers that read what a chain does.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::IpAddr;
use std::sync::Mutex;

use async_trait::async_trait;
use ipnet::IpNet;
use sandbox_transport::metadata::{metadata_v4, metadata_v6};

use super::iptables::{DOCKER_USER, INPUT, IpFamily, Ipt, IptablesRunner, RunOutput};
use super::network::EgressNames;
use super::policy::EgressPolicy;
use super::repair::RuleSet;
use super::routes::ConnectedRoute;
use super::sweep::remove_chain;

/// A small in-memory iptables: enough of `-S`, `-C`, `-N`, `-I`, `-A`, `-D`, `-F`, `-X` for
/// the rule layer, per family, plus a log of every command line.
#[derive(Debug, Default)]
pub(super) struct FakeIptables {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
pub(super) struct FakeState {
    pub(super) tables: HashMap<IpFamily, BTreeMap<String, Vec<String>>>,
    pub(super) calls: Vec<String>,
    pub(super) spawn_error: Option<io::ErrorKind>,
    pub(super) answer: Option<RunOutput>,
}

const BUILTINS: [&str; 3] = ["INPUT", "FORWARD", "OUTPUT"];

impl FakeIptables {
    /// What Docker leaves on a host, plus one host rule in INPUT that must survive.
    pub(super) fn docker_host() -> Self {
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

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    pub(super) fn calls(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().calls)
    }

    pub(super) fn table(&self, family: IpFamily) -> BTreeMap<String, Vec<String>> {
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

pub(super) fn resolvers() -> Vec<IpAddr> {
    ["10.255.255.53", "127.0.0.53", "2001:db8::53"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect()
}

/// The host's connected routes in most tests: a LAN with public addresses (TEST-NET-3)
/// and a private one, Docker's default bridge, the sandbox network's own bridge, a VPN's
/// default-like half, and IPv6 LANs (a public one, a unique-local one, link-local).
pub(super) fn routes() -> Vec<ConnectedRoute> {
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

pub(super) async fn install(
    fake: &FakeIptables,
    family: IpFamily,
    policy: EgressPolicy,
    resolvers: &[IpAddr],
) -> Result<(), String> {
    install_with(fake, family, policy, resolvers, &routes()).await
}

/// [`install`] of the strict policy's IPv4 rules with [`resolvers`], on a runtime of its own:
/// the first step of most tests.
pub(super) fn install_strict_v4(fake: &FakeIptables) -> Result<(), String> {
    rt().block_on(install(
        fake,
        IpFamily::V4,
        EgressPolicy::STRICT,
        &resolvers(),
    ))
}

pub(super) async fn install_with(
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

pub(super) async fn remove(fake: &FakeIptables, family: IpFamily, policy: EgressPolicy) {
    let names = EgressNames::new("team-a", policy);
    let ipt = Ipt::new(fake, family);
    for chain in [&names.forward, &names.input] {
        remove_chain(&ipt, chain, &[DOCKER_USER, INPUT])
            .await
            .unwrap();
    }
}

pub(super) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

pub(super) fn mutating(calls: &[String]) -> Vec<String> {
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
pub(super) fn fate<S: AsRef<str>>(rules: &[S], dst: IpAddr, proto: &str, port: u16) -> String {
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
pub(super) fn metadata_not_dropped<S: AsRef<str>>(rules: &[S], family: IpFamily) -> Vec<IpAddr> {
    metadata_destinations(family)
        .into_iter()
        .filter(|dst| fate(rules, *dst, "tcp", 80) != "DROP")
        .collect()
}

/// The verdicts of a chain in the fake, in order.
pub(super) fn verdicts(fake: &FakeIptables, family: IpFamily, chain: &str) -> Vec<String> {
    fake.table(family)[chain]
        .iter()
        .map(|r| r.rsplit(' ').next().unwrap_or_default().to_owned())
        .collect()
}

pub(super) fn exemptions_first(verdicts: &[String]) -> bool {
    let first_drop = verdicts.iter().position(|v| v == "DROP");
    first_drop.is_none_or(|i| verdicts[i..].iter().all(|v| v == "DROP"))
}
