//! Finding and checking the agent binary, once, at the adapter's start.
//!
//! The bytes are read into memory then (about 2.4 MB) and every create copies those bytes,
//! rather than streaming the file from disk per create: what is installed is exactly what was
//! checked, so a file rebuilt or replaced on disk while the service runs can never put an
//! unchecked or mismatched agent into a container; picking up a new agent is a restart, the
//! same moment a new service binary is picked up.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::{Error, ErrorCode, Operation, Provider};
use tokio::io::AsyncReadExt;

/// The version the agent must report: all workspace crates share one version, so the agent
/// built from this tree reports this adapter crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The agent's file name; the default path is this name beside the running executable.
pub const FILE_NAME: &str = "sandbox-agent";

/// Larger than any agent build by far (the static build is about 2.4 MB, and xtask refuses one
/// past 5 MiB); a file past this is not the agent, and is not read into memory.
pub const MAX_BYTES: u64 = 32 * 1024 * 1024;

/// How long `sandbox-agent --version` may take; it prints one line and exits.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of `--version`'s output that is read.
const MAX_VERSION_OUTPUT: u64 = 4096;

/// What to do about any of the refusals below (every refusal's message ends with it).
pub const FIX: &str = "run `cargo xtask agent` (it prints the built binary's path) and set \
                   docker.agent_path (SANDBOX_DOCKER_AGENT_PATH) to it, or put sandbox-agent \
                   beside the sandbox binary; or use docker.data_plane = \"exec\" \
                   (SANDBOX_DOCKER_DATA_PLANE=exec)";

/// A checked agent binary, held in memory.
#[derive(Clone)]
pub struct AgentBinary {
    path: PathBuf,
    bytes: Bytes,
    version: String,
}

impl fmt::Debug for AgentBinary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentBinary")
            .field("path", &self.path)
            .field("bytes", &self.bytes.len())
            .field("version", &self.version)
            .finish()
    }
}

impl AgentBinary {
    /// Where the binary was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The checked bytes every create installs.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The version it reported.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Finds the agent (`configured`, else [`default_path`]), reads it and checks it: a
    /// regular file under [`MAX_BYTES`], a statically linked x86-64 ELF executable, and one
    /// that answers `--version` with [`VERSION`]. Every refusal names the path and the fix.
    pub async fn load(configured: Option<&Path>) -> Result<Self, Error> {
        let path = match configured {
            Some(p) => p.to_path_buf(),
            None => default_path()?,
        };
        Self::load_expecting(&path, VERSION).await
    }

    /// [`AgentBinary::load`] of `path`, expecting `expected` as its version.
    pub async fn load_expecting(path: &Path, expected: &str) -> Result<Self, Error> {
        let bytes = read(path).await?;
        check_static(path, &bytes)?;
        let version = run_version(path).await?;
        if version != expected {
            return Err(refusal(format!(
                "the agent {} is version {version}, and this service is {expected}: the two \
                 are built from one tree",
                path.display()
            )));
        }
        Ok(AgentBinary {
            path: path.to_path_buf(),
            bytes,
            version,
        })
    }
}

/// `sandbox-agent` beside the running executable.
pub fn default_path() -> Result<PathBuf, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| refusal(format!("cannot tell where the running binary is: {e}")))?;
    let dir = exe
        .parent()
        .ok_or_else(|| refusal(format!("{} has no directory", exe.display())))?;
    Ok(dir.join(FILE_NAME))
}

fn refusal(what: String) -> Error {
    Error::unsupported(
        Operation::VALIDATE,
        format!("docker.data_plane = \"agent\" cannot start: {what}; {FIX}"),
    )
    .with_code(ErrorCode::ConfigIncomplete)
    .with_provider(Provider::Docker)
}

async fn read(path: &Path) -> Result<Bytes, Error> {
    let meta = tokio::fs::metadata(path).await.map_err(|e| {
        refusal(if e.kind() == std::io::ErrorKind::NotFound {
            format!("there is no agent at {}", path.display())
        } else {
            format!("cannot read the agent at {}: {e}", path.display())
        })
    })?;
    if !meta.is_file() {
        return Err(refusal(format!(
            "the agent path {} is not a regular file",
            path.display()
        )));
    }
    if meta.len() > MAX_BYTES {
        return Err(refusal(format!(
            "{} is {} bytes, past the {MAX_BYTES} an agent can be",
            path.display(),
            meta.len()
        )));
    }
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| refusal(format!("cannot open the agent at {}: {e}", path.display())))?;
    // Bounded again on the read itself: the file may grow after the metadata was taken.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| refusal(format!("cannot read the agent at {}: {e}", path.display())))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(refusal(format!(
            "{} grew past the {MAX_BYTES} bytes an agent can be",
            path.display()
        )));
    }
    Ok(Bytes::from(bytes))
}

