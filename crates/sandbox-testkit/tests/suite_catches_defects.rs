//! The suite must be able to fail: each defect below is planted in a decorator around the fake (the test kit's
//! forwarding helper, so each defect writes only the methods it changes),
//! and the case that guards against it must reject it, while the healthy fake passes the same
//! case. A case that passes a broken provider is a case that checks nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::Arc;

use async_trait::async_trait;
use sandbox_core::{
    Capability, Checked, ConnectRequest, CreateRequest, Error, ExecRequest, ExecResult, ListFilter,
    ListPage, Operation, SandboxHandle, SandboxId, SandboxPage, SandboxPath, SandboxProvider,
    SandboxSummary, SnapshotId, Snapshots,
};
use sandbox_core::{
    ErrorCode, ErrorKind, ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, Processes,
    ReadStream, StreamedFiles, Watch, WatchStream,
};
use sandbox_testkit::conformance::{Target, find_case, run_case};
use sandbox_testkit::{FakeProvider, Forward, ProviderHooks, fake_capabilities};

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
    ReplayIgnoresOffset,
    WriteLeavesPartialFile,
    WatchIsAlwaysRecursive,
    CapRefusalUncoded,
    CreateDropsUser,
    PageDropsNext,
    TunnelCorruptsAnswer,
    ClosedPortUncoded,
    TunnelLimitUncoded,
}

/// A tunnel's answer with the first byte of every chunk flipped.
#[derive(Debug)]
struct Flipping(Box<dyn sandbox_core::TunnelSource>);

#[async_trait]
impl sandbox_core::TunnelSource for Flipping {
    async fn recv(&mut self) -> Option<Result<Vec<u8>, Error>> {
        self.0.recv().await.map(|chunk| {
            chunk.map(|mut bytes| {
                if let Some(first) = bytes.first_mut() {
                    *first ^= 0xff;
                }
                bytes
            })
        })
    }
}

/// The defect, planted through the test kit's forwarding helper: only the methods a defect
/// touches are written here, the rest forward to the fake.
#[derive(Debug)]
struct Broken {
    /// The wrapped fake, for inspecting its state (clones share it).
    fake: Checked<FakeProvider>,
    defect: Defect,
}

impl Broken {
    fn provider(defect: Defect) -> Forward<Broken> {
        let fake = FakeProvider::new();
        Forward::new(Arc::new(fake.clone()), Broken { fake, defect })
    }
}

