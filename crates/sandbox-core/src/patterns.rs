//! The validators' rules as regular expressions, so a document (the service's OpenAPI
//! document) states exactly what the validators accept, from this one place.
//!
//! Every pattern is anchored (`^…$`) and written in the subset that ECMA-262 (JSON Schema's
//! dialect), Python's `re` (what fuzzers generate with) and Rust's `regex` (these tests) read
//! alike: character classes with `\xhh` and `\uhhhh` escapes, `(?:…)`, `*`, `+`, `?`, `{m,n}`.
//! No `\s`, `\d` or `\w`: their meaning differs between the three.
//!
//! The tests below check each pattern against its validator on edge cases and random strings;
//! a rule changed in one place and not the other fails them.
//!
//! Lengths are not in the patterns. The validators count bytes; a document's `maxLength`
//! counts characters, so where the two can differ (text that may be non-ASCII) the document
//! says "bytes" in words.

/// The control characters `char::is_control` refuses (Unicode `Cc`), for a character class.
macro_rules! control {
    () => {
        r"\x00-\x1f\x7f-\x9f"
    };
}

/// The whitespace `str::trim` removes (Unicode `White_Space`) that [`control!`] does not
/// already cover, for a character class.
macro_rules! blank {
    () => {
        r" \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
    };
}

/// Not blank, no control characters: sandbox, template and snapshot IDs, snapshot names
/// (`ids::check_text`).
pub const TEXT_ID: &str = concat!(
    "^[^",
    control!(),
    "]*[^",
    control!(),
    blank!(),
    "][^",
    control!(),
    "]*$"
);

/// A session ID: [`TEXT_ID`] without `{` or `}` (`SessionId::new`).
pub const SESSION_ID: &str = concat!(
    "^[^{}",
    control!(),
    "]*[^{}",
    control!(),
    blank!(),
    "][^{}",
    control!(),
    "]*$"
);

/// A sandbox path (`SandboxPath::new`): absolute, no control characters, no `..` component
/// (`.` and empty components are allowed; they are normalized away).
pub const SANDBOX_PATH: &str = concat!(
    r"^(?:/(?:[^./",
    control!(),
    "][^/",
    control!(),
    r"]*|\.(?:[^./",
    control!(),
    "][^/",
    control!(),
    r"]*|\.[^/",
    control!(),
    "]+)?)?)+$"
);

/// A program or shell expression (`ExecRequest::validate`): not blank, no NUL. Other control
/// characters are allowed: a shell script has newlines.
pub const PROGRAM: &str = concat!(r"^[^\x00]*[^\x00\t-\r\x85", blank!(), r"][^\x00]*$");

/// An argument or an environment value: no NUL (it cannot cross `execve`).
pub const NO_NUL: &str = r"^[^\x00]*$";

/// An environment variable name (`exec::validate_env_name`; at most 256 bytes, all ASCII).
pub const ENV_NAME: &str = r"^[A-Za-z_][A-Za-z0-9_]*$";

/// An OS account name or numeric ID (`exec::validate_user`; 1 to 64 bytes, all ASCII).
pub const USER: &str = r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$";

/// A process tag (`ProcessTag::new`; 1 to 64 bytes, all ASCII).
pub const PROCESS_TAG: &str = r"^[A-Za-z0-9][A-Za-z0-9._-]*$";

