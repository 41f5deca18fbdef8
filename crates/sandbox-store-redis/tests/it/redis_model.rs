//! A model test of the Redis store against real Redis (`SANDBOX_TEST_REDIS_URL`, set by
//! `cargo xtask test`): random operation sequences run on the store and on a small pure
//! model written here, and every result and the resulting state must agree.
//!
//! Each proptest case gets a fresh random namespace and two store instances on it (two fred
//! clients: two replicas sharing one Redis). Every operation picks the instance it runs on, so
//! whatever one replica writes or locks, the other must see. The key space is deliberately
//! tiny (tenant 1 sessions `s0`/`s1`, tenant 2 session `s0`: the same session name under
//! another tenant must stay apart), and so are the pools of sandboxes, providers, tokens and
//! configs, so that random operations collide on purpose.
//!
//! Covered, each compared with the model:
//! - bindings: `get`, `create` (also a racing create from both replicas, and a binding of
//!   another key, refused as `invalid_request`), `delete_if_match` and
//!   `replace_traffic_token_if_match` with matching and non-matching expectations, the same
//!   token and the empty token, and an `expected` binding that is the one as created (so its
//!   stale mark and token may be out of date: only provider and sandbox must count);
//! - `invalidate_by_config`: the mark count, exactly which sessions are reported failed
//!   because their lifecycle lock is held, and each new `stale_at` lying within the call;
//! - the lifecycle lock from either replica: a free key is granted, a held key is not granted
//!   within a short probe (also to the replica already holding it: the lock is not
//!   re-entrant), a race of both replicas for a free key grants exactly one, `release` answers
//!   `Ok` with ownership intact, and a dropped lock frees its key (in the background, so the
//!   test polls for it);
//! - turn leases (`begin_turn`, `end_turn`, `turn_state`, `consume_turn_rebuild`), the rewind
//!   lock (`try_lock_rewind` with its three refusals, release, drop, `has_rewind_lock`) and
//!   background activities (`add` with a per-kind cap, `remove`, `list`), with the exclusions
//!   between them.
//!
//! After every step the test reads the whole state back through both replicas: each key's
//! binding, turn state, rewind lock and activities, and whether its lifecycle lock key exists
//! in Redis (the model knows exactly which keys are locked).
//!
//! Not covered: lease expiry (turn, rewind and activity leases are far longer than a case, and
//! the lifecycle lock's short lease is renewed while held and never left to lapse, because a
//! model judged by the wall clock would be a flaky model), ownership loss (Redis never goes away here: the outage cases of the conformance suite do
//! that), truly concurrent interleavings beyond the two races (the sequence is otherwise
//! serial, so the model stays a plain state machine), malformed stored values (conformance
//! plants those), and the cluster topology.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fred::interfaces::KeysInterface;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sandbox_core::{
    BackgroundActivity, Binding, BindingKey, BindingStore, ConfigId, Error, ErrorCode, ErrorKind,
    LifecycleLock, Provider, RewindLock, SandboxId, Secret, SessionId, TemplateId, TenantId,
    TurnState, timefmt,
};
use sandbox_store_redis::{RedisBindingStore, RedisStoreConfig, Topology};
use time::OffsetDateTime;

/// Cases and steps per case: enough that locks, turns, rewinds and activities meet on the same
/// keys in many combinations (`--nocapture` prints what was reached), few enough that the
/// binary stays well under a minute. `PROPTEST_CASES` overrides the count for a soak.
const CASES: u32 = 48;
const MAX_STEPS: usize = 25;

/// How long an acquire of a held lock is watched for a (wrong) grant. The acquire loop retries
/// every 25–74 ms, so this spans several attempts.
const PROBE: Duration = Duration::from_millis(250);
/// The bound on anything that must eventually happen (a free lock granted, a dropped lock's
/// background release landing). Generous: only a hang or a store that never frees fails it.
const EVENTUALLY: Duration = Duration::from_secs(5);
/// The invalidation's per-session lock wait; short, since every locked session costs one.
const INVALIDATE_LOCK_WAIT: Duration = Duration::from_millis(250);
/// Far longer than any case: leases never lapse under the model (see the module doc).
const LONG_LEASE: Duration = Duration::from_secs(120);

/// The key space: `(tenant, session)`.
const KEYS: [(u64, &str); 3] = [(1, "s0"), (1, "s1"), (2, "s0")];
const TENANTS: [u64; 2] = [1, 2];
const SANDBOXES: [&str; 3] = ["sbx-0", "sbx-1", "sbx-2"];
const TEMPLATES: [&str; 2] = ["tpl-a", "tpl-b"];
/// `""` normalizes to the default-config sentinel.
const CONFIGS: [&str; 3] = ["cfg-a", "cfg-b", ""];
/// `""` is the empty token: stored as absent, never a patch.
const TOKENS: [&str; 3] = ["tok-0", "tok-1", ""];
const CREATED: [&str; 2] = ["2026-01-02T08:00:00.123456789Z", "2026-02-03T09:30:00Z"];
const STALE: &str = "2026-02-04T10:00:00.5Z";
const ACTIVITY_IDS: [&str; 3] = ["a0", "a1", "a2"];
const ACTIVITY_KINDS: [&str; 2] = ["shell_job", "desktop"];
const STARTED: [&str; 2] = ["2026-03-01T10:00:00.25Z", "2026-03-02T11:00:00Z"];

// ---- operations -------------------------------------------------------------------------------

/// An index into [`KEYS`], printed as the key it names.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key(usize);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (tenant, session) = KEYS[self.0];
        write!(f, "{tenant}/{session}")
    }
}

