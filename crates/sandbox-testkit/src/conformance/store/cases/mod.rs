//! The store cases, one file per concern; the table below registers each with the features it
//! needs and what it cites (port contract tags, and `invariant.N` for item N of the reference's
//! §3 checklist).
//!
//! Invariant 1 (key validation) is a property of `BindingKey`'s constructor, checked in
//! `sandbox-core`; a store can only ever be handed valid keys. The reference's "cancelled
//! context" items (8, 10) are, in Rust, dropped futures: `lock_cancelled_wait_leaves_nothing`
//! covers the lock; a dropped `begin_turn` is a call that never happened.

mod backing;
mod bindings;
mod declared;
mod invalidate;
mod leases;
mod lock;

use super::{StoreCase, StoreFeature};

macro_rules! case {
    ($module:ident :: $name:ident, [$($req:ident),*], [$($cite:literal),*]) => {
        StoreCase {
            name: concat!("store_", stringify!($name)),
            requires: &[$(StoreFeature::$req),*],
            forbids: &[],
            cites: &[$($cite),*],
            run: |ctx| Box::pin($module::$name(ctx)),
        }
    };
}

/// The case about the declaration itself, which every store runs before the others.
pub(super) fn declaration_cases() -> Vec<StoreCase> {
    vec![case!(declared::declared_features_match, [], ["features"])]
}

/// Every store case but the declaration case.
pub fn all_store_cases() -> Vec<StoreCase> {
    vec![
        // Bindings.
        case!(
            bindings::create_if_absent,
            [],
            ["create.absent", "invariant.3"]
        ),
        case!(
            bindings::create_refuses_foreign_identity,
            [],
            ["create.validate", "errors.origin", "invariant.2"]
        ),
        case!(bindings::binding_round_trips, [], ["invariant.2"]),
        case!(
            bindings::delete_if_match_exact,
            [],
            ["delete_if_match", "invariant.4"]
        ),
        case!(bindings::tenants_are_isolated, [], ["invariant.5"]),
        case!(
            bindings::token_patch_touches_only_the_token,
            [],
            ["replace_traffic_token_if_match", "invariant.9"]
        ),
        case!(
            bindings::token_patch_keeps_concurrent_stale_mark,
            [],
            ["replace_traffic_token_if_match", "invariant.9"]
        ),
        // Backing faults.
        case!(
            backing::malformed_value_is_an_error,
            [RawValues],
            ["get.malformed", "errors.origin", "invariant.6"]
        ),
        case!(
            backing::foreign_value_is_an_error,
            [RawValues],
            ["get.malformed", "errors.origin", "invariant.6"]
        ),
        case!(
            backing::outage_fails_closed,
            [Outage],
            ["lock.fail_closed", "errors.origin", "invariant.7"]
        ),
        // The lifecycle lock.
        case!(
            lock::lock_serializes_across_instances,
            [],
            ["lock.exclusive", "invariant.8"]
        ),
        case!(
            lock::lock_different_keys_in_parallel,
            [],
            ["lock.exclusive", "invariant.8"]
        ),
        case!(
            lock::lock_cancelled_wait_leaves_nothing,
            [],
            ["lock.cancel", "invariant.8"]
        ),
        case!(
            lock::lock_release_and_drop_free_the_key,
            [],
            ["lock.ownership", "lock.exclusive", "invariant.8"]
        ),
        // Turn leases.
        case!(
            leases::turn_lease_lifecycle,
            [TurnLeases],
            ["turn_leases", "invariant.10"]
        ),
        case!(
            leases::turn_consume_without_lease_creates_none,
            [TurnLeases],
            ["turn_leases", "invariant.10"]
        ),
        case!(
            leases::turn_end_without_lease_is_harmless,
            [TurnLeases],
            ["turn_leases", "invariant.10"]
        ),
        case!(
            leases::turn_lease_expires_unless_rearmed,
            [TurnLeases],
            ["turn_leases", "reference.2.2.turn_lease"]
        ),
        // The rewind lock.
        case!(
            leases::rewind_lock_is_exclusive,
            [RewindLock],
            ["rewind_locks", "errors.origin", "invariant.11"]
        ),
        case!(
            leases::rewind_lock_blocks_begin_turn,
            [RewindLock, TurnLeases],
            [
                "rewind_locks",
                "turn_leases",
                "errors.origin",
                "invariant.11"
            ]
        ),
        case!(
            leases::rewind_refused_while_turn_active,
            [RewindLock, TurnLeases],
            ["rewind_locks", "invariant.11"]
        ),
        case!(
            leases::rewind_lock_outlives_its_ttl,
            [RewindLock],
            ["rewind_locks", "invariant.11"]
        ),
        case!(
            leases::rewind_lock_survives_an_outage,
            [RewindLock, Outage],
            ["rewind_locks", "invariant.11"]
        ),
        // Background activities.
        case!(
            leases::activity_cap_per_kind,
            [Activities],
            ["activities.add", "errors.origin"]
        ),
        case!(
            leases::activity_renew_and_remove,
            [Activities],
            ["activities.renew", "activities.remove"]
        ),
        case!(
            leases::activity_lease_expires,
            [Activities],
            ["activities.list"]
        ),
        case!(
            leases::live_activity_holds_the_turn,
            [Activities, TurnLeases],
            ["turn_leases", "activities"]
        ),
        case!(
            leases::live_activity_refuses_rewind,
            [Activities, RewindLock],
            ["rewind_locks", "activities"]
        ),
        // Invalidation.
        case!(
            invalidate::invalidate_marks_only_tenant_and_config,
            [],
            ["invalidate_by_config", "invariant.12"]
        ),
        case!(
            invalidate::invalidate_reports_a_locked_session,
            [],
            ["invalidate_by_config", "errors.origin", "invariant.12"]
        ),
        case!(
            invalidate::invalidate_waits_for_a_briefly_held_lock,
            [],
            ["invalidate_by_config", "invariant.12"]
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_prefixed() {
        let cases = all_store_cases();
        let names: HashSet<&str> = cases.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), cases.len());
        assert!(cases.iter().all(|c| c.name.starts_with("store_")));
        assert!(cases.iter().all(|c| !c.cites.is_empty()));
    }
}
