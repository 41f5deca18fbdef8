//! Table tests for the envelope codec. Every decoding case goes through [`check`], which feeds
//! the input whole, split in two at every byte, and one byte at a time, and demands the same
//! outcome each way: framing must not depend on where the network cut the body.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use bytes::Bytes;
use sandbox_envd::envelope::{FLAG_COMPRESSED, FLAG_END_STREAM, PREFIX_LEN};
use sandbox_envd::process::{ProcessEvent, StartResponse, process_event};
use sandbox_envd::{
    Code, ConnectError, DecoderConfig, EndStreamMessage, Envelope, EnvelopeDecoder, EnvelopeError,
    PayloadError, StreamItem,
};

/// What decoding a whole input produced: the envelopes handed out, then either a clean finish
/// or the first error.
type Outcome = (Vec<Envelope>, Result<(), EnvelopeError>);

/// Feeds `chunks` to a decoder, draining after each, then finishes.
fn run<'a>(config: DecoderConfig, chunks: impl IntoIterator<Item = &'a [u8]>) -> Outcome {
    let mut decoder = EnvelopeDecoder::new(config);
    let mut out = Vec::new();
    for chunk in chunks {
        decoder.push(chunk);
        loop {
            match decoder.decode() {
                Ok(Some(envelope)) => out.push(envelope),
                Ok(None) => break,
                Err(e) => {
                    // Failure is sticky.
                    decoder.push(b"more");
                    assert_eq!(decoder.decode(), Err(e.clone()));
                    assert_eq!(decoder.finish(), Err(e.clone()));
                    return (out, Err(e));
                }
            }
        }
    }
    let end = decoder.finish();
    (out, end)
}

/// Decodes `input` under `config` every way it can be chunked; each must give `expected`.
#[track_caller]
fn check(name: &str, config: DecoderConfig, input: &[u8], expected: Outcome) {
    assert_eq!(run(config, [input]), expected, "{name}: whole");
    for cut in 0..=input.len() {
        let (a, b) = input.split_at(cut);
        assert_eq!(run(config, [a, b]), expected, "{name}: cut at {cut}");
    }
    assert_eq!(
        run(config, input.chunks(1)),
        expected,
        "{name}: one byte at a time"
    );
}

