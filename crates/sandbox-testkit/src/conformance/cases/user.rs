//! The create request's default user (`[create.user]`): what names no user runs as it and
//! starts in its workdir; a backend without `default_user` refuses the request.

use sandbox_core::{ErrorKind, ExecRequest, SandboxUser};

use super::super::{CaseResult, Ctx, ensure, ensure_eq, expect_kind};
use super::{exec, scratch};

/// The account the case runs as: `nobody` is in every Debian-like image, and provisioned
/// below where the image lacks it.
const USER: &str = "nobody";

/// Adds root and [`USER`] to the image's account files where missing. A `FROM scratch` image
/// has no `/etc/passwd` at all (its one account is root, built into the backend); a file that
/// exists but lacks root would make root unknown, so root's line comes first.
const PROVISION: &str = "[ -e /etc/passwd ] || echo 'root:x:0:0:root:/:/bin/sh' > /etc/passwd; \
     grep -q '^nobody:' /etc/passwd || echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >> /etc/passwd; \
     [ -e /etc/group ] || echo 'root:x:0:' > /etc/group; \
     grep -q ':65534:' /etc/group || echo 'nogroup:x:65534:' >> /etc/group";

fn stdout(what: &str, r: &sandbox_core::ExecResult) -> Result<String, super::super::Failure> {
    ensure(r.exit_code == 0, || {
        format!(
            "{what} exited {}: {}",
            r.exit_code,
            super::super::preview(&r.stderr)
        )
    })?;
    Ok(String::from_utf8_lossy(&r.stdout).into_owned())
}

pub(super) async fn create_user_runs_what_names_none(ctx: &Ctx) -> CaseResult {
    // A directory no image has: the create must make it.
    let workdir = scratch(ctx, "home")?;
    let mut request = ctx.create_request();
    request.user = Some(SandboxUser::new(USER, workdir.clone())?);
    let h = ctx.create_with(request).await?;
    if ctx.caps().posix_shell {
        // As root, named: the backend resolves accounts when a call runs, so an account added
        // after the create is the sandbox's user from then on. (The fake keeps no account
        // files: any valid name is an account there.)
        let mut provision = ExecRequest::shell(PROVISION);
        provision.user = Some("root".to_owned());
        stdout("provisioning the account", &exec(ctx, &h, provision).await?)?;
    }
    let who = exec(ctx, &h, ExecRequest::argv("id", ["-un"])).await?;
    ensure_eq(
        "id -un of an exec naming no user",
        stdout("id -un", &who)?,
        format!("{USER}\n"),
    )?;
    let pwd = exec(ctx, &h, ExecRequest::argv("pwd", Vec::<String>::new())).await?;
    ensure_eq(
        "pwd of an exec naming no cwd",
        stdout("pwd", &pwd)?,
        format!("{workdir}\n"),
    )?;
    // The call's own user and cwd still win over the defaults.
    let mut as_root = ExecRequest::argv("id", ["-un"]);
    as_root.user = Some("root".to_owned());
    ensure_eq(
        "id -un of an exec naming root",
        stdout("id -un as root", &exec(ctx, &h, as_root).await?)?,
        "root\n".to_owned(),
    )?;
    let elsewhere = ExecRequest::argv("pwd", Vec::<String>::new()).cwd(super::path("/")?);
    ensure_eq(
        "pwd of an exec naming /",
        stdout("pwd in /", &exec(ctx, &h, elsewhere).await?)?,
        "/\n".to_owned(),
    )
}

pub(super) async fn create_with_user_is_unsupported(ctx: &Ctx) -> CaseResult {
    let mut request = ctx.create_request();
    request.user = Some(SandboxUser::new(USER, scratch(ctx, "home")?)?);
    let result = ctx.provider().create(request).await;
    if let Ok(h) = &result {
        ctx.track(h.id().clone());
    }
    expect_kind("create with a user", result, ErrorKind::Unsupported)
}
