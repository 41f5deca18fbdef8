//! Rule 12, a decorator forwards every method: an impl of a port or capability trait for a
//! type that wraps another implementor carries `#[deny(clippy::missing_trait_methods)]`, so a
//! provided method (`read_file_stream`, an `as_*` accessor, `optimistic_reads`) cannot be left
//! to its default and silently bypass the inner component (ARCHITECTURE.md, invariant
//! "decorators forward every method").
//!
//! How a decorator impl is recognized, from the source text of the crates' `src/` trees:
//! - the trait is one of [`PORT_TRAITS`];
//! - and the impl wraps another implementor: its header is generic over one of those traits
//!   (`impl<P: SandboxProvider> Snapshots for Checked<P>`), or the self type's definition in
//!   the same file holds a `dyn` of one of them (`inner: Arc<dyn BindingStore>`) or a type
//!   some scanned file implements one of them for (`inner: FakeProvider`).
//!
//! Test doubles under `tests/` that change a few methods on purpose are not scanned; they
//! forward the rest with the test kit's forwarding helper.

use std::collections::BTreeSet;
use std::path::Path;

use crate::tidy::Violation;
use crate::tidy_source::rust_files;

/// The ports and capability traits of `sandbox-core` a decorator may wrap.
pub const PORT_TRAITS: &[&str] = &[
    "SandboxProvider",
    "Snapshots",
    "TemplateCatalog",
    "Terminals",
    "Desktop",
    "KeepAlive",
    "ConnectProbe",
    "BindingStore",
    "TurnLeases",
    "RewindLocks",
    "ActivityRegistry",
    "OptimisticReads",
];

const ATTRIBUTE: &str = "#[deny(clippy::missing_trait_methods)]";

/// One `impl <Trait> for <Type>` of a port trait.
#[derive(Debug)]
struct PortImpl {
    line: usize,
    header: String,
    trait_name: &'static str,
    self_type: String,
    has_attribute: bool,
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `word` occurs in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char)
    })
}

/// The code of a line, without a trailing `//` comment.
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("").trim()
}

/// The port impls of one file.
fn port_impls(text: &str) -> Vec<PortImpl> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, raw) in lines.iter().enumerate() {
        let line = code(raw);
        if !(line.starts_with("impl") || line.starts_with("unsafe impl")) {
            continue;
        }
        // The header may wrap: read on to the opening brace.
        let mut header = line.to_owned();
        let mut next = n + 1;
        while !header.contains('{') && next < lines.len() {
            header.push(' ');
            header.push_str(code(lines[next]));
            next += 1;
        }
        let head = header.split('{').next().unwrap_or("").to_owned();
        let Some((before_for, after_for)) = head.split_once(" for ") else {
            continue;
        };
        let trait_path = before_for.rsplit([' ', '>']).next().unwrap_or("");
        let trait_last = trait_path.rsplit("::").next().unwrap_or("");
        let Some(&trait_name) = PORT_TRAITS.iter().find(|t| **t == trait_last) else {
            continue;
        };
        let self_type = after_for
            .split_whitespace()
            .next()
            .unwrap_or("")
            .split('<')
            .next()
            .unwrap_or("")
            .to_owned();
        // Attributes directly above the impl (other attributes and comments may sit between).
        let mut has_attribute = false;
        let mut above = n;
        while above > 0 {
            above -= 1;
            let prev = lines[above].trim();
            if prev.starts_with("#[") || prev.starts_with("//") {
                has_attribute |= prev.replace(' ', "") == ATTRIBUTE;
            } else {
                break;
            }
        }
        out.push(PortImpl {
            line: n + 1,
            header: head,
            trait_name,
            self_type,
            has_attribute,
        });
    }
    out
}

/// The text of `name`'s struct definition in `text` (to its `;` or closing brace).
fn struct_definition(text: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    for (n, raw) in lines.iter().enumerate() {
        let line = code(raw);
        let Some(at) = line.find("struct ") else {
            continue;
        };
        let rest = &line[at + "struct ".len()..];
        let declared: String = rest.chars().take_while(|c| is_ident_char(*c)).collect();
        if declared != name {
            continue;
        }
        let mut def = String::new();
        let mut depth = 0i32;
        for l in &lines[n..] {
            let l = code(l);
            def.push_str(l);
            def.push('\n');
            depth += l.matches(['{', '(']).count() as i32 - l.matches(['}', ')']).count() as i32;
            if depth <= 0 && (l.ends_with(';') || l.ends_with('}')) {
                break;
            }
        }
        return Some(def);
    }
    None
}

