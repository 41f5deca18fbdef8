//! The suite must be able to fail: each defect below is planted in a decorator around the fake,
//! and the case that guards against it must reject it, while the healthy fake passes the same
//! case. A case that passes a broken provider is a case that checks nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::Arc;

use async_trait::async_trait;
use sandbox_core::{
    Capabilities, Capability, Checked, ConnectProbe, ConnectRequest, CreateRequest, DirEntry,
    Error, ExecRequest, ExecResult, KeepAlive, ListFilter, NetworkFields, Operation, Provider,
    SandboxHandle, SandboxId, SandboxPath, SandboxProvider, SandboxSummary, SnapshotId,
    SnapshotRef, Snapshots, StatEntry, TemplateCatalog,
};
use sandbox_testkit::conformance::{Target, find_case, run_case};
use sandbox_testkit::{FakeProvider, fake_capabilities};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defect {
    ListIgnoresFilter,
    DeleteIsNoop,
    MergesStreams,
    TruncatesOutput,
    HidesTimeouts,
    ReportsExit124AsKilled,
    ExitCodesAlwaysZero,
    GoneIsUnavailable,
    MkdirOfExistingFails,
    CorruptsBinary,
    DropsMetadata,
    SnapshotDeleteNotIdempotent,
    EchoIsCanned,
    StdinIgnored,
    RemoveRootAllowed,
}

#[derive(Debug)]
struct Broken {
    inner: Checked<FakeProvider>,
    defect: Defect,
}