/// A binding to create, as indices into the pools.
#[derive(Debug, Clone)]
struct Spec {
    provider: Provider,
    sandbox: usize,
    template: usize,
    created: usize,
    config: Option<usize>,
    stale: bool,
    token: Option<usize>,
}

/// Which `(provider, sandbox)` (or whole binding) an operation expects to find.
#[derive(Debug, Clone)]
enum Target {
    /// The binding stored now (per the model): a match, when bound.
    Current,
    /// The binding as it was created: same provider and sandbox, but possibly an older token
    /// and no stale mark.
    AsCreated,
    /// Anything from the pools: usually a mismatch, sometimes a match by chance.
    Other(Provider, usize),
}

/// What an invalidation names.
#[derive(Debug, Clone)]
enum Scope {
    /// The tenant and config of this key's binding (per the model): something to mark, unless
    /// it is already stale or locked.
    OfKey(Key),
    /// A tenant and config from the pools: often nothing to mark.
    Pool { tenant: usize, config: usize },
}

#[derive(Debug, Clone)]
enum TokenChoice {
    /// The token stored now (a no-op patch).
    Same,
    /// The empty token (never a patch).
    Empty,
    /// A non-empty token from the pool.
    Pool(usize),
}

#[derive(Debug, Clone)]
enum Op {
    Get {
        inst: usize,
        key: Key,
    },
    Create {
        inst: usize,
        key: Key,
        spec: Spec,
    },
    /// A binding of the next key, created under this one.
    CreateForeign {
        inst: usize,
        key: Key,
        spec: Spec,
    },
    /// Both replicas create at once, with different bindings.
    RaceCreate {
        key: Key,
        first: Spec,
        second: Spec,
    },
    DeleteIfMatch {
        inst: usize,
        key: Key,
        target: Target,
    },
    ReplaceToken {
        inst: usize,
        key: Key,
        target: Target,
        token: TokenChoice,
    },
    Invalidate {
        inst: usize,
        scope: Scope,
    },
    Lock {
        inst: usize,
        key: Key,
    },
    /// Both replicas acquire at once.
    RaceLock {
        key: Key,
    },
    /// Releases the `which % held`-th held lifecycle lock (no-op when none is held).
    Release {
        which: usize,
    },
    /// Drops it instead.
    DropLock {
        which: usize,
    },
    BeginTurn {
        inst: usize,
        key: Key,
    },
    EndTurn {
        inst: usize,
        key: Key,
    },
    TurnState {
        inst: usize,
        key: Key,
    },
    ConsumeRebuild {
        inst: usize,
        key: Key,
    },
    LockRewind {
        inst: usize,
        key: Key,
    },
    ReleaseRewind {
        which: usize,
    },
    DropRewind {
        which: usize,
    },
    AddActivity {
        inst: usize,
        key: Key,
        id: usize,
        kind: usize,
        started: usize,
        cap: usize,
    },
    RemoveActivity {
        inst: usize,
        key: Key,
        id: usize,
    },
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Get { .. } => "get",
            Op::Create { .. } => "create",
            Op::CreateForeign { .. } => "create_foreign",
            Op::RaceCreate { .. } => "race_create",
            Op::DeleteIfMatch { .. } => "delete_if_match",
            Op::ReplaceToken { .. } => "replace_token",
            Op::Invalidate { .. } => "invalidate",
            Op::Lock { .. } => "lock",
            Op::RaceLock { .. } => "race_lock",
            Op::Release { .. } => "release",
            Op::DropLock { .. } => "drop_lock",
            Op::BeginTurn { .. } => "begin_turn",
            Op::EndTurn { .. } => "end_turn",
            Op::TurnState { .. } => "turn_state",
            Op::ConsumeRebuild { .. } => "consume_rebuild",
            Op::LockRewind { .. } => "lock_rewind",
            Op::ReleaseRewind { .. } => "release_rewind",
            Op::DropRewind { .. } => "drop_rewind",
            Op::AddActivity { .. } => "add_activity",
            Op::RemoveActivity { .. } => "remove_activity",
        }
    }
}

fn key() -> impl Strategy<Value = Key> {
    (0..KEYS.len()).prop_map(Key)
}

fn inst() -> impl Strategy<Value = usize> {
    0..2usize
}

fn provider() -> impl Strategy<Value = Provider> {
    prop::sample::select(Provider::ALL.to_vec())
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        provider(),
        0..SANDBOXES.len(),
        0..TEMPLATES.len(),
        0..CREATED.len(),
        prop::option::weighted(0.8, 0..CONFIGS.len()),
        prop::bool::weighted(0.15),
        prop::option::of(0..TOKENS.len()),
    )
        .prop_map(
            |(provider, sandbox, template, created, config, stale, token)| Spec {
                provider,
                sandbox,
                template,
                created,
                config,
                stale,
                token,
            },
        )
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        4 => Just(Target::Current),
        2 => Just(Target::AsCreated),
        2 => (provider(), 0..SANDBOXES.len()).prop_map(|(p, s)| Target::Other(p, s)),
    ]
}

fn token_choice() -> impl Strategy<Value = TokenChoice> {
    prop_oneof![
        1 => Just(TokenChoice::Same),
        1 => Just(TokenChoice::Empty),
        // The pool's last entry is the empty token; `Pool` picks the non-empty ones.
        3 => (0..TOKENS.len() - 1).prop_map(TokenChoice::Pool),
    ]
}

