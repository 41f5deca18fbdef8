//! `EntryInfo` as envd fills it, from `lstat` of a path.
//!
//! - `mode` holds the permission bits only; `permissions` is Go's `FileMode.String()`
//!   (`-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`), which envd's clients show as is.
//! - A symlink reports its *target's* type and permission bits, the fully resolved target in
//!   `symlinkTarget`, and `isSymlink`; its own `lstat` gives size, owner and times.
//! - Owner and group are names from `/etc/passwd` and `/etc/group`, or the number when the
//!   id has no name.
//! - `metadata` is the file's `user.e2b.*` attributes (see [`super::metadata`]).

use std::collections::HashMap;
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use sandbox_envd::Timestamp;
use sandbox_envd::filesystem::{EntryInfo, FileType};

use super::metadata;
use super::path::base_name;
use crate::users::AccountFiles;

const S_IFMT: u32 = 0o170_000;
const S_IFSOCK: u32 = 0o140_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFBLK: u32 = 0o060_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFCHR: u32 = 0o020_000;
const S_IFIFO: u32 = 0o010_000;
const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_ISVTX: u32 = 0o1000;

/// Owner and group names, looked up once per id for the length of one call (a listing of a
/// thousand files owned by one user reads `/etc/passwd` once, not a thousand times).
#[derive(Debug)]
pub(crate) struct Names {
    accounts: AccountFiles,
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    pub(crate) fn new(accounts: AccountFiles) -> Self {
        Names {
            accounts,
            users: HashMap::new(),
            groups: HashMap::new(),
        }
    }

    fn user(&mut self, uid: u32) -> String {
        let accounts = &self.accounts;
        self.users
            .entry(uid)
            .or_insert_with(|| match accounts.user_by_uid(uid) {
                Ok(Some(u)) => u.name,
                _ => uid.to_string(),
            })
            .clone()
    }

    fn group(&mut self, gid: u32) -> String {
        let accounts = &self.accounts;
        self.groups
            .entry(gid)
            .or_insert_with(|| match accounts.group_name(gid) {
                Ok(Some(name)) => name,
                _ => gid.to_string(),
            })
            .clone()
    }
}

/// The entry at `path`, which is reported as given. A missing path is an error of kind
/// `NotFound`.
pub(crate) fn entry_info(path: &Path, names: &mut Names) -> io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(path)?;
    let mut entry = EntryInfo {
        name: base_name(path),
        path: path.to_string_lossy().into_owned(),
        size: i64::try_from(meta.len()).unwrap_or(i64::MAX),
        permissions: go_mode_string(meta.mode()),
        owner: names.user(meta.uid()),
        group: names.group(meta.gid()),
        modified_time: modified(&meta),
        ..EntryInfo::default()
    };
    if meta.file_type().is_symlink() {
        // An unresolvable link names itself as its target and has no type, as envd reports it.
        let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Ok(target_meta) = std::fs::metadata(&target) {
            entry.r#type = file_type(&target_meta);
            entry.mode = target_meta.mode() & 0o777;
        }
        entry.symlink_target = Some(target.to_string_lossy().into_owned());
        entry.is_symlink = true;
    } else {
        entry.r#type = file_type(&meta);
        entry.mode = meta.mode() & 0o777;
    }
    // Best effort, as in envd: unreadable attributes do not make the entry unreadable.
    entry.metadata = metadata::read(path).unwrap_or_default();
    Ok(entry)
}

fn file_type(meta: &Metadata) -> FileType {
    if meta.is_file() {
        FileType::File
    } else if meta.is_dir() {
        FileType::Directory
    } else {
        FileType::Unspecified
    }
}

/// envd omits a zero modification time.
fn modified(meta: &Metadata) -> Option<Timestamp> {
    let (seconds, nanos) = (meta.mtime(), meta.mtime_nsec());
    if seconds == 0 && nanos == 0 {
        return None;
    }
    Timestamp::new(seconds, i32::try_from(nanos).ok()?).ok()
}

/// Go's `os.FileMode.String()` for a Linux `st_mode`: type letters in Go's order
/// (`d`, `L`, `D`, `p`, `S`, `u`, `g`, `c`, `t`), `-` when there is none, then `rwxrwxrwx`.
pub(crate) fn go_mode_string(st_mode: u32) -> String {
    let kind = st_mode & S_IFMT;
    let mut out = String::with_capacity(12);
    let letters = [
        (kind == S_IFDIR, 'd'),
        (kind == S_IFLNK, 'L'),
        (kind == S_IFBLK || kind == S_IFCHR, 'D'),
        (kind == S_IFIFO, 'p'),
        (kind == S_IFSOCK, 'S'),
        (st_mode & S_ISUID != 0, 'u'),
        (st_mode & S_ISGID != 0, 'g'),
        (kind == S_IFCHR, 'c'),
        (st_mode & S_ISVTX != 0, 't'),
    ];
    out.extend(letters.iter().filter(|(set, _)| *set).map(|(_, c)| *c));
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if st_mode & (1 << (8 - i)) != 0 {
            c
        } else {
            '-'
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_strings_match_go() {
        let check = |mode: u32, expected: &str| assert_eq!(go_mode_string(mode), expected);
        check(0o100_644, "-rw-r--r--");
        check(0o040_755, "drwxr-xr-x");
        check(0o120_777, "Lrwxrwxrwx");
        check(0o020_666, "Dcrw-rw-rw-");
        check(0o060_660, "Drw-rw----");
        check(0o010_600, "prw-------");
        check(0o140_755, "Srwxr-xr-x");
        check(0o104_755, "urwxr-xr-x");
        check(0o102_755, "grwxr-xr-x");
        check(0o041_777, "dtrwxrwxrwx");
        check(0o100_000, "----------");
    }
}
