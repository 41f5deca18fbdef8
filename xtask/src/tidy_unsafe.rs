//! The `unsafe` rules: the workspace denies `unsafe_code`, and the one place that may use it is
//! `sandbox-agent`'s `sys` module (`crates/sandbox-agent/src/sys.rs` or `src/sys/`), the agent's
//! thin layer over the system calls no maintained crate wraps. Everything else goes through
//! rustix or std.
//!
//! Why `deny` and not `forbid` in `[workspace.lints.rust]`: `forbid` cannot be lowered by any
//! attribute, `#[expect]` included, so the `sys` module could not exist; with `deny`, each use
//! states itself with `#[expect(unsafe_code, reason = "...")]`, and an `expect` that no longer
//! covers any `unsafe` fails the build (`unfulfilled_lint_expectations`), so none outlives its
//! code. What `forbid` would have guaranteed elsewhere, this rule checks instead:
//!
//! - `unsafe-code-lint`: the root manifest keeps `unsafe_code = "deny"` (members inherit it:
//!   rule `workspace-lints`).
//! - `unsafe-only-in-sys`: no `unsafe` keyword, and no attribute naming the `unsafe_code` lint
//!   (`allow`, `expect`, `warn`), in any `.rs` file of the workspace outside the `sys` module.
//! - `unsafe-under-expect`: in the `sys` module, every `unsafe` lies in an item under
//!   `#[expect(unsafe_code, reason = "...")]` (or the file carries it as an inner attribute);
//!   `allow(unsafe_code)` is refused there too, and an `expect` without a reason.
//! - `unsafe-safety-comment`: every `unsafe { ... }` block and `unsafe impl` has a
//!   `// SAFETY:` comment on the comment lines right above the line it is on (attributes may
//!   sit between), saying why the operation is sound.
//!
//! The scan reads code only: comments, string and character literals are blanked first, so
//! `"unsafe"` in a message or a doc is not code.

use std::path::Path;

use crate::tidy::Violation;
use crate::tidy_source::rust_files;

/// The `sys` module, relative to the workspace root: the file, or the directory of its
/// submodules.
pub const SYS_FILE: &str = "crates/sandbox-agent/src/sys.rs";
pub const SYS_DIR: &str = "crates/sandbox-agent/src/sys/";

/// Whether `path` (relative to the workspace root, `/`-separated) is in the `sys` module.
pub fn is_sys(path: &str) -> bool {
    path == SYS_FILE || path.starts_with(SYS_DIR)
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `text` with every comment, string literal and character literal replaced by spaces
/// (newlines kept, so lines and columns stay where they were).
pub fn blank_non_code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        // `br"..."`: the `b` of a byte raw string is code, and does not make `r` part of a name.
        let prev_ident = i > 0
            && is_ident_char(chars[i - 1])
            && !(chars[i - 1] == 'b' && (i < 2 || !is_ident_char(chars[i - 2])));
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && !prev_ident && matches!(next, Some('"' | '#')) {
            // A raw string `r"..."`, `r#"..."#` (also `br`, whose `b` is already out).
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            for _ in i..=j {
                out.push(' ');
            }
            i = j + 1;
            while i < chars.len() {
                if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() {
                match chars[i] {
                    '\\' => {
                        out.push(' ');
                        if let Some(&e) = chars.get(i + 1) {
                            out.push(blank(e));
                        }
                        i += 2;
                    }
                    '"' => {
                        out.push(' ');
                        i += 1;
                        break;
                    }
                    other => {
                        out.push(blank(other));
                        i += 1;
                    }
                }
            }
        } else if c == '\'' {
            // A character literal ('x', '\n', '\''), else a lifetime or label ('a), left as is.
            let end = if next == Some('\\') {
                (i + 2..chars.len().min(i + 12)).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    for _ in i..=end {
                        out.push(' ');
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Byte offsets of `word` as a whole identifier in `code`.
fn word_offsets<'a>(code: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    code.match_indices(word).filter_map(move |(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + word.len()..].chars().next();
        (!before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char)).then_some(at)
    })
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

fn violation(rule: &'static str, detail: String) -> Violation {
    Violation { rule, detail }
}

/// An attribute naming the `unsafe_code` lint: its span in the blanked code, whether it is an
/// inner attribute, its level (`allow`, `expect`, ...), and whether it has a `reason`.
#[derive(Debug)]
struct LintAttr {
    start: usize,
    end: usize,
    inner: bool,
    level: String,
    has_reason: bool,
}

fn lint_attributes(code: &str) -> Vec<LintAttr> {
    let mut out = Vec::new();
    for at in word_offsets(code, "unsafe_code") {
        // Back to the `#[` or `#![` that opens this attribute.
        let Some(open) = code[..at].rfind('#') else {
            continue;
        };
        let head = &code[open..at];
        // The lint named outside an attribute (a `#` earlier in the file closed its own).
        if head.contains(']') {
            continue;
        }
        let inner = head.starts_with("#!");
        let Some(paren) = head.find('(') else {
            continue;
        };
        let level: String = head[..paren]
            .trim_start_matches(['#', '!', '['])
            .trim()
            .to_owned();
        let Some(close) = code[at..].find(']') else {
            continue;
        };
        let end = at + close + 1;
        out.push(LintAttr {
            start: open,
            end,
            inner,
            level,
            has_reason: word_offsets(&code[open..end], "reason").next().is_some(),
        });
    }
    out
}

/// The byte range of the item an outer attribute ending at `from` applies to: up to the `;`
/// that ends it, or the `}` that closes its first brace, at the attribute's own depth.
fn item_span(code: &str, from: usize) -> (usize, usize) {
    let mut depth = 0i64;
    for (off, c) in code[from..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth <= 0 {
                    return (from, from + off + 1);
                }
            }
            ';' if depth == 0 => return (from, from + off + 1),
            _ => {}
        }
    }
    (from, code.len())
}

