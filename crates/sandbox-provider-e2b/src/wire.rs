//! The control plane's JSON, as the adapter sends and reads it.
//!
//! Only what the adapter uses is modelled. Requests leave out every field they do not set
//! (`skip_serializing_if`), so a strict plane (this service's own E2B API refuses keys it does
//! not know) sees exactly what was asked for; answers ignore fields they do not read, so a
//! newer plane's additions do not break an older adapter.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /sandboxes` (`NewSandbox`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Whole seconds, rounded up.
    pub timeout: u64,
    /// Pause instead of kill at the timeout.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub auto_pause: bool,
    /// With `auto_pause`: keep the memory (the only pause that can resume on traffic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_pause_memory: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<AutoResume>,
    /// envd requires its access token: always sent `true`.
    pub secure: bool,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: bool,
    pub network: Network,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env_vars: BTreeMap<String, String>,
}

/// `SandboxAutoResumeConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AutoResume {
    pub enabled: bool,
}

/// `SandboxNetworkConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// `false` closes the sandbox's ports to requests without its traffic token.
    pub allow_public_traffic: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
    /// Per-domain header rules.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub rules: BTreeMap<String, Vec<NetworkRule>>,
}

/// `SandboxNetworkRule`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetworkRule {
    pub transform: Transform,
}

/// `SandboxNetworkTransform`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transform {
    pub headers: BTreeMap<String, String>,
}

/// `Sandbox`: the answer of create and connect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxAnswer {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID", default)]
    pub template_id: String,
    #[serde(default)]
    pub envd_version: String,
    #[serde(default)]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub traffic_access_token: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
}

/// `ListedSandbox`, and the part of `SandboxDetail` the adapter reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID", default)]
    pub template_id: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub end_at: Option<String>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub envd_version: String,
    #[serde(default)]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
}

/// `POST /sandboxes/{id}/connect` and `/timeout`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimeoutBody {
    pub timeout: u64,
}

/// `POST /sandboxes/{id}/snapshots` (`SandboxSnapshotRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SnapshotRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `SnapshotInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    #[serde(default)]
    pub names: Vec<String>,
}

/// `GET /templates/aliases/{alias}`: the template a name resolves to, and whether it is the
/// plane's own public one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TemplateAlias {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default)]
    pub public: bool,
}

/// `Template` of `GET /templates`: the part the catalog reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateListed {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID", default)]
    pub build_id: String,
    #[serde(default)]
    pub names: Vec<String>,
    #[serde(default)]
    pub aliases: Vec<String>,
    #[serde(default)]
    pub build_status: String,
}

/// `TemplateWithBuilds` of `GET /templates/{id}`: the part the catalog reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default)]
    pub names: Vec<String>,
    #[serde(default)]
    pub aliases: Vec<String>,
    #[serde(default)]
    pub builds: Vec<TemplateBuild>,
}

/// `TemplateBuild`, one build of a template.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TemplateBuild {
    #[serde(rename = "buildID")]
    pub build_id: String,
    #[serde(default)]
    pub status: String,
}

/// `TemplateTag` of `GET /templates/{id}/tags`: which build a tag names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TemplateTag {
    pub tag: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// `POST /v3/templates` (`TemplateBuildRequestV3`): a new build of the template named `name`
/// (a new template when the team has none of that name), to carry `tags` once ready.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TemplateBuildRequest {
    pub name: String,
    pub tags: Vec<String>,
}

/// The answer of `POST /v3/templates`: the part the catalog reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TemplateBuildRequested {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// `POST /v2/templates/{id}/builds/{build}` (`TemplateBuildStartV2`): the build's one source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TemplateBuildStart {
    #[serde(rename = "fromImage")]
    pub from_image: String,
}

/// `GET /templates/{id}/builds/{build}/status` (`TemplateBuildInfo`): the part the catalog
/// reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TemplateBuildInfo {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: Option<BuildReason>,
}

/// Why a build failed (`BuildStatusReason`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BuildReason {
    #[serde(default)]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_body_names_only_what_it_sets() {
        let body = NewSandbox {
            template_id: "base".into(),
            timeout: 300,
            secure: true,
            allow_internet_access: true,
            ..NewSandbox::default()
        };
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "templateID": "base",
                "timeout": 300,
                "secure": true,
                "allow_internet_access": true,
                "network": {"allowPublicTraffic": false},
            })
        );
    }

    #[test]
    fn answers_ignore_what_they_do_not_read() {
        let a: SandboxAnswer = serde_json::from_str(
            r#"{"sandboxID":"i1","templateID":"t","clientID":"c","envdVersion":"0.2.0",
                "envdAccessToken":"tok","trafficAccessToken":null,"domain":"d","future":1}"#,
        )
        .unwrap();
        assert_eq!(a.sandbox_id, "i1");
        assert_eq!(a.envd_access_token.as_deref(), Some("tok"));
        assert_eq!(a.traffic_access_token, None);
        let l: ListedSandbox =
            serde_json::from_str(r#"{"sandboxID":"i2","state":"paused","metadata":null}"#).unwrap();
        assert_eq!(l.state, "paused");
        assert_eq!(l.metadata, None);
    }

    #[test]
    fn template_build_bodies_name_only_what_the_routes_take() {
        let request = TemplateBuildRequest {
            name: "std".into(),
            tags: vec!["default".into()],
        };
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            serde_json::json!({"name": "std", "tags": ["default"]})
        );
        let start = TemplateBuildStart {
            from_image: "img:1".into(),
        };
        assert_eq!(
            serde_json::to_value(&start).unwrap(),
            serde_json::json!({"fromImage": "img:1"})
        );
        let info: TemplateBuildInfo = serde_json::from_str(
            r#"{"templateID":"t","buildID":"b","status":"error","logs":[],
                "reason":{"message":"no such image","logEntries":[]}}"#,
        )
        .unwrap();
        assert_eq!(info.status, "error");
        assert_eq!(info.reason.unwrap().message, "no such image");
    }
}
