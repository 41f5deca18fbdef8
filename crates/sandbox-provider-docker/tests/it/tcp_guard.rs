//! A `tcp://` daemon is dialled only through sandbox-transport's guarded connector: a daemon
//! name that resolves to a cloud-metadata address, or such an address written as a literal in
//! any encoding, is refused with `unsafe_outbound_url` before any socket is opened — even though
//! the daemon policy allows private addresses, and for every address of the metadata table,
//! also those that sit inside private ranges. Hermetic: the resolver and the dialer are the test's own, and the
//! dialer only records what it was asked to dial.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{Error, ErrorCode, ErrorKind, TemplateId};
use sandbox_provider_docker::engine::Dialing;
use sandbox_provider_docker::{DockerConfig, DockerProvider, NetworkMode, PullPolicy};
use sandbox_transport::metadata::METADATA_ENDPOINTS;
use sandbox_transport::{Dial, Resolve};
use support::{Ca, CertDir};
use tokio::net::TcpStream;

/// Answers every lookup with the same addresses and records the names asked for.
#[derive(Debug)]
struct FixedResolver {
    answer: Vec<IpAddr>,
    lookups: Mutex<Vec<String>>,
}

#[async_trait]
impl Resolve for FixedResolver {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        self.lookups.lock().unwrap().push(host.to_owned());
        Ok(self.answer.clone())
    }
}

/// Records each address it is asked to dial and connects to none of them.
#[derive(Debug, Default)]
struct RecordingDialer {
    dials: Mutex<Vec<SocketAddr>>,
}

#[async_trait]
impl Dial for RecordingDialer {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        self.dials.lock().unwrap().push(addr);
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "the test dialer connects nowhere",
        ))
    }
}

struct Outcome {
    error: Error,
    lookups: Vec<String>,
    dials: Vec<SocketAddr>,
}

/// Connects to `host` with valid TLS material, the resolver answering `answer`.
async fn connect(host: &str, answer: &[&str]) -> Outcome {
    let ca = Ca::new("guard test CA");
    let certs = CertDir::new(&ca, &ca.client());
    connect_with_certs(host, answer, &certs).await
}

async fn connect_with_certs(host: &str, answer: &[&str], certs: &CertDir) -> Outcome {
    connect_full(host, answer, certs, NetworkMode::None).await
}

async fn connect_full(
    host: &str,
    answer: &[&str],
    certs: &CertDir,
    network: NetworkMode,
) -> Outcome {
    let resolver = Arc::new(FixedResolver {
        answer: answer.iter().map(|a| a.parse().unwrap()).collect(),
        lookups: Mutex::new(Vec::new()),
    });
    let dialer = Arc::new(RecordingDialer::default());
    let mut config = DockerConfig::new(
        TemplateId::new("sandbox-busybox:test").unwrap(),
        &format!("tguard-{:08x}", fastrand::u32(..)),
    );
    config.enabled = true;
    // The guard is judged before any engine call in either data plane; exec mode needs no
    // agent binary, which this hermetic test does not have.
    config.data_plane = sandbox_provider_docker::DataPlane::Exec;
    config.pull_policy = PullPolicy::Never;
    config.network = network;
    config.idle_sweep = false;
    config.rpc_timeout = Duration::from_secs(5);
    config.host = Some(host.to_owned());
    config.tls_cert_path = Some(certs.path().to_path_buf());
    let dialing = Dialing {
        resolver: resolver.clone(),
        dialer: dialer.clone(),
    };
    let error = DockerProvider::connect_with(config, dialing)
        .await
        .expect_err("nothing answers here, so connect must fail");
    let lookups = resolver.lookups.lock().unwrap().clone();
    let dials = dialer.dials.lock().unwrap().clone();
    Outcome {
        error,
        lookups,
        dials,
    }
}

fn assert_refused(o: &Outcome, what: &str) {
    assert_eq!(
        o.error.kind(),
        ErrorKind::InvalidRequest,
        "{what}: {}",
        o.error
    );
    assert_eq!(
        o.error.code(),
        Some(ErrorCode::UnsafeOutboundUrl),
        "{what}: {}",
        o.error
    );
    let shown = o.error.to_string();
    assert!(
        shown.contains("outbound endpoint refused"),
        "{what}: {shown}"
    );
    assert!(shown.contains("docker host "), "{what}: {shown}");
    assert!(o.dials.is_empty(), "{what}: dialled {:?}", o.dials);
}

#[tokio::test]
async fn a_daemon_name_resolving_to_cloud_metadata_is_never_dialled() {
    // Every address of the metadata table, the ones inside ranges the daemon policy allows
    // (ULA, CGNAT) and WireServer's public one included, and an IPv4-mapped form.
    let table: Vec<String> = METADATA_ENDPOINTS
        .iter()
        .map(|e| e.addr.to_string())
        .chain(["::ffff:169.254.169.254".to_owned()])
        .collect();
    for metadata in table.iter().map(String::as_str) {
        let o = connect("tcp://docker.example.test:2376", &[metadata]).await;
        assert_refused(&o, metadata);
        assert!(
            o.error.to_string().contains("cloud metadata"),
            "{metadata}: {}",
            o.error
        );
        assert_eq!(o.lookups, ["docker.example.test"], "{metadata}");
        assert!(
            o.error.to_string().contains("docker.example.test:2376"),
            "{metadata}: {}",
            o.error
        );
    }
    // Link-local is refused as well.
    let o = connect("tcp://docker.example.test:2376", &["169.254.10.1"]).await;
    assert_refused(&o, "link-local");
}

