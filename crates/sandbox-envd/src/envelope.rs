//! The Connect envelope: how a streaming call's messages are framed inside an HTTP body.
//!
//! Each message is a 5-byte prefix (one flags byte, then the payload length as a big-endian
//! `u32`) followed by the payload. Flag `0x01` marks a compressed payload, `0x02` the
//! end-of-stream message that closes every response stream; the other six bits are reserved.
//!
//! The decoder is incremental and I/O-free: an HTTP body arrives in chunks cut anywhere, so it
//! buffers what it is given ([`EnvelopeDecoder::push`]) and hands out each envelope once whole
//! ([`EnvelopeDecoder::decode`]). It checks the prefix as soon as the five bytes are in, so an
//! oversized length is refused before its payload is buffered: a hostile or broken peer cannot
//! make us hold more than one maximum-sized message. After an error the decoder stays failed,
//! because the framing is lost and nothing after that point can be trusted.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::EndStreamMessage;

/// Length of the prefix before each payload.
pub const PREFIX_LEN: usize = 5;
/// Flag: the payload is compressed with the negotiated encoding.
pub const FLAG_COMPRESSED: u8 = 0b0000_0001;
/// Flag: the payload is the end-of-stream message, not a message of the method's type.
pub const FLAG_END_STREAM: u8 = 0b0000_0010;
/// The flags this protocol version defines; any other bit set is an error.
const KNOWN_FLAGS: u8 = FLAG_COMPRESSED | FLAG_END_STREAM;

/// Default limit on one payload. envd's largest messages are output chunks (32 KiB of output,
/// about 44 KiB as base64 JSON) and directory listings; 4 MiB is gRPC's customary default and
/// leaves room for a deep `ListDir` while bounding what a broken peer can make us buffer.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 4 * 1024 * 1024;

/// One framed message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Envelope {
    /// Flag `0x01`: the payload is compressed.
    pub compressed: bool,
    /// Flag `0x02`: the payload is the end-of-stream message.
    pub end_stream: bool,
    /// The payload (JSON, unless compressed).
    pub payload: Bytes,
}

/// A framing error: the byte stream is not (or no longer) a valid sequence of envelopes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// A payload longer than the limit: refused from its prefix, before it is buffered.
    #[error("envelope payload of {length} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The length (declared by a prefix, or of a payload given to the encoder).
        length: u64,
        /// The limit in force.
        limit: u64,
    },
    /// The input ended inside an envelope.
    #[error("stream ended inside an envelope: {received} of {expected} bytes received")]
    Truncated {
        /// Bytes of the envelope received (prefix included).
        received: usize,
        /// Bytes the envelope needs (prefix included; 5 while the prefix is incomplete).
        expected: usize,
    },
    /// A reserved flag bit is set.
    #[error("envelope flags {flags:#04x} set reserved bits")]
    UnknownFlags {
        /// The flags byte.
        flags: u8,
    },
    /// The compressed flag is set, but the call negotiated no compression (`identity`).
    #[error("envelope is marked compressed but no compression was negotiated")]
    CompressionNotNegotiated,
    /// The end-of-stream flag is set where the protocol forbids it (on a request stream).
    #[error("end-of-stream envelope in a request stream")]
    UnexpectedEndStream,
    /// Bytes follow the end-of-stream envelope, which must be the last.
    #[error("data after the end-of-stream envelope")]
    DataAfterEndStream,
}

/// What a decoder accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Longest payload accepted (bytes).
    pub max_message_size: usize,
    /// Whether the call negotiated a compression; without one, a compressed flag is an error.
    /// The decoder never decompresses: a compressed envelope is handed out as it came.
    pub compression_negotiated: bool,
    /// Whether end-of-stream envelopes are allowed: response streams end with one, request
    /// streams must never carry one.
    pub end_stream_allowed: bool,
}

impl DecoderConfig {
    /// For reading a response stream (the client side): end-of-stream expected, no compression
    /// (nobody compresses envd traffic, `docs/envd.md`), the default size limit.
    pub const fn response() -> Self {
        DecoderConfig {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            compression_negotiated: false,
            end_stream_allowed: true,
        }
    }

    /// For reading a request stream (the server side): no end-of-stream, no compression, the
    /// default size limit.
    pub const fn request() -> Self {
        DecoderConfig {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            compression_negotiated: false,
            end_stream_allowed: false,
        }
    }

    /// The same, with another payload limit.
    pub const fn with_max_message_size(mut self, max: usize) -> Self {
        self.max_message_size = max;
        self
    }

    /// The same, with compression negotiated or not.
    pub const fn with_compression_negotiated(mut self, negotiated: bool) -> Self {
        self.compression_negotiated = negotiated;
        self
    }
}

impl Default for DecoderConfig {
    fn default() -> Self {
        DecoderConfig::response()
    }
}

