//! The conformance registry and the judgement of one adapter's run.
//!
//! The suite itself lives in `sandbox-testkit`. Its test binary, given
//! `SANDBOX_CONFORMANCE_ADAPTER`, registers only the cases the adapter's declared capabilities
//! make applicable; given also `SANDBOX_CONFORMANCE_DESCRIBE=<path>`, it writes the full case list
//! (applicable or not, and why) to `<path>` instead of running. Comparing that list with nextest's
//! JUnit report is how a case that silently disappeared is caught.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::junit::{Counts, Status, TestCase};
use crate::prereq::Tool;
use crate::redis;

pub const ENV_ADAPTER: &str = "SANDBOX_CONFORMANCE_ADAPTER";
pub const ENV_DESCRIBE: &str = "SANDBOX_CONFORMANCE_DESCRIBE";
/// Which topology the `redis` adapter's binary connects to: `standalone` (through
/// `SANDBOX_TEST_REDIS_URL`) or `cluster` (through `SANDBOX_TEST_REDIS_CLUSTER_NODES`).
pub const ENV_REDIS_TOPOLOGY: &str = "SANDBOX_REDIS_TOPOLOGY";
/// The Docker adapter's data plane in its conformance run (`exec` or `agent`), as the service's
/// environment names it; the agent run finds the agent through `SANDBOX_AGENT_BIN`.
pub const ENV_DOCKER_DATA_PLANE: &str = "SANDBOX_DOCKER_DATA_PLANE";

/// The nextest profile conformance runs use (see `.config/nextest.toml`).
pub const NEXTEST_PROFILE: &str = "conformance";

/// A service an adapter's suite needs running before it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// A Docker engine answering on the default socket.
    DockerEngine,
    /// The local `sandbox-busybox:test` image (needs the engine).
    TestImage,
    /// A standalone `redis-server` on a free 127.0.0.1 port.
    Redis,
    /// A Redis Cluster of three primaries on free 127.0.0.1 ports.
    RedisCluster,
    /// The Debian sandbox image (`sandbox-debian:<recipe hash>`, see `debian_image`), built
    /// with debootstrap when missing and kept: its tag changes only with its recipe.
    DebianImage,
    /// The venv holding the official E2B Python SDK from its hashed lock (see `e2b_sdk`).
    SdkVenv,
    /// The venv of the older E2B Python SDK (2.45.1) from its own hashed lock.
    SdkVenvOlder,
    /// The venv of Schemathesis (4.32.5), the OpenAPI fuzzer, from its own hashed lock.
    SchemathesisVenv,
    /// The E2B JS SDK installed by `npm ci` from its committed lock (see `js_sdk`).
    JsSdk,
    /// The static `sandbox-agent` (`agent_build`), built and checked; Docker's agent-mode run
    /// installs it in every container.
    Agent,
}

