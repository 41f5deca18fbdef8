//! Templates and snapshots.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::ids::{SandboxId, SnapshotId, TenantId};
use crate::timefmt;

/// The provider-neutral view of a template, as a settings page lists it. IDs stay opaque.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Template {
    pub id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// This is the workspace's standard (command-line) template.
    #[serde(default)]
    pub standard: bool,
    /// This is the desktop sibling of the standard template.
    #[serde(default)]
    pub desktop: bool,
    /// The provider's own explanation of a failed build.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// One provider-side snapshot. Its ID can be passed back as a create request's template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRef {
    pub id: SnapshotId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The sandbox it was taken from, when the provider records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SandboxId>,
    #[serde(
        default,
        with = "timefmt::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub created_at: Option<OffsetDateTime>,
    /// The tenant whose sandbox it was taken from, when the provider records it (per-tenant
    /// snapshot quotas count these). Not serialized: it is the provider's record, never input.
    #[serde(skip)]
    pub tenant: Option<TenantId>,
}

/// The longest template ID, build ID or tag a [`TemplateBuildRequest`] carries (a backend
/// may join a tenant, an ID and a tag into one 128-byte image tag).
pub const MAX_TEMPLATE_WORD: usize = 40;
/// The longest template name.
pub const MAX_TEMPLATE_NAME: usize = 128;

/// Whether `word` may be a built template's ID or build ID: 1 to [`MAX_TEMPLATE_WORD`]
/// lower-case letters, digits and `-` (no `_`, so a backend may use `_` to join words).
pub fn is_template_word(word: &str) -> bool {
    !word.is_empty()
        && word.len() <= MAX_TEMPLATE_WORD
        && word
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `name` may be a built template's name: 1 to [`MAX_TEMPLATE_NAME`] lower-case
/// letters, digits, `-` and `_`.
pub fn is_template_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TEMPLATE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Whether `tag` may name one build of a built template: 1 to [`MAX_TEMPLATE_WORD`]
/// lower-case letters, digits, `-`, `_` and `.`.
pub fn is_template_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= MAX_TEMPLATE_WORD
        && tag.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
        })
}

/// The metadata key a create request names a built template's tenant under: the template
/// boots only when it names the template's own tenant ([`crate::TemplateBuilds`]). Set by the
/// service that resolved the template for its caller, never by a caller.
pub const TEMPLATE_TENANT: &str = "sandbox.template_tenant";

/// A build of a tenant's template from an image already on the backend
/// ([`crate::TemplateBuilds`]). IDs are checked with [`is_template_word`], the name with
/// [`is_template_name`] and tags with [`is_template_tag`] before they reach a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateBuildRequest {
    /// Whose template it is; only this tenant's creates boot it.
    pub tenant: TenantId,
    /// The caller's ID of the template (stable over its builds).
    pub template_id: String,
    /// The caller's ID of this build.
    pub build_id: String,
    /// The template's name (its alias), recorded with the build.
    pub name: String,
    /// The tags this build takes (moved from any other build of the template that held them);
    /// at least one.
    pub tags: Vec<String>,
    /// The image the build is made from, as the backend names it; never fetched.
    pub source_image: String,
}

impl TemplateBuildRequest {
    /// Refuses a request whose words a backend could not keep, naming the field.
    pub fn validate(&self) -> Result<(), crate::Error> {
        let op = crate::Operation::BUILD_TEMPLATE;
        for (field, word) in [
            ("template_id", &self.template_id),
            ("build_id", &self.build_id),
        ] {
            if !is_template_word(word) {
                return Err(crate::Error::invalid_request(
                    op,
                    format!(
                        "{field} must be 1 to {MAX_TEMPLATE_WORD} lower-case letters, digits and -"
                    ),
                ));
            }
        }
        if !is_template_name(&self.name) {
            return Err(crate::Error::invalid_request(
                op,
                format!(
                    "name must be 1 to {MAX_TEMPLATE_NAME} lower-case letters, digits, - and _"
                ),
            ));
        }
        if self.tags.is_empty() || !self.tags.iter().all(|t| is_template_tag(t)) {
            return Err(crate::Error::invalid_request(
                op,
                format!(
                    "tags must be at least one, each 1 to {MAX_TEMPLATE_WORD} lower-case letters, digits, -, _ and ."
                ),
            ));
        }
        if self.source_image.is_empty() || self.source_image.len() > 255 {
            return Err(crate::Error::invalid_request(
                op,
                "source_image must be 1 to 255 bytes",
            ));
        }
        Ok(())
    }
}

/// One finished build of a tenant's template, as the backend keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltTemplate {
    pub tenant: TenantId,
    pub template_id: String,
    pub build_id: String,
    pub name: String,
    /// The tags that name this build now (a build whose last tag moved away is gone).
    pub tags: Vec<String>,
    /// The image it was built from, as the build request named it.
    pub source_image: String,
    /// What a create request names to boot this build (for this tenant only).
    pub template: crate::ids::TemplateId,
    pub created_at: Option<OffsetDateTime>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_words_names_and_tags_are_checked() {
        assert!(is_template_word("abc-123"));
        for bad in ["", "a_b", "A", "a.b", &"a".repeat(41)] {
            assert!(!is_template_word(bad), "{bad}");
        }
        assert!(is_template_name("my_env-2"));
        assert!(!is_template_name("My"));
        assert!(is_template_tag("v1.2_x-y"));
        assert!(!is_template_tag("v1:x"));
        let mut request = TemplateBuildRequest {
            tenant: TenantId::new(7).unwrap(),
            template_id: "t1".to_owned(),
            build_id: "b1".to_owned(),
            name: "env".to_owned(),
            tags: vec!["default".to_owned()],
            source_image: "img:1".to_owned(),
        };
        assert!(request.validate().is_ok());
        request.tags.clear();
        assert!(request.validate().unwrap_err().message().contains("tags"));
        request.tags.push("default".to_owned());
        request.template_id = "t_1".to_owned();
        assert!(
            request
                .validate()
                .unwrap_err()
                .message()
                .contains("template_id")
        );
    }
}
