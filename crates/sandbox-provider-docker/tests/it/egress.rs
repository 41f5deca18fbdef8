//! Egress protection against a real engine, real iptables and a test host in a network
//! namespace this test creates.
//!
//! Nothing leaves the machine: only packets entering from the test's bridges are diverted (a
//! policy-routing rule per bridge) to a routing table that sends the probe addresses (every IPv4
//! address of `sandbox_transport`'s metadata table, a private one and a public stand-in) to a
//! veth whose other end is the test host, and ends in `unreachable`. The main table gains one
//! route only, and only on that veth (asserted): a public-addressed (TEST-NET) /24 the host is
//! connected to through it, the host LAN the strict policy must drop although no private range
//! covers it; the test host answers there too, and the route goes with the veth. The test host
//! answers HTTP on 8080 and logs every request path; each
//! probe's path names the container and the target, so "the test host logged nothing from it"
//! is a check on the log (Docker masquerades, so source addresses alone would not tell). The
//! unprotected control container reaching every metadata address proves the diversion works for
//! each, so the protected containers' silence is the rules' doing.
//!
//! Everything created is named `sbxt-…`/`sbxt…` or labelled `sandbox.test=1`, uses policy
//! table [`TABLE`] (rule priority [`PRIORITY`]), and is removed by a drop guard; after a killed
//! run, `cargo xtask test` removes the leftovers (`xtask/src/netclean.rs` uses the same names).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)] // Test binary: a failed unwrap is a failed test, stderr is its log.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::panic::AssertUnwindSafe;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use bollard::{ClientVersion, Docker};
use futures_util::{FutureExt, StreamExt};
use sandbox_core::ErrorKind;
use sandbox_provider_docker::egress::{EgressGuard, EgressNetwork, EgressPolicy, host_resolvers};
use sandbox_transport::metadata::metadata_v4;

const GATE: &str = "SANDBOX_EGRESS_TEST";
const IMAGE: &str = "sandbox-busybox:test";
const TEST_LABEL: &str = "sandbox.test";
/// Policy-routing table of the test (xtask's netclean deletes rules that look it up).
const TABLE: &str = "7913";
/// Priority of the test's `ip rule`s: ahead of `main` (32766), after `local` (0), so packets
/// to the host's own addresses are still delivered locally.
const PRIORITY: &str = "7913";
const HTTP_PORT: u16 = 8080;
const PEER_PORT: u16 = 9000;
const HOST_PORT: u16 = 8081;
/// TEST-NET-3: documentation range, never routed, so it stands in for "the internet".
const ALLOWED: &str = "203.0.113.7";
/// Candidate /24s for the private probe address and the veth; the first one the machine does
/// not use is taken.
const PRIVATE_NETS: [[u8; 3]; 3] = [[10, 213, 99], [10, 231, 77], [192, 168, 213]];
/// Candidate /24s for the host LAN with public (documentation) addresses: the host end of the
/// test host's veth takes `.1/24`, so the host is connected to it; the test host answers on
/// `.7`. The first one the machine does not use is taken.
const LAN_NETS: [[u8; 3]; 2] = [[198, 51, 100], [192, 0, 2]];
const PROBE_TIMEOUT_SECS: &str = "3";
/// Probes in flight at once: enough to keep the run short (most blocked probes wait out their
/// timeout), few enough that two shared cores start every allowed one well inside it.
const PROBES_IN_FLIGHT: usize = 16;

/// The test host: logs `<client> <path>` per request, says `ready` once bound, and exits on
/// its own after 15 minutes so a killed test cannot leave it running for long.
const TEST_HOST: &str = r#"
import http.server, os, sys, threading
log, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write(f"{self.client_address[0]} {self.path}\n")
        body = b"sbxt-ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
