//! Source rules that `cargo metadata` cannot see.
//!
//! Rule 9, no global mutable state: process-wide mutable statics make tests order-dependent
//! and replicas of the service disagree in ways no test reproduces, so clock, IDs, randomness
//! and registries are passed in instead (ARCHITECTURE.md, invariant "no global state"). A
//! line-based scan is enough: the forms it looks for are the only ways to declare such state.
//!
//! Rule 10, an error's origin is data: which component failed is `Error::origin`, so no code
//! reads an error's operation name (`.operation().as_str()`) to decide it, as the HTTP layer
//! once did with a `store.` prefix. Rule 11, operation names follow the one scheme of
//! `sandbox_core::error` (`[a-z][a-z0-9_]*`, no component prefix): every
//! `Operation::new("...")` literal is checked, so a dotted `store.get` cannot come back as a
//! second way of saying where an error came from. (xtask depends on no workspace crate, so
//! [`follows_operation_scheme`] restates `Operation::follows_scheme`.)
//!
//! The rule `handlers-through-manager`: the HTTP handlers (`HANDLER_DIR`) never reach past
//! `SessionManager` to its lifecycle coordinator or provider (`.lifecycle()`), so the rule that
//! lookup-only operations never provision lives in one crate, `sandbox-session`, instead of
//! partly in the handlers that call it.
//!
//! The rule `e2b-api-port-only`: the E2B-compatible API (`E2B_API_DIR`) reaches its backend
//! through the provider port and the `EnvdPlane` it is handed, never by naming an adapter
//! crate, so the same API can front any backend (and the E2B adapter can be tested against
//! it) without a line of it changing. The composition root wires the adapter in.

use std::path::{Path, PathBuf};

use crate::tidy::Violation;

/// Types whose presence in a `static` makes it mutable state.
const INTERIOR_MUTABILITY: &[&str] = &[
    "Mutex",
    "RwLock",
    "Atomic",
    "OnceLock",
    "OnceCell",
    "LazyLock",
    "RefCell",
    "Cell<",
    "UnsafeCell",
];

/// The HTTP handlers, relative to the crates directory (`handlers-through-manager`).
const HANDLER_DIR: &str = "sandbox-app/src/http";

/// The E2B-compatible API, relative to the crates directory (`e2b-api-port-only`).
const E2B_API_DIR: &str = "sandbox-app/src/e2b";

/// The adapter crates the E2B API may not name, as paths and as crate names.
const ADAPTER_NAMES: &[&str] = &[
    "sandbox_provider_docker",
    "sandbox-provider-docker",
    "sandbox_provider_e2b",
    "sandbox_provider_cube",
];

/// Checks one file of the E2B API for `e2b-api-port-only`; `path` is only used in messages.
/// Comments count too: a `use` hidden behind a macro or a doc link is still a dependency.
pub fn check_e2b_api_source(path: &str, text: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if let Some(name) = ADAPTER_NAMES.iter().find(|name| line.contains(*name)) {
            out.push(Violation {
                rule: "e2b-api-port-only",
                detail: format!(
                    "{path}:{}: names {name} — the E2B API reaches its backend through the provider port and its EnvdPlane only; wire adapters in the composition root",
                    n + 1
                ),
            });
        }
    }
    out
}

/// Checks one HTTP handler file's text for `handlers-through-manager`; `path` is only used in
/// messages.
pub fn check_handler_source(path: &str, text: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if code.contains(".lifecycle()") {
            out.push(Violation {
                rule: "handlers-through-manager",
                detail: format!(
                    "{path}:{}: `{}` — a handler calls a `SessionManager` method, which owns the lookup-only rule, never the coordinator behind it",
                    n + 1,
                    code.trim()
                ),
            });
        }
    }
    out
}