impl Service {
    pub fn name(self) -> &'static str {
        match self {
            Self::DockerEngine => "Docker engine",
            Self::TestImage => "test image sandbox-busybox:test",
            Self::Redis => "Redis server",
            Self::RedisCluster => "Redis Cluster",
            Self::DebianImage => "Debian sandbox image",
            Self::SdkVenv => "E2B Python SDK venv",
            Self::SdkVenvOlder => "older E2B Python SDK venv",
            Self::SchemathesisVenv => "schemathesis venv",
            Self::JsSdk => "E2B JS SDK install",
            Self::Agent => "static sandbox-agent",
        }
    }

    /// The environment variable that tells test processes where this service is, when they
    /// need to be told (its value is known once the service runs; xtask sets it on the test
    /// commands of the suites that need the service).
    pub fn env_var(self) -> Option<&'static str> {
        match self {
            // The engine is found on its default socket, the image by its fixed name.
            Self::DockerEngine | Self::TestImage => None,
            Self::Redis => Some(redis::ENV_URL),
            Self::RedisCluster => Some(redis::ENV_CLUSTER_NODES),
            // The tag is a hash of the recipe, the venv's place the target directory's.
            Self::DebianImage => Some(crate::debian_image::ENV_IMAGE),
            Self::SdkVenv => Some(crate::e2b_sdk::ENV_PYTHON),
            Self::SdkVenvOlder => Some(crate::e2b_sdk::OLDER.env_var),
            // Its `bin/schemathesis`, not its python.
            Self::SchemathesisVenv => Some(crate::e2b_sdk::SCHEMATHESIS.env_var),
            Self::JsSdk => Some(crate::js_sdk::ENV_JS_DIR),
            Self::Agent => Some(crate::agent_build::ENV_AGENT_BIN),
        }
    }

    /// Services that must be up before this one.
    pub fn depends_on(self) -> &'static [Service] {
        match self {
            Self::DockerEngine
            | Self::Redis
            | Self::RedisCluster
            | Self::SdkVenv
            | Self::SdkVenvOlder
            | Self::SchemathesisVenv
            | Self::JsSdk
            | Self::Agent => &[],
            Self::TestImage | Self::DebianImage => &[Service::DockerEngine],
        }
    }

    /// Prerequisites this service needs installed.
    pub fn tools(self) -> &'static [Tool] {
        match self {
            Self::DockerEngine => &[Tool::Docker],
            Self::TestImage => &[Tool::Docker, Tool::Busybox],
            Self::Redis | Self::RedisCluster => &[Tool::Redis],
            Self::DebianImage => &[Tool::Docker, Tool::Debootstrap],
            Self::SdkVenv | Self::SdkVenvOlder | Self::SchemathesisVenv => &[Tool::Python],
            Self::JsSdk => &[Tool::Node],
            Self::Agent => &[Tool::StaticLibc],
        }
    }
}

/// One row of the registry: an adapter the conformance suite runs against.
#[derive(Clone, Copy, Debug)]
pub struct Adapter {
    /// The value of `SANDBOX_CONFORMANCE_ADAPTER` and of `cargo xtask conformance <name>`.
    pub name: &'static str,
    /// The cargo package holding the adapter's conformance test target.
    pub package: &'static str,
    /// The `[[test]]` target (`--test <target>`).
    pub test_target: &'static str,
    pub services: &'static [Service],
    /// The configurations the suite runs against, one run and one table each (the Redis store:
    /// standalone, then cluster). Empty: one run, no extra environment.
    pub variants: &'static [Variant],
}

/// One configuration of an adapter's suite.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// Names the run in its table and messages: `redis (cluster)`.
    pub label: &'static str,
    /// Set on the test binary's describe and nextest runs.
    pub env: &'static [(&'static str, &'static str)],
}

impl Variant {
    /// An adapter without variants runs once, like this.
    const PLAIN: &'static [Variant] = &[Variant {
        label: "",
        env: &[],
    }];

    /// `redis (cluster)`, or just the adapter's name for the plain run.
    pub fn title(&self, adapter: &str) -> String {
        if self.label.is_empty() {
            adapter.to_owned()
        } else {
            format!("{adapter} ({})", self.label)
        }
    }

    /// For file names: `redis-cluster`, or the adapter's name.
    pub fn stem(&self, adapter: &str) -> String {
        if self.label.is_empty() {
            adapter.to_owned()
        } else {
            format!("{adapter}-{}", self.label)
        }
    }
}

impl Adapter {
    /// The runs of this adapter's suite, in order.
    pub fn runs(&self) -> &'static [Variant] {
        if self.variants.is_empty() {
            Variant::PLAIN
        } else {
            self.variants
        }
    }
}

