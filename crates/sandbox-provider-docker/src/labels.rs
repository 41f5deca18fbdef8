//! The labels the adapter puts on containers and images, and how sandbox metadata maps onto
//! them.
//!
//! Metadata keys are stored under [`META_PREFIX`], so no caller-chosen key can collide with (or
//! forge) the labels that decide ownership, such as [`MANAGED`] or [`NAMESPACE`].

use std::collections::HashMap;

use sandbox_core::{Error, Metadata, Operation};

/// On every container the adapter creates. Every sweep and listing filters on it.
pub const MANAGED: &str = "sandbox.managed";
/// The adapter namespace that owns the container: sweeps and listings never cross it.
pub const NAMESPACE: &str = "sandbox.namespace";
/// Per-container idle TTL in seconds (0 = never reclaimed for idleness).
pub const IDLE_TTL: &str = "sandbox.idle-ttl-seconds";
/// What the idle sweep does to a container idle past its TTL: [`ON_IDLE_PAUSE`] pauses it (the
/// create's `on_timeout = pause`); absent, it is deleted.
pub const ON_IDLE: &str = "sandbox.on-idle";
/// The [`ON_IDLE`] value that pauses.
pub const ON_IDLE_PAUSE: &str = "pause";
/// Prefix of labels carrying sandbox metadata.
pub const META_PREFIX: &str = "sandbox.meta.";
/// On snapshot images.
pub const SNAPSHOT: &str = "sandbox.snapshot";
/// The container a snapshot image was committed from.
pub const SNAPSHOT_SOURCE: &str = "sandbox.snapshot-source";
/// On snapshot images: the name the snapshot was taken with, as given (its tag holds only a
/// sanitized form); empty when it was given none. Written at every commit, like [`TENANT`].
pub const SNAPSHOT_NAME: &str = "sandbox.snapshot-name";
/// On snapshot images: the tenant whose sandbox the snapshot was taken from, copied at commit
/// from the source's ownership metadata (`sandbox.meta.sandbox_tenant_id`); empty when that
/// named none. Written at every commit, so the value a restore is judged by never comes from a
/// label the image inherited from its source container or its base image.
pub const TENANT: &str = "sandbox.tenant";
/// On template images (`template_builds`): `true`. Their tenant is [`TENANT`], set at build.
pub const TEMPLATE: &str = "sandbox.template";
/// On template images: the template's ID, its build's ID, its name and its source image.
pub const TEMPLATE_ID: &str = "sandbox.template-id";
pub const TEMPLATE_BUILD: &str = "sandbox.template-build";
pub const TEMPLATE_NAME: &str = "sandbox.template-name";
pub const TEMPLATE_SOURCE: &str = "sandbox.template-source";

/// Label keys: 1–128 bytes, printable, no `=` (the filter syntax), no whitespace.
pub fn validate_label_key(key: &str) -> Result<(), Error> {
    let ok = !key.is_empty()
        && key.len() <= 128
        && !key.contains('=')
        && !key.chars().any(|c| c.is_control() || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_request(
            Operation::VALIDATE,
            format!(
                "metadata key {:?} cannot be a Docker label",
                key.chars().take(64).collect::<String>()
            ),
        ))
    }
}

/// Label values: at most 4096 bytes, no control characters.
pub fn validate_label_value(key: &str, value: &str) -> Result<(), Error> {
    if value.len() > 4096 || value.chars().any(char::is_control) {
        return Err(Error::invalid_request(
            Operation::VALIDATE,
            format!(
                "metadata value of {key:?} cannot be a Docker label (control characters or over 4096 bytes)"
            ),
        ));
    }
    Ok(())
}

/// Metadata as labels.
pub fn metadata_labels(metadata: &Metadata) -> Result<HashMap<String, String>, Error> {
    let mut labels = HashMap::with_capacity(metadata.len());
    for (k, v) in metadata {
        validate_label_key(k)?;
        validate_label_value(k, v)?;
        labels.insert(format!("{META_PREFIX}{k}"), v.clone());
    }
    Ok(labels)
}

/// Labels back to metadata (only the prefixed ones).
pub fn labels_to_metadata(labels: Option<&HashMap<String, String>>) -> Metadata {
    labels
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            k.strip_prefix(META_PREFIX)
                .map(|m| (m.to_owned(), v.clone()))
        })
        .collect()
}

/// Whether a container's labels say this adapter namespace owns it.
pub fn owned_by(labels: Option<&HashMap<String, String>>, namespace: &str) -> bool {
    labels.is_some_and(|l| {
        l.get(MANAGED).map(String::as_str) == Some("true")
            && l.get(NAMESPACE).map(String::as_str) == Some(namespace)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_under_a_prefix_and_cannot_forge_ownership() {
        let meta: Metadata = [
            ("sandbox.managed".to_owned(), "true".to_owned()),
            ("tenant".to_owned(), "7".to_owned()),
        ]
        .into();
        let labels = metadata_labels(&meta).unwrap();
        assert_eq!(
            labels
                .get("sandbox.meta.sandbox.managed")
                .map(String::as_str),
            Some("true")
        );
        assert!(
            !labels.contains_key(MANAGED),
            "metadata must not set the ownership label"
        );
        assert_eq!(labels_to_metadata(Some(&labels)), meta);
        assert!(!owned_by(Some(&labels), "ns"));
        for bad in ["", "a=b", "a b", "a\nb"] {
            assert!(validate_label_key(bad).is_err(), "{bad:?}");
        }
        assert!(validate_label_value("k", "a\u{0}").is_err());
    }
}