/// Checks one file's text; `path` is only used in messages.
pub fn check_source(path: &str, text: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("").trim();
        let is_static = [
            "static ",
            "pub static ",
            "pub(crate) static ",
            "pub(super) static ",
        ]
        .iter()
        .any(|prefix| code.starts_with(prefix));
        let offending = code.starts_with("static mut ")
            || code.contains(" static mut ")
            || code.contains("lazy_static!")
            || code.contains("thread_local!")
            || (is_static && INTERIOR_MUTABILITY.iter().any(|t| code.contains(t)));
        if offending {
            out.push(Violation {
                rule: "global-mutable-state",
                detail: format!(
                    "{path}:{}: `{code}` — pass state in instead of a global",
                    n + 1
                ),
            });
        }
        let mut rest = code;
        while let Some(at) = rest.find("Operation::new(\"") {
            let name_and_more = &rest[at + "Operation::new(\"".len()..];
            let name = name_and_more.split('"').next().unwrap_or("");
            if !follows_operation_scheme(name) {
                out.push(Violation {
                    rule: "operation-name",
                    detail: format!(
                        "{path}:{}: operation {name:?} — names are snake_case with no component prefix (see sandbox_core::error)",
                        n + 1
                    ),
                });
            }
            rest = name_and_more;
        }
        if code.contains(".operation().as_str()") {
            out.push(Violation {
                rule: "origin-from-operation",
                detail: format!(
                    "{path}:{}: `{code}` — an error's origin is `Error::origin`, not its operation's name",
                    n + 1
                ),
            });
        }
    }
    out
}

