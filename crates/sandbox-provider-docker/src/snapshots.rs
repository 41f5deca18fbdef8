//! Snapshots by commit into the adapter's own image namespace, and the template catalog.
//!
//! Snapshot images live in their own repository, `sandbox-snapshot-<namespace>`, labelled with
//! the namespace: a prune or a listing never mixes them with base images or another
//! deployment's snapshots. A snapshot's ID is its image reference, which `create` accepts as a
//! template directly.

use std::collections::HashMap;

use async_trait::async_trait;
use bollard::models::ContainerConfig;
use bollard::query_parameters::{CommitContainerOptions, ListImagesOptions, RemoveImageOptions};
use sandbox_core::{
    Error, ErrorKind, Operation, Provider, SandboxId, SnapshotId, SnapshotRef, Snapshots, Template,
    TemplateCatalog,
};

use crate::client::DockerProvider;
use crate::errors;
use crate::labels;

/// Every snapshot repository starts with this; such references are never pulled.
pub const SNAPSHOT_REPO_PREFIX: &str = "sandbox-snapshot-";

/// Whether an image reference names a snapshot (a local commit no registry has).
pub fn is_snapshot_ref(image: &str) -> bool {
    image.starts_with(SNAPSHOT_REPO_PREFIX)
}

/// A tag from a caller's snapshot name: lowercase `[a-z0-9]` runs joined by single `-`, at most
/// 80 characters; random when nothing usable remains.
pub fn sanitize_tag(name: Option<&str>) -> String {
    let mut tag = String::new();
    for ch in name
        .unwrap_or_default()
        .chars()
        .flat_map(char::to_lowercase)
    {
        if ch.is_ascii_lowercase() || ch.is_ascii_digit() {
            tag.push(ch);
        } else if !tag.is_empty() && !tag.ends_with('-') {
            tag.push('-');
        }
        if tag.len() >= 80 {
            break;
        }
    }
    let tag = tag.trim_end_matches('-').to_owned();
    let suffix = format!("{:08x}", fastrand::u32(..));
    // A suffix keeps two snapshots with the same name from overwriting each other's tag.
    if tag.is_empty() {
        format!("s-{suffix}")
    } else {
        format!("{}-{suffix}", &tag[..tag.len().min(70)])
    }
}

impl DockerProvider {
    fn snapshot_repo(&self) -> String {
        format!("{SNAPSHOT_REPO_PREFIX}{}", self.namespace())
    }
}

