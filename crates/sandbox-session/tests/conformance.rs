//! The binding-store conformance suite against the memory store (adapter `memory`).
//!
//! Runs in plain `cargo test`, and through `cargo xtask conformance memory`. The memory store
//! keeps typed values and lives in this process, so the cases needing raw bytes or an outage are
//! not applicable to it; every other case is.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{Clock, ManualClock, SystemClock};
use sandbox_session::memory_store::{
    DEFAULT_REWIND_TTL, DEFAULT_TURN_LEASE_TTL, MemoryBindingStore,
};
use sandbox_testkit::conformance::store::{
    StoreFeature, StoreFeatures, StoreTarget, StoreTiming, run_store_main,
};

/// The set the memory store must declare, written out independently of the store.
fn required() -> StoreFeatures {
    StoreFeatures::of(&[
        StoreFeature::TurnLeases,
        StoreFeature::RewindLock,
        StoreFeature::Activities,
    ])
}

/// Short enough that the invalidation cases take about a second; the store's default is 2 s.
const INVALIDATE_LOCK_WAIT: Duration = Duration::from_secs(1);

fn target() -> StoreTarget {
    // Lease expiry follows a manual clock the cases move, so the real default TTLs (30 min
    // for a turn lease, 2 min for the rewind lock) are exercised without waiting for them.
    let clock = ManualClock::new(SystemClock.now());
    let store = MemoryBindingStore::builder()
        .clock(Arc::new(clock.clone()))
        .invalidate_lock_wait(INVALIDATE_LOCK_WAIT)
        .build();
    StoreTarget::new(
        Arc::new(store.clone()),
        // A clone shares the store's state: a second instance on the same backing.
        Arc::new(store),
        required(),
        StoreTiming {
            turn_lease_ttl: DEFAULT_TURN_LEASE_TTL,
            rewind_ttl: DEFAULT_REWIND_TTL,
            invalidate_lock_wait: INVALIDATE_LOCK_WAIT,
        },
    )
    .with_clock(Arc::new(move |by| clock.advance(by)))
}

fn main() -> ExitCode {
    run_store_main(
        "memory",
        required(),
        Arc::new(|_namespace| Box::pin(async { Ok(target()) })),
    )
}
