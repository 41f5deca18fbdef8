//! The envd requests behind streamed files and watches, against the recording server as the
//! gateway: a streamed write is an octet-stream upload to a hidden sibling and then a `Move`
//! over the target (the sibling removed when anything fails, the target never touched); a
//! streamed read stats first, reads only a regular file and is bounded; a rename checks the
//! port's rules before its `Move`; a watch is one `WatchDir` stream, armed by its `start`.

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use sandbox_core::{
    ByteStream, Checked, CreateRequest, Error, ErrorCode, ErrorKind, Operation, ReadStream,
    SandboxHandle, SandboxPath, SandboxProvider, TemplateId, WatchEventKind, narrow,
};
use sandbox_provider_e2b::E2bProvider;
use serde_json::{Value, json};

use crate::recorder::{Recorder, Reply, Seen};
use crate::wire::{answer, provider};

const STAT: &str = "/filesystem.Filesystem/Stat";
const MOVE: &str = "/filesystem.Filesystem/Move";
const REMOVE: &str = "/filesystem.Filesystem/Remove";
const WATCH: &str = "/filesystem.Filesystem/WatchDir";

fn path(raw: &str) -> SandboxPath {
    SandboxPath::new(raw).unwrap()
}

/// A sandbox whose envd reports `version`.
async fn sandbox(rec: &Recorder, version: &str) -> (Checked<E2bProvider>, SandboxHandle) {
    let mut created = answer("i1", None);
    created["envdVersion"] = json!(version);
    rec.on("POST", "/sandboxes", vec![Reply::ok(201, created)]);
    // What a failed data-plane call is explained by: the sandbox still runs.
    rec.on(
        "GET",
        "/sandboxes/i1",
        vec![Reply::ok(
            200,
            json!({"sandboxID": "i1", "templateID": "base", "clientID": "c", "state": "running",
                   "startedAt": "2026-12-02T10:00:00Z", "endAt": "2026-12-02T10:05:00Z",
                   "cpuCount": 1, "memoryMB": 512, "diskSizeMB": 1024, "envdVersion": version}),
        )],
    );
    let p = provider(rec);
    let h = p
        .create(CreateRequest::new(TemplateId::new("base").unwrap()))
        .await
        .unwrap();
    (p, h)
}

fn entry(path: &str, kind: &str, size: u64) -> Value {
    let name = path.rsplit('/').next().unwrap();
    json!({"name": name, "type": kind, "path": path, "size": size.to_string()})
}

fn stat_answer(entry: Value) -> Reply {
    Reply::ok(200, json!({ "entry": entry }))
}

fn connect_error(status: u16, code: &str, message: &str) -> Reply {
    Reply::ok(status, json!({"code": code, "message": message}))
}

/// The JSON message of a unary Connect request.
fn message(seen: &Seen) -> Value {
    seen.json()
}

fn param<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A source handing out `chunks`, then an error instead of the end when `fail` is set.
struct Chunks {
    chunks: std::collections::VecDeque<Vec<u8>>,
    fail: bool,
}

#[async_trait]
impl ByteStream for Chunks {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, Error>> {
        match self.chunks.pop_front() {
            Some(chunk) => Some(Ok(chunk)),
            None if self.fail => {
                self.fail = false;
                Some(Err(Error::unavailable(
                    Operation::new("upload"),
                    "the client went away mid-upload",
                )))
            }
            None => None,
        }
    }
}

fn source(chunks: &[&[u8]], fail: bool) -> ReadStream {
    Box::new(Chunks {
        chunks: chunks.iter().map(|c| c.to_vec()).collect(),
        fail,
    })
}

fn uploaded(path: &str) -> Reply {
    Reply::ok(
        200,
        json!([{"name": path.rsplit('/').next().unwrap(), "type": "file", "path": path}]),
    )
}

/// The staging path of the one upload seen, checked to be a hidden sibling of `target`.
fn staging_of(upload: &Seen, target: &str) -> String {
    let params = upload.params();
    let staged = param(&params, "path").unwrap().to_owned();
    let (dir, name) = target.rsplit_once('/').unwrap();
    let prefix = format!("{dir}/.{name}.sandbox-upload-");
    let suffix = staged
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{staged} is not a hidden sibling of {target}"));
    assert_eq!(suffix.len(), 16, "{staged}");
    assert!(suffix.bytes().all(|b| b.is_ascii_hexdigit()), "{staged}");
    staged
}

