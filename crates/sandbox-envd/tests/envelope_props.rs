//! Properties of the envelope codec: the decoder never panics on any bytes cut anywhere, its
//! outcome never depends on the cuts, and encode → decode gives back what went in.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use proptest::prelude::*;
use sandbox_envd::{DecoderConfig, Envelope, EnvelopeDecoder, EnvelopeError};

type Outcome = (Vec<Envelope>, Result<(), EnvelopeError>);

/// Feeds `input` cut at `cuts` (sorted, deduplicated, within bounds), draining after each
/// chunk, then finishes.
fn run(config: DecoderConfig, input: &[u8], cuts: &[usize]) -> Outcome {
    let mut decoder = EnvelopeDecoder::new(config);
    let mut out = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&input.len())) {
        decoder.push(&input[start..end]);
        start = end;
        loop {
            match decoder.decode() {
                Ok(Some(envelope)) => {
                    assert!(envelope.payload.len() <= config.max_message_size);
                    out.push(envelope);
                }
                Ok(None) => break,
                Err(e) => return (out, Err(e)),
            }
        }
    }
    let end = decoder.finish();
    (out, end)
}

fn cuts_for(len: usize, raw: Vec<usize>) -> Vec<usize> {
    let mut cuts: Vec<usize> = raw.into_iter().map(|c| c % (len + 1)).collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

fn config() -> impl Strategy<Value = DecoderConfig> {
    (
        prop_oneof![
            Just(sandbox_envd::envelope::DEFAULT_MAX_MESSAGE_SIZE),
            0usize..64
        ],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(max, compression, end_stream)| DecoderConfig {
            max_message_size: max,
            compression_negotiated: compression,
            end_stream_allowed: end_stream,
        })
}

/// Bytes that look like envelopes often enough to reach every branch: small lengths and the
/// interesting flag values are likelier than in uniform noise.
fn wire_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..16),
        (
            prop_oneof![Just(0u8), Just(1), Just(2), Just(3), any::<u8>()],
            prop::collection::vec(any::<u8>(), 0..24),
            0usize..3,
        )
            .prop_map(|(flags, payload, trim)| {
                let mut out = vec![flags];
                out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
                out.extend_from_slice(&payload);
                out.truncate(out.len().saturating_sub(trim));
                out
            }),
    ];
    prop::collection::vec(piece, 0..6).prop_map(|pieces| pieces.concat())
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (any::<bool>(), prop::collection::vec(any::<u8>(), 0..200)).prop_map(|(compressed, payload)| {
        Envelope {
            compressed,
            end_stream: false,
            payload: Bytes::from(payload),
        }
    })
}

proptest! {
    #[test]
    fn decoder_never_panics_and_ignores_chunking(
        config in config(),
        input in prop_oneof![wire_bytes(), prop::collection::vec(any::<u8>(), 0..512)],
        raw_cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = run(config, &input, &[]);
        let cut = run(config, &input, &cuts_for(input.len(), raw_cuts));
        prop_assert_eq!(&whole, &cut);
        let bytewise: Vec<usize> = (1..input.len()).collect();
        prop_assert_eq!(&whole, &run(config, &input, &bytewise));
        // Whatever came out re-encodes to a prefix of the input.
        let mut reencoded = Vec::new();
        for envelope in &whole.0 {
            reencoded.extend_from_slice(&envelope.to_bytes().unwrap());
        }
        prop_assert!(input.starts_with(&reencoded));
        if whole.1.is_ok() {
            prop_assert_eq!(reencoded, input);
        }
    }

    #[test]
    fn encode_then_decode_round_trips(
        messages in prop::collection::vec(envelope(), 0..8),
        end in prop::option::of((any::<bool>(), prop::collection::vec(any::<u8>(), 0..64))),
        raw_cuts in prop::collection::vec(any::<usize>(), 0..16),
    ) {
        let mut sent = messages;
        if let Some((compressed, payload)) = end {
            sent.push(Envelope { compressed, end_stream: true, payload: Bytes::from(payload) });
        }
        let mut wire = Vec::new();
        for envelope in &sent {
            wire.extend_from_slice(&envelope.to_bytes().unwrap());
        }
        let config = DecoderConfig::response().with_compression_negotiated(true);
        let (received, finish) = run(config, &wire, &cuts_for(wire.len(), raw_cuts));
        prop_assert_eq!(finish, Ok(()));
        prop_assert_eq!(received, sent);
    }
}