/// The weights keep probes of held locks (each costs [`PROBE`]) to a few per case.
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (inst(), key()).prop_map(|(inst, key)| Op::Get { inst, key }),
        5 => (inst(), key(), spec()).prop_map(|(inst, key, spec)| Op::Create { inst, key, spec }),
        1 => (inst(), key(), spec())
            .prop_map(|(inst, key, spec)| Op::CreateForeign { inst, key, spec }),
        2 => (key(), spec(), spec())
            .prop_map(|(key, first, second)| Op::RaceCreate { key, first, second }),
        3 => (inst(), key(), target())
            .prop_map(|(inst, key, target)| Op::DeleteIfMatch { inst, key, target }),
        4 => (inst(), key(), target(), token_choice()).prop_map(|(inst, key, target, token)| {
            Op::ReplaceToken { inst, key, target, token }
        }),
        2 => (inst(), key()).prop_map(|(inst, key)| Op::Invalidate {
            inst,
            scope: Scope::OfKey(key),
        }),
        1 => (inst(), 0..TENANTS.len(), 0..CONFIGS.len()).prop_map(|(inst, tenant, config)| {
            Op::Invalidate { inst, scope: Scope::Pool { tenant, config } }
        }),
        4 => (inst(), key()).prop_map(|(inst, key)| Op::Lock { inst, key }),
        1 => key().prop_map(|key| Op::RaceLock { key }),
        3 => any::<usize>().prop_map(|which| Op::Release { which }),
        2 => any::<usize>().prop_map(|which| Op::DropLock { which }),
        3 => (inst(), key()).prop_map(|(inst, key)| Op::BeginTurn { inst, key }),
        2 => (inst(), key()).prop_map(|(inst, key)| Op::EndTurn { inst, key }),
        1 => (inst(), key()).prop_map(|(inst, key)| Op::TurnState { inst, key }),
        2 => (inst(), key()).prop_map(|(inst, key)| Op::ConsumeRebuild { inst, key }),
        3 => (inst(), key()).prop_map(|(inst, key)| Op::LockRewind { inst, key }),
        1 => any::<usize>().prop_map(|which| Op::ReleaseRewind { which }),
        1 => any::<usize>().prop_map(|which| Op::DropRewind { which }),
        2 => (
            inst(),
            key(),
            0..ACTIVITY_IDS.len(),
            0..ACTIVITY_KINDS.len(),
            0..STARTED.len(),
            0..3usize,
        )
            .prop_map(|(inst, key, id, kind, started, cap)| Op::AddActivity {
                inst,
                key,
                id,
                kind,
                started,
                cap,
            }),
        1 => (inst(), key(), 0..ACTIVITY_IDS.len())
            .prop_map(|(inst, key, id)| Op::RemoveActivity { inst, key, id }),
    ]
}

// ---- the model --------------------------------------------------------------------------------

/// A chat-turn lease: the hold count and whether the turn's one rebuild is still unspent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Turn {
    refs: u32,
    rebuild: bool,
}

/// Everything the model knows about one key.
#[derive(Debug, Clone, Default)]
struct KeyModel {
    binding: Option<Binding>,
    /// The binding as its `create` stored it (before token patches and stale marks).
    as_created: Option<Binding>,
    /// Which replica holds the lifecycle lock.
    lock: Option<usize>,
    turn: Option<Turn>,
    rewind: bool,
    /// id → (kind, started_at).
    activities: BTreeMap<String, (String, OffsetDateTime)>,
}

impl KeyModel {
    fn turn_state(&self) -> TurnState {
        let live_work = !self.activities.is_empty();
        TurnState {
            active: self.turn.is_some() || live_work,
            // Live work counts as a turn that must not rebuild (it would kill the work).
            may_rebuild: self.turn.is_some_and(|t| t.rebuild) && !live_work,
        }
    }

    fn activity_list(&self) -> Vec<BackgroundActivity> {
        self.activities
            .iter()
            .map(|(id, (kind, started_at))| BackgroundActivity {
                id: id.clone(),
                kind: kind.clone(),
                started_at: *started_at,
            })
            .collect()
    }
}

fn binding_keys() -> Vec<BindingKey> {
    KEYS.iter()
        .map(|&(tenant, session)| BindingKey::new(tenant, session).unwrap())
        .collect()
}

fn at(raw: &str) -> OffsetDateTime {
    timefmt::parse(raw).unwrap()
}

impl Spec {
    fn build(&self, key: &BindingKey) -> Binding {
        let mut b = Binding::new(
            key,
            self.provider,
            SandboxId::new(SANDBOXES[self.sandbox]).unwrap(),
            TemplateId::new(TEMPLATES[self.template]).unwrap(),
            at(CREATED[self.created]),
        );
        b.config_id = self.config.map(|c| ConfigId::new(CONFIGS[c]).unwrap());
        b.stale_at = self.stale.then(|| at(STALE));
        b.traffic_token = self.token.map(|t| Secret::new(TOKENS[t]));
        b
    }
}

/// What a store hands back for `b`: the wire schema omits an empty token and reads it back as
/// absent.
fn stored_form(mut b: Binding) -> Binding {
    if b.traffic_token.as_ref().is_some_and(Secret::is_empty) {
        b.traffic_token = None;
    }
    b
}

// ---- the harness ------------------------------------------------------------------------------

/// What the random sequences reached (`--nocapture` prints it), so a weight change that stops
/// reaching a branch shows.
type Seen = Mutex<BTreeMap<String, usize>>;

fn saw(seen: &Seen, what: &str) {
    *seen.lock().unwrap().entry(what.to_owned()).or_default() += 1;
}

struct HeldLock {
    key: usize,
    inst: usize,
    lock: LifecycleLock,
}

