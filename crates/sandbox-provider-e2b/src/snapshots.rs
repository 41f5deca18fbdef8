//! Snapshots and the template catalog on the control plane.
//!
//! - **Snapshots.** A snapshot is `POST /sandboxes/{id}/snapshots` (the snapshot deadline,
//!   never resent: a second call could take a second snapshot), listed by `GET /snapshots`
//!   (`sandboxID` when filtered, paged with `nextToken`), and deleted as the template it is on
//!   E2B, `DELETE /templates/{id}`: a 404 there is success (`[snapshot.delete_idempotent]`),
//!   and a refusal because a sandbox still uses it is `conflict` (`errors.rs`).
//! - **Tenants.** E2B's `SnapshotInfo` records neither the source sandbox nor a tenant, and one
//!   API key serves every tenant of this service. So a snapshot's name carries its tenant: the
//!   adapter names it `sbx-t<tenant>-<name>` (`sbx-t-<name>` for a source with no ownership
//!   tenant), the tenant read from the source's ownership metadata before the snapshot, and a
//!   listing reads the tenant and the caller's name back ([`owner_of`]). A create from a
//!   snapshot ([`E2bProvider::check_restore`]) boots only a snapshot listed with the request's
//!   own tenant; anything else (another tenant's, a plane's snapshot not taken here, a template,
//!   an invented ID) is one refusal naming nothing, `snapshot_not_found`, so it is no oracle.
//! - **The catalog.** `list_templates` is `GET /templates`. `ensure_standard_template` finds
//!   the configured template (`e2b_provider.template`, `name` or `name:tag`, the tag
//!   `default` when none is named), the build its tag names (`GET /templates/{id}/tags`), and
//!   that build's status in `GET /templates/{id}`: only a `ready` build of that tag is the
//!   standard template; an untagged, unfinished or failed build never is. A name that is not
//!   the team's may be the plane's public template (`GET /templates/aliases/{name}` says
//!   `public`), which the plane builds and keeps ready: it is the standard template under the
//!   default tag, and nothing is built for it.
//! - **Building it.** With a build spec (`e2b_provider.template_from_image`, E2B's
//!   `fromImage`), a team template that is missing, whose tag names no build, or whose tagged
//!   build failed is rebuilt: one `POST /v3/templates` under the template's name with the
//!   tag (never resent: a second one would be a second build), one start of that build from
//!   the image (`POST /v2/templates/{id}/builds/{build}`, never resent either), then its
//!   status polled (`GET /templates/{id}/builds/{build}/status`, the interval growing from
//!   [`POLL_FIRST`] to [`POLL_MAX`]) until `ready` or `error`, within
//!   `e2b_provider.template_build_timeout_seconds`. A tagged build still `waiting` or
//!   `building` (another caller's) is waited for within the same bound first, and rebuilt only
//!   if it fails or is still unfinished then. A build ending in `error`, or not ready in time,
//!   is an error and never the standard template; a ready one is returned only once the tag is
//!   read back naming a ready build. Without a build spec nothing is built: such a template
//!   is `unsupported`, naming the missing key. One process ensures once at a time, so its
//!   callers never build twice; two processes ensuring at once may each build, and then the
//!   later ready build carries the tag and the other is superseded.
//! - **Superseded builds.** Once the new build is ready it carries the tag, so the builds the
//!   tag named before (and failed builds of the template) are superseded: no tag of the
//!   standard template names them. The plane offers no delete of one build (`DELETE
//!   /templates/{id}` removes the whole template, the new build with it), so the adapter
//!   deletes nothing and leaves them to the plane: this workspace's own E2B API removes a
//!   build no tag names whenever a build, tag or untag of the template ends (an image a
//!   sandbox still runs from stays until the next one), and keeps failed builds' records only
//!   in memory, bounded; another plane keeps them as long as it keeps untagged builds. A
//!   build another tag still names is not superseded and stays usable under that tag.

use std::time::Duration;

use async_trait::async_trait;
use hyper::Method;
use sandbox_core::binding::owner_metadata;
use sandbox_core::{
    Error, ErrorKind, Operation, SandboxId, SandboxProvider, SnapshotId, SnapshotRef, Snapshots,
    Template, TemplateCatalog, TenantId,
};
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::control::{Call, segment};
use crate::errors::{self, provider_error};
use crate::provider::E2bProvider;
use crate::wire;

