//! The Debian sandbox image's recipe: where its packages come from (the machine's own apt
//! sources, never a URL written here), what goes in, and the tag derived from all of it.
//!
//! The image is what the official SDKs expect of a sandbox: `/bin/bash` (they run
//! `/bin/bash -l -c` and `/bin/bash -i -l`), a `user` account (uid 1000, home `/home/user`),
//! coreutils, procps, python3, git, curl and CA certificates. It is a `debootstrap
//! --variant=minbase` root filesystem imported with `docker import`, so no registry is involved.
//! Its tag is a hash of the recipe: a changed mirror, suite, package list or step is a new tag,
//! and an existing tag is never rebuilt.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// Tells a test which image to run: the tag, known only once the recipe is read.
pub const ENV_IMAGE: &str = "SANDBOX_TEST_DEBIAN_IMAGE";
/// The image repository; the tag is [`Recipe::tag`].
pub const REPOSITORY: &str = "sandbox-debian";
/// Bumped when the build changes in a way the recipe's fields do not show.
pub const RECIPE_VERSION: u32 = 1;
pub const VARIANT: &str = "minbase";
/// What `--include` adds to minbase.
pub const PACKAGES: &[&str] = &[
    "bash",
    "coreutils",
    "procps",
    "python3",
    "git",
    "curl",
    "ca-certificates",
];
/// The account the SDKs run as.
pub const USER: &str = "user";
pub const USER_UID: u32 = 1000;
pub const USER_HOME: &str = "/home/user";
pub const USER_SHELL: &str = "/bin/bash";
/// Run in the chroot after `useradd`: the downloaded packages and the package lists are a
/// third of the root filesystem and stale the day after; a sandbox that installs packages runs
/// `apt-get update` first, as in any Debian container image.
pub const CLEANUP: &str = "apt-get clean && rm -rf /var/lib/apt/lists/*";
/// Image settings `docker import` records (`--change`): an imported root filesystem has no
/// environment, and a process the agent starts without a login shell still needs a `PATH`.
pub const IMPORT_CHANGES: &[&str] = &[
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "CMD [\"/bin/bash\"]",
];

/// The apt source files of a machine, relative to its root.
pub const SOURCES_LIST: &str = "etc/apt/sources.list";
pub const SOURCES_DIR: &str = "etc/apt/sources.list.d";

/// One apt source entry, from either file format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AptSource {
    pub types: Vec<String>,
    pub uris: Vec<String>,
    pub suites: Vec<String>,
    pub components: Vec<String>,
    pub enabled: bool,
}

/// The one-line format (`sources.list`, `*.list`): `deb [options] uri suite [component...]`.
pub fn parse_one_line(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for raw in text.lines() {
        let line = raw.split('#').next().unwrap_or("").trim();
        let Some((kind, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let mut rest = rest.trim_start();
        // Options: `[arch=amd64 signed-by=/usr/share/keyrings/x.gpg]`.
        if let Some(after) = rest.strip_prefix('[') {
            let Some((_, tail)) = after.split_once(']') else {
                continue;
            };
            rest = tail;
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        out.push(AptSource {
            types: vec![kind.to_owned()],
            uris: vec![uri.to_owned()],
            suites: vec![suite.to_owned()],
            components: words.map(str::to_owned).collect(),
            enabled: true,
        });
    }
    out
}

/// The deb822 format (`*.sources`): stanzas of `Field: value` separated by blank lines,
/// continuation lines indented, comment lines starting with `#`.
pub fn parse_deb822(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let flush = |fields: &mut Vec<(String, String)>, out: &mut Vec<AptSource>| {
        if fields.is_empty() {
            return;
        }
        let get = |name: &str| -> Vec<String> {
            fields
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .flat_map(|(_, v)| v.split_whitespace().map(str::to_owned))
                .collect()
        };
        let enabled = get("Enabled")
            .first()
            .is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        out.push(AptSource {
            types: get("Types"),
            uris: get("URIs"),
            suites: get("Suites"),
            components: get("Components"),
            enabled,
        });
        fields.clear();
    };
    for raw in text.lines() {
        if raw.trim().is_empty() {
            flush(&mut fields, &mut out);
        } else if raw.trim_start().starts_with('#') {
            continue;
        } else if raw.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                value.push(' ');
                value.push_str(raw.trim());
            }
        } else if let Some((key, value)) = raw.split_once(':') {
            fields.push((key.trim().to_owned(), value.trim().to_owned()));
        }
    }
    flush(&mut fields, &mut out);
    out
}

/// Every apt source of the machine whose root is `root` (`/` for this one): `sources.list`,
/// then `sources.list.d/*.list` and `*.sources` in name order. Other files there (`.save`,
/// `.disabled`) are not sources, as for apt. Each entry comes with the file it is in.
pub fn read_sources(root: &Path) -> Result<Vec<(PathBuf, AptSource)>, String> {
    let mut files = Vec::new();
    let list = root.join(SOURCES_LIST);
    if list.is_file() {
        files.push(list);
    }
    let dir = root.join(SOURCES_DIR);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut more: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "list" || e == "sources"))
            .collect();
        more.sort();
        files.extend(more);
    }
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let sources = if file.extension().is_some_and(|e| e == "sources") {
            parse_deb822(&text)
        } else {
            parse_one_line(&text)
        };
        out.extend(sources.into_iter().map(|s| (file.clone(), s)));
    }
    Ok(out)
}

