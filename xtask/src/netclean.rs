//! Removes the network state the Docker adapter's egress test leaves behind when it is killed
//! (`crates/sandbox-provider-docker/tests/it/egress.rs`): its network namespaces and the servers
//! in them, its veths, its policy-routing rules and table, its Docker containers and networks,
//! and the adapter's `SBX-*` chains of test namespaces.
//!
//! Idempotent, and it only ever touches what carries the test's marks: netns, veths and temp
//! files named [`PREFIX`]…, containers and control networks that are both labelled
//! [`TEST_LABEL`] and named `sbxt-…`, routing table [`TABLE`], and adapter networks and chains
//! whose namespace starts with [`NAMESPACE_PREFIX`]. Nothing else is listed for deletion, so it
//! is safe on a machine with real sandboxes or with another suite's test containers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sandbox_iptables_listing::{chains_owned_by, jumps_to};

use crate::process::{self, Output};

/// Every netns, veth, container, network and temp file of the egress test starts with this.
pub const PREFIX: &str = "sbxt";
/// The adapter namespaces the egress test uses (`sbxt-<run>`).
pub const NAMESPACE_PREFIX: &str = "sbxt-";
/// The label on the test's containers and on its unprotected control network.
pub const TEST_LABEL: &str = "sandbox.test=1";
/// The policy-routing table the egress test diverts its bridges to (reserved for it).
pub const TABLE: &str = "7913";

const STEP_DEADLINE: Duration = Duration::from_secs(60);
/// `ip rule del` removes one rule per call; a run adds three.
const MAX_RULES: usize = 64;

/// What a cleanup did and what it could not do.
#[derive(Debug, Default)]
pub struct Report {
    /// One line per thing removed, for the log.
    pub removed: Vec<String>,
    /// One line per failure; the rest still ran.
    pub problems: Vec<String>,
}

/// Removes every leftover of the egress test. `docker` says whether the engine is up (the
/// Docker steps are skipped otherwise); the kernel steps need root and are skipped without it
/// (the test cannot have created anything then).
pub fn clean(docker: bool) -> Report {
    let mut r = Report::default();
    kill_recorded_servers(&mut r, &std::env::temp_dir());
    if docker {
        docker_leftovers(&mut r);
    }
    if process::is_root() {
        netns_leftovers(&mut r);
        for program in ["iptables", "ip6tables"] {
            if process::find_executable(program).is_some() {
                chain_leftovers(&mut r, program);
            }
        }
        routing_leftovers(&mut r);
        veth_leftovers(&mut r);
    }
    temp_leftovers(&mut r, &std::env::temp_dir());
    r
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let mut cmd = process::command(program, args);
    if program == "docker" {
        cmd.env_remove("DOCKER_HOST");
    }
    run_cmd(cmd)
}

fn run_cmd(mut cmd: Command) -> Result<String, String> {
    let out = process::run_with_deadline(&mut cmd, STEP_DEADLINE, Output::Capture)?;
    out.check()?;
    Ok(out.stdout)
}

/// Runs a deletion, recording it as removed or as a problem.
fn remove(r: &mut Report, what: String, program: &str, args: &[&str]) {
    match run(program, args) {
        Ok(_) => r.removed.push(what),
        Err(e) => r.problems.push(format!("cannot remove {what}: {e}")),
    }
}

/// The test records the pids of its Python servers in `sbxt-<run>.pids`; a killed test leaves
/// them running (they also exit by themselves after 15 minutes).
fn kill_recorded_servers(r: &mut Report, tmp: &Path) {
    for file in test_files(tmp).into_iter().filter(|f| f.ends_with(".pids")) {
        let text = std::fs::read_to_string(tmp.join(&file)).unwrap_or_default();
        for pid in text
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            // Only a process that is still the test's server: pids are reused.
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if is_test_server(&String::from_utf8_lossy(&cmdline)) {
                match process::send_signal(pid, "KILL") {
                    Ok(()) => r.removed.push(format!("test server pid {pid}")),
                    Err(e) => r.problems.push(e),
                }
            }
        }
    }
}

/// A `/proc/<pid>/cmdline` (NUL-separated) of one of the test's Python servers.
pub fn is_test_server(cmdline: &str) -> bool {
    let args: Vec<&str> = cmdline.split('\0').collect();
    args.iter().any(|a| a.ends_with("python3"))
        && args.iter().any(|a| {
            Path::new(a)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(NAMESPACE_PREFIX) && n.ends_with(".log"))
        })
}

