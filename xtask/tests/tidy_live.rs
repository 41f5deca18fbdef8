//! The architecture check on the live workspace, so `cargo test` (and nextest) enforce it the way
//! rust-analyzer's tidy tests do. `cargo xtask tidy` runs the same check.

#[test]
fn live_workspace_keeps_the_architecture() {
    let root = xtask::workspace::root();
    let violations = xtask::tidy::check_live(&root).expect("cargo metadata on the live workspace");
    let lines: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        violations.is_empty(),
        "{} tidy violation(s):\n{}",
        violations.len(),
        lines.join("\n")
    );
}