/// Every adapter `cargo xtask test` runs the suite against. Adding one is one line here (plus a
/// [`Service`] variant if it needs a new kind of service).
pub const ADAPTERS: &[Adapter] = &[
    Adapter {
        name: "fake",
        package: "sandbox-testkit",
        test_target: "conformance",
        services: &[],
        variants: &[],
    },
    // Both data planes (`docker.data_plane`): commands through `docker exec` under the engine's
    // init, and the agent installed as every container's PID 1.
    Adapter {
        name: "docker",
        package: "sandbox-provider-docker",
        test_target: "conformance",
        services: &[Service::DockerEngine, Service::TestImage, Service::Agent],
        variants: &[
            Variant {
                label: "exec",
                env: &[(ENV_DOCKER_DATA_PLANE, "exec")],
            },
            Variant {
                label: "agent",
                env: &[(ENV_DOCKER_DATA_PLANE, "agent")],
            },
        ],
    },
    Adapter {
        name: "memory",
        package: "sandbox-session",
        test_target: "conformance",
        services: &[],
        variants: &[],
    },
    // E2B's cloud cannot run here: the adapter speaks to this workspace's own E2B-compatible
    // API (`sandbox serve` with `[e2b]`, agent mode, the Debian image as template `base`), which
    // each case of the test binary spawns; hence the package, which builds that binary.
    Adapter {
        name: "e2b",
        package: "sandbox-app",
        test_target: "conformance_e2b",
        services: &[Service::DockerEngine, Service::DebianImage, Service::Agent],
        variants: &[],
    },
    // The store must behave the same on one server and on a cluster (keys of one binding in one
    // hash slot), so the suite runs against both.
    Adapter {
        name: "redis",
        package: "sandbox-store-redis",
        test_target: "conformance",
        services: &[Service::Redis, Service::RedisCluster],
        variants: &[
            Variant {
                label: "standalone",
                env: &[(ENV_REDIS_TOPOLOGY, "standalone")],
            },
            Variant {
                label: "cluster",
                env: &[(ENV_REDIS_TOPOLOGY, "cluster")],
            },
        ],
    },
];

pub fn find(name: &str) -> Option<&'static Adapter> {
    ADAPTERS.iter().find(|a| a.name == name)
}

