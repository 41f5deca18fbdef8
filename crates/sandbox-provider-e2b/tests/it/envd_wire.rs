//! The exact envd requests behind `exec` and `write_file`, against the recording server as
//! the gateway (`proxy_url`) every data-plane request is dialled at: Connect envelopes, the
//! sandbox host, the routing headers, the envd token and the Basic-auth user; a multipart
//! upload naming the user.

use bytes::{BufMut, Bytes, BytesMut};
use sandbox_core::{CreateRequest, ExecRequest, SandboxPath, SandboxProvider, TemplateId};
use serde_json::{Value, json};

use crate::recorder::{Recorder, Reply, Seen};
use crate::wire::{answer, provider};

/// One Connect envelope: flags, big-endian length, JSON.
fn envelope(flags: u8, message: &Value) -> Bytes {
    let payload = message.to_string();
    let mut out = BytesMut::new();
    out.put_u8(flags);
    out.put_u32(u32::try_from(payload.len()).unwrap());
    out.put_slice(payload.as_bytes());
    out.freeze()
}

/// The envelopes of a request body, as JSON.
fn envelopes(body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    let mut rest = body;
    while rest.len() >= 5 {
        let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
        out.push((rest[0], serde_json::from_slice(&rest[5..5 + len]).unwrap()));
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty(), "trailing bytes in {body:?}");
    out
}

fn started_stream() -> Reply {
    let mut body = BytesMut::new();
    body.put(envelope(0, &json!({"event": {"start": {"pid": 42}}})));
    body.put(envelope(0, &json!({"event": {"data": {"stdout": "aGkK"}}})));
    body.put(envelope(
        0,
        &json!({"event": {"data": {"stderr": "ZXJyCg=="}}}),
    ));
    body.put(envelope(
        0,
        &json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3"}}}),
    ));
    body.put(envelope(2, &json!({})));
    Reply::Raw(
        200,
        vec![("content-type", "application/connect+json".to_owned())],
        body.freeze(),
    )
}

fn envd_headers(seen: &Seen) {
    assert_eq!(seen.header("host"), Some("49983-i1.localhost"), "{seen:?}");
    assert_eq!(seen.header("e2b-sandbox-id"), Some("i1"));
    assert_eq!(seen.header("e2b-sandbox-port"), Some("49983"));
    assert_eq!(seen.header("x-access-token"), Some("envd-token"));
    // The API key is the control plane's: it never travels to a sandbox.
    assert_eq!(seen.header("x-api-key"), None);
}

#[tokio::test]
async fn exec_is_one_start_call_in_connect_envelopes() {
    let rec = Recorder::start().await;
    rec.on(
        "POST",
        "/sandboxes",
        vec![Reply::ok(201, answer("i1", None))],
    );
    rec.on("POST", "/process.Process/Start", vec![started_stream()]);
    let p = provider(&rec);
    let handle = p
        .create(CreateRequest::new(TemplateId::new("base").unwrap()))
        .await
        .unwrap();
    let mut request = ExecRequest::argv("/bin/echo", ["a b", "$HOME"]);
    request.env.insert("K".to_owned(), "v".to_owned());
    request.cwd = Some(SandboxPath::new("/tmp").unwrap());
    let result = p.exec(&handle, request).await.unwrap();
    assert_eq!(result.exit_code, 3);
    assert_eq!(result.stdout, b"hi\n");
    assert_eq!(result.stderr, b"err\n");
    assert!(!result.killed && !result.truncated);

    let start = &rec.seen_at("POST", "/process.Process/Start")[0];
    envd_headers(start);
    // Root, as envd's Basic credentials with an empty password.
    assert_eq!(start.header("authorization"), Some("Basic cm9vdDo="));
    assert_eq!(
        start.header("content-type"),
        Some("application/connect+json")
    );
    assert_eq!(start.header("connect-protocol-version"), Some("1"));
    let sent = envelopes(&start.body);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (flags, message) = &sent[0];
    assert_eq!(*flags, 0);
    let process = &message["process"];
    // The argv form is the program and its arguments, nothing interpreted.
    assert_eq!(process["cmd"], "/bin/echo");
    assert_eq!(process["args"], json!(["a b", "$HOME"]));
    assert_eq!(process["envs"]["K"], "v");
    assert_eq!(process["cwd"], "/tmp");
}

#[tokio::test]
async fn a_write_is_one_multipart_upload_naming_the_user() {
    let rec = Recorder::start().await;
    rec.on(
        "POST",
        "/sandboxes",
        vec![Reply::ok(201, answer("i1", None))],
    );
    rec.on(
        "POST",
        "/files",
        vec![Reply::ok(
            200,
            json!([{"name": "x.bin", "type": "file", "path": "/tmp/x.bin"}]),
        )],
    );
    let p = provider(&rec);
    let handle = p
        .create(CreateRequest::new(TemplateId::new("base").unwrap()))
        .await
        .unwrap();
    let content = b"\x00\x01binary\xffbytes".to_vec();
    p.write_file(&handle, &SandboxPath::new("/tmp/x.bin").unwrap(), &content)
        .await
        .unwrap();
    let upload = &rec.seen_at("POST", "/files")[0];
    envd_headers(upload);
    let params = upload.params();
    assert!(
        params.contains(&("path".to_owned(), "/tmp/x.bin".to_owned())),
        "{params:?}"
    );
    assert!(
        params.contains(&("username".to_owned(), "root".to_owned())),
        "{params:?}"
    );
    let content_type = upload.header("content-type").unwrap();
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .unwrap_or_else(|| panic!("not multipart: {content_type}"));
    let body = &upload.body[..];
    let head = format!("--{boundary}\r\n");
    assert!(body.starts_with(head.as_bytes()), "{body:?}");
    let text = String::from_utf8_lossy(body);
    assert!(text.contains("name=\"file\""), "{text}");
    // The part's filename is the whole path, as the SDKs send it.
    assert!(text.contains("filename=\"/tmp/x.bin\""), "{text}");
    // The bytes travel as they are, between the part's head and the closing boundary.
    let at = body.windows(content.len()).position(|w| w == content);
    assert!(at.is_some(), "content not in {body:?}");
    assert!(
        body.ends_with(format!("--{boundary}--\r\n").as_bytes()),
        "{text}"
    );
}