/// A snapshot listing's page size (the plane's maximum).
pub(crate) const SNAPSHOT_PAGE: u32 = 100;
/// The most pages one snapshot listing reads: a plane that keeps handing out new tokens is cut
/// off.
pub(crate) const MAX_SNAPSHOT_PAGES: usize = 1000;
/// The tag a template reference without one means.
pub(crate) const DEFAULT_TAG: &str = "default";
/// The first wait between two polls of a build's status: a build on a local engine can be
/// ready within a second.
pub(crate) const POLL_FIRST: Duration = Duration::from_millis(250);
/// The longest wait between two polls: image builds on a plane take minutes, and a status
/// call every few seconds is enough to notice the end without loading the plane.
pub(crate) const POLL_MAX: Duration = Duration::from_secs(2);
/// How a snapshot name taken here begins; the tenant's number (none for a source without an
/// ownership tenant), then `-`, then the caller's name follow.
const OWNER_PREFIX: &str = "sbx-t";

/// The name a snapshot of `tenant`'s sandbox is taken with (see the module docs).
fn owned_name(tenant: Option<TenantId>, name: Option<&str>) -> String {
    let tenant = tenant.map(|t| t.get().to_string()).unwrap_or_default();
    format!("{OWNER_PREFIX}{tenant}-{}", name.unwrap_or(""))
}

/// Whose snapshot a plane name says it is, and the caller's name in it: `None` for a name not
/// taken here. A plane may show a name under a namespace (`team/name`) or with a tag
/// (`name:tag`); both are looked through.
fn owner_of(raw: &str) -> Option<(Option<TenantId>, Option<String>)> {
    let last = raw.rsplit('/').next().unwrap_or(raw);
    let last = last.split_once(':').map_or(last, |(name, _)| name);
    let rest = last.strip_prefix(OWNER_PREFIX)?;
    let (digits, name) = rest.split_once('-')?;
    let tenant = if digits.is_empty() {
        None
    } else {
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(TenantId::new(digits.parse::<u64>().ok()?).ok()?)
    };
    Some((tenant, (!name.is_empty()).then(|| name.to_owned())))
}

/// The one refusal of a restore that names no snapshot of the request's tenant.
fn snapshot_not_found() -> Error {
    provider_error(
        Error::not_found(Operation::CREATE, "no such snapshot")
            .with_code(sandbox_core::ErrorCode::SnapshotNotFound),
    )
}

/// The tenant `metadata` (port form) names under the ownership key.
fn tenant_in(metadata: &sandbox_core::Metadata) -> Option<TenantId> {
    metadata
        .get(owner_metadata::TENANT)
        .and_then(|t| t.parse::<u64>().ok())
        .and_then(|t| TenantId::new(t).ok())
}

/// A snapshot ID the plane answered, checked.
fn snapshot_id(op: Operation, raw: &str) -> Result<SnapshotId, Error> {
    SnapshotId::new(raw).map_err(|e| errors::unreadable(op, format!("snapshot ID {raw:?}: {e}")))
}

/// A next-page token that can be sent back as it is, and has not been seen before.
fn next_token(
    op: Operation,
    answer: &crate::control::Answer,
    seen: &mut std::collections::HashSet<String>,
) -> Result<Option<String>, Error> {
    match answer.header("x-next-token").map(str::trim) {
        None | Some("") => Ok(None),
        Some(token) => {
            let safe = token.len() <= 4096
                && token
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !matches!(b, b'&' | b'#' | b'%'));
            if !safe || !seen.insert(token.to_owned()) {
                return Err(errors::unreadable(
                    op,
                    "a next-page token that repeats or cannot be sent back",
                ));
            }
            Ok(Some(token.to_owned()))
        }
    }
}

/// `name[:tag]` of the configured template, the tag [`DEFAULT_TAG`] when none is named.
fn split_template(reference: &str) -> (&str, &str) {
    match reference.trim().rsplit_once(':') {
        Some((name, tag)) if !name.is_empty() && !tag.is_empty() && !tag.contains('/') => {
            (name, tag)
        }
        _ => (reference.trim(), DEFAULT_TAG),
    }
}

