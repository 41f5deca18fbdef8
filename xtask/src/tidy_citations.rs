//! Rule 14, the repository cites nothing outside itself: a comment, a string or a page that
//! points at a document a newcomer cannot open (`protocol.md §3.1`, a shared guide, a seed file,
//! "the reference implementation", a bare "invariant 7" of a checklist kept elsewhere) is a
//! claim nobody can check. What the code relies on is stated where it is used, or written into
//! crate docs or a `docs/` page and pointed at there; `ARCHITECTURE.md`'s invariants are cited
//! by what they say, not by a number. A published standard is citable: a section sign after an
//! RFC number (`RFC 9110 §11.1`) passes.
//!
//! Scanned: every `.rs`, `.md` and `.toml` file of the workspace, except build output, git's
//! own files, the raw benchmark records under `docs/bench/` (captured tool output, not prose),
//! and this file, which has to spell the patterns out. A line-based, case-insensitive scan of
//! whole lines: the patterns never occur in code, so comments and strings need no parser.

use std::path::{Path, PathBuf};

use crate::tidy::Violation;

/// Phrases that only ever point outside the repository, lower-cased.
const OUTSIDE: &[&str] = &[
    "protocol.md",
    "dependencies.md",
    "weknora-behaviours",
    "../shared",
    "/work/shared",
    "shared/guides",
    "shared/reference",
    "shared/seeds",
    "seeds/",
    "seed file",
    "the seed's",
    "the reference implementation",
    "the reference checklist",
];

/// Directories never scanned, by name.
const SKIPPED_DIRS: &[&str] = &["target", ".git"];

/// Paths never scanned, relative to the root with `/` separators, each with its reason above.
const SKIPPED_PATHS: &[&str] = &[
    // Raw benchmark records: tool output captured verbatim.
    "docs/bench",
    // This rule: its patterns and its self-tests' planted citations.
    "xtask/src/tidy_citations.rs",
];

/// What each citation on one line points at (the matched pattern), at most once each. `before`
/// is the previous line: a section sign is fine after an RFC number there or on this line
/// ("RFC 9110 §11.1"), since a published standard is something anyone can open.
pub fn citations_in(before: &str, line: &str) -> Vec<String> {
    let lower = line.to_lowercase();
    let names_an_rfc = names_an_rfc(&before.to_lowercase()) || names_an_rfc(&lower);
    let mut out: Vec<String> = OUTSIDE
        .iter()
        .filter(|p| lower.contains(**p))
        .map(|p| (*p).to_owned())
        .collect();
    // `§3`, `§ 3.1`: a section number of some other document.
    let mut rest = lower.as_str();
    while let Some(at) = rest.find('§') {
        let after = rest[at + '§'.len_utf8()..].trim_start();
        if after.starts_with(|c: char| c.is_ascii_digit()) && !names_an_rfc {
            out.push("§<number>".to_owned());
            break;
        }
        rest = &rest[at + '§'.len_utf8()..];
    }
    // "the reference" as a whole phrase ("the reference's 2 s", "the reference default"); "the
    // references" and "reference-counted" are other words.
    if has_phrase(&lower, "the reference") {
        out.push("the reference".to_owned());
    }
    // "invariant 13", "invariants 30–32": numbers of a checklist kept elsewhere.
    for word in ["invariant ", "invariants "] {
        if lower
            .match_indices(word)
            .any(|(at, _)| lower[at + word.len()..].starts_with(|c: char| c.is_ascii_digit()))
        {
            out.push("invariant <number>".to_owned());
            break;
        }
    }
    out.dedup();
    out
}

/// Whether `text` (lower-cased) names an RFC by number: `rfc 9110`, `rfc9110`.
fn names_an_rfc(text: &str) -> bool {
    text.match_indices("rfc").any(|(at, _)| {
        text[at + 3..]
            .trim_start()
            .starts_with(|c: char| c.is_ascii_digit())
    })
}

/// Whether `phrase` occurs in `text` not followed by a letter, digit, `-` or `_`.
fn has_phrase(text: &str, phrase: &str) -> bool {
    text.match_indices(phrase).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + phrase.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric)
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
    })
}

/// Checks one file's text; `path` is only used in messages.
pub fn check_text(path: &str, text: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut before = "";
    for (n, line) in text.lines().enumerate() {
        for what in citations_in(before, line) {
            out.push(Violation {
                rule: "outside-citation",
                detail: format!(
                    "{path}:{}: cites `{what}` outside the repository — state the fact, or write it into crate docs or docs/ and point there",
                    n + 1
                ),
            });
        }
        before = line;
    }
    out
}

