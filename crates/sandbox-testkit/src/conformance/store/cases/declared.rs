//! The case every store runs about its declaration itself: the target claims the pinned
//! feature set, and each claimed part or hook is really there.

use super::super::{StoreCtx, StoreFeature};
use crate::conformance::{CaseResult, ensure, ensure_eq};

/// The target claims exactly the pinned set, and each claim is backed: the store (and its
/// peer) hand out the optional part, the target carries the hook. A feature declared but not
/// callable, or callable but not declared, would make cases vanish or fail for the wrong reason.
pub(super) async fn declared_features_match(ctx: &StoreCtx) -> CaseResult {
    let target = ctx.target();
    ensure_eq("declared store features", target.features, ctx.pinned())?;
    let f = target.features;
    for (which, store) in [("store", ctx.store()), ("peer", ctx.peer())] {
        let pairs = [
            (
                StoreFeature::TurnLeases,
                f.turn_leases,
                store.turn_leases().is_some(),
            ),
            (
                StoreFeature::RewindLock,
                f.rewind_lock,
                store.rewind_locks().is_some(),
            ),
            (
                StoreFeature::Activities,
                f.activities,
                store.activities().is_some(),
            ),
        ];
        for (feature, declared, callable) in pairs {
            ensure(declared == callable, || {
                format!("{which}: feature {feature}: declared={declared} but callable={callable}")
            })?;
        }
    }
    let hooks = [
        (
            StoreFeature::RawValues,
            f.raw_values,
            target.plant_raw.is_some(),
        ),
        (
            StoreFeature::Outage,
            f.outage,
            target.take_down.is_some() && target.bring_up.is_some(),
        ),
    ];
    for (feature, declared, hooked) in hooks {
        ensure(declared == hooked, || {
            format!("feature {feature}: declared={declared} but the target hook present={hooked}")
        })?;
    }
    Ok(())
}
