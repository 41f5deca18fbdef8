//! The outbound policy and the guarded connector: one row per address class × encoding under
//! both policies, every address of the metadata table in every encoding under both policies
//! (and its neighbours judged by their range), a property test over all of
//! 169.254.0.0/16 in every encoding, DNS rebinding caught at connect time before any socket,
//! whitelist-only mode without a single resolver call for a refused host, and real loopback
//! connections (hyper included) only where the policy allows them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use proptest::prelude::*;
use sandbox_core::ErrorCode;
use sandbox_transport::metadata::METADATA_ENDPOINTS;
use sandbox_transport::{
    Dial, GuardedConnector, IpClass, OutboundPolicy, Resolve, TcpDialer, Whitelist, classify,
    validate_url,
};
use tokio::net::TcpStream;

/// A resolver that answers from a script and counts its calls; an empty script panics, so a
/// literal that should need no DNS proves it.
#[derive(Debug, Default)]
struct Scripted {
    answers: Mutex<VecDeque<Vec<IpAddr>>>,
    calls: AtomicUsize,
}

impl Scripted {
    fn answering(answers: &[&[&str]]) -> Arc<Self> {
        Arc::new(Scripted {
            answers: Mutex::new(
                answers
                    .iter()
                    .map(|a| a.iter().map(|s| s.parse().unwrap()).collect())
                    .collect(),
            ),
            calls: AtomicUsize::new(0),
        })
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Resolve for Scripted {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.answers
            .lock()
            .unwrap()
            .pop_front()
            .ok_or_else(|| panic!("unexpected DNS lookup of {host}"))
    }
}

/// A dialer that counts and never opens a socket.
#[derive(Debug, Default)]
struct NoSockets {
    dials: AtomicUsize,
}

#[async_trait]
impl Dial for NoSockets {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        self.dials.fetch_add(1, Ordering::SeqCst);
        Err(std::io::Error::other(format!(
            "test dialer: would dial {addr}"
        )))
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `Ok(())` when the policy lets `http://<host>/` through (no DNS involved).
fn verdict(host: &str, policy: &OutboundPolicy) -> Result<(), String> {
    let resolver = Scripted::answering(&[]);
    rt().block_on(async {
        validate_url(&format!("http://{host}/"), policy, &*resolver)
            .await
            .map(|_| ())
            .map_err(|e| {
                assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl), "{e}");
                e.to_string()
            })
    })
}

/// The IPv4 encodings of one address that URL hosts accept, with whether each is the address
/// itself (`true`) or a relay's embedding of it (`false`).
fn v4_encodings(ip: Ipv4Addr) -> Vec<(String, &'static str, bool)> {
    let [a, b, c, d] = ip.octets();
    let n = u32::from(ip);
    let mut out = vec![
        (ip.to_string(), "dotted", true),
        (n.to_string(), "decimal", true),
        (format!("0x{n:x}"), "hex", true),
        (format!("0x{a:x}.{b}.{c}.{d}"), "hex first octet", true),
        (format!("0{a:o}.{b}.{c}.{d}"), "octal first octet", true),
        (
            format!("{a}.{}", u32::from_be_bytes([0, b, c, d])),
            "a.bcd",
            true,
        ),
        (format!("[::ffff:{ip}]"), "IPv4-mapped", true),
        (format!("[::{ip}]"), "IPv4-compatible", false),
        (format!("[::ffff:0:{ip}]"), "IPv4-translated", false),
        (
            format!("[2002:{:02x}{:02x}:{:02x}{:02x}::1]", a, b, c, d),
            "6to4",
            false,
        ),
        (format!("[64:ff9b::{ip}]"), "NAT64 well-known", false),
    ];
    if a == 127 && b == 0 && c == 0 {
        out.push((format!("127.{d}"), "shorthand a.d", true));
    }
    out
}