/// Whether the comment lines right above line `line` (1-based; attributes may sit between)
/// hold a `SAFETY:` comment.
fn has_safety_comment(lines: &[&str], line: usize) -> bool {
    let mut n = line - 1;
    while n > 0 {
        n -= 1;
        let l = lines[n].trim();
        if l.starts_with("//") {
            if l.contains("SAFETY:") {
                return true;
            }
        } else if !l.starts_with("#[") {
            return false;
        }
    }
    false
}

/// Checks one file; `path` is relative to the workspace root (and used in messages).
pub fn check_file(path: &str, text: &str) -> Vec<Violation> {
    let code = blank_non_code(text);
    let attrs = lint_attributes(&code);
    let mut out = Vec::new();
    if !is_sys(path) {
        for a in &attrs {
            out.push(violation(
                "unsafe-only-in-sys",
                format!(
                    "{path}:{}: `{}({}unsafe_code ...)` — the workspace denies unsafe_code and \
                     only {SYS_FILE} (or {SYS_DIR}) may lift it; use rustix or std here",
                    line_of(&code, a.start),
                    a.level,
                    if a.inner { "!" } else { "" },
                ),
            ));
        }
        for at in word_offsets(&code, "unsafe") {
            out.push(violation(
                "unsafe-only-in-sys",
                format!(
                    "{path}:{}: `unsafe` outside {SYS_FILE} — move the operation into the agent's \
                     sys module (under #[expect(unsafe_code, reason = \"...\")] with a SAFETY \
                     comment) or use rustix",
                    line_of(&code, at)
                ),
            ));
        }
        return out;
    }

    let mut covered = Vec::new();
    for a in &attrs {
        let line = line_of(&code, a.start);
        if a.level != "expect" {
            out.push(violation(
                "unsafe-under-expect",
                format!(
                    "{path}:{line}: `{}(unsafe_code)` — write #[expect(unsafe_code, reason = \
                     \"...\")], so it fails once nothing needs it",
                    a.level
                ),
            ));
            continue;
        }
        if !a.has_reason {
            out.push(violation(
                "unsafe-under-expect",
                format!(
                    "{path}:{line}: #[expect(unsafe_code)] without a reason — say why this needs \
                     unsafe: `reason = \"...\"`"
                ),
            ));
            continue;
        }
        covered.push(if a.inner {
            (0, code.len())
        } else {
            item_span(&code, a.end)
        });
    }
    let lines: Vec<&str> = text.lines().collect();
    for at in word_offsets(&code, "unsafe") {
        let line = line_of(&code, at);
        if !covered.iter().any(|&(s, e)| at >= s && at < e) {
            out.push(violation(
                "unsafe-under-expect",
                format!(
                    "{path}:{line}: `unsafe` not under #[expect(unsafe_code, reason = \"...\")] — \
                     put the attribute on the item that holds it"
                ),
            ));
        }
        let after = code[at + "unsafe".len()..].trim_start();
        let needs_comment = after.starts_with('{')
            || (after.starts_with("impl") && !after[4..].starts_with(is_ident_char));
        if needs_comment && !has_safety_comment(&lines, line) {
            out.push(violation(
                "unsafe-safety-comment",
                format!(
                    "{path}:{line}: `unsafe` without a `// SAFETY:` comment right above it — say \
                     why the operation is sound"
                ),
            ));
        }
    }
    out
}

