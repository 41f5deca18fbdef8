//! Building the default sandbox image locally, without a registry: `FROM scratch` plus a
//! statically linked busybox from the host (Debian's `busybox-static`), so a fresh machine gets a
//! working image with nothing pulled.

use std::path::Path;

use bollard::query_parameters::BuildImageOptionsBuilder;
use futures_util::StreamExt as _;
use sandbox_core::{Error, ErrorKind, Operation, Provider};

use crate::errors;
use crate::provider::DockerProvider;

const OP_BUILD: Operation = Operation::new("build_image");

/// Where Debian's `busybox-static` installs the binary.
pub const DEFAULT_BUSYBOX: &str = "/bin/busybox";

/// The repository of images this recipe builds: only images named `sandbox-busybox:<tag>` are
/// ever built from it, so a missing image of any other name is never silently replaced.
pub const RECIPE_REPOSITORY: &str = "sandbox-busybox";

/// Label on images this recipe built.
pub const RECIPE_LABEL: &str = "sandbox.recipe";

/// `RUN` executes the copied busybox inside the build container, so a dynamically linked one
/// (Debian's plain `busybox` package) fails here, at build time, rather than in every sandbox.
const DOCKERFILE: &str = "FROM scratch\n\
COPY busybox /bin/busybox\n\
RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n";

/// What to tell an operator whose host cannot build the image.
const FIX: &str = "install Debian's busybox-static (apt-get install busybox-static), which \
puts a statically linked busybox at /bin/busybox, or point the service at an image you have";

/// Whether `image` is named for this recipe (`sandbox-busybox:<tag>`).
pub fn is_recipe_image(image: &str) -> bool {
    image
        .split_once(':')
        .is_some_and(|(repo, tag)| repo == RECIPE_REPOSITORY && !tag.is_empty())
}

fn build_error(kind: ErrorKind, message: String) -> Error {
    Error::new(kind, OP_BUILD, message).with_provider(Provider::Docker)
}

impl DockerProvider {
    /// Whether the engine has `image` locally (no pull, whatever the pull policy).
    pub async fn image_present(&self, image: &str) -> Result<bool, Error> {
        match self.docker().inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) => {
                let mapped = errors::map(OP_BUILD, e);
                if mapped.http_status() == Some(404) {
                    Ok(false)
                } else {
                    Err(mapped)
                }
            }
        }
    }

    /// Builds `image` (which must be named `sandbox-busybox:<tag>`) from the busybox binary at
    /// `busybox`, calling `progress` with each line of the engine's build output. The build runs
    /// with networking off and the legacy builder, which needs no registry for `FROM scratch`.
    pub async fn build_busybox_image(
        &self,
        image: &str,
        busybox: &Path,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(), Error> {
        if !is_recipe_image(image) {
            return Err(build_error(
                ErrorKind::InvalidRequest,
                format!(
                    "only images named {RECIPE_REPOSITORY}:<tag> are built locally; {image:?} is not"
                ),
            ));
        }
        let binary = tokio::fs::read(busybox).await.map_err(|e| {
            build_error(
                ErrorKind::InvalidRequest,
                format!("cannot read {}: {e}; {FIX}", busybox.display()),
            )
        })?;
        let context = build_context(&binary).map_err(|e| {
            build_error(
                ErrorKind::Internal,
                format!("cannot assemble the build context: {e}"),
            )
        })?;
        let labels = std::collections::HashMap::from([(
            RECIPE_LABEL.to_owned(),
            "busybox-static".to_owned(),
        )]);
        let options = BuildImageOptionsBuilder::default()
            .t(image)
            .rm(true)
            .forcerm(true)
            .networkmode("none")
            .labels(&labels)
            .build();
        let mut steps = StepImages::default();
        let built = self.run_build(image, busybox, options, context, progress, &mut steps);
        let outcome = built.await;
        if outcome.is_err() {
            self.remove_step_images(&steps.committed).await;
        }
        outcome
    }

    /// Removes the images the steps of a failed build committed (the legacy builder keeps them
    /// as build cache, and with the final image missing they would stay dangling). An image
    /// that another image or a tag still needs is refused by the engine and kept; nothing here
    /// is forced.
    async fn remove_step_images(&self, steps: &[String]) {
        for id in steps.iter().rev() {
            let options = bollard::query_parameters::RemoveImageOptionsBuilder::default()
                .force(false)
                .noprune(false)
                .build();
            if let Err(e) = self.docker().remove_image(id, Some(options), None).await {
                tracing::debug!(image = %id, error = %e, "a failed build's step image stays");
            }
        }
    }

    async fn run_build(
        &self,
        image: &str,
        busybox: &Path,
        options: bollard::query_parameters::BuildImageOptions,
        context: Vec<u8>,
        progress: &mut (dyn FnMut(&str) + Send),
        steps: &mut StepImages,
    ) -> Result<(), Error> {
        let mut stream =
            self.docker()
                .build_image(options, None, Some(bollard::body_full(context.into())));
        let mut last = String::new();
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| {
                let mapped = errors::map(OP_BUILD, e);
                match mapped.kind() {
                    // The engine refused the build: the binary is the likely cause.
                    ErrorKind::Internal | ErrorKind::InvalidRequest => build_error(
                        ErrorKind::InvalidRequest,
                        format!(
                            "building {image} failed: {}; the busybox at {} must be statically \
                             linked: {FIX}",
                            mapped.message(),
                            busybox.display()
                        ),
                    ),
                    _ => mapped,
                }
            })?;
            if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                return Err(build_error(
                    ErrorKind::InvalidRequest,
                    format!(
                        "building {image} failed: {detail} (after {last:?}); the busybox at {} \
                         must be statically linked: {FIX}",
                        busybox.display()
                    ),
                ));
            }
            for line in info.stream.iter().flat_map(|s| s.lines()) {
                let line = plain(line);
                steps.see(&line);
                if !line.is_empty() {
                    progress(&line);
                    last = line;
                }
            }
        }
        if self.image_present(image).await? {
            Ok(())
        } else {
            Err(build_error(
                ErrorKind::Internal,
                format!("the engine finished building {image} but does not list it"),
            ))
        }
    }
}

