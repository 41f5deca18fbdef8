//! Golden files: the wire form of every message, written by hand from envd's message shapes and
//! its JSON mapping (`docs/envd.md`, "Connect services" and "The Connect codec").
//!
//! - `tests/golden/<proto name>[--<case>].json` is canonical: it must decode, and encode back to
//!   exactly the same bytes (so key order, omitted defaults, enum names, base64 and int64
//!   strings are all pinned).
//! - `tests/golden/lenient/<canonical file stem>@<what>.json` is another way of writing the same
//!   value that a proto3 JSON parser must accept (enum numbers, int64 as numbers, proto field
//!   names, URL-safe base64, nulls, unknown fields): it must decode to the same value and encode
//!   to the canonical bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use sandbox_envd::{ConnectError, EndStreamMessage, files, filesystem as fs, process as ps};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Decodes `text` as `T` and encodes it again.
fn reencode<T: Serialize + DeserializeOwned>(text: &[u8]) -> Result<String, String> {
    let value: T = serde_json::from_slice(text).map_err(|e| format!("decode: {e}"))?;
    serde_json::to_string(&value).map_err(|e| format!("encode: {e}"))
}

/// Whether `a` and `b` decode to equal values of `T`.
fn same_value<T: DeserializeOwned + PartialEq + Debug>(a: &[u8], b: &[u8]) -> Result<(), String> {
    let a: T = serde_json::from_slice(a).map_err(|e| format!("decode canonical: {e}"))?;
    let b: T = serde_json::from_slice(b).map_err(|e| format!("decode lenient: {e}"))?;
    if a == b {
        Ok(())
    } else {
        Err(format!(
            "values differ:\n canonical {a:?}\n lenient   {b:?}"
        ))
    }
}

#[derive(Clone, Copy)]
struct Codec {
    reencode: fn(&[u8]) -> Result<String, String>,
    same_value: fn(&[u8], &[u8]) -> Result<(), String>,
}

fn codec<T: Serialize + DeserializeOwned + PartialEq + Debug>() -> Codec {
    Codec {
        reencode: reencode::<T>,
        same_value: same_value::<T>,
    }
}