/// Why a payload could not be read as the message asked for.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    /// The payload is compressed; decompress it first.
    #[error("envelope payload is compressed")]
    Compressed,
    /// A message was expected, but this is the end-of-stream envelope.
    #[error("expected a message, found the end-of-stream envelope")]
    UnexpectedEndStream,
    /// The end-of-stream message was expected, but this is an ordinary message.
    #[error("expected the end-of-stream envelope, found a message")]
    NotEndStream,
    /// The payload is not valid JSON for the type.
    #[error("malformed {what} JSON: {source}")]
    Json {
        /// `message` or `end-of-stream message`.
        what: &'static str,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
}

/// A decoded envelope's meaning: a message of the stream, or its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamItem<T> {
    /// A message of the method's type.
    Message(T),
    /// The end-of-stream message (success or failure, plus trailers).
    End(EndStreamMessage),
}

impl Envelope {
    /// An uncompressed message envelope.
    pub fn message(payload: impl Into<Bytes>) -> Self {
        Envelope {
            compressed: false,
            end_stream: false,
            payload: payload.into(),
        }
    }

    /// An uncompressed end-of-stream envelope.
    pub fn end_stream(payload: impl Into<Bytes>) -> Self {
        Envelope {
            compressed: false,
            end_stream: true,
            payload: payload.into(),
        }
    }

    /// A message envelope holding `message` as JSON.
    pub fn from_message<T: Serialize>(message: &T) -> Result<Self, PayloadError> {
        serde_json::to_vec(message)
            .map(Envelope::message)
            .map_err(|source| PayloadError::Json {
                what: "message",
                source,
            })
    }

    /// The end-of-stream envelope holding `end` as JSON.
    pub fn from_end_stream(end: &EndStreamMessage) -> Result<Self, PayloadError> {
        end.to_json()
            .map(Envelope::end_stream)
            .map_err(|source| PayloadError::Json {
                what: "end-of-stream message",
                source,
            })
    }

    /// The flags byte.
    pub fn flags(&self) -> u8 {
        let mut flags = 0;
        if self.compressed {
            flags |= FLAG_COMPRESSED;
        }
        if self.end_stream {
            flags |= FLAG_END_STREAM;
        }
        flags
    }

    /// Bytes the envelope takes on the wire.
    pub fn encoded_len(&self) -> usize {
        PREFIX_LEN + self.payload.len()
    }

    /// Appends the envelope to `dst`. Fails only for a payload whose length does not fit the
    /// 32-bit prefix.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EnvelopeError> {
        let length = u32::try_from(self.payload.len()).map_err(|_| EnvelopeError::TooLarge {
            length: self.payload.len() as u64,
            limit: u64::from(u32::MAX),
        })?;
        dst.reserve(self.encoded_len());
        dst.put_u8(self.flags());
        dst.put_u32(length);
        dst.put_slice(&self.payload);
        Ok(())
    }

    /// The envelope as bytes.
    pub fn to_bytes(&self) -> Result<Bytes, EnvelopeError> {
        let mut dst = BytesMut::with_capacity(self.encoded_len());
        self.encode(&mut dst)?;
        Ok(dst.freeze())
    }

    /// Reads the payload as a message of type `T`.
    pub fn parse_message<T: DeserializeOwned>(&self) -> Result<T, PayloadError> {
        if self.end_stream {
            return Err(PayloadError::UnexpectedEndStream);
        }
        if self.compressed {
            return Err(PayloadError::Compressed);
        }
        serde_json::from_slice(&self.payload).map_err(|source| PayloadError::Json {
            what: "message",
            source,
        })
    }

    /// Reads the payload as the end-of-stream message.
    pub fn parse_end_stream(&self) -> Result<EndStreamMessage, PayloadError> {
        if !self.end_stream {
            return Err(PayloadError::NotEndStream);
        }
        if self.compressed {
            return Err(PayloadError::Compressed);
        }
        EndStreamMessage::from_json(&self.payload).map_err(|source| PayloadError::Json {
            what: "end-of-stream message",
            source,
        })
    }

    /// Reads the payload as whichever it is: a message of type `T` or the end of the stream.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<StreamItem<T>, PayloadError> {
        if self.end_stream {
            self.parse_end_stream().map(StreamItem::End)
        } else {
            self.parse_message().map(StreamItem::Message)
        }
    }
}

/// Where the decoder stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Reading envelopes.
    Open,
    /// The end-of-stream envelope was handed out; nothing may follow.
    Ended,
    /// Framing failed; every later call reports the same error.
    Failed(EnvelopeError),
}

/// The incremental envelope decoder (see the module docs).
#[derive(Debug, Clone)]
pub struct EnvelopeDecoder {
    config: DecoderConfig,
    buffer: BytesMut,
    state: State,
}

