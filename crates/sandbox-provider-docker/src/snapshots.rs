//! Snapshots by commit into the adapter's own image namespace, and the template catalog.
//!
//! Snapshot images live in their own repository, `sandbox-snapshot-<namespace>`, labelled with
//! the namespace and with the tenant of the sandbox they were taken from: a prune or a listing
//! never mixes them with base images or another deployment's snapshots. A snapshot's ID is its
//! image reference, `sandbox-snapshot-<namespace>:<name>-<32 hex digits>`, the digits 128 bits
//! from the OS generator.
//!
//! A restore (`create` with `from_snapshot`, or any template in a snapshot repository) boots
//! only a tag of this namespace's repository whose image labels say snapshot, this namespace,
//! and the tenant of the request's ownership metadata ([`restorable`]). Anything else, missing
//! or not, answers one and the same [`snapshot_not_found`], so the answer tells a caller nothing
//! about images it may not use; the check is local (an inspect), so a restore never makes the
//! engine pull, whatever the pull policy. The container boots the image ID that was checked,
//! not the name, so a tag moved in between cannot substitute another image.

use std::collections::HashMap;

use async_trait::async_trait;
use bollard::models::ContainerConfig;
use bollard::query_parameters::{CommitContainerOptions, ListImagesOptions, RemoveImageOptions};
use sandbox_core::{
    Error, ErrorCode, ErrorKind, Operation, Provider, SandboxId, SnapshotId, SnapshotRef,
    Snapshots, Template, TemplateCatalog, TenantId, owner_metadata,
};

use crate::errors;
use crate::labels;
use crate::provider::DockerProvider;

/// Every snapshot repository starts with this; such references are never pulled.
pub const SNAPSHOT_REPO_PREFIX: &str = "sandbox-snapshot-";

/// Whether an image reference names a snapshot (a local commit no registry has).
pub fn is_snapshot_ref(image: &str) -> bool {
    image.starts_with(SNAPSHOT_REPO_PREFIX)
}

/// A tag from a caller's snapshot name: lowercase `[a-z0-9]` runs joined by single `-`, cut to
/// 47 characters, then `-` and 32 hex digits of OS randomness (at most 80 characters in all).
/// The suffix keeps two snapshots with one name from overwriting each other's tag, and makes a
/// snapshot's ID impossible to guess.
pub fn sanitize_tag(name: Option<&str>) -> Result<String, Error> {
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
        if tag.len() >= 47 {
            break;
        }
    }
    let tag = tag.trim_end_matches('-');
    let suffix = random_hex()?;
    Ok(if tag.is_empty() {
        format!("s-{suffix}")
    } else {
        format!("{tag}-{suffix}")
    })
}

