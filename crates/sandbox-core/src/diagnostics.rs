//! One-line, secret-free renderings of text that is about to reach a log.
//!
//! Error messages are assembled from provider answers, URLs and request fragments, any of which
//! may carry an API key, a bearer token or a traffic token. Rather than trusting every adapter to
//! leave them out, everything an [`crate::Error`] prints passes through [`scrub`].

/// Words after which the next value is a credential. Matched case-insensitively, followed by
/// `:`, `=` or whitespace (and optional quotes).
const SECRET_MARKERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "bearer",
    "basic",
    "x-api-key",
    "api-key",
    "api_key",
    "apikey",
    "access_token",
    "access-token",
    "traffic_access_token",
    "e2b-traffic-access-token",
    "cube-traffic-access-token",
    "x-access-token",
    "token",
    "password",
    "passwd",
    "secret",
    "client_secret",
];

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Makes `text` safe for a single log line: control characters (line breaks included) become
/// spaces, runs of spaces collapse, URL user-info and values following credential markers are
/// replaced by `[redacted]`.
pub fn scrub(text: &str) -> String {
    let one_line = collapse_whitespace(text);
    let no_userinfo = redact_userinfo(&one_line);
    redact_marked_values(&no_userinfo)
}

fn collapse_whitespace(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last_space = false;
    for ch in text.chars() {
        let ch = if ch.is_control() || ch.is_whitespace() {
            ' '
        } else {
            ch
        };
        if ch == ' ' {
            if !last_space {
                out.push(' ');
            }
            last_space = true;
        } else {
            out.push(ch);
            last_space = false;
        }
    }
    out.trim().to_owned()
}

/// `scheme://user:pass@host` → `scheme://[redacted]@host`.
fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        let authority_end = tail
            .find(['/', ' ', '?', '#', '"', '\''])
            .unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str(REDACTED);
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

fn is_value_end(ch: char) -> bool {
    ch.is_whitespace() || matches!(ch, ',' | ';' | '&' | '"' | '\'' | ')' | ']' | '}' | '>')
}

fn redact_marked_values(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    // (start, end) byte ranges of values to redact, in order, non-overlapping.
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let bytes = lower.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let mut advanced = false;
        for marker in SECRET_MARKERS {
            if !lower[i..].starts_with(marker) {
                continue;
            }
            // The marker must start a word, so "tokenizer" or "mytoken" in prose is left alone
            // unless it is followed by a separator and a value. A marker right after '/' is a
            // path component ("/etc/passwd"), not a key: an error quoting a path stays readable.
            let starts_word = i == 0 || !(is_word_byte(bytes[i - 1]) || bytes[i - 1] == b'/');
            let after = i + marker.len();
            let ends_word = after >= bytes.len() || !is_word_byte(bytes[after]);
            if !starts_word || !ends_word {
                continue;
            }
            if let Some((start, end)) = value_after(text, marker, after) {
                ranges.push((start, end));
                i = end;
                advanced = true;
                break;
            }
        }
        if !advanced {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    if ranges.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut cursor = 0;
    for (start, end) in ranges {
        out.push_str(&text[cursor..start]);
        out.push_str(REDACTED);
        cursor = end;
    }
    out.push_str(&text[cursor..]);
    out
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Finds the value that follows a marker ending at `from`: optional quotes, then a separator
/// (`:`/`=`/spaces), then optional quotes, then the value up to its end. Returns `None` when no
/// separator follows (the marker was an ordinary word) or the value is empty/already redacted.
fn value_after(text: &str, marker: &str, from: usize) -> Option<(usize, usize)> {
    // Only the auth schemes take a space-separated value ("Bearer abc"); for every other marker
    // a bare space would redact ordinary prose ("the token expired").
    let space_separates = matches!(marker, "bearer" | "basic");
    let rest = &text[from..];
    let mut offset = 0;
    let mut saw_separator = false;
    for ch in rest.chars() {
        match ch {
            '"' | '\'' => {}
            ':' | '=' => saw_separator = true,
            ' ' if space_separates => saw_separator = true,
            ' ' => {}
            _ => break,
        }
        offset += ch.len_utf8();
    }
    if !saw_separator {
        return None;
    }
    let start = from + offset;
    let value_len = text[start..]
        .find(is_value_end)
        .unwrap_or(text.len() - start);
    if value_len == 0 || text[start..].starts_with(REDACTED) {
        return None;
    }
    let value = &text[start..start + value_len];
    // "Authorization: Bearer abc": the scheme word is itself a marker and its value is what
    // follows, so leave the scheme in place and let the loop redact the credential after it.
    let lower = value.to_ascii_lowercase();
    if lower == "bearer" || lower == "basic" {
        return None;
    }
    Some((start, start + value_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: &str) {
        assert_eq!(scrub(input), expected, "input: {input:?}");
    }

    #[test]
    fn scrub_table() {
        check("plain message", "plain message");
        check("line one\nline two\r\n\tthree", "line one line two three");
        check(
            "Authorization: Bearer abc.def",
            "Authorization: Bearer [redacted]",
        );
        check(
            "authorization=Basic dXNlcjo=",
            "authorization=Basic [redacted]",
        );
        check("X-API-Key: e2b_123456 rest", "X-API-Key: [redacted] rest");
        check(
            "e2b-traffic-access-token: tok-1, next",
            "e2b-traffic-access-token: [redacted], next",
        );
        check(
            r#"{"traffic_access_token":"s3cr3t","x":1}"#,
            r#"{"traffic_access_token":"[redacted]","x":1}"#,
        );
        check(
            "GET https://user:pw@api.example.com/x failed",
            "GET https://[redacted]@api.example.com/x failed",
        );
        check("password=hunter2&user=bob", "password=[redacted]&user=bob");
        check("the tokenizer failed", "the tokenizer failed");
        check("token", "token");
        check("the token expired", "the token expired");
        check("token = abc", "token = [redacted]");
        check(
            r#"invalid path "../etc/passwd": must be absolute"#,
            r#"invalid path "../etc/passwd": must be absolute"#,
        );
        check(
            r#"{"path":"/a/token","token":"t0k"}"#,
            r#"{"path":"/a/token","token":"[redacted]"}"#,
        );
        check("no token here: ", "no token here:");
        check("emoji 🎉 token=abc", "emoji 🎉 token=[redacted]");
        check(
            "https://api.example.com/path?q=1",
            "https://api.example.com/path?q=1",
        );
    }

    #[test]
    fn scrub_never_panics_on_odd_input() {
        let mut seed: u32 = 0x1234_5678;
        for _ in 0..3000 {
            let len = (seed % 64) as usize;
            let mut bytes = Vec::with_capacity(len);
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                bytes.push((seed % 256) as u8);
            }
            let text = String::from_utf8_lossy(&bytes).replace('\u{FFFD}', "token=");
            let out = scrub(&text);
            assert!(!out.contains('\n'));
        }
    }
}
