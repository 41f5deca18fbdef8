//! `GET /files` and `POST /files` through their handler functions, on temporary directories:
//! paths, users, errors and their bodies, gzip both ways, ranges, multipart with several
//! files, metadata, special files refused, bounds, and signed URLs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod support;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, StatusCode};
use sandbox_agent::files::{
    self, FileOperation, FilesBody, FilesContext, FilesLimits, get_files, post_files,
};
use serde_json::Value;
use support::Env;

fn ctx(env: &Env) -> FilesContext {
    FilesContext {
        accounts: env.accounts.clone(),
        default_user: Some("me".into()),
        default_workdir: None,
        access_token: None,
        limits: FilesLimits::default(),
        reserved: Default::default(),
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn get(query: &str) -> Request<Full<Bytes>> {
    Request::get(format!("/files?{query}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

async fn body_bytes(response: Response<FilesBody>) -> Vec<u8> {
    response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec()
}

/// An error answer's status, checked to be envd's JSON form, and its message.
async fn error_of(response: Response<FilesBody>) -> (u16, String) {
    let status = response.status().as_u16();
    assert_eq!(
        response.headers()["content-type"],
        "application/json; charset=utf-8"
    );
    let body: Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
    assert_eq!(body["code"], u64::from(status), "{body}");
    (status, body["message"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn downloads_answer_the_bytes_with_envd_headers() {
    let env = Env::new();
    let file = env.home().join("notes.txt");
    std::fs::write(&file, b"hello world").unwrap();
    let response = get_files(get("path=notes.txt"), &ctx(&env)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let h = response.headers();
    assert_eq!(h["content-type"], "text/plain; charset=utf-8");
    assert_eq!(h["content-disposition"], "inline; filename=notes.txt");
    assert_eq!(h["content-length"], "11");
    assert!(h.get("content-encoding").is_none());
    assert_eq!(body_bytes(response).await, b"hello world");

    // Absolute, `~/`, and binary content with an unknown extension.
    let bin = env.home().join("data.bin");
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    std::fs::write(&bin, &data).unwrap();
    for path in [bin.to_str().unwrap(), "~/data.bin"] {
        let response = get_files(get(&format!("path={}", encode(path))), &ctx(&env)).await;
        assert_eq!(
            response.headers()["content-type"],
            "application/octet-stream"
        );
        assert_eq!(body_bytes(response).await, data, "{path}");
    }
}

#[tokio::test]
async fn download_errors_are_envd_errors() {
    let env = Env::new();
    std::fs::create_dir(env.home().join("dir")).unwrap();
    let (status, message) = error_of(get_files(get("path=dir"), &ctx(&env)).await).await;
    assert_eq!(status, 400);
    assert!(message.contains("is a directory"), "{message}");

    let (status, message) = error_of(get_files(get("path=missing"), &ctx(&env)).await).await;
    assert_eq!(status, 404);
    let expected = format!(
        "path '{}' does not exist",
        env.home().join("missing").display()
    );
    assert_eq!(message, expected);

    let (status, _) = error_of(get_files(get("path=x&username=ghost"), &ctx(&env)).await).await;
    assert_eq!(status, 401);

    let no_default = FilesContext {
        default_user: None,
        ..ctx(&env)
    };
    let (status, message) = error_of(get_files(get("path=x"), &no_default).await).await;
    assert_eq!(status, 400);
    assert!(message.contains("username"), "{message}");

    // The user's own home is where relative paths start.
    std::fs::write(env.other.home.join("theirs"), b"other's").unwrap();
    let response = get_files(get("path=theirs&username=other"), &ctx(&env)).await;
    assert_eq!(body_bytes(response).await, b"other's");
}

#[tokio::test]
async fn special_files_are_refused_not_read() {
    let env = Env::new();
    let fifo = env.home().join("pipe");
    support::mkfifo(&fifo);
    std::os::unix::fs::symlink("/dev/zero", env.home().join("zero")).unwrap();
    for path in ["pipe", "zero", "/dev/zero"] {
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            get_files(get(&format!("path={}", encode(path))), &ctx(&env)),
        )
        .await
        .expect("a special file hung the download");
        let (status, message) = error_of(response).await;
        assert_eq!(status, 400, "{path}");
        assert!(message.contains("not a regular file"), "{path}: {message}");
    }
    // Nor written: the upload is refused before it opens the FIFO for writing.
    let response = tokio::time::timeout(
        Duration::from_secs(5),
        post_files(octet("path=pipe", b"data".to_vec()), &ctx(&env)),
    )
    .await
    .expect("a FIFO hung the upload");
    let (status, message) = error_of(response).await;
    assert_eq!(status, 400);
    assert!(message.contains("not a regular file"), "{message}");
}

#[tokio::test]
async fn downloads_are_gzipped_when_accepted() {
    let env = Env::new();
    let content: Vec<u8> = b"compress me please ".repeat(20_000);
    std::fs::write(env.home().join("big.txt"), &content).unwrap();
    let request = Request::get("/files?path=big.txt")
        .header("accept-encoding", "gzip, deflate")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = get_files(request, &ctx(&env)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-encoding"], "gzip");
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; charset=utf-8"
    );
    let compressed = body_bytes(response).await;
    assert!(compressed.len() < content.len() / 10);
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&compressed[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, content);

    let refused = Request::get("/files?path=big.txt")
        .header("accept-encoding", "br, identity;q=0")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _) = error_of(get_files(refused, &ctx(&env)).await).await;
    assert_eq!(status, 406);
}

#[tokio::test]
async fn one_range_is_served() {
    let env = Env::new();
    std::fs::write(env.home().join("r.bin"), b"0123456789").unwrap();
    let request = Request::get("/files?path=r.bin")
        .header("range", "bytes=2-5")
        .header("accept-encoding", "gzip")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = get_files(request, &ctx(&env)).await;
    assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(response.headers()["content-range"], "bytes 2-5/10");
    assert!(response.headers().get("content-encoding").is_none());
    assert_eq!(body_bytes(response).await, b"2345");
    let past = Request::get("/files?path=r.bin")
        .header("range", "bytes=20-")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _) = error_of(get_files(past, &ctx(&env)).await).await;
    assert_eq!(status, 416);
}

fn octet(query: &str, data: Vec<u8>) -> Request<Full<Bytes>> {
    Request::post(format!("/files?{query}"))
        .header("content-type", "application/octet-stream")
        .body(Full::new(Bytes::from(data)))
        .unwrap()
}

async fn written(response: Response<FilesBody>) -> Value {
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "{:?}",
        response.headers()
    );
    assert_eq!(response.headers()["content-type"], "application/json");
    serde_json::from_slice(&body_bytes(response).await).unwrap()
}

#[tokio::test]
async fn octet_stream_uploads_create_parents_and_overwrite() {
    let env = Env::new();
    let answer =
        written(post_files(octet("path=a/b/c.txt", b"first".to_vec()), &ctx(&env)).await).await;
    let target = env.home().join("a/b/c.txt");
    assert_eq!(
        answer,
        serde_json::json!([{"path": target.to_str().unwrap(), "name": "c.txt", "type": "file"}])
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"first");
    written(post_files(octet("path=a/b/c.txt", b"2nd".to_vec()), &ctx(&env)).await).await;
    assert_eq!(std::fs::read(&target).unwrap(), b"2nd");

    let (status, message) = error_of(post_files(octet("", b"x".to_vec()), &ctx(&env)).await).await;
    assert_eq!(status, 400);
    assert!(
        message.contains("path query parameter is required"),
        "{message}"
    );
    std::fs::create_dir(env.home().join("dir")).unwrap();
    let (status, message) =
        error_of(post_files(octet("path=dir", b"x".to_vec()), &ctx(&env)).await).await;
    assert_eq!(status, 400);
    assert!(message.contains("is a directory"), "{message}");
    let (status, _) =
        error_of(post_files(octet("path=a/b/c.txt/under", b"x".to_vec()), &ctx(&env)).await).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn uploads_belong_to_the_user() {
    let env = Env::new();
    let answer = written(
        post_files(
            octet("path=deep/er/f.txt&username=other", b"x".to_vec()),
            &ctx(&env),
        )
        .await,
    )
    .await;
    let target = env.other.home.join("deep/er/f.txt");
    assert_eq!(answer[0]["path"], target.to_str().unwrap());
    let expected = support::expected_uid(&env.other);
    for path in [
        target.clone(),
        env.other.home.join("deep"),
        env.other.home.join("deep/er"),
    ] {
        assert_eq!(
            std::fs::metadata(&path).unwrap().uid(),
            expected,
            "{}",
            path.display()
        );
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

#[tokio::test]
async fn gzip_uploads_are_decompressed() {
    let env = Env::new();
    let content = b"zipped content ".repeat(10_000);
    let request = Request::post("/files?path=z.txt")
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(Full::new(Bytes::from(gzip(&content))))
        .unwrap();
    written(post_files(request, &ctx(&env)).await).await;
    assert_eq!(std::fs::read(env.home().join("z.txt")).unwrap(), content);

    // Two gzip members in a row are one stream, as Go's reader takes them.
    let mut two = gzip(b"one,");
    two.extend(gzip(b"two"));
    let request = Request::post("/files?path=two.txt")
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(Full::new(Bytes::from(two)))
        .unwrap();
    written(post_files(request, &ctx(&env)).await).await;
    assert_eq!(
        std::fs::read(env.home().join("two.txt")).unwrap(),
        b"one,two"
    );

    for (name, bad) in [
        ("garbage", b"not gzip at all".to_vec()),
        ("truncated", gzip(&content)[..100].to_vec()),
    ] {
        let request = Request::post("/files?path=bad.txt")
            .header("content-type", "application/octet-stream")
            .header("content-encoding", "gzip")
            .body(Full::new(Bytes::from(bad)))
            .unwrap();
        let (status, message) = error_of(post_files(request, &ctx(&env)).await).await;
        assert_eq!(status, 400, "{name}: {message}");
        assert!(message.contains("decompressing"), "{name}: {message}");
    }
    let request = Request::post("/files?path=x")
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "br")
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    assert_eq!(error_of(post_files(request, &ctx(&env)).await).await.0, 400);
}

const BOUNDARY: &str = "----agent-test-boundary";

/// A multipart body of `(field name, filename, content)` parts.
fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, filename, content) in parts {
        out.extend(format!("--{BOUNDARY}\r\n").bytes());
        match filename {
            Some(f) => out.extend(
                format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\n")
                    .bytes(),
            ),
            None => {
                out.extend(format!("Content-Disposition: form-data; name=\"{name}\"\r\n").bytes())
            }
        }
        out.extend(b"Content-Type: application/octet-stream\r\n\r\n");
        out.extend(*content);
        out.extend(b"\r\n");
    }
    out.extend(format!("--{BOUNDARY}--\r\n").bytes());
    out
}

fn multipart_request(query: &str, body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::post(format!("/files?{query}"))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

#[tokio::test]
async fn multipart_uploads_write_every_file_part() {
    let env = Env::new();
    let abs = env.path("elsewhere/abs.bin");
    let abs = abs.to_str().unwrap();
    let body = multipart(&[
        ("file", Some("one.txt"), b"first file"),
        ("comment", None, b"not a file: ignored"),
        ("file", Some("dir/two.txt"), b"second\r\n--not-the-boundary"),
        ("file", Some(abs), &[0u8, 1, 2, 255]),
    ]);
    let answer = written(post_files(multipart_request("", body), &ctx(&env)).await).await;
    let paths: Vec<&str> = answer
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    let one = env.home().join("one.txt");
    let two = env.home().join("dir/two.txt");
    assert_eq!(
        paths,
        vec![one.to_str().unwrap(), two.to_str().unwrap(), abs]
    );
    assert!(
        answer
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["type"] == "file")
    );
    assert_eq!(answer[1]["name"], "two.txt");
    assert_eq!(std::fs::read(&one).unwrap(), b"first file");
    assert_eq!(
        std::fs::read(&two).unwrap(),
        b"second\r\n--not-the-boundary"
    );
    assert_eq!(std::fs::read(abs).unwrap(), [0u8, 1, 2, 255]);

    // The query's path wins over a part's filename.
    let body = multipart(&[("file", Some("ignored.txt"), b"by query")]);
    let answer = written(post_files(multipart_request("path=q.txt", body), &ctx(&env)).await).await;
    assert_eq!(answer[0]["name"], "q.txt");
    assert_eq!(
        std::fs::read(env.home().join("q.txt")).unwrap(),
        b"by query"
    );
    assert!(!env.home().join("ignored.txt").exists());

    // Two parts for one path: the first is written, then 400.
    let body = multipart(&[("file", Some("dup"), b"1"), ("file", Some("./dup"), b"2")]);
    let (status, message) =
        error_of(post_files(multipart_request("", body), &ctx(&env)).await).await;
    assert_eq!(status, 400);
    assert!(
        message.contains("multiple files to the same path"),
        "{message}"
    );
    assert_eq!(std::fs::read(env.home().join("dup")).unwrap(), b"1");

    let (status, message) = error_of(
        post_files(
            Request::post("/files?path=x")
                .header("content-type", "text/plain")
                .body(Full::new(Bytes::from_static(b"x")))
                .unwrap(),
            &ctx(&env),
        )
        .await,
    )
    .await;
    assert_eq!(status, 400);
    assert!(message.contains("unsupported content type"), "{message}");
}

#[tokio::test]
async fn multipart_gzip_and_header_bounds() {
    let env = Env::new();
    let body = multipart(&[
        ("file", Some("g1"), b"gz one"),
        ("file", Some("g2"), b"gz two"),
    ]);
    let request = Request::post("/files")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .header("content-encoding", "gzip")
        .body(Full::new(Bytes::from(gzip(&body))))
        .unwrap();
    let answer = written(post_files(request, &ctx(&env)).await).await;
    assert_eq!(answer.as_array().unwrap().len(), 2);
    assert_eq!(std::fs::read(env.home().join("g2")).unwrap(), b"gz two");

    // Part headers that never end are refused, not buffered.
    let mut bomb = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b\"\r\nX-Pad: "
    )
    .into_bytes();
    bomb.extend(std::iter::repeat_n(b'x', 4 * 1024 * 1024));
    let (status, message) =
        error_of(post_files(multipart_request("", bomb), &ctx(&env)).await).await;
    assert_eq!(status, 400);
    assert!(message.contains("headers did not end"), "{message}");
}

#[tokio::test]
async fn uploads_are_bounded() {
    let env = Env::new();
    let small = FilesContext {
        limits: FilesLimits {
            max_upload_bytes: 1000,
        },
        ..ctx(&env)
    };
    let (status, _) = error_of(post_files(octet("path=big", vec![7; 1001]), &small).await).await;
    assert_eq!(status, 413);
    written(post_files(octet("path=fits", vec![7; 1000]), &small).await).await;
    // Counted after decompression: a small gzip of a large file is still large.
    let request = Request::post("/files?path=bomb")
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(Full::new(Bytes::from(gzip(&[0u8; 100_000]))))
        .unwrap();
    assert_eq!(error_of(post_files(request, &small).await).await.0, 413);
    let body = multipart(&[
        ("file", Some("a"), &[1u8; 600]),
        ("file", Some("b"), &[2u8; 600]),
    ]);
    assert_eq!(
        error_of(post_files(multipart_request("", body), &small).await)
            .await
            .0,
        413
    );
}

#[tokio::test]
async fn metadata_headers_become_attributes_and_replace_old_ones() {
    let env = Env::new();
    let request = Request::post("/files?path=m.txt")
        .header("content-type", "application/octet-stream")
        .header("X-Metadata-Owner", "alice")
        .header("x-metadata-Stage", "draft")
        .body(Full::new(Bytes::from_static(b"content")))
        .unwrap();
    let answer = written(post_files(request, &ctx(&env)).await).await;
    assert_eq!(
        answer[0]["metadata"],
        serde_json::json!({"owner": "alice", "stage": "draft"})
    );
    let path = env.home().join("m.txt");
    let mut buf = [0u8; 64];
    let n = rustix::fs::getxattr(&path, "user.e2b.owner", &mut buf[..]).unwrap();
    assert_eq!(&buf[..n], b"alice");

    let request = Request::post("/files?path=m.txt")
        .header("content-type", "application/octet-stream")
        .header("x-metadata-stage", "final")
        .body(Full::new(Bytes::from_static(b"v2")))
        .unwrap();
    let answer = written(post_files(request, &ctx(&env)).await).await;
    assert_eq!(answer[0]["metadata"], serde_json::json!({"stage": "final"}));
    assert!(rustix::fs::getxattr(&path, "user.e2b.owner", &mut buf[..]).is_err());

    written(post_files(octet("path=m.txt", b"v3".to_vec()), &ctx(&env)).await).await;
    let plain = written(post_files(octet("path=m.txt", b"v4".to_vec()), &ctx(&env)).await).await;
    assert!(plain[0].get("metadata").is_none(), "{plain}");

    let request = Request::post("/files?path=m.txt")
        .header("content-type", "application/octet-stream")
        .header("x-metadata-k", "v".repeat(5000))
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    let (status, message) = error_of(post_files(request, &ctx(&env)).await).await;
    assert_eq!(status, 400);
    assert!(message.contains("invalid metadata"), "{message}");
    // Refused before anything was written.
    assert_eq!(std::fs::read(&path).unwrap(), b"v4");
}

#[tokio::test]
async fn an_access_token_needs_the_header_or_a_signature() {
    let env = Env::new();
    std::fs::write(env.home().join("s.txt"), b"secret").unwrap();
    let token = "tok";
    let secured = FilesContext {
        access_token: Some(token.into()),
        ..ctx(&env)
    };
    let (status, _) = error_of(get_files(get("path=s.txt"), &secured).await).await;
    assert_eq!(status, 401);

    let with_header = Request::get("/files?path=s.txt")
        .header(files::ACCESS_TOKEN_HEADER, token)
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(
        body_bytes(get_files(with_header, &secured).await).await,
        b"secret"
    );

    let sig = files::sign("s.txt", FileOperation::Read, None, token, None);
    let signed = get(&format!("path=s.txt&signature={}", encode(&sig)));
    assert_eq!(
        body_bytes(get_files(signed, &secured).await).await,
        b"secret"
    );

    // A read signature does not write.
    let upload = octet(
        &format!("path=s.txt&signature={}", encode(&sig)),
        b"x".to_vec(),
    );
    let (status, _) = error_of(post_files(upload, &secured).await).await;
    assert_eq!(status, 401);

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let expired = files::sign("s.txt", FileOperation::Read, None, token, Some(now - 10));
    let (status, message) = error_of(
        get_files(
            get(&format!(
                "path=s.txt&signature={}&signature_expiration={}",
                encode(&expired),
                now - 10
            )),
            &secured,
        )
        .await,
    )
    .await;
    assert_eq!(status, 401);
    assert!(message.contains("expired"), "{message}");

    let write_sig = files::sign(
        "w.txt",
        FileOperation::Write,
        Some("me"),
        token,
        Some(now + 60),
    );
    let upload = octet(
        &format!(
            "path=w.txt&username=me&signature={}&signature_expiration={}",
            encode(&write_sig),
            now + 60
        ),
        b"signed write".to_vec(),
    );
    written(post_files(upload, &secured).await).await;
    assert_eq!(
        std::fs::read(env.home().join("w.txt")).unwrap(),
        b"signed write"
    );
}

#[test]
fn handler_futures_are_send() {
    // The server runs handlers on a multi-threaded runtime: their futures must be `Send`.
    fn send<T: Send>(_: &T) {}
    let env = Env::new();
    let ctx = ctx(&env);
    let download = get_files(get("path=x"), &ctx);
    send(&download);
    let upload = post_files(octet("path=x", Vec::new()), &ctx);
    send(&upload);
}
