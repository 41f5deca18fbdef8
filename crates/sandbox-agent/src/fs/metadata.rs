//! A file's user metadata: the `X-Metadata-*` headers of an upload, kept as `user.e2b.<key>`
//! extended attributes and reported back as `EntryInfo.metadata`.
//!
//! The `user.` namespace is the one Linux lets any file owner write; `e2b.` keeps these keys
//! apart from other tools' `user.*` attributes, and is the name envd uses, so metadata written
//! by either survives a move between them.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use rustix::fs::XattrFlags;
use rustix::io::Errno;

/// The attribute namespace metadata keys live in.
pub const XATTR_PREFIX: &str = "user.e2b.";

/// The longest key: Linux caps a whole attribute name at 255 bytes.
pub const MAX_KEY_BYTES: usize = 255 - XATTR_PREFIX.len();

/// The most metadata one file carries, counted as the sum of every stored name and value.
/// ext4 keeps all of an inode's attributes in one 4 KiB block, so more would fail late, after
/// the file's content was already written.
pub const MAX_TOTAL_BYTES: usize = 4096;

/// The most keys one upload may set (each is one header, and one attribute on disk).
pub const MAX_KEYS: usize = 64;

/// Linux's bound on an attribute list and on one attribute value (`XATTR_LIST_MAX`,
/// `XATTR_SIZE_MAX`): nothing longer can exist, so reads never need more.
const XATTR_MAX: usize = 64 * 1024;

/// Why metadata was refused before any file was touched (the caller's error, 400).
pub fn validate(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    if metadata.len() > MAX_KEYS {
        return Err(format!(
            "{} metadata keys, more than the {MAX_KEYS} allowed",
            metadata.len()
        ));
    }
    let mut total = 0;
    for (key, value) in metadata {
        if key.is_empty() {
            return Err("metadata key must not be empty".into());
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(format!(
                "metadata key {key:?} exceeds {MAX_KEY_BYTES} bytes"
            ));
        }
        printable("key", key, key)?;
        printable("value for key", key, value)?;
        total += XATTR_PREFIX.len() + key.len() + value.len();
    }
    if total > MAX_TOTAL_BYTES {
        return Err(format!(
            "total metadata size {total} exceeds {MAX_TOTAL_BYTES} bytes"
        ));
    }
    Ok(())
}

/// Header values are printable US-ASCII on the wire; anything else would not survive a round
/// trip through an HTTP header anyway.
fn printable(what: &str, key: &str, s: &str) -> Result<(), String> {
    match s.bytes().position(|c| !(0x20..=0x7e).contains(&c)) {
        None => Ok(()),
        Some(at) => Err(format!(
            "metadata {what} {key:?} contains a non-printable byte at offset {at}"
        )),
    }
}

/// Whether an attribute error means the filesystem keeps no user attributes at all.
pub fn is_unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::OPNOTSUPP.raw_os_error())
}

/// Replaces the metadata of an open file with `metadata`: keys absent from it are removed, so
/// overwriting a file (which keeps attributes across truncation) leaves no stale metadata.
pub fn replace(file: &std::fs::File, metadata: &BTreeMap<String, String>) -> io::Result<()> {
    let mut list = vec![0u8; XATTR_MAX];
    let len = rustix::fs::flistxattr(file, &mut list[..])?;
    for name in names(&list[..len]) {
        let Some(key) = name.strip_prefix(XATTR_PREFIX) else {
            continue;
        };
        if metadata.contains_key(key) {
            continue;
        }
        match rustix::fs::fremovexattr(file, name) {
            Ok(()) | Err(Errno::NODATA) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for (key, value) in metadata {
        rustix::fs::fsetxattr(
            file,
            format!("{XATTR_PREFIX}{key}"),
            value.as_bytes(),
            XattrFlags::empty(),
        )?;
    }
    Ok(())
}

/// The metadata of the file at `path` (a final symlink followed), prefix stripped. A
/// filesystem without attributes has none; keys or values that are not UTF-8 (set by other
/// tools) are skipped, since the wire map holds strings.
pub fn read(path: &Path) -> io::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    // Most files have no attributes at all: one query answers that without a buffer.
    let size = match rustix::fs::listxattr_query(path) {
        Ok(0) | Err(Errno::OPNOTSUPP) => return Ok(out),
        Ok(size) => size.min(XATTR_MAX),
        Err(e) => return Err(e.into()),
    };
    let mut list = vec![0u8; size];
    let len = match rustix::fs::listxattr(path, &mut list[..]) {
        Ok(len) => len,
        // It grew between the two calls: take the most there can be.
        Err(Errno::RANGE) => {
            list.resize(XATTR_MAX, 0);
            rustix::fs::listxattr(path, &mut list[..])?
        }
        Err(e) => return Err(e.into()),
    };
    let mut value = Vec::new();
    for name in names(&list[..len]) {
        let Some(key) = name.strip_prefix(XATTR_PREFIX) else {
            continue;
        };
        value.resize(XATTR_MAX, 0);
        let n = match rustix::fs::getxattr(path, name, &mut value[..]) {
            Ok(n) => n,
            // Removed between the listing and the read.
            Err(Errno::NODATA) => continue,
            Err(e) => return Err(e.into()),
        };
        if let Ok(text) = std::str::from_utf8(&value[..n]) {
            out.insert(key.to_owned(), text.to_owned());
        }
    }
    Ok(out)
}

/// The UTF-8 names of a NUL-separated attribute list.
fn names(list: &[u8]) -> impl Iterator<Item = &str> {
    list.split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .filter_map(|n| std::str::from_utf8(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn validation_refuses_what_cannot_be_stored() {
        assert!(validate(&map(&[("k", "v"), ("other", "a value")])).is_ok());
        assert!(validate(&map(&[("", "v")])).is_err());
        assert!(validate(&map(&[(&"k".repeat(MAX_KEY_BYTES + 1), "v")])).is_err());
        assert!(validate(&map(&[(&"k".repeat(MAX_KEY_BYTES), "v")])).is_ok());
        assert!(validate(&map(&[("k", "tab\there")])).is_err());
        assert!(validate(&map(&[("k", "é")])).is_err());
        assert!(validate(&map(&[("k", &"v".repeat(MAX_TOTAL_BYTES))])).is_err());
        let many: BTreeMap<String, String> = (0..=MAX_KEYS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(validate(&many).unwrap_err().contains("more than"));
    }

    #[test]
    fn unsupported_is_told_apart() {
        assert!(is_unsupported(&io::Error::from_raw_os_error(
            Errno::OPNOTSUPP.raw_os_error()
        )));
        assert!(!is_unsupported(&io::Error::from_raw_os_error(
            Errno::NOSPC.raw_os_error()
        )));
    }

    #[test]
    fn metadata_is_replaced_not_merged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        // Another tool's attribute in the user namespace is left alone.
        rustix::fs::fsetxattr(&file, "user.other", b"keep", XattrFlags::empty()).unwrap();
        replace(&file, &map(&[("a", "1"), ("b", "2")])).unwrap();
        assert_eq!(read(&path).unwrap(), map(&[("a", "1"), ("b", "2")]));
        replace(&file, &map(&[("b", "3")])).unwrap();
        assert_eq!(read(&path).unwrap(), map(&[("b", "3")]));
        replace(&file, &BTreeMap::new()).unwrap();
        assert!(read(&path).unwrap().is_empty());
        let mut buf = [0u8; 16];
        let n = rustix::fs::getxattr(&path, "user.other", &mut buf[..]).unwrap();
        assert_eq!(&buf[..n], b"keep");
    }
}