/// A container image may have no loader and no libc (`FROM scratch`), or another one, so only a
/// static agent runs in every sandbox.
fn check_static(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let linking = sandbox_elf::linking(bytes)
        .map_err(|e| refusal(format!("{} is not the agent: {e}", path.display())))?;
    if linking.is_static() {
        return Ok(());
    }
    let mut why = Vec::new();
    if let Some(interp) = &linking.interpreter {
        why.push(format!("its loader is {interp}"));
    }
    if !linking.needed.is_empty() {
        why.push(format!("it needs {}", linking.needed.join(", ")));
    }
    Err(refusal(format!(
        "{} is dynamically linked ({}), and a sandbox image may have no loader or libc",
        path.display(),
        why.join("; ")
    )))
}

/// Runs `<path> --version` under [`VERSION_TIMEOUT`] and reads the version it prints.
async fn run_version(path: &Path) -> Result<String, Error> {
    let mut child = tokio::process::Command::new(path)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| refusal(format!("cannot run {} --version: {e}", path.display())))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| refusal("no stdout of --version".to_owned()))?;
    let run = async {
        let mut out = Vec::new();
        (&mut stdout)
            .take(MAX_VERSION_OUTPUT)
            .read_to_end(&mut out)
            .await?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out))
    };
    let (status, out) = match tokio::time::timeout(VERSION_TIMEOUT, run).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => {
            return Err(refusal(format!(
                "running {} --version: {e}",
                path.display()
            )));
        }
        Err(_) => {
            return Err(refusal(format!(
                "{} --version did not answer within {}s",
                path.display(),
                VERSION_TIMEOUT.as_secs()
            )));
        }
    };
    let text = String::from_utf8_lossy(&out);
    match (status.success(), parse_version(&text)) {
        (true, Some(version)) => Ok(version.to_owned()),
        _ => Err(refusal(format!(
            "{} --version {status} and printed {:?}, not \"sandbox-agent <version>\"",
            path.display(),
            text.chars().take(120).collect::<String>()
        ))),
    }
}

/// The version in the agent's `--version` line, `sandbox-agent 0.1.0`.
fn parse_version(text: &str) -> Option<&str> {
    let line = text.trim_end_matches(['\n', '\r']);
    let version = line.strip_prefix("sandbox-agent ")?;
    let plain = !version.is_empty()
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'));
    plain.then_some(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_is_the_agents_and_nothing_else() {
        assert_eq!(parse_version("sandbox-agent 0.1.0\n"), Some("0.1.0"));
        assert_eq!(
            parse_version("sandbox-agent 1.2.3-rc.1"),
            Some("1.2.3-rc.1")
        );
        for bad in [
            "",
            "sandbox-agent \n",
            "0.1.0\n",
            "busybox v1.36.1\n",
            "sandbox-agent 0.1.0\nmore\n",
            "sandbox-agent 0.1.0 extra",
        ] {
            assert_eq!(parse_version(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_missing_agent_is_refused_with_the_fix() {
        let err = AgentBinary::load(Some(Path::new("/nonexistent/sandbox-agent")))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::ConfigIncomplete));
        let text = err.to_string();
        assert!(
            text.contains("there is no agent at /nonexistent/sandbox-agent"),
            "{text}"
        );
        assert!(text.contains("cargo xtask agent"), "{text}");
        assert!(text.contains("docker.agent_path"), "{text}");
    }

    /// The host's `/bin/true` is a dynamic executable on every Debian system.
    #[tokio::test]
    async fn a_dynamic_agent_is_refused_before_it_runs() {
        let err = AgentBinary::load(Some(Path::new("/bin/true")))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("dynamically linked"), "{text}");
        assert!(text.contains("libc.so"), "{text}");
        assert!(text.contains("cargo xtask agent"), "{text}");
    }

    #[tokio::test]
    async fn a_file_that_is_not_an_executable_is_refused() {
        let dir = std::env::temp_dir().join(format!("agent-bin-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join(FILE_NAME);
        std::fs::write(&script, "#!/bin/sh\necho sandbox-agent 0.1.0\n").unwrap();
        let err = AgentBinary::load(Some(&script)).await.unwrap_err();
        assert!(err.to_string().contains("not an ELF file"), "{err}");
        let err = AgentBinary::load(Some(&dir)).await.unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_default_is_beside_the_running_binary() {
        let exe = std::env::current_exe().unwrap();
        assert_eq!(
            default_path().unwrap(),
            exe.parent().unwrap().join("sandbox-agent")
        );
    }
}