fn frame(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn message(payload: &'static [u8]) -> Envelope {
    Envelope::message(Bytes::from_static(payload))
}

fn end_stream(payload: &'static [u8]) -> Envelope {
    Envelope::end_stream(Bytes::from_static(payload))
}

fn concat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn well_formed_streams() {
    let response = DecoderConfig::response();
    check("empty input", response, b"", (vec![], Ok(())));
    check(
        "one message",
        response,
        &frame(0, br#"{"a":1}"#),
        (vec![message(br#"{"a":1}"#)], Ok(())),
    );
    check(
        "empty payload",
        response,
        &frame(0, b""),
        (vec![message(b"")], Ok(())),
    );
    check(
        "messages then end-of-stream",
        response,
        &concat(&[
            frame(0, b"1"),
            frame(0, b"22"),
            frame(FLAG_END_STREAM, b"{}"),
        ]),
        (
            vec![message(b"1"), message(b"22"), end_stream(b"{}")],
            Ok(()),
        ),
    );
    check(
        "only end-of-stream",
        response,
        &frame(FLAG_END_STREAM, b"{}"),
        (vec![end_stream(b"{}")], Ok(())),
    );
    check(
        "request stream without end-of-stream",
        DecoderConfig::request(),
        &concat(&[frame(0, b"a"), frame(0, b"b")]),
        (vec![message(b"a"), message(b"b")], Ok(())),
    );
    let compressed = DecoderConfig::response().with_compression_negotiated(true);
    check(
        "compressed, negotiated",
        compressed,
        &concat(&[
            frame(FLAG_COMPRESSED, b"zz"),
            frame(FLAG_COMPRESSED | FLAG_END_STREAM, b"z"),
        ]),
        (
            vec![
                Envelope {
                    compressed: true,
                    end_stream: false,
                    payload: Bytes::from_static(b"zz"),
                },
                Envelope {
                    compressed: true,
                    end_stream: true,
                    payload: Bytes::from_static(b"z"),
                },
            ],
            Ok(()),
        ),
    );
    let small = DecoderConfig::response().with_max_message_size(4);
    check(
        "payload exactly at the limit",
        small,
        &frame(0, b"1234"),
        (vec![message(b"1234")], Ok(())),
    );
}

#[test]
fn malformed_streams() {
    let response = DecoderConfig::response();
    check(
        "truncated prefix",
        response,
        &[0, 0, 0],
        (
            vec![],
            Err(EnvelopeError::Truncated {
                received: 3,
                expected: 5,
            }),
        ),
    );
    check(
        "truncated payload",
        response,
        &frame(0, b"0123456789")[..9],
        (
            vec![],
            Err(EnvelopeError::Truncated {
                received: 9,
                expected: 15,
            }),
        ),
    );
    check(
        "truncated after a good envelope",
        response,
        &concat(&[frame(0, b"ok"), vec![0, 0, 0, 0, 9, b'x']]),
        (
            vec![message(b"ok")],
            Err(EnvelopeError::Truncated {
                received: 6,
                expected: 14,
            }),
        ),
    );
    let small = DecoderConfig::response().with_max_message_size(4);
    check(
        "over the limit, refused from the prefix alone",
        small,
        &[0, 0, 0, 0, 5],
        (
            vec![],
            Err(EnvelopeError::TooLarge {
                length: 5,
                limit: 4,
            }),
        ),
    );
    check(
        "declared length u32::MAX",
        response,
        &[0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3],
        (
            vec![],
            Err(EnvelopeError::TooLarge {
                length: u64::from(u32::MAX),
                limit: 4 * 1024 * 1024,
            }),
        ),
    );
    check(
        "over the limit after a good envelope",
        small,
        &concat(&[frame(0, b"1234"), frame(0, b"12345")]),
        (
            vec![message(b"1234")],
            Err(EnvelopeError::TooLarge {
                length: 5,
                limit: 4,
            }),
        ),
    );
    for flags in [0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xff, 0x06] {
        check(
            &format!("reserved flags {flags:#04x}"),
            response,
            &frame(flags, b"{}"),
            (vec![], Err(EnvelopeError::UnknownFlags { flags })),
        );
    }
    check(
        "compressed without negotiation",
        response,
        &concat(&[frame(0, b"a"), frame(FLAG_COMPRESSED, b"b")]),
        (
            vec![message(b"a")],
            Err(EnvelopeError::CompressionNotNegotiated),
        ),
    );
    check(
        "compressed end-of-stream without negotiation",
        response,
        &frame(FLAG_COMPRESSED | FLAG_END_STREAM, b"{}"),
        (vec![], Err(EnvelopeError::CompressionNotNegotiated)),
    );
    check(
        "end-of-stream in a request stream",
        DecoderConfig::request(),
        &concat(&[frame(0, b"a"), frame(FLAG_END_STREAM, b"{}")]),
        (vec![message(b"a")], Err(EnvelopeError::UnexpectedEndStream)),
    );
    check(
        "one byte after end-of-stream",
        response,
        &concat(&[frame(FLAG_END_STREAM, b"{}"), vec![0]]),
        (
            vec![end_stream(b"{}")],
            Err(EnvelopeError::DataAfterEndStream),
        ),
    );
    check(
        "a message after end-of-stream",
        response,
        &concat(&[frame(FLAG_END_STREAM, b"{}"), frame(0, b"x")]),
        (
            vec![end_stream(b"{}")],
            Err(EnvelopeError::DataAfterEndStream),
        ),
    );
}

#[test]
fn error_messages_are_one_clear_line() {
    let cases = [
        (
            EnvelopeError::TooLarge {
                length: 5,
                limit: 4,
            },
            "envelope payload of 5 bytes exceeds the limit of 4 bytes",
        ),
        (
            EnvelopeError::Truncated {
                received: 9,
                expected: 15,
            },
            "stream ended inside an envelope: 9 of 15 bytes received",
        ),
        (
            EnvelopeError::UnknownFlags { flags: 0x80 },
            "envelope flags 0x80 set reserved bits",
        ),
        (
            EnvelopeError::CompressionNotNegotiated,
            "envelope is marked compressed but no compression was negotiated",
        ),
        (
            EnvelopeError::UnexpectedEndStream,
            "end-of-stream envelope in a request stream",
        ),
        (
            EnvelopeError::DataAfterEndStream,
            "data after the end-of-stream envelope",
        ),
    ];
    for (error, text) in cases {
        assert_eq!(error.to_string(), text);
    }
}

#[test]
fn encoding() {
    let check = |envelope: Envelope, bytes: &[u8]| {
        assert_eq!(envelope.to_bytes().unwrap(), bytes, "{envelope:?}");
        assert_eq!(envelope.encoded_len(), bytes.len());
    };
    check(message(b"{}"), &[0, 0, 0, 0, 2, b'{', b'}']);
    check(end_stream(b"{}"), &[2, 0, 0, 0, 2, b'{', b'}']);
    check(message(b""), &[0, 0, 0, 0, 0]);
    check(
        Envelope {
            compressed: true,
            end_stream: true,
            payload: Bytes::from_static(b"x"),
        },
        &[3, 0, 0, 0, 1, b'x'],
    );
    let big = Envelope::message(vec![7u8; 300]);
    let bytes = big.to_bytes().unwrap();
    assert_eq!(&bytes[..PREFIX_LEN], &[0, 0, 0, 1, 44]);
}

#[test]
fn end_of_stream_with_error_and_metadata() {
    let end = EndStreamMessage {
        error: Some(ConnectError::new(
            Code::NotFound,
            "process with pid 7 not found",
        )),
        metadata: BTreeMap::from([("x-trace".to_owned(), vec!["a".to_owned(), "b".to_owned()])]),
    };
    let envelope = Envelope::from_end_stream(&end).unwrap();
    assert!(envelope.end_stream);
    let payload = br#"{"error":{"code":"not_found","message":"process with pid 7 not found"},"metadata":{"x-trace":["a","b"]}}"#;
    assert_eq!(&envelope.payload[..], payload);

    let wire = concat(&[
        frame(0, br#"{"event":{"start":{"pid":7}}}"#),
        frame(2, payload),
    ]);
    let (envelopes, end_result) = run(DecoderConfig::response(), wire.chunks(3));
    end_result.unwrap();
    assert_eq!(envelopes.len(), 2);
    let parsed = envelopes[1].parse_end_stream().unwrap();
    assert_eq!(parsed, end);
    let error = parsed.into_result().unwrap_err();
    assert_eq!(error.code, Code::NotFound);
    assert_eq!(
        error.to_core_error(sandbox_core::Operation::EXEC).kind(),
        sandbox_core::ErrorKind::NotFound
    );
}

/// A `Process/Start` response as captured from a real envd (`docs/envd.md`), replayed through
/// the decoder and typed.
#[test]
fn captured_start_stream() {
    let wire = concat(&[
        frame(0, br#"{"event":{"start":{"pid":42}}}"#),
        frame(0, br#"{"event":{"keepalive":{}}}"#),
        frame(0, br#"{"event":{"data":{"stdout":"aGkK"}}}"#),
        frame(0, br#"{"event":{"data":{"stderr":"ZXJyCg=="}}}"#),
        frame(
            0,
            br#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
        ),
        frame(2, b"{}"),
    ]);
    let (envelopes, end) = run(DecoderConfig::response(), wire.chunks(7));
    end.unwrap();
    let items: Vec<StreamItem<StartResponse>> =
        envelopes.iter().map(|e| e.parse().unwrap()).collect();
    use process_event::{DataEvent, EndEvent, Event, KeepAlive, StartEvent, data_event::Output};
    let event = |e: Event| {
        StreamItem::Message(StartResponse {
            event: Some(ProcessEvent::new(e)),
        })
    };
    assert_eq!(
        items,
        vec![
            event(Event::Start(StartEvent { pid: 42 })),
            event(Event::Keepalive(KeepAlive {})),
            event(Event::Data(DataEvent {
                output: Some(Output::Stdout(b"hi\n".to_vec()))
            })),
            event(Event::Data(DataEvent {
                output: Some(Output::Stderr(b"err\n".to_vec()))
            })),
            event(Event::End(EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".to_owned(),
                error: None,
            })),
            StreamItem::End(EndStreamMessage::ok()),
        ]
    );
    // And back: encoding the typed stream gives the captured bytes.
    let mut encoded = Vec::new();
    for item in &items {
        let envelope = match item {
            StreamItem::Message(m) => Envelope::from_message(m).unwrap(),
            StreamItem::End(end) => Envelope::from_end_stream(end).unwrap(),
        };
        encoded.extend_from_slice(&envelope.to_bytes().unwrap());
    }
    assert_eq!(encoded, wire);
}

#[test]
fn payload_kinds_are_checked() {
    let end = end_stream(b"{}");
    assert!(matches!(
        end.parse_message::<StartResponse>(),
        Err(PayloadError::UnexpectedEndStream)
    ));
    assert!(matches!(
        message(b"{}").parse_end_stream(),
        Err(PayloadError::NotEndStream)
    ));
    let compressed = Envelope {
        compressed: true,
        end_stream: false,
        payload: Bytes::from_static(b"{}"),
    };
    assert!(matches!(
        compressed.parse_message::<StartResponse>(),
        Err(PayloadError::Compressed)
    ));
    let err = message(b"{").parse_message::<StartResponse>().unwrap_err();
    assert!(
        err.to_string().starts_with("malformed message JSON: "),
        "{err}"
    );
    let err = end_stream(br#"{"error":{}}"#)
        .parse_end_stream()
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("malformed end-of-stream message JSON: missing field `code`"),
        "{err}"
    );
}

#[test]
fn decoder_bookkeeping() {
    let mut decoder = EnvelopeDecoder::default();
    assert_eq!(decoder.config(), DecoderConfig::response());
    decoder.push(&frame(0, b"abc")[..4]);
    assert_eq!(decoder.decode(), Ok(None));
    assert_eq!(decoder.buffered(), 4);
    decoder.push(&frame(0, b"abc")[4..]);
    assert_eq!(decoder.decode(), Ok(Some(message(b"abc"))));
    assert_eq!(decoder.buffered(), 0);
    assert!(!decoder.end_stream_seen());
    decoder.push(&frame(FLAG_END_STREAM, b"{}"));
    assert_eq!(decoder.decode(), Ok(Some(end_stream(b"{}"))));
    assert!(decoder.end_stream_seen());
    assert_eq!(decoder.decode(), Ok(None));
    assert_eq!(decoder.finish(), Ok(()));
}