fn docker_leftovers(r: &mut Report) {
    // Both marks: the label alone is shared with the conformance and engine suites, whose
    // containers (of another run, maybe still going) are not ours to remove here.
    let label = format!("label={TEST_LABEL}");
    match run(
        "docker",
        &["ps", "-a", "--filter", &label, "--format", "{{.Names}}"],
    ) {
        Ok(out) => {
            let names = prefixed(&out);
            if !names.is_empty() {
                let mut args = vec!["rm", "-f"];
                args.extend(names.iter().map(String::as_str));
                remove(
                    r,
                    format!("test containers {}", names.join(" ")),
                    "docker",
                    &args,
                );
            }
        }
        Err(e) => r.problems.push(format!("cannot list test containers: {e}")),
    }
    // The adapter's networks of test namespaces first (they may hold the test's containers'
    // endpoints), then the test's own control networks.
    let format = "{{.Name}}\t{{.Label \"sandbox.namespace\"}}";
    match run(
        "docker",
        &[
            "network",
            "ls",
            "--filter",
            "label=sandbox.managed=true",
            "--format",
            format,
        ],
    ) {
        Ok(out) => {
            for name in test_adapter_networks(&out) {
                remove(
                    r,
                    format!("network {name}"),
                    "docker",
                    &["network", "rm", &name],
                );
            }
        }
        Err(e) => r
            .problems
            .push(format!("cannot list adapter networks: {e}")),
    }
    match run(
        "docker",
        &["network", "ls", "--filter", &label, "--format", "{{.Name}}"],
    ) {
        Ok(out) => {
            for name in prefixed(&out) {
                remove(
                    r,
                    format!("network {name}"),
                    "docker",
                    &["network", "rm", &name],
                );
            }
        }
        Err(e) => r.problems.push(format!("cannot list test networks: {e}")),
    }
}

/// The names of a one-name-per-line listing that start with `sbxt-`.
pub fn prefixed(listing: &str) -> Vec<String> {
    listing
        .split_whitespace()
        .filter(|n| n.starts_with(NAMESPACE_PREFIX))
        .map(str::to_owned)
        .collect()
}

/// Names from `docker network ls --format '{{.Name}}\t{{.Label "sandbox.namespace"}}'` whose
/// namespace is a test namespace.
pub fn test_adapter_networks(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, ns)| ns.trim().starts_with(NAMESPACE_PREFIX))
        .map(|(name, _)| name.trim().to_owned())
        .collect()
}

fn netns_leftovers(r: &mut Report) {
    let list = match run("ip", &["netns", "list"]) {
        Ok(out) => out,
        Err(e) => {
            return r
                .problems
                .push(format!("cannot list network namespaces: {e}"));
        }
    };
    for ns in test_netns(&list) {
        // Processes keep a deleted namespace alive: end the test's servers in it first.
        if let Ok(pids) = run("ip", &["netns", "pids", &ns]) {
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
            {
                if let Err(e) = process::send_signal(pid, "KILL") {
                    r.problems.push(e);
                }
            }
        }
        remove(r, format!("netns {ns}"), "ip", &["netns", "del", &ns]);
    }
}

/// Test namespaces from `ip netns list` (lines like `sbxt-1a2b3c (id: 0)`).
pub fn test_netns(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(NAMESPACE_PREFIX))
        .map(str::to_owned)
        .collect()
}

fn chain_leftovers(r: &mut Report, program: &str) {
    let listing = match run(program, &["-w", "-S"]) {
        Ok(out) => out,
        Err(e) => return r.problems.push(format!("cannot list {program} rules: {e}")),
    };
    // The chain names and the listing's grammar are the adapter's own, read with the adapter's
    // reader, so this cleanup takes exactly the chains the adapter would call its own.
    for chain in chains_owned_by(&listing, NAMESPACE_PREFIX) {
        for jump in jumps_to(&listing, &chain) {
            let mut args = vec!["-w", "-D"];
            args.extend(jump.iter().skip(1).map(String::as_str));
            remove(r, format!("{program} jump to {chain}"), program, &args);
        }
        remove(
            r,
            format!("{program} rules of {chain}"),
            program,
            &["-w", "-F", &chain],
        );
        remove(
            r,
            format!("{program} chain {chain}"),
            program,
            &["-w", "-X", &chain],
        );
    }
}

