//! The pull path against a real registry — Debian's `docker-registry`, started by this test on
//! 127.0.0.1 (never a public registry): a missing image is pulled under `missing`, an unknown
//! manifest is `invalid_request`, an unreachable registry is `unavailable`, and snapshot images
//! are never pulled.
//!
//! Needs the engine, the local test image and the `docker-registry` binary (xtask installs the
//! Debian package), so it is ignored in a plain `cargo test` and run by `cargo xtask test`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::io::Write as _;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bollard::query_parameters::{PushImageOptions, RemoveImageOptions, TagImageOptions};
use futures_util::StreamExt;
use sandbox_core::{
    CreateRequest, ErrorCode, ErrorKind, ExecRequest, ListFilter, SandboxProvider, TemplateId,
};
use sandbox_provider_docker::{DockerConfig, DockerProvider, NetworkMode, PullPolicy};

const IMAGE: &str = "sandbox-busybox:test";

/// A `docker-registry` on a free loopback port, storing into a temp dir; killed on drop.
struct Registry {
    child: Child,
    addr: String,
    dir: std::path::PathBuf,
}

impl Registry {
    fn start() -> Registry {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir =
            std::env::temp_dir().join(format!("sbxt-registry-{port}-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = dir.join("config.yml");
        let mut f = std::fs::File::create(&config).unwrap();
        write!(
            f,
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (Debian package docker-registry) must be installed: cargo xtask test installs it");
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        // A readiness probe of a loopback server this test started, not a tenant endpoint.
        #[allow(clippy::disallowed_methods)]
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry { child, addr, dir }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn provider(policy: PullPolicy) -> sandbox_core::Checked<DockerProvider> {
    let mut c = DockerConfig::new(
        TemplateId::new(IMAGE).unwrap(),
        &format!("treg-{:08x}", fastrand::u32(..)),
    );
    c.enabled = true;
    c.agent_path = Some(crate::support::agent_bin());
    c.pull_policy = policy;
    c.network = NetworkMode::None;
    c.idle_sweep = false;
    c.extra_labels
        .insert("sandbox.test".to_owned(), "1".to_owned());
    DockerProvider::connect(c).await.unwrap()
}

fn create(template: &str) -> CreateRequest {
    CreateRequest::new(TemplateId::new(template).unwrap())
}

async fn remove_image(p: &DockerProvider, image: &str) {
    let _ = p
        .docker()
        .remove_image(
            image,
            Some(RemoveImageOptions {
                force: true,
                noprune: true,
                ..Default::default()
            }),
            None,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and docker-registry: cargo xtask test runs it"]
async fn pulls_follow_the_policy_against_a_loopback_registry() {
    let mut registry = Registry::start();
    let p = provider(PullPolicy::Missing).await;
    let repo = format!("{}/sbxt/busybox", registry.addr);
    let tag = format!("t{:08x}", fastrand::u32(..));
    let remote = format!("{repo}:{tag}");

    // Publish the local test image to the loopback registry (Docker trusts 127.0.0.0/8
    // registries over plain HTTP), then forget the local name so a create must pull it.
    p.docker()
        .tag_image(
            IMAGE,
            Some(TagImageOptions {
                repo: Some(repo.clone()),
                tag: Some(tag.clone()),
            }),
        )
        .await
        .unwrap();
    let mut push = p.docker().push_image(
        &repo,
        Some(PushImageOptions {
            tag: Some(tag.clone()),
            ..Default::default()
        }),
        None,
    );
    while let Some(step) = push.next().await {
        step.expect("push to the loopback registry");
    }
    remove_image(&p, &remote).await;
    assert!(
        p.docker().inspect_image(&remote).await.is_err(),
        "the pulled name must be absent before the test"
    );

    // `never` refuses to fetch it...
    let never = provider(PullPolicy::Never).await;
    let err = never.create(create(&remote)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert_eq!(err.code(), Some(ErrorCode::ImageNotPresent));

    // ... `missing` pulls it and the sandbox runs.
    let h = p.create(create(&remote)).await.unwrap();
    let r = p
        .exec(&h, ExecRequest::argv("echo", ["pulled"]))
        .await
        .unwrap();
    assert_eq!(r.stdout_lossy(), "pulled\n");

    // A manifest the registry does not have is the caller's bad template.
    let err = p
        .create(create(&format!("{repo}:no-such-tag")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");

    // Snapshot references are local commits: never pulled, even under `always`. A missing one
    // is the same `snapshot_not_found` as a foreign one ([create.snapshot_owner]).
    let always = provider(PullPolicy::Always).await;
    let err = always
        .create(create(&format!(
            "sandbox-snapshot-{}:gone",
            always.namespace()
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SnapshotNotFound), "{err}");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    // A registry that cannot be reached may come back: unavailable, not invalid.
    registry.stop();
    let err = p
        .create(create(&format!("{repo}:another-{tag}")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    for s in p.list(&ListFilter::default()).await.unwrap() {
        let _ = p.delete(&s.id).await;
    }
    remove_image(&p, &remote).await;
}
