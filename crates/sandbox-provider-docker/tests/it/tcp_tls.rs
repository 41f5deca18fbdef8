//! A `tcp://` daemon over mutual TLS, on the real engine: a loopback TLS proxy this test runs
//! (requiring a client certificate issued by its CA) forwards each authenticated connection
//! byte for byte to the engine's unix socket. The adapter connects to `tcp://127.0.0.1:<port>`
//! through the guarded connector with the normal `DockerProvider::connect`, negotiates the API,
//! creates a sandbox and execs in it — exec output travels over an HTTP upgrade, so this is
//! also the proof that hijacked connections work over the custom transport. A client
//! certificate from another CA, or a daemon certificate the client's CA did not issue, fails
//! with `authentication` and never reaches the engine.
//!
//! Needs a Docker engine and the locally built `sandbox-busybox:test` image, so it is ignored
//! in a plain `cargo test`; `cargo xtask test` runs it in the docker engine stage. Containers are
//! labelled `sandbox.test=1` and scoped to a namespace unique to the test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sandbox_core::{
    CreateRequest, ErrorKind, ExecRequest, ListFilter, SandboxPath, SandboxProvider, TemplateId,
};
use sandbox_provider_docker::engine::{self, Endpoint};
use sandbox_provider_docker::{DockerConfig, DockerProvider};
use support::{Ca, CertDir, Issued};

use support::{IMAGE, namespace};

fn config(ns: &str, port: u16, certs: &Path) -> DockerConfig {
    let mut c = support::config(ns);
    c.host = Some(format!("tcp://127.0.0.1:{port}"));
    c.tls_cert_path = Some(certs.to_path_buf());
    c
}

/// The engine's unix socket, as the adapter itself would find it.
fn engine_socket() -> PathBuf {
    match engine::resolve_endpoint(None, std::env::var("DOCKER_HOST").ok().as_deref(), None) {
        Ok(Endpoint::Unix(path)) => path,
        other => panic!("the test proxies to a unix socket, not {other:?}"),
    }
}

/// A loopback TLS daemon front: what it accepted, and what it let through to the engine.
struct Proxy {
    port: u16,
    accepted: Arc<AtomicUsize>,
    forwarded: Arc<AtomicUsize>,
}

impl Proxy {
    /// Serves `server` (issued by `ca`) and requires a client certificate issued by `ca`.
    async fn start(ca: &Ca, server: &Issued) -> Proxy {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
            .unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(server.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let socket = engine_socket();
        let (accepted, forwarded) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (acc, fwd) = (accepted.clone(), forwarded.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                acc.fetch_add(1, Ordering::SeqCst);
                let (acceptor, socket, fwd) = (acceptor.clone(), socket.clone(), fwd.clone());
                tokio::spawn(async move {
                    // The handshake ends only after the client's certificate is verified.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut engine = tokio::net::UnixStream::connect(&socket).await.unwrap();
                    fwd.fetch_add(1, Ordering::SeqCst);
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut engine).await;
                });
            }
        });
        Proxy {
            port,
            accepted,
            forwarded,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn forwarded(&self) -> usize {
        self.forwarded.load(Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_tcp_daemon_over_mutual_tls_runs_a_sandbox() {
    let ca = Ca::new("daemon test CA");
    let proxy = Proxy::start(&ca, &ca.server()).await;
    let certs = CertDir::new(&ca, &ca.client());
    let ns = namespace("tls");
    let p = DockerProvider::connect(config(&ns, proxy.port, certs.path()))
        .await
        .expect("connect to the engine through the TLS proxy");
    assert!(!p.engine().api_version.is_empty());
    p.health().await.unwrap();
    let after_connect = proxy.forwarded();
    assert!(
        after_connect >= 1,
        "the version probe went through the proxy"
    );

    let h = p
        .create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap();
    let r = p
        .exec(&h, ExecRequest::argv("echo", ["hello"]))
        .await
        .unwrap();
    assert_eq!(r.stdout_lossy(), "hello\n", "stderr: {}", r.stderr_lossy());
    assert_eq!(r.exit_code, 0);
    // Stdin goes the other way over the same upgraded connection.
    let mut cat = ExecRequest::argv("cat", Vec::<String>::new());
    cat.stdin = Some(b"piped over tls\n".to_vec());
    let r = p.exec(&h, cat).await.unwrap();
    assert_eq!(r.stdout_lossy(), "piped over tls\n");
    let path = SandboxPath::new("/tmp/over-tls.txt").unwrap();
    p.write_file(&h, &path, b"written over tls").await.unwrap();
    assert_eq!(p.read_file(&h, &path).await.unwrap(), b"written over tls");

    let listed = p.list(&ListFilter::default()).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    p.delete(h.id()).await.unwrap();
    assert!(p.list(&ListFilter::default()).await.unwrap().is_empty());
    assert!(
        proxy.forwarded() > after_connect,
        "every call went through the proxy ({} connections)",
        proxy.forwarded()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn certificates_from_another_ca_never_reach_the_engine() {
    let ca = Ca::new("daemon test CA");
    let other = Ca::new("someone else's CA");
    let proxy = Proxy::start(&ca, &ca.server()).await;

    // The client presents a certificate the daemon's CA did not issue: the daemon refuses it.
    let certs = CertDir::new(&ca, &other.client());
    let err = DockerProvider::connect(config(&namespace("tlsc"), proxy.port, certs.path()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Authentication, "{err}");
    let shown = err.to_string();
    assert!(
        shown.contains("TLS with the Docker engine failed"),
        "{shown}"
    );
    assert!(shown.contains("cert.pem"), "{shown}");
    assert!(proxy.accepted() >= 1, "the proxy was dialled");
    assert_eq!(proxy.forwarded(), 0, "nothing reached the engine");

    // The client trusts another CA than the one that issued the daemon's certificate.
    let accepted = proxy.accepted();
    let certs = CertDir::new(&other, &ca.client());
    let err = DockerProvider::connect(config(&namespace("tlss"), proxy.port, certs.path()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Authentication, "{err}");
    let shown = err.to_string();
    assert!(shown.contains("ca.pem"), "{shown}");
    assert!(shown.to_lowercase().contains("certificate"), "{shown}");
    assert!(proxy.accepted() > accepted, "the proxy was dialled");
    assert_eq!(proxy.forwarded(), 0, "nothing reached the engine");

    // The right certificates get through the same proxy: the refusals above were the TLS.
    let certs = CertDir::new(&ca, &ca.client());
    let p = DockerProvider::connect(config(&namespace("tlsok"), proxy.port, certs.path()))
        .await
        .unwrap();
    p.health().await.unwrap();
    assert!(proxy.forwarded() >= 1);
}
