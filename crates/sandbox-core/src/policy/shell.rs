//! Quoting for `/bin/sh`.

/// Renders `s` as one literal word for a POSIX shell.
///
/// Single quotes are the only construct that keeps every metacharacter inert: inside double
/// quotes `$`, backtick and `\` still expand, so a file name chosen by an uploaded archive would
/// run as a command. An embedded single quote becomes `'\''` (close, escaped quote, reopen).
/// Non-ASCII passes through unchanged, so a CJK file name still names the same file. The empty
/// string becomes `''`, an empty argument rather than none.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for ch in s.chars() {
        if ch == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(ch);
        }
    }
    out.push('\'');
    out
}

/// Quotes every word and joins them with spaces: an argv rendered as one shell line.
pub fn join<I, S>(words: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    words
        .into_iter()
        .map(|w| quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_table() {
        let check = |input: &str, want: &str| assert_eq!(quote(input), want, "{input:?}");
        check("", "''");
        check("abc", "'abc'");
        check("it's", "'it'\\''s'");
        check("$(rm -rf /)", "'$(rm -rf /)'");
        check("`id`", "'`id`'");
        check("a\nb", "'a\nb'");
        check("报告.csv", "'报告.csv'");
        assert_eq!(join(["echo", "a b", "'"]), "'echo' 'a b' ''\\'''");
    }
}