#[test]
fn every_class_in_every_encoding_under_both_policies() {
    let deny = OutboundPolicy::deny_private();
    let allow = OutboundPolicy::allow_private();
    // (address, class, allowed when deny-private, allowed when allow-private)
    let v4: &[(&str, &str, bool, bool)] = &[
        ("8.8.8.8", "public", true, true),
        ("192.0.2.10", "documentation", true, true),
        ("127.0.0.1", "loopback", false, true),
        ("10.1.2.3", "private", false, true),
        ("172.16.5.4", "private", false, true),
        ("192.168.1.1", "private", false, true),
        ("100.64.1.1", "cgnat", false, true),
        ("169.254.10.20", "link-local", false, false),
        ("169.254.169.254", "cloud metadata", false, false),
        ("100.100.100.200", "cloud metadata", false, false),
        ("239.1.1.1", "multicast", false, false),
        ("224.0.0.5", "link-local", false, false),
        ("0.0.0.0", "unspecified", false, false),
        ("240.0.0.1", "reserved", false, false),
        ("198.18.0.1", "reserved", false, false),
    ];
    let mut rows = 0;
    for &(addr, class, deny_ok, allow_ok) in v4 {
        let ip: Ipv4Addr = addr.parse().unwrap();
        for (host, encoding, transparent) in v4_encodings(ip) {
            // A relay's embedding passes only a public address (a documentation range is not
            // routable, so carrying one is an anomaly); the transparent forms are the address.
            let (want_deny, want_allow) = if transparent {
                (deny_ok, allow_ok)
            } else {
                (class == "public", class == "public")
            };
            for (policy, want, name) in [(&deny, want_deny, "deny"), (&allow, want_allow, "allow")]
            {
                let got = verdict(&host, policy);
                assert_eq!(
                    got.is_ok(),
                    want,
                    "{class} {addr} as {encoding} ({host}) under {name}-private: {got:?}"
                );
                if let Err(why) = &got
                    && class == "cloud metadata"
                {
                    assert!(why.contains("metadata"), "{host}: {why}");
                }
                rows += 1;
            }
        }
    }
    let v6: &[(&str, &str, bool, bool)] = &[
        ("2606:4700::1111", "public", true, true),
        ("2001:db8::1", "documentation", true, true),
        ("::1", "loopback", false, true),
        ("fd12:3456::1", "private", false, true),
        ("fe80::1", "link-local", false, false),
        ("fd00:ec2::254", "cloud metadata", false, false),
        ("ff05::1", "multicast", false, false),
        ("ff02::1", "link-local", false, false),
        ("::", "unspecified", false, false),
        ("fec0::1", "site-local", false, false),
        (
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "translated",
            false,
            false,
        ), // Teredo
        ("64:ff9b:1::808:808", "translated", false, false), // NAT64 local use
        ("100::1", "reserved", false, false),
    ];
    for &(addr, class, deny_ok, allow_ok) in v6 {
        let host = format!("[{addr}]");
        for (policy, want, name) in [(&deny, deny_ok, "deny"), (&allow, allow_ok, "allow")] {
            let got = verdict(&host, policy);
            assert_eq!(
                got.is_ok(),
                want,
                "{class} {addr} under {name}-private: {got:?}"
            );
            if let Err(why) = &got {
                assert!(why.contains(class), "{addr}: {why} should name {class}");
            }
            rows += 1;
        }
    }
    assert!(rows > 300, "{rows} rows");
}

/// The literal forms of a table address: every IPv4 encoding URL hosts accept, or the IPv6
/// address compressed, fully expanded and in upper case.
fn metadata_literals(ip: IpAddr) -> Vec<(String, &'static str)> {
    match ip {
        IpAddr::V4(v4) => v4_encodings(v4)
            .into_iter()
            .map(|(host, encoding, _)| (host, encoding))
            .collect(),
        IpAddr::V6(v6) => {
            let expanded: Vec<String> = v6.segments().iter().map(|s| format!("{s:04x}")).collect();
            vec![
                (format!("[{v6}]"), "compressed"),
                (format!("[{}]", expanded.join(":")), "expanded"),
                (format!("[{v6}]").to_uppercase(), "upper case"),
            ]
        }
    }
}