/// The name a template shows: its first name, else its first alias, else its ID.
fn shown_name(id: &str, names: &[String], aliases: &[String]) -> String {
    names
        .first()
        .or_else(|| aliases.first())
        .cloned()
        .unwrap_or_else(|| id.to_owned())
}

impl E2bProvider {
    /// Refuses a create from a snapshot unless its template is a snapshot taken here of the
    /// request's own tenant (module docs).
    pub(crate) async fn check_restore(
        &self,
        request: &sandbox_core::CreateRequest,
    ) -> Result<(), Error> {
        let tenant = tenant_in(&request.metadata);
        let owned = self
            .listed_snapshots(None)
            .await
            .map_err(|e| e.with_operation(Operation::CREATE))?;
        let mine = owned.iter().any(|(s, taken_here)| {
            *taken_here && s.id.as_str() == request.template.as_str() && s.tenant == tenant
        });
        if mine {
            Ok(())
        } else {
            Err(snapshot_not_found())
        }
    }

    /// Every snapshot the plane lists (of `source`, when given), each with whether it was
    /// taken here: its name says so, and whose it is.
    async fn listed_snapshots(
        &self,
        source: Option<&SandboxId>,
    ) -> Result<Vec<(SnapshotRef, bool)>, Error> {
        let op = Operation::LIST_SNAPSHOTS;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut next: Option<String> = None;
        for _ in 0..MAX_SNAPSHOT_PAGES {
            let mut call = Call::new(op, Method::GET, "/snapshots", self.config().http_timeout())
                .idempotent()
                .param("limit", SNAPSHOT_PAGE.to_string());
            if let Some(source) = source {
                call = call.param("sandboxID", source.as_str());
            }
            if let Some(token) = &next {
                call = call.param("nextToken", token.clone());
            }
            let answer = self.control().send(&call).await?.expect(&[200])?;
            let page: Vec<wire::SnapshotInfo> = answer.decode()?;
            for info in page {
                let id = snapshot_id(op, &info.snapshot_id)?;
                let owner = info
                    .names
                    .iter()
                    .filter(|n| *n != id.as_str())
                    .find_map(|n| owner_of(n));
                let (tenant, name, taken_here) = match owner {
                    Some((tenant, name)) => (tenant, name, true),
                    None => (
                        None,
                        info.names.into_iter().find(|n| n != id.as_str()),
                        false,
                    ),
                };
                out.push((
                    SnapshotRef {
                        id,
                        name,
                        source: source.cloned(),
                        created_at: None,
                        tenant,
                    },
                    taken_here,
                ));
            }
            match next_token(op, &answer, &mut seen)? {
                None => return Ok(out),
                Some(token) => next = Some(token),
            }
        }
        Err(errors::unreadable(
            op,
            format!("more than {MAX_SNAPSHOT_PAGES} pages"),
        ))
    }

    /// Whether template `t` is the configured one, by ID or by any of its names.
    fn is_standard(&self, id: &str, names: &[String], aliases: &[String]) -> bool {
        let (name, _) = split_template(&self.config().template);
        id == name
            || names
                .iter()
                .chain(aliases)
                .any(|n| n == name || split_template(n).0 == name)
    }

    /// The configured template when it is not the team's own: the plane's public template of
    /// that name (E2B's `base`), which the plane builds and keeps ready itself, so its word
    /// that the name resolves is the whole check. Only its default tag is the public one.
    async fn public_standard(&self, name: &str, tag: &str) -> Result<Template, Error> {
        match self.public_lookup(name, tag).await? {
            Public::Ready(template) => Ok(template),
            Public::Absent => Err(self.missing_standard("is not on the plane")),
            Public::Refused(why) => Err(self.missing_standard(why)),
        }
    }

