//! The template catalog: the standard template can be ensured and is then listed.

use sandbox_core::narrow;

use super::super::{CaseResult, Ctx, Failure, ensure};

pub(super) async fn template_catalog_has_standard(ctx: &Ctx) -> CaseResult {
    let catalog = narrow::template_catalog(ctx.provider())
        .ok_or_else(|| Failure("template_catalog declared but not callable".to_owned()))?;
    let standard = catalog.ensure_standard_template().await?;
    let listed = catalog.list_templates().await?;
    ensure(listed.iter().any(|t| t.id == standard.id), || {
        format!("list_templates lacks the standard template {}", standard.id)
    })
}
