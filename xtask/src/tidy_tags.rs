//! Rule 15, contract tags: the port's rustdoc and the conformance suite name the same
//! contract. A contract bullet the suite checks carries a tag in brackets
//! (`` /// - `[exec.timeout]` A command exceeding ... ``), and each case cites the tags it checks
//! in its registry line (`case!(exec::exec_timeout_kills, [], [], ["exec.timeout"])`). Every tag
//! a port documents must be cited by at least one case of its suite (else the bullet is a promise
//! nobody checks), and every tag a case cites must be documented on the port (else the cite
//! names nothing a reader can find).
//!
//! A bullet the suite cannot check through the port stays in the rustdoc without a tag.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::tidy::Violation;

/// Each suite: the port file whose tags it checks, and the registry file where its cases cite
/// them (paths from the workspace root).
pub const SUITES: &[(&str, &str)] = &[
    (
        "crates/sandbox-core/src/ports/provider.rs",
        "crates/sandbox-testkit/src/conformance/cases/mod.rs",
    ),
    (
        "crates/sandbox-core/src/ports/store.rs",
        "crates/sandbox-testkit/src/conformance/store/cases/mod.rs",
    ),
    (
        "crates/sandbox-core/src/ports/deadlines.rs",
        "crates/sandbox-testkit/src/conformance/deadlines/cases/mod.rs",
    ),
];

const RULE: &str = "contract-tags";

/// The tags a port's doc comments (`///`, `//!`) document: each `` `[name]` `` whose name is
/// lower-case words joined by `.` (rustdoc links are `` [`Name`] ``, so they never match).
pub fn documented_tags(port: &str) -> BTreeSet<String> {
    let mut tags = BTreeSet::new();
    for line in port.lines() {
        let line = line.trim_start();
        if !(line.starts_with("///") || line.starts_with("//!")) {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("`[") {
            rest = &rest[start + 2..];
            let Some(end) = rest.find("]`") else { break };
            let name = &rest[..end];
            if is_tag(name) {
                tags.insert(name.to_owned());
            }
            rest = &rest[end + 2..];
        }
    }
    tags
}

fn is_tag(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
}

/// The tags each case of a registry cites: case name → cited tags, read from every
/// `case!(module::name, [requires...], [forbids...], ["tag", ...])` outside comments (the only
/// string literals in a registry line are its cites).
pub fn cited_tags(registry: &str) -> BTreeMap<String, Vec<String>> {
    let code: String = registry
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut cases = BTreeMap::new();
    let mut rest = code.as_str();
    while let Some(start) = rest.find("case!(") {
        rest = &rest[start + "case!(".len()..];
        let (body, after) = balanced(rest);
        rest = after;
        let Some(head) = body.split(',').next() else {
            continue;
        };
        let name = head.rsplit("::").next().unwrap_or(head).trim();
        if name.starts_with('$') {
            continue; // The macro's own definition.
        }
        cases.insert(name.to_owned(), string_literals(body));
    }
    cases
}

/// Splits `text` (just after an opening parenthesis) at its matching closing one.
fn balanced(text: &str) -> (&str, &str) {
    let mut depth = 1_usize;
    let mut in_string = false;
    for (i, c) in text.char_indices() {
        match (in_string, c) {
            (true, '"') | (false, '"') => in_string = !in_string,
            (false, '(') => depth += 1,
            (false, ')') => {
                depth -= 1;
                if depth == 0 {
                    return (&text[..i], &text[i + 1..]);
                }
            }
            _ => {}
        }
    }
    (text, "")
}

fn string_literals(text: &str) -> Vec<String> {
    text.split('"')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_owned())
        .collect()
}

