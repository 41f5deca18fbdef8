//! Template builds: a build from an image on the backend boots for its tenant only, tags move
//! between builds, deletes are idempotent, and an absent image builds nothing.

use sandbox_core::{
    BuiltTemplate, CreateRequest, ErrorCode, ErrorKind, ListFilter, TEMPLATE_TENANT,
    TemplateBuildRequest, TemplateBuilds, TemplateId, TenantId, narrow,
};

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq};

fn builds(ctx: &Ctx) -> Result<&dyn TemplateBuilds, Failure> {
    narrow::template_builds(ctx.provider())
        .ok_or_else(|| Failure("template_builds declared but not callable".to_owned()))
}

fn tenant(raw: u32) -> Result<TenantId, Failure> {
    TenantId::new(u64::from(raw)).map_err(Failure::from)
}

/// A build of template `id` (the case's tokens are random per call, so the ID is passed).
fn request(
    ctx: &Ctx,
    tenant: TenantId,
    id: &str,
    build: &str,
    tags: &[&str],
) -> TemplateBuildRequest {
    TemplateBuildRequest {
        tenant,
        template_id: id.to_owned(),
        build_id: format!("{build}-{id}"),
        name: format!("name-{id}"),
        tags: tags.iter().map(|t| (*t).to_owned()).collect(),
        source_image: ctx.create_request().template.as_str().to_owned(),
    }
}

fn as_tenant(ctx: &Ctx, tenant: Option<TenantId>, template: &TemplateId) -> CreateRequest {
    let mut request = ctx.create_request();
    if let Some(t) = tenant {
        request
            .metadata
            .insert(TEMPLATE_TENANT.to_owned(), t.get().to_string());
    }
    request.template = template.clone();
    request
}

fn tags_of(listed: &[BuiltTemplate], build_id: &str) -> Vec<String> {
    let mut tags: Vec<String> = listed
        .iter()
        .filter(|b| b.build_id == build_id)
        .flat_map(|b| b.tags.clone())
        .collect();
    tags.sort();
    tags
}

pub(super) async fn template_build_boots_for_its_tenant_only(ctx: &Ctx) -> CaseResult {
    let builds = builds(ctx)?;
    let owner = tenant(ctx.int(1..=1_000_000))?;
    let other = tenant(ctx.int(1_000_001..=2_000_000))?;
    let id = format!("conf-{}", ctx.token());
    let first = request(ctx, owner, &id, "b1", &["default", "v1"]);
    let built = builds.build_template(&first).await?;
    let result = async {
        let listed = builds.list_built_templates(owner).await?;
        ensure_eq(
            "the new build's tags",
            tags_of(&listed, &first.build_id),
            vec!["default".to_owned(), "v1".to_owned()],
        )?;
        ensure(builds.list_built_templates(other).await?.is_empty(), || {
            "another tenant's listing shows the build".to_owned()
        })?;
        let h = ctx
            .create_with(as_tenant(ctx, Some(owner), &built.template))
            .await?;
        ctx.provider().get(h.id()).await?;
        let before = ctx
            .provider()
            .list(&ListFilter {
                metadata: ctx.metadata(),
                states: Vec::new(),
            })
            .await?
            .len();
        for (what, who) in [("another tenant", Some(other)), ("no tenant", None)] {
            match ctx
                .provider()
                .create(as_tenant(ctx, who, &built.template))
                .await
            {
                Ok(handle) => {
                    ctx.track(handle.id().clone());
                    return Err(Failure(format!("{what} booted the template")));
                }
                Err(e) => ensure(
                    e.kind() == ErrorKind::NotFound
                        && e.code() == Some(ErrorCode::TemplateNotFound),
                    || format!("{what}: expected template_not_found, got {e}"),
                )?,
            }
        }
        let after = ctx
            .provider()
            .list(&ListFilter {
                metadata: ctx.metadata(),
                states: Vec::new(),
            })
            .await?
            .len();
        ensure_eq("sandboxes after the refused creates", after, before)
    }
    .await;
    builds
        .delete_built_template(owner, &first.template_id)
        .await?;
    result
}