struct HeldRewind {
    key: usize,
    inst: usize,
    lock: RewindLock,
}

struct Harness<'a> {
    stores: [RedisBindingStore; 2],
    keys: Vec<BindingKey>,
    model: Vec<KeyModel>,
    locks: Vec<HeldLock>,
    rewinds: Vec<HeldRewind>,
    seen: &'a Seen,
}

type Step = Result<(), String>;

fn store_err(what: &str, e: &Error) -> String {
    format!("{what}: unexpected store error: {e}")
}

macro_rules! check_eq {
    ($actual:expr, $expected:expr, $($what:tt)+) => {{
        let (actual, expected) = (&$actual, &$expected);
        if actual != expected {
            return Err(format!(
                "{}: store answered {actual:?}, the model expected {expected:?}",
                format_args!($($what)+)
            ));
        }
    }};
}

fn refusal_code(result: &Result<(), Error>) -> Result<Option<ErrorCode>, String> {
    match result {
        Ok(()) => Ok(None),
        Err(e) if e.kind() == ErrorKind::Conflict => Ok(e.code()),
        Err(e) => Err(format!("expected a conflict refusal or success, got {e}")),
    }
}

async fn connect(url: &str, namespace: &str) -> RedisBindingStore {
    let mut config = RedisStoreConfig::new(
        Topology::Standalone {
            url: url.to_owned(),
        },
        namespace,
    );
    // Renewed every 667 ms, so a case that holds a lock across a few probes exercises
    // renewal, with over a second of slack for a loaded machine.
    config.lock_lease = Duration::from_secs(2);
    config.turn_lease_ttl = LONG_LEASE;
    config.rewind_ttl = LONG_LEASE;
    config.invalidate_lock_wait = INVALIDATE_LOCK_WAIT;
    config.command_timeout = Duration::from_secs(2);
    config.connect_timeout = Duration::from_secs(5);
    RedisBindingStore::connect(config).await.unwrap()
}