/// `[a-z][a-z0-9_]*`, the form of an operation name.
pub fn follows_operation_scheme(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Every `.rs` file under `dir`, recursively.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Runs rules 9 to 11 and `handlers-through-manager` over the `src/` trees of the crates under
/// `crates_dir`.
pub fn check_crates(crates_dir: &Path) -> Result<Vec<Violation>, String> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(crates_dir)
        .map_err(|e| format!("cannot read {}: {e}", crates_dir.display()))?;
    let handlers = crates_dir.join(HANDLER_DIR);
    let e2b_api = crates_dir.join(E2B_API_DIR);
    for entry in entries.flatten() {
        for file in rust_files(&entry.path().join("src")) {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let shown = file.display().to_string();
            out.extend(check_source(&shown, &text));
            if file.starts_with(&handlers) {
                out.extend(check_handler_source(&shown, &text));
            }
            if file.starts_with(&e2b_api) {
                out.extend(check_e2b_api_source(&shown, &text));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_mutable_state_is_refused() {
        for bad in [
            "static mut COUNTER: u32 = 0;",
            "pub static REGISTRY: Mutex<Vec<u8>> = Mutex::new(Vec::new());",
            "static NEXT_ID: AtomicU64 = AtomicU64::new(0);",
            "pub(crate) static CONFIG: OnceLock<String> = OnceLock::new();",
            "static CACHE: LazyLock<HashMap<u8, u8>> = LazyLock::new(HashMap::new);",
            "thread_local! { static X: RefCell<u8> = RefCell::new(0); }",
            "lazy_static! { static ref X: u8 = 0; }",
        ] {
            let v = check_source("a.rs", bad);
            assert_eq!(v.len(), 1, "{bad}");
            assert_eq!(v[0].rule, "global-mutable-state");
            assert!(v[0].to_string().contains("a.rs:1"), "{}", v[0]);
        }
    }

    #[test]
    fn deciding_by_an_operation_name_is_refused() {
        for bad in [
            r#"let from_store = err.operation().as_str().starts_with("store.");"#,
            r#"if error.operation().as_str() == "get" {"#,
        ] {
            let v = check_source("a.rs", bad);
            assert_eq!(v.len(), 1, "{bad}");
            assert_eq!(v[0].rule, "origin-from-operation");
        }
        for ok in [
            "let from_store = err.origin() == Origin::Store;",
            "let op = err.operation();",
            "// err.operation().as_str() (a comment)",
        ] {
            assert!(check_source("a.rs", ok).is_empty(), "{ok}");
        }
    }

    #[test]
    fn operation_names_outside_the_scheme_are_refused() {
        for bad in [
            r#"const OP: Operation = Operation::new("store.get");"#,
            r#"let op = Operation::new("envd.files.upload");"#,
            r#"Error::internal(Operation::new("ok"), "x").with(Operation::new("Bad"))"#,
            r#"Operation::new("")"#,
        ] {
            let v = check_source("a.rs", bad);
            assert_eq!(v.len(), 1, "{bad}");
            assert_eq!(v[0].rule, "operation-name");
        }
        for ok in [
            r#"const OP: Operation = Operation::new("lock_lifecycle");"#,
            r#"let op = Operation::new(method_name);"#,
            r#"// Operation::new("store.get") in a comment"#,
        ] {
            assert!(check_source("a.rs", ok).is_empty(), "{ok}");
        }
    }

    #[test]
    fn handlers_that_reach_the_coordinator_are_refused() {
        for bad in [
            "    let lifecycle = state.manager.lifecycle();",
            "    let provider = state.manager.lifecycle().provider();",
            "    state.manager.lifecycle().peek_state(&key).await?; // a comment after",
        ] {
            let v = check_handler_source("http/x.rs", bad);
            assert_eq!(v.len(), 1, "{bad}");
            assert_eq!(v[0].rule, "handlers-through-manager");
            assert!(v[0].to_string().contains("http/x.rs:1"), "{}", v[0]);
        }
        for ok in [
            "    state.manager.peek(&key).await?;",
            "    // state.manager.lifecycle() in a comment",
            "    let lifecycle = Lifecycle::new(provider, store, existence, config);",
        ] {
            assert!(check_handler_source("http/x.rs", ok).is_empty(), "{ok}");
        }
    }

    #[test]
    fn the_handler_rule_scans_only_the_handlers() {
        let root = std::env::temp_dir().join(format!("tidy-handlers-{}", std::process::id()));
        let planted = "pub fn f(m: &M) { let _ = m.lifecycle(); }\n";
        for dir in ["sandbox-app/src/http", "sandbox-session/src"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
            std::fs::write(root.join(dir).join("planted.rs"), planted).unwrap();
        }
        let v = check_crates(&root).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(v[0].rule, "handlers-through-manager");
        assert!(v[0].detail.contains("http"), "{}", v[0]);
    }

    #[test]
    fn the_e2b_api_names_no_adapter() {
        let root = std::env::temp_dir().join(format!("tidy-e2b-{}", std::process::id()));
        for (dir, text) in [
            (
                "sandbox-app/src/e2b",
                "use sandbox_provider_docker::DockerProvider;\n",
            ),
            (
                "sandbox-app/src/e2b/sub",
                "// see sandbox-provider-docker\n",
            ),
            (
                "sandbox-app/src",
                "use sandbox_provider_docker::DockerProvider;\n",
            ),
        ] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
            std::fs::write(root.join(dir).join("planted.rs"), text).unwrap();
        }
        let v = check_crates(&root).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        let e2b: Vec<_> = v.iter().filter(|v| v.rule == "e2b-api-port-only").collect();
        assert_eq!(e2b.len(), 2, "{v:#?}");
        assert!(e2b.iter().all(|v| v.detail.contains("/e2b/")), "{e2b:#?}");
        assert!(check_e2b_api_source("e2b/x.rs", "use sandbox_core::SandboxProvider;").is_empty());
    }

    #[test]
    fn constants_and_comments_pass() {
        for ok in [
            "static GREETING: &str = \"hi\";",
            "pub const ALL: [u8; 2] = [1, 2];",
            "// static mut X: u32 = 0; (an example in a comment)",
            "let mutex = Mutex::new(0); // not a static",
            "struct Inner { lost: AtomicBool }",
        ] {
            assert!(check_source("a.rs", ok).is_empty(), "{ok}");
        }
    }
}
