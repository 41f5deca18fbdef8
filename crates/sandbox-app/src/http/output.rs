//! Command output as JSON text without losing a byte: UTF-8 stays text, a character split
//! across two chunks is held back until its rest arrives, and bytes that are not UTF-8 travel
//! as base64.

use base64::Engine as _;

use crate::api;

/// A piece of output ready for a JSON line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    /// Valid UTF-8 (`"data"`).
    Text(String),
    /// Anything else (`"data_b64"`, standard base64).
    Binary(Vec<u8>),
}

impl Piece {
    /// The piece as an output line of `stream`: `data` or `data_b64`.
    pub(super) fn into_output(self, stream: api::StreamName) -> api::ExecOutput {
        let (data, data_b64) = match self {
            Piece::Text(text) => (Some(text), None),
            Piece::Binary(bytes) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            ),
        };
        api::ExecOutput {
            stream,
            data,
            data_b64,
        }
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

        let line = Piece::Binary(vec![0xff, 0xfe]).into_output(api::StreamName::Stdout);
        assert_eq!((line.data, line.data_b64.as_deref()), (None, Some("//4=")));
    }
}
