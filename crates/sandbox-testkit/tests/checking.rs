//! The checking layer (`sandbox_core::Checked`) over the fake, exactly as the fake's constructor
//! hands it out: what it refuses, that a refusal never reaches the adapter, and that the
//! capability wrappers it hands out pass through it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use sandbox_core::{
    Capability, CreateRequest, ErrorKind, ExecRequest, ListFilter, ListPage, NetworkField,
    NetworkFields, NetworkPolicy, Origin, Provider, SandboxPath, SandboxProvider, SandboxUser,
    SnapshotId, VolumeMount,
};
use sandbox_testkit::{FakeOp, FakeProvider};

fn request() -> CreateRequest {
    CreateRequest::new(FakeProvider::template())
}

#[tokio::test]
async fn network_fields_the_fake_does_not_enforce_are_refused_by_name() {
    let fake = FakeProvider::new();
    assert_eq!(fake.network_fields(), NetworkFields::NONE);
    let mut one = request();
    one.network.deny_out = vec!["10.0.0.0/8".to_owned()];
    let err = fake.create(one).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("field deny_out;"), "{err}");
    assert_eq!(err.origin(), Origin::Provider(Provider::E2b));

    let mut two = request();
    two.network = NetworkPolicy {
        allow_internet_access: Some(true),
        allow_out: vec!["example.com".to_owned()],
        ..NetworkPolicy::default()
    };
    let err = fake.create(two).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("fields allow_internet_access, allow_out;"),
        "{err}"
    );
    // Refused before the adapter: the fake never saw either call.
    assert_eq!(fake.calls(FakeOp::Create), 0);
    // The empty policy asks nothing and passes.
    fake.create(request()).await.unwrap();
    assert_eq!(fake.calls(FakeOp::Create), 1);
}

#[tokio::test]
async fn a_user_without_default_user_is_refused_by_name() {
    let fake = FakeProvider::builder()
        .without(Capability::DefaultUser)
        .build();
    let mut named = request();
    named.user = Some(SandboxUser::new("user", SandboxPath::new("/home/user").unwrap()).unwrap());
    let err = fake.create(named).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.message().contains("default_user"), "{err}");
    assert!(err.message().contains("remove user"), "{err}");
    assert_eq!(err.origin(), Origin::Provider(Provider::E2b));
    // A name the constructor would have refused, built by hand, is invalid before anything.
    let mut bad = request();
    bad.user = Some(SandboxUser {
        name: "Not A User".to_owned(),
        workdir: SandboxPath::new("/tmp").unwrap(),
    });
    let err = fake.create(bad).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    // Refused before the adapter; no user asks nothing and passes.
    assert_eq!(fake.calls(FakeOp::Create), 0);
    fake.create(request()).await.unwrap();
    assert_eq!(fake.calls(FakeOp::Create), 1);
    // The full fake declares default_user, so the same request passes the layer.
    let full = FakeProvider::new();
    assert!(full.capabilities().default_user);
    let mut named = request();
    named.user = Some(SandboxUser::new("user", SandboxPath::new("/home/user").unwrap()).unwrap());
    full.create(named).await.unwrap();
}

#[test]
fn the_field_names_are_the_wire_names() {
    let names: Vec<&str> = NetworkField::ALL.iter().map(|f| f.as_str()).collect();
    assert_eq!(
        names,
        [
            "allow_internet_access",
            "allow_public_traffic",
            "allow_out",
            "deny_out",
            "cube_rules",
            "e2b_host_rules"
        ]
    );
}

#[tokio::test]
async fn metadata_volumes_shell_and_list_follow_the_declarations() {
    let fake = FakeProvider::builder()
        .without(Capability::Metadata)
        .without(Capability::List)
        .without(Capability::FsEnumeration)
        .build();
    let mut meta = request();
    meta.metadata.insert("k".into(), "v".into());
    let err = fake.create(meta).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("metadata"), "{err}");
    let mut volumes = request();
    volumes
        .volumes
        .push(VolumeMount::new("data", SandboxPath::new("/data").unwrap()).unwrap());
    let err = fake.create(volumes).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("volumes"), "{err}");
    let mut bad_env = request();
    bad_env.env.insert("1BAD".into(), "x".into());
    assert_eq!(
        fake.create(bad_env).await.unwrap_err().kind(),
        ErrorKind::InvalidRequest
    );
    assert_eq!(fake.calls(FakeOp::Create), 0);

    let h = fake.create(request()).await.unwrap();
    let err = fake
        .exec(&h, ExecRequest::shell("echo hi"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("posix_shell"), "{err}");
    assert_eq!(fake.calls(FakeOp::Exec), 0);
    let err = fake.list(&ListFilter::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("list"), "{err}");
    // Its pages too, refused by the layer before the fake lists anything.
    let err = fake
        .list_page(&ListFilter::default(), &ListPage::first(2))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("list"), "{err}");
    assert_eq!(fake.calls(FakeOp::List), 0);
    let err = fake
        .stat(&h, &SandboxPath::new("/workspace").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert_eq!(fake.calls(FakeOp::List) + fake.calls(FakeOp::Stat), 0);
    // The argv form goes through.
    let ok = fake
        .exec(&h, ExecRequest::argv("echo", ["hi"]))
        .await
        .unwrap();
    assert_eq!(ok.stdout, b"hi\n");
}