    /// What the alias lookup says of `name`: see [`public_standard`](Self::public_standard).
    async fn public_lookup(&self, name: &str, tag: &str) -> Result<Public, Error> {
        let op = Operation::ENSURE_TEMPLATE;
        let call = Call::new(
            op,
            Method::GET,
            format!("/templates/aliases/{}", segment(name)),
            self.config().http_timeout(),
        )
        .idempotent();
        let alias: wire::TemplateAlias = match self.control().send(&call).await?.expect(&[200]) {
            Ok(answer) => answer.decode()?,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Public::Absent),
            Err(e) => return Err(e),
        };
        if !alias.public || tag != DEFAULT_TAG {
            return Ok(Public::Refused(format!(
                "is not the team's, and {name:?} names no public template under the tag {tag:?}"
            )));
        }
        Ok(Public::Ready(Template {
            name: name.to_owned(),
            id: alias.template_id,
            status: "ready".to_owned(),
            standard: true,
            ..Template::default()
        }))
    }

    /// The refusal of a standard template that is not ready: without a build spec, or under
    /// a name the plane holds as a template that is not the team's.
    fn missing_standard(&self, why: impl std::fmt::Display) -> Error {
        let remedy = if self.config().template_build_image().is_some() {
            "this adapter builds only the team's own templates, and the plane holds this name otherwise; name another template"
        } else {
            "this adapter holds no build spec to build it from (e2b_provider.template_from_image is empty): set it, or build it on the plane (E2B's template build) and tag the ready build"
        };
        provider_error(Error::unsupported(
            Operation::ENSURE_TEMPLATE,
            format!(
                "the standard template {:?} (e2b_provider.template) {why}; {remedy}",
                self.config().template
            ),
        ))
    }

    /// The team's template `reference` (a name or an ID), or `None` when the team has none.
    async fn team_template(&self, reference: &str) -> Result<Option<wire::TemplateDetail>, Error> {
        let call = Call::new(
            Operation::ENSURE_TEMPLATE,
            Method::GET,
            format!("/templates/{}", segment(reference)),
            self.config().http_timeout(),
        )
        .idempotent();
        match self.control().send(&call).await?.expect(&[200]) {
            Ok(answer) => Ok(Some(answer.decode()?)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Where the team's template stands under `tag`: the build the tag names (its tags read
    /// from the plane), and that build's status in `detail`.
    async fn standing(&self, detail: &wire::TemplateDetail, tag: &str) -> Result<Standing, Error> {
        let call = Call::new(
            Operation::ENSURE_TEMPLATE,
            Method::GET,
            format!("/templates/{}/tags", segment(&detail.template_id)),
            self.config().http_timeout(),
        )
        .idempotent();
        let tags: Vec<wire::TemplateTag> =
            self.control().send(&call).await?.expect(&[200])?.decode()?;
        let Some(tagged) = tags.iter().find(|t| t.tag == tag) else {
            return Ok(Standing::Unusable(format!("has no build tagged {tag:?}")));
        };
        Ok(
            match detail.builds.iter().find(|b| b.build_id == tagged.build_id) {
                Some(build) if build.status == "ready" => Standing::Ready(Template {
                    name: shown_name(&detail.template_id, &detail.names, &detail.aliases),
                    id: detail.template_id.clone(),
                    status: "ready".to_owned(),
                    standard: true,
                    ..Template::default()
                }),
                Some(build) if matches!(build.status.as_str(), "waiting" | "building") => {
                    Standing::Unfinished(build.build_id.clone())
                }
                Some(build) => Standing::Unusable(format!(
                    "has build {} tagged {tag:?}, whose status is {:?}, not ready",
                    tagged.build_id, build.status
                )),
                None => Standing::Unusable(format!(
                    "names build {} under the tag {tag:?}, which its builds do not list",
                    tagged.build_id
                )),
            },
        )
    }

    /// Polls build `build` of template `template` until it is `ready` or `error`, or until
    /// `deadline`. A poll the plane fails to answer (unavailable, timed out, over capacity)
    /// is tried again at the next interval: the build goes on regardless.
    async fn await_build(
        &self,
        template: &str,
        build: &str,
        deadline: Instant,
    ) -> Result<Built, Error> {
        let op = Operation::ENSURE_TEMPLATE;
        let path = format!(
            "/templates/{}/builds/{}/status",
            segment(template),
            segment(build)
        );
        let mut wait = POLL_FIRST;
        let mut last = String::from("no status read yet");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Built::Unfinished(last));
            }
            let call = Call::new(
                op,
                Method::GET,
                path.clone(),
                self.config().http_timeout().min(left),
            )
            .idempotent();
            let answer = match self.control().send(&call).await {
                Ok(answer) => answer.expect(&[200]),
                Err(e) => Err(e),
            };
            match answer.and_then(|a| a.decode::<wire::TemplateBuildInfo>()) {
                Ok(info) => match info.status.as_str() {
                    "ready" => return Ok(Built::Ready),
                    "error" => {
                        let reason = info
                            .reason
                            .map(|r| r.message)
                            .filter(|m| !m.trim().is_empty())
                            .unwrap_or_else(|| "the plane gave no reason".to_owned());
                        return Ok(Built::Failed(reason));
                    }
                    // `waiting`, `building`, and any word a newer plane adds for a build
                    // that has not ended.
                    other => last = format!("status {other:?}"),
                },
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::Capacity
                    ) =>
                {
                    last = e.to_string();
                }
                Err(e) => return Err(e),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(wait.min(left)).await;
            wait = (wait * 2).min(POLL_MAX);
        }
    }

    /// One new build of the standard template from `image` (module docs): requested, started,
    /// awaited, and returned once the tag names a ready build.
    async fn build_standard(
        &self,
        name: &str,
        tag: &str,
        image: &str,
        why: &str,
    ) -> Result<Template, Error> {
        let op = Operation::ENSURE_TEMPLATE;
        let timeout = self.config().template_build_timeout();
        let deadline = Instant::now() + timeout;
        tracing::info!(
            template = name,
            tag,
            image,
            why,
            "e2b: building the standard template"
        );
        // Neither call is marked idempotent: each one sent again could make a second build.
        let call = Call::new(
            op,
            Method::POST,
            "/v3/templates",
            self.config().http_timeout(),
        )
        .json(&wire::TemplateBuildRequest {
            name: name.to_owned(),
            tags: vec![tag.to_owned()],
        })?;
        let requested: wire::TemplateBuildRequested = self
            .control()
            .send(&call)
            .await?
            .expect(&[200, 201, 202])?
            .decode()?;
        if requested.template_id.is_empty() || requested.build_id.is_empty() {
            return Err(errors::unreadable(
                op,
                "a build request answered without a template or build ID",
            ));
        }
        let (template_id, build_id) = (requested.template_id, requested.build_id);
        let call = Call::new(
            op,
            Method::POST,
            format!(
                "/v2/templates/{}/builds/{}",
                segment(&template_id),
                segment(&build_id)
            ),
            self.config().http_timeout(),
        )
        .json(&wire::TemplateBuildStart {
            from_image: image.to_owned(),
        })?;
        self.control()
            .send(&call)
            .await?
            .expect(&[200, 201, 202, 204])?;
        match self.await_build(&template_id, &build_id, deadline).await? {
            Built::Ready => {}
            Built::Failed(reason) => {
                return Err(provider_error(Error::internal(
                    op,
                    format!(
                        "the build {build_id} of the standard template {name:?} from {image} failed, so it is not used: {reason}"
                    ),
                )));
            }
            Built::Unfinished(last) => {
                return Err(provider_error(Error::timeout(
                    op,
                    format!(
                        "the build {build_id} of the standard template {name:?} from {image} was not ready within {timeout:?} (e2b_provider.template_build_timeout_seconds; last: {last}), so it is not used"
                    ),
                )));
            }
        }
        // Ready is not enough: a create boots what the tag names, so the tag is read back.
        let detail = self.team_template(&template_id).await?.ok_or_else(|| {
            provider_error(Error::unavailable(
                op,
                format!("the template {template_id} of the ready build {build_id} is gone"),
            ))
        })?;
        match self.standing(&detail, tag).await? {
            Standing::Ready(template) => {
                tracing::info!(template = name, tag, build = %build_id, "e2b: the standard template is built");
                Ok(template)
            }
            Standing::Unfinished(_) | Standing::Unusable(_) => {
                Err(provider_error(Error::internal(
                    op,
                    format!(
                        "the build {build_id} of the standard template {name:?} is ready, but the tag {tag:?} names no ready build"
                    ),
                )))
            }
        }
    }
}

