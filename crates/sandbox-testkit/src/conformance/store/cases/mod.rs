//! The store cases, one file per concern; the table below registers each with the features it
//! needs and the contract tags of `sandbox_core::ports::store` it cites.
//!
//! Key validation is a property of `BindingKey`'s constructor, checked in `sandbox-core`; a
//! store can only ever be handed valid keys. A cancelled call is, in Rust, a dropped future:
//! `lock_cancelled_wait_leaves_nothing` covers the lock; a dropped `begin_turn` is a call that
//! never happened.

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
    vec![case!(
        declared::declared_features_match,
        [],
        ["optional.fixed"]
    )]
}

/// Every store case but the declaration case.
pub fn all_store_cases() -> Vec<StoreCase> {
    vec![
        // Bindings.
        case!(bindings::create_if_absent, [], ["create.absent"]),
        case!(
            bindings::create_refuses_foreign_identity,
            [],
            ["create.validate", "errors.origin"]
        ),
        case!(bindings::binding_round_trips, [], ["get.round_trip"]),
        case!(bindings::delete_if_match_exact, [], ["delete.match"]),
        case!(bindings::tenants_are_isolated, [], ["tenant.isolated"]),
        case!(
            bindings::token_patch_touches_only_the_token,
            [],
            ["token.patch"]
        ),
        case!(
            bindings::token_patch_keeps_concurrent_stale_mark,
            [],
            ["token.patch"]
        ),
        // Backing faults.
        case!(
            backing::malformed_value_is_an_error,
            [RawValues],
            ["get.malformed", "errors.origin"]
        ),
        case!(
            backing::foreign_value_is_an_error,
            [RawValues],
            ["get.malformed", "errors.origin"]
        ),
        case!(
            backing::outage_fails_closed,
            [Outage],
            ["lock.fail_closed", "errors.origin"]
        ),
        // The lifecycle lock.
        case!(
            lock::lock_serializes_across_instances,
            [],
            ["lock.exclusive"]
        ),
        case!(
            lock::lock_different_keys_in_parallel,
            [],
            ["lock.exclusive"]
        ),
        case!(
            lock::lock_cancelled_wait_leaves_nothing,
            [],
            ["lock.cancel"]
        ),
        case!(
            lock::lock_release_and_drop_free_the_key,
            [],
            ["lock.ownership", "lock.exclusive"]
        ),
        // Turn leases.
        case!(leases::turn_lease_lifecycle, [TurnLeases], ["turn.lease"]),
        case!(
            leases::turn_consume_without_lease_creates_none,
            [TurnLeases],
            ["turn.absent"]
        ),
        case!(
            leases::turn_end_without_lease_is_harmless,
            [TurnLeases],
            ["turn.absent"]
        ),
        case!(
            leases::turn_lease_expires_unless_rearmed,
            [TurnLeases],
            ["turn.expiry"]
        ),
        // The rewind lock.
        case!(
            leases::rewind_lock_is_exclusive,
            [RewindLock],
            ["rewind.exclusive", "errors.origin"]
        ),
        case!(
            leases::rewind_lock_blocks_begin_turn,
            [RewindLock, TurnLeases],
            ["turn.rewind_locked", "errors.origin"]
        ),
        case!(
            leases::rewind_refused_while_turn_active,
            [RewindLock, TurnLeases],
            ["rewind.refusals"]
        ),
        case!(
            leases::rewind_lock_outlives_its_ttl,
            [RewindLock],
            ["rewind.kept_alive"]
        ),
        case!(
            leases::rewind_lock_survives_an_outage,
            [RewindLock, Outage],
            ["rewind.kept_alive"]
        ),
        // Background activities.
        case!(
            leases::activity_cap_per_kind,
            [Activities],
            ["activities.add", "activities.remove", "errors.origin"]
        ),
        case!(
            leases::activity_renew_and_remove,
            [Activities],
            ["activities.renew", "activities.remove", "activities.list"]
        ),
        case!(
            leases::activity_lease_expires,
            [Activities],
            ["activities.list"]
        ),
        case!(
            leases::live_activity_holds_the_turn,
            [Activities, TurnLeases],
            ["activities.hold"]
        ),
        case!(
            leases::live_activity_refuses_rewind,
            [Activities, RewindLock],
            ["activities.hold", "rewind.refusals"]
        ),
        // Invalidation.
        case!(
            invalidate::invalidate_marks_only_tenant_and_config,
            [],
            ["invalidate.marks"]
        ),
        case!(
            invalidate::invalidate_reports_a_locked_session,
            [],
            ["invalidate.locked", "errors.origin"]
        ),
        case!(
            invalidate::invalidate_waits_for_a_briefly_held_lock,
            [],
            ["invalidate.locked"]
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
