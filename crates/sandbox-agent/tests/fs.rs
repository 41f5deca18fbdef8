//! The filesystem service on temporary directories: every call's semantics and error codes,
//! and watching (stream and polled, create/write/remove, entries, recursion, the bounds).

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod support;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::time::Duration;

use sandbox_agent::fs::{Caller, Filesystem, FsLimits};
use sandbox_envd::Code;
use sandbox_envd::filesystem::watch_dir_response::Event;
use sandbox_envd::filesystem::*;
use support::Env;

fn service(env: &Env, limits: FsLimits) -> Filesystem {
    Filesystem::new(env.accounts.clone(), limits)
}

fn caller(env: &Env) -> Caller {
    Caller {
        user: env.me.clone(),
        default_workdir: None,
    }
}

fn stat_req(path: &str) -> StatRequest {
    StatRequest { path: path.into() }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test]
async fn stat_fills_the_entry_as_envd_does() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    let file = env.home().join("a.txt");
    std::fs::write(&file, b"hello").unwrap();
    chmod(&file, 0o644);
    rustix::fs::setxattr(
        &file,
        "user.e2b.owner",
        b"alice",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();

    let entry = fs
        .stat(&caller(&env), stat_req(file.to_str().unwrap()))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(entry.name, "a.txt");
    assert_eq!(entry.path, file.to_str().unwrap());
    assert_eq!(entry.r#type, FileType::File);
    assert_eq!(entry.size, 5);
    assert_eq!(entry.mode, 0o644);
    assert_eq!(entry.permissions, "-rw-r--r--");
    assert_eq!(entry.owner, "me");
    assert_eq!(entry.group, "mygroup");
    assert!(!entry.is_symlink);
    assert_eq!(entry.symlink_target, None);
    let mtime = std::fs::metadata(&file).unwrap().mtime();
    assert_eq!(entry.modified_time.unwrap().seconds, mtime);
    assert_eq!(
        entry.metadata.get("owner").map(String::as_str),
        Some("alice")
    );
    assert_eq!(entry.metadata.len(), 1);

    let dir = env.home().join("d");
    std::fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o755);
    let entry = fs
        .stat(&caller(&env), stat_req("d"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(entry.r#type, FileType::Directory);
    assert_eq!(entry.permissions, "drwxr-xr-x");
    assert_eq!(entry.mode, 0o755);
    assert_eq!(entry.path, dir.to_str().unwrap());
}

#[tokio::test]
async fn stat_reports_symlinks_by_their_target() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    let target = env.home().join("t.bin");
    std::fs::write(&target, b"0123456789").unwrap();
    chmod(&target, 0o600);
    let link = env.home().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let entry = fs
        .stat(&caller(&env), stat_req("link"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert!(entry.is_symlink);
    assert_eq!(entry.r#type, FileType::File);
    assert_eq!(entry.mode, 0o600);
    assert!(entry.permissions.starts_with('L'), "{}", entry.permissions);
    assert_eq!(
        entry.symlink_target.as_deref(),
        Some(std::fs::canonicalize(&target).unwrap().to_str().unwrap())
    );
    assert_eq!(entry.path, link.to_str().unwrap());

    let broken = env.home().join("broken");
    std::os::unix::fs::symlink(env.home().join("nowhere"), &broken).unwrap();
    let entry = fs
        .stat(&caller(&env), stat_req("broken"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert!(entry.is_symlink);
    assert_eq!(entry.r#type, FileType::Unspecified);
    assert_eq!(entry.symlink_target.as_deref(), broken.to_str());
}

#[tokio::test]
async fn paths_resolve_from_the_home_and_the_default_workdir() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    std::fs::write(env.home().join("f"), b"x").unwrap();
    let home = fs
        .stat(&caller(&env), stat_req("~"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(home.path, env.home().to_str().unwrap());
    let empty = fs
        .stat(&caller(&env), stat_req(""))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(empty.path, env.home().to_str().unwrap());
    let rel = fs
        .stat(&caller(&env), stat_req("./f"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(rel.path, env.home().join("f").to_str().unwrap());
    let tilde = fs
        .stat(&caller(&env), stat_req("~/f"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(tilde.path, rel.path);

    let workdir = env.path("work");
    std::fs::create_dir(&workdir).unwrap();
    let with_workdir = Caller {
        user: env.me.clone(),
        default_workdir: Some(workdir.clone()),
    };
    let entry = fs
        .stat(&with_workdir, stat_req(""))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(entry.path, workdir.to_str().unwrap());
    // Relative paths still start at the home, not the working directory.
    let entry = fs
        .stat(&with_workdir, stat_req("f"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(entry.path, env.home().join("f").to_str().unwrap());

    let err = fs
        .stat(&caller(&env), stat_req("~root/x"))
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    let err = fs
        .stat(&caller(&env), stat_req("missing"))
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound, "{err}");
    // Nothing can be below a file.
    let err = fs
        .stat(&caller(&env), stat_req("f/below"))
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound, "{err}");
}

#[tokio::test]
async fn owners_without_a_name_are_numbers() {
    let env = Env::new();
    // Account files that do not know the current user.
    let passwd = env.path("passwd-empty");
    let group = env.path("group-empty");
    std::fs::write(&passwd, "").unwrap();
    std::fs::write(&group, "").unwrap();
    let accounts = sandbox_agent::users::AccountFiles { passwd, group };
    let fs = Filesystem::new(accounts, FsLimits::default());
    let file = env.home().join("f");
    std::fs::write(&file, b"x").unwrap();
    let entry = fs
        .stat(&caller(&env), stat_req(file.to_str().unwrap()))
        .await
        .unwrap()
        .entry
        .unwrap();
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(entry.owner, meta.uid().to_string());
    assert_eq!(entry.group, meta.gid().to_string());
}

#[tokio::test]
async fn make_dir_creates_parents_and_answers_envd_codes() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    let other = Caller {
        user: env.other.clone(),
        default_workdir: None,
    };
    let deep = env.home().join("a/b/c");
    let entry = fs
        .make_dir(
            &other,
            MakeDirRequest {
                path: deep.to_str().unwrap().into(),
            },
        )
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(entry.r#type, FileType::Directory);
    assert_eq!(entry.path, deep.to_str().unwrap());
    for created in ["a", "a/b", "a/b/c"] {
        let meta = std::fs::metadata(env.home().join(created)).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.uid(), support::expected_uid(&env.other), "{created}");
    }
    // The home existed: it keeps its owner.
    assert_eq!(
        std::fs::metadata(env.home()).unwrap().uid(),
        rustix::process::geteuid().as_raw()
    );

    let again = fs
        .make_dir(
            &other,
            MakeDirRequest {
                path: deep.to_str().unwrap().into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(again.code, Code::AlreadyExists);
    std::fs::write(env.home().join("file"), b"x").unwrap();
    let on_file = fs
        .make_dir(
            &caller(&env),
            MakeDirRequest {
                path: "file".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(on_file.code, Code::InvalidArgument);
    let under_file = fs
        .make_dir(
            &caller(&env),
            MakeDirRequest {
                path: "file/sub".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(under_file.code, Code::InvalidArgument, "{under_file}");
}

#[tokio::test]
async fn move_creates_the_destination_parent() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    std::fs::write(env.home().join("src.txt"), b"data").unwrap();
    let entry = fs
        .move_entry(
            &caller(&env),
            MoveRequest {
                source: "src.txt".into(),
                destination: "new/dir/dst.txt".into(),
            },
        )
        .await
        .unwrap()
        .entry
        .unwrap();
    let dst = env.home().join("new/dir/dst.txt");
    assert_eq!(entry.path, dst.to_str().unwrap());
    assert_eq!(entry.name, "dst.txt");
    assert_eq!(std::fs::read(&dst).unwrap(), b"data");
    assert!(!env.home().join("src.txt").exists());

    let missing = fs
        .move_entry(
            &caller(&env),
            MoveRequest {
                source: "nope".into(),
                destination: "x".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(missing.code, Code::NotFound);
}

fn names(entries: &[EntryInfo]) -> Vec<&str> {
    entries.iter().map(|e| e.path.as_str()).collect()
}

#[tokio::test]
async fn list_dir_walks_to_the_depth_asked() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    let root = env.home().join("tree");
    std::fs::create_dir_all(root.join("b/c/d")).unwrap();
    std::fs::write(root.join("a.txt"), b"1").unwrap();
    std::fs::write(root.join("b/x.txt"), b"2").unwrap();
    std::fs::write(root.join("b/c/y.txt"), b"3").unwrap();
    let r = root.to_str().unwrap();
    let list = |path: String, depth: u32| {
        let fs = fs.clone();
        let caller = caller(&env);
        async move { fs.list_dir(&caller, ListDirRequest { path, depth }).await }
    };

    let one = list(r.into(), 0).await.unwrap().entries;
    assert_eq!(names(&one), vec![format!("{r}/a.txt"), format!("{r}/b")]);
    assert_eq!(list(r.into(), 1).await.unwrap().entries, one);
    let two = list(r.into(), 2).await.unwrap().entries;
    assert_eq!(
        names(&two),
        vec![
            format!("{r}/a.txt"),
            format!("{r}/b"),
            format!("{r}/b/c"),
            format!("{r}/b/x.txt")
        ]
    );
    let all = list(r.into(), 10).await.unwrap().entries;
    assert_eq!(all.len(), 6);
    assert_eq!(all[3].r#type, FileType::Directory);
    assert_eq!(all[3].name, "d");

    // A symlink root is followed, and paths are built from the path asked for.
    let link = env.home().join("tree-link");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    let via_link = list("tree-link".into(), 1).await.unwrap().entries;
    let l = link.to_str().unwrap();
    assert_eq!(
        names(&via_link),
        vec![format!("{l}/a.txt"), format!("{l}/b")]
    );
    // Symlinks below the root are listed, not followed.
    std::os::unix::fs::symlink(root.join("b"), root.join("b-link")).unwrap();
    let with_link = list(r.into(), 3).await.unwrap().entries;
    assert!(!names(&with_link).iter().any(|p| p.contains("b-link/")));

    assert_eq!(
        list("missing".into(), 1).await.unwrap_err().code,
        Code::NotFound
    );
    assert_eq!(
        list(format!("{r}/a.txt"), 1).await.unwrap_err().code,
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn list_dir_is_bounded() {
    let env = Env::new();
    let limits = FsLimits {
        max_list_entries: 5,
        ..FsLimits::default()
    };
    let fs = service(&env, limits);
    for i in 0..6 {
        std::fs::write(env.home().join(format!("f{i}")), b"").unwrap();
    }
    let err = fs
        .list_dir(
            &caller(&env),
            ListDirRequest {
                path: String::new(),
                depth: 1,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted, "{err}");
    std::fs::remove_file(env.home().join("f5")).unwrap();
    let ok = fs
        .list_dir(
            &caller(&env),
            ListDirRequest {
                path: String::new(),
                depth: 1,
            },
        )
        .await
        .unwrap();
    assert_eq!(ok.entries.len(), 5);
}

#[tokio::test]
async fn remove_is_recursive_and_idempotent() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    std::fs::create_dir_all(env.home().join("d/e/f")).unwrap();
    std::fs::write(env.home().join("d/e/f/g"), b"x").unwrap();
    fs.remove(&caller(&env), RemoveRequest { path: "d".into() })
        .await
        .unwrap();
    assert!(!env.home().join("d").exists());
    fs.remove(&caller(&env), RemoveRequest { path: "d".into() })
        .await
        .unwrap();
    // A symlink goes, its target stays.
    let target = env.home().join("keep");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("inside"), b"x").unwrap();
    std::os::unix::fs::symlink(&target, env.home().join("link")).unwrap();
    fs.remove(
        &caller(&env),
        RemoveRequest {
            path: "link".into(),
        },
    )
    .await
    .unwrap();
    assert!(!env.home().join("link").exists());
    assert!(target.join("inside").exists());
}

/// The next filesystem event of a stream, skipping keep-alives, within a deadline.
async fn next_event(stream: &mut sandbox_agent::fs::WatchDirStream) -> FilesystemEvent {
    loop {
        let item = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("no event within 5 s")
            .expect("the stream ended")
            .expect("the stream failed");
        match item.event {
            Some(Event::Filesystem(e)) => return e,
            Some(Event::Keepalive(_)) => {}
            other => panic!("unexpected message {other:?}"),
        }
    }
}

async fn expect_start(stream: &mut sandbox_agent::fs::WatchDirStream) {
    let first = stream.next().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(Event::Start(_))), "{first:?}");
}

fn watch_req(path: &Path, recursive: bool, include_entry: bool) -> WatchDirRequest {
    WatchDirRequest {
        path: path.to_str().unwrap().into(),
        recursive,
        include_entry,
        allow_network_mounts: false,
    }
}

/// A `WatchDir` stream of `path` whose `start` was read.
async fn started(
    fs: &Filesystem,
    env: &Env,
    path: &Path,
    recursive: bool,
    include_entry: bool,
) -> sandbox_agent::fs::WatchDirStream {
    let mut stream = fs
        .watch_dir(
            &caller(env),
            watch_req(path, recursive, include_entry),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    expect_start(&mut stream).await;
    stream
}

#[tokio::test]
async fn watch_dir_streams_create_write_remove() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    let dir = env.home().join("watched");
    std::fs::create_dir(&dir).unwrap();
    let mut stream = started(&fs, &env, &dir, false, true).await;

    std::fs::write(dir.join("new.txt"), b"").unwrap();
    let created = next_event(&mut stream).await;
    assert_eq!(
        (created.name.as_str(), created.r#type),
        ("new.txt", EventType::Create)
    );
    let entry = created
        .entry
        .expect("include_entry attaches the entry to a create");
    assert_eq!(entry.name, "new.txt");
    assert_eq!(entry.r#type, FileType::File);

    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("new.txt"))
            .unwrap();
        f.write_all(b"more").unwrap();
    }
    let written = next_event(&mut stream).await;
    assert_eq!(
        (written.name.as_str(), written.r#type),
        ("new.txt", EventType::Write)
    );
    assert_eq!(written.entry.unwrap().size, 4);

    chmod(&dir.join("new.txt"), 0o600);
    let chmodded = next_event(&mut stream).await;
    assert_eq!(
        (chmodded.name.as_str(), chmodded.r#type),
        ("new.txt", EventType::Chmod)
    );
    assert_eq!(chmodded.entry.unwrap().permissions, "-rw-------");

    std::fs::remove_file(dir.join("new.txt")).unwrap();
    let removed = next_event(&mut stream).await;
    assert_eq!(
        (removed.name.as_str(), removed.r#type),
        ("new.txt", EventType::Remove)
    );
    assert!(removed.entry.is_none(), "a remove never carries an entry");

    // Without include_entry nothing is attached.
    let mut plain = started(&fs, &env, &dir, false, false).await;
    std::fs::write(dir.join("other"), b"").unwrap();
    let e = next_event(&mut plain).await;
    assert_eq!(e.r#type, EventType::Create);
    assert!(e.entry.is_none());
}

#[tokio::test]
async fn recursive_watches_see_new_subdirectories() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    let dir = env.home().join("w");
    std::fs::create_dir_all(dir.join("existing")).unwrap();
    let mut stream = started(&fs, &env, &dir, true, false).await;
    std::fs::write(dir.join("existing/f"), b"").unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(
        (e.name.as_str(), e.r#type),
        ("existing/f", EventType::Create)
    );

    std::fs::create_dir(dir.join("new")).unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!((e.name.as_str(), e.r#type), ("new", EventType::Create));
    // A change inside the new directory is seen (its watch was added), reported once it
    // happened, possibly also by the scan of the new directory.
    std::fs::write(dir.join("new/g"), b"").unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!((e.name.as_str(), e.r#type), ("new/g", EventType::Create));

    // A directory renamed inside the tree is reported under its new name afterwards.
    std::fs::rename(dir.join("new"), dir.join("renamed")).unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!((e.name.as_str(), e.r#type), ("new", EventType::Rename));
    let e = next_event(&mut stream).await;
    assert_eq!((e.name.as_str(), e.r#type), ("renamed", EventType::Create));
    // (The scan of the moved-in directory reports what it holds.)
    let e = next_event(&mut stream).await;
    assert_eq!(
        (e.name.as_str(), e.r#type),
        ("renamed/g", EventType::Create)
    );
    std::fs::write(dir.join("renamed/h"), b"").unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(
        (e.name.as_str(), e.r#type),
        ("renamed/h", EventType::Create)
    );
    // One moved out of the tree is no longer watched.
    std::fs::rename(dir.join("renamed"), env.home().join("outside")).unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!((e.name.as_str(), e.r#type), ("renamed", EventType::Rename));
    std::fs::write(env.home().join("outside/i"), b"").unwrap();
    std::fs::write(dir.join("marker"), b"").unwrap();
    let e = next_event(&mut stream).await;
    assert_eq!(
        e.name, "marker",
        "a change outside the tree was reported first"
    );

    // A non-recursive watch does not see below the top.
    let mut flat = started(&fs, &env, &dir, false, false).await;
    std::fs::write(dir.join("existing/h"), b"").unwrap();
    std::fs::write(dir.join("top"), b"").unwrap();
    let e = next_event(&mut flat).await;
    assert_eq!(
        e.name, "top",
        "the change below the top was not reported first"
    );
}

#[tokio::test]
async fn idle_streams_send_keepalives() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    let mut stream = fs
        .watch_dir(
            &caller(&env),
            watch_req(env.home(), false, false),
            Duration::from_millis(100),
        )
        .await
        .unwrap();
    expect_start(&mut stream).await;
    let next = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(next.event, Some(Event::Keepalive(_))), "{next:?}");
}

#[tokio::test]
async fn watching_what_is_not_a_directory_fails() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    std::fs::write(env.home().join("f"), b"").unwrap();
    let missing = fs
        .watch_dir(
            &caller(&env),
            watch_req(&env.home().join("nope"), false, false),
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    assert_eq!(missing.code, Code::NotFound);
    let file = fs
        .create_watcher(
            &caller(&env),
            CreateWatcherRequest {
                path: "f".into(),
                ..CreateWatcherRequest::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(file.code, Code::InvalidArgument);
}

/// Polls a watcher until `want` events arrived (events may be split over several calls).
async fn poll_events(fs: &Filesystem, id: &str, want: usize) -> Vec<FilesystemEvent> {
    let mut all = Vec::new();
    for _ in 0..100 {
        let got = fs
            .get_watcher_events(GetWatcherEventsRequest {
                watcher_id: id.into(),
            })
            .await
            .unwrap();
        all.extend(got.events);
        if all.len() >= want {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("only {} of {want} events: {all:?}", all.len());
}

#[tokio::test]
async fn polled_watchers_drain_since_the_last_call() {
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    let id = fs
        .create_watcher(
            &caller(&env),
            CreateWatcherRequest {
                path: String::new(),
                include_entry: true,
                ..CreateWatcherRequest::default()
            },
        )
        .await
        .unwrap()
        .watcher_id;
    assert!(!id.is_empty());
    std::fs::write(env.home().join("one"), b"").unwrap();
    std::fs::remove_file(env.home().join("one")).unwrap();
    let events = poll_events(&fs, &id, 2).await;
    let seen: Vec<_> = events.iter().map(|e| (e.name.as_str(), e.r#type)).collect();
    assert_eq!(
        seen,
        vec![("one", EventType::Create), ("one", EventType::Remove)]
    );
    // Drained: nothing until something else happens.
    let again = fs
        .get_watcher_events(GetWatcherEventsRequest {
            watcher_id: id.clone(),
        })
        .await
        .unwrap();
    assert!(again.events.is_empty(), "{again:?}");

    fs.remove_watcher(RemoveWatcherRequest {
        watcher_id: id.clone(),
    })
    .await
    .unwrap();
    let gone = fs
        .get_watcher_events(GetWatcherEventsRequest {
            watcher_id: id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code, Code::NotFound);
    let twice = fs
        .remove_watcher(RemoveWatcherRequest { watcher_id: id })
        .await
        .unwrap_err();
    assert_eq!(twice.code, Code::NotFound);
}

#[tokio::test]
async fn a_polled_watcher_that_overflows_says_so_once() {
    let env = Env::new();
    let limits = FsLimits {
        max_watcher_events: 3,
        ..FsLimits::default()
    };
    let fs = service(&env, limits);
    let id = fs
        .create_watcher(&caller(&env), CreateWatcherRequest::default())
        .await
        .unwrap()
        .watcher_id;
    for i in 0..10 {
        std::fs::write(env.home().join(format!("f{i}")), b"").unwrap();
    }
    let req = || GetWatcherEventsRequest {
        watcher_id: id.clone(),
    };
    let mut overflowed = None;
    for _ in 0..100 {
        match fs.get_watcher_events(req()).await {
            Err(e) => {
                overflowed = Some(e);
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let err = overflowed.expect("the overflow was reported");
    assert_eq!(err.code, Code::ResourceExhausted, "{err}");
    // Reported once; the watcher goes on.
    let after = fs.get_watcher_events(req()).await.unwrap();
    assert!(after.events.len() <= 3);
    std::fs::write(env.home().join("later"), b"").unwrap();
    let later = poll_events(&fs, &id, 1).await;
    assert!(later.iter().any(|e| e.name == "later"), "{later:?}");
}

#[tokio::test]
async fn concurrent_watchers_are_bounded() {
    let env = Env::new();
    let limits = FsLimits {
        max_watchers: 2,
        ..FsLimits::default()
    };
    let fs = service(&env, limits);
    let c = caller(&env);
    let stream = fs
        .watch_dir(
            &c,
            watch_req(env.home(), false, false),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let id = fs
        .create_watcher(&c, CreateWatcherRequest::default())
        .await
        .unwrap()
        .watcher_id;
    let third = fs
        .create_watcher(&c, CreateWatcherRequest::default())
        .await
        .unwrap_err();
    assert_eq!(third.code, Code::ResourceExhausted, "{third}");
    let third_stream = fs
        .watch_dir(
            &c,
            watch_req(env.home(), false, false),
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    assert_eq!(third_stream.code, Code::ResourceExhausted);

    // Removing a polled watcher frees its place at once.
    fs.remove_watcher(RemoveWatcherRequest { watcher_id: id })
        .await
        .unwrap();
    let id = fs
        .create_watcher(&c, CreateWatcherRequest::default())
        .await
        .unwrap()
        .watcher_id;
    // Dropping a stream frees its place once its task notices.
    drop(stream);
    let mut freed = false;
    for _ in 0..100 {
        if fs
            .create_watcher(&c, CreateWatcherRequest::default())
            .await
            .is_ok()
        {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "a dropped stream kept its watcher slot");
    fs.remove_watcher(RemoveWatcherRequest { watcher_id: id })
        .await
        .unwrap();
}

#[test]
fn service_futures_and_streams_are_send() {
    // The server runs calls on a multi-threaded runtime: futures and streams must be `Send`.
    fn send<T: Send>(_: &T) {}
    let env = Env::new();
    let fs = service(&env, FsLimits::default());
    let c = caller(&env);
    send(&fs.stat(&c, stat_req("x")));
    send(&fs.list_dir(&c, ListDirRequest::default()));
    send(&fs.watch_dir(&c, WatchDirRequest::default(), Duration::from_secs(1)));
    send(&fs.create_watcher(&c, CreateWatcherRequest::default()));
    send(&fs.get_watcher_events(GetWatcherEventsRequest::default()));
    fn stream_is_send<T: Send + Unpin + futures_util::Stream>() {}
    stream_is_send::<sandbox_agent::fs::WatchDirStream>();
}
