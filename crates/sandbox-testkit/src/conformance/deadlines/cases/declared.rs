//! The case every deadline target runs about its declaration: the target claims the pinned
//! feature set, and each claimed part is really there.

use super::super::DeadlineCtx;
use crate::conformance::{CaseResult, ensure, ensure_eq};

/// The target claims exactly the pinned set, and carries the peer and the reopen hook exactly
/// when it claims them: a feature declared but missing, or present but undeclared, would make
/// cases vanish or fail for the wrong reason.
pub(super) async fn declared_features_match(ctx: &DeadlineCtx) -> CaseResult {
    let target = ctx.target();
    ensure_eq("declared deadline features", target.features, ctx.pinned())?;
    ensure(target.features.peer == target.peer.is_some(), || {
        format!(
            "feature peer: declared={} but a peer present={}",
            target.features.peer,
            target.peer.is_some()
        )
    })?;
    ensure(target.features.reopen == target.reopen.is_some(), || {
        format!(
            "feature reopen: declared={} but a reopen hook present={}",
            target.features.reopen,
            target.reopen.is_some()
        )
    })
}