/// Every message kind, by its proto name. Each must have at least one canonical golden file.
fn codecs() -> BTreeMap<&'static str, Codec> {
    use fs::watch_dir_response as wdr;
    use ps::{process_event as pe, stream_input_request as sir};
    BTreeMap::from([
        ("process.PTY", codec::<ps::Pty>()),
        ("process.PTY.Size", codec::<ps::pty::Size>()),
        ("process.ProcessConfig", codec::<ps::ProcessConfig>()),
        ("process.ListRequest", codec::<ps::ListRequest>()),
        ("process.ProcessInfo", codec::<ps::ProcessInfo>()),
        ("process.ListResponse", codec::<ps::ListResponse>()),
        ("process.StartRequest", codec::<ps::StartRequest>()),
        ("process.UpdateRequest", codec::<ps::UpdateRequest>()),
        ("process.UpdateResponse", codec::<ps::UpdateResponse>()),
        ("process.ProcessEvent", codec::<ps::ProcessEvent>()),
        ("process.ProcessEvent.StartEvent", codec::<pe::StartEvent>()),
        ("process.ProcessEvent.DataEvent", codec::<pe::DataEvent>()),
        ("process.ProcessEvent.EndEvent", codec::<pe::EndEvent>()),
        ("process.ProcessEvent.KeepAlive", codec::<pe::KeepAlive>()),
        ("process.StartResponse", codec::<ps::StartResponse>()),
        ("process.ConnectResponse", codec::<ps::ConnectResponse>()),
        ("process.SendInputRequest", codec::<ps::SendInputRequest>()),
        (
            "process.SendInputResponse",
            codec::<ps::SendInputResponse>(),
        ),
        ("process.ProcessInput", codec::<ps::ProcessInput>()),
        (
            "process.StreamInputRequest",
            codec::<ps::StreamInputRequest>(),
        ),
        (
            "process.StreamInputRequest.StartEvent",
            codec::<sir::StartEvent>(),
        ),
        (
            "process.StreamInputRequest.DataEvent",
            codec::<sir::DataEvent>(),
        ),
        (
            "process.StreamInputRequest.KeepAlive",
            codec::<sir::KeepAlive>(),
        ),
        (
            "process.StreamInputResponse",
            codec::<ps::StreamInputResponse>(),
        ),
        (
            "process.SendSignalRequest",
            codec::<ps::SendSignalRequest>(),
        ),
        (
            "process.SendSignalResponse",
            codec::<ps::SendSignalResponse>(),
        ),
        (
            "process.CloseStdinRequest",
            codec::<ps::CloseStdinRequest>(),
        ),
        (
            "process.CloseStdinResponse",
            codec::<ps::CloseStdinResponse>(),
        ),
        ("process.ConnectRequest", codec::<ps::ConnectRequest>()),
        ("process.ProcessSelector", codec::<ps::ProcessSelector>()),
        ("filesystem.MoveRequest", codec::<fs::MoveRequest>()),
        ("filesystem.MoveResponse", codec::<fs::MoveResponse>()),
        ("filesystem.MakeDirRequest", codec::<fs::MakeDirRequest>()),
        ("filesystem.MakeDirResponse", codec::<fs::MakeDirResponse>()),
        ("filesystem.RemoveRequest", codec::<fs::RemoveRequest>()),
        ("filesystem.RemoveResponse", codec::<fs::RemoveResponse>()),
        ("filesystem.StatRequest", codec::<fs::StatRequest>()),
        ("filesystem.StatResponse", codec::<fs::StatResponse>()),
        ("filesystem.EntryInfo", codec::<fs::EntryInfo>()),
        ("filesystem.ListDirRequest", codec::<fs::ListDirRequest>()),
        ("filesystem.ListDirResponse", codec::<fs::ListDirResponse>()),
        ("filesystem.WatchDirRequest", codec::<fs::WatchDirRequest>()),
        ("filesystem.FilesystemEvent", codec::<fs::FilesystemEvent>()),
        (
            "filesystem.WatchDirResponse",
            codec::<fs::WatchDirResponse>(),
        ),
        (
            "filesystem.WatchDirResponse.StartEvent",
            codec::<wdr::StartEvent>(),
        ),
        (
            "filesystem.WatchDirResponse.KeepAlive",
            codec::<wdr::KeepAlive>(),
        ),
        (
            "filesystem.CreateWatcherRequest",
            codec::<fs::CreateWatcherRequest>(),
        ),
        (
            "filesystem.CreateWatcherResponse",
            codec::<fs::CreateWatcherResponse>(),
        ),
        (
            "filesystem.GetWatcherEventsRequest",
            codec::<fs::GetWatcherEventsRequest>(),
        ),
        (
            "filesystem.GetWatcherEventsResponse",
            codec::<fs::GetWatcherEventsResponse>(),
        ),
        (
            "filesystem.RemoveWatcherRequest",
            codec::<fs::RemoveWatcherRequest>(),
        ),
        (
            "filesystem.RemoveWatcherResponse",
            codec::<fs::RemoveWatcherResponse>(),
        ),
        ("connect.EndStreamMessage", codec::<EndStreamMessage>()),
        ("connect.Error", codec::<ConnectError>()),
        ("files.WriteInfo", codec::<files::WriteInfo>()),
        ("files.WriteInfoList", codec::<Vec<files::WriteInfo>>()),
        ("files.HttpError", codec::<files::HttpError>()),
    ])
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The `.json` files directly in `dir`, by file stem.
fn json_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_str().unwrap().to_owned();
            (stem, std::fs::read(&p).unwrap())
        })
        .collect()
}

/// The proto name a canonical file stem is for (`process.StartRequest--pty` → `process.StartRequest`).
fn kind_of(stem: &str) -> &str {
    stem.split_once("--").map_or(stem, |(kind, _)| kind)
}