pub(super) async fn template_tags_move_and_deletes_are_idempotent(ctx: &Ctx) -> CaseResult {
    let builds = builds(ctx)?;
    let owner = tenant(ctx.int(1..=1_000_000))?;
    let id = format!("conf-{}", ctx.token());
    let first = request(ctx, owner, &id, "b1", &["default", "v1"]);
    builds.build_template(&first).await?;
    let result = async {
        // A second build takes `default`; the first keeps `v1`.
        let second = request(ctx, owner, &id, "b2", &["default"]);
        builds.build_template(&second).await?;
        let listed = builds.list_built_templates(owner).await?;
        ensure_eq(
            "first build's tags",
            tags_of(&listed, &first.build_id),
            vec!["v1".to_owned()],
        )?;
        ensure_eq(
            "second build's tags",
            tags_of(&listed, &second.build_id),
            vec!["default".to_owned()],
        )?;
        // `v1` moves to the second build, which leaves the first without a tag: gone.
        builds
            .tag_built_template(
                owner,
                &first.template_id,
                &second.build_id,
                &["v1".to_owned()],
            )
            .await?;
        let listed = builds.list_built_templates(owner).await?;
        ensure_eq(
            "second build's tags after the move",
            tags_of(&listed, &second.build_id),
            vec!["default".to_owned(), "v1".to_owned()],
        )?;
        ensure(tags_of(&listed, &first.build_id).is_empty(), || {
            "the build that lost its last tag is still listed".to_owned()
        })?;
        let unknown = builds
            .tag_built_template(
                owner,
                &first.template_id,
                "no-such-build",
                &["x".to_owned()],
            )
            .await;
        ensure(
            unknown
                .as_ref()
                .is_err_and(|e| e.code() == Some(ErrorCode::TemplateNotFound)),
            || format!("tagging an unknown build: {unknown:?}"),
        )?;
        builds
            .untag_built_template(
                owner,
                &first.template_id,
                &["v1".to_owned(), "nope".to_owned()],
            )
            .await?;
        let listed = builds.list_built_templates(owner).await?;
        ensure_eq(
            "tags after the untag",
            tags_of(&listed, &second.build_id),
            vec!["default".to_owned()],
        )?;
        // [template_builds.local]: an absent image builds nothing.
        let absent = request(
            ctx,
            owner,
            &format!("absent-{}", ctx.token()),
            "b3",
            &["default"],
        );
        let mut absent = absent;
        absent.source_image = format!("sandbox-absent-{}:none", ctx.token());
        match builds.build_template(&absent).await {
            Ok(b) => {
                let _ = builds.delete_built_template(owner, &b.template_id).await;
                return Err(Failure("a build from an absent image succeeded".to_owned()));
            }
            Err(e) => ensure(
                e.kind() == ErrorKind::InvalidRequest
                    && e.code() == Some(ErrorCode::ImageNotPresent)
                    && e.message().contains(&absent.source_image),
                || format!("an absent image: expected image_not_present naming it, got {e}"),
            )?,
        }
        ensure(
            !builds
                .list_built_templates(owner)
                .await?
                .iter()
                .any(|b| b.template_id == absent.template_id),
            || "the failed build is listed".to_owned(),
        )?;
        // Another tenant's delete changes nothing.
        let other = tenant(ctx.int(1_000_001..=2_000_000))?;
        builds
            .delete_built_template(other, &first.template_id)
            .await?;
        ensure_eq(
            "builds after another tenant's delete",
            builds.list_built_templates(owner).await?.len(),
            1,
        )?;
        builds
            .delete_built_template(owner, &first.template_id)
            .await?;
        ensure(builds.list_built_templates(owner).await?.is_empty(), || {
            "the deleted template is listed".to_owned()
        })?;
        builds
            .delete_built_template(owner, &first.template_id)
            .await
            .map_err(|e| Failure(format!("a second delete must succeed: {e}")))
    }
    .await;
    let _ = builds
        .delete_built_template(owner, &first.template_id)
        .await;
    result
}