/// Suites that carry updates to a release, not a release debootstrap can install.
const NOT_A_RELEASE: &[&str] = &[
    "-updates",
    "-security",
    "-backports",
    "-proposed-updates",
    "-proposed",
    "-backports-sloppy",
];

/// The mirror and release suite the image is bootstrapped from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    pub uri: String,
    pub suite: String,
}

/// The first enabled binary (`deb`) source over http(s) with the `main` component and a
/// release suite (`bookworm`, not `bookworm-updates` or a flat `./` repository).
pub fn choose_mirror(sources: &[AptSource]) -> Option<Mirror> {
    for s in sources.iter().filter(|s| s.enabled) {
        if !s.types.iter().any(|t| t == "deb") || !s.components.iter().any(|c| c == "main") {
            continue;
        }
        let Some(uri) = s
            .uris
            .iter()
            .find(|u| u.starts_with("http://") || u.starts_with("https://"))
        else {
            continue;
        };
        let release = s.suites.iter().find(|suite| {
            !suite.is_empty()
                && !suite.contains('/')
                && !NOT_A_RELEASE.iter().any(|tail| suite.ends_with(tail))
        });
        if let Some(suite) = release {
            return Some(Mirror {
                uri: uri.trim_end_matches('/').to_owned(),
                suite: suite.clone(),
            });
        }
    }
    None
}

/// Everything the image is made from; its hash is the tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipe {
    pub mirror: Mirror,
}

impl Recipe {
    pub fn new(mirror: Mirror) -> Self {
        Self { mirror }
    }

    /// The arguments of `debootstrap` that make the root filesystem in `dir`.
    pub fn debootstrap_args(&self, dir: &Path) -> Vec<OsString> {
        vec![
            format!("--variant={VARIANT}").into(),
            format!("--include={}", PACKAGES.join(",")).into(),
            self.mirror.suite.clone().into(),
            dir.as_os_str().to_owned(),
            self.mirror.uri.clone().into(),
        ]
    }

    /// The `useradd` arguments run in the chroot.
    pub fn useradd_args(&self) -> Vec<String> {
        vec![
            "-m".into(),
            "-u".into(),
            USER_UID.to_string(),
            "-d".into(),
            USER_HOME.into(),
            "-s".into(),
            USER_SHELL.into(),
            USER.into(),
        ]
    }

