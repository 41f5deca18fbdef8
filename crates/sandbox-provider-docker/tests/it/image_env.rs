//! The image's `ENV` reaches every command, in both data planes, with one precedence: the
//! image's `ENV` under the create request's env, under the command's own env. Exec mode gets it
//! from the engine (an exec runs with the container's environment); agent mode's agent starts
//! processes with an environment of its own making, so the provider hands it the image's.
//!
//! Each test builds its own small image locally, `FROM sandbox-busybox:test` with `ENV` lines
//! (the legacy builder, networking off: nothing is pulled), and removes it at the end. They need
//! the engine, the `sandbox-busybox:test` image, and for agent mode the static agent
//! (`SANDBOX_AGENT_BIN`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test module: a failed unwrap is a failed test.

use std::collections::BTreeMap;

use bollard::Docker;
use bollard::query_parameters::{
    BuildImageOptionsBuilder, RemoveImageOptionsBuilder, StopContainerOptions,
};
use futures_util::StreamExt as _;
use sandbox_core::{
    CreateRequest, ExecRequest, ListFilter, SandboxHandle, SandboxProvider, Snapshots, TemplateId,
};
use sandbox_provider_docker::{DataPlane, DockerConfig, DockerProvider};

use crate::channel::agent_binary;
use crate::support::{IMAGE, config, namespace};

/// What the image says; `SBX_LAYERED` and `SBX_COMMAND` are overridden above it. A value with
/// a space and an `=`, so nothing splits it on the way.
const DOCKERFILE_ENV: &str = "ENV SBX_IMAGE_ONLY=\"from image\" SBX_LAYERED=image \
SBX_COMMAND=image SBX_EQ=a=b PATH=/image/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The script every check runs: each variable on its own line, `-` when unset.
const PRINT: &str = "for v in SBX_IMAGE_ONLY SBX_LAYERED SBX_COMMAND SBX_EQ SBX_CREATE_ONLY PATH; \
do eval \"echo \\\"\\${$v--}\\\"\"; done";

/// A locally built image with [`DOCKERFILE_ENV`], removed on [`EnvImage::remove`].
struct EnvImage {
    docker: Docker,
    name: String,
}

impl EnvImage {
    async fn build() -> EnvImage {
        let docker = Docker::connect_with_unix_defaults().unwrap();
        let name = format!("sbx-test-image-env:{:08x}", fastrand::u32(..));
        let dockerfile = format!("FROM {IMAGE}\n{DOCKERFILE_ENV}\n");
        let mut archive = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(dockerfile.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        archive
            .append_data(&mut header, "Dockerfile", dockerfile.as_bytes())
            .unwrap();
        let context = archive.into_inner().unwrap();
        let options = BuildImageOptionsBuilder::default()
            .t(&name)
            .rm(true)
            .forcerm(true)
            .networkmode("none")
            .pull("false")
            .build();
        {
            let mut stream =
                docker.build_image(options, None, Some(bollard::body_full(context.into())));
            while let Some(item) = stream.next().await {
                let info = item.unwrap_or_else(|e| panic!("building {name}: {e}"));
                assert!(
                    info.error_detail.is_none(),
                    "building {name}: {:?}",
                    info.error_detail
                );
            }
        }
        let env = docker
            .inspect_image(&name)
            .await
            .unwrap()
            .config
            .unwrap()
            .env
            .unwrap();
        assert!(
            env.iter().any(|e| e == "SBX_IMAGE_ONLY=from image"),
            "{env:?}"
        );
        EnvImage { docker, name }
    }

    async fn remove(self) {
        let options = RemoveImageOptionsBuilder::default().force(true).build();
        self.docker
            .remove_image(&self.name, Some(options), None)
            .await
            .unwrap();
    }
}

async fn cleanup(p: &DockerProvider) {
    for s in p.list(&ListFilter::default()).await.unwrap_or_default() {
        let _ = p.delete(&s.id).await;
    }
}

fn create_request(template: &str, env: &[(&str, &str)]) -> CreateRequest {
    let mut create = CreateRequest::new(TemplateId::new(template).unwrap());
    create.env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect::<BTreeMap<_, _>>();
    create
}

/// What [`PRINT`] shows in `h`, as a command that sets `SBX_COMMAND` itself.
async fn seen(p: &DockerProvider, h: &SandboxHandle) -> Vec<String> {
    let mut request = ExecRequest::shell(PRINT);
    request
        .env
        .insert("SBX_COMMAND".to_owned(), "command".to_owned());
    let r = p.exec(h, request).await.unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr_lossy());
    r.stdout_lossy().lines().map(str::to_owned).collect()
}

/// One data plane's run: a create over the image, a restart and a restore.
async fn check(data_plane: DataPlane, tag: &str) {
    let image = EnvImage::build().await;
    let mut c: DockerConfig = config(&namespace(tag));
    if data_plane == DataPlane::Agent {
        c.data_plane = DataPlane::Agent;
        c.agent_path = Some(agent_binary());
    }
    let p = DockerProvider::connect(c).await.unwrap();
    assert_eq!(p.data_plane(), data_plane);
    let create = create_request(
        &image.name,
        &[("SBX_LAYERED", "create"), ("SBX_CREATE_ONLY", "create")],
    );
    let h = p.create(create).await.unwrap();
    let expected = [
        "from image",
        "create",
        "command",
        "a=b",
        "create",
        "/image/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ];
    assert_eq!(seen(&p, &h).await, expected, "{data_plane:?}");
    // Without a command env of its own, the image's (under the create's) shows.
    let r = p
        .exec(&h, ExecRequest::shell("echo $SBX_COMMAND"))
        .await
        .unwrap();
    assert_eq!(r.stdout_lossy().trim(), "image", "{data_plane:?}");

    // A stopped sandbox that the next command starts again has the same environment.
    p.docker()
        .stop_container(h.id().as_str(), None::<StopContainerOptions>)
        .await
        .unwrap();
    assert_eq!(seen(&p, &h).await, expected, "after a restart");
    // A restore boots the snapshot, which carries the image's ENV and the create's env;
    // the restore's own env is above both.
    let snap = p.create_snapshot(h.id(), Some("env")).await.unwrap();
    let mut restore = create_request(snap.id.as_str(), &[("SBX_LAYERED", "restore")]);
    restore.from_snapshot = true;
    let restored = p.create(restore).await.unwrap();
    assert_eq!(
        seen(&p, &restored).await,
        [
            "from image",
            "restore",
            "command",
            "a=b",
            "create",
            "/image/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ],
        "a restore"
    );
    cleanup(&p).await;
    p.delete_snapshot(&snap.id).await.unwrap();
    image.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn exec_mode_commands_see_the_images_env_under_the_create_and_command_env() {
    check(DataPlane::Exec, "ienx").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn agent_mode_commands_see_the_images_env_under_the_create_and_command_env() {
    check(DataPlane::Agent, "iena").await;
}
