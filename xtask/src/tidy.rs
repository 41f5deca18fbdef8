//! The architecture check: the dependency lines of `ARCHITECTURE.md`, enforced on the
//! `cargo metadata --format-version 1` document.
//!
//! [`check`] is a pure function over a parsed document so every rule can be tested on a small
//! doctored graph; [`check_manifests`] is the one rule that reads manifest text; [`check_live`]
//! runs both on this workspace.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::process::{self, Output};

/// `sandbox-core`'s transitive normal dependencies must stay inside this list: serde,
/// async-trait, one time crate, one waker primitive, and what those need to build.
pub const CORE_ALLOWED: &[&str] = &[
    "serde",
    "serde_core",
    "serde_derive",
    "async-trait",
    "time",
    "time-core",
    "time-macros",
    "deranged",
    "powerfmt",
    "num-conv",
    "itoa",
    "event-listener",
    "concurrent-queue",
    "crossbeam-utils",
    "parking",
    "pin-project-lite",
    "proc-macro2",
    "quote",
    "syn",
    "unicode-ident",
];

/// The only crates `sandbox-core` may name in its own `[dependencies]`.
pub const CORE_DIRECT_ALLOWED: &[&str] = &["serde", "async-trait", "time", "event-listener"];

/// What `sandbox-envd` may add to [`CORE_ALLOWED`] (`zmij` is serde_json's newer float printer;
/// `thiserror` derives envd's own error types, core no longer needs it).
pub const ENVD_EXTRA_ALLOWED: &[&str] = &[
    "sandbox-core",
    "thiserror",
    "thiserror-impl",
    "serde_json",
    "base64",
    "bytes",
    "memchr",
    "ryu",
    "zmij",
];

/// Adapters: never depend on each other, by any kind of dependency.
pub const ADAPTERS: &[&str] = &[
    "sandbox-provider-docker",
    "sandbox-provider-e2b",
    "sandbox-provider-cube",
    "sandbox-store-redis",
];

/// HTTP-server, CLI and config-format crates `sandbox-session` must not pull in (hyper as a whole:
/// the session layer makes no HTTP of its own either).
pub const SESSION_FORBIDDEN: &[&str] = &[
    "axum",
    "hyper",
    "clap",
    "toml",
    "serde_yaml",
    "figment",
    "config",
];

/// One TLS crypto provider for the whole graph (aws-lc-rs), so no `ring`.
pub const FORBIDDEN_EVERYWHERE: &[&str] = &["ring"];

/// Which workspace crates a workspace crate may name as a normal dependency.
#[derive(Clone, Copy, Debug)]
pub enum Allowed {
    Only(&'static [&'static str]),
    AnyExcept(&'static [&'static str]),
}

impl Allowed {
    fn permits(self, dep: &str) -> bool {
        match self {
            Self::Only(list) => list.contains(&dep),
            Self::AnyExcept(list) => !list.contains(&dep),
        }
    }
}

/// The workspace-internal normal edges `ARCHITECTURE.md` allows. A new crate gets a line here.
pub const WORKSPACE_EDGES: &[(&str, Allowed)] = &[
    ("sandbox-core", Allowed::Only(&[])),
    ("sandbox-envd", Allowed::Only(&["sandbox-core"])),
    (
        "sandbox-transport",
        Allowed::Only(&["sandbox-core", "sandbox-envd"]),
    ),
    (
        "sandbox-provider-docker",
        Allowed::Only(&[
            "sandbox-core",
            "sandbox-transport",
            // Agent mode speaks envd to the agent, as the E2B and Cube adapters speak it.
            "sandbox-envd",
            "sandbox-iptables-listing",
            "sandbox-elf",
        ]),
    ),
    // The adapter's chain names and listing reader: shared with xtask, so it depends on nothing.
    ("sandbox-iptables-listing", Allowed::Only(&[])),
    // The ELF linking reader: shared with xtask, so it depends on nothing.
    ("sandbox-elf", Allowed::Only(&[])),
    (
        "sandbox-provider-e2b",
        Allowed::Only(&["sandbox-core", "sandbox-transport", "sandbox-envd"]),
    ),
    (
        "sandbox-provider-cube",
        Allowed::Only(&["sandbox-core", "sandbox-transport", "sandbox-envd"]),
    ),
    ("sandbox-store-redis", Allowed::Only(&["sandbox-core"])),
    ("sandbox-session", Allowed::Only(&["sandbox-core"])),
    ("sandbox-testkit", Allowed::Only(&["sandbox-core"])),
    ("sandbox-agent", Allowed::Only(&["sandbox-envd"])),
    (
        "sandbox-app",
        Allowed::AnyExcept(&["xtask", "sandbox-testkit"]),
    ),
    (
        "xtask",
        Allowed::Only(&["sandbox-iptables-listing", "sandbox-elf"]),
    ),
];

/// A crossed line: which rule, and what crossed it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub rule: &'static str,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tidy: {}: {}", self.rule, self.detail)
    }
}

fn violation(rule: &'static str, detail: String) -> Violation {
    Violation { rule, detail }
}

// ---------------------------------------------------------------------------------------------
// The metadata document (only the fields the rules read).

