//! What the agent's filesystem tests share: a temporary root with its own account files, a
//! home for the current user, and a second user the agent gives files to when it runs as root.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use sandbox_agent::users::{AccountFiles, User};

/// The uid and gid of the second account (never the current user's).
pub const OTHER_UID: u32 = 4242;

pub struct Env {
    pub dir: tempfile::TempDir,
    pub accounts: AccountFiles,
    pub me: User,
    pub other: User,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let home = dir.path().join("home/me");
        let other_home = dir.path().join("home/other");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&other_home).unwrap();
        let passwd = dir.path().join("passwd");
        let group = dir.path().join("group");
        std::fs::write(
            &passwd,
            format!(
                "me:x:{uid}:{gid}::{}:/bin/sh\nother:x:{OTHER_UID}:{OTHER_UID}::{}:/bin/sh\n",
                home.display(),
                other_home.display()
            ),
        )
        .unwrap();
        std::fs::write(&group, format!("mygroup:x:{gid}:\nothers:x:{OTHER_UID}:\n")).unwrap();
        let accounts = AccountFiles { passwd, group };
        let me = accounts.user_by_name("me").unwrap().unwrap();
        let other = accounts.user_by_name("other").unwrap().unwrap();
        Env {
            dir,
            accounts,
            me,
            other,
        }
    }

    pub fn home(&self) -> &Path {
        &self.me.home
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

/// Whether the tests run as root (then created entries are given to the selected user).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The owner the agent should give a created entry for `user`: the user when the agent can
/// change owners, else the agent itself.
pub fn expected_uid(user: &User) -> u32 {
    if is_root() {
        user.uid
    } else {
        rustix::process::geteuid().as_raw()
    }
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}