/// 128 bits from the OS generator, as 32 lowercase hex digits.
fn random_hex() -> Result<String, Error> {
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            Operation::CREATE_SNAPSHOT,
            format!("no randomness for a snapshot name: {e}"),
        )
        .with_provider(Provider::Docker)
    })?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether a snapshot name is kept in its label: bounded and without control characters (a
/// name that is not is still folded, sanitized, into the tag).
fn label_safe(name: &str) -> bool {
    name.len() <= 512 && !name.chars().any(char::is_control)
}

/// The one answer to a restore of anything but this tenant's snapshot in this namespace:
/// missing, foreign, another deployment's and not-a-snapshot alike, naming nothing, so it is
/// no oracle for which images exist.
pub fn snapshot_not_found() -> Error {
    Error::not_found(Operation::CREATE, "no such snapshot")
        .with_code(ErrorCode::SnapshotNotFound)
        .with_provider(Provider::Docker)
}

/// Whether an image with `image_labels` may be restored in `namespace` by a request whose
/// ownership metadata names `tenant` (`None`: no tenant, which matches only snapshots whose
/// source named none).
pub fn restorable(
    image_labels: Option<&HashMap<String, String>>,
    namespace: &str,
    tenant: Option<&str>,
) -> bool {
    let Some(l) = image_labels else {
        return false;
    };
    let get = |k: &str| l.get(k).map(String::as_str);
    get(labels::SNAPSHOT) == Some("true")
        && get(labels::NAMESPACE) == Some(namespace)
        // A snapshot without the explicit label predates tenant tracking: nobody's.
        && get(labels::TENANT).is_some_and(|t| t == tenant.unwrap_or(""))
}

/// The tenant a snapshot image records, when it records one.
fn tenant_of(image_labels: &HashMap<String, String>) -> Option<TenantId> {
    image_labels
        .get(labels::TENANT)
        .and_then(|t| t.parse::<u64>().ok())
        .and_then(|t| TenantId::new(t).ok())
}

/// Whether `reference` is a tag of `repo` as this adapter writes them (`<repo>:<[a-z0-9-]>`):
/// no digest, no registry, no other repository that merely starts alike.
fn is_tag_of(reference: &str, repo: &str) -> bool {
    reference
        .strip_prefix(repo)
        .and_then(|rest| rest.strip_prefix(':'))
        .is_some_and(|tag| {
            !tag.is_empty()
                && tag.len() <= 128
                && tag
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

impl DockerProvider {
    fn snapshot_repo(&self) -> String {
        format!("{SNAPSHOT_REPO_PREFIX}{}", self.namespace())
    }

    /// `[create.snapshot_owner]`: the image ID a restore of `template` for `tenant` boots, with
    /// the image's `ENV` lines, or [`snapshot_not_found`]. Only a local inspect: nothing is
    /// pulled. Engine failures other than "no such image" stay themselves (an engine that is
    /// down is no answer about the snapshot, and says nothing about which images exist).
    pub(crate) async fn restorable_image(
        &self,
        template: &str,
        tenant: Option<&str>,
    ) -> Result<(String, Vec<String>), Error> {
        if !is_tag_of(template, &self.snapshot_repo()) {
            return Err(snapshot_not_found());
        }
        let inspect = match self.docker().inspect_image(template).await {
            Ok(inspect) => inspect,
            Err(e) => {
                let mapped = errors::map(Operation::CREATE, e);
                return Err(if mapped.http_status() == Some(404) {
                    snapshot_not_found()
                } else {
                    mapped
                });
            }
        };
        let config = inspect.config.unwrap_or_default();
        match inspect.id {
            Some(id) if restorable(config.labels.as_ref(), self.namespace(), tenant) => {
                Ok((id, config.env.unwrap_or_default()))
            }
            _ => Err(snapshot_not_found()),
        }
    }

    /// Refuses a snapshot image named as a plain template (by its image ID, or a name that is
    /// not its snapshot tag): snapshots are restored only through [`Self::restorable_image`].
    pub(crate) fn refuse_snapshot_image(
        image_labels: Option<&HashMap<String, String>>,
    ) -> Result<(), Error> {
        let snapshot = image_labels
            .and_then(|l| l.get(labels::SNAPSHOT))
            .is_some_and(|v| v == "true");
        if snapshot {
            return Err(snapshot_not_found());
        }
        Ok(())
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
        let source = self.inspect_owned(op, sandbox.as_str()).await?;
        // The source's ownership metadata, as its create stamped it.
        let tenant = source
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| {
                l.get(&format!(
                    "{}{}",
                    labels::META_PREFIX,
                    owner_metadata::TENANT
                ))
            })
            .cloned()
            .unwrap_or_default();
        let repo = self.snapshot_repo();
        let tag = sanitize_tag(name)?;
        let options = CommitContainerOptions {
            container: Some(sandbox.as_str().to_owned()),
            repo: Some(repo.clone()),
            tag: Some(tag.clone()),
            pause: true,
            ..Default::default()
        };
        // The engine merges the container's labels under these; every label a restore is judged
        // by is set here, so none of them can come from the container.
        let image_labels = HashMap::from([
            (labels::SNAPSHOT.to_owned(), "true".to_owned()),
            (labels::NAMESPACE.to_owned(), self.namespace().to_owned()),
            (
                labels::SNAPSHOT_SOURCE.to_owned(),
                sandbox.as_str().to_owned(),
            ),
            (labels::TENANT.to_owned(), tenant.clone()),
            (
                labels::SNAPSHOT_NAME.to_owned(),
                name.filter(|n| label_safe(n))
                    .unwrap_or_default()
                    .to_owned(),
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
            tenant: tenant
                .parse::<u64>()
                .ok()
                .and_then(|t| TenantId::new(t).ok()),
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
                    name: image
                        .labels
                        .get(labels::SNAPSHOT_NAME)
                        .filter(|n| !n.is_empty())
                        .cloned(),
                    source: image
                        .labels
                        .get(labels::SNAPSHOT_SOURCE)
                        .and_then(|s| SandboxId::new(s.clone()).ok()),
                    created_at: time::OffsetDateTime::from_unix_timestamp(image.created).ok(),
                    tenant: tenant_of(&image.labels),
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

    fn tag(name: Option<&str>) -> String {
        sanitize_tag(name).unwrap()
    }

    #[test]
    fn tags_are_sanitized_and_end_in_128_random_bits() {
        let t = tag(Some("My Snapshot!! v2"));
        assert!(t.starts_with("my-snapshot-v2-"), "{t}");
        assert!(tag(None).starts_with("s-"));
        assert!(tag(Some("日本")).starts_with("s-"));
        let long = tag(Some(&"a".repeat(300)));
        assert_eq!(long.len(), 80, "{long}");
        for t in [tag(Some("x")), tag(None), long] {
            let suffix = t.rsplit_once('-').unwrap().1;
            assert_eq!(suffix.len(), 32, "{t}");
            assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{t}");
        }
        assert_ne!(tag(Some("same")), tag(Some("same")));
        assert!(is_snapshot_ref("sandbox-snapshot-ns:tag"));
        assert!(!is_snapshot_ref("busybox:latest"));
    }

    #[test]
    fn only_tags_of_the_namespace_repository_are_snapshot_references() {
        let repo = "sandbox-snapshot-ns";
        for (reference, ok) in [
            ("sandbox-snapshot-ns:mine-0f", true),
            ("sandbox-snapshot-ns:", false),
            ("sandbox-snapshot-ns", false),
            ("sandbox-snapshot-ns-b:mine", false),
            ("sandbox-snapshot-ns:mine@sha256:00", false),
            ("sandbox-snapshot-ns:Mine", false),
            ("docker.io/library/sandbox-snapshot-ns:mine", false),
            ("sandbox-busybox:test", false),
            ("sha256:0123", false),
        ] {
            assert_eq!(is_tag_of(reference, repo), ok, "{reference}");
        }
    }

    #[test]
    fn restores_match_namespace_and_tenant_exactly() {
        let snap = |ns: &str, tenant: Option<&str>| {
            let mut l = HashMap::from([
                (labels::SNAPSHOT.to_owned(), "true".to_owned()),
                (labels::NAMESPACE.to_owned(), ns.to_owned()),
            ]);
            if let Some(t) = tenant {
                l.insert(labels::TENANT.to_owned(), t.to_owned());
            }
            l
        };
        let check = |l: &HashMap<String, String>, tenant: Option<&str>, want: bool| {
            assert_eq!(
                restorable(Some(l), "ns", tenant),
                want,
                "{l:?} as {tenant:?}"
            );
        };
        check(&snap("ns", Some("7")), Some("7"), true);
        check(&snap("ns", Some("7")), Some("8"), false);
        check(&snap("ns", Some("7")), None, false);
        check(&snap("ns", Some("")), None, true);
        check(&snap("ns", Some("")), Some("7"), false);
        check(&snap("ns", Some("")), Some(""), true);
        check(&snap("other", Some("7")), Some("7"), false);
        // Before tenants were recorded: restorable by nobody.
        check(&snap("ns", None), None, false);
        check(&snap("ns", None), Some("7"), false);
        let mut not_snapshot = snap("ns", Some("7"));
        not_snapshot.insert(labels::SNAPSHOT.to_owned(), "false".to_owned());
        check(&not_snapshot, Some("7"), false);
        assert!(!restorable(None, "ns", None));
        assert!(DockerProvider::refuse_snapshot_image(Some(&snap("x", None))).is_err());
        assert!(DockerProvider::refuse_snapshot_image(None).is_ok());
        let err = snapshot_not_found();
        assert_eq!(
            (err.kind(), err.code()),
            (ErrorKind::NotFound, Some(ErrorCode::SnapshotNotFound))
        );
    }
}
