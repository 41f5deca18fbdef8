//! Pure policy: shell quoting, the workspace layout, skill paths and script interpreters. No
//! I/O; every rule is a function of its inputs. (The script validator lives in
//! `sandbox-session::policy`, where it may use `regex`.)

pub mod shell;
pub mod skills;
pub mod workspace;
