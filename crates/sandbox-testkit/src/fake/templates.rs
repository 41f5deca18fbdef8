//! The fake's template builds: a build copies nothing (the fake's templates hold no files), it
//! records which tenant may boot it. The fake's "images on the backend" are its known
//! templates that are not snapshots.

use async_trait::async_trait;
use sandbox_core::{
    BuiltTemplate, CreateRequest, Error, ErrorCode, Operation, SnapshotId, TEMPLATE_TENANT,
    TemplateBuildRequest, TemplateBuilds, TemplateId, TenantId,
};

use super::{FakeOp, FakeProvider, State, lock};

/// Every built template's boot reference starts with this.
const BUILT_PREFIX: &str = "built-";

pub(super) fn is_built_ref(template: &TemplateId) -> bool {
    template.as_str().starts_with(BUILT_PREFIX)
}

/// One answer for a missing and a foreign built template alike.
fn template_not_found(op: Operation) -> Error {
    Error::not_found(op, "no such template").with_code(ErrorCode::TemplateNotFound)
}

/// `[template_builds.owner]`: `request` boots a built template only when its metadata names
/// the template's tenant.
pub(super) fn check_owner(st: &State, request: &CreateRequest) -> Result<(), Error> {
    let tenant = request.metadata.get(TEMPLATE_TENANT);
    let owned = st
        .built
        .iter()
        .any(|b| b.template == request.template && tenant == Some(&b.tenant.get().to_string()));
    if owned {
        Ok(())
    } else {
        Err(template_not_found(Operation::CREATE))
    }
}

#[async_trait]
impl TemplateBuilds for FakeProvider {
    async fn build_template(&self, request: &TemplateBuildRequest) -> Result<BuiltTemplate, Error> {
        self.enter(FakeOp::BuildTemplate, None).await?;
        let op = Operation::BUILD_TEMPLATE;
        let now = self.now();
        let mut st = lock(&self.inner.state);
        let present = TemplateId::new(request.source_image.as_str())
            .ok()
            .filter(|t| st.templates.contains_key(t))
            .filter(|t| {
                SnapshotId::new(t.as_str())
                    .ok()
                    .is_none_or(|s| !st.snapshots.contains_key(&s))
            });
        if present.is_none() {
            return Err(self.err(
                Error::invalid_request(
                    op,
                    format!(
                        "image {} is not on the backend, and builds never fetch one",
                        request.source_image
                    ),
                )
                .with_code(ErrorCode::ImageNotPresent),
            ));
        }
        st.next += 1;
        let template = TemplateId::new(format!(
            "{BUILT_PREFIX}{:08x}-{}",
            self.inner.instance, st.next
        ))?;
        // The new build takes its tags from the template's other builds; one left without a
        // tag is gone, as an image whose last tag moved away.
        for other in st
            .built
            .iter_mut()
            .filter(|b| b.tenant == request.tenant && b.template_id == request.template_id)
        {
            other.tags.retain(|t| !request.tags.contains(t));
        }
        st.built.retain(|b| !b.tags.is_empty());
        let built = BuiltTemplate {
            tenant: request.tenant,
            template_id: request.template_id.clone(),
            build_id: request.build_id.clone(),
            name: request.name.clone(),
            tags: request.tags.clone(),
            source_image: request.source_image.clone(),
            template,
            created_at: Some(now),
        };
        st.built.push(built.clone());
        Ok(built)
    }

    async fn list_built_templates(&self, tenant: TenantId) -> Result<Vec<BuiltTemplate>, Error> {
        self.enter(FakeOp::ListBuiltTemplates, None).await?;
        let st = lock(&self.inner.state);
        Ok(st
            .built
            .iter()
            .filter(|b| b.tenant == tenant)
            .cloned()
            .collect())
    }

    async fn tag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        build_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        self.enter(FakeOp::TagTemplate, None).await?;
        let mut st = lock(&self.inner.state);
        let exists = st
            .built
            .iter()
            .any(|b| b.tenant == tenant && b.template_id == template_id && b.build_id == build_id);
        if !exists {
            return Err(self.err(template_not_found(Operation::TAG_TEMPLATE)));
        }
        for b in st
            .built
            .iter_mut()
            .filter(|b| b.tenant == tenant && b.template_id == template_id)
        {
            if b.build_id == build_id {
                for tag in tags {
                    if !b.tags.contains(tag) {
                        b.tags.push(tag.clone());
                    }
                }
            } else {
                b.tags.retain(|t| !tags.contains(t));
            }
        }
        st.built.retain(|b| !b.tags.is_empty());
        Ok(())
    }

    async fn untag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        self.enter(FakeOp::UntagTemplate, None).await?;
        let mut st = lock(&self.inner.state);
        for b in st
            .built
            .iter_mut()
            .filter(|b| b.tenant == tenant && b.template_id == template_id)
        {
            b.tags.retain(|t| !tags.contains(t));
        }
        st.built.retain(|b| !b.tags.is_empty());
        Ok(())
    }

    async fn delete_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
    ) -> Result<(), Error> {
        self.enter(FakeOp::DeleteTemplate, None).await?;
        let mut st = lock(&self.inner.state);
        st.built
            .retain(|b| !(b.tenant == tenant && b.template_id == template_id));
        Ok(())
    }
}