/// Every scanned file under `root`, as `(path relative to root with '/', absolute path)`.
pub fn scanned_files(root: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            let rel = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            if SKIPPED_PATHS.contains(&rel.as_str()) {
                continue;
            }
            if path.is_dir() {
                let name = entry.file_name();
                if !SKIPPED_DIRS.iter().any(|d| name == **d) {
                    stack.push(path);
                }
            } else if path
                .extension()
                .is_some_and(|e| e == "rs" || e == "md" || e == "toml")
            {
                out.push((rel, path));
            }
        }
    }
    out.sort();
    out
}

/// Runs rule 14 over the workspace at `root`.
pub fn check_tree(root: &Path) -> Result<Vec<Violation>, String> {
    let mut out = Vec::new();
    for (rel, path) in scanned_files(root) {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        out.extend(check_text(&rel, &text));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planted_citations_are_refused() {
        for (bad, what) in [
            ("/// envd's port (protocol.md §3.1).", "protocol.md"),
            ("//! The rules (PROTOCOL.MD, section 4).", "protocol.md"),
            ("// see §4.2 of the spec", "§<number>"),
            ("// see § 7", "§<number>"),
            ("/// Timings default to the reference's.", "the reference"),
            ("// As the reference writes it", "the reference"),
            ("/// (the reference default)", "the reference"),
            (
                "//! It replaces the reference implementation's doubles",
                "the reference implementation",
            ),
            (
                "/// Invariant 13: one sandbox per session.",
                "invariant <number>",
            ),
            ("//! and invariants 30–32.", "invariant <number>"),
            ("// from ../shared/guides/style.md", "../shared"),
            ("let doc = \"/work/shared/README.md\";", "/work/shared"),
            ("# pinned as dependencies.md says", "dependencies.md"),
            ("// the design is in seeds/000.txt", "seeds/"),
            ("// the seed's godoc says so", "the seed's"),
        ] {
            let v = check_text("a.rs", bad);
            assert!(
                v.iter().any(|v| v.detail.contains(&format!("`{what}`"))),
                "{bad}: {v:?}"
            );
            assert!(v.iter().all(|v| v.rule == "outside-citation"));
            assert!(v[0].to_string().contains("a.rs:1"), "{}", v[0]);
        }
    }

    #[test]
    fn in_repository_pointers_and_ordinary_words_pass() {
        for ok in [
            "/// envd's port inside a sandbox (`docs/envd.md`, \"Addressing\").",
            "//! ARCHITECTURE.md, invariant \"lookup-only never provisions\".",
            "// Rule 9 of tidy: no global mutable state.",
            "let seed = l.resolve(&key(1)).await.unwrap();",
            "/// Redis Cluster seed nodes (`host:port`).",
            "    fastrand::Rng::with_seed(7).fill(&mut big);",
            "/// An opaque, provider-issued reference to a live sandbox.",
            "// layers are reference-counted by the engine",
            "/// Returns the references it holds.",
            "/// The `workspace` section is shared by replicas.",
            "/// 2 s: the store's default.",
            "// § alone, or §x, is not a section number",
            "/// The scheme is case-insensitive (RFC 9110 §11.1).",
        ] {
            assert!(check_text("a.rs", ok).is_empty(), "{ok}");
        }
        // A standard's section may wrap onto the next line; another document's may not.
        assert!(check_text("a.rs", "/// (RFC 9110\n/// §11.1), so").is_empty());
        assert_eq!(
            check_text("a.rs", "/// (see the RFCs\n/// §11.1), so").len(),
            1
        );
    }

    #[test]
    fn the_walk_scans_sources_and_pages_and_skips_build_output() {
        let root =
            std::env::temp_dir().join(format!("xtask-tidy-citations-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let write = |rel: &str, text: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap_or(&root)).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("crates/a/src/lib.rs", "//! fine\n/// see protocol.md §3\n");
        write("crates/a/tests/t.rs", "// Invariant 14: planted\n");
        write("docs/page.md", "As the reference says.\n");
        write("crates/a/Cargo.toml", "# pinned per dependencies.md\n");
        write("crates/a/notes.txt", "protocol.md\n");
        write("target/debug/build/x.rs", "protocol.md\n");
        write("docs/bench/api.md", "protocol.md\n");
        let v = check_tree(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        let lines: Vec<String> = v.iter().map(ToString::to_string).collect();
        let files: std::collections::BTreeSet<&str> = v
            .iter()
            .filter_map(|v| v.detail.split(':').next())
            .collect();
        assert_eq!(
            files.into_iter().collect::<Vec<_>>(),
            [
                "crates/a/Cargo.toml",
                "crates/a/src/lib.rs",
                "crates/a/tests/t.rs",
                "docs/page.md"
            ],
            "{lines:#?}"
        );
        assert!(
            lines.iter().any(|l| l.contains("crates/a/src/lib.rs:2")),
            "{lines:#?}"
        );
    }
}