threading.Timer(900, os._exit, [0]).start()
srv = http.server.ThreadingHTTPServer((addr, port), H)
print("ready", flush=True)
srv.serve_forever()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and a Docker engine: run through `cargo xtask test`, which sets SANDBOX_EGRESS_TEST=1"]
async fn egress_protection_matrix() {
    match std::env::var(GATE).as_deref() {
        Ok("1") => {}
        _ => panic!(
            "{GATE}=1 is not set: this test edits the host's firewall and routing (as root), \
             so it only runs when asked to; `cargo xtask test` runs it"
        ),
    }
    prerequisites();
    let docker = Docker::connect_with_unix(
        "unix:///var/run/docker.sock",
        120,
        &ClientVersion {
            major_version: 1,
            minor_version: 41,
        },
    )
    .expect("Docker socket /var/run/docker.sock");
    docker.inspect_image(IMAGE).await.unwrap_or_else(|e| {
        panic!("{IMAGE} is missing ({e}); `cargo xtask test` builds it (tests never pull)")
    });

    let main_before = main_table();
    let mut env = Env::new(docker);
    let result = AssertUnwindSafe(scenario(&mut env)).catch_unwind().await;
    // Always clean up here; the Drop guard is only for a panic inside this cleanup.
    env.teardown();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    env.assert_gone();
    assert_eq!(main_table(), main_before, "the main routing table changed");
}