#[tokio::test]
async fn a_streamed_write_uploads_a_hidden_sibling_then_moves_it_over_the_target() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec, "0.6.4").await;
    rec.on_fn("POST", "/files", |seen, _| {
        let params = seen.params();
        uploaded(param(&params, "path").unwrap())
    });
    rec.on(
        "POST",
        MOVE,
        vec![Reply::ok(
            200,
            json!({"entry": entry("/w/d/up.bin", "FILE_TYPE_FILE", 9)}),
        )],
    );
    let s = narrow::streamed_files(&p).unwrap();
    let target = path("/w/d/up.bin");
    let written = s
        .write_stream(
            &h,
            &target,
            source(&[b"abc", b"\x00\xff", b"defg"], false),
            9,
        )
        .await
        .unwrap();
    assert_eq!(written, 9);

    let uploads = rec.seen_at("POST", "/files");
    assert_eq!(uploads.len(), 1);
    let upload = &uploads[0];
    assert_eq!(upload.header("host"), Some("49983-i1.localhost"));
    assert_eq!(upload.header("x-access-token"), Some("envd-token"));
    // Streamed: the raw bytes as one octet-stream body, not a multipart form.
    assert_eq!(
        upload.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(&upload.body[..], b"abc\x00\xffdefg");
    // Files act as root.
    assert_eq!(param(&upload.params(), "username"), Some("root"));
    let staged = staging_of(upload, target.as_str());

    let moves = rec.seen_at("POST", MOVE);
    assert_eq!(moves.len(), 1);
    assert_eq!(
        message(&moves[0]),
        json!({"source": staged, "destination": "/w/d/up.bin"})
    );
    assert_eq!(moves[0].header("authorization"), Some("Basic cm9vdDo="));
    // The move came after the upload, and nothing was removed.
    let order: Vec<String> = rec
        .seen()
        .iter()
        .filter(|s| s.path == "/files" || s.path == MOVE)
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(order, ["/files", MOVE]);
    assert!(rec.seen_at("POST", REMOVE).is_empty());
    // A second write stages under another name.
    s.write_stream(&h, &target, source(&[b"x"], false), 1)
        .await
        .unwrap();
    let again = staging_of(&rec.seen_at("POST", "/files")[1], target.as_str());
    assert_ne!(again, staged);
}

#[tokio::test]
async fn a_failed_source_or_the_cap_removes_the_sibling_and_never_moves() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec, "0.6.4").await;
    rec.on_fn("POST", "/files", |seen, _| {
        let params = seen.params();
        uploaded(param(&params, "path").unwrap())
    });
    rec.on("POST", REMOVE, vec![Reply::ok(200, json!({}))]);
    let s = narrow::streamed_files(&p).unwrap();
    let target = path("/w/kept.bin");

    // The source fails after two chunks: its own error, not the connection's.
    let e = s
        .write_stream(&h, &target, source(&[b"abcd", b"efgh"], true), 1 << 20)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("went away mid-upload"), "{e}");
    assert_eq!(e.operation(), Operation::WRITE_FILE_STREAM);
    let first = rec.seen_at("POST", "/files")[0].clone();
    let staged = staging_of(&first, target.as_str());
    // The body ended cleanly with what the source gave before failing.
    assert_eq!(&first.body[..], b"abcdefgh");
    let removes = rec.seen_at("POST", REMOVE);
    assert_eq!(removes.len(), 1);
    assert_eq!(message(&removes[0]), json!({"path": staged}));

    // Past the cap: file_too_large, and no byte past the cap was sent.
    let e = s
        .write_stream(&h, &target, source(&[b"abcd", b"efgh", b"ijkl"], false), 10)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::FileTooLarge), "{e}");
    assert_eq!(e.operation(), Operation::WRITE_FILE_STREAM);
    let second = rec.seen_at("POST", "/files")[1].clone();
    assert!(second.body.len() <= 10, "{} bytes sent", second.body.len());
    let staged = staging_of(&second, target.as_str());
    let removes = rec.seen_at("POST", REMOVE);
    assert_eq!(removes.len(), 2);
    assert_eq!(message(&removes[1]), json!({"path": staged}));

    // Neither ever touched the target.
    assert!(rec.seen_at("POST", MOVE).is_empty());
}