fn routing_leftovers(r: &mut Report) {
    let rules = run("ip", &["rule", "list"]).unwrap_or_default();
    let count = rules_for_table(&rules);
    for _ in 0..count.min(MAX_RULES) {
        remove(
            r,
            format!("ip rule looking up table {TABLE}"),
            "ip",
            &["rule", "del", "table", TABLE],
        );
    }
    let routes = run("ip", &["route", "show", "table", TABLE]).unwrap_or_default();
    if !routes.trim().is_empty() {
        remove(
            r,
            format!("routes of table {TABLE}"),
            "ip",
            &["route", "flush", "table", TABLE],
        );
    }
}

/// How many rules of `ip rule list` look up the test table.
pub fn rules_for_table(listing: &str) -> usize {
    listing
        .lines()
        .filter(|l| l.split_whitespace().skip_while(|w| *w != "lookup").nth(1) == Some(TABLE))
        .count()
}

fn veth_leftovers(r: &mut Report) {
    let list = run("ip", &["-o", "link", "show", "type", "veth"]).unwrap_or_default();
    for name in test_veths(&list) {
        remove(r, format!("veth {name}"), "ip", &["link", "del", &name]);
    }
}

/// Test veths from `ip -o link show type veth` (`7: sbxt1a2b3ch@if6: <...> ...`).
pub fn test_veths(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n))
        .filter(|n| n.starts_with(PREFIX))
        .map(str::to_owned)
        .collect()
}

fn temp_leftovers(r: &mut Report, tmp: &Path) {
    for file in test_files(tmp) {
        let path: PathBuf = tmp.join(&file);
        match std::fs::remove_file(&path) {
            Ok(()) => r.removed.push(format!("{}", path.display())),
            Err(e) => r
                .problems
                .push(format!("cannot remove {}: {e}", path.display())),
        }
    }
}

/// The test's log and pid files in `tmp` (`sbxt-<run>.log`, `sbxt-<run>-host.log`,
/// `sbxt-<run>.pids`).
fn test_files(tmp: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(tmp) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.starts_with(NAMESPACE_PREFIX) && (n.ends_with(".log") || n.ends_with(".pids"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_netns_veths_rules_and_networks() {
        assert_eq!(
            test_netns("sbxt-1a2b3c (id: 0)\nprod-ns\nsbxt-ffffff\n"),
            ["sbxt-1a2b3c", "sbxt-ffffff"]
        );
        let links = "7: sbxt1a2b3ch@if6: <BROADCAST,MULTICAST,UP> mtu 1500\n\
                     9: veth12ab@if8: <BROADCAST> mtu 1500\n";
        assert_eq!(test_veths(links), ["sbxt1a2b3ch"]);
        let rules = "0:\tfrom all lookup local\n7913:\tfrom all iif sbx1 lookup 7913\n\
                     7913:\tfrom all iif sbx2 lookup 7913\n8000:\tfrom all lookup 79130\n\
                     32766:\tfrom all lookup main\n";
        assert_eq!(rules_for_table(rules), 2);
        assert_eq!(
            prefixed("sbxt-1a2b3c-s1\nsbx-bench-1-abc\nsbxt-ctl-1a2b3c\n"),
            ["sbxt-1a2b3c-s1", "sbxt-ctl-1a2b3c"]
        );
        assert_eq!(
            test_adapter_networks("sbx-sbxt-1a2b3c-strict\tsbxt-1a2b3c\nsbx-prod-strict\tprod\n"),
            ["sbx-sbxt-1a2b3c-strict"]
        );
    }

    #[test]
    fn recognises_only_the_test_servers() {
        assert!(is_test_server(
            &[
                "ip",
                "netns",
                "exec",
                "sbxt-1",
                "python3",
                "-c",
                "...",
                "/tmp/sbxt-1a2b3c.log",
                "0.0.0.0",
                "8080"
            ]
            .join("\0")
        ));
        assert!(is_test_server(
            &[
                "python3",
                "-c",
                "...",
                "/tmp/sbxt-1a2b3c-host.log",
                "172.18.0.1",
                "8081"
            ]
            .join("\0")
        ));
        assert!(!is_test_server("python3\0-m\0http.server\0"));
        assert!(!is_test_server("sleep\0/tmp/sbxt-1.log\0"));
    }
}