/// Whether the impl wraps another implementor (see the module docs).
fn is_decorator(imp: &PortImpl, text: &str, implementors: &BTreeSet<String>) -> bool {
    let generics = imp.header.split(" for ").next().unwrap_or("");
    let generic_over_port = generics
        .split_once('<')
        .is_some_and(|(_, g)| PORT_TRAITS.iter().any(|t| has_word(g, t)));
    let where_over_port = imp
        .header
        .split_once(" where ")
        .is_some_and(|(_, w)| PORT_TRAITS.iter().any(|t| has_word(w, t)));
    if generic_over_port || where_over_port {
        return true;
    }
    let Some(def) = struct_definition(text, &imp.self_type) else {
        return false;
    };
    let body = def.split_once(['{', '(']).map_or("", |(_, b)| b);
    PORT_TRAITS.iter().any(|t| {
        body.contains(&format!("dyn {t}")) || body.contains(&format!("dyn sandbox_core::{t}"))
    }) || implementors
        .iter()
        .any(|ty| *ty != imp.self_type && has_word(body, ty))
}

/// Checks a set of files, given as `(path, text)`.
pub fn check_files<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
) -> Vec<Violation> {
    let implementors: BTreeSet<String> = files
        .clone()
        .into_iter()
        .flat_map(|(_, text)| port_impls(text))
        .map(|i| i.self_type)
        .collect();
    let mut out = Vec::new();
    for (path, text) in files {
        for imp in port_impls(text) {
            if !imp.has_attribute && is_decorator(&imp, text, &implementors) {
                out.push(Violation {
                    rule: "decorator-forwards-every-method",
                    detail: format!(
                        "{path}:{}: `impl {} for {}` wraps another implementor but lacks {ATTRIBUTE}",
                        imp.line, imp.trait_name, imp.self_type
                    ),
                });
            }
        }
    }
    out
}

/// Runs rule 12 over the `src/` trees of the crates under `crates_dir`.
pub fn check_crates(crates_dir: &Path) -> Result<Vec<Violation>, String> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(crates_dir)
        .map_err(|e| format!("cannot read {}: {e}", crates_dir.display()))?;
    for entry in entries.flatten() {
        for file in rust_files(&entry.path().join("src")) {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            files.push((file.display().to_string(), text));
        }
    }
    Ok(check_files(
        files.iter().map(|(p, t)| (p.as_str(), t.as_str())),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADAPTER: &str = r#"
pub struct Backend { inner: Arc<Inner> }

#[async_trait]
impl SandboxProvider for Backend {
    async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error> {
        self.inner.get(id)
    }
}
"#;

    fn check(decorator: &str) -> Vec<Violation> {
        check_files([("adapter.rs", ADAPTER), ("layer.rs", decorator)])
    }

    #[test]
    fn a_planted_decorator_without_the_attribute_is_refused() {
        for planted in [
            // Generic over the port.
            "pub struct Checked<P> { inner: P }\n#[async_trait]\nimpl<P: SandboxProvider> Snapshots for Checked<P> {\n}",
            // A `where` clause, the header on several lines.
            "pub struct Timed<S> { inner: S }\nimpl<S> sandbox_core::BindingStore\n    for Timed<S>\nwhere\n    S: BindingStore,\n{\n}",
            // Holding a `dyn` of a port.
            "struct Metered {\n    inner: Arc<dyn SandboxProvider>,\n    metrics: Arc<Metrics>,\n}\n#[async_trait]\n#[allow(dead_code)]\nimpl SandboxProvider for Metered {\n}",
            // Wrapping a known implementor, in a tuple struct.
            "struct Forgetful(Backend);\nimpl SandboxProvider for Forgetful {\n}",
        ] {
            let v = check(planted);
            assert_eq!(v.len(), 1, "{planted}: {v:?}");
            assert_eq!(v[0].rule, "decorator-forwards-every-method");
            assert!(v[0].to_string().contains("layer.rs:"), "{}", v[0]);
        }
    }

    #[test]
    fn decorators_with_the_attribute_and_plain_adapters_pass() {
        for ok in [
            "pub struct Checked<P> { inner: P }\n#[async_trait]\n#[deny(clippy::missing_trait_methods)]\nimpl<P: SandboxProvider> SandboxProvider for Checked<P> {\n}",
            // The attribute may sit among others, with a comment between.
            "struct Metered { inner: Arc<dyn BindingStore> }\n#[deny(clippy::missing_trait_methods)]\n// Every method is timed.\n#[async_trait]\nimpl BindingStore for Metered {\n}",
            // Not a decorator: holds no implementor.
            "struct Memory { map: Mutex<HashMap<u8, u8>> }\nimpl BindingStore for Memory {\n}",
            // Not a port trait.
            "struct Wrap(Backend);\nimpl fmt::Debug for Wrap {\n}",
        ] {
            assert!(check(ok).is_empty(), "{ok}: {:?}", check(ok));
        }
    }
}