/// The registered adapter names, comma-separated (for error messages).
pub fn names() -> String {
    ADAPTERS
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The services `adapter` needs, dependencies first, without duplicates.
pub fn services_in_order(adapter: &Adapter) -> Vec<Service> {
    fn visit(s: Service, out: &mut Vec<Service>) {
        for &d in s.depends_on() {
            visit(d, out);
        }
        if !out.contains(&s) {
            out.push(s);
        }
    }
    let mut out = Vec::new();
    for &s in adapter.services {
        visit(s, &mut out);
    }
    out
}

/// The prerequisites `adapter`'s suite needs (nextest plus its services' tools).
pub fn tools(adapter: &Adapter) -> Vec<Tool> {
    let mut tools = vec![Tool::Nextest];
    for s in services_in_order(adapter) {
        for &t in s.tools() {
            if !tools.contains(&t) {
                tools.push(t);
            }
        }
    }
    tools
}

/// The document the describe mode writes.
#[derive(Clone, Debug, Deserialize)]
pub struct Describe {
    pub adapter: String,
    pub cases: Vec<DescribedCase>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct DescribedCase {
    /// e.g. `conformance::exec_argv_roundtrip`, exactly the nextest test name.
    pub name: String,
    pub applicable: bool,
    /// Capabilities the case needs.
    #[serde(default)]
    pub requires: Vec<String>,
    /// Which of those the adapter does not declare (why it is not applicable).
    #[serde(default)]
    pub missing: Vec<String>,
    /// Why the case does not apply, in words ("needs pty", "checks the refusal without
    /// metadata"); preferred over `missing` when present.
    #[serde(default)]
    pub reason: Option<String>,
}

pub fn parse_describe(json: &str) -> Result<Describe, String> {
    serde_json::from_str(json).map_err(|e| format!("cannot parse the describe document: {e}"))
}

/// One adapter's results: the table and what is wrong with them.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub adapter: String,
    pub counts: Counts,
    /// (short case name, why it does not apply).
    pub not_applicable: Vec<(String, String)>,
    pub failed: Vec<String>,
    pub skipped: Vec<String>,
    /// Applicable in the describe document but absent from JUnit.
    pub missing_from_junit: Vec<String>,
    /// Ran, but the describe document does not know them.
    pub undescribed: Vec<String>,
    /// The describe document names another adapter.
    pub adapter_mismatch: Option<String>,
}

/// `conformance::exec_argv_roundtrip` → `exec_argv_roundtrip`.
pub fn short_name(name: &str) -> &str {
    name.strip_prefix("conformance::").unwrap_or(name)
}

/// Compares the describe document with what nextest reported.
pub fn evaluate(adapter: &str, describe: &Describe, junit: &[TestCase]) -> Report {
    let mut r = Report {
        adapter: adapter.to_owned(),
        counts: Counts::of(junit),
        ..Report::default()
    };
    if describe.adapter != adapter {
        r.adapter_mismatch = Some(describe.adapter.clone());
    }
    for case in &describe.cases {
        if case.applicable {
            if !junit.iter().any(|t| t.name == case.name) {
                r.missing_from_junit.push(case.name.clone());
            }
        } else {
            let why = match &case.reason {
                Some(reason) => reason.clone(),
                None if !case.missing.is_empty() => format!("needs {}", case.missing.join(", ")),
                None if !case.requires.is_empty() => format!("needs {}", case.requires.join(", ")),
                None => String::new(),
            };
            r.not_applicable
                .push((short_name(&case.name).to_owned(), why));
        }
    }
    for t in junit {
        match t.status {
            Status::Passed => {}
            Status::Failed => r.failed.push(t.name.clone()),
            Status::Skipped => r.skipped.push(t.name.clone()),
        }
        if !describe.cases.iter().any(|c| c.name == t.name) {
            r.undescribed.push(t.name.clone());
        }
    }
    r
}

impl Report {
    /// The table printed per adapter.
    pub fn table(&self) -> String {
        let c = &self.counts;
        let mut s = format!("conformance: {}\n", self.adapter);
        s.push_str("  registered  passed  failed  skipped  not applicable\n");
        let _ = writeln!(
            s,
            "  {:>10}  {:>6}  {:>6}  {:>7}  {:>14}",
            c.total(),
            c.passed,
            c.failed,
            c.skipped,
            self.not_applicable.len()
        );
        if !self.not_applicable.is_empty() {
            let list: Vec<String> = self
                .not_applicable
                .iter()
                .map(|(name, why)| {
                    if why.is_empty() {
                        name.clone()
                    } else {
                        format!("{name} ({why})")
                    }
                })
                .collect();
            let _ = writeln!(s, "  not applicable: {}", list.join(", "));
        }
        for (label, list) in [
            ("failed", &self.failed),
            ("skipped", &self.skipped),
            ("applicable but not run", &self.missing_from_junit),
            ("ran but not described", &self.undescribed),
        ] {
            if !list.is_empty() {
                let names: Vec<&str> = list.iter().map(|n| short_name(n)).collect();
                let _ = writeln!(s, "  {label}: {}", names.join(", "));
            }
        }
        s
    }

    /// Reasons this run fails. Under CI a skipped or vanished case fails too: no silent skips.
    pub fn problems(&self, ci: bool) -> Vec<String> {
        let mut p = Vec::new();
        let a = &self.adapter;
        if let Some(other) = &self.adapter_mismatch {
            p.push(format!(
                "{a}: the describe document is for adapter {other:?}"
            ));
        }
        if self.counts.total() == 0 {
            p.push(format!("{a}: no conformance case ran"));
        }
        if !self.failed.is_empty() {
            p.push(format!("{a}: {} case(s) failed", self.failed.len()));
        }
        if ci && !self.skipped.is_empty() {
            p.push(format!(
                "{a}: {} registered case(s) were skipped (no silent skips in CI)",
                self.skipped.len()
            ));
        }
        if ci && !self.missing_from_junit.is_empty() {
            p.push(format!(
                "{a}: {} applicable case(s) are missing from the JUnit report",
                self.missing_from_junit.len()
            ));
        }
        p
    }

    /// What is suspicious but tolerated (locally, or always for undescribed cases).
    pub fn warnings(&self, ci: bool) -> Vec<String> {
        let mut w = Vec::new();
        let a = &self.adapter;
        if !ci && !self.skipped.is_empty() {
            w.push(format!(
                "{a}: {} registered case(s) were skipped (a failure under CI=true)",
                self.skipped.len()
            ));
        }
        if !ci && !self.missing_from_junit.is_empty() {
            w.push(format!(
                "{a}: {} applicable case(s) are missing from the JUnit report (a failure under CI=true)",
                self.missing_from_junit.len()
            ));
        }
        if !self.undescribed.is_empty() {
            w.push(format!(
                "{a}: {} case(s) ran that the describe document does not list",
                self.undescribed.len()
            ));
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DESCRIBE: &str = r#"{"adapter":"fake","cases":[
        {"name":"conformance::exec_argv_roundtrip","applicable":true,"requires":["metadata"],"missing":[]},
        {"name":"conformance::files_roundtrip","applicable":true,"requires":[],"missing":[]},
        {"name":"conformance::terminal_roundtrip","applicable":false,"requires":["pty"],"missing":["pty"]},
        {"name":"conformance::exec_shell_form","applicable":false,"requires":["posix_shell","metadata"],"missing":["posix_shell"]}
    ]}"#;

    fn case(name: &str, status: Status) -> TestCase {
        TestCase {
            name: name.into(),
            classname: None,
            status,
        }
    }

    #[test]
    fn all_passed() {
        let d = parse_describe(DESCRIBE).unwrap();
        let junit = [
            case("conformance::exec_argv_roundtrip", Status::Passed),
            case("conformance::files_roundtrip", Status::Passed),
        ];
        let r = evaluate("fake", &d, &junit);
        assert_eq!(r.problems(true), Vec::<String>::new());
        assert_eq!(r.warnings(true), Vec::<String>::new());
        assert_eq!(
            r.table(),
            "conformance: fake\n\
             \x20 registered  passed  failed  skipped  not applicable\n\
             \x20          2       2       0        0               2\n\
             \x20 not applicable: terminal_roundtrip (needs pty), exec_shell_form (needs posix_shell)\n"
        );
    }

    #[test]
    fn failures_skips_and_vanished_cases() {
        let d = parse_describe(DESCRIBE).unwrap();
        let junit = [
            case("conformance::exec_argv_roundtrip", Status::Failed),
            case("conformance::surprise", Status::Skipped),
        ];
        let r = evaluate("fake", &d, &junit);
        assert_eq!(r.failed, vec!["conformance::exec_argv_roundtrip"]);
        assert_eq!(r.missing_from_junit, vec!["conformance::files_roundtrip"]);
        assert_eq!(r.undescribed, vec!["conformance::surprise"]);
        // Locally: only the failure fails; skip and vanished case are warnings.
        assert_eq!(r.problems(false).len(), 1);
        assert_eq!(r.warnings(false).len(), 3);
        // In CI all three fail.
        assert_eq!(r.problems(true).len(), 3);
        let table = r.table();
        assert!(table.contains("  failed: exec_argv_roundtrip\n"), "{table}");
        assert!(
            table.contains("  applicable but not run: files_roundtrip\n"),
            "{table}"
        );
    }

    #[test]
    fn nothing_ran_and_wrong_adapter() {
        let d = parse_describe(DESCRIBE).unwrap();
        let r = evaluate("docker", &d, &[]);
        let p = r.problems(false);
        assert!(
            p.iter().any(|p| p.contains("no conformance case ran")),
            "{p:?}"
        );
        assert!(p.iter().any(|p| p.contains("\"fake\"")), "{p:?}");
    }

    #[test]
    fn registry_is_consistent() {
        assert!(find("fake").is_some());
        assert!(find("nope").is_none());
        for a in ADAPTERS {
            assert_eq!(ADAPTERS.iter().filter(|b| b.name == a.name).count(), 1);
        }
    }

    #[test]
    fn services_come_dependencies_first() {
        let a = Adapter {
            name: "x",
            package: "p",
            test_target: "t",
            services: &[Service::TestImage, Service::DockerEngine],
            variants: &[],
        };
        assert_eq!(
            services_in_order(&a),
            vec![Service::DockerEngine, Service::TestImage]
        );
        assert_eq!(tools(&a), vec![Tool::Nextest, Tool::Docker, Tool::Busybox]);
    }

    #[test]
    fn redis_runs_standalone_then_cluster() {
        let redis = find("redis").unwrap();
        assert_eq!(redis.package, "sandbox-store-redis");
        assert_eq!(tools(redis), vec![Tool::Nextest, Tool::Redis]);
        let runs = redis.runs();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].title("redis"), "redis (standalone)");
        assert_eq!(runs[0].stem("redis"), "redis-standalone");
        assert_eq!(runs[0].env, [(ENV_REDIS_TOPOLOGY, "standalone")]);
        assert_eq!(runs[1].title("redis"), "redis (cluster)");
        assert_eq!(runs[1].stem("redis"), "redis-cluster");
        assert_eq!(runs[1].env, [(ENV_REDIS_TOPOLOGY, "cluster")]);
        for s in services_in_order(redis) {
            assert!(s.env_var().is_some(), "{s:?} must tell tests where it is");
        }
    }

    #[test]
    fn docker_runs_in_both_data_planes_with_the_agent_built() {
        let docker = find("docker").unwrap();
        let runs = docker.runs();
        let titles: Vec<String> = runs.iter().map(|r| r.title("docker")).collect();
        assert_eq!(titles, ["docker (exec)", "docker (agent)"]);
        assert_eq!(runs[0].env, [(ENV_DOCKER_DATA_PLANE, "exec")]);
        assert_eq!(runs[1].env, [(ENV_DOCKER_DATA_PLANE, "agent")]);
        assert!(docker.services.contains(&Service::Agent));
        assert_eq!(
            Service::Agent.env_var(),
            Some(crate::agent_build::ENV_AGENT_BIN)
        );
    }

    #[test]
    fn e2b_runs_against_the_e2b_api_with_its_image_and_agent() {
        let e2b = find("e2b").unwrap();
        assert_eq!(e2b.package, "sandbox-app");
        assert_eq!(e2b.test_target, "conformance_e2b");
        assert_eq!(e2b.runs().len(), 1);
        for s in [Service::DockerEngine, Service::DebianImage, Service::Agent] {
            assert!(e2b.services.contains(&s), "{s:?}");
        }
    }

    #[test]
    fn the_schemathesis_venv_gives_its_program_and_needs_python() {
        let s = Service::SchemathesisVenv;
        assert_eq!(s.name(), "schemathesis venv");
        assert_eq!(s.env_var(), Some("SANDBOX_TEST_SCHEMATHESIS"));
        assert_eq!(s.tools(), [Tool::Python]);
        assert!(s.depends_on().is_empty());
    }

    #[test]
    fn adapters_without_variants_run_once_under_their_name() {
        for name in ["fake", "memory"] {
            let a = find(name).unwrap();
            let runs = a.runs();
            assert_eq!(runs.len(), 1, "{name}");
            assert_eq!(runs[0].title(name), name);
            assert_eq!(runs[0].stem(name), name);
            assert!(runs[0].env.is_empty());
        }
    }
}