async fn scenario(env: &mut Env) {
    // Leftovers of a killed run that used the same table would misroute: remove them first.
    clear_table();
    env.pick_addresses();

    // The unprotected control bridge: a plain user network, named bridge, default settings.
    let ctl_net = format!("sbxt-ctl-{}", env.run);
    env.docker
        .create_network(NetworkCreateRequest {
            name: ctl_net.clone(),
            driver: Some("bridge".into()),
            options: Some(HashMap::from([(
                "com.docker.network.bridge.name".into(),
                env.ctl_bridge.clone(),
            )])),
            labels: Some(HashMap::from([(TEST_LABEL.into(), "1".into())])),
            ..Default::default()
        })
        .await
        .unwrap();
    env.networks.push(ctl_net.clone());

    // Racing creates through clones of one guard: one network, each rule exactly once.
    let guard = env.guard.clone();
    let (g2, g3) = (guard.clone(), guard.clone());
    let (a, b, c) = tokio::join!(
        guard.ensure(EgressPolicy::STRICT),
        g2.ensure(EgressPolicy::STRICT),
        g3.ensure(EgressPolicy::STRICT),
    );
    let strict = a.unwrap();
    assert_eq!(b.unwrap(), strict);
    assert_eq!(c.unwrap(), strict);
    let private = guard.ensure(EgressPolicy::ALLOW_PRIVATE).await.unwrap();
    assert_eq!(guard.ensure(EgressPolicy::STRICT).await.unwrap(), strict);
    assert!(!strict.ipv6 && !private.ipv6, "the daemon has no IPv6 here");
    eprintln!("strict network: {strict:?}\nprivate network: {private:?}");
    for net in [&strict, &private] {
        check_rules_installed(env, net);
    }

    // From here on the test sets up its own routing: Docker has added the networks' connected
    // routes, and nothing else may change in the main table but the test LAN's route.
    let main_before = main_table();
    env.test_host();

    // A create after the host gained a LAN: strict drops it, allow-private does not.
    assert_eq!(guard.ensure(EgressPolicy::STRICT).await.unwrap(), strict);
    assert_eq!(
        guard.ensure(EgressPolicy::ALLOW_PRIVATE).await.unwrap(),
        private
    );
    let lan_net = env.lan_cidr();
    let strict_names = env.guard.names(EgressPolicy::STRICT);
    let private_names = env.guard.names(EgressPolicy::ALLOW_PRIVATE);
    assert!(
        has_rule(&strict_names.forward, &["-d", &lan_net, "-j", "DROP"]),
        "no drop of the host LAN {lan_net} in {}",
        strict_names.forward
    );
    assert!(
        !has_rule(&private_names.forward, &["-d", &lan_net, "-j", "DROP"]),
        "allow-private drops the host LAN {lan_net}"
    );

    // Divert only the test's bridges to the test host.
    for bridge in [&env.ctl_bridge, &strict.bridge, &private.bridge].map(String::as_str) {
        sh(&[
            "ip", "rule", "add", "priority", PRIORITY, "iif", bridge, "table", TABLE,
        ]);
    }
    let strict_gw = gateway(&env.docker, &strict.name).await;
    env.host_listener(&strict_gw);

    let ctl1 = env.container("ctl1", &ctl_net).await;
    let ctl2 = env.container("ctl2", &ctl_net).await;
    let s1 = env.container("s1", &strict.name).await;
    let s2 = env.container("s2", &strict.name).await;
    let p1 = env.container("p1", &private.name).await;
    let veth = format!(" dev {} ", env.veth_host);
    let (own, rest): (Vec<String>, Vec<String>) = main_table()
        .lines()
        .map(|l| format!("{l} "))
        .partition(|l| l.contains(&veth));
    assert_eq!(
        rest.iter()
            .map(|l| l.trim_end())
            .collect::<Vec<_>>()
            .join("\n"),
        main_before,
        "the test must not touch the main routing table beyond its LAN's route"
    );
    assert!(
        own.len() == 1 && own[0].starts_with(&format!("{lan_net}{veth}")),
        "the test veth's routes in the main table: {own:?}"
    );

    // The matrix: (row, column, container, url, expected to answer). Every IPv4 address of the
    // metadata table is a column of its own: the control reaches each, no protected one does.
    let private_addr = env.private_addr.to_string();
    let mut targets: Vec<(String, String, [bool; 3])> = metadata_v4()
        .map(|m| {
            (
                format!("meta-{m}"),
                format!("{m}:{HTTP_PORT}"),
                [true, false, false],
            )
        })
        .collect();
    targets.push((
        "private".into(),
        format!("{private_addr}:{HTTP_PORT}"),
        [true, false, true],
    ));
    targets.push((
        "allowed".into(),
        format!("{ALLOWED}:{HTTP_PORT}"),
        [true, true, true],
    ));
    // The host's own LAN, public addresses and all: the host's network, not the internet.
    targets.push((
        "lan".into(),
        format!("{}:{HTTP_PORT}", env.lan_addr),
        [true, false, true],
    ));
    let mut probes: Vec<(&str, String, &Ctr, String, bool)> = Vec::new();
    for (i, (row, c)) in [("control", &ctl1), ("strict", &s1), ("private", &p1)]
        .into_iter()
        .enumerate()
    {
        for (col, target, expect) in &targets {
            probes.push((row, col.clone(), c, target.clone(), expect[i]));
        }
    }
    probes.push((
        "control",
        "peer".into(),
        &ctl1,
        format!("{}:{PEER_PORT}", ctl2.ip),
        true,
    ));
    probes.push((
        "strict",
        "peer".into(),
        &s1,
        format!("{}:{PEER_PORT}", s2.ip),
        false,
    ));
    probes.push((
        "strict",
        "self".into(),
        &s2,
        format!("127.0.0.1:{PEER_PORT}"),
        true,
    ));
    probes.push((
        "control",
        "host".into(),
        &ctl1,
        format!("{strict_gw}:{HOST_PORT}"),
        true,
    ));
    probes.push((
        "strict",
        "host".into(),
        &s1,
        format!("{strict_gw}:{HOST_PORT}"),
        false,
    ));
    probes.push((
        "private",
        "host".into(),
        &p1,
        format!("{strict_gw}:{HOST_PORT}"),
        false,
    ));

    let docker = &env.docker;
    let started = std::time::Instant::now();
    let results: Vec<_> =
        futures_util::stream::iter(probes.iter().map(|(row, col, c, target, _)| {
            // Test-host probes carry a tag for the log; busybox httpd serves only its index.
            let url = if col == "peer" || col == "self" {
                format!("http://{target}/")
            } else {
                format!("http://{target}/{}-{col}", c.name)
            };
            async move { (*row, col.as_str(), probe(docker, &c.name, &url).await) }
        }))
        .buffered(PROBES_IN_FLIGHT)
        .collect()
        .await;
    eprintln!(
        "{} probes in {:.1}s",
        probes.len(),
        started.elapsed().as_secs_f64()
    );

    let mut table = format!("{:<36}answered  expected  wget\n", "from -> to");
    let mut wrong = Vec::new();
    for ((row, col, (got, detail)), (.., want)) in results.iter().zip(&probes) {
        let line = format!(
            "{:<36}{:<10}{:<10}{detail}\n",
            format!("{row} -> {col}"),
            if *got { "yes" } else { "no" },
            if *want { "yes" } else { "no" }
        );
        table.push_str(&line);
        if got != want {
            wrong.push(line.trim().to_owned());
        }
    }
    eprintln!(
        "probe matrix (timeout {PROBE_TIMEOUT_SECS} wget -q -O- http://<to>/<container>-<column>):\n{table}"
    );

    // What the test host saw: nothing from a blocked probe.
    let log = std::fs::read_to_string(&env.log).unwrap_or_default();
    let host_log = std::fs::read_to_string(&env.host_log).unwrap_or_default();
    eprintln!("test host log:\n{log}host listener log:\n{host_log}");
    for ((row, col, c, _, want), (.., (got, _))) in probes.iter().zip(&results) {
        let path = format!("/{}-{col}", c.name);
        let logged = log
            .lines()
            .chain(host_log.lines())
            .any(|l| l.ends_with(&path));
        if *col == "peer" || *col == "self" {
            continue;
        }
        assert_eq!(
            logged, *want,
            "{row} -> {col}: logged={logged}, answered={got}"
        );
    }
    assert!(
        wrong.is_empty(),
        "unexpected probe results:\n{}",
        wrong.join("\n")
    );

    // The LAN goes away: the next create converges the strict chain, the drop is deleted and
    // everything else stays.
    sh(&[
        "ip",
        "addr",
        "del",
        &format!("{}/24", env.lan_host_end()),
        "dev",
        &env.veth_host,
    ]);
    assert_eq!(
        env.guard.ensure(EgressPolicy::STRICT).await.unwrap(),
        strict
    );
    assert!(
        !has_rule(&strict_names.forward, &["-d", &lan_net, "-j", "DROP"]),
        "the drop of the vanished LAN {lan_net} is still in {}",
        strict_names.forward
    );
    assert!(has_rule(
        &strict_names.forward,
        &["-d", "168.63.129.16/32", "-j", "DROP"]
    ));
    check_rules_installed(env, &strict);

    // Removal refuses while containers are attached, and then changes nothing.
    let busy = env.guard.remove().await.unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Conflict, "{busy}");
    check_rules_installed(env, &strict);
    env.remove_containers().await;
    env.guard.remove().await.unwrap();
    let listing = sh(&["iptables", "-w", "-S"]);
    for net in [&strict, &private] {
        assert!(
            !listing.contains(&net.bridge),
            "{} left in iptables",
            net.bridge
        );
        assert!(env.docker.inspect_network(&net.name, None).await.is_err());
    }
    env.guard.remove().await.unwrap();

    // Start-up hygiene: chains whose network vanished behind the adapter's back go.
    let other = EgressGuard::new(env.docker.clone(), &format!("{}-o", env.namespace)).unwrap();
    let orphan = other.ensure(EgressPolicy::STRICT).await.unwrap();
    env.docker.remove_network(&orphan.name).await.unwrap();
    let removed = other.remove_orphans().await.unwrap();
    assert!(removed >= 2, "removed {removed} orphan chain(s)");
    assert!(!sh(&["iptables", "-w", "-S"]).contains(&orphan.bridge));
    other.remove().await.unwrap();

    // Fail closed: a namespace the adapter could never name things after is refused early.
    let bad = EgressGuard::new(env.docker.clone(), "Not_Valid").unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidRequest);
}