#[tokio::test]
async fn a_failed_move_removes_the_sibling() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec, "0.6.4").await;
    rec.on_fn("POST", "/files", |seen, _| {
        let params = seen.params();
        uploaded(param(&params, "path").unwrap())
    });
    rec.on(
        "POST",
        MOVE,
        vec![connect_error(400, "invalid_argument", "is a directory")],
    );
    rec.on("POST", REMOVE, vec![Reply::ok(200, json!({}))]);
    let s = narrow::streamed_files(&p).unwrap();
    let e = s
        .write_stream(&h, &path("/w/dir"), source(&[b"abc"], false), 3)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    let staged = staging_of(&rec.seen_at("POST", "/files")[0], "/w/dir");
    let removes = rec.seen_at("POST", REMOVE);
    assert_eq!(removes.len(), 1);
    assert_eq!(message(&removes[0]), json!({"path": staged}));
}

#[tokio::test]
async fn an_envd_without_streamed_uploads_is_refused_before_anything_is_sent() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec, "0.5.6").await;
    let s = narrow::streamed_files(&p).unwrap();
    let e = s
        .write_stream(&h, &path("/w/a.bin"), source(&[b"abc"], false), 3)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.message().contains("0.5.6"), "{e}");
    assert!(rec.seen_at("POST", "/files").is_empty());
}

/// Drains a stream: the bytes and the error that ended it.
async fn drain(mut stream: ReadStream) -> (Vec<u8>, Option<Error>) {
    let mut out = Vec::new();
    while let Some(chunk) = stream.next_chunk().await {
        match chunk {
            Ok(bytes) => out.extend_from_slice(&bytes),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

#[tokio::test]
async fn a_streamed_read_stats_first_and_reads_only_a_regular_file() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec, "0.6.4").await;
    let content = b"0123456789".to_vec();
    rec.on_fn("POST", STAT, |seen, _| {
        let asked = seen.json()["path"].as_str().unwrap().to_owned();
        match asked.as_str() {
            "/w/ok.bin" => stat_answer(entry(&asked, "FILE_TYPE_FILE", 10)),
            "/w/fifo" => stat_answer(entry(&asked, "FILE_TYPE_UNSPECIFIED", 0)),
            // A link to /dev/zero, as newer envd reports it: the target's type, flagged.
            "/w/zero" => {
                let mut e = entry(&asked, "FILE_TYPE_FILE", 0);
                e["isSymlink"] = json!(true);
                e["symlinkTarget"] = json!("/dev/zero");
                stat_answer(e)
            }
            "/w/big.bin" => stat_answer(entry(&asked, "FILE_TYPE_FILE", 1 << 40)),
            _ => connect_error(404, "not_found", "no such file"),
        }
    });
    rec.on(
        "GET",
        "/files",
        vec![Reply::Raw(
            200,
            vec![("content-type", "application/octet-stream".to_owned())],
            Bytes::from(content.clone()),
        )],
    );
    let s = narrow::streamed_files(&p).unwrap();
    let (back, ended) = drain(s.read_stream(&h, &path("/w/ok.bin"), 10).await.unwrap()).await;
    assert!(ended.is_none(), "{ended:?}");
    assert_eq!(back, content);
    let downloads = rec.seen_at("GET", "/files");
    assert_eq!(downloads.len(), 1);
    let params = downloads[0].params();
    assert_eq!(param(&params, "path"), Some("/w/ok.bin"));
    assert_eq!(param(&params, "username"), Some("root"));
    // The stat came first.
    let first = rec.seen().into_iter().position(|s| s.path == STAT).unwrap();
    let download = rec
        .seen()
        .into_iter()
        .position(|s| s.path == "/files")
        .unwrap();
    assert!(first < download);

    // Nothing but a regular file is downloaded, through either read.
    for odd in ["/w/fifo", "/w/zero"] {
        let e = s.read_stream(&h, &path(odd), 1 << 30).await.err().unwrap();
        assert_eq!(
            (e.kind(), e.code()),
            (ErrorKind::InvalidRequest, Some(ErrorCode::NotARegularFile)),
            "{odd}: {e}"
        );
        let e = p
            .read_file_stream(&h, &path(odd), 1 << 30)
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), Some(ErrorCode::NotARegularFile), "{odd}: {e}");
    }
    // A file already over the cap is refused before its download.
    let e = s
        .read_stream(&h, &path("/w/big.bin"), 1 << 30)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Some(ErrorCode::FileTooLarge), "{e}");
    let e = s.read_stream(&h, &path("/w/none"), 10).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert_eq!(
        rec.seen_at("GET", "/files").len(),
        1,
        "only ok.bin was read"
    );
}

