//! The control plane's JSON, with the E2B API's field names.
//!
//! Create bodies are read as a JSON object first and every key is judged: the ones this
//! service honours are decoded, the ones it cannot honour are refused by name (never accepted
//! and left unapplied), and unknown ones are refused too, since an option we do not know is
//! one we do not honour.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The `clientID` every sandbox reports (deprecated in the API; the SDKs still require it).
pub const CLIENT_ID: &str = "6532622b";

/// A create, as far as this service honours it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewSandbox {
    pub template: String,
    pub timeout: Option<i64>,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    /// `allow_internet_access: false`, or `network.denyOut: ["0.0.0.0/0"]`.
    pub deny_internet: bool,
    /// `autoPause: true`: paused, not killed, at the timeout.
    pub auto_pause: bool,
    /// `network.allowPublicTraffic: false`: the sandbox's preview ports want its traffic
    /// token.
    pub traffic_closed: bool,
}

/// Why a create body was refused: the message names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

fn refuse(field: &str, why: &str) -> Refused {
    Refused(format!("{field}: {why}"))
}

fn string_map(field: &str, value: &Value) -> Result<BTreeMap<String, String>, Refused> {
    match value {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(refuse(field, "values must be strings")),
            })
            .collect(),
        _ => Err(refuse(field, "must be an object of strings")),
    }
}

