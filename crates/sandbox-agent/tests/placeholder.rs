//! Until its issue lands, the binary says so and exits 2 instead of pretending to work.

#[test]
fn placeholder_exits_2_and_says_not_built_yet() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandbox-agent"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not built yet"));
    assert!(out.stdout.is_empty());
}