#[tokio::test]
async fn metadata_literals_in_any_encoding_are_refused_without_a_lookup() {
    for host in [
        "tcp://169.254.169.254:2376",
        "tcp://[::ffff:169.254.169.254]:2376",
        "https://[::ffff:a9fe:a9fe]:2376",
        "tcp://[fd00:ec2::254]:2376",
        "tcp://0xa9.0xfe.0xa9.0xfe:2376",
        "tcp://2852039166:2376",
        "tcp://169.254.169.254",
    ] {
        let o = connect(host, &[]).await;
        assert_refused(&o, host);
        assert!(o.lookups.is_empty(), "{host}: looked up {:?}", o.lookups);
    }
}

#[tokio::test]
async fn private_daemons_are_dialled_and_only_at_the_addresses_that_pass() {
    // The control: a private daemon is dialled (so the empty dial lists above mean something),
    // and the failure to connect is `unavailable`, not a refusal.
    let o = connect("tcp://docker.example.test:2376", &["10.0.0.5"]).await;
    assert_eq!(o.dials, ["10.0.0.5:2376".parse().unwrap()]);
    assert_eq!(o.error.kind(), ErrorKind::Unavailable, "{}", o.error);
    assert_eq!(o.error.code(), None, "{}", o.error);
    assert!(
        o.error
            .to_string()
            .contains("the test dialer connects nowhere"),
        "{}",
        o.error
    );
    // A name answering metadata and a private address: only the private one is dialled.
    let o = connect(
        "tcp://docker.example.test:2376",
        &["169.254.169.254", "10.0.0.5"],
    )
    .await;
    assert_eq!(o.dials, ["10.0.0.5:2376".parse().unwrap()]);
    // No port: Docker's TLS port.
    let o = connect("tcp://127.0.0.1", &[]).await;
    assert_eq!(o.dials, ["127.0.0.1:2376".parse().unwrap()]);
}

#[tokio::test]
async fn missing_or_bad_tls_material_is_named_before_anything_is_dialled() {
    let ca = Ca::new("guard test CA");
    for (file, contents) in [
        ("ca.pem", None),
        ("cert.pem", None),
        ("key.pem", None),
        ("ca.pem", Some("not a certificate")),
        ("cert.pem", Some("")),
        (
            "key.pem",
            Some("-----BEGIN PRIVATE KEY-----\nnot!base64\n-----END PRIVATE KEY-----\n"),
        ),
    ] {
        let certs = CertDir::new(&ca, &ca.client());
        let path = certs.path().join(file);
        match contents {
            None => std::fs::remove_file(&path).unwrap(),
            Some(text) => std::fs::write(&path, text).unwrap(),
        }
        let o = connect_with_certs("tcp://10.0.0.5:2376", &[], &certs).await;
        let shown = o.error.to_string();
        assert_eq!(o.error.kind(), ErrorKind::InvalidRequest, "{file}: {shown}");
        assert!(shown.contains(file), "{file}: {shown}");
        assert!(
            shown.contains(&certs.path().display().to_string()),
            "{file}: {shown}"
        );
        assert!(o.dials.is_empty(), "{file}: dialled {:?}", o.dials);
    }
    // A key that is not the certificate's.
    let certs = CertDir::new(&ca, &ca.client());
    std::fs::write(certs.path().join("key.pem"), ca.client().key_pem).unwrap();
    let o = connect_with_certs("tcp://10.0.0.5:2376", &[], &certs).await;
    assert_eq!(o.error.kind(), ErrorKind::InvalidRequest, "{}", o.error);
    assert!(o.error.to_string().contains("key.pem"), "{}", o.error);
    assert!(o.dials.is_empty());
}

#[tokio::test]
async fn bridge_networking_needs_a_daemon_on_this_host() {
    // The egress chains are installed where the adapter runs: a daemon elsewhere would run its
    // sandboxes unprotected, so the config is refused before any lookup or dial.
    let ca = Ca::new("guard test CA");
    let certs = CertDir::new(&ca, &ca.client());
    for host in ["tcp://10.0.0.5:2376", "tcp://docker.example.test:2376"] {
        let o = connect_full(host, &["10.0.0.5"], &certs, NetworkMode::Bridge).await;
        assert_eq!(
            o.error.kind(),
            ErrorKind::Unsupported,
            "{host}: {}",
            o.error
        );
        assert_eq!(
            o.error.code(),
            Some(ErrorCode::EgressProtectionUnavailable),
            "{host}"
        );
        assert!(o.error.to_string().contains("network none"), "{}", o.error);
        assert!(o.lookups.is_empty() && o.dials.is_empty(), "{host}");
    }
    // A loopback daemon is this host: on to the dial.
    for (host, dialled) in [
        ("tcp://127.0.0.1:2376", "127.0.0.1:2376"),
        ("tcp://[::1]:2376", "[::1]:2376"),
    ] {
        let o = connect_full(host, &[], &certs, NetworkMode::Bridge).await;
        assert_eq!(o.dials, [dialled.parse().unwrap()], "{host}: {}", o.error);
    }
    let o = connect_full(
        "tcp://localhost:2376",
        &["127.0.0.1"],
        &certs,
        NetworkMode::Bridge,
    )
    .await;
    assert_eq!(o.dials, ["127.0.0.1:2376".parse().unwrap()], "{}", o.error);
}