fn is_off(value: &Value) -> bool {
    matches!(value, Value::Null | Value::Bool(false))
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Reads a create body of `POST /v2/sandboxes` (`legacy = false`) or `POST /sandboxes`.
pub fn parse_new_sandbox(body: &[u8], legacy: bool) -> Result<NewSandbox, Refused> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| Refused(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(object) = value else {
        return Err(Refused("the body must be a JSON object".to_owned()));
    };
    let mut out = NewSandbox::default();
    let mut keep_memory = None;
    for (key, value) in &object {
        match key.as_str() {
            "templateID" => match value {
                Value::String(s) if !s.is_empty() => out.template = s.clone(),
                _ => return Err(refuse("templateID", "must be a non-empty string")),
            },
            "timeout" => match value {
                Value::Null => {}
                Value::Number(n) => {
                    out.timeout =
                        Some(n.as_i64().ok_or_else(|| {
                            refuse("timeout", "must be a whole number of seconds")
                        })?);
                }
                _ => return Err(refuse("timeout", "must be a whole number of seconds")),
            },
            "metadata" => out.metadata = string_map("metadata", value)?,
            "envVars" => out.env = string_map("envVars", value)?,
            "allow_internet_access" => match value {
                Value::Null | Value::Bool(true) => {}
                Value::Bool(false) => out.deny_internet = true,
                _ => return Err(refuse("allow_internet_access", "must be a boolean")),
            },
            "autoPause" => match value {
                Value::Null | Value::Bool(false) => {}
                Value::Bool(true) => out.auto_pause = true,
                _ => return Err(refuse("autoPause", "must be a boolean")),
            },
            // Judged with autoPause below: the keys come in any order.
            "autoPauseMemory" => match value {
                Value::Null => {}
                Value::Bool(keep) => keep_memory = Some(*keep),
                _ => return Err(refuse("autoPauseMemory", "must be a boolean")),
            },
            "autoResume" => {
                let enabled = value.get("enabled").cloned().unwrap_or(Value::Null);
                if !is_off(&enabled) {
                    return Err(refuse(
                        "autoResume",
                        "resuming a paused sandbox on traffic is not supported by this server; a paused sandbox resumes on connect",
                    ));
                }
            }
            "secure" if legacy => {
                // Every sandbox is secured: it always gets an access token.
            }
            "network" => parse_network(value, &mut out)?,
            "volumeMounts" if is_empty(value) => {}
            "volumeMounts" => {
                return Err(refuse(
                    "volumeMounts",
                    "volumes are not supported by this server",
                ));
            }
            "mcp" if value.is_null() => {}
            "mcp" => {
                return Err(refuse(
                    "mcp",
                    "the MCP gateway is not supported by this server",
                ));
            }
            "iam" if value.is_null() => {}
            "iam" => {
                return Err(refuse(
                    "iam",
                    "workload identity tokens are not supported by this server",
                ));
            }
            other => {
                let shown: String = other.chars().take(64).collect();
                return Err(Refused(format!(
                    "{shown}: not an option this server knows, so it cannot honour it"
                )));
            }
        }
    }
    if out.template.is_empty() {
        return Err(refuse("templateID", "is required"));
    }
    if out.auto_pause && keep_memory == Some(false) {
        return Err(refuse(
            "autoPauseMemory",
            "filesystem-only pause is not supported by this server: its pause keeps the memory",
        ));
    }
    Ok(out)
}

fn parse_network(value: &Value, out: &mut NewSandbox) -> Result<(), Refused> {
    let object: &Map<String, Value> = match value {
        Value::Null => return Ok(()),
        Value::Object(o) => o,
        _ => return Err(refuse("network", "must be an object")),
    };
    for (key, value) in object {
        let field = format!("network.{key}");
        match key.as_str() {
            // Closed: the preview ports (`e2b::preview`) answer only requests that carry the
            // sandbox's traffic token.
            "allowPublicTraffic" if matches!(value, Value::Null | Value::Bool(_)) => {
                out.traffic_closed = matches!(value, Value::Bool(false));
            }
            "allowOut" if is_empty(value) => {}
            "allowOut" => {
                let has_domain = value.as_array().is_some_and(|a| {
                    a.iter().any(|v| {
                        v.as_str()
                            .is_some_and(|s| s.parse::<std::net::IpAddr>().is_err() && !is_cidr(s))
                    })
                });
                let why = if has_domain {
                    "allowing domains is not supported by this server (it enforces only all-or-nothing internet access)"
                } else {
                    "per-destination allow rules are not supported by this server (it enforces only all-or-nothing internet access)"
                };
                return Err(refuse("allowOut", why).with_field(&field));
            }
            "denyOut" if is_empty(value) => {}
            "denyOut" => {
                let all = value
                    .as_array()
                    .is_some_and(|a| a.len() == 1 && a[0].as_str() == Some("0.0.0.0/0"));
                if !all {
                    return Err(refuse(
                        "denyOut",
                        "only [\"0.0.0.0/0\"] (no internet access) is supported by this server",
                    )
                    .with_field(&field));
                }
                out.deny_internet = true;
            }
            "egressProxy" if value.is_null() => {}
            "egressProxy" => {
                return Err(refuse(
                    "egressProxy",
                    "egress proxies are not supported by this server",
                )
                .with_field(&field));
            }
            "rules" if is_empty(value) => {}
            "rules" => {
                return Err(refuse(
                    "rules",
                    "network rules (header transforms) are not supported by this server",
                )
                .with_field(&field));
            }
            "maskRequestHost" | "dnsServers" | "httpsPorts" if is_empty(value) => {}
            other => {
                let shown: String = other.chars().take(64).collect();
                return Err(Refused(format!(
                    "network.{shown}: not supported by this server"
                )));
            }
        }
    }
    Ok(())
}

impl Refused {
    /// The message with the dotted field in front too, so both spellings are named.
    fn with_field(self, field: &str) -> Refused {
        Refused(format!("{field} ({})", self.0))
    }
}

fn is_cidr(text: &str) -> bool {
    text.split_once('/').is_some_and(|(ip, bits)| {
        ip.parse::<std::net::IpAddr>().is_ok() && bits.parse::<u8>().is_ok()
    })
}

/// A timeout or connect body: `{"timeout": N}`, optional where the route allows.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TimeoutBody {
    #[serde(default)]
    pub timeout: Option<i64>,
    /// Sent by connect for a reboot-style resume; irrelevant to a running sandbox.
    #[serde(default)]
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: `{}`, `{"memory": bool}`, `{"requireHealthyGuest": bool}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseBody {
    /// `false` asks for a filesystem-only pause, which this server does not do.
    #[serde(default)]
    pub memory: Option<bool>,
    /// Refuse the pause unless the sandbox's envd answers first.
    #[serde(default)]
    pub require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/resume` (the legacy resume): `timeout` defaults to 15 s there.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeBody {
    #[serde(default)]
    pub timeout: Option<i64>,
    /// Deprecated in the API; a sandbox's timeout action is fixed at its create here.
    #[serde(default)]
    pub auto_pause: Option<bool>,
    /// `false` asks for a reboot-style resume, which this server does not do.
    #[serde(default)]
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/refreshes`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RefreshBody {
    #[serde(default)]
    pub duration: Option<i64>,
}

/// `Sandbox`: the answer of create and connect.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxAnswer {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: String,
    pub envd_access_token: String,
    /// The preview ports' token when public traffic is closed, else `null`.
    pub traffic_access_token: Option<String>,
    pub domain: String,
}

/// `ListedSandbox`, and with [`SandboxDetail`] the answer of get.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub started_at: String,
    pub end_at: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: &'static str,
    pub envd_version: String,
    pub metadata: BTreeMap<String, String>,
}

/// `SandboxDetail`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(flatten)]
    pub listed: ListedSandbox,
    pub envd_access_token: String,
    pub allow_internet_access: bool,
    pub domain: String,
    pub lifecycle: Lifecycle,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub auto_resume: bool,
    pub on_timeout: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<NewSandbox, Refused> {
        parse_new_sandbox(json.as_bytes(), false)
    }

    #[test]
    fn the_sdks_bodies_are_accepted() {
        let plain = parse(r#"{"templateID":"base","metadata":{},"envVars":{}}"#).unwrap();
        assert_eq!(plain.template, "base");
        assert_eq!(plain.timeout, None);
        let full = parse(
            r#"{"templateID":"base","timeout":120,"metadata":{"a":"b"},"envVars":{"FOO":"bar"},
                "allow_internet_access":false,"autoPause":false,"autoResume":{"enabled":false},
                "network":{"allowPublicTraffic":false,"denyOut":["0.0.0.0/0"]},"mcp":null}"#,
        )
        .unwrap();
        assert_eq!(full.timeout, Some(120));
        assert_eq!(full.metadata["a"], "b");
        assert_eq!(full.env["FOO"], "bar");
        assert!(full.deny_internet);
        assert!(
            parse_new_sandbox(br#"{"templateID":"base","secure":true}"#, true).is_ok(),
            "the legacy route's secure flag"
        );
    }

    #[test]
    fn options_that_cannot_be_honoured_are_refused_by_name() {
        for (body, field) in [
            (
                r#"{"templateID":"b","volumeMounts":[{"name":"v","path":"/v"}]}"#,
                "volumeMounts",
            ),
            (r#"{"templateID":"b","mcp":{"x":{}}}"#, "mcp"),
            (
                r#"{"templateID":"b","iam":{"tokens":{"t":{"audience":"a","tokenType":"JWT-SVID"}}}}"#,
                "iam",
            ),
            (
                r#"{"templateID":"b","network":{"egressProxy":{"address":"p:1"}}}"#,
                "egressProxy",
            ),
            (
                r#"{"templateID":"b","network":{"allowOut":["example.com"]}}"#,
                "allowOut",
            ),
            (
                r#"{"templateID":"b","network":{"allowOut":["1.1.1.1"],"denyOut":["0.0.0.0/0"]}}"#,
                "allowOut",
            ),
            (
                r#"{"templateID":"b","network":{"rules":{"h":[{"transform":{}}]}}}"#,
                "rules",
            ),
            (
                r#"{"templateID":"b","network":{"denyOut":["10.0.0.0/8"]}}"#,
                "denyOut",
            ),
            (
                r#"{"templateID":"b","autoPause":true,"autoPauseMemory":false}"#,
                "autoPauseMemory",
            ),
            (r#"{"templateID":"b","autoPause":"yes"}"#, "autoPause"),
            (
                r#"{"templateID":"b","autoResume":{"enabled":true}}"#,
                "autoResume",
            ),
            (r#"{"templateID":"b","secure":true}"#, "secure"),
            (r#"{"templateID":"b","fancyNewOption":1}"#, "fancyNewOption"),
            (r#"{"metadata":{}}"#, "templateID"),
            (r#"{"templateID":"b","timeout":"5"}"#, "timeout"),
            (r#"{"templateID":"b","envVars":{"A":1}}"#, "envVars"),
        ] {
            let Refused(message) = parse(body).unwrap_err();
            assert!(message.contains(field), "{body}: {message}");
        }
        assert!(parse("[]").is_err());
        assert!(parse("{").is_err());
    }

    #[test]
    fn auto_pause_is_read_and_keeps_memory() {
        assert!(!parse(r#"{"templateID":"b"}"#).unwrap().auto_pause);
        assert!(
            !parse(r#"{"templateID":"b","autoPause":false}"#)
                .unwrap()
                .auto_pause
        );
        for body in [
            r#"{"templateID":"b","autoPause":true}"#,
            r#"{"templateID":"b","autoPause":true,"autoPauseMemory":true}"#,
            r#"{"autoPauseMemory":true,"templateID":"b","autoPause":true,"autoResume":{"enabled":false}}"#,
        ] {
            assert!(parse(body).unwrap().auto_pause, "{body}");
        }
        // Without autoPause, the memory flag means nothing.
        assert!(parse(r#"{"templateID":"b","autoPauseMemory":false}"#).is_ok());
    }

    #[test]
    fn answers_use_the_apis_field_names() {
        let answer = SandboxAnswer {
            template_id: "base".into(),
            sandbox_id: "i1".into(),
            client_id: CLIENT_ID.into(),
            envd_version: "0.6.4".into(),
            envd_access_token: "t".into(),
            traffic_access_token: Some("u".into()),
            domain: "localhost".into(),
        };
        let json = serde_json::to_value(&answer).unwrap();
        for key in [
            "templateID",
            "sandboxID",
            "clientID",
            "envdVersion",
            "envdAccessToken",
            "trafficAccessToken",
            "domain",
        ] {
            assert!(json.get(key).is_some(), "{key}: {json}");
        }
    }
}
