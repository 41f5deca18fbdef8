//! Users and groups, read from `/etc/passwd` and `/etc/group` by the agent itself.
//!
//! The agent is a static binary, and static glibc has no NSS: `getpwnam` cannot be trusted to
//! see the image's accounts. The two files are the whole source of truth inside a sandbox
//! image, so they are parsed here, bounded, and re-read on every lookup (an image or a user
//! may add accounts while the agent runs, e.g. `useradd` in a setup command).

use std::path::{Path, PathBuf};

/// The most of `/etc/passwd` or `/etc/group` read; a larger file is refused, not truncated.
pub const MAX_ACCOUNT_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// One account of `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: PathBuf,
}

/// Where the account files are; tests point these at a temporary directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountFiles {
    pub passwd: PathBuf,
    pub group: PathBuf,
}

impl Default for AccountFiles {
    fn default() -> Self {
        Self {
            passwd: PathBuf::from("/etc/passwd"),
            group: PathBuf::from("/etc/group"),
        }
    }
}

/// Why an account lookup failed.
#[derive(Debug)]
pub enum LookupError {
    /// The file could not be read (missing, unreadable, too large).
    Read { path: PathBuf, reason: String },
}

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read { path, reason } => write!(f, "cannot read {}: {reason}", path.display()),
        }
    }
}

impl std::error::Error for LookupError {}

/// The account of an image that has no `/etc/passwd` at all (a `FROM scratch` image, the
/// default busybox sandbox image): root, as the container runtime itself runs a process
/// there. Nothing else exists in such an image.
pub fn builtin_root() -> User {
    User {
        name: "root".to_owned(),
        uid: 0,
        gid: 0,
        home: PathBuf::from("/"),
        shell: PathBuf::from("/bin/sh"),
    }
}

impl AccountFiles {
    /// The account named `name`, or `None` when there is none. Without a passwd file only
    /// root exists ([`builtin_root`]).
    pub fn user_by_name(&self, name: &str) -> Result<Option<User>, LookupError> {
        let Some(text) = read_if_present(&self.passwd)? else {
            return Ok((name == "root").then(builtin_root));
        };
        Ok(text
            .lines()
            .filter_map(parse_passwd_line)
            .find(|u| u.name == name))
    }

    /// The account with `uid` (the first one, as `getpwuid` answers). Without a passwd file
    /// only uid 0 exists ([`builtin_root`]).
    pub fn user_by_uid(&self, uid: u32) -> Result<Option<User>, LookupError> {
        let Some(text) = read_if_present(&self.passwd)? else {
            return Ok((uid == 0).then(builtin_root));
        };
        Ok(text
            .lines()
            .filter_map(parse_passwd_line)
            .find(|u| u.uid == uid))
    }

    /// The name of group `gid`, or `None`. Without a group file only gid 0, `root`, exists.
    pub fn group_name(&self, gid: u32) -> Result<Option<String>, LookupError> {
        let Some(text) = read_if_present(&self.group)? else {
            return Ok((gid == 0).then(|| "root".to_owned()));
        };
        Ok(text
            .lines()
            .filter_map(parse_group_line)
            .find(|g| g.gid == gid)
            .map(|g| g.name))
    }

    /// The supplementary groups `user` is a member of (by name in the group's member list),
    /// plus its primary group, without duplicates.
    pub fn groups_of(&self, user: &User) -> Result<Vec<u32>, LookupError> {
        let Some(text) = read_if_present(&self.group)? else {
            return Ok(vec![user.gid]);
        };
        let mut gids = vec![user.gid];
        for g in text.lines().filter_map(parse_group_line) {
            if g.members.iter().any(|m| m == &user.name) && !gids.contains(&g.gid) {
                gids.push(g.gid);
            }
        }
        Ok(gids)
    }
}

#[derive(Debug)]
struct Group {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// The file's text, or `None` when it does not exist: an image without account files is a
/// real case, and means "root only". Anything else that stops the read (a FIFO, a device, a
/// file too large, no permission) stays an error.
fn read_if_present(path: &Path) -> Result<Option<String>, LookupError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => read_bounded(path).map(Some),
    }
}