#[async_trait]
impl SandboxProvider for Broken {
    fn provider(&self) -> Provider {
        self.inner.provider()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn network_fields(&self) -> NetworkFields {
        self.inner.network_fields()
    }
    async fn health(&self) -> Result<(), Error> {
        self.inner.health().await
    }
    async fn create(&self, mut request: CreateRequest) -> Result<SandboxHandle, Error> {
        if self.defect == Defect::DropsMetadata {
            request.metadata.retain(|k, _| k == "sandbox_conformance");
        }
        self.inner.create(request).await
    }
    async fn connect(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        let result = self.inner.connect(request).await;
        match result {
            Err(e) if self.defect == Defect::GoneIsUnavailable && e.can_replace_binding() => {
                Err(Error::unavailable(Operation::CONNECT, "gateway hiccup"))
            }
            other => other,
        }
    }
    async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error> {
        self.inner.get(id).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<SandboxSummary>, Error> {
        if self.defect == Defect::ListIgnoresFilter {
            return self.inner.list(&ListFilter::default()).await;
        }
        self.inner.list(filter).await
    }
    async fn delete(&self, id: &SandboxId) -> Result<(), Error> {
        if self.defect == Defect::DeleteIsNoop {
            return Ok(());
        }
        self.inner.delete(id).await
    }
    async fn exec(
        &self,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        let mut request = request;
        if self.defect == Defect::StdinIgnored {
            request.stdin = None;
        }
        let is_echo = matches!(&request.command, sandbox_core::Command::Argv { program, .. } if program == "echo");
        let mut r = self.inner.exec(sandbox, request).await?;
        match self.defect {
            Defect::MergesStreams => {
                let err = std::mem::take(&mut r.stderr);
                r.stdout.extend(err);
            }
            Defect::TruncatesOutput => r.stdout.truncate(64 * 1024),
            Defect::HidesTimeouts => r.killed = false,
            Defect::ReportsExit124AsKilled if r.exit_code == 124 => r.killed = true,
            Defect::ExitCodesAlwaysZero => r.exit_code = 0,
            Defect::EchoIsCanned if is_echo => r.stdout = b"hello\n".to_vec(),
            _ => {}
        }
        Ok(r)
    }
    async fn write_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        if self.defect == Defect::CorruptsBinary {
            let mangled: Vec<u8> = content.iter().copied().filter(|b| *b != b'\r').collect();
            return self.inner.write_file(sandbox, path, &mangled).await;
        }
        self.inner.write_file(sandbox, path, content).await
    }
    async fn read_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<u8>, Error> {
        self.inner.read_file(sandbox, path).await
    }
    async fn list_dir(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<DirEntry>, Error> {
        self.inner.list_dir(sandbox, path).await
    }
    async fn make_dir(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        if self.defect == Defect::MkdirOfExistingFails
            && self.inner.stat(sandbox, path).await.is_ok()
        {
            return Err(Error::internal(
                Operation::MAKE_DIR,
                "directory already exists",
            ));
        }
        self.inner.make_dir(sandbox, path).await
    }
    async fn remove(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        if self.defect == Defect::RemoveRootAllowed && path.is_root() {
            return Ok(());
        }
        self.inner.remove(sandbox, path).await
    }
    async fn stat(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<StatEntry, Error> {
        self.inner.stat(sandbox, path).await
    }
    // A decorator forwards every optional capability, or the capability silently disappears.
    fn as_snapshots(&self) -> Option<&dyn Snapshots> {
        Some(self)
    }
    fn as_template_catalog(&self) -> Option<&dyn TemplateCatalog> {
        self.inner.as_template_catalog()
    }
    fn as_keep_alive(&self) -> Option<&dyn KeepAlive> {
        self.inner.as_keep_alive()
    }
    fn as_connect_probe(&self) -> Option<&dyn ConnectProbe> {
        self.inner.as_connect_probe()
    }
}

#[async_trait]
impl Snapshots for Broken {
    async fn create_snapshot(
        &self,
        sandbox: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotRef, Error> {
        self.inner.create_snapshot(sandbox, name).await
    }
    async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), Error> {
        if self.defect == Defect::SnapshotDeleteNotIdempotent
            && !self.inner.snapshot_ids().contains(id)
        {
            return Err(Error::not_found(
                Operation::DELETE_SNAPSHOT,
                "no such snapshot",
            ));
        }
        self.inner.delete_snapshot(id).await
    }
    async fn list_snapshots(&self, source: Option<&SandboxId>) -> Result<Vec<SnapshotRef>, Error> {
        self.inner.list_snapshots(source).await
    }
}

fn target(provider: Arc<dyn SandboxProvider>) -> Target {
    Target {
        provider,
        template: FakeProvider::template(),
        declared: fake_capabilities(),
    }
}

async fn outcome(case: &str, provider: Arc<dyn SandboxProvider>) -> Result<(), String> {
    let case = find_case(case).unwrap_or_else(|| panic!("no case named {case}"));
    run_case(&case, target(provider), fastrand::u64(..))
        .await
        .map_err(|f| f.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_planted_defect_is_caught_by_its_case() {
    let table = [
        (
            Defect::ListIgnoresFilter,
            "list_filters_by_metadata_and_state",
        ),
        (Defect::DeleteIsNoop, "delete_then_get_is_not_found"),
        (Defect::MergesStreams, "exec_streams_are_kept_apart"),
        (Defect::TruncatesOutput, "exec_large_stdout_is_intact"),
        (Defect::HidesTimeouts, "exec_timeout_kills"),
        (
            Defect::ReportsExit124AsKilled,
            "exec_exit_124_and_137_are_not_timeouts",
        ),
        (Defect::ExitCodesAlwaysZero, "exec_exit_codes"),
        (Defect::GoneIsUnavailable, "connect_deleted_is_replaceable"),
        (
            Defect::MkdirOfExistingFails,
            "files_make_dir_parents_and_existing",
        ),
        (Defect::CorruptsBinary, "files_binary_round_trip"),
        (Defect::DropsMetadata, "metadata_round_trips"),
        (Defect::SnapshotDeleteNotIdempotent, "snapshot_round_trip"),
        (Defect::EchoIsCanned, "exec_argv_echo"),
        (Defect::StdinIgnored, "exec_stdin_is_delivered"),
        (Defect::RemoveRootAllowed, "files_remove_recursive"),
    ];
    for (defect, case) in table {
        let healthy = outcome(case, Arc::new(FakeProvider::new())).await;
        assert!(
            healthy.is_ok(),
            "{case} fails the healthy fake: {healthy:?}"
        );
        let broken = outcome(
            case,
            Arc::new(Broken {
                inner: FakeProvider::new(),
                defect,
            }),
        )
        .await;
        assert!(broken.is_err(), "{case} did not catch {defect:?}");
    }
}

#[tokio::test]
async fn declaring_less_than_the_pinned_set_is_caught() {
    let narrowed = FakeProvider::builder()
        .without(Capability::Snapshots)
        .build();
    let case = find_case("declared_capabilities_match").unwrap();
    let result = run_case(&case, target(Arc::new(narrowed)), 1).await;
    assert!(
        result.is_err(),
        "a provider declaring less than its pinned set passed"
    );
    let err = result.unwrap_err().0;
    assert!(err.contains("declared capabilities"), "{err}");
}

#[tokio::test]
async fn a_dropped_capability_method_is_caught() {
    // Declares snapshots but a careless decorator does not forward the trait.
    #[derive(Debug)]
    struct Forgetful(Checked<FakeProvider>);
    #[async_trait]
    impl SandboxProvider for Forgetful {
        fn provider(&self) -> Provider {
            self.0.provider()
        }
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        fn network_fields(&self) -> NetworkFields {
            self.0.network_fields()
        }
        async fn health(&self) -> Result<(), Error> {
            self.0.health().await
        }
        async fn create(&self, r: CreateRequest) -> Result<SandboxHandle, Error> {
            self.0.create(r).await
        }
        async fn connect(&self, r: ConnectRequest) -> Result<SandboxHandle, Error> {
            self.0.connect(r).await
        }
        async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error> {
            self.0.get(id).await
        }
        async fn list(&self, f: &ListFilter) -> Result<Vec<SandboxSummary>, Error> {
            self.0.list(f).await
        }
        async fn delete(&self, id: &SandboxId) -> Result<(), Error> {
            self.0.delete(id).await
        }
        async fn exec(&self, h: &SandboxHandle, r: ExecRequest) -> Result<ExecResult, Error> {
            self.0.exec(h, r).await
        }
        async fn write_file(
            &self,
            h: &SandboxHandle,
            p: &SandboxPath,
            c: &[u8],
        ) -> Result<(), Error> {
            self.0.write_file(h, p, c).await
        }
        async fn read_file(&self, h: &SandboxHandle, p: &SandboxPath) -> Result<Vec<u8>, Error> {
            self.0.read_file(h, p).await
        }
        async fn list_dir(
            &self,
            h: &SandboxHandle,
            p: &SandboxPath,
        ) -> Result<Vec<DirEntry>, Error> {
            self.0.list_dir(h, p).await
        }
        async fn make_dir(&self, h: &SandboxHandle, p: &SandboxPath) -> Result<(), Error> {
            self.0.make_dir(h, p).await
        }
        async fn remove(&self, h: &SandboxHandle, p: &SandboxPath) -> Result<(), Error> {
            self.0.remove(h, p).await
        }
        async fn stat(&self, h: &SandboxHandle, p: &SandboxPath) -> Result<StatEntry, Error> {
            self.0.stat(h, p).await
        }
    }
    let case = find_case("declared_capabilities_are_callable").unwrap();
    let err = run_case(&case, target(Arc::new(Forgetful(FakeProvider::new()))), 2)
        .await
        .unwrap_err()
        .0;
    assert!(
        err.contains("declared=true but narrowing gives callable=false"),
        "{err}"
    );
}