impl EnvelopeDecoder {
    /// A decoder with `config`.
    pub fn new(config: DecoderConfig) -> Self {
        EnvelopeDecoder {
            config,
            buffer: BytesMut::new(),
            state: State::Open,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> DecoderConfig {
        self.config
    }

    /// Appends the next chunk of input. Cheap: checking happens in [`decode`](Self::decode).
    pub fn push(&mut self, chunk: &[u8]) {
        if matches!(self.state, State::Failed(_)) {
            return;
        }
        self.buffer.extend_from_slice(chunk);
    }

    /// The next complete envelope, `Ok(None)` if more input is needed, or the framing error.
    pub fn decode(&mut self) -> Result<Option<Envelope>, EnvelopeError> {
        let result = self.decode_inner();
        if let Err(e) = &result {
            self.fail(e.clone());
        }
        result
    }

    fn decode_inner(&mut self) -> Result<Option<Envelope>, EnvelopeError> {
        match &self.state {
            State::Failed(e) => return Err(e.clone()),
            State::Ended if !self.buffer.is_empty() => {
                return Err(EnvelopeError::DataAfterEndStream);
            }
            State::Ended => return Ok(None),
            State::Open => {}
        }
        let Some(prefix) = self.buffer.first_chunk::<PREFIX_LEN>() else {
            return Ok(None);
        };
        let flags = prefix[0];
        let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
        self.check_prefix(flags, length)?;
        // `check_prefix` bounded `length` by a `usize` limit, so the cast is lossless; the
        // addition saturates rather than overflow on 32-bit targets with no limit.
        let total = PREFIX_LEN.saturating_add(length as usize);
        if self.buffer.len() < total {
            // Reserve once for the whole envelope instead of growing chunk by chunk.
            self.buffer.reserve(total - self.buffer.len());
            return Ok(None);
        }
        self.buffer.advance(PREFIX_LEN);
        let payload = self.buffer.split_to(total - PREFIX_LEN).freeze();
        let envelope = Envelope {
            compressed: flags & FLAG_COMPRESSED != 0,
            end_stream: flags & FLAG_END_STREAM != 0,
            payload,
        };
        if envelope.end_stream {
            self.state = State::Ended;
        }
        Ok(Some(envelope))
    }

    fn check_prefix(&self, flags: u8, length: u32) -> Result<(), EnvelopeError> {
        if flags & !KNOWN_FLAGS != 0 {
            return Err(EnvelopeError::UnknownFlags { flags });
        }
        if flags & FLAG_COMPRESSED != 0 && !self.config.compression_negotiated {
            return Err(EnvelopeError::CompressionNotNegotiated);
        }
        if flags & FLAG_END_STREAM != 0 && !self.config.end_stream_allowed {
            return Err(EnvelopeError::UnexpectedEndStream);
        }
        let too_large = usize::try_from(length).map_or(true, |n| n > self.config.max_message_size);
        if too_large {
            return Err(EnvelopeError::TooLarge {
                length: u64::from(length),
                limit: self.config.max_message_size as u64,
            });
        }
        Ok(())
    }

    /// Declares the input finished. Errors if it stopped inside an envelope (or a framing
    /// error happened earlier, or data followed the end-of-stream envelope). Call
    /// [`decode`](Self::decode) until it returns `Ok(None)` first: complete envelopes still
    /// buffered are not an error here, but they would be lost.
    ///
    /// Whether a response stream lacking its end-of-stream envelope is acceptable is the
    /// caller's decision ([`end_stream_seen`](Self::end_stream_seen)); connect-python tolerates
    /// it, envd never does it.
    pub fn finish(&mut self) -> Result<(), EnvelopeError> {
        let result = self.finish_inner();
        if let Err(e) = &result {
            self.fail(e.clone());
        }
        result
    }

    fn finish_inner(&self) -> Result<(), EnvelopeError> {
        match &self.state {
            State::Failed(e) => Err(e.clone()),
            State::Ended if !self.buffer.is_empty() => Err(EnvelopeError::DataAfterEndStream),
            State::Ended => Ok(()),
            State::Open if self.buffer.is_empty() => Ok(()),
            State::Open => {
                let expected = match self.buffer.first_chunk::<PREFIX_LEN>() {
                    Some(p) => PREFIX_LEN + u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize,
                    None => PREFIX_LEN,
                };
                if self.buffer.len() >= expected {
                    // A complete envelope nobody decoded: decoding it first is the contract.
                    return Ok(());
                }
                Err(EnvelopeError::Truncated {
                    received: self.buffer.len(),
                    expected,
                })
            }
        }
    }

    fn fail(&mut self, error: EnvelopeError) {
        self.state = State::Failed(error);
        self.buffer = BytesMut::new();
    }

    /// Whether the end-of-stream envelope has been handed out.
    pub fn end_stream_seen(&self) -> bool {
        matches!(self.state, State::Ended)
    }

    /// Bytes buffered and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }
}

impl Default for EnvelopeDecoder {
    fn default() -> Self {
        EnvelopeDecoder::new(DecoderConfig::default())
    }
}