/// Every address of the metadata table, in every literal form and (for IPv4) every embedding
/// the guard decodes, is refused as cloud metadata under both policies: at validation, and at
/// connect time before any socket.
#[test]
fn every_metadata_address_is_refused_in_every_encoding_under_both_policies() {
    let deny = OutboundPolicy::deny_private();
    let allow = OutboundPolicy::allow_private();
    let mut wrong = Vec::new();
    let mut rows = 0;
    for endpoint in METADATA_ENDPOINTS {
        let class = classify(endpoint.addr);
        if class != IpClass::Metadata {
            wrong.push(format!(
                "{} ({}) is {class:?}",
                endpoint.addr, endpoint.providers
            ));
        }
        for (host, encoding) in metadata_literals(endpoint.addr) {
            for (policy, name) in [(&deny, "deny"), (&allow, "allow")] {
                let got = verdict(&host, policy);
                if !got
                    .as_ref()
                    .is_err_and(|why| why.contains("cloud metadata"))
                {
                    wrong.push(format!(
                        "{} ({}) as {encoding} {host} under {name}-private: {got:?}",
                        endpoint.addr, endpoint.providers
                    ));
                }
                rows += 1;
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {rows} rows not refused as cloud metadata:\n{}",
        wrong.len(),
        wrong.join("\n")
    );

    let dialer = Arc::new(NoSockets::default());
    rt().block_on(async {
        for policy in [deny, allow] {
            let connector =
                GuardedConnector::with(policy, Scripted::answering(&[]), dialer.clone());
            for endpoint in METADATA_ENDPOINTS {
                let host = match endpoint.addr {
                    IpAddr::V4(v4) => v4.to_string(),
                    IpAddr::V6(v6) => format!("[{v6}]"),
                };
                let e = connector.connect(&host, 80).await.unwrap_err();
                assert!(e.to_string().contains("cloud metadata"), "{host}: {e}");
            }
        }
    });
    assert_eq!(
        dialer.dials.load(Ordering::SeqCst),
        0,
        "no socket was opened"
    );
}

/// The table names exact addresses: the neighbours of an entry keep the class of their range.
#[test]
fn a_metadata_address_neighbour_is_judged_by_its_range() {
    for endpoint in METADATA_ENDPOINTS {
        let neighbours: Vec<IpAddr> = match endpoint.addr {
            IpAddr::V4(v4) => [u32::from(v4) - 1, u32::from(v4) + 1]
                .map(|n| IpAddr::V4(Ipv4Addr::from(n)))
                .to_vec(),
            IpAddr::V6(v6) => [u128::from(v6) - 1, u128::from(v6) + 1]
                .map(|n| IpAddr::V6(Ipv6Addr::from(n)))
                .to_vec(),
        };
        for n in neighbours {
            if !sandbox_transport::metadata::is_metadata(n) {
                assert_ne!(
                    classify(n),
                    IpClass::Metadata,
                    "{n}, next to {}",
                    endpoint.addr
                );
            }
        }
    }
    // WireServer's neighbours are public; Alibaba's are CGNAT, open with private endpoints.
    assert!(verdict("168.63.129.17", &OutboundPolicy::deny_private()).is_ok());
    assert!(verdict("100.100.100.201", &OutboundPolicy::allow_private()).is_ok());
    assert!(verdict("[fd20:ce::253]", &OutboundPolicy::allow_private()).is_ok());
}

#[test]
fn urls_are_checked_for_scheme_host_and_special_names() {
    let deny = OutboundPolicy::deny_private();
    let allow = OutboundPolicy::allow_private();
    let none = Scripted::answering(&[]);
    let check = |url: &str, policy: &OutboundPolicy| {
        rt().block_on(validate_url(url, policy, &*none)).map(|_| ())
    };
    for bad in [
        "",
        "not a url",
        "ftp://example.com/",
        "file:///etc/passwd",
        "http://",
    ] {
        assert!(check(bad, &allow).is_err(), "{bad:?}");
    }
    assert!(
        check("http://printer.local/", &allow).is_err(),
        ".local always refused"
    );
    assert!(check("http://localhost:8080/", &deny).is_err());
    assert!(check("http://api.localhost/", &deny).is_err());
    assert!(
        check("http://localhost:8080/", &allow).is_ok(),
        "no DNS for localhost"
    );
    assert_eq!(none.calls(), 0);
    assert!(check("HTTPS://[::ffff:7f00:1]/", &allow).is_ok());
    assert!(check("https://[::ffff:7f00:1]/", &deny).is_err());
}

#[test]
fn every_address_of_a_name_must_pass_and_failures_fail_closed() {
    let policy = OutboundPolicy::deny_private();
    let resolver = Scripted::answering(&[&["93.184.216.34", "10.0.0.1"], &[], &["93.184.216.34"]]);
    let run = |url: &str| rt().block_on(validate_url(url, &policy, &*resolver));
    let e = run("https://mixed.example/").unwrap_err();
    assert!(e.to_string().contains("10.0.0.1"), "{e}");
    assert!(
        run("https://empty.example/").is_err(),
        "no address is a refusal"
    );
    assert!(run("https://ok.example/").is_ok());
    let e = rt()
        .block_on(validate_url("https://gone.example/", &policy, &Failing))
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl));
    assert!(e.to_string().contains("does not resolve"), "{e}");
}

/// A resolver whose every lookup fails (NXDOMAIN, a dead DNS server).
#[derive(Debug)]
struct Failing;

#[async_trait]
impl Resolve for Failing {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{host}: no such host"),
        ))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every address inside 169.254.0.0/16, in any encoding, is refused, even with private
    /// endpoints allowed.
    #[test]
    fn link_local_is_refused_in_every_encoding(c in any::<u8>(), d in any::<u8>()) {
        let ip = Ipv4Addr::new(169, 254, c, d);
        let allow = OutboundPolicy::allow_private();
        for (host, encoding, _) in v4_encodings(ip) {
            let got = verdict(&host, &allow);
            prop_assert!(got.is_err(), "{} as {} ({}) passed", ip, encoding, host);
        }
    }

    /// Classification never panics and a mapped address always judges like its IPv4 form.
    #[test]
    fn a_mapped_address_is_its_ipv4_address(raw in any::<u32>()) {
        let v4 = Ipv4Addr::from(raw);
        let mapped = IpAddr::V6(v4.to_ipv6_mapped());
        for policy in [OutboundPolicy::deny_private(), OutboundPolicy::allow_private()] {
            prop_assert_eq!(policy.judge_ip(IpAddr::V4(v4)).is_ok(), policy.judge_ip(mapped).is_ok());
        }
    }
}

