//! Shell quoting round-trips through a real `/bin/sh`: whatever the string, the quoted word
//! reaches the program as exactly one argument with exactly those bytes.

// A test binary: a failed unwrap is a failed test with a message, which is what we want.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use proptest::prelude::*;
use sandbox_core::policy::shell;

/// Runs `printf '%s' <quoted>` through `/bin/sh -c` and returns what printf received.
fn through_sh(word: &str) -> String {
    let script = format!("printf '%s' {}", shell::quote(word));
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("run /bin/sh");
    assert!(
        out.status.success(),
        "sh failed for {word:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 out")
}

#[test]
fn hostile_words_survive_sh() {
    for word in [
        "",
        "'",
        "''",
        "a'b'c",
        "$(id)",
        "`id`",
        "${HOME}",
        "$HOME",
        "a\\b",
        "\\'",
        "\"quoted\"",
        "line\nbreak",
        "tab\there",
        "*",
        "~",
        "; rm -rf /",
        "-n",
        "报告 2026.csv",
        "emoji 🎉",
    ] {
        assert_eq!(through_sh(word), word);
    }
}

#[test]
fn argv_join_keeps_word_boundaries() {
    let words = ["a b", "", "'c'", "$x"];
    let script = format!(
        "for w in {}; do printf '[%s]' \"$w\"; done",
        shell::join(words)
    );
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("run /bin/sh");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "[a b][]['c'][$x]");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn any_string_round_trips(word in "[^\\x00]{0,40}") {
        prop_assert_eq!(through_sh(&word), word);
    }
}