/// The jumps exist exactly once and match only the bridge; DNS to every upstream resolver is
/// exempt (the adapter's `egress` module docs, `src/egress/mod.rs`, say why that rule is needed
/// at all).
fn check_rules_installed(env: &Env, net: &EgressNetwork) {
    let names = env.guard.names(if net.name.ends_with("-private") {
        EgressPolicy::ALLOW_PRIVATE
    } else {
        EgressPolicy::STRICT
    });
    for (builtin, chain) in [("DOCKER-USER", &names.forward), ("INPUT", &names.input)] {
        let listing = sh(&["iptables", "-w", "-S", builtin]);
        let jumps: Vec<&str> = listing
            .lines()
            .filter(|l| l.ends_with(&format!("-j {chain}")))
            .collect();
        assert_eq!(jumps.len(), 1, "{builtin}: {jumps:?}");
        assert!(
            jumps[0].contains(&format!("-i {}", net.bridge)),
            "{}",
            jumps[0]
        );
    }
    for r in host_resolvers() {
        if let IpAddr::V4(v4) = r {
            if v4.is_loopback() {
                continue;
            }
            let dst = format!("{v4}/32");
            let status = Command::new("iptables")
                .args([
                    "-w",
                    "-C",
                    &names.forward,
                    "-d",
                    &dst,
                    "-p",
                    "udp",
                    "--dport",
                    "53",
                    "-j",
                    "RETURN",
                ])
                .status()
                .unwrap();
            assert!(
                status.success(),
                "no DNS exemption for {dst} in {}",
                names.forward
            );
        }
    }
}

