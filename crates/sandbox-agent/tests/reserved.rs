//! Reserved trees (`--reserved-path`): every file operation, through `/files` and the
//! filesystem service, refuses a path that is or resolves into one, with symlinks planted the
//! way code in a sandbox would plant them; and the refusal changes nothing on disk.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, StatusCode};
use sandbox_agent::files::{FilesBody, FilesContext, FilesLimits, get_files, post_files};
use sandbox_agent::fs::reserved::Reserved;
use sandbox_agent::fs::{Caller, Filesystem, FsLimits};
use sandbox_envd::Code;
use sandbox_envd::filesystem::*;
use support::Env;

/// An environment with two reserved trees, a directory `res` (holding `secret`) and a file
/// `marker`, and symlinks into them from the home.
struct Planted {
    env: Env,
    reserved: Reserved,
}

impl Planted {
    fn new() -> Planted {
        let env = Env::new();
        let res = env.path("res");
        std::fs::create_dir(&res).unwrap();
        std::fs::write(res.join("secret"), b"secret").unwrap();
        std::fs::write(env.path("marker"), b"marker").unwrap();
        let home = env.home();
        symlink(res.join("secret"), home.join("to-secret")).unwrap();
        symlink(&res, home.join("to-res")).unwrap();
        symlink("../../marker", home.join("to-marker")).unwrap();
        symlink(res.join("not-yet"), home.join("dangling")).unwrap();
        std::fs::write(home.join("plain.txt"), b"plain").unwrap();
        let reserved = Reserved::new([res, env.path("marker")]);
        Planted { env, reserved }
    }

    fn home(&self, rel: &str) -> PathBuf {
        self.env.home().join(rel)
    }

    fn ctx(&self) -> FilesContext {
        FilesContext {
            accounts: self.env.accounts.clone(),
            default_user: Some("me".into()),
            default_workdir: None,
            access_token: None,
            limits: FilesLimits::default(),
            reserved: self.reserved.clone(),
        }
    }

    fn fs(&self) -> Filesystem {
        Filesystem::with_reserved(
            self.env.accounts.clone(),
            FsLimits::default(),
            self.reserved.clone(),
        )
    }

    fn caller(&self) -> Caller {
        Caller {
            user: self.env.me.clone(),
            default_workdir: None,
        }
    }

    /// Nothing in the reserved trees changed.
    fn untouched(&self) {
        assert_eq!(
            std::fs::read(self.env.path("res/secret")).unwrap(),
            b"secret"
        );
        assert_eq!(std::fs::read(self.env.path("marker")).unwrap(), b"marker");
        let mut names: Vec<_> = std::fs::read_dir(self.env.path("res"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["secret"],
            "nothing was created in the reserved tree"
        );
    }
}

/// The symlinked ways into the reserved trees, and the trees named directly.
const INTO_RESERVED: &[&str] = &["to-secret", "to-res/secret", "to-marker", "dangling"];

async fn error_of(response: Response<FilesBody>) -> (u16, String) {
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    (status, body["message"].as_str().unwrap_or("").to_owned())
}

fn query(path: &Path) -> String {
    let encoded: String = path
        .to_str()
        .unwrap()
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'/' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("path={encoded}")
}

#[tokio::test]
async fn downloads_of_reserved_files_are_403_however_they_are_reached() {
    let p = Planted::new();
    let direct = [p.env.path("res/secret"), p.env.path("marker")];
    let planted = INTO_RESERVED.iter().map(|r| p.home(r));
    for path in direct.into_iter().chain(planted) {
        let request = Request::get(format!("/files?{}", query(&path)))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (status, message) = error_of(get_files(request, &p.ctx()).await).await;
        assert_eq!(status, 403, "{}: {message}", path.display());
        assert!(message.contains("reserved tree"), "{message}");
    }
    let request = Request::get(format!("/files?{}", query(&p.home("plain.txt"))))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = get_files(request, &p.ctx()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"plain");
}

#[tokio::test]
async fn uploads_into_reserved_trees_are_403_and_write_nothing() {
    let p = Planted::new();
    let targets = INTO_RESERVED
        .iter()
        .map(|r| p.home(r))
        .chain([p.home("to-res/new/deeper.txt"), p.env.path("res/direct")]);
    for path in targets {
        let request = Request::post(format!("/files?{}", query(&path)))
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::from_static(b"overwritten")))
            .unwrap();
        let (status, message) = error_of(post_files(request, &p.ctx()).await).await;
        assert_eq!(status, 403, "{}: {message}", path.display());
        p.untouched();
    }
    // A symlinked parent that leads elsewhere is fine.
    symlink(p.env.path("home"), p.home("to-home")).unwrap();
    let request = Request::post(format!("/files?{}", query(&p.home("to-home/ok.txt"))))
        .header("content-type", "application/octet-stream")
        .body(Full::new(Bytes::from_static(b"ok")))
        .unwrap();
    assert_eq!(post_files(request, &p.ctx()).await.status(), StatusCode::OK);
    assert_eq!(std::fs::read(p.env.path("home/ok.txt")).unwrap(), b"ok");
}

