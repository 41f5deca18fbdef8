//! The deadline cases, one file per concern; the table below registers each with the features
//! it needs and the contract tags of `sandbox_core::ports::deadlines` it cites.

mod basics;
mod declared;
mod due;

use super::{DeadlineCase, DeadlineFeature};

macro_rules! case {
    ($module:ident :: $name:ident, [$($req:ident),*], [$($cite:literal),*]) => {
        DeadlineCase {
            name: concat!("deadlines_", stringify!($name)),
            requires: &[$(DeadlineFeature::$req),*],
            forbids: &[],
            cites: &[$($cite),*],
            run: |ctx| Box::pin($module::$name(ctx)),
        }
    };
}

/// The case about the declaration itself, which every target runs before the others. It checks
/// the target, not a port contract, so it cites no tag.
pub(super) fn declaration_cases() -> Vec<DeadlineCase> {
    vec![case!(declared::declared_features_match, [], [])]
}

/// Every deadline case but the declaration case.
pub fn all_deadline_cases() -> Vec<DeadlineCase> {
    vec![
        case!(
            basics::set_get_replace,
            [],
            ["deadlines.set", "deadlines.get", "deadlines.replace"]
        ),
        case!(
            basics::remove_absent_is_ok,
            [],
            ["deadlines.remove", "deadlines.get"]
        ),
        case!(basics::keys_are_independent, [], ["deadlines.keys"]),
        case!(
            basics::concurrent_sets_all_land,
            [],
            ["deadlines.concurrent", "deadlines.set"]
        ),
        case!(
            basics::invalid_keys_are_refused,
            [],
            ["deadlines.key", "deadlines.origin"]
        ),
        case!(
            basics::out_of_range_instants_are_refused,
            [],
            ["deadlines.range", "deadlines.origin"]
        ),
        case!(
            basics::durable_across_reopen,
            [Reopen],
            ["deadlines.durable"]
        ),
        case!(due::due_exactly_earliest_first, [], ["deadlines.due"]),
        case!(
            due::due_respects_limit,
            [],
            ["deadlines.due", "deadlines.replace"]
        ),
        case!(due::far_future_is_not_due, [], ["deadlines.far"]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_prefixed() {
        let cases = all_deadline_cases();
        let names: HashSet<&str> = cases.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), cases.len());
        assert!(cases.iter().all(|c| c.name.starts_with("deadlines_")));
        assert!(cases.iter().all(|c| !c.cites.is_empty()));
    }
}
