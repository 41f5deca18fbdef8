//! Tenants' templates built from images already on the engine (`TemplateBuilds`).
//!
//! A build never pulls: the source image is inspected locally, a container is created from its
//! ID (never started) and committed into the adapter's own repository,
//! `sandbox-template-<namespace>`, with labels naming the namespace, the tenant, the template,
//! the build, the name and the source. Each of the build's tags is a tag of that image,
//! `t<tenant>_<template ID>_<tag>` (IDs have no `_`, so the three parts split back
//! unambiguously): moving a tag to another build is `docker tag`, and the engine keeps all of
//! it, so a ready template survives a restart and every replica on the engine sees it.
//!
//! A create naming a tag of this repository boots it only for the tenant its image's labels
//! name, by the image ID that was checked (`DockerProvider::bootable_template`); any other
//! name of a template image (its ID, say) is refused. Missing and foreign answer alike.

use std::collections::HashMap;

use async_trait::async_trait;
use bollard::models::{ContainerConfig, ContainerCreateBody, ImageConfig, ImageSummary};
use bollard::query_parameters::{
    CommitContainerOptions, ListImagesOptions, RemoveContainerOptions, RemoveImageOptions,
    TagImageOptions,
};
use sandbox_core::{
    BuiltTemplate, Error, ErrorCode, Operation, Provider, TemplateBuildRequest, TemplateBuilds,
    TemplateId, TenantId,
};

use crate::errors;
use crate::labels;
use crate::provider::DockerProvider;

/// Every template repository starts with this; such references are never pulled.
pub const TEMPLATE_REPO_PREFIX: &str = "sandbox-template-";

/// Whether an image reference names a built template.
pub fn is_template_ref(image: &str) -> bool {
    image.starts_with(TEMPLATE_REPO_PREFIX)
}

/// The one answer to a create or a tag of anything but this tenant's template.
pub fn template_not_found(op: Operation) -> Error {
    Error::not_found(op, "no such template")
        .with_code(ErrorCode::TemplateNotFound)
        .with_provider(Provider::Docker)
}

/// The image tag of one template tag: `t<tenant>_<template ID>_<tag>`.
fn image_tag(tenant: TenantId, template_id: &str, tag: &str) -> String {
    format!("t{}_{template_id}_{tag}", tenant.get())
}

/// Splits an image tag back into (tenant, template ID, tag).
fn split_image_tag(image_tag: &str) -> Option<(u64, &str, &str)> {
    let rest = image_tag.strip_prefix('t')?;
    let (tenant, rest) = rest.split_once('_')?;
    let (template_id, tag) = rest.split_once('_')?;
    let tenant = tenant.parse().ok()?;
    (sandbox_core::is_template_word(template_id) && sandbox_core::is_template_tag(tag)).then_some((
        tenant,
        template_id,
        tag,
    ))
}

/// Whether `image_labels` say: a template image of `namespace` belonging to `tenant`.
fn owned(image_labels: Option<&HashMap<String, String>>, namespace: &str, tenant: &str) -> bool {
    let Some(l) = image_labels else {
        return false;
    };
    let get = |k: &str| l.get(k).map(String::as_str);
    get(labels::TEMPLATE) == Some("true")
        && get(labels::NAMESPACE) == Some(namespace)
        && get(labels::TENANT) == Some(tenant)
}

impl DockerProvider {
    fn template_repo(&self) -> String {
        format!("{TEMPLATE_REPO_PREFIX}{}", self.namespace())
    }

    /// `[template_builds.owner]`: the image ID (and `ENV`) a create of `template` for
    /// `tenant` boots, or [`template_not_found`]. Only a local inspect: nothing is pulled.
    pub(crate) async fn bootable_template(
        &self,
        template: &str,
        tenant: Option<&str>,
    ) -> Result<(String, Vec<String>), Error> {
        let op = Operation::CREATE;
        let tag_ok = template
            .strip_prefix(&self.template_repo())
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(split_image_tag)
            .is_some_and(|(t, _, _)| tenant == Some(t.to_string().as_str()));
        let Some(tenant) = tenant.filter(|_| tag_ok) else {
            return Err(template_not_found(op));
        };
        let inspect = match self.docker().inspect_image(template).await {
            Ok(inspect) => inspect,
            Err(e) => {
                let mapped = errors::map(op, e);
                return Err(if mapped.http_status() == Some(404) {
                    template_not_found(op)
                } else {
                    mapped
                });
            }
        };
        let config = inspect.config.unwrap_or_default();
        match inspect.id {
            Some(id) if owned(config.labels.as_ref(), self.namespace(), tenant) => {
                Ok((id, config.env.unwrap_or_default()))
            }
            _ => Err(template_not_found(op)),
        }
    }