/// `unsafe-code-lint` over the root manifest's text.
pub fn check_root_manifest(manifest: &str) -> Vec<Violation> {
    let mut table = "";
    let mut level = None;
    for raw in manifest.lines() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.starts_with('[') {
            table = line;
            continue;
        }
        if table == "[workspace.lints.rust]"
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "unsafe_code"
        {
            let value = value.trim();
            level = Some(
                value
                    .trim_matches('"')
                    .split("level")
                    .nth(1)
                    .map_or(value.trim_matches('"'), |rest| {
                        rest.split('"').nth(1).unwrap_or("")
                    })
                    .to_owned(),
            );
        }
    }
    match level.as_deref() {
        Some("deny") => Vec::new(),
        Some("forbid") => vec![violation(
            "unsafe-code-lint",
            "the root Cargo.toml forbids unsafe_code: #[expect] cannot lower forbid, so the \
             agent's sys module cannot exist; write `unsafe_code = \"deny\"` (tidy refuses \
             unsafe everywhere else)"
                .into(),
        )],
        other => vec![violation(
            "unsafe-code-lint",
            format!(
                "the root Cargo.toml's [workspace.lints.rust] has unsafe_code = {other:?}: it must \
                 be \"deny\", so unsafe needs a stated #[expect] in the agent's sys module"
            ),
        )],
    }
}