#[async_trait]
impl ProviderHooks for Broken {
    async fn create(
        &self,
        next: &dyn SandboxProvider,
        mut request: CreateRequest,
    ) -> Result<SandboxHandle, Error> {
        if self.defect == Defect::DropsMetadata {
            request.metadata.retain(|k, _| k == "sandbox_conformance");
        }
        if self.defect == Defect::CreateDropsUser {
            request.user = None;
        }
        next.create(request).await
    }
    async fn connect(
        &self,
        next: &dyn SandboxProvider,
        request: ConnectRequest,
    ) -> Result<SandboxHandle, Error> {
        let result = next.connect(request).await;
        match result {
            Err(e) if self.defect == Defect::GoneIsUnavailable && e.can_replace_binding() => {
                Err(Error::unavailable(Operation::CONNECT, "gateway hiccup"))
            }
            other => other,
        }
    }
    async fn list(
        &self,
        next: &dyn SandboxProvider,
        filter: &ListFilter,
    ) -> Result<Vec<SandboxSummary>, Error> {
        if self.defect == Defect::ListIgnoresFilter {
            return next.list(&ListFilter::default()).await;
        }
        next.list(filter).await
    }
    async fn list_page(
        &self,
        next: &dyn SandboxProvider,
        filter: &ListFilter,
        page: &ListPage,
    ) -> Result<SandboxPage, Error> {
        let mut got = next.list_page(filter, page).await?;
        if self.defect == Defect::PageDropsNext {
            got.next = None;
        }
        Ok(got)
    }
    async fn delete(&self, next: &dyn SandboxProvider, id: &SandboxId) -> Result<(), Error> {
        if self.defect == Defect::DeleteIsNoop {
            return Ok(());
        }
        next.delete(id).await
    }
    async fn exec(
        &self,
        next: &dyn SandboxProvider,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        let mut request = request;
        if self.defect == Defect::StdinIgnored {
            request.stdin = None;
        }
        let is_echo = matches!(&request.command, sandbox_core::Command::Argv { program, .. } if program == "echo");
        let mut r = next.exec(sandbox, request).await?;
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
        next: &dyn SandboxProvider,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        if self.defect == Defect::CorruptsBinary {
            let mangled: Vec<u8> = content.iter().copied().filter(|b| *b != b'\r').collect();
            return next.write_file(sandbox, path, &mangled).await;
        }
        next.write_file(sandbox, path, content).await
    }
    async fn make_dir(
        &self,
        next: &dyn SandboxProvider,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<(), Error> {
        if self.defect == Defect::MkdirOfExistingFails && next.stat(sandbox, path).await.is_ok() {
            return Err(Error::internal(
                Operation::MAKE_DIR,
                "directory already exists",
            ));
        }
        next.make_dir(sandbox, path).await
    }
    async fn remove(
        &self,
        next: &dyn SandboxProvider,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<(), Error> {
        if self.defect == Defect::RemoveRootAllowed && path.is_root() {
            return Ok(());
        }
        next.remove(sandbox, path).await
    }
    async fn start_process(
        &self,
        next: &dyn Processes,
        sandbox: &SandboxHandle,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error> {
        match next.start_process(sandbox, spec).await {
            // The cap's refusal without its code: a caller cannot tell it from other capacity.
            Err(e)
                if self.defect == Defect::CapRefusalUncoded
                    && e.code() == Some(ErrorCode::ProcessLimit) =>
            {
                Err(Error::new(
                    ErrorKind::Capacity,
                    Operation::START_PROCESS,
                    e.message().to_owned(),
                ))
            }
            other => other,
        }
    }
    async fn open_tunnel(
        &self,
        next: &dyn sandbox_core::Tunnels,
        sandbox: &SandboxHandle,
        port: u16,
    ) -> Result<sandbox_core::Tunnel, Error> {
        let uncoded =
            |e: Error| Error::new(e.kind(), Operation::OPEN_TUNNEL, e.message().to_owned());
        match next.open_tunnel(sandbox, port).await {
            Ok(tunnel) if self.defect == Defect::TunnelCorruptsAnswer => Ok(sandbox_core::Tunnel {
                sink: tunnel.sink,
                source: Box::new(Flipping(tunnel.source)),
            }),
            Err(e)
                if self.defect == Defect::ClosedPortUncoded
                    && e.code() == Some(ErrorCode::PortClosed) =>
            {
                Err(uncoded(e))
            }
            Err(e)
                if self.defect == Defect::TunnelLimitUncoded
                    && e.code() == Some(ErrorCode::TunnelLimit) =>
            {
                Err(uncoded(e))
            }
            other => other,
        }
    }
    async fn attach_process(
        &self,
        next: &dyn Processes,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<ProcessStream, Error> {
        let from = if self.defect == Defect::ReplayIgnoresOffset {
            None
        } else {
            from
        };
        next.attach_process(sandbox, target, from).await
    }
    async fn write_stream(
        &self,
        next: &dyn StreamedFiles,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        mut source: ReadStream,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        if self.defect != Defect::WriteLeavesPartialFile {
            return next.write_stream(sandbox, path, source, max_bytes).await;
        }
        // Writes in place as the bytes arrive: a failed upload leaves what came before.
        let mut so_far = Vec::new();
        while let Some(chunk) = source.next_chunk().await {
            match chunk {
                Ok(bytes) => so_far.extend_from_slice(&bytes),
                Err(e) => {
                    self.fake.write_file(sandbox, path, &so_far).await?;
                    return Err(e);
                }
            }
        }
        self.fake.write_file(sandbox, path, &so_far).await?;
        Ok(so_far.len() as u64)
    }
    async fn watch_dir(
        &self,
        next: &dyn Watch,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        let recursive = recursive || self.defect == Defect::WatchIsAlwaysRecursive;
        next.watch_dir(sandbox, dir, recursive).await
    }
    async fn delete_snapshot(&self, next: &dyn Snapshots, id: &SnapshotId) -> Result<(), Error> {
        if self.defect == Defect::SnapshotDeleteNotIdempotent
            && !self.fake.snapshot_ids().contains(id)
        {
            return Err(Error::not_found(
                Operation::DELETE_SNAPSHOT,
                "no such snapshot",
            ));
        }
        next.delete_snapshot(id).await
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
        (
            Defect::ReplayIgnoresOffset,
            "process_output_replays_exactly",
        ),
        (Defect::WriteLeavesPartialFile, "streamed_write_is_atomic"),
        (Defect::WatchIsAlwaysRecursive, "watch_recursive_flag"),
        (Defect::CapRefusalUncoded, "process_cap_is_enforced"),
        (Defect::CreateDropsUser, "create_user_runs_what_names_none"),
        (Defect::PageDropsNext, "list_pages_through_a_filter"),
        (
            Defect::TunnelCorruptsAnswer,
            "tunnel_carries_bytes_both_ways",
        ),
        (
            Defect::ClosedPortUncoded,
            "tunnel_to_a_closed_port_is_refused",
        ),
        (Defect::TunnelLimitUncoded, "tunnel_cap_is_enforced"),
    ];
    for (defect, case) in table {
        let healthy = outcome(case, Arc::new(FakeProvider::new())).await;
        assert!(
            healthy.is_ok(),
            "{case} fails the healthy fake: {healthy:?}"
        );
        let broken = outcome(case, Arc::new(Broken::provider(defect))).await;
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
    struct Forgetful;
    impl ProviderHooks for Forgetful {
        fn hides(&self, capability: Capability) -> bool {
            capability == Capability::Snapshots
        }
    }
    let case = find_case("declared_capabilities_are_callable").unwrap();
    let err = run_case(
        &case,
        target(Arc::new(Forward::new(
            Arc::new(FakeProvider::new()),
            Forgetful,
        ))),
        2,
    )
    .await
    .unwrap_err()
    .0;
    assert!(
        err.contains("declared=true but narrowing gives callable=false"),
        "{err}"
    );
}