impl Harness<'_> {
    fn store(&self, inst: usize) -> &RedisBindingStore {
        &self.stores[inst]
    }

    /// The `(provider, sandbox)` a target names.
    fn resolve(&self, k: usize, target: &Target) -> (Provider, SandboxId) {
        let m = &self.model[k];
        let from = |b: &Option<Binding>| b.as_ref().map(|b| (b.provider, b.sandbox_id.clone()));
        // An unbound key matches nothing, so any pair will do.
        let fallback = || (Provider::Docker, SandboxId::new(SANDBOXES[0]).unwrap());
        match target {
            Target::Current => from(&m.binding).unwrap_or_else(fallback),
            Target::AsCreated => from(&m.as_created).unwrap_or_else(fallback),
            Target::Other(p, s) => (*p, SandboxId::new(SANDBOXES[*s]).unwrap()),
        }
    }

    /// The whole `expected` binding a token patch is given.
    fn expected_binding(&self, k: usize, target: &Target) -> Binding {
        let m = &self.model[k];
        let picked = match target {
            Target::Current => m.binding.clone(),
            Target::AsCreated => m.as_created.clone(),
            Target::Other(..) => None,
        };
        picked.unwrap_or_else(|| {
            let (provider, sandbox) = self.resolve(k, target);
            Binding::new(
                &self.keys[k],
                provider,
                sandbox,
                TemplateId::new(TEMPLATES[0]).unwrap(),
                at(CREATED[0]),
            )
        })
    }

    async fn lock_key_exists(&self, k: usize) -> Result<bool, String> {
        let raw = self.stores[0].keys_of(&self.keys[k]).lock;
        let n: i64 = self.stores[0]
            .client()
            .exists(raw)
            .await
            .map_err(|e| format!("EXISTS on the lock key: {e}"))?;
        Ok(n > 0)
    }

    /// Polls until `done` answers true, within [`EVENTUALLY`].
    async fn eventually<F, Fut>(&self, what: &str, mut done: F) -> Step
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool, String>>,
    {
        let start = Instant::now();
        loop {
            if done().await? {
                return Ok(());
            }
            if start.elapsed() > EVENTUALLY {
                return Err(format!("{what}: still not the case after {EVENTUALLY:?}"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn step(&mut self, op: &Op) -> Step {
        saw(self.seen, op.name());
        match op {
            Op::Get { inst, key } => {
                let got = self
                    .store(*inst)
                    .get(&self.keys[key.0])
                    .await
                    .map_err(|e| store_err("get", &e))?;
                check_eq!(got, self.model[key.0].binding, "get");
            }
            Op::Create { inst, key, spec } => {
                let k = key.0;
                let b = spec.build(&self.keys[k]);
                let created = self
                    .store(*inst)
                    .create(&self.keys[k], &b)
                    .await
                    .map_err(|e| store_err("create", &e))?;
                let expected = self.model[k].binding.is_none();
                check_eq!(created, expected, "create");
                if created {
                    let b = stored_form(b);
                    self.model[k].binding = Some(b.clone());
                    self.model[k].as_created = Some(b);
                }
                saw(self.seen, &format!("create.{created}"));
            }
            Op::CreateForeign { inst, key, spec } => {
                let owner = &self.keys[(key.0 + 1) % KEYS.len()];
                let b = spec.build(owner);
                match self.store(*inst).create(&self.keys[key.0], &b).await {
                    Err(e) if e.kind() == ErrorKind::InvalidRequest => {}
                    other => {
                        return Err(format!(
                            "create of {owner}'s binding under {key:?}: expected invalid_request, got {other:?}"
                        ));
                    }
                }
            }
            Op::RaceCreate { key, first, second } => {
                let k = key.0;
                let (a, b) = (first.build(&self.keys[k]), second.build(&self.keys[k]));
                let (ra, rb) = tokio::join!(
                    self.stores[0].create(&self.keys[k], &a),
                    self.stores[1].create(&self.keys[k], &b)
                );
                let ra = ra.map_err(|e| store_err("race create (replica 0)", &e))?;
                let rb = rb.map_err(|e| store_err("race create (replica 1)", &e))?;
                if self.model[k].binding.is_some() {
                    check_eq!((ra, rb), (false, false), "race create on a bound key");
                } else {
                    let winner = match (ra, rb) {
                        (true, false) => a,
                        (false, true) => b,
                        other => {
                            return Err(format!(
                                "race create on an unbound key: exactly one replica must win, got {other:?}"
                            ));
                        }
                    };
                    let winner = stored_form(winner);
                    self.model[k].binding = Some(winner.clone());
                    self.model[k].as_created = Some(winner);
                    saw(self.seen, "race_create.won");
                }
            }
            Op::DeleteIfMatch { inst, key, target } => {
                let k = key.0;
                let (provider, sandbox) = self.resolve(k, target);
                let deleted = self
                    .store(*inst)
                    .delete_if_match(&self.keys[k], provider, &sandbox)
                    .await
                    .map_err(|e| store_err("delete_if_match", &e))?;
                let expected = self.model[k]
                    .binding
                    .as_ref()
                    .is_some_and(|b| b.provider == provider && b.sandbox_id == sandbox);
                check_eq!(
                    deleted,
                    expected,
                    "delete_if_match({provider:?}, {sandbox})"
                );
                if deleted {
                    self.model[k].binding = None;
                    self.model[k].as_created = None;
                }
                saw(self.seen, &format!("delete_if_match.{deleted}"));
            }
            Op::ReplaceToken {
                inst,
                key,
                target,
                token,
            } => {
                let k = key.0;
                let expected_binding = self.expected_binding(k, target);
                let current_token = self.model[k]
                    .binding
                    .as_ref()
                    .and_then(|b| b.traffic_token.clone());
                let token = match token {
                    TokenChoice::Same => current_token.unwrap_or_else(|| Secret::new(TOKENS[0])),
                    TokenChoice::Empty => Secret::new(""),
                    TokenChoice::Pool(i) => Secret::new(TOKENS[*i]),
                };
                let replaced = self
                    .store(*inst)
                    .replace_traffic_token_if_match(&self.keys[k], &expected_binding, &token)
                    .await
                    .map_err(|e| store_err("replace_traffic_token_if_match", &e))?;
                // Only provider and sandbox of `expected` count; the token only patches.
                let expected = !token.is_empty()
                    && self.model[k].binding.as_ref().is_some_and(|b| {
                        b.provider == expected_binding.provider
                            && b.sandbox_id == expected_binding.sandbox_id
                            && b.traffic_token.as_ref() != Some(&token)
                    });
                check_eq!(
                    replaced,
                    expected,
                    "replace_traffic_token_if_match(expected {}/{}, token {:?})",
                    expected_binding.provider.as_str(),
                    expected_binding.sandbox_id,
                    token.expose()
                );
                if replaced && let Some(b) = self.model[k].binding.as_mut() {
                    b.traffic_token = Some(token);
                }
                saw(self.seen, &format!("replace_token.{replaced}"));
            }
            Op::Invalidate { inst, scope } => {
                let (tenant, config) = match scope {
                    Scope::OfKey(key) => (
                        self.keys[key.0].tenant,
                        self.model[key.0]
                            .binding
                            .as_ref()
                            .and_then(|b| b.config_id.clone())
                            .unwrap_or_else(|| ConfigId::new(CONFIGS[0]).unwrap()),
                    ),
                    Scope::Pool { tenant, config } => (
                        TenantId::new(TENANTS[*tenant]).unwrap(),
                        ConfigId::new(CONFIGS[*config]).unwrap(),
                    ),
                };
                self.invalidate(*inst, tenant, &config).await?;
            }
            Op::Lock { inst, key } => {
                let k = key.0;
                let acquire = self.stores[*inst].lock_lifecycle(&self.keys[k]);
                if let Some(holder) = self.model[k].lock {
                    match tokio::time::timeout(PROBE, acquire).await {
                        Err(_elapsed) => saw(self.seen, "lock.refused_while_held"),
                        Ok(got) => {
                            return Err(format!(
                                "lock of {key:?} by replica {inst} while replica {holder} holds it: expected no grant within {PROBE:?}, got {:?}",
                                got.map(|_| "a lock")
                            ));
                        }
                    }
                } else {
                    let lock = tokio::time::timeout(EVENTUALLY, acquire)
                        .await
                        .map_err(|_| {
                            format!("lock of free key {key:?} not granted in {EVENTUALLY:?}")
                        })?
                        .map_err(|e| store_err("lock_lifecycle", &e))?;
                    self.model[k].lock = Some(*inst);
                    self.locks.push(HeldLock {
                        key: k,
                        inst: *inst,
                        lock,
                    });
                    saw(self.seen, "lock.granted");
                }
            }
            Op::RaceLock { key } => self.race_lock(*key).await?,
            Op::Release { which } => {
                if self.locks.is_empty() {
                    return Ok(());
                }
                let held = self.locks.remove(which % self.locks.len());
                if let Some(reason) = held.lock.ownership().loss_reason() {
                    return Err(format!(
                        "lock of {:?} (replica {}) lost ownership while held: {reason}",
                        Key(held.key),
                        held.inst
                    ));
                }
                held.lock.release().await.map_err(|e| {
                    format!(
                        "release of {:?} (replica {}): {e}",
                        Key(held.key),
                        held.inst
                    )
                })?;
                self.model[held.key].lock = None;
                saw(self.seen, "release.held");
            }
            Op::DropLock { which } => {
                if self.locks.is_empty() {
                    return Ok(());
                }
                let held = self.locks.remove(which % self.locks.len());
                let k = held.key;
                drop(held);
                // The drop releases in the background; the key must come free soon after.
                self.eventually("the dropped lock's key is gone", || async {
                    Ok(!self.lock_key_exists(k).await?)
                })
                .await?;
                self.model[k].lock = None;
                saw(self.seen, "drop_lock.held");
            }
            Op::BeginTurn { inst, key } => {
                let k = key.0;
                let turns = self.store(*inst).turn_leases().unwrap();
                let code = refusal_code(&turns.begin_turn(&self.keys[k]).await)?;
                let m = &mut self.model[k];
                let expected = m.rewind.then_some(ErrorCode::SessionRewindLocked);
                check_eq!(code, expected, "begin_turn");
                if code.is_none() {
                    let turn = m.turn.get_or_insert(Turn {
                        refs: 0,
                        // The first hold of a turn allows its one rebuild.
                        rebuild: true,
                    });
                    turn.refs += 1;
                }
                saw(self.seen, &format!("begin_turn.{code:?}"));
            }
            Op::EndTurn { inst, key } => {
                let k = key.0;
                let turns = self.store(*inst).turn_leases().unwrap();
                turns
                    .end_turn(&self.keys[k])
                    .await
                    .map_err(|e| store_err("end_turn", &e))?;
                let m = &mut self.model[k];
                if let Some(turn) = m.turn.as_mut() {
                    turn.refs -= 1;
                    if turn.refs == 0 {
                        m.turn = None;
                    }
                }
            }
            Op::TurnState { inst, key } => {
                let k = key.0;
                let turns = self.store(*inst).turn_leases().unwrap();
                let state = turns
                    .turn_state(&self.keys[k])
                    .await
                    .map_err(|e| store_err("turn_state", &e))?;
                check_eq!(state, self.model[k].turn_state(), "turn_state");
            }
            Op::ConsumeRebuild { inst, key } => {
                let k = key.0;
                let turns = self.store(*inst).turn_leases().unwrap();
                turns
                    .consume_turn_rebuild(&self.keys[k])
                    .await
                    .map_err(|e| store_err("consume_turn_rebuild", &e))?;
                // Never creates a lease: an empty one would read as an open turn.
                if let Some(turn) = self.model[k].turn.as_mut() {
                    turn.rebuild = false;
                }
            }
            Op::LockRewind { inst, key } => {
                let k = key.0;
                let rewinds = self.store(*inst).rewind_locks().unwrap();
                let result = rewinds.try_lock_rewind(&self.keys[k]).await;
                let m = &self.model[k];
                let expected = if m.turn.is_some() {
                    Some(ErrorCode::SessionTurnActive)
                } else if !m.activities.is_empty() {
                    Some(ErrorCode::SessionWorkActive)
                } else if m.rewind {
                    Some(ErrorCode::SessionRewindLocked)
                } else {
                    None
                };
                let (code, lock) = match result {
                    Ok(lock) => (None, Some(lock)),
                    Err(e) => (refusal_code(&Err(e))?, None),
                };
                check_eq!(code, expected, "try_lock_rewind");
                if let Some(lock) = lock {
                    self.model[k].rewind = true;
                    self.rewinds.push(HeldRewind {
                        key: k,
                        inst: *inst,
                        lock,
                    });
                }
                saw(self.seen, &format!("lock_rewind.{code:?}"));
            }
            Op::ReleaseRewind { which } => {
                if self.rewinds.is_empty() {
                    return Ok(());
                }
                let held = self.rewinds.remove(which % self.rewinds.len());
                held.lock.release().await.map_err(|e| {
                    format!(
                        "rewind release of {:?} (replica {}): {e}",
                        Key(held.key),
                        held.inst
                    )
                })?;
                self.model[held.key].rewind = false;
                saw(self.seen, "release_rewind.held");
            }
            Op::DropRewind { which } => {
                if self.rewinds.is_empty() {
                    return Ok(());
                }
                let held = self.rewinds.remove(which % self.rewinds.len());
                let k = held.key;
                drop(held);
                let rewinds = self.stores[0].rewind_locks().unwrap();
                self.eventually("the dropped rewind lock is gone", || async {
                    rewinds
                        .has_rewind_lock(&self.keys[k])
                        .await
                        .map(|held| !held)
                        .map_err(|e| store_err("has_rewind_lock", &e))
                })
                .await?;
                self.model[k].rewind = false;
                saw(self.seen, "drop_rewind.held");
            }
            Op::AddActivity {
                inst,
                key,
                id,
                kind,
                started,
                cap,
            } => {
                let k = key.0;
                let activity = BackgroundActivity {
                    id: ACTIVITY_IDS[*id].to_owned(),
                    kind: ACTIVITY_KINDS[*kind].to_owned(),
                    started_at: at(STARTED[*started]),
                };
                let registry = self.store(*inst).activities().unwrap();
                let result = registry
                    .add(&self.keys[k], &activity, LONG_LEASE, *cap)
                    .await;
                let m = &mut self.model[k];
                // Re-adding a live id refreshes it (a retried registration takes no second
                // slot); otherwise the kind's live count must stay under the cap.
                let same_kind = m
                    .activities
                    .values()
                    .filter(|(kind, _)| *kind == activity.kind)
                    .count();
                let allowed = m.activities.contains_key(&activity.id) || same_kind < *cap;
                match (&result, allowed) {
                    (Ok(()), true) => {
                        m.activities.insert(
                            activity.id.clone(),
                            (activity.kind.clone(), activity.started_at),
                        );
                    }
                    (Err(e), false) if e.kind() == ErrorKind::Capacity => {}
                    _ => {
                        return Err(format!(
                            "add activity {activity:?} (cap {cap}): store answered {result:?}, the model expected {}",
                            if allowed {
                                "success"
                            } else {
                                "a capacity refusal"
                            }
                        ));
                    }
                }
                saw(self.seen, &format!("add_activity.{allowed}"));
            }
            Op::RemoveActivity { inst, key, id } => {
                let k = key.0;
                let registry = self.store(*inst).activities().unwrap();
                registry
                    .remove(&self.keys[k], ACTIVITY_IDS[*id])
                    .await
                    .map_err(|e| store_err("remove activity", &e))?;
                self.model[k].activities.remove(ACTIVITY_IDS[*id]);
            }
        }
        Ok(())
    }

    async fn invalidate(&mut self, inst: usize, tenant: TenantId, config: &ConfigId) -> Step {
        let before = OffsetDateTime::now_utc();
        let report = self.stores[inst]
            .invalidate_by_config(tenant, config)
            .await
            .map_err(|e| store_err("invalidate_by_config", &e))?;
        let after = OffsetDateTime::now_utc();

        let ours: Vec<usize> = (0..KEYS.len())
            .filter(|&k| self.keys[k].tenant == tenant)
            .collect();
        let markable = |k: usize| {
            self.model[k]
                .binding
                .as_ref()
                .is_some_and(|b| b.config_id.as_ref() == Some(config) && b.stale_at.is_none())
        };
        let locked = |k: usize| self.model[k].lock.is_some();
        let will_mark: Vec<usize> = ours
            .iter()
            .copied()
            .filter(|&k| markable(k) && !locked(k))
            .collect();
        // Exactly the locked sessions it should mark are reported (a session of another config
        // is never waited for).
        let must_fail: BTreeSet<&SessionId> = ours
            .iter()
            .filter(|&&k| markable(k) && locked(k))
            .map(|&k| &self.keys[k].session)
            .collect();
        let may_fail = must_fail.clone();
        let failed: BTreeSet<&SessionId> = report.failed.iter().map(|(s, _)| s).collect();
        let what = format!("invalidate_by_config({tenant}, {config}) on replica {inst}");
        check_eq!(report.marked, will_mark.len(), "{what}: marked");
        if !(must_fail.is_subset(&failed) && failed.is_subset(&may_fail))
            || failed.len() != report.failed.len()
        {
            return Err(format!(
                "{what}: failed sessions {:?}, the model expected all of {must_fail:?} and none outside {may_fail:?}",
                report.failed
            ));
        }
        if let Some((s, e)) = report
            .failed
            .iter()
            .find(|(_, e)| e.kind() != ErrorKind::Timeout)
        {
            return Err(format!(
                "{what}: session {s} failed with {e}, expected a lock-wait timeout"
            ));
        }
        for k in will_mark {
            let got = self.stores[inst]
                .get(&self.keys[k])
                .await
                .map_err(|e| store_err("get after invalidate", &e))?;
            let stale_at = got.and_then(|b| b.stale_at);
            match stale_at {
                Some(t) if before <= t && t <= after => {
                    // The rest of the binding is compared by the state check after the step.
                    if let Some(b) = self.model[k].binding.as_mut() {
                        b.stale_at = Some(t);
                    }
                }
                other => {
                    return Err(format!(
                        "{what}: {:?} should be marked stale between {before} and {after}, its stale_at is {other:?}",
                        Key(k)
                    ));
                }
            }
        }
        saw(
            self.seen,
            &format!(
                "invalidate.marked={}.failed={}",
                report.marked,
                report.failed.len()
            ),
        );
        Ok(())
    }

    async fn race_lock(&mut self, key: Key) -> Step {
        let k = key.0;
        let bk = &self.keys[k];
        if let Some(holder) = self.model[k].lock {
            let (a, b) = tokio::join!(
                tokio::time::timeout(PROBE, self.stores[0].lock_lifecycle(bk)),
                tokio::time::timeout(PROBE, self.stores[1].lock_lifecycle(bk))
            );
            if a.is_ok() || b.is_ok() {
                return Err(format!(
                    "race for {key:?} held by replica {holder}: expected no grant within {PROBE:?}, replica 0 {}, replica 1 {}",
                    if a.is_ok() { "finished" } else { "waited" },
                    if b.is_ok() { "finished" } else { "waited" },
                ));
            }
            saw(self.seen, "race_lock.refused_while_held");
            return Ok(());
        }
        let mut a = self.stores[0].lock_lifecycle(bk);
        let mut b = self.stores[1].lock_lifecycle(bk);
        let first = tokio::time::timeout(EVENTUALLY, async {
            tokio::select! {
                got = &mut a => (0, got),
                got = &mut b => (1, got),
            }
        })
        .await
        .map_err(|_| format!("race for free key {key:?}: nobody granted in {EVENTUALLY:?}"))?;
        let (winner, lock) = first;
        let lock = lock.map_err(|e| store_err("race lock", &e))?;
        // The loser keeps waiting; it must not be granted while the winner holds.
        let loser = if winner == 0 { b } else { a };
        if let Ok(got) = tokio::time::timeout(PROBE, loser).await {
            return Err(format!(
                "race for free key {key:?}: replica {winner} won, and replica {} also finished within {PROBE:?}: {:?}",
                1 - winner,
                got.map(|_| "a lock")
            ));
        }
        self.model[k].lock = Some(winner);
        self.locks.push(HeldLock {
            key: k,
            inst: winner,
            lock,
        });
        saw(self.seen, "race_lock.one_winner");
        Ok(())
    }

    /// Reads every key's whole state back through both replicas.
    async fn check_state(&self) -> Step {
        for (k, bk) in self.keys.iter().enumerate() {
            let m = &self.model[k];
            for (inst, store) in self.stores.iter().enumerate() {
                let on = format!("{:?} via replica {inst}", Key(k));
                let got = store.get(bk).await.map_err(|e| store_err("get", &e))?;
                check_eq!(got, m.binding, "binding of {on}");
                let state = store
                    .turn_leases()
                    .unwrap()
                    .turn_state(bk)
                    .await
                    .map_err(|e| store_err("turn_state", &e))?;
                check_eq!(state, m.turn_state(), "turn state of {on}");
                let rewind = store
                    .rewind_locks()
                    .unwrap()
                    .has_rewind_lock(bk)
                    .await
                    .map_err(|e| store_err("has_rewind_lock", &e))?;
                check_eq!(rewind, m.rewind, "rewind lock of {on}");
                let activities = store
                    .activities()
                    .unwrap()
                    .list(bk)
                    .await
                    .map_err(|e| store_err("list activities", &e))?;
                check_eq!(activities, m.activity_list(), "activities of {on}");
            }
            let exists = self.lock_key_exists(k).await?;
            check_eq!(
                exists,
                m.lock.is_some(),
                "lifecycle lock key of {:?} present",
                Key(k)
            );
        }
        for held in &self.locks {
            if let Some(reason) = held.lock.ownership().loss_reason() {
                return Err(format!(
                    "lock of {:?} (replica {}) lost ownership while held: {reason}",
                    Key(held.key),
                    held.inst
                ));
            }
        }
        Ok(())
    }

    /// Runs the steps, checking the whole state after each.
    async fn run(&mut self, ops: &[Op]) -> Result<(), TestCaseError> {
        for (i, op) in ops.iter().enumerate() {
            self.step(op)
                .await
                .map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
            self.check_state()
                .await
                .map_err(|e| TestCaseError::fail(format!("after step {i} {op:?}: {e}")))?;
        }
        Ok(())
    }

    /// Releases what is still held, deletes the case's keys and closes both clients, also after
    /// a failed case: shrinking replays hundreds of cases, and none may leave connections or
    /// keys behind on the shared Redis. The first error is reported; the rest still runs.
    async fn finish(mut self) -> Step {
        let mut errors = Vec::new();
        for held in self.locks.drain(..) {
            if let Err(e) = held.lock.release().await {
                errors.push(format!(
                    "final release of {:?} (replica {}): {e}",
                    Key(held.key),
                    held.inst
                ));
            }
        }
        for held in self.rewinds.drain(..) {
            if let Err(e) = held.lock.release().await {
                errors.push(format!("final rewind release of {:?}: {e}", Key(held.key)));
            }
        }
        for bk in &self.keys {
            let keys = self.stores[0].keys_of(bk);
            let all = vec![
                keys.binding,
                keys.lock,
                keys.turn,
                keys.rewind,
                keys.activity,
            ];
            if let Err(e) = self.stores[0].client().del::<i64, _>(all).await {
                errors.push(format!("cleanup: {e}"));
            }
        }
        for store in &self.stores {
            if let Err(e) = fred::interfaces::ClientLike::quit(store.client()).await {
                errors.push(format!("quit: {e}"));
            }
        }
        errors.into_iter().next().map_or(Ok(()), Err)
    }
}

async fn run_case(url: &str, ops: &[Op], seen: &Seen) -> Result<(), TestCaseError> {
    let namespace = format!("tmodel-{:016x}", fastrand::u64(..));
    let stores = [
        connect(url, &namespace).await,
        connect(url, &namespace).await,
    ];
    let mut h = Harness {
        stores,
        keys: binding_keys(),
        model: vec![KeyModel::default(); KEYS.len()],
        locks: Vec::new(),
        rewinds: Vec::new(),
        seen,
    };
    let result = h.run(ops).await;
    let finished = h.finish().await;
    result?;
    finished.map_err(TestCaseError::fail)
}

#[test]
#[ignore = "needs Redis: cargo xtask test runs it"]
fn two_replicas_agree_with_the_model() {
    let url = std::env::var("SANDBOX_TEST_REDIS_URL")
        .expect("SANDBOX_TEST_REDIS_URL: run through `cargo xtask test`");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let seen = Seen::default();
    let defaults = Config::default();
    let mut runner = TestRunner::new(Config {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            defaults.cases
        } else {
            CASES
        },
        failure_persistence: None,
        // Every shrink step replays against Redis, and probes cost real time: bound shrinking.
        max_shrink_iters: 512,
        max_shrink_time: 60_000,
        ..defaults
    });
    let started = Instant::now();
    let result = runner.run(&prop::collection::vec(op(), 1..=MAX_STEPS), |ops| {
        rt.block_on(run_case(&url, &ops, &seen))
    });
    for (what, n) in seen.lock().unwrap().iter() {
        eprintln!("{what:45} {n}");
    }
    eprintln!("model run took {:?}", started.elapsed());
    if let Err(e) = result {
        panic!("{e}");
    }
}