#[derive(Clone, Debug, Deserialize)]
pub struct Metadata {
    pub packages: Vec<Package>,
    pub workspace_members: Vec<String>,
    pub resolve: Option<Resolve>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Package {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub version: String,
    pub manifest_path: String,
    /// The manifest's dependencies (to tell optional ones).
    #[serde(default)]
    pub dependencies: Vec<PackageDep>,
    /// The manifest's features: name → what each enables.
    #[serde(default)]
    pub features: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct PackageDep {
    /// The dependency's package name.
    pub name: String,
    #[serde(default)]
    pub optional: bool,
    #[serde(default)]
    pub rename: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Resolve {
    pub nodes: Vec<Node>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Node {
    pub id: String,
    #[serde(default)]
    pub deps: Vec<NodeDep>,
    /// The package's activated features.
    #[serde(default)]
    pub features: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct NodeDep {
    pub pkg: String,
    #[serde(default)]
    pub dep_kinds: Vec<DepKind>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct DepKind {
    /// `null` for a normal dependency, else `"dev"` or `"build"`.
    pub kind: Option<String>,
}

/// Parses the output of `cargo metadata --format-version 1`.
pub fn parse_metadata(json: &str) -> Result<Metadata, String> {
    serde_json::from_str(json).map_err(|e| format!("cannot parse cargo metadata: {e}"))
}

/// Whether `parent` (with `active` features) really builds its dependency on package `child`.
/// `cargo metadata` lists an optional dependency that only a weak feature (`dep?/feature`)
/// mentions as if it were built (rust-lang/cargo#10801; rustls-webpki's `ring?/alloc` is one),
/// so an optional dependency counts only when an active feature enables it. A document without
/// dependency lists (older cargo, hand-made tests) keeps every edge: the strict reading.
fn dependency_is_built(parent: &Package, active: &[String], child: &str) -> bool {
    let declared: Vec<&PackageDep> = parent
        .dependencies
        .iter()
        .filter(|d| d.name == child)
        .collect();
    if declared.is_empty() || declared.iter().any(|d| !d.optional) {
        return true;
    }
    declared.iter().any(|d| {
        let key = d.rename.as_deref().unwrap_or(&d.name);
        active.iter().any(|feature| {
            feature == key
                || parent.features.get(feature).is_some_and(|enables| {
                    enables.iter().any(|v| {
                        v == key
                            || v.strip_prefix("dep:") == Some(key)
                            || v.strip_prefix(key)
                                .is_some_and(|rest| rest.starts_with('/'))
                    })
                })
        })
    })
}

// ---------------------------------------------------------------------------------------------
// The dependency graph.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Normal,
    Dev,
    Build,
}

struct Edge<'m> {
    to: &'m str,
    kinds: Vec<Kind>,
}

impl Edge<'_> {
    fn has(&self, kind: Kind) -> bool {
        self.kinds.contains(&kind)
    }
}

struct Graph<'m> {
    name: BTreeMap<&'m str, &'m str>,
    edges: BTreeMap<&'m str, Vec<Edge<'m>>>,
    /// Workspace member name → package id.
    members: BTreeMap<&'m str, &'m str>,
}

impl<'m> Graph<'m> {
    fn new(md: &'m Metadata) -> Result<Self, String> {
        let resolve = md
            .resolve
            .as_ref()
            .ok_or("cargo metadata has no resolve graph (was it run with --no-deps?)")?;
        let name: BTreeMap<&str, &str> = md
            .packages
            .iter()
            .map(|p| (p.id.as_str(), p.name.as_str()))
            .collect();
        let mut members = BTreeMap::new();
        for id in &md.workspace_members {
            let n = name
                .get(id.as_str())
                .ok_or_else(|| format!("workspace member {id} is not among the packages"))?;
            members.insert(*n, id.as_str());
        }
        let packages: BTreeMap<&str, &Package> =
            md.packages.iter().map(|p| (p.id.as_str(), p)).collect();
        let mut edges = BTreeMap::new();
        for node in &resolve.nodes {
            let list = node
                .deps
                .iter()
                .filter(|d| {
                    let child = name.get(d.pkg.as_str()).copied().unwrap_or_default();
                    packages
                        .get(node.id.as_str())
                        .is_none_or(|p| dependency_is_built(p, &node.features, child))
                })
                .map(|d| Edge {
                    to: d.pkg.as_str(),
                    kinds: if d.dep_kinds.is_empty() {
                        // Cargo before 1.41 wrote no kinds; assume the strictest reading.
                        vec![Kind::Normal]
                    } else {
                        d.dep_kinds
                            .iter()
                            .map(|k| match k.kind.as_deref() {
                                Some("dev") => Kind::Dev,
                                Some("build") => Kind::Build,
                                _ => Kind::Normal,
                            })
                            .collect()
                    },
                })
                .collect();
            edges.insert(node.id.as_str(), list);
        }
        Ok(Self {
            name,
            edges,
            members,
        })
    }

    fn name_of(&self, id: &'m str) -> &'m str {
        self.name.get(id).copied().unwrap_or(id)
    }

    fn edges(&self, id: &str) -> &[Edge<'m>] {
        self.edges.get(id).map_or(&[], Vec::as_slice)
    }

    fn is_member(&self, id: &str) -> bool {
        self.members.values().any(|m| *m == id)
    }

    /// Everything reachable from `roots` over edges accepted by `follow`, with the predecessor of
    /// each package on a shortest path (roots have none). Breadth-first so paths are short.
    fn reach(
        &self,
        roots: &[&'m str],
        follow: impl Fn(&Edge<'m>) -> bool,
    ) -> BTreeMap<&'m str, Option<&'m str>> {
        let mut pred: BTreeMap<&str, Option<&str>> = BTreeMap::new();
        let mut queue = VecDeque::new();
        for &r in roots {
            if pred.insert(r, None).is_none() {
                queue.push_back(r);
            }
        }
        while let Some(id) = queue.pop_front() {
            for e in self.edges(id) {
                if follow(e) && !pred.contains_key(e.to) {
                    pred.insert(e.to, Some(id));
                    queue.push_back(e.to);
                }
            }
        }
        pred
    }

    /// The normal closure of `root` (excluding `root`), with predecessors.
    fn normal_closure(&self, root: &'m str) -> BTreeMap<&'m str, Option<&'m str>> {
        let mut reach = self.reach(&[root], |e| e.has(Kind::Normal));
        reach.remove(root);
        reach
    }

    /// "a -> b -> c" from the predecessor map, ending at `to`, starting at `from`.
    fn path(
        &self,
        pred: &BTreeMap<&'m str, Option<&'m str>>,
        from: &'m str,
        to: &'m str,
    ) -> String {
        let mut chain = vec![to];
        let mut cur = to;
        while let Some(Some(p)) = pred.get(cur) {
            chain.push(p);
            cur = p;
            if chain.len() > pred.len() + 1 {
                break; // Cannot happen with a BFS tree; never loop on a malformed map.
            }
        }
        if cur != from {
            chain.push(from);
        }
        chain.reverse();
        chain
            .iter()
            .map(|id| self.name_of(id))
            .collect::<Vec<_>>()
            .join(" -> ")
    }
}

// ---------------------------------------------------------------------------------------------
// The rules.

/// Runs every graph rule (1–7) on `md`. Rule 8 reads files: see [`check_manifests`].
pub fn check(md: &Metadata) -> Result<Vec<Violation>, String> {
    let g = Graph::new(md)?;
    let mut out = Vec::new();
    core_allow_list(&g, &mut out);
    envd_allow_list(&g, &mut out);
    workspace_edges(&g, &mut out);
    adapter_isolation(&g, &mut out);
    app_and_testkit(&g, &mut out);
    session_no_server(&g, &mut out);
    nothing_forbidden(&g, &mut out);
    shared_with_xtask(&g, &mut out);
    out.sort();
    out.dedup();
    Ok(out)
}

/// Reports every package in the normal closure of `crate_name` that `allowed` refuses.
fn closure_within(
    g: &Graph<'_>,
    rule: &'static str,
    crate_name: &str,
    allowed: impl Fn(&str) -> bool,
    out: &mut Vec<Violation>,
) {
    let Some(&root) = g.members.get(crate_name) else {
        return;
    };
    let pred = g.normal_closure(root);
    for &id in pred.keys() {
        let name = g.name_of(id);
        if !allowed(name) {
            out.push(violation(
                rule,
                format!(
                    "{crate_name} must not depend on {name} (normal dependency path: {})",
                    g.path(&pred, root, id)
                ),
            ));
        }
    }
}

/// Rule 1.
fn core_allow_list(g: &Graph<'_>, out: &mut Vec<Violation>) {
    closure_within(
        g,
        "core-allow-list",
        "sandbox-core",
        |n| CORE_ALLOWED.contains(&n),
        out,
    );
    let Some(&core) = g.members.get("sandbox-core") else {
        return;
    };
    for e in g.edges(core).iter().filter(|e| e.has(Kind::Normal)) {
        let name = g.name_of(e.to);
        if !CORE_DIRECT_ALLOWED.contains(&name) {
            out.push(violation(
                "core-direct-deps",
                format!(
                    "sandbox-core names {name} in [dependencies]; allowed: {}",
                    CORE_DIRECT_ALLOWED.join(", ")
                ),
            ));
        }
    }
}

/// Rule 2.
fn envd_allow_list(g: &Graph<'_>, out: &mut Vec<Violation>) {
    closure_within(
        g,
        "envd-allow-list",
        "sandbox-envd",
        |n| CORE_ALLOWED.contains(&n) || ENVD_EXTRA_ALLOWED.contains(&n),
        out,
    );
}

/// The crates xtask shares with the workspace build nothing else, so xtask stays light.
pub const SHARED_WITH_XTASK: &[&str] = &["sandbox-iptables-listing", "sandbox-elf"];

/// Rule 2b: a crate in [`SHARED_WITH_XTASK`] has no normal dependency at all (xtask builds it
/// on every run; a dependency there would be one of xtask's).
fn shared_with_xtask(g: &Graph<'_>, out: &mut Vec<Violation>) {
    for &name in SHARED_WITH_XTASK {
        closure_within(g, "shared-with-xtask", name, |_| false, out);
    }
}

/// Rule 3.
fn workspace_edges(g: &Graph<'_>, out: &mut Vec<Violation>) {
    for (&name, &id) in &g.members {
        let Some(&(_, allowed)) = WORKSPACE_EDGES.iter().find(|(n, _)| *n == name) else {
            out.push(violation(
                "workspace-edges",
                format!(
                    "{name} is a workspace member with no line in the tidy edge table \
                     (xtask/src/tidy.rs WORKSPACE_EDGES): say which workspace crates it may use"
                ),
            ));
            continue;
        };
        for e in g.edges(id).iter().filter(|e| e.has(Kind::Normal)) {
            if !g.is_member(e.to) {
                continue;
            }
            let dep = g.name_of(e.to);
            if !allowed.permits(dep) {
                out.push(violation(
                    "workspace-edges",
                    format!("{name} must not depend on {dep}"),
                ));
            }
        }
    }
}

/// Rule 4: an adapter's build and tests (its direct dependencies of any kind, then their
/// normal and build closure) contain no other adapter.
fn adapter_isolation(g: &Graph<'_>, out: &mut Vec<Violation>) {
    for &adapter in ADAPTERS {
        let Some(&root) = g.members.get(adapter) else {
            continue;
        };
        let direct: Vec<&str> = g.edges(root).iter().map(|e| e.to).collect();
        let mut pred = g.reach(&direct, |e| e.has(Kind::Normal) || e.has(Kind::Build));
        for d in &direct {
            pred.insert(d, Some(root));
        }
        for &id in pred.keys() {
            let other = g.name_of(id);
            if other != adapter && ADAPTERS.contains(&other) {
                out.push(violation(
                    "adapter-isolation",
                    format!(
                        "adapter {adapter} must not depend on adapter {other} (path: {})",
                        g.path(&pred, root, id)
                    ),
                ));
            }
        }
    }
}

/// Rule 5.
fn app_and_testkit(g: &Graph<'_>, out: &mut Vec<Violation>) {
    for (&from, edges) in &g.edges {
        for e in edges {
            match g.name_of(e.to) {
                "sandbox-app" if g.is_member(e.to) => out.push(violation(
                    "app-has-no-dependents",
                    format!(
                        "{} depends on sandbox-app (the composition root is never a dependency)",
                        g.name_of(from)
                    ),
                )),
                "sandbox-testkit"
                    if g.is_member(e.to) && e.kinds.iter().any(|k| *k != Kind::Dev) =>
                {
                    out.push(violation(
                        "testkit-dev-only",
                        format!(
                            "{} depends on sandbox-testkit other than as a dev-dependency",
                            g.name_of(from)
                        ),
                    ));
                }
                _ => {}
            }
        }
    }
}

/// Rule 6.
fn session_no_server(g: &Graph<'_>, out: &mut Vec<Violation>) {
    closure_within(
        g,
        "session-no-server",
        "sandbox-session",
        |n| !SESSION_FORBIDDEN.contains(&n),
        out,
    );
}

/// Rule 7.
fn nothing_forbidden(g: &Graph<'_>, out: &mut Vec<Violation>) {
    for &name in g.members.keys() {
        closure_within(
            g,
            "no-ring",
            name,
            |n| !FORBIDDEN_EVERYWHERE.contains(&n),
            out,
        );
    }
}

/// Rule 8: every member's manifest opts into the workspace lints. `manifests` holds
/// (crate name, manifest text) pairs.
pub fn check_manifests<'a>(
    manifests: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<Violation> {
    manifests
        .into_iter()
        .filter(|(_, text)| !has_workspace_lints(text))
        .map(|(name, _)| {
            violation(
                "workspace-lints",
                format!("{name}'s Cargo.toml lacks `[lints] workspace = true`"),
            )
        })
        .collect()
}

/// Whether a manifest says `[lints] workspace = true`, `lints.workspace = true` or
/// `lints = { workspace = true }` (a line-based reading of the TOML, enough for manifests).
pub fn has_workspace_lints(manifest: &str) -> bool {
    let mut table = String::new();
    for raw in manifest.lines() {
        let line = strip_comment(raw).trim();
        if line.starts_with('[') {
            table = line
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim()
                .to_owned();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key: String = key.chars().filter(|c| !c.is_whitespace()).collect();
        let value: String = value.chars().filter(|c| !c.is_whitespace()).collect();
        let found = match table.as_str() {
            "lints" => key == "workspace" && value == "true",
            "" => {
                (key == "lints.workspace" && value == "true")
                    || (key == "lints" && value == "{workspace=true}")
            }
            _ => false,
        };
        if found {
            return true;
        }
    }
    false
}

/// Rule 13: every external dependency of a member takes its version from the root's
/// `[workspace.dependencies]`, so one crate is one version in one place. A member may add
/// features (`{ workspace = true, features = [...] }`), never a version of its own.
pub fn check_versions<'a>(
    manifests: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<Violation> {
    manifests
        .into_iter()
        .flat_map(|(name, text)| {
            pinned_dependencies(text).into_iter().map(move |dep| {
                violation(
                    "workspace-versions",
                    format!(
                        "{name}'s Cargo.toml pins `{dep}` itself: give it a line in the root's \
                         [workspace.dependencies] and write `{dep} = {{ workspace = true }}`"
                    ),
                )
            })
        })
        .collect()
}

/// The dependencies a manifest gives a version of its own: a `name = "1.2"` or an inline
/// table with `version` in any dependency table (normal, dev, build, per target). Path and
/// inherited dependencies are not versions. A line-based reading, like [`has_workspace_lints`]:
/// dotted `[dependencies.name]` tables are not used in this workspace.
pub fn pinned_dependencies(manifest: &str) -> Vec<String> {
    let mut table = String::new();
    let mut pinned = Vec::new();
    for raw in manifest.lines() {
        let line = strip_comment(raw).trim();
        if line.starts_with('[') {
            table = line
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim()
                .to_owned();
            continue;
        }
        if !table.ends_with("dependencies") {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if key.contains('.') || value.contains("workspace") || value.contains("path") {
            continue;
        }
        if value.starts_with('"') || (value.starts_with('{') && value.contains("version")) {
            pinned.push(key.to_owned());
        }
    }
    pinned
}

/// Drops a trailing `# comment` that is not inside a quoted string.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// How long `cargo metadata` may take (it may have to update the registry index).
const METADATA_DEADLINE: Duration = Duration::from_secs(300);

/// Runs every rule on the workspace at `root`: `cargo metadata` for the graph, the members'
/// manifest files for rule 8, the source text for the rest.
pub fn check_live(root: &Path) -> Result<Vec<Violation>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = process::command(cargo, ["metadata", "--format-version", "1"]);
    cmd.current_dir(root);
    let outcome = process::run_with_deadline(&mut cmd, METADATA_DEADLINE, Output::Capture)?;
    outcome.check()?;
    let md = parse_metadata(&outcome.stdout)?;
    let mut violations = check(&md)?;

    let mut manifests = Vec::new();
    for id in &md.workspace_members {
        let Some(pkg) = md.packages.iter().find(|p| &p.id == id) else {
            continue;
        };
        let text = std::fs::read_to_string(&pkg.manifest_path)
            .map_err(|e| format!("cannot read {}: {e}", pkg.manifest_path))?;
        manifests.push((pkg.name.as_str(), text));
    }
    violations.extend(check_manifests(
        manifests.iter().map(|(n, t)| (*n, t.as_str())),
    ));
    violations.extend(check_versions(
        manifests.iter().map(|(n, t)| (*n, t.as_str())),
    ));
    violations.extend(crate::tidy_source::check_crates(&root.join("crates"))?);
    violations.extend(crate::tidy_decorators::check_crates(&root.join("crates"))?);
    violations.extend(crate::tidy_citations::check_tree(root)?);
    violations.extend(crate::tidy_tags::check_tree(root)?);
    violations.extend(crate::tidy_tests::check_workspace(root)?);
    violations.extend(crate::tidy_unsafe::check_tree(root)?);
    Ok(violations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A doctored metadata document. Workspace crates are `name` (id `path+file:///ws/name#0.1.0`),
    /// registry crates are `name@1` (id `registry+...#name@1.0.0`). Edges are
    /// `(from, to, kind)` with kind `None` (normal), `Some("dev")` or `Some("build")`; one pair
    /// may appear with several kinds.
    struct Doc {
        members: Vec<&'static str>,
        externals: Vec<&'static str>,
        edges: Vec<(&'static str, &'static str, Option<&'static str>)>,
    }

    fn id(name: &str) -> String {
        match name.strip_suffix("@1") {
            Some(n) => format!("registry+https://github.com/rust-lang/crates.io-index#{n}@1.0.0"),
            None => format!("path+file:///ws/crates/{name}#0.1.0"),
        }
    }

    impl Doc {
        /// The clean workspace: every member, with the allowed edges and a realistic closure.
        fn clean() -> Self {
            let mut members: Vec<&str> = WORKSPACE_EDGES.iter().map(|(n, _)| *n).collect();
            members.sort();
            Self {
                members,
                externals: vec![
                    "serde@1",
                    "serde_core@1",
                    "serde_derive@1",
                    "proc-macro2@1",
                    "quote@1",
                    "syn@1",
                    "unicode-ident@1",
                    "thiserror@1",
                    "thiserror-impl@1",
                    "async-trait@1",
                    "time@1",
                    "time-core@1",
                    "deranged@1",
                    "powerfmt@1",
                    "num-conv@1",
                    "event-listener@1",
                    "concurrent-queue@1",
                    "crossbeam-utils@1",
                    "parking@1",
                    "pin-project-lite@1",
                    "serde_json@1",
                    "itoa@1",
                    "memchr@1",
                    "zmij@1",
                    "base64@1",
                    "tokio@1",
                    "hyper@1",
                    "axum@1",
                    "aws-lc-rs@1",
                    "cc@1",
                    "proptest@1",
                ],
                edges: vec![
                    ("sandbox-core", "serde@1", None),
                    ("sandbox-core", "async-trait@1", None),
                    ("sandbox-core", "time@1", None),
                    ("sandbox-core", "event-listener@1", None),
                    ("sandbox-core", "proptest@1", Some("dev")),
                    ("sandbox-core", "tokio@1", Some("dev")),
                    ("serde@1", "serde_core@1", None),
                    ("serde@1", "serde_derive@1", None),
                    ("serde_derive@1", "proc-macro2@1", None),
                    ("serde_derive@1", "quote@1", None),
                    ("serde_derive@1", "syn@1", None),
                    ("syn@1", "unicode-ident@1", None),
                    ("thiserror@1", "thiserror-impl@1", None),
                    ("async-trait@1", "syn@1", None),
                    ("time@1", "deranged@1", None),
                    ("time@1", "time-core@1", None),
                    ("time@1", "num-conv@1", None),
                    ("deranged@1", "powerfmt@1", None),
                    ("event-listener@1", "concurrent-queue@1", None),
                    ("event-listener@1", "parking@1", None),
                    ("event-listener@1", "pin-project-lite@1", None),
                    ("concurrent-queue@1", "crossbeam-utils@1", None),
                    ("sandbox-envd", "sandbox-core", None),
                    ("sandbox-envd", "serde_json@1", None),
                    ("sandbox-envd", "base64@1", None),
                    ("sandbox-envd", "thiserror@1", None),
                    ("serde_json@1", "itoa@1", None),
                    ("serde_json@1", "memchr@1", None),
                    ("serde_json@1", "zmij@1", None),
                    ("serde_json@1", "serde_core@1", None),
                    ("sandbox-transport", "sandbox-core", None),
                    ("sandbox-transport", "sandbox-envd", None),
                    ("sandbox-transport", "hyper@1", None),
                    ("sandbox-transport", "aws-lc-rs@1", None),
                    ("aws-lc-rs@1", "cc@1", Some("build")),
                    ("sandbox-provider-docker", "sandbox-core", None),
                    ("sandbox-provider-docker", "sandbox-transport", None),
                    ("sandbox-provider-docker", "sandbox-iptables-listing", None),
                    ("sandbox-provider-docker", "sandbox-testkit", Some("dev")),
                    ("sandbox-provider-e2b", "sandbox-core", None),
                    ("sandbox-provider-e2b", "sandbox-transport", None),
                    ("sandbox-provider-e2b", "sandbox-envd", None),
                    ("sandbox-provider-e2b", "sandbox-testkit", Some("dev")),
                    ("sandbox-provider-cube", "sandbox-core", None),
                    ("sandbox-provider-cube", "sandbox-transport", None),
                    ("sandbox-provider-cube", "sandbox-envd", None),
                    ("sandbox-store-redis", "sandbox-core", None),
                    ("sandbox-store-redis", "tokio@1", None),
                    ("sandbox-store-redis", "sandbox-testkit", Some("dev")),
                    ("sandbox-session", "sandbox-core", None),
                    ("sandbox-session", "tokio@1", None),
                    ("sandbox-session", "sandbox-testkit", Some("dev")),
                    ("sandbox-testkit", "sandbox-core", None),
                    ("sandbox-testkit", "tokio@1", None),
                    ("sandbox-agent", "sandbox-envd", None),
                    ("sandbox-app", "sandbox-core", None),
                    ("sandbox-app", "sandbox-session", None),
                    ("sandbox-app", "sandbox-provider-docker", None),
                    ("sandbox-app", "sandbox-provider-e2b", None),
                    ("sandbox-app", "sandbox-store-redis", None),
                    ("sandbox-app", "axum@1", None),
                    ("axum@1", "hyper@1", None),
                    ("xtask", "sandbox-iptables-listing", None),
                    ("xtask", "serde_json@1", None),
                    ("xtask", "serde@1", None),
                ],
            }
        }

        fn with_edge(
            mut self,
            from: &'static str,
            to: &'static str,
            kind: Option<&'static str>,
        ) -> Self {
            if to.ends_with("@1") && !self.externals.contains(&to) {
                self.externals.push(to);
            }
            self.edges.push((from, to, kind));
            self
        }

        fn with_member(mut self, name: &'static str) -> Self {
            self.members.push(name);
            self
        }

        fn json(&self) -> Value {
            let packages: Vec<Value> = self
                .members
                .iter()
                .chain(&self.externals)
                .map(|n| {
                    json!({
                        "id": id(n),
                        "name": n.trim_end_matches("@1"),
                        "version": if n.ends_with("@1") { "1.0.0" } else { "0.1.0" },
                        "manifest_path": format!("/ws/crates/{n}/Cargo.toml"),
                    })
                })
                .collect();
            let mut deps: BTreeMap<(&str, &str), Vec<Value>> = BTreeMap::new();
            for (from, to, kind) in &self.edges {
                deps.entry((from, to))
                    .or_default()
                    .push(json!({ "kind": kind, "target": null }));
            }
            let nodes: Vec<Value> = self
                .members
                .iter()
                .chain(&self.externals)
                .map(|n| {
                    let d: Vec<Value> = deps
                        .iter()
                        .filter(|((from, _), _)| from == n)
                        .map(|((_, to), kinds)| {
                            json!({
                                "name": to.trim_end_matches("@1").replace('-', "_"),
                                "pkg": id(to),
                                "dep_kinds": kinds,
                            })
                        })
                        .collect();
                    json!({ "id": id(n), "deps": d, "dependencies": [], "features": [] })
                })
                .collect();
            json!({
                "packages": packages,
                "workspace_members": self.members.iter().map(|n| id(n)).collect::<Vec<_>>(),
                "resolve": { "nodes": nodes, "root": null },
                "version": 1,
            })
        }

        fn violations(&self) -> Vec<Violation> {
            let md = parse_metadata(&self.json().to_string()).unwrap();
            check(&md).unwrap()
        }
    }

    /// Asserts `doc` crosses `rule` with `needle` in the detail (one edge may cross several rules).
    fn check_crossed(doc: Doc, rule: &str, needle: &str) {
        let v = doc.violations();
        assert!(
            v.iter()
                .any(|v| v.rule == rule && v.detail.contains(needle)),
            "expected a {rule} violation mentioning {needle:?}, got: {v:#?}"
        );
    }

    #[test]
    fn clean_workspace_passes() {
        assert_eq!(Doc::clean().violations(), vec![]);
    }

    #[test]
    fn rule1_core_closure_outside_allow_list() {
        let doc = Doc::clean().with_edge("time@1", "libc@1", None);
        check_crossed(
            doc,
            "core-allow-list",
            "sandbox-core must not depend on libc (normal dependency path: sandbox-core -> time -> libc)",
        );
    }

    #[test]
    fn rule1_core_dev_and_build_deps_are_not_counted() {
        let doc = Doc::clean()
            .with_edge("sandbox-core", "libc@1", Some("dev"))
            .with_edge("time@1", "cc@1", Some("build"));
        assert_eq!(doc.violations(), vec![]);
    }

    #[test]
    fn rule1_core_direct_dep_outside_small_list() {
        // itoa is in the closure allow-list, but core may not name it itself.
        let doc = Doc::clean().with_edge("sandbox-core", "itoa@1", None);
        check_crossed(doc, "core-direct-deps", "sandbox-core names itoa");
    }

    #[test]
    fn rule2b_what_xtask_shares_depends_on_nothing() {
        let doc = Doc::clean().with_edge("sandbox-iptables-listing", "serde@1", None);
        check_crossed(
            doc,
            "shared-with-xtask",
            "sandbox-iptables-listing must not depend on serde",
        );
        // A dev-dependency is not built for xtask.
        let doc = Doc::clean().with_edge("sandbox-iptables-listing", "proptest@1", Some("dev"));
        assert_eq!(doc.violations(), vec![]);
    }

    #[test]
    fn rule1_core_may_not_take_back_thiserror() {
        // Core dropped thiserror (issue 14); envd may still use it, core may not.
        let doc = Doc::clean().with_edge("sandbox-core", "thiserror@1", None);
        check_crossed(
            doc,
            "core-allow-list",
            "sandbox-core must not depend on thiserror",
        );
    }

    #[test]
    fn rule2_envd_closure() {
        let doc = Doc::clean().with_edge("sandbox-envd", "tokio@1", None);
        check_crossed(
            doc,
            "envd-allow-list",
            "sandbox-envd must not depend on tokio",
        );
        let doc = Doc::clean().with_edge("base64@1", "hashbrown@1", None);
        check_crossed(
            doc,
            "envd-allow-list",
            "sandbox-envd -> base64 -> hashbrown",
        );
    }

    #[test]
    fn rule3_workspace_edges() {
        let doc = Doc::clean().with_edge("sandbox-session", "sandbox-envd", None);
        check_crossed(
            doc,
            "workspace-edges",
            "sandbox-session must not depend on sandbox-envd",
        );
        let doc = Doc::clean().with_edge("sandbox-app", "sandbox-testkit", None);
        // Also crosses rule 5 (testkit is dev-only), so only look for this rule's line.
        let v = doc.violations();
        assert!(v.iter().any(|v| v.rule == "workspace-edges"
            && v.detail == "sandbox-app must not depend on sandbox-testkit"));
        let doc = Doc::clean().with_edge("sandbox-agent", "sandbox-core", None);
        check_crossed(
            doc,
            "workspace-edges",
            "sandbox-agent must not depend on sandbox-core",
        );
        let doc = Doc::clean().with_edge("xtask", "sandbox-core", None);
        check_crossed(
            doc,
            "workspace-edges",
            "xtask must not depend on sandbox-core",
        );
        // Dev edges are not this rule's business.
        let doc = Doc::clean().with_edge("sandbox-agent", "sandbox-core", Some("dev"));
        assert_eq!(doc.violations(), vec![]);
    }

    #[test]
    fn rule3_unknown_member_needs_a_table_line() {
        let doc =
            Doc::clean()
                .with_member("sandbox-new")
                .with_edge("sandbox-new", "sandbox-core", None);
        check_crossed(
            doc,
            "workspace-edges",
            "sandbox-new is a workspace member with no line",
        );
    }

    #[test]
    fn rule4_adapters_never_depend_on_each_other() {
        for kind in [None, Some("dev"), Some("build")] {
            let doc = Doc::clean().with_edge("sandbox-provider-e2b", "sandbox-provider-cube", kind);
            let v = doc.violations();
            assert!(
                v.iter().any(|v| v.rule == "adapter-isolation"
                    && v.detail.contains("adapter sandbox-provider-e2b must not depend on adapter sandbox-provider-cube")),
                "kind {kind:?}: {v:#?}"
            );
        }
        // Through a dev-dependency's normal closure: testkit -> store-redis.
        let doc = Doc::clean().with_edge("sandbox-testkit", "sandbox-store-redis", None);
        let v = doc.violations();
        assert!(
            v.iter().any(|v| v.rule == "adapter-isolation"
                && v.detail
                    .contains("sandbox-provider-docker -> sandbox-testkit -> sandbox-store-redis")),
            "{v:#?}"
        );
    }

    #[test]
    fn rule5_nothing_depends_on_app() {
        let doc = Doc::clean().with_edge("sandbox-session", "sandbox-app", Some("dev"));
        check_crossed(
            doc,
            "app-has-no-dependents",
            "sandbox-session depends on sandbox-app",
        );
    }

    #[test]
    fn rule5_testkit_only_as_dev_dependency() {
        // Build kind only, so no other rule (workspace edges look at normal edges) fires.
        let doc = Doc::clean().with_edge("sandbox-session", "sandbox-testkit", Some("build"));
        check_crossed(
            doc,
            "testkit-dev-only",
            "sandbox-session depends on sandbox-testkit",
        );
        // Dev and normal at once is still a violation.
        let doc = Doc::clean().with_edge("sandbox-store-redis", "sandbox-testkit", None);
        let v = doc.violations();
        assert!(v.iter().any(|v| v.rule == "testkit-dev-only"), "{v:#?}");
    }

    #[test]
    fn rule6_session_has_no_server_cli_or_config_format() {
        for forbidden in [
            "axum@1",
            "hyper@1",
            "clap@1",
            "toml@1",
            "serde_yaml@1",
            "figment@1",
            "config@1",
        ] {
            let doc = Doc::clean().with_edge("tokio@1", forbidden, None);
            let v = doc.violations();
            let name = forbidden.trim_end_matches("@1");
            assert!(
                v.iter().any(|v| v.rule == "session-no-server"
                    && v.detail
                        .contains(&format!("sandbox-session -> tokio -> {name}"))),
                "{forbidden}: {v:#?}"
            );
        }
        // As a dev-dependency it is fine (tests may spin up an HTTP server).
        let doc = Doc::clean().with_edge("sandbox-session", "hyper@1", Some("dev"));
        assert_eq!(doc.violations(), vec![]);
    }

    #[test]
    fn rule7_no_ring_anywhere() {
        let doc = Doc::clean().with_edge("hyper@1", "ring@1", None);
        let v = doc.violations();
        assert!(v.iter().all(|v| v.rule == "no-ring"), "{v:#?}");
        for member in [
            "sandbox-transport",
            "sandbox-app",
            "sandbox-provider-docker",
        ] {
            assert!(
                v.iter().any(|v| v
                    .detail
                    .starts_with(&format!("{member} must not depend on ring"))),
                "{member}: {v:#?}"
            );
        }
        // A build-only ring (e.g. a build script's helper) is not linked into anything.
        let doc = Doc::clean().with_edge("aws-lc-rs@1", "ring@1", Some("build"));
        assert_eq!(doc.violations(), vec![]);
    }

    #[test]
    fn rule7_a_weakly_mentioned_optional_ring_is_not_built() {
        // rustls-webpki's `alloc = ["ring?/alloc"]`: metadata lists the edge, nothing builds it.
        let weak = |active: &[&str]| {
            let mut doc = Doc::clean()
                .with_edge("hyper@1", "webpki@1", None)
                .with_edge("webpki@1", "ring@1", None)
                .json();
            let webpki = id("webpki@1");
            for p in doc["packages"].as_array_mut().unwrap() {
                if p["id"] == webpki.as_str() {
                    p["dependencies"] = json!([{ "name": "ring", "optional": true }]);
                    p["features"] = json!({ "alloc": ["ring?/alloc"], "ring": ["dep:ring"] });
                }
            }
            for n in doc["resolve"]["nodes"].as_array_mut().unwrap() {
                if n["id"] == webpki.as_str() {
                    n["features"] = json!(active);
                }
            }
            check(&parse_metadata(&doc.to_string()).unwrap()).unwrap()
        };
        assert_eq!(weak(&["alloc"]), vec![]);
        let v = weak(&["alloc", "ring"]);
        assert!(
            !v.is_empty() && v.iter().all(|v| v.rule == "no-ring"),
            "{v:#?}"
        );
    }

    #[test]
    fn rule8_workspace_lints_in_every_manifest() {
        let good = [
            "[package]\nname = \"a\"\n\n[lints]\nworkspace = true\n",
            "[package]\nname = \"a\"\n[lints]\n# comment\nworkspace=true # trailing\n",
            "lints.workspace = true\n[package]\nname = \"a\"\n",
            "lints = { workspace = true }\n[package]\nname = \"a\"\n",
            "[ lints ]\n  workspace   =   true\n",
        ];
        for text in good {
            assert_eq!(check_manifests([("a", text)]), vec![], "{text}");
        }
        let bad = [
            "[package]\nname = \"a\"\n",
            "[package]\nname = \"a\"\n[lints]\nworkspace = false\n",
            "[package]\nlints.workspace = true\n",
            "[lints.rust]\nunsafe_code = \"deny\"\n",
            "[package]\nname = \"a\"\n# [lints]\n# workspace = true\n",
            "[lints]\n[dependencies]\nworkspace = true\n",
        ];
        for text in bad {
            let v = check_manifests([("sandbox-x", text)]);
            assert_eq!(v.len(), 1, "{text}");
            assert_eq!(v[0].rule, "workspace-lints");
            assert_eq!(
                v[0].to_string(),
                "tidy: workspace-lints: sandbox-x's Cargo.toml lacks `[lints] workspace = true`"
            );
        }
    }

    #[test]
    fn rule13_versions_come_from_the_workspace() {
        let good = "[package]\nname = \"a\"\nversion.workspace = true\n\n[dependencies]\n\
                    serde.workspace = true\nhyper = { workspace = true, features = [\"client\"] }\n\
                    sandbox-core = { path = \"../sandbox-core\" }\n\
                    [target.'cfg(unix)'.dev-dependencies]\nrustix = { workspace = true }\n\
                    [[bench]]\nname = \"b\"\n[features]\ndocker = [\"dep:x\"]\n";
        assert_eq!(check_versions([("a", good)]), vec![], "{good}");
        let bad = "[dependencies]\nurl = \"2.5\"\n# tar = \"0.4\"\n\
                   [target.'cfg(unix)'.dev-dependencies]\n\
                   rustix = { version = \"1\", default-features = false }\n";
        let v = check_versions([("sandbox-x", bad)]);
        let names: Vec<&str> = v.iter().map(|v| v.rule).collect();
        assert_eq!(names, ["workspace-versions", "workspace-versions"], "{v:?}");
        assert!(v[0].to_string().contains("pins `url` itself"), "{}", v[0]);
        assert!(
            v[1].to_string().contains("pins `rustix` itself"),
            "{}",
            v[1]
        );
    }

    #[test]
    fn no_resolve_graph_is_an_error() {
        let md =
            parse_metadata(r#"{"packages":[],"workspace_members":[],"resolve":null}"#).unwrap();
        assert!(check(&md).unwrap_err().contains("resolve"));
    }

    #[test]
    fn display_is_one_line() {
        let v = violation("no-ring", "a must not depend on ring".into());
        assert_eq!(v.to_string(), "tidy: no-ring: a must not depend on ring");
    }
}