#[tokio::test]
async fn a_file_that_grew_past_the_cap_after_its_stat_ends_the_stream() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec, "0.6.4").await;
    rec.on(
        "POST",
        STAT,
        vec![stat_answer(entry("/w/grows", "FILE_TYPE_FILE", 4))],
    );
    // Chunked, with no length announced: only the bytes tell.
    rec.on(
        "GET",
        "/files",
        vec![Reply::Raw(
            200,
            vec![
                ("content-type", "application/octet-stream".to_owned()),
                ("transfer-encoding", "chunked".to_owned()),
            ],
            Bytes::from(vec![7u8; 64 * 1024]),
        )],
    );
    let stream = p
        .read_file_stream(&h, &path("/w/grows"), 1000)
        .await
        .unwrap();
    let (got, ended) = drain(stream).await;
    assert!(got.len() <= 1000, "{} bytes past a cap of 1000", got.len());
    let e = ended.expect("the stream must end in an error");
    assert_eq!(e.code(), Some(ErrorCode::FileTooLarge), "{e}");
    assert_eq!(e.operation(), Operation::READ_FILE_STREAM);
}

#[tokio::test]
async fn a_rename_checks_the_ports_rules_then_is_one_move() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec, "0.6.4").await;
    rec.on_fn("POST", STAT, |seen, _| {
        let asked = seen.json()["path"].as_str().unwrap().to_owned();
        match asked.as_str() {
            "/w/dir" => stat_answer(entry(&asked, "FILE_TYPE_DIRECTORY", 4096)),
            "/w/file" => stat_answer(entry(&asked, "FILE_TYPE_FILE", 3)),
            _ => connect_error(404, "not_found", "no such file"),
        }
    });
    rec.on(
        "POST",
        MOVE,
        vec![Reply::ok(
            200,
            json!({"entry": entry("/w/new/b", "FILE_TYPE_FILE", 3)}),
        )],
    );
    let s = narrow::streamed_files(&p).unwrap();
    s.rename_path(&h, &path("/w/a"), &path("/w/new/b"))
        .await
        .unwrap();
    let moves = rec.seen_at("POST", MOVE);
    assert_eq!(moves.len(), 1);
    assert_eq!(
        message(&moves[0]),
        json!({"source": "/w/a", "destination": "/w/new/b"})
    );
    // Onto an existing file: envd's move replaces it.
    s.rename_path(&h, &path("/w/a"), &path("/w/file"))
        .await
        .unwrap();
    assert_eq!(rec.seen_at("POST", MOVE).len(), 2);
    // Onto a directory, into itself, or `/`: refused here, never sent.
    for (from, to) in [
        ("/w/a", "/w/dir"),
        ("/w/dir", "/w/dir/inside"),
        ("/w/a", "/"),
    ] {
        let e = s.rename_path(&h, &path(from), &path(to)).await.unwrap_err();
        assert_eq!(
            (e.kind(), e.code()),
            (ErrorKind::InvalidRequest, Some(ErrorCode::InvalidPath)),
            "{from} -> {to}: {e}"
        );
        assert_eq!(e.operation(), Operation::RENAME_PATH);
    }
    assert_eq!(rec.seen_at("POST", MOVE).len(), 2);
}

/// One Connect envelope: flags, big-endian length, JSON.
fn envelope(flags: u8, message: &Value) -> Bytes {
    let payload = message.to_string();
    let mut out = BytesMut::new();
    out.put_u8(flags);
    out.put_u32(u32::try_from(payload.len()).unwrap());
    out.put_slice(payload.as_bytes());
    out.freeze()
}