    /// Refuses a template image named any other way than its tag (by ID, say): templates are
    /// booted only through [`Self::bootable_template`].
    pub(crate) fn refuse_template_image(
        image_labels: Option<&HashMap<String, String>>,
    ) -> Result<(), Error> {
        let template = image_labels
            .and_then(|l| l.get(labels::TEMPLATE))
            .is_some_and(|v| v == "true");
        if template {
            return Err(template_not_found(Operation::CREATE));
        }
        Ok(())
    }

    /// This tenant's template images (of one template, when named), tagged or not.
    async fn template_images(
        &self,
        op: Operation,
        tenant: TenantId,
        template_id: Option<&str>,
    ) -> Result<Vec<ImageSummary>, Error> {
        let mut filters = vec![
            format!("{}=true", labels::TEMPLATE),
            format!("{}={}", labels::NAMESPACE, self.namespace()),
            format!("{}={}", labels::TENANT, tenant.get()),
        ];
        if let Some(id) = template_id {
            filters.push(format!("{}={id}", labels::TEMPLATE_ID));
        }
        let options = ListImagesOptions {
            all: false,
            filters: Some(HashMap::from([("label".to_owned(), filters)])),
            ..Default::default()
        };
        self.docker()
            .list_images(Some(options))
            .await
            .map_err(|e| errors::map(op, e))
    }

    /// The template tags of one image (those of this repository, tenant and template).
    fn tags_of(&self, image: &ImageSummary, tenant: TenantId, template_id: &str) -> Vec<String> {
        let prefix = format!("{}:", self.template_repo());
        image
            .repo_tags
            .iter()
            .filter_map(|r| r.strip_prefix(&prefix))
            .filter_map(split_image_tag)
            .filter(|(t, id, _)| *t == tenant.get() && *id == template_id)
            .map(|(_, _, tag)| tag.to_owned())
            .collect()
    }

    /// Removes the template's images no tag names any more (a tag moved to another build).
    /// An image a sandbox still runs stays (the engine refuses), and goes at a later prune.
    async fn prune_untagged(&self, op: Operation, tenant: TenantId, template_id: &str) {
        let Ok(images) = self.template_images(op, tenant, Some(template_id)).await else {
            return;
        };
        for image in images {
            if self.tags_of(&image, tenant, template_id).is_empty() {
                let options = RemoveImageOptions {
                    force: false,
                    noprune: false,
                    ..Default::default()
                };
                if let Err(e) = self
                    .docker()
                    .remove_image(&image.id, Some(options), None)
                    .await
                {
                    tracing::debug!(image = %image.id, error = %e, "template image kept");
                }
            }
        }
    }

    /// Points template tag `tag` at image `image_id` (moving it from wherever it was).
    async fn put_tag(
        &self,
        op: Operation,
        image_id: &str,
        tenant: TenantId,
        template_id: &str,
        tag: &str,
    ) -> Result<(), Error> {
        let options = TagImageOptions {
            repo: Some(self.template_repo()),
            tag: Some(image_tag(tenant, template_id, tag)),
        };
        self.docker()
            .tag_image(image_id, Some(options))
            .await
            .map_err(|e| errors::map(op, e))
    }

