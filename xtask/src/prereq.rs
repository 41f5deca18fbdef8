//! Prerequisites: the tools the pipeline needs, how to tell they are there, and how to get them.
//!
//! One table, so a later service is one more line.

use std::path::Path;
use std::time::Duration;

use crate::process::{self, Output};

/// What a prerequisite makes possible; stages and services name the tools they need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tool {
    /// The Docker client and daemon.
    Docker,
    /// A static busybox, the only file of the test image.
    Busybox,
    Nextest,
    Rustfmt,
    Clippy,
    /// Debian's `docker-registry`, served on 127.0.0.1 by the Docker adapter's pull test.
    Registry,
    /// iptables and iproute2, for the Docker adapter's egress rules and its network test.
    NetTools,
    /// `redis-server` and `redis-cli`: the loopback Redis servers and cluster of the Redis store's
    /// tests.
    Redis,
    /// Static glibc (`libc.a`), which the static link of `sandbox-agent` needs.
    StaticLibc,
    /// `debootstrap`: the root filesystem of the Debian sandbox image.
    Debootstrap,
    /// `python3` with its `venv` module: the venv of the official E2B Python SDK.
    Python,
    /// `node` and `npm`: the official E2B JS SDK, installed with `npm ci`.
    Node,
}

/// How to tell a prerequisite is present.
#[derive(Clone, Copy, Debug)]
pub enum Probe {
    /// An executable on `PATH` (or in an sbin directory).
    Executable(&'static str),
    /// A file at a fixed path.
    File(&'static str),
    /// `cargo <subcommand> --version` succeeds.
    CargoSubcommand(&'static str),
}

/// How to get a missing prerequisite.
#[derive(Clone, Copy, Debug)]
pub enum Install {
    /// A Debian package (installed automatically when root and apt-get are available).
    Apt(&'static str),
    /// `cargo install <crate> --locked` (run automatically).
    CargoInstall(&'static str),
    /// A rustup component: only named, since toolchains cannot be fetched from every machine.
    RustupComponent(&'static str),
}

impl Install {
    /// The command a person would type.
    pub fn hint(self) -> String {
        match self {
            Self::Apt(pkg) => format!("apt-get install {pkg}"),
            Self::CargoInstall(krate) => format!("cargo install {krate} --locked"),
            Self::RustupComponent(c) => format!("rustup component add {c}"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Prerequisite {
    pub tool: Tool,
    /// Shown in messages.
    pub what: &'static str,
    pub probe: Probe,
    pub install: Install,
    /// Why the pipeline needs it.
    pub reason: &'static str,
}

/// Everything `cargo xtask test` may need. Add a line per new tool.
pub const PREREQUISITES: &[Prerequisite] = &[
    Prerequisite {
        tool: Tool::Docker,
        what: "docker",
        probe: Probe::Executable("docker"),
        install: Install::Apt("docker.io"),
        reason: "the Docker client: builds the test image and talks to the engine",
    },
    Prerequisite {
        tool: Tool::Docker,
        what: "dockerd",
        probe: Probe::Executable("dockerd"),
        install: Install::Apt("docker.io"),
        reason: "the Docker engine, started by xtask when none is running",
    },
    Prerequisite {
        tool: Tool::Busybox,
        what: "/bin/busybox",
        probe: Probe::File("/bin/busybox"),
        install: Install::Apt("busybox-static"),
        reason: "a static busybox is the whole sandbox-busybox:test image (FROM scratch, no registry)",
    },
    Prerequisite {
        tool: Tool::Nextest,
        what: "cargo nextest",
        probe: Probe::CargoSubcommand("nextest"),
        install: Install::CargoInstall("cargo-nextest"),
        reason: "runs the hermetic and conformance suites with deadlines and JUnit reports",
    },
    Prerequisite {
        tool: Tool::Rustfmt,
        what: "cargo fmt",
        probe: Probe::CargoSubcommand("fmt"),
        install: Install::RustupComponent("rustfmt"),
        reason: "the fmt stage",
    },
    Prerequisite {
        tool: Tool::Clippy,
        what: "cargo clippy",
        probe: Probe::CargoSubcommand("clippy"),
        install: Install::RustupComponent("clippy"),
        reason: "the clippy stage",
    },
    Prerequisite {
        tool: Tool::Registry,
        what: "docker-registry",
        probe: Probe::Executable("docker-registry"),
        install: Install::Apt("docker-registry"),
        reason: "a registry on 127.0.0.1 for the Docker adapter's pull test (never a public registry)",
    },
    Prerequisite {
        tool: Tool::NetTools,
        what: "iptables",
        probe: Probe::Executable("iptables"),
        install: Install::Apt("iptables"),
        reason: "the Docker adapter's egress chains",
    },
    Prerequisite {
        tool: Tool::NetTools,
        what: "ip",
        probe: Probe::Executable("ip"),
        install: Install::Apt("iproute2"),
        reason: "network namespaces and policy routing of the egress test",
    },
    Prerequisite {
        tool: Tool::Redis,
        what: "redis-server",
        probe: Probe::Executable("redis-server"),
        install: Install::Apt("redis-server"),
        reason: "the Redis store's tests: a server and a 3-node cluster on 127.0.0.1, started by xtask",
    },
    Prerequisite {
        tool: Tool::Redis,
        what: "redis-cli",
        probe: Probe::Executable("redis-cli"),
        // Debian's redis-server depends on redis-tools, which holds redis-cli.
        install: Install::Apt("redis-server"),
        reason: "xtask's readiness probes and `redis-cli --cluster create`",
    },
    Prerequisite {
        tool: Tool::StaticLibc,
        what: "libc.a",
        probe: Probe::File(crate::agent_build::STATIC_LIBC),
        install: Install::Apt("libc6-dev"),
        reason: "static glibc for the static link of sandbox-agent (+crt-static)",
    },
    Prerequisite {
        tool: Tool::Debootstrap,
        what: "debootstrap",
        probe: Probe::Executable("debootstrap"),
        install: Install::Apt("debootstrap"),
        reason: "the root filesystem of the Debian sandbox image, from the machine's apt mirror",
    },
    Prerequisite {
        tool: Tool::Python,
        what: "python3",
        probe: Probe::Executable("python3"),
        // Debian's python3 has no `venv` without it; it depends on python3 itself.
        install: Install::Apt("python3-venv"),
        reason: "the venv that holds the official E2B Python SDK from its hashed lock",
    },
    Prerequisite {
        tool: Tool::Node,
        what: "node",
        probe: Probe::Executable("node"),
        // NodeSource's nodejs (20.18.1+; it carries npm): Debian 12's own is 18, which the
        // SDK's engines refuse (`cargo xtask js-sdk` checks the version and says so).
        install: Install::Apt("nodejs"),
        reason: "the official E2B JS SDK's scenario (Node 20.18.1+ or 22+)",
    },
    Prerequisite {
        tool: Tool::Node,
        what: "npm",
        probe: Probe::Executable("npm"),
        install: Install::Apt("nodejs"),
        reason: "npm ci of the official E2B JS SDK from its committed lock",
    },
];

/// The prerequisites for `tools`.
pub fn for_tools(tools: &[Tool]) -> Vec<&'static Prerequisite> {
    PREREQUISITES
        .iter()
        .filter(|p| tools.contains(&p.tool))
        .collect()
}

const PROBE_DEADLINE: Duration = Duration::from_secs(60);

/// Whether `p` is present. `cargo` is the cargo to ask about subcommands.
pub fn present(p: &Prerequisite, cargo: &Path) -> bool {
    match p.probe {
        Probe::Executable(name) => process::find_executable(name).is_some(),
        Probe::File(path) => Path::new(path).is_file(),
        Probe::CargoSubcommand(sub) => {
            let mut cmd = process::command(cargo, [sub, "--version"]);
            process::run_with_deadline(&mut cmd, PROBE_DEADLINE, Output::Capture)
                .is_ok_and(|o| o.success())
        }
    }
}

/// The distinct Debian packages among `missing`, in table order.
pub fn apt_packages(missing: &[&Prerequisite]) -> Vec<&'static str> {
    let mut pkgs = Vec::new();
    for p in missing {
        if let Install::Apt(pkg) = p.install
            && !pkgs.contains(&pkg)
        {
            pkgs.push(pkg);
        }
    }
    pkgs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_packages_are_deduplicated() {
        let missing = for_tools(&[Tool::Docker, Tool::Busybox, Tool::Nextest]);
        assert_eq!(missing.len(), 4);
        assert_eq!(apt_packages(&missing), vec!["docker.io", "busybox-static"]);
    }

    #[test]
    fn redis_is_one_debian_package_for_both_binaries() {
        let missing = for_tools(&[Tool::Redis]);
        let names: Vec<&str> = missing.iter().map(|p| p.what).collect();
        assert_eq!(names, vec!["redis-server", "redis-cli"]);
        assert_eq!(apt_packages(&missing), vec!["redis-server"]);
    }

    #[test]
    fn every_tool_has_a_prerequisite() {
        for tool in [
            Tool::Docker,
            Tool::Busybox,
            Tool::Nextest,
            Tool::Rustfmt,
            Tool::Clippy,
            Tool::Registry,
            Tool::NetTools,
            Tool::Redis,
            Tool::StaticLibc,
            Tool::Debootstrap,
            Tool::Python,
            Tool::Node,
        ] {
            assert!(!for_tools(&[tool]).is_empty(), "{tool:?}");
        }
    }

    #[test]
    fn hints_name_the_command() {
        assert_eq!(
            Install::Apt("busybox-static").hint(),
            "apt-get install busybox-static"
        );
        assert_eq!(
            Install::CargoInstall("cargo-nextest").hint(),
            "cargo install cargo-nextest --locked"
        );
    }
}