/// Checks one suite: `port` and `registry` are (path, text) pairs.
pub fn check_suite(port: (&str, &str), registry: (&str, &str)) -> Vec<Violation> {
    let documented = documented_tags(port.1);
    let cited = cited_tags(registry.1);
    let mut out = Vec::new();
    if cited.is_empty() {
        out.push(Violation {
            rule: RULE,
            detail: format!("{} registers no case! lines to read cites from", registry.0),
        });
        return out;
    }
    let all_cited: BTreeSet<&str> = cited.values().flatten().map(String::as_str).collect();
    for tag in &documented {
        if !all_cited.contains(tag.as_str()) {
            out.push(Violation {
                rule: RULE,
                detail: format!(
                    "{} documents `[{tag}]`, but no case in {} cites it: add the case that \
                     checks it, or drop the tag if the suite cannot check that bullet",
                    port.0, registry.0
                ),
            });
        }
    }
    for (case, tags) in &cited {
        for tag in tags.iter().filter(|t| !documented.contains(t.as_str())) {
            out.push(Violation {
                rule: RULE,
                detail: format!(
                    "case {case} in {} cites `{tag}`, which {} does not document: cite the \
                     bullet's real tag, or tag the bullet on the port",
                    registry.0, port.0
                ),
            });
        }
    }
    out
}

/// Runs rule 14 on every suite of the workspace at `root`.
pub fn check_tree(root: &Path) -> Result<Vec<Violation>, String> {
    let read = |rel: &str| {
        std::fs::read_to_string(root.join(rel)).map_err(|e| format!("cannot read {rel}: {e}"))
    };
    let mut out = Vec::new();
    for (port, registry) in SUITES {
        out.extend(check_suite(
            (port, &read(port)?),
            (registry, &read(registry)?),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORT: &str = r#"
//! Contract bullets carry a tag in brackets (e.g. `[exec.io]`).

/// A backend. See [`Error`] and [`exec`](Port::exec).
pub trait Port {
    /// Runs a command.
    /// - `[exec.io]` Stdin is delivered; env applies.
    /// - `[exec.timeout]` A command exceeding its timeout is killed, and
    ///   (`[exec.timeout.reaped]`) leaves nothing behind.
    fn exec(&self);
}
// `[not.a_doc_comment]` is no tag.
"#;

    const REGISTRY: &str = r#"
macro_rules! case {
    ($module:ident :: $name:ident, [$($req:ident),*], [$($cite:literal),*]) => {};
}
pub fn all_cases() -> Vec<Case> {
    vec![
        case!(exec::exec_io, [], ["exec.io"]),
        // case!(exec::old, [], ["exec.gone"]),
        case!(
            exec::exec_timeout_kills,
            [PosixShell],
            ["exec.timeout", "exec.timeout.reaped"]
        ),
    ]
}
"#;

    fn check(port: &str, registry: &str) -> Vec<Violation> {
        check_suite(("port.rs", port), ("cases.rs", registry))
    }

    /// Asserts `v` is exactly one contract-tags violation saying `needle`.
    fn refused_once(v: &[Violation], needle: &str) {
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].rule, "contract-tags");
        assert!(v[0].to_string().contains(needle), "{}", v[0]);
    }

    #[test]
    fn rule15_reads_tags_and_cites() {
        let tags: Vec<String> = documented_tags(PORT).into_iter().collect();
        assert_eq!(tags, ["exec.io", "exec.timeout", "exec.timeout.reaped"]);
        let cites = cited_tags(REGISTRY);
        assert_eq!(cites.len(), 2, "{cites:?}");
        assert_eq!(cites["exec_io"], ["exec.io"]);
        assert_eq!(
            cites["exec_timeout_kills"],
            ["exec.timeout", "exec.timeout.reaped"]
        );
        assert_eq!(check(PORT, REGISTRY), vec![]);
    }

    #[test]
    fn rule15_a_planted_uncited_tag_is_refused() {
        let port = PORT.replace(
            "    fn exec(&self);",
            "    /// - `[exec.cancel]` Dropping the call kills it.\n    fn exec(&self);",
        );
        refused_once(
            &check(&port, REGISTRY),
            "port.rs documents `[exec.cancel]`, but no case in cases.rs cites it",
        );
    }

    #[test]
    fn rule15_a_planted_unknown_cite_is_refused() {
        let registry = REGISTRY.replace(r#"["exec.io"]"#, r#"["exec.io", "exec.stdin"]"#);
        refused_once(
            &check(PORT, &registry),
            "case exec_io in cases.rs cites `exec.stdin`, which port.rs does not",
        );
    }

    #[test]
    fn rule15_a_registry_without_cases_is_refused() {
        refused_once(
            &check(PORT, "pub fn all_cases() -> Vec<Case> { Vec::new() }"),
            "cases.rs registers no case! lines",
        );
    }
}