#[tokio::test]
async fn uploads_through_a_hard_link_to_a_reserved_file_are_403_and_write_nothing() {
    let p = Planted::new();
    std::fs::hard_link(p.env.path("res/secret"), p.home("linked-secret")).unwrap();
    std::fs::hard_link(p.env.path("marker"), p.home("linked-marker")).unwrap();
    for name in ["linked-secret", "linked-marker"] {
        let request = Request::post(format!("/files?{}", query(&p.home(name))))
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::from_static(b"overwritten")))
            .unwrap();
        let (status, message) = error_of(post_files(request, &p.ctx()).await).await;
        assert_eq!(status, 403, "{name}: {message}");
        assert!(message.contains("hard link"), "{message}");
        p.untouched();
    }
    // A file linked twice outside the reserved trees is written as any other.
    std::fs::hard_link(p.home("plain.txt"), p.home("plain-too.txt")).unwrap();
    let request = Request::post(format!("/files?{}", query(&p.home("plain-too.txt"))))
        .header("content-type", "application/octet-stream")
        .body(Full::new(Bytes::from_static(b"both")))
        .unwrap();
    assert_eq!(post_files(request, &p.ctx()).await.status(), StatusCode::OK);
    assert_eq!(std::fs::read(p.home("plain.txt")).unwrap(), b"both");
}

fn assert_denied(e: &sandbox_envd::ConnectError, what: &str) {
    assert_eq!(e.code, Code::PermissionDenied, "{what}: {e:?}");
    assert!(e.message.contains("reserved tree"), "{what}: {e:?}");
}

#[tokio::test]
async fn the_filesystem_service_refuses_reserved_paths_in_every_call() {
    let p = Planted::new();
    let fs = p.fs();
    let who = p.caller();
    let named = |r: &str| p.home(r).to_str().unwrap().to_owned();
    for r in INTO_RESERVED {
        let e = fs
            .stat(&who, StatRequest { path: named(r) })
            .await
            .unwrap_err();
        assert_denied(&e, &format!("stat {r}"));
        let e = fs
            .remove(&who, RemoveRequest { path: named(r) })
            .await
            .unwrap_err();
        assert_denied(&e, &format!("remove {r}"));
        let e = fs
            .move_entry(
                &who,
                MoveRequest {
                    source: named(r),
                    destination: named("moved"),
                },
            )
            .await
            .unwrap_err();
        assert_denied(&e, &format!("move from {r}"));
        p.untouched();
    }
    assert!(
        p.home("to-marker").symlink_metadata().is_ok(),
        "the refused link itself is still there"
    );
    let e = fs
        .move_entry(
            &who,
            MoveRequest {
                source: named("plain.txt"),
                destination: named("to-res/plain.txt"),
            },
        )
        .await
        .unwrap_err();
    assert_denied(&e, "move into");
    for dir in ["to-res", "to-res/sub"] {
        let e = fs
            .make_dir(&who, MakeDirRequest { path: named(dir) })
            .await
            .unwrap_err();
        assert_denied(&e, &format!("make_dir {dir}"));
    }
    let e = fs
        .list_dir(
            &who,
            ListDirRequest {
                path: named("to-res"),
                depth: 1,
            },
        )
        .await
        .unwrap_err();
    assert_denied(&e, "list_dir");
    let e = fs
        .create_watcher(
            &who,
            CreateWatcherRequest {
                path: named("to-res"),
                ..CreateWatcherRequest::default()
            },
        )
        .await
        .unwrap_err();
    assert_denied(&e, "create_watcher");
    p.untouched();

    // What is not reserved still works, and a listing shows a reserved tree without walking it.
    fs.stat(
        &who,
        StatRequest {
            path: named("plain.txt"),
        },
    )
    .await
    .unwrap();
    let listing = fs
        .list_dir(
            &who,
            ListDirRequest {
                path: p.env.dir.path().to_str().unwrap().to_owned(),
                depth: 3,
            },
        )
        .await
        .unwrap()
        .entries;
    let paths: Vec<&str> = listing.iter().map(|e| e.path.as_str()).collect();
    let res = p.env.path("res");
    assert!(paths.contains(&res.to_str().unwrap()), "{paths:?}");
    assert!(
        !paths.iter().any(|e| e.ends_with("/res/secret")),
        "{paths:?}"
    );
    fs.remove(
        &who,
        RemoveRequest {
            path: named("plain.txt"),
        },
    )
    .await
    .unwrap();
    assert!(!p.home("plain.txt").exists());
    fs.make_dir(
        &who,
        MakeDirRequest {
            path: named("new/dir"),
        },
    )
    .await
    .unwrap();
    assert!(p.home("new/dir").is_dir());
}