fn read_bounded(path: &Path) -> Result<String, LookupError> {
    use std::io::Read as _;
    let err = |reason: String| LookupError::Read {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let meta = file.metadata().map_err(|e| err(e.to_string()))?;
    // A FIFO or a device would never end or never say its size: only regular files are read.
    if !meta.is_file() {
        return Err(err("not a regular file".into()));
    }
    let mut buf = Vec::new();
    file.take(MAX_ACCOUNT_FILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| err(e.to_string()))?;
    if buf.len() as u64 > MAX_ACCOUNT_FILE_BYTES {
        return Err(err(format!("larger than {MAX_ACCOUNT_FILE_BYTES} bytes")));
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// `name:password:uid:gid:gecos:home:shell`; comments, blanks and malformed lines are skipped,
/// as libc's files backend skips them.
fn parse_passwd_line(line: &str) -> Option<User> {
    if line.starts_with('#') {
        return None;
    }
    let mut f = line.split(':');
    let name = f.next().filter(|n| !n.is_empty())?;
    let _password = f.next()?;
    let uid = f.next()?.parse().ok()?;
    let gid = f.next()?.parse().ok()?;
    let _gecos = f.next()?;
    let home = f.next()?;
    let shell = f.next().unwrap_or("");
    Some(User {
        name: name.to_owned(),
        uid,
        gid,
        home: PathBuf::from(if home.is_empty() { "/" } else { home }),
        shell: PathBuf::from(shell),
    })
}

/// `name:password:gid:member,member`.
fn parse_group_line(line: &str) -> Option<Group> {
    if line.starts_with('#') {
        return None;
    }
    let mut f = line.split(':');
    let name = f.next().filter(|n| !n.is_empty())?;
    let _password = f.next()?;
    let gid = f.next()?.parse().ok()?;
    let members = f
        .next()
        .unwrap_or("")
        .split(',')
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect();
    Some(Group {
        name: name.to_owned(),
        gid,
        members,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(passwd: &str, group: &str) -> (tempdir::Dir, AccountFiles) {
        let dir = tempdir::Dir::new();
        std::fs::write(dir.path().join("passwd"), passwd).unwrap();
        std::fs::write(dir.path().join("group"), group).unwrap();
        let f = AccountFiles {
            passwd: dir.path().join("passwd"),
            group: dir.path().join("group"),
        };
        (dir, f)
    }

    mod tempdir {
        /// A directory removed on drop (no tempfile dependency for one test module).
        pub(super) struct Dir(std::path::PathBuf);
        impl Dir {
            pub(super) fn new() -> Self {
                let p = std::env::temp_dir().join(format!(
                    "sandbox-agent-users-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&p).unwrap();
                Self(p)
            }
            pub(super) fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    const PASSWD: &str = "# comment\nroot:x:0:0:root:/root:/bin/bash\nbroken line\n\
        user:x:1000:1000::/home/user:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
        dup:x:1000:1000::/home/dup:/bin/sh\nnohome:x:1001:1001:::\n";
    const GROUP: &str = "root:x:0:\nuser:x:1000:\ndocker:x:999:user,other\nwheel:x:10:user\nbad\n";

    #[test]
    fn users_are_found_by_name_and_uid() {
        let (_d, f) = files(PASSWD, GROUP);
        let u = f.user_by_name("user").unwrap().unwrap();
        assert_eq!(u.uid, 1000);
        assert_eq!(u.gid, 1000);
        assert_eq!(u.home, PathBuf::from("/home/user"));
        assert_eq!(u.shell, PathBuf::from("/bin/bash"));
        assert_eq!(f.user_by_uid(0).unwrap().unwrap().name, "root");
        // The first account with a uid wins, as getpwuid answers.
        assert_eq!(f.user_by_uid(1000).unwrap().unwrap().name, "user");
        assert_eq!(f.user_by_name("ghost").unwrap(), None);
        assert_eq!(f.user_by_name("broken line").unwrap(), None);
        assert_eq!(
            f.user_by_name("nohome").unwrap().unwrap().home,
            PathBuf::from("/")
        );
    }

    #[test]
    fn groups_are_named_and_memberships_listed() {
        let (_d, f) = files(PASSWD, GROUP);
        assert_eq!(f.group_name(999).unwrap().as_deref(), Some("docker"));
        assert_eq!(f.group_name(4242).unwrap(), None);
        let u = f.user_by_name("user").unwrap().unwrap();
        assert_eq!(f.groups_of(&u).unwrap(), vec![1000, 999, 10]);
    }

    #[test]
    fn a_special_file_is_an_error_not_an_empty_list() {
        let f = AccountFiles {
            passwd: PathBuf::from("/dev/zero"),
            group: PathBuf::from("/dev/zero"),
        };
        let err = f.user_by_name("root").unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        let err = f.group_name(0).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn without_account_files_only_root_exists() {
        let f = AccountFiles {
            passwd: PathBuf::from("/nonexistent/passwd"),
            group: PathBuf::from("/nonexistent/group"),
        };
        assert_eq!(f.user_by_name("root").unwrap(), Some(builtin_root()));
        assert_eq!(f.user_by_uid(0).unwrap(), Some(builtin_root()));
        assert_eq!(f.user_by_name("user").unwrap(), None);
        assert_eq!(f.user_by_uid(1000).unwrap(), None);
        assert_eq!(f.group_name(0).unwrap().as_deref(), Some("root"));
        assert_eq!(f.group_name(1000).unwrap(), None);
        assert_eq!(f.groups_of(&builtin_root()).unwrap(), vec![0]);
        // A passwd file that exists but lacks root is the image's word: no built-in root.
        let (_d, f) = files("user:x:1000:1000::/home/user:/bin/sh\n", "user:x:1000:\n");
        assert_eq!(f.user_by_name("root").unwrap(), None);
    }
}
