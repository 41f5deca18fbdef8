//! What a started process gets: its working directory, environment and identity.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use sandbox_envd::{Code, ConnectError};

use crate::sys::Credentials;
use crate::users::{AccountFiles, User};

/// `PATH` for processes when the agent itself has none (a `FROM scratch` image started
/// without an environment): the usual Debian default.
pub(crate) const FALLBACK_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The working directory, as envd resolves it: the request's `cwd`, else the default
/// workdir, else the user's home; `~` and `~/…` are the home; a relative path is taken from
/// the home; `.` and `..` are resolved lexically. It must exist.
pub(crate) fn working_dir(
    requested: Option<&str>,
    user: &User,
    default_workdir: Option<&Path>,
) -> Result<PathBuf, ConnectError> {
    let text = match requested {
        Some(p) if !p.is_empty() => p.to_owned(),
        _ => default_workdir
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let path = if text == "~" {
        user.home.clone()
    } else if let Some(rest) = text.strip_prefix("~/") {
        user.home.join(rest)
    } else if text.starts_with('~') {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!(
                "failed to expand path '{text}' for user '{}': cannot expand user-specific home dir",
                user.name
            ),
        ));
    } else {
        user.home.join(&text)
    };
    let path = clean(&path);
    if !path.exists() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("cwd '{}' does not exist", path.display()),
        ));
    }
    Ok(path)
}

/// `path` made absolute and without `.` or `..` (never above the root).
fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The environment: `PATH` (the agent's), `HOME`, `USER` and `LOGNAME` of the user, the
/// agent's default environment, then the request's `envs`; a later value wins.
pub(crate) fn environment(
    user: &User,
    defaults: &[(String, String)],
    request: &BTreeMap<String, String>,
    agent_path: Option<String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".to_owned(),
        agent_path.unwrap_or_else(|| FALLBACK_PATH.to_owned()),
    );
    env.insert("HOME".to_owned(), user.home.to_string_lossy().into_owned());
    env.insert("USER".to_owned(), user.name.clone());
    env.insert("LOGNAME".to_owned(), user.name.clone());
    for (k, v) in defaults {
        env.insert(k.clone(), v.clone());
    }
    for (k, v) in request {
        env.insert(k.clone(), v.clone());
    }
    env
}

/// Who the process runs as: switched to `user` when the agent is root; when it is not, only
/// its own user can be served.
pub(crate) fn credentials(
    user: &User,
    accounts: &AccountFiles,
    agent_uid: u32,
) -> Result<Option<Credentials>, ConnectError> {
    if agent_uid == 0 {
        // A group file that cannot be read leaves the primary group only, as a missing
        // membership would.
        let groups = accounts.groups_of(user).unwrap_or_else(|_| vec![user.gid]);
        return Ok(Some(Credentials {
            uid: user.uid,
            gid: user.gid,
            groups,
        }));
    }
    if user.uid == agent_uid {
        return Ok(None);
    }
    Err(ConnectError::new(
        Code::PermissionDenied,
        format!(
            "the agent runs as uid {agent_uid} and cannot start processes as '{}' (uid {})",
            user.name, user.uid
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(home: &Path) -> User {
        User {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: home.to_owned(),
            shell: PathBuf::from("/bin/sh"),
        }
    }

    #[test]
    fn working_directories_resolve_as_envd_resolves_them() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join("sub")).unwrap();
        let u = user(home.path());
        let h = home.path().to_owned();
        let check = |req: Option<&str>, default: Option<&Path>, want: &Path| {
            assert_eq!(working_dir(req, &u, default).unwrap(), want, "{req:?}");
        };
        check(None, None, &h);
        check(Some(""), None, &h);
        check(Some("~"), None, &h);
        check(Some("~/sub"), None, &h.join("sub"));
        check(Some("sub"), None, &h.join("sub"));
        check(Some("sub/../sub/."), None, &h.join("sub"));
        check(Some("/"), None, Path::new("/"));
        check(None, Some(&h.join("sub")), &h.join("sub"));
        check(Some("/tmp"), Some(&h.join("sub")), Path::new("/tmp"));
        let e = working_dir(Some("/nonexistent/dir"), &u, None).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert_eq!(e.message, "cwd '/nonexistent/dir' does not exist");
        let e = working_dir(Some("~root"), &u, None).unwrap_err();
        assert!(e.message.contains("cannot expand"), "{e}");
        assert_eq!(clean(Path::new("/../a/./b/..")), PathBuf::from("/a"));
    }

    #[test]
    fn later_environment_values_win() {
        let u = user(Path::new("/home/user"));
        let defaults = vec![("A".to_owned(), "default".to_owned())];
        let request = BTreeMap::from([
            ("A".to_owned(), "request".to_owned()),
            ("HOME".to_owned(), "/elsewhere".to_owned()),
        ]);
        let env = environment(&u, &defaults, &request, None);
        assert_eq!(env["A"], "request");
        assert_eq!(env["HOME"], "/elsewhere");
        assert_eq!(env["USER"], "user");
        assert_eq!(env["PATH"], FALLBACK_PATH);
        let env = environment(&u, &defaults, &BTreeMap::new(), Some("/bin".into()));
        assert_eq!(
            (env["A"].as_str(), env["PATH"].as_str()),
            ("default", "/bin")
        );
    }

    #[test]
    fn only_root_switches_users() {
        let u = user(Path::new("/home/user"));
        let accounts = AccountFiles {
            passwd: PathBuf::from("/nonexistent"),
            group: PathBuf::from("/nonexistent"),
        };
        assert_eq!(
            credentials(&u, &accounts, 0).unwrap(),
            Some(Credentials {
                uid: 1000,
                gid: 1000,
                groups: vec![1000]
            })
        );
        assert_eq!(credentials(&u, &accounts, 1000).unwrap(), None);
        let e = credentials(&u, &accounts, 1001).unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied);
    }
}
