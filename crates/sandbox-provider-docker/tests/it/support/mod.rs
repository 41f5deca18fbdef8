//! Shared by the engine tests: the settings every test sandbox uses (the local image, no
//! network, no sweep, the test label, a namespace unique to the test), and for the `tcp://`
//! tests a test-made CA that issues daemon and client certificates and a `tls_cert_path`
//! directory holding `ca.pem`, `cert.pem` and `key.pem`, removed on drop.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

/// The locally built image every engine test runs (never pulled).
pub(crate) const IMAGE: &str = "sandbox-busybox:test";

/// A namespace unique to one test run: its containers are its own.
pub(crate) fn namespace(tag: &str) -> String {
    format!("t{tag}-{:08x}", fastrand::u32(..))
}

pub(crate) use sandbox_testkit::static_agent::agent_bin;

/// The adapter's settings for a test sandbox in namespace `ns` on the default engine, in the
/// default data plane (agent mode, with [`agent_bin`]).
pub(crate) fn config(ns: &str) -> sandbox_provider_docker::DockerConfig {
    use sandbox_provider_docker::{DockerConfig, NetworkMode, PullPolicy};
    let mut c = DockerConfig::new(sandbox_core::TemplateId::new(IMAGE).unwrap(), ns);
    assert_eq!(
        c.data_plane,
        sandbox_provider_docker::DataPlane::Agent,
        "agent mode is the default"
    );
    c.agent_path = Some(agent_bin());
    c.enabled = true;
    c.pull_policy = PullPolicy::Never;
    c.network = NetworkMode::None;
    c.idle_sweep = false;
    c.extra_labels
        .insert("sandbox.test".to_owned(), "1".to_owned());
    c
}

/// [`config`] in the exec data plane, the declared fallback.
pub(crate) fn exec_config(ns: &str) -> sandbox_provider_docker::DockerConfig {
    let mut c = config(ns);
    c.data_plane = sandbox_provider_docker::DataPlane::Exec;
    c.agent_path = None;
    c
}

/// `script` as a plain engine exec (agent mode's commands go through the agent instead).
pub(crate) async fn engine_sh(
    p: &sandbox_provider_docker::DockerProvider,
    h: &sandbox_core::SandboxHandle,
    script: &str,
) -> String {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    use futures_util::StreamExt;
    let created = p
        .docker()
        .create_exec(
            h.id().as_str(),
            CreateExecOptions {
                cmd: Some(vec![
                    "/bin/sh".to_owned(),
                    "-c".to_owned(),
                    script.to_owned(),
                ]),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    if let StartExecResults::Attached { mut output, .. } =
        p.docker().start_exec(&created.id, None).await.unwrap()
    {
        while let Some(Ok(frame)) = output.next().await {
            out.extend_from_slice(&frame.into_bytes());
        }
    }
    String::from_utf8_lossy(&out).trim().to_owned()
}

/// A certificate authority made for one test.
pub(crate) struct Ca {
    pub(crate) pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, both PEM.
pub(crate) struct Issued {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A daemon certificate for 127.0.0.1 and `localhost`.
    pub(crate) fn server(&self) -> Issued {
        self.issue(
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate, as `docker --tlsverify` presents one.
    pub(crate) fn client(&self) -> Issued {
        self.issue(Vec::new(), ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, names: Vec<String>, usage: ExtendedKeyUsagePurpose) -> Issued {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "sandbox test");
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A `tls_cert_path` directory; removed on drop.
pub(crate) struct CertDir {
    path: PathBuf,
}

impl CertDir {
    /// `ca.pem` (the CA the daemon's certificate must come from), `cert.pem` and `key.pem`
    /// (the client's).
    pub(crate) fn new(ca: &Ca, client: &Issued) -> CertDir {
        let path = std::env::temp_dir().join(format!("sbx-docker-tls-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("ca.pem"), &ca.pem).unwrap();
        std::fs::write(path.join("cert.pem"), &client.cert_pem).unwrap();
        std::fs::write(path.join("key.pem"), &client.key_pem).unwrap();
        CertDir { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CertDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