/// What the alias lookup says of a template name that is not the team's.
enum Public {
    /// The plane's public template, ready under the default tag.
    Ready(Template),
    /// No template of that name.
    Absent,
    /// A name the lookup knows, but not as a public template under the tag asked for.
    Refused(String),
}

/// Where the team's template stands under the configured tag.
enum Standing {
    /// The tag names a ready build: the standard template.
    Ready(Template),
    /// The tag names a build that has not ended (its ID).
    Unfinished(String),
    /// No usable build under the tag, and why.
    Unusable(String),
}

/// How a build awaited ended.
enum Built {
    Ready,
    /// Status `error`, with the plane's reason.
    Failed(String),
    /// Not ended by the deadline; the last thing read.
    Unfinished(String),
}

#[async_trait]
impl Snapshots for E2bProvider {
    async fn create_snapshot(
        &self,
        sandbox: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotRef, Error> {
        let op = Operation::CREATE_SNAPSHOT;
        // The source's ownership tenant, which the plane's answer does not carry; reading it
        // also makes a missing sandbox `not_found` before anything is snapshotted.
        let source = self.get(sandbox).await.map_err(|e| e.with_operation(op))?;
        let tenant = tenant_in(&source.metadata);
        let call = Call::new(
            op,
            Method::POST,
            format!("/sandboxes/{}/snapshots", segment(sandbox.as_str())),
            self.config().snapshot_timeout(),
        )
        .json(&wire::SnapshotRequest {
            name: Some(owned_name(tenant, name)),
        })?;
        let info: wire::SnapshotInfo = self
            .control()
            .send(&call)
            .await?
            .expect(&[200, 201])?
            .decode()?;
        Ok(SnapshotRef {
            id: snapshot_id(op, &info.snapshot_id)?,
            name: name.map(str::to_owned),
            source: Some(sandbox.clone()),
            created_at: Some(OffsetDateTime::now_utc()),
            tenant,
        })
    }

    async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), Error> {
        let call = Call::new(
            Operation::DELETE_SNAPSHOT,
            Method::DELETE,
            format!("/templates/{}", segment(id.as_str())),
            self.config().http_timeout(),
        )
        .idempotent();
        match self.control().send(&call).await?.expect(&[200, 204]) {
            Ok(_) => Ok(()),
            // [snapshot.delete_idempotent]: already gone.
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn list_snapshots(&self, source: Option<&SandboxId>) -> Result<Vec<SnapshotRef>, Error> {
        Ok(self
            .listed_snapshots(source)
            .await?
            .into_iter()
            .map(|(snapshot, _)| snapshot)
            .collect())
    }
}

#[async_trait]
impl TemplateCatalog for E2bProvider {
    async fn list_templates(&self) -> Result<Vec<Template>, Error> {
        let call = Call::new(
            Operation::LIST_TEMPLATES,
            Method::GET,
            "/templates",
            self.config().http_timeout(),
        )
        .idempotent();
        let listed: Vec<wire::TemplateListed> =
            self.control().send(&call).await?.expect(&[200])?.decode()?;
        let mut out: Vec<Template> = listed
            .into_iter()
            .map(|t| Template {
                standard: self.is_standard(&t.template_id, &t.names, &t.aliases),
                name: shown_name(&t.template_id, &t.names, &t.aliases),
                status: t.build_status,
                id: t.template_id,
                ..Template::default()
            })
            .collect();
        // The team's listing leaves out the plane's public templates; the standard one is
        // listed all the same when it is one of them.
        if !out.iter().any(|t| t.standard) {
            let (name, tag) = split_template(&self.config().template);
            match self.public_standard(name, tag).await {
                Ok(public) => out.push(public),
                Err(e) if e.kind() == ErrorKind::Unsupported => {}
                Err(e) => return Err(e.with_operation(Operation::LIST_TEMPLATES)),
            }
        }
        Ok(out)
    }

    async fn ensure_standard_template(&self) -> Result<Template, Error> {
        let _one_at_a_time = self.ensuring().await;
        let (name, tag) = split_template(&self.config().template);
        let image = self.config().template_build_image();
        let Some(detail) = self.team_template(name).await? else {
            return match (self.public_lookup(name, tag).await?, image) {
                (Public::Ready(template), _) => Ok(template),
                (Public::Absent, Some(image)) => {
                    self.build_standard(name, tag, image, "the team has no such template")
                        .await
                }
                (Public::Absent, None) => Err(self.missing_standard("is not on the plane")),
                (Public::Refused(why), _) => Err(self.missing_standard(why)),
            };
        };
        let why = match self.standing(&detail, tag).await? {
            Standing::Ready(template) => return Ok(template),
            Standing::Unusable(why) => why,
            Standing::Unfinished(build) => {
                let Some(image) = image else {
                    return Err(self.missing_standard(format!(
                        "has build {build} tagged {tag:?}, which has not finished"
                    )));
                };
                // Another caller's build: waited for, and used once the tag names it ready.
                let deadline = Instant::now() + self.config().template_build_timeout();
                let why = match self
                    .await_build(&detail.template_id, &build, deadline)
                    .await?
                {
                    Built::Ready => match self.team_template(&detail.template_id).await? {
                        Some(detail) => match self.standing(&detail, tag).await? {
                            Standing::Ready(template) => return Ok(template),
                            Standing::Unfinished(_) | Standing::Unusable(_) => format!(
                                "its build {build} is ready, but the tag {tag:?} names no ready build"
                            ),
                        },
                        None => format!("its template went away while build {build} ran"),
                    },
                    Built::Failed(reason) => format!("its tagged build {build} failed: {reason}"),
                    Built::Unfinished(last) => {
                        format!("its tagged build {build} did not finish in time ({last})")
                    }
                };
                return self.build_standard(name, tag, image, &why).await;
            }
        };
        match image {
            Some(image) => self.build_standard(name, tag, image, &why).await,
            None => Err(self.missing_standard(why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_references_split_on_their_tag() {
        assert_eq!(split_template("base"), ("base", "default"));
        assert_eq!(split_template("env:v2"), ("env", "v2"));
        assert_eq!(split_template(" env:v2 "), ("env", "v2"));
        assert_eq!(split_template("team/env:v2"), ("team/env", "v2"));
        assert_eq!(split_template("env:"), ("env:", "default"));
    }

    #[test]
    fn a_snapshot_name_carries_its_tenant_both_ways() {
        let t = |n: u64| TenantId::new(n).ok();
        assert_eq!(owned_name(t(42), Some("own-x")), "sbx-t42-own-x");
        assert_eq!(owned_name(None, Some("a")), "sbx-t-a");
        assert_eq!(owned_name(t(7), None), "sbx-t7-");
        assert_eq!(
            owner_of("sbx-t42-own-x"),
            Some((t(42), Some("own-x".to_owned())))
        );
        // A caller's name that looks like a tenant is still the caller's name.
        assert_eq!(owner_of("sbx-t3-5-x"), Some((t(3), Some("5-x".to_owned()))));
        assert_eq!(owner_of("sbx-t-a"), Some((None, Some("a".to_owned()))));
        assert_eq!(owner_of("sbx-t7-"), Some((t(7), None)));
        // A plane's namespace and tag are looked through.
        assert_eq!(
            owner_of("team-1/sbx-t9-snap:default"),
            Some((t(9), Some("snap".to_owned())))
        );
        // Names not taken here are no one's.
        for foreign in ["my-snap", "sbx-tx-a", "sbx-t0-a", "sbx-t12", ""] {
            assert_eq!(owner_of(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn the_ownership_tenant_is_read_when_it_is_one() {
        let with = |v: &str| {
            sandbox_core::Metadata::from([(owner_metadata::TENANT.to_owned(), v.to_owned())])
        };
        assert_eq!(tenant_in(&with("7")).map(TenantId::get), Some(7));
        assert_eq!(tenant_in(&with("0")), None);
        assert_eq!(tenant_in(&with("x")), None);
        assert_eq!(tenant_in(&sandbox_core::Metadata::new()), None);
    }
}
