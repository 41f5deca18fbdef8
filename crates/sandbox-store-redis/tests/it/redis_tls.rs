//! TLS and AUTH against a real `redis-server` this test starts: a test-made CA signs the
//! server's certificate, the server listens with TLS only and an ACL user (the default user is
//! off). The store connects with the CA and the user's password and works; a client trusting
//! another CA, a wrong password, or plain TCP to the TLS port are each refused with a clear
//! error — never a store that silently works unauthenticated.
//!
//! Needs `redis-server` (built with TLS, as Debian's is) and `openssl`: ignored in a plain
//! `cargo test`, run by the redis stage of `cargo xtask test`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_core::{Binding, BindingKey, BindingStore, ErrorKind, Provider, SandboxId, TemplateId};
use sandbox_store_redis::{RedisBindingStore, RedisStoreConfig, TlsSettings, Topology};

const USER: &str = "sandbox-app";
const PASSWORD: &str = "correct-horse-battery-staple";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`<name>-ca.crt`) in `dir`.
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            &format!("{name}-ca.key"),
            "-out",
            &format!("{name}-ca.crt"),
            "-subj",
            &format!("/CN={name} test CA"),
        ],
    );
}

/// A server certificate for 127.0.0.1 signed by the `ca` CA.
fn make_server_cert(dir: &Path, ca: &str) {
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &format!("{ca}-ca.crt"),
            "-CAkey",
            &format!("{ca}-ca.key"),
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
}

struct TlsRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start() -> TlsRedis {
    let dir = std::env::temp_dir().join(format!("sbx-redis-tls-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    make_ca(&dir, "good");
    make_ca(&dir, "other");
    make_server_cert(&dir, "good");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = format!(
        "bind 127.0.0.1\nport 0\ntls-port {port}\ntls-cert-file server.crt\ntls-key-file server.key\n\
         tls-ca-cert-file good-ca.crt\ntls-auth-clients no\nsave \"\"\nappendonly no\n\
         user default off\nuser {USER} on >{PASSWORD} ~* &* +@all\n"
    );
    std::fs::write(dir.join("redis.conf"), conf).unwrap();
    let log = std::fs::File::create(dir.join("redis.log")).unwrap();
    let child = Command::new("redis-server")
        .arg("redis.conf")
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("redis-server");
    let server = TlsRedis { child, port, dir };
    // Ready when the server says so in its log (a TCP probe would need a raw dial).
    let start = Instant::now();
    loop {
        let log = std::fs::read_to_string(server.dir.join("redis.log")).unwrap_or_default();
        if log.contains("Ready to accept connections") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "redis-server with TLS did not come up: {log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

fn config(server: &TlsRedis, ca: &str, password: &str, tls: bool) -> RedisStoreConfig {
    let scheme = if tls { "rediss" } else { "redis" };
    let mut c = RedisStoreConfig::new(
        Topology::Standalone {
            url: format!("{scheme}://127.0.0.1:{}", server.port),
        },
        format!("ttls-{:08x}", fastrand::u32(..)),
    );
    c.username = Some(USER.to_owned());
    c.password = Some(sandbox_core::Secret::new(password));
    if tls {
        c.tls = Some(TlsSettings {
            ca_file: Some(server.dir.join(format!("{ca}-ca.crt"))),
            ..TlsSettings::default()
        });
    }
    c.connect_timeout = Duration::from_secs(5);
    c.command_timeout = Duration::from_secs(3);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server with TLS and openssl: cargo xtask test runs it"]
async fn tls_and_acl_auth_connect_and_wrong_credentials_are_refused_clearly() {
    let server = start();

    let store = RedisBindingStore::connect(config(&server, "good", PASSWORD, true))
        .await
        .expect("the right CA and password connect");
    let key = BindingKey::new(3, "over-tls").unwrap();
    let b = Binding::new(
        &key,
        Provider::Docker,
        SandboxId::new("sbx-tls").unwrap(),
        TemplateId::new("tpl").unwrap(),
        time::OffsetDateTime::now_utc(),
    );
    assert!(store.create(&key, &b).await.unwrap());
    assert_eq!(store.get(&key).await.unwrap(), Some(b.clone()));
    let lock = store.lock_lifecycle(&key).await.unwrap();
    lock.release().await.unwrap();
    assert!(
        store
            .delete_if_match(&key, b.provider, &b.sandbox_id)
            .await
            .unwrap()
    );

    // A server certificate from a CA the client does not trust.
    let e = RedisBindingStore::connect(config(&server, "other", PASSWORD, true))
        .await
        .expect_err("an untrusted certificate must not connect");
    println!("untrusted CA: {e}");
    assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
    assert!(
        e.to_string().contains("certificate is not trusted"),
        "the error names the certificate problem: {e}"
    );

    // The right CA, the wrong password.
    let e = RedisBindingStore::connect(config(&server, "good", "wrong-password", true))
        .await
        .expect_err("a wrong password must not connect");
    println!("wrong password: {e}");
    assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("WRONGPASS") || text.to_lowercase().contains("auth"),
        "the error says authentication failed: {e}"
    );
    assert!(
        !text.contains("wrong-password"),
        "the password is never echoed: {e}"
    );

    // Plain TCP to the TLS port.
    let e = RedisBindingStore::connect(config(&server, "good", PASSWORD, false))
        .await
        .expect_err("plain TCP to a TLS port must not connect");
    println!("plain TCP: {e}");
    assert_ne!(e.kind(), ErrorKind::InvalidRequest, "{e}");
}