/// Whether `chain` holds the rule `spec` (`iptables -C`).
fn has_rule(chain: &str, spec: &[&str]) -> bool {
    Command::new("iptables")
        .args(["-w", "-C", chain])
        .args(spec)
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Runs `wget` in the container: whether the body came back, and what happened.
async fn probe(docker: &Docker, container: &str, url: &str) -> (bool, String) {
    // `timeout 3 wget` rather than `wget -T 3`: the `-T` option of Debian 12's static busybox
    // (1.35.0) segfaults, even on a successful fetch.
    let cmd = vec![
        "timeout".to_owned(),
        PROBE_TIMEOUT_SECS.to_owned(),
        "wget".to_owned(),
        "-q".to_owned(),
        "-O-".to_owned(),
        url.to_owned(),
    ];
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(cmd),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut out = String::new();
    let run = async {
        if let StartExecResults::Attached { mut output, .. } =
            docker.start_exec(&exec.id, None).await.unwrap()
        {
            while let Some(Ok(chunk)) = output.next().await {
                out.push_str(&chunk.to_string());
            }
        }
    };
    // wget's own timeout ends a dropped connection; this one only guards the test itself.
    if tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .is_err()
    {
        return (false, "exec did not finish within 30s".into());
    }
    let code = docker.inspect_exec(&exec.id).await.unwrap().exit_code;
    let detail = format!("exit {code:?}: {}", out.trim().replace('\n', " | "));
    (code == Some(0) && out.contains("-ok"), detail)
}

async fn gateway(docker: &Docker, network: &str) -> String {
    let net = docker.inspect_network(network, None).await.unwrap();
    net.ipam
        .and_then(|i| i.config)
        .into_iter()
        .flatten()
        .find_map(|c| c.gateway.filter(|g| !g.contains(':')))
        .unwrap()
}

/// A test container: busybox with an HTTP server on [`PEER_PORT`], so a peer can try it.
#[derive(Debug)]
struct Ctr {
    name: String,
    ip: String,
}

/// Everything this run creates, so teardown knows exactly what to remove.
struct Env {
    docker: Docker,
    guard: EgressGuard,
    run: String,
    namespace: String,
    netns: String,
    veth_host: String,
    veth_peer: String,
    ctl_bridge: String,
    log: std::path::PathBuf,
    host_log: std::path::PathBuf,
    /// Pids of the test's servers, for xtask's netclean after a killed run.
    pids: std::path::PathBuf,
    private_net: [u8; 3],
    private_addr: Ipv4Addr,
    lan_net: [u8; 3],
    lan_addr: Ipv4Addr,
    containers: Vec<String>,
    networks: Vec<String>,
    children: Vec<Child>,
    torn_down: bool,
}

impl Env {
    fn new(docker: Docker) -> Self {
        let run = format!("{:06x}", fastrand::u32(..0x0100_0000));
        let namespace = format!("sbxt-{run}");
        let tmp = std::env::temp_dir();
        Env {
            guard: EgressGuard::new(docker.clone(), &namespace).unwrap(),
            docker,
            netns: namespace.clone(),
            veth_host: format!("sbxt{run}h"),
            veth_peer: format!("sbxt{run}p"),
            ctl_bridge: format!("sbxt{run}c"),
            log: tmp.join(format!("sbxt-{run}.log")),
            host_log: tmp.join(format!("sbxt-{run}-host.log")),
            pids: tmp.join(format!("sbxt-{run}.pids")),
            namespace,
            run,
            private_net: PRIVATE_NETS[0],
            private_addr: Ipv4Addr::UNSPECIFIED,
            lan_net: LAN_NETS[0],
            lan_addr: Ipv4Addr::UNSPECIFIED,
            containers: Vec::new(),
            networks: Vec::new(),
            children: Vec::new(),
            torn_down: false,
        }
    }

    /// The private /24 must be foreign to this machine: no address in it, no route into it
    /// but the default one.
    fn pick_addresses(&mut self) {
        let addrs = sh(&["ip", "-4", "-o", "addr", "show"]);
        let routes = sh(&["ip", "-4", "route", "show", "table", "all"]);
        let used: Vec<(u32, u32)> = addrs
            .split_whitespace()
            .chain(routes.split_whitespace())
            .filter_map(cidr)
            .collect();
        let in_use = |a: Ipv4Addr| {
            used.iter()
                .any(|(base, mask)| *mask != 0 && u32::from(a) & mask == *base)
        };
        let net = PRIVATE_NETS
            .into_iter()
            .find(|n| !in_use(Ipv4Addr::new(n[0], n[1], n[2], 7)))
            .expect("every candidate private test /24 is in use on this machine");
        self.private_net = net;
        self.private_addr = Ipv4Addr::new(net[0], net[1], net[2], 7);
        let lan = LAN_NETS
            .into_iter()
            .find(|[a, b, c]| {
                !in_use(Ipv4Addr::new(*a, *b, *c, 1)) && !in_use(Ipv4Addr::new(*a, *b, *c, 7))
            })
            .expect("every candidate test LAN /24 is in use on this machine");
        self.lan_net = lan;
        self.lan_addr = Ipv4Addr::new(lan[0], lan[1], lan[2], 7);
        for a in probe_addresses() {
            assert!(
                !in_use(a),
                "{a} is routed or assigned on this machine; the test would not be hermetic"
            );
        }
        let rp = std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter").unwrap();
        assert_ne!(
            rp.trim(),
            "1",
            "strict reverse-path filtering (net.ipv4.conf.all.rp_filter=1) would drop the test \
             host's replies, and the test does not change global sysctls"
        );
    }

    /// The test LAN, `a.b.c.0/24`.
    fn lan_cidr(&self) -> String {
        let [a, b, c] = self.lan_net;
        format!("{a}.{b}.{c}.0/24")
    }

    /// The host's address on the test LAN.
    fn lan_host_end(&self) -> Ipv4Addr {
        let [a, b, c] = self.lan_net;
        Ipv4Addr::new(a, b, c, 1)
    }

    /// The test host: a netns behind a veth, holding the probe addresses, and the host's
    /// connected route into the test LAN through that veth.
    fn test_host(&mut self) {
        let [a, b, c] = self.private_net;
        let host_end = format!("{a}.{b}.{c}.1");
        let peer_end = format!("{a}.{b}.{c}.2");
        let private = self.private_addr.to_string();
        let (ns, h, p) = (&self.netns, &self.veth_host, &self.veth_peer);
        sh(&["ip", "netns", "add", ns]);
        sh(&["ip", "link", "add", h, "type", "veth", "peer", "name", p]);
        sh(&["ip", "link", "set", p, "netns", ns]);
        // A /32 without a prefix route: the main table stays exactly as it was. The address is
        // only the source Docker's masquerade gives the diverted probes.
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{host_end}/32"),
            "dev",
            h,
            "noprefixroute",
        ]);
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{h}/rp_filter"), "0").unwrap();
        sh(&["ip", "link", "set", h, "up"]);
        // The host LAN: a /24 with its kernel route in the main table, the one route the test
        // adds there. Nothing leaves: the route ends in the test's own netns.
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.lan_host_end()),
            "dev",
            h,
        ]);
        let in_ns = |args: &[&str]| {
            let mut full = vec!["ip", "netns", "exec", ns];
            full.extend_from_slice(args);
            sh(&full);
        };
        in_ns(&["ip", "link", "set", "lo", "up"]);
        in_ns(&["ip", "link", "set", p, "up"]);
        in_ns(&["ip", "addr", "add", &format!("{peer_end}/32"), "dev", p]);
        let served: Vec<String> = probe_addresses()
            .map(|a| a.to_string())
            .chain([private.clone(), self.lan_addr.to_string()])
            .collect();
        for addr in &served {
            in_ns(&["ip", "addr", "add", &format!("{addr}/32"), "dev", "lo"]);
        }
        in_ns(&["ip", "route", "add", &format!("{host_end}/32"), "dev", p]);
        in_ns(&["ip", "route", "add", "default", "via", &host_end, "dev", p]);
        for addr in &served {
            sh(&[
                "ip",
                "route",
                "add",
                &format!("{addr}/32"),
                "dev",
                h,
                "table",
                TABLE,
            ]);
        }
        sh(&[
            "ip",
            "route",
            "add",
            "unreachable",
            "default",
            "table",
            TABLE,
        ]);

        let log = self.log.to_string_lossy().into_owned();
        let child = spawn_server(
            &["ip", "netns", "exec", ns, "python3", "-c", TEST_HOST],
            &[&log, "0.0.0.0", &HTTP_PORT.to_string()],
        );
        self.record(child);
    }

    fn record(&mut self, child: Child) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.pids)
            .unwrap();
        writeln!(f, "{}", child.id()).unwrap();
        self.children.push(child);
    }

    /// A listener on the host itself (root namespace), on the strict network's gateway
    /// address only, so it is not exposed on the machine's real interfaces.
    fn host_listener(&mut self, addr: &str) {
        let log = self.host_log.to_string_lossy().into_owned();
        let child = spawn_server(
            &["python3", "-c", TEST_HOST],
            &[&log, addr, &HOST_PORT.to_string()],
        );
        self.record(child);
    }

    async fn container(&mut self, role: &str, network: &str) -> Ctr {
        let name = format!("sbxt-{}-{role}", self.run);
        self.containers.push(name.clone());
        let script = format!(
            "mkdir -p /www && echo peer-ok > /www/index.html && httpd -p {PEER_PORT} -h /www \
             && exec sleep 900"
        );
        self.docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                ContainerCreateBody {
                    image: Some(IMAGE.into()),
                    cmd: Some(vec!["sh".into(), "-c".into(), script]),
                    labels: Some(HashMap::from([(TEST_LABEL.into(), "1".into())])),
                    host_config: Some(HostConfig {
                        network_mode: Some(network.into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        self.docker.start_container(&name, None).await.unwrap();
        let info = self.docker.inspect_container(&name, None).await.unwrap();
        let ip = info
            .network_settings
            .and_then(|s| s.networks)
            .and_then(|mut n| n.remove(network))
            .and_then(|e| e.ip_address)
            .filter(|ip| !ip.is_empty())
            .unwrap();
        Ctr { name, ip }
    }

    async fn remove_containers(&mut self) {
        for name in std::mem::take(&mut self.containers) {
            let opts = RemoveContainerOptionsBuilder::default().force(true).build();
            let _ = self.docker.remove_container(&name, Some(opts)).await;
        }
    }

    /// Removes everything this run created; tolerant of what is already gone.
    fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if !self.containers.is_empty() {
            let mut rm = Command::new("docker");
            rm.args(["rm", "-f"]).args(&self.containers);
            let _ = quiet(&mut rm);
        }
        // The guard's own removal (networks, jumps, chains), on a runtime of its own: this
        // also runs from Drop, outside any async context.
        let guards = [
            self.guard.clone(),
            EgressGuard::new(self.docker.clone(), &format!("{}-o", self.namespace)).unwrap(),
        ];
        let removal = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                for g in guards {
                    if let Err(e) = g.remove().await {
                        eprintln!("teardown: {e}");
                    }
                }
            });
        });
        let _ = removal.join();
        for net in &self.networks {
            let _ = quiet(Command::new("docker").args(["network", "rm", net]));
        }
        clear_table();
        let _ = quiet(Command::new("ip").args(["netns", "del", &self.netns]));
        let _ = quiet(Command::new("ip").args(["link", "del", &self.veth_host]));
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(&self.host_log);
        let _ = std::fs::remove_file(&self.pids);
    }

    /// After teardown: nothing of this run is left in the places the issue lists.
    fn assert_gone(&self) {
        let netns = sh(&["ip", "netns", "list"]);
        assert!(!netns.contains(&self.netns), "netns left: {netns}");
        let rules = sh(&["ip", "rule", "list"]);
        assert!(
            !rules.contains(&format!("lookup {TABLE}")),
            "ip rules left: {rules}"
        );
        let links = sh(&["ip", "-o", "link", "show"]);
        assert!(
            !links.contains(&format!("sbxt{}", self.run)),
            "links left: {links}"
        );
        let ipt = sh(&["iptables", "-w", "-S"]);
        assert!(
            !ipt.contains(&format!("sbx:{}", self.namespace)),
            "rules left: {ipt}"
        );
        let nets = sh(&["docker", "network", "ls", "--format", "{{.Name}}"]);
        assert!(!nets.contains(&self.run), "networks left: {nets}");
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The fixed probe addresses the test host holds: every IPv4 address of the metadata table and
/// the public stand-in.
fn probe_addresses() -> impl Iterator<Item = Ipv4Addr> {
    metadata_v4().chain([ALLOWED.parse().unwrap()])
}

/// The main routing table, without the `linkdown` flag a bridge gains and loses as
/// containers come and go.
fn main_table() -> String {
    sh(&["ip", "route", "show", "table", "main"])
        .lines()
        .map(|l| l.replace(" linkdown", "").trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Deletes every `ip rule` that looks up the test table, and the table's routes. Both are the
/// test's alone (the table number is reserved for it).
fn clear_table() {
    for _ in 0..64 {
        if quiet(Command::new("ip").args(["rule", "del", "table", TABLE])).is_err() {
            break;
        }
    }
    let _ = quiet(Command::new("ip").args(["route", "flush", "table", TABLE]));
}

/// Starts a Python server and waits for its `ready` line.
fn spawn_server(cmd: &[&str], args: &[&str]) -> Child {
    let mut child = Command::new(cmd[0])
        .args(&cmd[1..])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(line) if line.trim() == "ready" => child,
        other => {
            let _ = child.kill();
            panic!("test server {cmd:?} {args:?} did not start: {other:?}");
        }
    }
}

fn prerequisites() {
    let uid = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("Uid:")
                .map(|r| r.split_whitespace().next().unwrap_or("").to_owned())
        });
    assert_eq!(
        uid.as_deref(),
        Some("0"),
        "{GATE}=1 but not root: the egress test creates network namespaces and iptables rules"
    );
    for (tool, arg) in [
        ("iptables", "-V"),
        ("ip", "-V"),
        ("python3", "-V"),
        ("docker", "version"),
    ] {
        if let Err(e) = quiet(Command::new(tool).arg(arg)) {
            panic!("{GATE}=1 but `{tool} {arg}` does not work: {e}");
        }
    }
}

/// Runs a setup command; any failure fails the test with the command's stderr.
fn sh(args: &[&str]) -> String {
    quiet(Command::new(args[0]).args(&args[1..]))
        .unwrap_or_else(|e| panic!("`{}` failed: {e}", args.join(" ")))
}

fn quiet(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `a.b.c.d/len` (or a bare address) → (network, mask).
fn cidr(word: &str) -> Option<(u32, u32)> {
    let (addr, len) = word.split_once('/').unwrap_or((word, "32"));
    let addr: Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Some((u32::from(addr) & mask, mask))
}