#[test]
fn dns_rebinding_is_refused_at_connect_time_before_any_socket() {
    let policy = OutboundPolicy::deny_private();
    // Public at validation, the metadata address a moment later.
    let resolver = Scripted::answering(&[&["93.184.216.34"], &["169.254.169.254"]]);
    let dialer = Arc::new(NoSockets::default());
    let connector = GuardedConnector::with(policy.clone(), resolver.clone(), dialer.clone());
    rt().block_on(async {
        validate_url("https://rebind.example/", &policy, &*resolver)
            .await
            .expect("validation saw a public address");
        let e = connector.connect("rebind.example", 443).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl), "{e}");
        assert!(e.to_string().contains("metadata"), "{e}");
    });
    assert_eq!(resolver.calls(), 2);
    assert_eq!(
        dialer.dials.load(Ordering::SeqCst),
        0,
        "no socket was opened"
    );
}

#[test]
fn odd_literal_encodings_are_judged_at_connect_time_too() {
    let dialer = Arc::new(NoSockets::default());
    let connector = GuardedConnector::with(
        OutboundPolicy::allow_private(),
        Scripted::answering(&[]),
        dialer.clone(),
    );
    rt().block_on(async {
        for host in [
            "[::ffff:169.254.169.254]",
            "0xa9.254.169.254",
            "2852039166",
            "[::169.254.169.254]",
        ] {
            let e = connector.connect(host, 80).await.unwrap_err();
            assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl), "{host}: {e}");
        }
    });
    assert_eq!(dialer.dials.load(Ordering::SeqCst), 0);
}

#[test]
fn whitelist_only_mode_refuses_before_any_lookup() {
    let policy = OutboundPolicy {
        allow_private: true,
        whitelist: Some(Whitelist::new(["api.example.com", "192.0.2.0/24"]).unwrap()),
    };
    let resolver = Scripted::answering(&[&["93.184.216.34"], &["93.184.216.34"]]);
    let dialer = Arc::new(NoSockets::default());
    let connector = GuardedConnector::with(policy.clone(), resolver.clone(), dialer.clone());
    rt().block_on(async {
        for url in [
            "https://evil.example/",
            "http://10.0.0.1/",
            "http://8.8.8.8/",
            "http://localhost/",
        ] {
            let e = validate_url(url, &policy, &*resolver).await.unwrap_err();
            assert!(e.to_string().contains("whitelist"), "{url}: {e}");
        }
        let e = connector.connect("evil.example", 443).await.unwrap_err();
        assert!(e.to_string().contains("whitelist"), "{e}");
        assert_eq!(resolver.calls(), 0, "refused hosts cost no DNS lookup");
        assert!(
            validate_url("https://API.example.com/", &policy, &*resolver)
                .await
                .is_ok()
        );
        assert!(
            validate_url("http://192.0.2.9/", &policy, &*resolver)
                .await
                .is_ok()
        );
        // A whitelisted name still dials only addresses its class allows.
        let _ = connector.connect("api.example.com", 443).await;
    });
    assert_eq!(resolver.calls(), 2);
    assert_eq!(dialer.dials.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn real_loopback_connections_follow_the_policy() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    let deny = GuardedConnector::new(OutboundPolicy::deny_private());
    let e = deny.connect("127.0.0.1", port).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "nothing reached the listener"
    );

    let allow = GuardedConnector::with(
        OutboundPolicy::allow_private(),
        Arc::new(sandbox_transport::SystemResolver),
        Arc::new(TcpDialer::default()),
    );
    allow.connect("127.0.0.1", port).await.unwrap();

    // As hyper-util's connector.
    use http_body_util::{BodyExt, Empty};
    let client: hyper_util::client::legacy::Client<_, Empty<hyper::body::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(allow);
    let resp = client
        .get(format!("http://127.0.0.1:{port}/").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        &resp.into_body().collect().await.unwrap().to_bytes()[..],
        b"ok"
    );

    let denied: hyper_util::client::legacy::Client<_, Empty<hyper::body::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(deny);
    let e = denied
        .get(format!("http://127.0.0.1:{port}/").parse().unwrap())
        .await
        .unwrap_err();
    assert!(
        format!("{e:?}").contains("unsafe_outbound_url") || format!("{e:?}").contains("refused"),
        "{e:?}"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "the two allowed connections only"
    );
}