    /// The recipe as text: one `key=value` line per input, in a fixed order.
    pub fn canonical(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "recipe={RECIPE_VERSION}");
        let _ = writeln!(s, "suite={}", self.mirror.suite);
        let _ = writeln!(s, "mirror={}", self.mirror.uri);
        let _ = writeln!(s, "variant={VARIANT}");
        let _ = writeln!(s, "packages={}", PACKAGES.join(","));
        let _ = writeln!(s, "useradd={}", self.useradd_args().join(" "));
        let _ = writeln!(s, "cleanup={CLEANUP}");
        for change in IMPORT_CHANGES {
            let _ = writeln!(s, "change={change}");
        }
        s
    }

    /// The first 12 hex digits of the SHA-256 of [`Recipe::canonical`].
    pub fn hash(&self) -> String {
        Sha256::digest(self.canonical().as_bytes())
            .iter()
            .take(6)
            .fold(String::new(), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            })
    }

    /// `sandbox-debian:<hash>`.
    pub fn tag(&self) -> String {
        format!("{REPOSITORY}:{}", self.hash())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(types: &[&str], uri: &str, suites: &[&str], components: &[&str]) -> AptSource {
        let v = |x: &[&str]| x.iter().map(|s| (*s).to_owned()).collect();
        AptSource {
            types: v(types),
            uris: vec![uri.to_owned()],
            suites: v(suites),
            components: v(components),
            enabled: true,
        }
    }

    #[test]
    fn the_one_line_format() {
        let text = "\
# the main archive
deb http://deb.debian.org/debian bookworm main contrib
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://mirror.example/debian/ bookworm-updates main # trailing
deb-src http://deb.debian.org/debian bookworm main

deb http://flat.example/repo ./
broken-line
";
        let got = parse_one_line(text);
        assert_eq!(
            got,
            vec![
                source(
                    &["deb"],
                    "http://deb.debian.org/debian",
                    &["bookworm"],
                    &["main", "contrib"]
                ),
                source(
                    &["deb"],
                    "https://mirror.example/debian/",
                    &["bookworm-updates"],
                    &["main"]
                ),
                source(
                    &["deb-src"],
                    "http://deb.debian.org/debian",
                    &["bookworm"],
                    &["main"]
                ),
                source(&["deb"], "http://flat.example/repo", &["./"], &[]),
            ]
        );
    }

    #[test]
    fn the_deb822_format() {
        // The shape of this machine's debian.sources, a comment inside a stanza included.
        let text = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
  contrib
enabled: No
";
        let got = parse_deb822(text);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[0],
            source(
                &["deb"],
                "http://deb.debian.org/debian",
                &["bookworm", "bookworm-updates"],
                &["main"]
            )
        );
        assert_eq!(got[1].types, ["deb", "deb-src"]);
        assert_eq!(got[1].components, ["main", "contrib"]);
        assert!(!got[1].enabled);
    }

    #[test]
    fn the_mirror_is_the_first_release_suite_of_a_deb_source_with_main() {
        let check = |sources: &[AptSource], expected: Option<(&str, &str)>| {
            assert_eq!(
                choose_mirror(sources),
                expected.map(|(uri, suite)| Mirror {
                    uri: uri.into(),
                    suite: suite.into()
                }),
                "{sources:?}"
            );
        };
        let main = source(
            &["deb"],
            "http://deb.debian.org/debian/",
            &["bookworm-updates", "bookworm"],
            &["main"],
        );
        check(
            std::slice::from_ref(&main),
            Some(("http://deb.debian.org/debian", "bookworm")),
        );
        let security = source(
            &["deb"],
            "http://deb.debian.org/debian-security",
            &["bookworm-security"],
            &["main"],
        );
        let src_only = source(
            &["deb-src"],
            "http://a.example/debian",
            &["trixie"],
            &["main"],
        );
        let no_main = source(
            &["deb"],
            "http://b.example/debian",
            &["trixie"],
            &["contrib"],
        );
        let flat = source(&["deb"], "http://c.example/repo", &["./"], &["main"]);
        let not_http = source(&["deb"], "file:/srv/mirror", &["trixie"], &["main"]);
        let mut disabled = source(&["deb"], "http://d.example/debian", &["trixie"], &["main"]);
        disabled.enabled = false;
        check(
            &[
                security.clone(),
                src_only,
                no_main,
                flat,
                not_http,
                disabled,
                main,
            ],
            Some(("http://deb.debian.org/debian", "bookworm")),
        );
        check(&[security], None);
        check(&[], None);
    }

    #[test]
    fn sources_are_read_from_both_formats_in_apts_order() {
        let root = std::env::temp_dir().join(format!("xtask-apt-{}", std::process::id()));
        let dir = root.join(SOURCES_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            root.join(SOURCES_LIST),
            "deb http://one.example/debian trixie main\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("b.sources"),
            "Types: deb\nURIs: http://three.example/debian\nSuites: trixie\nComponents: main\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("a.list"),
            "deb http://two.example/debian trixie main\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("c.list.disabled"),
            "deb http://never.example/debian trixie main\n",
        )
        .unwrap();
        let got = read_sources(&root);
        std::fs::remove_dir_all(&root).unwrap();
        let uris: Vec<String> = got
            .unwrap()
            .into_iter()
            .map(|(_, s)| s.uris[0].clone())
            .collect();
        assert_eq!(
            uris,
            [
                "http://one.example/debian",
                "http://two.example/debian",
                "http://three.example/debian"
            ]
        );
    }

    fn recipe(uri: &str, suite: &str) -> Recipe {
        Recipe::new(Mirror {
            uri: uri.into(),
            suite: suite.into(),
        })
    }

    #[test]
    fn the_tag_is_a_stable_hash_of_the_recipe() {
        let r = recipe("http://deb.debian.org/debian", "bookworm");
        let tag = r.tag();
        assert!(tag.starts_with("sandbox-debian:"), "{tag}");
        let hash = r.hash();
        assert_eq!(hash.len(), 12);
        assert!(
            hash.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        // The same recipe always gives the same tag (a golden value: changing the recipe's
        // text changes it, on purpose, with RECIPE_VERSION or a field).
        assert_eq!(
            tag,
            recipe("http://deb.debian.org/debian", "bookworm").tag()
        );
        assert_eq!(hash, GOLDEN_HASH, "{}", r.canonical());
        // Every input is in the hash.
        assert_ne!(tag, recipe("http://deb.debian.org/debian", "trixie").tag());
        assert_ne!(
            tag,
            recipe("http://mirror.example/debian", "bookworm").tag()
        );
        let canonical = r.canonical();
        for part in [
            "recipe=1",
            "variant=minbase",
            "bash,coreutils,procps,python3,git,curl,ca-certificates",
            "-u 1000",
            "/home/user",
            "ENV PATH=",
        ] {
            assert!(canonical.contains(part), "{part}: {canonical}");
        }
    }

    /// `recipe("http://deb.debian.org/debian", "bookworm").hash()`.
    const GOLDEN_HASH: &str = "2b89ca47ae36";

    /// The service's default E2B `base` template is this recipe's tag from Debian's own
    /// mirror: a recipe change that moves the tag must move the default with it.
    #[test]
    fn the_services_default_base_image_is_the_default_recipes_tag() {
        let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../crates/sandbox-app/src/config.rs");
        let text = std::fs::read_to_string(&config).expect("the service's config.rs");
        let tag = recipe("http://deb.debian.org/debian", "bookworm").tag();
        let line = format!("pub const DEFAULT_E2B_BASE_IMAGE: &str = \"{tag}\";");
        assert!(
            text.contains(&line),
            "crates/sandbox-app/src/config.rs must say {line}"
        );
    }

    #[test]
    fn the_commands_follow_the_recipe() {
        let r = recipe("http://deb.debian.org/debian", "bookworm");
        let args: Vec<String> = r
            .debootstrap_args(Path::new("/t/rootfs"))
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "--variant=minbase",
                "--include=bash,coreutils,procps,python3,git,curl,ca-certificates",
                "bookworm",
                "/t/rootfs",
                "http://deb.debian.org/debian"
            ]
        );
        assert_eq!(
            r.useradd_args().join(" "),
            "-m -u 1000 -d /home/user -s /bin/bash user"
        );
    }
}