#[test]
fn canonical_goldens_round_trip_byte_for_byte() {
    let codecs = codecs();
    let files = json_files(&golden_dir());
    let mut failures = Vec::new();
    let mut covered = BTreeSet::new();
    for (stem, bytes) in &files {
        let kind = kind_of(stem);
        let Some(codec) = codecs.get(kind) else {
            failures.push(format!("{stem}: no message kind {kind:?}"));
            continue;
        };
        covered.insert(kind);
        let text = std::str::from_utf8(bytes).unwrap();
        let Some(expected) = text.strip_suffix('\n') else {
            failures.push(format!("{stem}: must end with one newline"));
            continue;
        };
        match (codec.reencode)(expected.as_bytes()) {
            Ok(got) if got == expected => {}
            Ok(got) => failures.push(format!("{stem}:\n  want {expected}\n  got  {got}")),
            Err(e) => failures.push(format!("{stem}: {e}")),
        }
    }
    for kind in codecs.keys() {
        if !covered.contains(kind) {
            failures.push(format!("{kind}: no golden file"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(files.len() >= codecs.len());
}

#[test]
fn lenient_forms_decode_to_the_canonical_value() {
    let codecs = codecs();
    let canonical = json_files(&golden_dir());
    let lenient = json_files(&golden_dir().join("lenient"));
    assert!(!lenient.is_empty());
    let mut failures = Vec::new();
    for (stem, bytes) in &lenient {
        let Some((canonical_stem, _)) = stem.split_once('@') else {
            failures.push(format!("{stem}: name must be <canonical>@<what>"));
            continue;
        };
        let Some(want) = canonical.get(canonical_stem) else {
            failures.push(format!("{stem}: no canonical file {canonical_stem}.json"));
            continue;
        };
        let codec = codecs[kind_of(canonical_stem)];
        let want = std::str::from_utf8(want).unwrap().trim_end();
        if let Err(e) = (codec.same_value)(want.as_bytes(), bytes) {
            failures.push(format!("{stem}: {e}"));
        }
        match (codec.reencode)(bytes) {
            Ok(got) if got == want => {}
            Ok(got) => failures.push(format!("{stem}:\n  want {want}\n  got  {got}")),
            Err(e) => failures.push(format!("{stem}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Spot checks that the goldens mean what `docs/envd.md` says, not just that they round-trip.
#[test]
fn goldens_decode_to_the_documented_values() {
    let read = |stem: &str| std::fs::read(golden_dir().join(format!("{stem}.json"))).unwrap();

    let start: ps::StartRequest = serde_json::from_slice(&read("process.StartRequest")).unwrap();
    let process = start.process.unwrap();
    assert_eq!(process.args, ["-l", "-c", "echo hi"]);
    assert_eq!(process.cwd.as_deref(), Some("/home/user"));
    assert_eq!(start.stdin, Some(false));

    let event: ps::ProcessEvent =
        serde_json::from_slice(&read("process.ProcessEvent--stderr")).unwrap();
    use ps::process_event::{DataEvent, Event, data_event::Output};
    assert_eq!(
        event.event,
        Some(Event::Data(DataEvent {
            output: Some(Output::Stderr(b"err\n".to_vec()))
        }))
    );

    let signal: ps::SendSignalRequest =
        serde_json::from_slice(&read("process.SendSignalRequest")).unwrap();
    assert_eq!(signal.signal, ps::Signal::Sigkill);
    assert_eq!(signal.signal.as_i32(), 9);
    assert_eq!(signal.process, Some(ps::ProcessSelector::pid(42)));

    let entry: fs::EntryInfo =
        serde_json::from_slice(&read("filesystem.EntryInfo--large")).unwrap();
    assert_eq!(entry.size, 9_007_199_254_740_993);
    assert_eq!(entry.mode, 0o600);
    let modified = entry.modified_time.unwrap();
    assert_eq!((modified.seconds, modified.nanos), (-1, 999_999_999));

    let end: EndStreamMessage =
        serde_json::from_slice(&read("connect.EndStreamMessage--error")).unwrap();
    let error = end.clone().into_result().unwrap_err();
    assert_eq!(error.code, sandbox_envd::Code::NotFound);
    assert_eq!(error.details[0].value, [0x0a, 0x02, 0x08, 0x3c]);
    assert_eq!(end.metadata["acme-operation-cost"], ["237"]);
}
