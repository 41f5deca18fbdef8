//! Pure policy from the specification: shell quoting, the workspace layout, skill paths, script
//! interpreters and the script validator. No I/O; every rule is a function of its inputs.

pub mod shell;
pub mod skills;
pub mod validator;
pub mod workspace;