/// The images this build's steps committed, read from the legacy builder's output. A step the
/// cache answered (` ---> Using cache` before its id) committed nothing: its image belongs to an
/// earlier build, perhaps one a healthy image still layers on, so it is not this build's to remove.
#[derive(Default)]
struct StepImages {
    committed: Vec<String>,
    cached: bool,
}

impl StepImages {
    fn see(&mut self, line: &str) {
        if line.trim() == "---> Using cache" {
            self.cached = true;
        } else if let Some(id) = step_image(line)
            && !std::mem::take(&mut self.cached)
        {
            self.committed.push(id.to_owned());
        }
    }
}

/// The image a legacy build step produced (` ---> 3f1c2d4e5a6b`), if the line names one.
fn step_image(line: &str) -> Option<&str> {
    let id = line.trim().strip_prefix("---> ")?;
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// A build output line without terminal escapes (the engine colours RUN's stderr) or other
/// control characters, so logs stay plain text.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC '[' parameters, ended by a letter.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else if !c.is_control() {
            out.push(c);
        }
    }
    out.trim_end().to_owned()
}

/// The build context: the Dockerfile and the binary, as an uncompressed tar.
fn build_context(busybox: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut archive = tar::Builder::new(Vec::new());
    for (name, mode, bytes) in [
        ("Dockerfile", 0o644, DOCKERFILE.as_bytes()),
        ("busybox", 0o755, busybox),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(mode);
        header.set_cksum();
        archive.append_data(&mut header, name, bytes)?;
    }
    archive.into_inner()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn step_images_are_read_from_the_build_output() {
        assert_eq!(step_image(" ---> 3f1c2d4e5a6b"), Some("3f1c2d4e5a6b"));
        assert_eq!(step_image("---> Running in 3f1c2d4e5a6b"), None);
        assert_eq!(step_image(" ---> Using cache"), None);
        assert_eq!(step_image("Step 2/3 : COPY busybox /bin/busybox"), None);
        assert_eq!(step_image(" ---> abc"), None);
    }

    #[test]
    fn a_step_the_cache_answered_committed_nothing() {
        let mut steps = StepImages::default();
        for line in [
            "Step 1/4 : FROM scratch",
            " ---> ",
            "Step 2/4 : COPY busybox /bin/busybox",
            " ---> Using cache",
            " ---> 72dadbecdb1a",
            "Step 3/4 : RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]",
            " ---> Running in 73d2a8b97590",
            " ---> 3f1c2d4e5a6b",
        ] {
            steps.see(line);
        }
        assert_eq!(steps.committed, ["3f1c2d4e5a6b"]);
    }

    #[test]
    fn progress_lines_are_plain_text() {
        assert_eq!(
            plain("\u{1b}[91mexec /bin/busybox: no such file\u{1b}[0m\r\n"),
            "exec /bin/busybox: no such file"
        );
        assert_eq!(plain("Step 1/5 : FROM scratch"), "Step 1/5 : FROM scratch");
        assert_eq!(plain("\u{1b}"), "");
    }

    #[test]
    fn only_recipe_names_are_built() {
        assert!(is_recipe_image("sandbox-busybox:test"));
        assert!(is_recipe_image("sandbox-busybox:first-start-1"));
        for other in [
            "sandbox-busybox",
            "sandbox-busybox:",
            "python:3.12",
            "registry.example/sandbox-busybox:test",
            "busybox:latest",
        ] {
            assert!(!is_recipe_image(other), "{other}");
        }
    }

    #[test]
    fn the_context_holds_the_dockerfile_and_an_executable_binary() {
        let tar_bytes = build_context(b"\x7fELF-pretend").unwrap();
        let mut archive = tar::Archive::new(tar_bytes.as_slice());
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mode = entry.header().mode().unwrap();
            let mut body = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut body).unwrap();
            seen.push((path, mode, body));
        }
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0, "Dockerfile");
        assert!(String::from_utf8_lossy(&seen[0].2).starts_with("FROM scratch"));
        assert_eq!(
            seen[1],
            ("busybox".to_owned(), 0o755, b"\x7fELF-pretend".to_vec())
        );
    }
}
