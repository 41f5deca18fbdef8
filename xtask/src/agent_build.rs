//! The static build of `sandbox-agent`: the one cargo command that makes it and the checks its
//! result must pass before it is copied into any image.
//!
//! The agent runs in images that have no loader or libc of their own (the `FROM scratch` busybox
//! image) or a different one (Debian), so it must be one statically linked file. On the gnu
//! target that is `-C target-feature=+crt-static`, given through
//! `CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS` on that one command: with an explicit
//! `--target`, cargo applies target rustflags to the target's artifacts only, so build scripts
//! and proc macros (host artifacts) stay dynamic and the host builds' caches are untouched.
//! `RUSTFLAGS` and `CARGO_ENCODED_RUSTFLAGS` are removed from that command: either would take
//! precedence over the target's flags and silently make a dynamic binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::elf;

pub const PACKAGE: &str = "sandbox-agent";
/// The `[profile.agent]` of the root manifest (release, LTO, one codegen unit, stripped,
/// `panic = "abort"`, optimized for size).
pub const PROFILE: &str = "agent";
/// The host target here, and the only one the agent is built for today. It is rustup's default
/// host target on x86-64 Linux, so no `rustup target add` is needed; its static glibc
/// (`libc.a`) comes with Debian's `libc6-dev`.
pub const TARGET: &str = "x86_64-unknown-linux-gnu";
pub const TARGET_RUSTFLAGS_VAR: &str = "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS";
pub const STATIC_RUSTFLAGS: &str = "-C target-feature=+crt-static";
/// The agent is copied into every sandbox image; past this size something large was linked in
/// by mistake (a TLS stack, a second runtime, debug info).
pub const MAX_BYTES: u64 = 5 * 1024 * 1024;
/// Names the checked static binary to the tests that copy it into containers (set by the
/// pipeline on the docker engine stage's tests).
pub const ENV_AGENT_BIN: &str = "SANDBOX_AGENT_BIN";
/// The static glibc the static link needs.
pub const STATIC_LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.a";
/// Present in a binary when static glibc's NSS code was linked in (`getpwnam`, `getaddrinfo`
/// and friends): that code loads shared NSS modules at run time, which a static binary in a
/// foreign image cannot do. The agent reads `/etc/passwd` itself and never resolves names.
pub const NSS_MARKER: &[u8] = b"/etc/nsswitch.conf";

/// The arguments of the build command, after `cargo`. `--locked`: the committed `Cargo.lock`
/// is what was reviewed.
pub const BUILD_ARGS: [&str; 8] = [
    "build",
    "--locked",
    "-p",
    PACKAGE,
    "--profile",
    PROFILE,
    "--target",
    TARGET,
];

/// Sets the static-link flag on `cmd` for the agent's target only, and removes what would
/// override it.
pub fn scope_rustflags(cmd: &mut Command) {
    cmd.env(TARGET_RUSTFLAGS_VAR, STATIC_RUSTFLAGS)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
}

/// Where the build puts the binary.
pub fn binary_path(target_dir: &Path) -> PathBuf {
    target_dir.join(TARGET).join(PROFILE).join(PACKAGE)
}

/// What the checks found in a good binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    pub bytes: u64,
}

/// Checks the built binary at `path`: statically linked, under [`MAX_BYTES`], no NSS code.
/// Each error names the fix.
pub fn check_binary(path: &Path) -> Result<Checked, String> {
    let meta = std::fs::metadata(path).map_err(|e| {
        format!(
            "{}: {e} (build it with `cargo xtask agent`)",
            path.display()
        )
    })?;
    // A file over the limit fails before it is read.
    if meta.len() > MAX_BYTES {
        return Err(too_large(path, meta.len()));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    check_bytes(path, &bytes)
}

fn too_large(path: &Path, bytes: u64) -> String {
    format!(
        "{} is {} bytes ({}), over the {} limit (agent_build::MAX_BYTES): look for a large \
         dependency with `cargo tree -p {PACKAGE} -e normal` and check that [profile.{PROFILE}] \
         still strips, uses LTO and aborts on panic",
        path.display(),
        bytes,
        mib(bytes),
        mib(MAX_BYTES)
    )
}

/// [`check_binary`] on bytes already read; `path` is only used in messages.
pub fn check_bytes(path: &Path, bytes: &[u8]) -> Result<Checked, String> {
    let len = bytes.len() as u64;
    if len > MAX_BYTES {
        return Err(too_large(path, len));
    }
    let linking = elf::linking(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(interp) = &linking.interpreter {
        return Err(format!(
            "{} is dynamically linked (program interpreter {interp}): it must be built with \
             {TARGET_RUSTFLAGS_VAR}=\"{STATIC_RUSTFLAGS}\" and no RUSTFLAGS overriding it; \
             `cargo xtask agent` does both",
            path.display()
        ));
    }
    if !linking.needed.is_empty() {
        return Err(format!(
            "{} needs shared libraries ({}): a static binary needs none; a dependency links a \
             system library dynamically (a -sys crate): make it static or drop it",
            path.display(),
            linking.needed.join(", ")
        ));
    }
    if bytes.windows(NSS_MARKER.len()).any(|w| w == NSS_MARKER) {
        return Err(format!(
            "{} contains glibc's NSS code (it mentions {}): something calls getpwnam, getgrnam \
             or getaddrinfo, which load shared modules at run time and fail in a static binary; \
             read accounts with sandbox_agent::users and never resolve host names",
            path.display(),
            String::from_utf8_lossy(NSS_MARKER)
        ));
    }
    Ok(Checked { bytes: len })
}

/// `1.23 MiB`.
pub fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_builds_the_agent_profile_for_the_target() {
        assert_eq!(
            BUILD_ARGS.join(" "),
            "build --locked -p sandbox-agent --profile agent --target x86_64-unknown-linux-gnu"
        );
        let mut cmd = Command::new("cargo");
        cmd.env("RUSTFLAGS", "-C target-cpu=native");
        scope_rustflags(&mut cmd);
        let envs: Vec<(String, Option<String>)> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        assert!(envs.contains(&(
            TARGET_RUSTFLAGS_VAR.into(),
            Some("-C target-feature=+crt-static".into())
        )));
        assert!(envs.contains(&("RUSTFLAGS".into(), None)), "{envs:?}");
        assert!(envs.contains(&("CARGO_ENCODED_RUSTFLAGS".into(), None)));
        assert_eq!(
            binary_path(Path::new("/t")),
            Path::new("/t/x86_64-unknown-linux-gnu/agent/sandbox-agent")
        );
    }

    #[test]
    fn a_dynamic_binary_is_refused_with_the_fix() {
        let sh = std::fs::read("/bin/sh").unwrap();
        let err = check_bytes(Path::new("/bin/sh"), &sh).unwrap_err();
        assert!(err.contains("dynamically linked"), "{err}");
        assert!(err.contains(TARGET_RUSTFLAGS_VAR), "{err}");
    }

    #[test]
    fn too_large_and_not_elf_are_refused() {
        let big = vec![0u8; (MAX_BYTES + 1) as usize];
        let err = check_bytes(Path::new("big"), &big).unwrap_err();
        assert!(err.contains("over the 5.00 MiB limit"), "{err}");
        let err = check_bytes(Path::new("script"), b"#!/bin/sh\n").unwrap_err();
        assert!(err.contains("not an ELF"), "{err}");
        let err = check_binary(Path::new("/nonexistent/sandbox-agent")).unwrap_err();
        assert!(err.contains("cargo xtask agent"), "{err}");
    }
}
