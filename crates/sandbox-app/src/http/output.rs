//! Command output as JSON text without losing a byte: UTF-8 stays text, a character split
//! across two chunks is held back until its rest arrives, and bytes that are not UTF-8 travel
//! as base64.

use base64::Engine as _;
use sandbox_core::ExecResult;
use serde_json::{Map, Value};

/// A piece of output ready for a JSON line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    /// Valid UTF-8 (`"data"`).
    Text(String),
    /// Anything else (`"data_b64"`, standard base64).
    Binary(Vec<u8>),
}

impl Piece {
    /// Adds the piece to `line` as `data` or `data_b64`.
    pub(super) fn put(self, line: &mut Map<String, Value>) {
        match self {
            Piece::Text(text) => line.insert("data".to_owned(), Value::String(text)),
            Piece::Binary(bytes) => line.insert(
                "data_b64".to_owned(),
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
            ),
        };
    }
}

/// One output stream's carry-over (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    /// The piece `chunk` completes, if any: the text up to a character still incomplete at the
    /// end (kept for the next chunk), or everything as binary when the bytes are not UTF-8.
    pub(super) fn push(&mut self, chunk: &[u8]) -> Option<Piece> {
        self.pending.extend_from_slice(chunk);
        let ready = match std::str::from_utf8(&self.pending) {
            Ok(_) => std::mem::take(&mut self.pending),
            // Only the end is incomplete (at most 3 bytes of a character): hold that back.
            Err(e) if e.error_len().is_none() => {
                let tail = self.pending.split_off(e.valid_up_to());
                std::mem::replace(&mut self.pending, tail)
            }
            Err(_) => return Some(Piece::Binary(std::mem::take(&mut self.pending))),
        };
        if ready.is_empty() {
            return None;
        }
        Some(match String::from_utf8(ready) {
            Ok(text) => Piece::Text(text),
            Err(e) => Piece::Binary(e.into_bytes()),
        })
    }

    /// What is left when the stream ends: a character that never completed, as binary.
    pub(super) fn finish(&mut self) -> Option<Piece> {
        (!self.pending.is_empty()).then(|| Piece::Binary(std::mem::take(&mut self.pending)))
    }
}

/// The buffered result of an exec (the exec and execute routes' `ExecResult`).
pub(super) fn result_json(r: &ExecResult) -> Value {
    let mut result = Map::new();
    result.insert("exit_code".to_owned(), Value::from(r.exit_code));
    result.insert("killed".to_owned(), Value::Bool(r.killed));
    result.insert(
        "duration_ms".to_owned(),
        Value::from(u64::try_from(r.duration.as_millis()).unwrap_or(u64::MAX)),
    );
    put_buffered(&mut result, "stdout", &r.stdout);
    put_buffered(&mut result, "stderr", &r.stderr);
    result.insert("truncated".to_owned(), Value::Bool(r.truncated));
    Value::Object(result)
}

/// The buffered result's fields for one stream: `<name>` (lossy text, for display),
/// `<name>_utf8`, and `<name>_b64` (the exact bytes) when they are not UTF-8.
fn put_buffered(result: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
    let utf8 = std::str::from_utf8(bytes).is_ok();
    result.insert(
        name.to_owned(),
        Value::String(String::from_utf8_lossy(bytes).into_owned()),
    );
    result.insert(format!("{name}_utf8"), Value::Bool(utf8));
    if !utf8 {
        result.insert(
            format!("{name}_b64"),
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Option<Piece> {
        Some(Piece::Text(s.to_owned()))
    }

    #[test]
    fn a_character_split_across_chunks_arrives_whole() {
        let bytes = "aä€😀z".as_bytes();
        // Every way of cutting the bytes in two gives back the same text, never a U+FFFD.
        for cut in 0..=bytes.len() {
            let mut carry = Utf8Carry::default();
            let mut out = String::new();
            for chunk in [&bytes[..cut], &bytes[cut..]] {
                match carry.push(chunk) {
                    Some(Piece::Text(t)) => out.push_str(&t),
                    Some(Piece::Binary(b)) => panic!("binary at cut {cut}: {b:?}"),
                    None => {}
                }
            }
            assert_eq!(carry.finish(), None);
            assert_eq!(out, "aä€😀z", "cut at {cut}");
        }
        let mut carry = Utf8Carry::default();
        assert_eq!(carry.push(&"ä".as_bytes()[..1]), None);
        assert_eq!(carry.push(&"ä".as_bytes()[1..]), text("ä"));
    }

    #[test]
    fn bytes_that_are_not_utf8_travel_as_binary() {
        let mut carry = Utf8Carry::default();
        assert_eq!(
            carry.push(&[b'o', b'k', 0xff, 0xfe]),
            Some(Piece::Binary(vec![b'o', b'k', 0xff, 0xfe]))
        );
        assert_eq!(carry.push(b"then text"), text("then text"));
        // A character cut off by the end of the stream.
        assert_eq!(carry.push(&[0xe2, 0x82]), None);
        assert_eq!(carry.finish(), Some(Piece::Binary(vec![0xe2, 0x82])));
        assert_eq!(carry.finish(), None);

        let mut line = Map::new();
        Piece::Binary(vec![0xff, 0xfe]).put(&mut line);
        assert_eq!(line["data_b64"], "//4=");
    }

    #[test]
    fn buffered_results_carry_exact_bytes_when_not_utf8() {
        let mut r = Map::new();
        put_buffered(&mut r, "stdout", b"plain");
        put_buffered(&mut r, "stderr", &[0xff, b'x']);
        assert_eq!(
            (&r["stdout"], &r["stdout_utf8"]),
            (&json("plain"), &Value::Bool(true))
        );
        assert!(!r.contains_key("stdout_b64"));
        assert_eq!(r["stderr_utf8"], Value::Bool(false));
        assert_eq!(r["stderr_b64"], "/3g=");
    }

    fn json(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}