    /// Takes template tag `tag` off whatever image holds it. Forced, so a tag whose image a
    /// sandbox runs is still removed (the sandbox keeps running; the image goes at a prune).
    async fn drop_tag(
        &self,
        op: Operation,
        tenant: TenantId,
        template_id: &str,
        tag: &str,
    ) -> Result<(), Error> {
        let reference = format!(
            "{}:{}",
            self.template_repo(),
            image_tag(tenant, template_id, tag)
        );
        let options = RemoveImageOptions {
            force: true,
            noprune: false,
            ..Default::default()
        };
        match self
            .docker()
            .remove_image(&reference, Some(options), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let mapped = errors::map(op, e);
                if mapped.http_status() == Some(404) {
                    Ok(())
                } else {
                    Err(mapped)
                }
            }
        }
    }

    async fn commit_build(
        &self,
        request: &TemplateBuildRequest,
        source_id: &str,
        source: &ImageConfig,
    ) -> Result<String, Error> {
        let op = Operation::BUILD_TEMPLATE;
        // A container that never starts: only its root filesystem (the image's) is committed.
        // It carries no label, so the engine merges none into the image.
        let body = ContainerCreateBody {
            image: Some(source_id.to_owned()),
            cmd: Some(
                source
                    .cmd
                    .clone()
                    .unwrap_or_else(|| vec!["/bin/sh".to_owned()]),
            ),
            network_disabled: Some(true),
            ..Default::default()
        };
        let created = self
            .docker()
            .create_container(
                // Named, not labelled (the commit would copy a label into the image), so one a
                // crash left between create and remove can be told apart by an operator.
                Some(bollard::query_parameters::CreateContainerOptions {
                    name: Some(format!(
                        "sandbox-template-build-{}-{:012x}",
                        self.namespace(),
                        fastrand::u64(..) & 0xffff_ffff_ffff
                    )),
                    ..Default::default()
                }),
                body,
            )
            .await
            .map_err(|e| errors::map(op, e))?;
        let first_tag = request
            .tags
            .first()
            .map(String::as_str)
            .unwrap_or("default");
        let image_labels = HashMap::from([
            (labels::TEMPLATE.to_owned(), "true".to_owned()),
            // An image built from a snapshot must never pass for one.
            (labels::SNAPSHOT.to_owned(), "false".to_owned()),
            (labels::NAMESPACE.to_owned(), self.namespace().to_owned()),
            (labels::TENANT.to_owned(), request.tenant.get().to_string()),
            (labels::TEMPLATE_ID.to_owned(), request.template_id.clone()),
            (labels::TEMPLATE_BUILD.to_owned(), request.build_id.clone()),
            (labels::TEMPLATE_NAME.to_owned(), request.name.clone()),
            (
                labels::TEMPLATE_SOURCE.to_owned(),
                request.source_image.clone(),
            ),
        ]);
        let config = ContainerConfig {
            labels: Some(image_labels),
            cmd: source.cmd.clone(),
            entrypoint: source.entrypoint.clone(),
            ..Default::default()
        };
        let options = CommitContainerOptions {
            container: Some(created.id.clone()),
            repo: Some(self.template_repo()),
            tag: Some(image_tag(request.tenant, &request.template_id, first_tag)),
            pause: false,
            ..Default::default()
        };
        let committed = self.docker().commit_container(options, config).await;
        let removed = self
            .docker()
            .remove_container(
                &created.id,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await;
        if let Err(e) = removed {
            tracing::warn!(container = %created.id, error = %e, "template build: the build container was not removed");
        }
        let committed = committed.map_err(|e| errors::map(op, e))?;
        Ok(committed.id)
    }
}

#[async_trait]
impl TemplateBuilds for DockerProvider {
    async fn build_template(&self, request: &TemplateBuildRequest) -> Result<BuiltTemplate, Error> {
        let op = Operation::BUILD_TEMPLATE;
        // [template_builds.local]: a local inspect, never a pull.
        let inspect = match self.docker().inspect_image(&request.source_image).await {
            Ok(inspect) => inspect,
            Err(e) => {
                let mapped = errors::map(op, e);
                if mapped.http_status() != Some(404) {
                    return Err(mapped);
                }
                return Err(Error::invalid_request(
                    op,
                    format!(
                        "image {} is not present on the Docker engine, and template builds never pull",
                        request.source_image
                    ),
                )
                .with_code(ErrorCode::ImageNotPresent)
                .with_provider(Provider::Docker));
            }
        };
        let config = inspect.config.clone().unwrap_or_default();
        let tenant_owned = config.labels.as_ref().is_some_and(|l| {
            l.get(labels::SNAPSHOT).is_some_and(|v| v == "true")
                || l.get(labels::TEMPLATE).is_some_and(|v| v == "true")
        });
        if tenant_owned {
            // A snapshot or a template belongs to a tenant: it is no source for anyone's build.
            return Err(Error::invalid_request(
                op,
                format!(
                    "image {} is a snapshot or a template, not a source image",
                    request.source_image
                ),
            )
            .with_provider(Provider::Docker));
        }
        let source_id = inspect.id.clone().ok_or_else(|| {
            Error::new(
                sandbox_core::ErrorKind::Internal,
                op,
                "the engine's inspect names no image ID",
            )
            .with_provider(Provider::Docker)
        })?;
        let image_id = self.commit_build(request, &source_id, &config).await?;
        for tag in request.tags.iter().skip(1) {
            self.put_tag(op, &image_id, request.tenant, &request.template_id, tag)
                .await?;
        }
        self.prune_untagged(op, request.tenant, &request.template_id)
            .await;
        let first = request
            .tags
            .first()
            .map(String::as_str)
            .unwrap_or("default");
        Ok(BuiltTemplate {
            tenant: request.tenant,
            template_id: request.template_id.clone(),
            build_id: request.build_id.clone(),
            name: request.name.clone(),
            tags: request.tags.clone(),
            source_image: request.source_image.clone(),
            template: TemplateId::new(format!(
                "{}:{}",
                self.template_repo(),
                image_tag(request.tenant, &request.template_id, first)
            ))?,
            created_at: Some(self.inner.config.clock.now()),
        })
    }