/// A script's file name (`policy::workspace::is_script_file_name`): one path segment that
/// does not start with `.`, no control characters, and an extension (any case) that names an
/// interpreter.
pub const SCRIPT_FILE_NAME: &str = concat!(
    r"^[^./",
    control!(),
    r"][^/",
    control!(),
    r"]*\.(?:[Pp][Yy]|[Ss][Hh]|[Bb][Aa][Ss][Hh]|[Jj][Ss]|[Mm][Jj][Ss]|[Cc][Jj][Ss]|[Tt][Ss]|[Rr][Bb]|[Pp][Ll])$"
);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;
    use regex::Regex;

    use super::*;
    use crate::{SandboxPath, SessionId, SnapshotId};

    fn agree(pattern: &str, accepts: impl Fn(&str) -> bool, samples: &[&str]) {
        let re = Regex::new(pattern).unwrap();
        for sample in samples {
            assert_eq!(
                re.is_match(sample),
                accepts(sample),
                "{pattern} and the validator disagree on {sample:?}"
            );
        }
    }

    /// Characters on the edges of every class above, to build strings from.
    const EDGES: &[char] = &[
        'a',
        'Z',
        '0',
        '9',
        '_',
        '-',
        '.',
        '/',
        '{',
        '}',
        ' ',
        '\t',
        '\n',
        '\r',
        '\0',
        '\x1f',
        '\x7f',
        '\u{80}',
        '\u{85}',
        '\u{9f}',
        '\u{a0}',
        '\u{1680}',
        '\u{2000}',
        '\u{200a}',
        '\u{200b}',
        '\u{2028}',
        '\u{202f}',
        '\u{205f}',
        '\u{3000}',
        '\u{feff}',
        'é',
        '中',
        '\u{1f600}',
    ];

    fn edge_strings() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(EDGES), 0..8)
            .prop_map(|chars| chars.into_iter().collect())
    }

    fn session_ok(s: &str) -> bool {
        s.len() <= crate::ids::MAX_ID_LEN && SessionId::new(s).is_ok()
    }

    fn text_ok(s: &str) -> bool {
        SnapshotId::new(s).is_ok()
    }

    fn path_ok(s: &str) -> bool {
        SandboxPath::new(s).is_ok()
    }

    fn program_ok(s: &str) -> bool {
        crate::ExecRequest::argv(s, Vec::<String>::new())
            .validate()
            .is_ok()
    }

    fn user_ok(s: &str) -> bool {
        crate::exec::validate_user(s).is_ok()
    }

    fn env_ok(s: &str) -> bool {
        crate::exec::validate_env_name(s).is_ok()
    }

    fn tag_ok(s: &str) -> bool {
        crate::ProcessTag::new(s).is_ok()
    }

    #[test]
    fn patterns_agree_with_their_validators_on_the_edges() {
        let common = [
            "", " ", "a", " a ", "\u{a0}", "\u{3000}", "\u{feff}", "a\nb", "a\n", "\0", "{a}", "/",
            "//", "/a", "a/b", "/..", "/../a", "/a/..", "/.", "/...", "/..a", "/.a", "/a/./b",
            "-u", "1000", "_x", "x-y.z",
        ];
        agree(SESSION_ID, session_ok, &common);
        agree(TEXT_ID, text_ok, &common);
        agree(SANDBOX_PATH, path_ok, &common);
        agree(PROGRAM, program_ok, &common);
        agree(USER, user_ok, &common);
        agree(ENV_NAME, env_ok, &common);
        agree(PROCESS_TAG, tag_ok, &common);
        agree(NO_NUL, |s| !s.contains('\0'), &common);
        agree(
            SCRIPT_FILE_NAME,
            crate::policy::workspace::is_script_file_name,
            &[
                "a.py", "a.PY", "run.Sh", "x.bash", "m.mjs", "c.cjs", "t.ts", "r.rb", "p.pl",
                "j.js", ".py", "a.txt", "a/b.py", "a\n.py", "py", "a.py.txt", "a..py", "é.py",
                " .py", "a.p y",
            ],
        );
    }

    proptest! {
        #[test]
        fn patterns_agree_with_their_validators(s in edge_strings()) {
            agree(SESSION_ID, session_ok, &[&s]);
            agree(TEXT_ID, text_ok, &[&s]);
            agree(PROGRAM, program_ok, &[&s]);
            agree(USER, user_ok, &[&s]);
            agree(ENV_NAME, env_ok, &[&s]);
            agree(PROCESS_TAG, tag_ok, &[&s]);
            let script = format!("{s}.py");
            agree(SCRIPT_FILE_NAME, crate::policy::workspace::is_script_file_name, &[&s, &script]);
            let path = format!("/{s}");
            agree(SANDBOX_PATH, path_ok, &[&s, &path]);
        }

        #[test]
        fn patterns_agree_on_any_text(s in "\\PC{0,12}|[\\x00-\\x7f]{0,12}") {
            agree(SESSION_ID, session_ok, &[&s]);
            agree(TEXT_ID, text_ok, &[&s]);
            agree(PROGRAM, program_ok, &[&s]);
            let path = format!("/{s}");
            agree(SANDBOX_PATH, path_ok, &[&path]);
        }
    }
}
