//! The `Content-Type` and `Content-Disposition` of a download.
//!
//! The type comes from the extension (case-insensitive), from a small table of the types a
//! sandbox's files commonly have (the types Go's `mime` package builds in, plus common text
//! and archive formats); anything else is `application/octet-stream`. Nothing is sniffed: the
//! first bytes of a file are never read to guess.

/// The type a file name's extension implies.
pub(crate) fn content_type(name: &str) -> &'static str {
    let Some((_, ext)) = name.rsplit_once('.') else {
        return OCTET_STREAM;
    };
    if ext.contains('/') {
        return OCTET_STREAM;
    }
    let ext = ext.to_ascii_lowercase();
    TYPES
        .iter()
        .find(|(e, _)| *e == ext)
        .map_or(OCTET_STREAM, |(_, t)| t)
}

const OCTET_STREAM: &str = "application/octet-stream";

const TYPES: &[(&str, &str)] = &[
    ("avif", "image/avif"),
    ("css", "text/css; charset=utf-8"),
    ("csv", "text/csv; charset=utf-8"),
    ("gif", "image/gif"),
    ("gz", "application/gzip"),
    ("htm", "text/html; charset=utf-8"),
    ("html", "text/html; charset=utf-8"),
    ("jpeg", "image/jpeg"),
    ("jpg", "image/jpeg"),
    ("js", "text/javascript; charset=utf-8"),
    ("json", "application/json"),
    ("md", "text/markdown; charset=utf-8"),
    ("mjs", "text/javascript; charset=utf-8"),
    ("mp3", "audio/mpeg"),
    ("mp4", "video/mp4"),
    ("pdf", "application/pdf"),
    ("png", "image/png"),
    ("svg", "image/svg+xml"),
    ("tar", "application/x-tar"),
    ("txt", "text/plain; charset=utf-8"),
    ("wasm", "application/wasm"),
    ("webp", "image/webp"),
    ("xml", "text/xml; charset=utf-8"),
    ("zip", "application/zip"),
];

/// `inline; filename=<name>`, with the name as a bare token when it is one, quoted when it is
/// printable ASCII, and in RFC 2231's `filename*=utf-8''…` form otherwise (how Go's
/// `mime.FormatMediaType` writes it).
pub(crate) fn content_disposition(name: &str) -> String {
    let is_token = !name.is_empty() && name.bytes().all(is_token_byte);
    if is_token {
        return format!("inline; filename={name}");
    }
    if name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        let mut out = String::from("inline; filename=\"");
        for c in name.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        return out;
    }
    let mut out = String::from("inline; filename*=utf-8''");
    for b in name.bytes() {
        if is_token_byte(b) && b != b'%' && b != b'\'' && b != b'*' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_come_from_extensions() {
        assert_eq!(content_type("a.txt"), "text/plain; charset=utf-8");
        assert_eq!(content_type("/x/y/IMAGE.PNG"), "image/png");
        assert_eq!(content_type("data.bin"), OCTET_STREAM);
        assert_eq!(content_type("noext"), OCTET_STREAM);
        assert_eq!(content_type("/dir.json/file"), OCTET_STREAM);
    }

    #[test]
    fn dispositions_quote_as_needed() {
        assert_eq!(content_disposition("a.txt"), "inline; filename=a.txt");
        assert_eq!(
            content_disposition("my file \"1\".txt"),
            "inline; filename=\"my file \\\"1\\\".txt\""
        );
        assert_eq!(
            content_disposition("é.txt"),
            "inline; filename*=utf-8''%C3%A9.txt"
        );
    }
}