#[async_trait]
impl Snapshots for DockerProvider {
    /// `docker commit` with the container paused for the duration (the engine's default): the
    /// same "provider pauses while snapshotting" contract E2B and Cube honour.
    async fn create_snapshot(
        &self,
        sandbox: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotRef, Error> {
        let op = Operation::CREATE_SNAPSHOT;
        self.inspect_owned(op, sandbox.as_str()).await?;
        let repo = self.snapshot_repo();
        let tag = sanitize_tag(name);
        let options = CommitContainerOptions {
            container: Some(sandbox.as_str().to_owned()),
            repo: Some(repo.clone()),
            tag: Some(tag.clone()),
            pause: true,
            ..Default::default()
        };
        let image_labels = HashMap::from([
            (labels::SNAPSHOT.to_owned(), "true".to_owned()),
            (labels::NAMESPACE.to_owned(), self.namespace().to_owned()),
            (
                labels::SNAPSHOT_SOURCE.to_owned(),
                sandbox.as_str().to_owned(),
            ),
        ]);
        let config = ContainerConfig {
            labels: Some(image_labels),
            ..Default::default()
        };
        self.docker()
            .commit_container(options, config)
            .await
            .map_err(|e| errors::map(op, e))?;
        Ok(SnapshotRef {
            id: SnapshotId::new(format!("{repo}:{tag}"))?,
            name: name.map(str::to_owned),
            source: Some(sandbox.clone()),
            created_at: Some(self.inner.config.clock.now()),
            tenant: None,
        })
    }

    /// Removes the image and prunes its untagged parents, so a chain of retired snapshots does
    /// not stay on disk forever; layers a live image still uses are reference-counted by the
    /// engine. A missing image is success (deletes are retried by reapers).
    async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), Error> {
        let op = Operation::DELETE_SNAPSHOT;
        if !id
            .as_str()
            .starts_with(&format!("{}:", self.snapshot_repo()))
        {
            // Only this namespace's snapshots may be deleted through this adapter.
            return Ok(());
        }
        let options = RemoveImageOptions {
            force: false,
            noprune: false,
            ..Default::default()
        };
        match self
            .docker()
            .remove_image(id.as_str(), Some(options), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let mapped = errors::map(op, e);
                match mapped.http_status() {
                    Some(404) => Ok(()),
                    Some(409) => {
                        Err(
                            Error::new(ErrorKind::Conflict, op, mapped.message().to_owned())
                                .with_provider(Provider::Docker),
                        )
                    }
                    _ => Err(mapped),
                }
            }
        }
    }

    async fn list_snapshots(&self, source: Option<&SandboxId>) -> Result<Vec<SnapshotRef>, Error> {
        let op = Operation::LIST_SNAPSHOTS;
        let mut filters = vec![
            format!("{}=true", labels::SNAPSHOT),
            format!("{}={}", labels::NAMESPACE, self.namespace()),
        ];
        if let Some(src) = source {
            filters.push(format!("{}={}", labels::SNAPSHOT_SOURCE, src.as_str()));
        }
        let options = ListImagesOptions {
            filters: Some(HashMap::from([("label".to_owned(), filters)])),
            ..Default::default()
        };
        let images = self
            .docker()
            .list_images(Some(options))
            .await
            .map_err(|e| errors::map(op, e))?;
        let repo = self.snapshot_repo();
        let mut out = Vec::new();
        for image in images {
            for tag in image
                .repo_tags
                .iter()
                .filter(|t| t.starts_with(&format!("{repo}:")))
            {
                out.push(SnapshotRef {
                    id: SnapshotId::new(tag.clone())?,
                    name: None,
                    source: image
                        .labels
                        .get(labels::SNAPSHOT_SOURCE)
                        .and_then(|s| SandboxId::new(s.clone()).ok()),
                    created_at: time::OffsetDateTime::from_unix_timestamp(image.created).ok(),
                    tenant: None,
                });
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl TemplateCatalog for DockerProvider {
    /// The configured image is the one template; snapshots are listed by `list_snapshots`.
    async fn list_templates(&self) -> Result<Vec<Template>, Error> {
        let image = self.inner.config.image.as_str();
        match self.docker().inspect_image(image).await {
            Ok(_) => Ok(vec![standard(image)]),
            Err(e) => {
                let mapped = errors::map(Operation::LIST_TEMPLATES, e);
                if mapped.http_status() == Some(404) {
                    Ok(Vec::new())
                } else {
                    Err(mapped)
                }
            }
        }
    }

    /// Makes the configured image present (pulling per the pull policy).
    async fn ensure_standard_template(&self) -> Result<Template, Error> {
        let image = self.inner.config.image.as_str().to_owned();
        self.ensure_image(Operation::ENSURE_TEMPLATE, &image)
            .await?;
        Ok(standard(&image))
    }
}

fn standard(image: &str) -> Template {
    Template {
        id: image.to_owned(),
        name: image.to_owned(),
        status: "ready".to_owned(),
        image: image.to_owned(),
        standard: true,
        ..Template::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_sanitized() {
        let tag = sanitize_tag(Some("My Snapshot!! v2"));
        assert!(tag.starts_with("my-snapshot-v2-"), "{tag}");
        assert!(sanitize_tag(None).starts_with("s-"));
        assert!(sanitize_tag(Some("日本")).starts_with("s-"));
        assert!(sanitize_tag(Some(&"a".repeat(300))).len() <= 80);
        assert!(is_snapshot_ref("sandbox-snapshot-ns:tag"));
        assert!(!is_snapshot_ref("busybox:latest"));
    }
}