    async fn list_built_templates(&self, tenant: TenantId) -> Result<Vec<BuiltTemplate>, Error> {
        let op = Operation::LIST_BUILT_TEMPLATES;
        let mut out = Vec::new();
        for image in self.template_images(op, tenant, None).await? {
            let label = |k: &str| image.labels.get(k).cloned().unwrap_or_default();
            let template_id = label(labels::TEMPLATE_ID);
            let mut tags = self.tags_of(&image, tenant, &template_id);
            tags.sort();
            let Some(first) = tags.first() else {
                continue;
            };
            out.push(BuiltTemplate {
                tenant,
                template: TemplateId::new(format!(
                    "{}:{}",
                    self.template_repo(),
                    image_tag(tenant, &template_id, first)
                ))?,
                build_id: label(labels::TEMPLATE_BUILD),
                name: label(labels::TEMPLATE_NAME),
                source_image: label(labels::TEMPLATE_SOURCE),
                created_at: time::OffsetDateTime::from_unix_timestamp(image.created).ok(),
                template_id,
                tags,
            });
        }
        Ok(out)
    }

    async fn tag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        build_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        let op = Operation::TAG_TEMPLATE;
        let images = self.template_images(op, tenant, Some(template_id)).await?;
        let Some(image) = images
            .iter()
            .find(|i| i.labels.get(labels::TEMPLATE_BUILD).map(String::as_str) == Some(build_id))
        else {
            return Err(template_not_found(op));
        };
        for tag in tags {
            self.put_tag(op, &image.id, tenant, template_id, tag)
                .await?;
        }
        self.prune_untagged(op, tenant, template_id).await;
        Ok(())
    }

    async fn untag_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
        tags: &[String],
    ) -> Result<(), Error> {
        let op = Operation::UNTAG_TEMPLATE;
        for tag in tags {
            self.drop_tag(op, tenant, template_id, tag).await?;
        }
        self.prune_untagged(op, tenant, template_id).await;
        Ok(())
    }

    async fn delete_built_template(
        &self,
        tenant: TenantId,
        template_id: &str,
    ) -> Result<(), Error> {
        let op = Operation::DELETE_TEMPLATE;
        for image in self.template_images(op, tenant, Some(template_id)).await? {
            for tag in self.tags_of(&image, tenant, template_id) {
                self.drop_tag(op, tenant, template_id, &tag).await?;
            }
        }
        self.prune_untagged(op, tenant, template_id).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tags_split_back_unambiguously() {
        let tenant = TenantId::new(7).unwrap();
        let tag = image_tag(tenant, "abc-1", "v1_x.y");
        assert_eq!(tag, "t7_abc-1_v1_x.y");
        assert_eq!(split_image_tag(&tag), Some((7, "abc-1", "v1_x.y")));
        for bad in ["7_a_b", "t7_a", "tx_a_b", "t7__b", "t7_a_", "t7_A_b"] {
            assert_eq!(split_image_tag(bad), None, "{bad}");
        }
        assert!(is_template_ref("sandbox-template-ns:t7_a_b"));
        assert!(!is_template_ref("sandbox-snapshot-ns:x"));
    }

    #[test]
    fn only_this_tenants_template_images_of_this_namespace_boot() {
        let l = |ns: &str, tenant: &str, template: &str| {
            HashMap::from([
                (labels::TEMPLATE.to_owned(), template.to_owned()),
                (labels::NAMESPACE.to_owned(), ns.to_owned()),
                (labels::TENANT.to_owned(), tenant.to_owned()),
            ])
        };
        assert!(owned(Some(&l("ns", "7", "true")), "ns", "7"));
        assert!(!owned(Some(&l("ns", "7", "true")), "ns", "8"));
        assert!(!owned(Some(&l("other", "7", "true")), "ns", "7"));
        assert!(!owned(Some(&l("ns", "7", "false")), "ns", "7"));
        assert!(!owned(None, "ns", "7"));
        assert!(DockerProvider::refuse_template_image(Some(&l("ns", "7", "true"))).is_err());
        assert!(DockerProvider::refuse_template_image(None).is_ok());
    }
}