/// Runs the rules over the root manifest and every `.rs` file under `crates/` and `xtask/`.
pub fn check_tree(root: &Path) -> Result<Vec<Violation>, String> {
    let manifest = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
    let mut out = check_root_manifest(&text);
    let crates = root.join("crates");
    let entries =
        std::fs::read_dir(&crates).map_err(|e| format!("cannot read {}: {e}", crates.display()))?;
    let mut dirs: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    dirs.push(root.join("xtask"));
    dirs.sort();
    for dir in dirs {
        for file in rust_files(&dir) {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let rel = file.strip_prefix(root).unwrap_or(&file);
            out.extend(check_file(&rel.display().to_string(), &text));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(path: &str, text: &str) -> Vec<&'static str> {
        check_file(path, text).into_iter().map(|v| v.rule).collect()
    }

    const GOOD_SYS: &str = r#"
//! The agent's system calls.

/// Makes the agent a subreaper.
#[expect(unsafe_code, reason = "prctl has no safe wrapper in rustix for this option")]
pub fn set_subreaper() -> i32 {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer argument and touches no memory.
    unsafe { prctl(36, 1) }
}

#[expect(unsafe_code, reason = "the handle is plain data")]
// SAFETY: Fd is an integer; moving it between threads moves no memory.
unsafe impl Send for Fd {}

pub fn safe() -> &'static str {
    "unsafe { in a string }"
}
"#;

    #[test]
    fn a_sys_module_that_states_its_unsafe_passes() {
        assert!(
            check_file(SYS_FILE, GOOD_SYS).is_empty(),
            "{:?}",
            check_file(SYS_FILE, GOOD_SYS)
        );
        assert!(check_file("crates/sandbox-agent/src/sys/pty.rs", GOOD_SYS).is_empty());
        let inner = "#![expect(unsafe_code, reason = \"every call here is a syscall\")]\n\
                     fn f() {\n    // SAFETY: getpid touches no memory.\n    unsafe { getpid() };\n}\n";
        assert!(
            check_file(SYS_FILE, inner).is_empty(),
            "{:?}",
            check_file(SYS_FILE, inner)
        );
    }

    #[test]
    fn planted_unsafe_outside_sys_is_refused() {
        let planted = "fn f() {\n    // SAFETY: fine.\n    unsafe { g() }\n}\n";
        let v = check_file("crates/sandbox-agent/src/process.rs", planted);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].rule, "unsafe-only-in-sys");
        assert!(v[0].detail.contains("process.rs:3"), "{}", v[0]);
        // The sys module's own text anywhere else: every attribute and keyword is refused.
        assert_eq!(
            rules("crates/sandbox-core/src/lib.rs", GOOD_SYS),
            vec!["unsafe-only-in-sys"; 4]
        );
        for lifted in [
            "#![allow(unsafe_code)]\n",
            "#[expect(unsafe_code, reason = \"x\")]\nfn f() {}\n",
            "#[warn(unsafe_code)]\nmod m;\n",
        ] {
            assert_eq!(
                rules("xtask/src/main.rs", lifted),
                ["unsafe-only-in-sys"],
                "{lifted}"
            );
        }
    }

    #[test]
    fn unsafe_without_a_safety_comment_is_refused() {
        let planted = "#[expect(unsafe_code, reason = \"a syscall\")]\nfn f() {\n    // Calls g.\n    unsafe { g() }\n}\n";
        assert_eq!(rules(SYS_FILE, planted), ["unsafe-safety-comment"]);
        let planted = "#[expect(unsafe_code, reason = \"x\")]\nunsafe impl Send for X {}\n";
        assert_eq!(rules(SYS_FILE, planted), ["unsafe-safety-comment"]);
        // A SAFETY comment separated by code does not count.
        let planted = "#[expect(unsafe_code, reason = \"x\")]\nfn f() {\n    // SAFETY: ok.\n    let a = 1;\n    let b = unsafe { g(a) };\n}\n";
        assert_eq!(rules(SYS_FILE, planted), ["unsafe-safety-comment"]);
    }

    #[test]
    fn unsafe_without_the_expect_is_refused() {
        let planted = "fn f() {\n    // SAFETY: ok.\n    unsafe { g() }\n}\n";
        assert_eq!(rules(SYS_FILE, planted), ["unsafe-under-expect"]);
        // The expect covers its own item only.
        let planted = "#[expect(unsafe_code, reason = \"x\")]\nfn f() {\n    // SAFETY: ok.\n    unsafe { g() }\n}\n\nfn h() {\n    // SAFETY: ok.\n    unsafe { g() }\n}\n";
        let v = check_file(SYS_FILE, planted);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("sys.rs:9"), "{}", v[0]);
        // allow instead of expect, and an expect without a reason.
        let allow = "#[allow(unsafe_code)]\nfn f() {\n    // SAFETY: ok.\n    unsafe { g() }\n}\n";
        assert_eq!(
            rules(SYS_FILE, allow),
            ["unsafe-under-expect", "unsafe-under-expect"]
        );
        let bare = "#[expect(unsafe_code)]\nfn f() {\n    // SAFETY: ok.\n    unsafe { g() }\n}\n";
        assert_eq!(
            rules(SYS_FILE, bare),
            ["unsafe-under-expect", "unsafe-under-expect"]
        );
    }

    #[test]
    fn comments_strings_and_names_are_not_code() {
        for ok in [
            "// unsafe { x } in a comment\n",
            "/* unsafe /* nested */ unsafe */ fn f() {}\n",
            "/// `unsafe_code` is denied\nfn f() {}\n",
            "const A: &str = \"unsafe { }\";\n",
            "const B: &str = r#\"unsafe \"quoted\" unsafe\"#;\n",
            "const C: char = '\"'; const D: &str = \"unsafe\";\n",
            "fn f<'a>(x: &'a str) -> &'a str { x } // unsafe\n",
            "let op = yaml_unsafe_load; let u = unsafe_outbound_url();\n",
            "const E: &[u8] = b\"unsafe\";\n",
        ] {
            assert!(
                check_file("crates/a/src/lib.rs", ok).is_empty(),
                "{ok}: {:?}",
                check_file("crates/a/src/lib.rs", ok)
            );
        }
        assert_eq!(blank_non_code("a // b\n\"c\" 'd' e"), "a     \n        e");
    }

    #[test]
    fn the_root_manifest_must_deny_unsafe_code() {
        assert!(check_root_manifest("[workspace.lints.rust]\nunsafe_code = \"deny\"\n").is_empty());
        assert!(
            check_root_manifest(
                "[workspace.lints.rust]\nunsafe_code = { level = \"deny\", priority = 0 }\n"
            )
            .is_empty()
        );
        let forbid = check_root_manifest("[workspace.lints.rust]\nunsafe_code = \"forbid\"\n");
        assert_eq!(forbid.len(), 1);
        assert!(
            forbid[0].detail.contains("cannot lower forbid"),
            "{}",
            forbid[0]
        );
        for bad in [
            "[workspace.lints.rust]\nunsafe_code = \"allow\"\n",
            "[workspace.lints.rust]\nunreachable_pub = \"warn\"\n",
            "[lints.rust]\nunsafe_code = \"deny\"\n",
        ] {
            let v = check_root_manifest(bad);
            assert_eq!(v.len(), 1, "{bad}");
            assert_eq!(v[0].rule, "unsafe-code-lint");
        }
    }
}
