//! The provider conformance suite: plain async functions over `&dyn SandboxProvider`, each
//! registered only when the adapter declares the capabilities it needs.
//!
//! Every run draws a random namespace and random payloads (file bytes, echo tokens, exit codes
//! in 1–120, env values), so no lookup table of canned answers can pass; the seed is printed
//! with every failure and `SANDBOX_CONFORMANCE_SEED` replays it. Sandboxes and snapshots a case
//! creates are deleted when it ends, pass or fail.
//!
//! Each case cites the contract bullets (tags like `[exec.timeout]`) of the port's rustdoc that
//! it checks. Cases whose requirements are missing are *not applicable* and are reported as such
//! by `cargo xtask conformance`, never silently skipped.

mod cases;
pub mod deadlines;
pub mod harness;
pub mod store;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sandbox_core::{
    Capabilities, Capability, CreateRequest, Error, ErrorKind, ExecRequest, Metadata,
    SandboxHandle, SandboxId, SandboxProvider, SnapshotId, TemplateId,
};

pub use cases::all_cases;
use harness::CaseRun;
pub use harness::{Declaration, Subject, SuiteCase};

/// The case named `name` (without the `conformance::` prefix), the declaration cases included.
pub fn find_case(name: &str) -> Option<Case> {
    harness::find::<ProviderSuite>(name)
}

/// Runs one case against `target` and cleans up after it: the library form of a trial, for
/// tests that check the suite itself. The target's own `declared` set is the pinned one.
pub async fn run_case(case: &Case, target: Target, seed: u64) -> CaseResult {
    let pinned = target.declared;
    harness::run_one::<ProviderSuite>(case, target, pinned, seed).await
}

/// Metadata key carrying the run's namespace on every sandbox the suite creates.
pub const NAMESPACE_KEY: &str = "sandbox_conformance";
/// Metadata key carrying the case name.
pub const CASE_KEY: &str = "sandbox_conformance_case";
/// Metadata marking test resources, so fixture cleanup (`sandbox.test=1`) finds leftovers.
pub const TEST_MARKER_KEY: &str = "sandbox.test";

/// Why a case failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Failure(format!("unexpected error: {err}"))
    }
}

/// The result of a case.
pub type CaseResult = Result<(), Failure>;

/// A boxed case future.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseResult> + Send + 'a>>;

/// One provider conformance case.
pub type Case = SuiteCase<Ctx, Capability>;

/// The provider suite, as the shared harness sees it.
#[derive(Debug, Clone, Copy)]
pub struct ProviderSuite;

// The provider's context takes the pinned set from its target (`Target::declared`, the set the
// adapter's test also hands the harness).
harness::subject! { ProviderSuite: Target, Capabilities, Ctx; "adapter", "adapter";
cases::declaration_cases, cases::all_cases;
|target, _pinned, namespace, case, seed| Ctx::new(target, namespace, case, seed) }

/// What a case runs against.
#[derive(Debug, Clone)]
pub struct Target {
    pub provider: Arc<dyn SandboxProvider>,
    /// A template the provider can boot (with `echo`, `cat`, `sleep`... on its path).
    pub template: TemplateId,
    /// The capability set the adapter's own test pins; the suite checks the provider reports
    /// exactly this, so a case cannot disappear by declaring less.
    pub declared: Capabilities,
}

/// Per-case context: the provider, the run's namespace and RNG, and what to clean up.
pub struct Ctx {
    target: Target,
    run: CaseRun,
    created: Mutex<Vec<SandboxId>>,
    snapshots: Mutex<Vec<SnapshotId>>,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx").field("run", &self.run).finish()
    }
}

impl Ctx {
    /// A context for `case` in the run `namespace`, with payloads drawn from `seed`.
    pub fn new(target: Target, namespace: &str, case: &'static str, seed: u64) -> Self {
        Ctx {
            target,
            run: CaseRun::new(namespace, case, seed),
            created: Mutex::new(Vec::new()),
            snapshots: Mutex::new(Vec::new()),
        }
    }

    /// The provider under test.
    pub fn provider(&self) -> &dyn SandboxProvider {
        &*self.target.provider
    }
    /// A shared handle to the provider (for spawned tasks).
    pub fn provider_arc(&self) -> Arc<dyn SandboxProvider> {
        self.target.provider.clone()
    }
    /// The declared capabilities.
    pub fn caps(&self) -> Capabilities {
        self.provider().capabilities()
    }
    /// The capability set the adapter's test pins.
    pub fn pinned(&self) -> Capabilities {
        self.target.declared
    }
    harness::run_accessors!();

    /// Random bytes.
    pub fn bytes(&self, len: usize) -> Vec<u8> {
        self.with_rng(|r| {
            let mut out = vec![0_u8; len];
            r.fill(&mut out);
            out
        })
    }
    /// A random exit code in 1–120 (avoiding the codes shells and timeouts give meaning).
    pub fn exit_code(&self) -> i32 {
        self.with_rng(|r| r.i32(1..=120))
    }
    /// A random integer in `range`.
    pub fn int(&self, range: std::ops::RangeInclusive<u32>) -> u32 {
        self.with_rng(|r| r.u32(range))
    }