#[tokio::test]
async fn capability_accessors_hand_out_the_layer() {
    let fake = FakeProvider::builder()
        .without(Capability::Snapshots)
        .without(Capability::KeepAlive)
        .build();
    // The accessor exists (the fake implements the trait), but what it returns is the layer's
    // wrapper: the flag is off, so the call is refused and never reaches the fake.
    let snapshots = fake.as_snapshots().unwrap();
    let id = SnapshotId::new("snap-x").unwrap();
    let err = snapshots.delete_snapshot(&id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert_eq!(fake.calls(FakeOp::DeleteSnapshot), 0);
    let h = fake.create(request()).await.unwrap();
    let err = fake
        .as_keep_alive()
        .unwrap()
        .keep_alive(&h, std::time::Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert_eq!(fake.calls(FakeOp::KeepAlive), 0);
    // A capability the fake does not implement at all stays absent.
    assert!(fake.as_terminals().is_none());
    assert!(fake.as_desktop().is_none());

    // With the flag on, the wrapper forwards to the fake.
    let full = FakeProvider::new();
    let h = full.create(request()).await.unwrap();
    let snap = full
        .as_snapshots()
        .unwrap()
        .create_snapshot(h.id(), None)
        .await
        .unwrap();
    assert_eq!(full.calls(FakeOp::CreateSnapshot), 1);
    assert!(full.snapshot_ids().contains(&snap.id));
}

#[tokio::test]
async fn the_issue_17_capabilities_follow_the_two_signal_rule() {
    use sandbox_core::{ProcessSpec, ReadStream, narrow};
    let fake = FakeProvider::builder()
        .without(Capability::Processes)
        .without(Capability::StreamedFiles)
        .without(Capability::Watch)
        .build();
    let h = fake.create(request()).await.unwrap();
    // Implemented but not declared: narrowing finds nothing, and the layer's wrapper refuses
    // before the fake sees the call.
    assert!(narrow::processes(&fake).is_none());
    assert!(narrow::streamed_files(&fake).is_none());
    assert!(narrow::watch(&fake).is_none());
    let err = fake
        .as_processes()
        .unwrap()
        .start_process(&h, ProcessSpec::argv("sleep", ["1"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let dir = SandboxPath::new("/workspace").unwrap();
    let err = fake
        .as_watch()
        .unwrap()
        .watch_dir(&h, &dir, false)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let source: ReadStream = Box::new(sandbox_core::BufferedStream::new(b"x".to_vec()));
    let err = fake
        .as_streamed_files()
        .unwrap()
        .write_stream(&h, &dir.join("f").unwrap(), source, 10)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert_eq!(
        fake.calls(FakeOp::StartProcess) + fake.calls(FakeOp::WatchDir),
        0
    );
    assert_eq!(fake.calls(FakeOp::WriteStream), 0);

    // Declared: a background start gets the exec checks (shell form without posix_shell, a
    // bad env name) before the fake.
    let full = FakeProvider::new();
    let h = full.create(request()).await.unwrap();
    let procs = narrow::processes(&full).unwrap();
    let err = procs
        .start_process(&h, ProcessSpec::shell("sleep 1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("posix_shell"), "{err}");
    let mut bad = ProcessSpec::argv("env", Vec::<String>::new());
    bad.env.insert("1BAD".to_owned(), "v".to_owned());
    let err = procs.start_process(&h, bad).await.unwrap_err();
    assert_eq!(err.code(), Some(sandbox_core::ErrorCode::InvalidCommand));
    assert_eq!(full.calls(FakeOp::StartProcess), 0);
    let ok = procs
        .start_process(&h, ProcessSpec::argv("sleep", ["30"]))
        .await
        .unwrap();
    assert_eq!(full.calls(FakeOp::StartProcess), 1);
    assert!(ok.status.is_running());
}