fn watch_stream(events: &[Value]) -> Reply {
    let mut body = BytesMut::new();
    for event in events {
        body.put(envelope(0, event));
    }
    body.put(envelope(2, &json!({})));
    Reply::Raw(
        200,
        vec![("content-type", "application/connect+json".to_owned())],
        body.freeze(),
    )
}

#[tokio::test]
async fn a_watch_is_one_watch_dir_stream_armed_by_its_start() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec, "0.6.4").await;
    rec.on_fn("POST", STAT, |seen, _| {
        let asked = seen.json()["path"].as_str().unwrap().to_owned();
        match asked.as_str() {
            "/w" => stat_answer(entry(&asked, "FILE_TYPE_DIRECTORY", 4096)),
            "/w/file" => stat_answer(entry(&asked, "FILE_TYPE_FILE", 3)),
            _ => connect_error(404, "not_found", "no such file"),
        }
    });
    rec.on(
        "POST",
        WATCH,
        vec![watch_stream(&[
            json!({"start": {}}),
            json!({"filesystem": {"name": "sub/a.txt", "type": "EVENT_TYPE_CREATE"}}),
            json!({"keepalive": {}}),
            json!({"filesystem": {"name": "b.txt", "type": "EVENT_TYPE_WRITE"}}),
            json!({"filesystem": {"name": "b.txt", "type": "EVENT_TYPE_RENAME"}}),
            json!({"filesystem": {"name": "c", "type": "EVENT_TYPE_REMOVE"}}),
        ])],
    );
    let w = narrow::watch(&p).unwrap();
    let mut events = w.watch_dir(&h, &path("/w"), true).await.unwrap();
    let mut seen = Vec::new();
    while let Some(event) = events.next_event().await {
        let event = event.unwrap();
        seen.push((event.kind, event.path.as_str().to_owned()));
    }
    assert_eq!(
        seen,
        [
            (WatchEventKind::Create, "/w/sub/a.txt".to_owned()),
            (WatchEventKind::Write, "/w/b.txt".to_owned()),
            (WatchEventKind::Rename, "/w/b.txt".to_owned()),
            (WatchEventKind::Remove, "/w/c".to_owned()),
        ]
    );
    let watches = rec.seen_at("POST", WATCH);
    assert_eq!(watches.len(), 1);
    let watch = &watches[0];
    assert_eq!(
        watch.header("content-type"),
        Some("application/connect+json")
    );
    assert_eq!(watch.header("authorization"), Some("Basic cm9vdDo="));
    // The request is one envelope naming the directory and the recursive flag.
    let body = &watch.body[..];
    let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
    assert_eq!((body[0], body.len()), (0, 5 + len));
    let request: Value = serde_json::from_slice(&body[5..]).unwrap();
    assert_eq!(request, json!({"path": "/w", "recursive": true}));

    // A file is not a directory; a missing path is not found; neither opens a stream.
    let e = w.watch_dir(&h, &path("/w/file"), false).await.unwrap_err();
    assert_eq!(
        (e.kind(), e.code()),
        (ErrorKind::InvalidRequest, Some(ErrorCode::NotADirectory)),
        "{e}"
    );
    let e = w.watch_dir(&h, &path("/w/none"), false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert_eq!(rec.seen_at("POST", WATCH).len(), 1);
}

#[tokio::test]
async fn a_watch_that_does_not_begin_with_start_is_refused() {
    let rec = Recorder::start().await;
    let (p, h) = sandbox(&rec, "0.6.4").await;
    rec.on(
        "POST",
        STAT,
        vec![stat_answer(entry("/w", "FILE_TYPE_DIRECTORY", 4096))],
    );
    rec.on(
        "POST",
        WATCH,
        vec![watch_stream(&[json!({
            "filesystem": {"name": "a", "type": "EVENT_TYPE_CREATE"}
        })])],
    );
    let w = narrow::watch(&p).unwrap();
    let e = w.watch_dir(&h, &path("/w"), false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Internal, "{e}");
    assert!(e.message().contains("not start"), "{e}");
}