    /// The metadata every sandbox of this run carries (when the provider keeps metadata).
    pub fn metadata(&self) -> Metadata {
        let mut m = Metadata::new();
        if self.caps().metadata {
            m.insert(NAMESPACE_KEY.to_owned(), self.run.namespace().to_owned());
            m.insert(CASE_KEY.to_owned(), self.run.case().replace('_', "-"));
            m.insert(TEST_MARKER_KEY.to_owned(), "1".to_owned());
        }
        m
    }
    /// A create request for the adapter's template carrying the run's metadata.
    pub fn create_request(&self) -> CreateRequest {
        let mut request = CreateRequest::new(self.target.template.clone());
        request.metadata = self.metadata();
        request
    }
    /// Creates a sandbox that is deleted when the case ends.
    pub async fn create(&self) -> Result<SandboxHandle, Failure> {
        self.create_with(self.create_request()).await
    }
    /// Creates a sandbox from `request`; it is deleted when the case ends.
    pub async fn create_with(&self, request: CreateRequest) -> Result<SandboxHandle, Failure> {
        let handle = within(
            Duration::from_secs(120),
            "create",
            self.provider().create(request),
        )
        .await?
        .map_err(|e| Failure(format!("create failed: {e}")))?;
        self.track(handle.id().clone());
        Ok(handle)
    }
    /// Registers a sandbox for deletion at the end of the case.
    pub fn track(&self, id: SandboxId) {
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(id);
    }
    /// Forgets a sandbox the case deleted itself.
    pub fn untrack(&self, id: &SandboxId) {
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|x| x != id);
    }
    /// Registers a snapshot for deletion at the end of the case.
    pub fn track_snapshot(&self, id: SnapshotId) {
        self.snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(id);
    }

    /// `exit <code>` in the form the adapter can run: the fake runs the portable vocabulary
    /// natively; a real backend has no `exit` binary (it is a shell builtin), so with a POSIX
    /// shell the same status comes from `sh -c 'exit N'` (still the argv form of exec).
    pub fn exit_request(&self, code: i32) -> ExecRequest {
        if self.caps().posix_shell {
            ExecRequest::argv("sh", ["-c".to_owned(), format!("exit {code}")])
        } else {
            ExecRequest::argv("exit", [code.to_string()])
        }
    }

    /// Deletes everything the case created. Errors are reported, not fatal: cleanup of one
    /// resource must not stop cleanup of the next.
    pub async fn cleanup(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let snapshots = std::mem::take(
            &mut *self
                .snapshots
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if let Some(snap) = sandbox_core::narrow::snapshots(self.provider()) {
            for id in snapshots {
                if let Err(e) = snap.delete_snapshot(&id).await {
                    problems.push(format!("cleanup: delete snapshot {id}: {e}"));
                }
            }
        }
        let created =
            std::mem::take(&mut *self.created.lock().unwrap_or_else(PoisonError::into_inner));
        for id in created {
            match self.provider().delete(&id).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => problems.push(format!("cleanup: delete sandbox {id}: {e}")),
            }
        }
        problems
    }
}

/// Fails with a clear message when `fut` does not finish within `limit`.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = T>,
) -> Result<T, Failure> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| Failure(format!("{what} did not finish within {}s", limit.as_secs())))
}

/// Asserts that `result` failed with `kind`.
pub fn expect_kind<T: fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    kind: ErrorKind,
) -> CaseResult {
    match result {
        Err(e) if e.kind() == kind => Ok(()),
        Err(e) => Err(Failure(format!("{what}: expected a {kind} error, got {e}"))),
        Ok(v) => Err(Failure(format!(
            "{what}: expected a {kind} error, got success: {v:?}"
        ))),
    }
}

/// Fails with `message` unless `condition` holds.
pub fn ensure(condition: bool, message: impl FnOnce() -> String) -> CaseResult {
    if condition {
        Ok(())
    } else {
        Err(Failure(message()))
    }
}

/// Fails unless `left == right`, showing both.
pub fn ensure_eq<T: PartialEq + fmt::Debug>(what: &str, left: T, right: T) -> CaseResult {
    if left == right {
        Ok(())
    } else {
        Err(Failure(format!("{what}: got {left:?}, want {right:?}")))
    }
}

/// Shortens bytes for a failure message.
pub fn preview(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
    if bytes.len() > 200 {
        format!("{text:?}... ({} bytes)", bytes.len())
    } else {
        format!("{text:?}")
    }
}

/// The describe document `cargo xtask` reads: which cases apply to `declared`.
pub fn describe(adapter: &str, declared: &Capabilities) -> serde_json::Value {
    harness::describe_suite::<ProviderSuite>(adapter, declared)
}
