//! Gateway routing: the split between control and data plane (an API host shaped like a data
//! host stays on the control plane; look-alike domains, missing digits, explicit ports,
//! over-long labels), dialing the gateway whatever the authority, the plain-HTTP gateway's
//! scheme rewrite, token injection that never overwrites, and the caller's request untouched.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use hyper::Request;
use sandbox_core::Secret;
use sandbox_transport::gateway::{
    Gateway, GatewayTarget, InboundTokens, Plane, TRAFFIC_TOKEN_HEADER, data_label,
};

fn gateway(target: Option<&str>) -> Gateway {
    let tokens = InboundTokens::default();
    tokens.put("SBX123", &Secret::new("tok-123"));
    Gateway::new(
        Some("49983-api.cube.app"),
        target.map(|t| GatewayTarget::parse(t).unwrap()),
        tokens,
    )
}

fn request(uri: &str) -> Request<String> {
    Request::builder().uri(uri).body("body".to_owned()).unwrap()
}

#[test]
fn the_split_rule() {
    let g = gateway(Some("https://gw.cube.internal:8443"));
    let data = |port, id: &str| Plane::Data {
        port,
        sandbox_id: id.to_owned(),
    };
    let rows: &[(&str, Plane)] = &[
        ("49983-sbx123.cube.app", data(49983, "sbx123")),
        ("8080-abc-def.cube.app", data(8080, "abc-def")),
        ("49983-SBX123.Cube.App.", data(49983, "sbx123")),
        // The API host is control plane even though it is shaped like a data host.
        ("49983-api.cube.app", Plane::Control),
        ("49983-API.cube.app.", Plane::Control),
        // Look-alike domains are still data plane -- and so dialled at *our* gateway, never at
        // the domain they name.
        ("49983-sbx123.evilcube.app", data(49983, "sbx123")),
        ("api.evilcube.app", Plane::Control),
        ("evilcube.app", Plane::Control),
        // Missing digits, no id, not a port.
        ("-sbx123.cube.app", Plane::Control),
        ("abc-sbx123.cube.app", Plane::Control),
        ("49983-.cube.app", Plane::Control),
        ("99999-sbx.cube.app", Plane::Control),
        ("0-sbx.cube.app", Plane::Control),
        ("49983sbx.cube.app", Plane::Control),
        ("api.cube.app", Plane::Control),
    ];
    for (host, want) in rows {
        assert_eq!(&g.plane(host).unwrap(), want, "{host}");
    }
    // Without a gateway everything is control plane.
    assert_eq!(
        gateway(None).plane("49983-sbx123.cube.app").unwrap(),
        Plane::Control
    );
}

#[test]
fn over_long_labels_are_refused() {
    let id = "a".repeat(58);
    let host = format!("49983-{id}.cube.app"); // 64-character first label
    let e = data_label(&host).unwrap_err();
    assert!(e.to_string().contains("at most 63"), "{e}");
    let ok = format!("49983-{}.cube.app", "a".repeat(57)); // exactly 63
    assert!(data_label(&ok).unwrap().is_some());
    assert!(
        gateway(Some("https://gw:443"))
            .route(&request(&format!("https://{host}/")))
            .is_err()
    );
}

#[test]
fn data_plane_requests_dial_the_gateway_and_keep_their_host() {
    let g = gateway(Some("https://gw.cube.internal:8443"));
    let original = request("https://49983-sbx123.evilcube.app:9999/process.Process/Start?x=1");
    let routed = g.route(&original).unwrap();
    assert_eq!(
        (routed.dial_host.as_str(), routed.dial_port),
        ("gw.cube.internal", 8443)
    );
    assert_eq!(routed.request.uri().scheme_str(), Some("https"));
    assert_eq!(
        routed.request.uri().path_and_query().unwrap().as_str(),
        "/process.Process/Start?x=1"
    );
    assert_eq!(
        routed.request.headers()["host"],
        "49983-sbx123.evilcube.app:9999"
    );
    assert_eq!(routed.request.headers()[TRAFFIC_TOKEN_HEADER], "tok-123");
    assert_eq!(routed.request.body(), "body");
    // The caller's request is untouched.
    assert!(original.headers().is_empty());
    assert_eq!(original.uri().scheme_str(), Some("https"));
}

#[test]
fn a_plain_http_gateway_rewrites_the_scheme() {
    let g = gateway(Some("http://10.0.0.5:8080"));
    let routed = g
        .route(&request("https://49983-sbx123.cube.app/files"))
        .unwrap();
    assert_eq!(
        (routed.dial_host.as_str(), routed.dial_port),
        ("10.0.0.5", 8080)
    );
    assert_eq!(routed.request.uri().scheme_str(), Some("http"));
    assert_eq!(routed.request.headers()["host"], "49983-sbx123.cube.app");
}

#[test]
fn control_plane_requests_go_where_they_say() {
    let g = gateway(Some("https://gw.cube.internal"));
    let routed = g
        .route(&request("https://49983-api.cube.app:7443/sandboxes"))
        .unwrap();
    assert_eq!(routed.plane, Plane::Control);
    assert_eq!(
        (routed.dial_host.as_str(), routed.dial_port),
        ("49983-api.cube.app", 7443)
    );
    let routed = g.route(&request("http://api.cube.app/health")).unwrap();
    assert_eq!(
        (routed.dial_host.as_str(), routed.dial_port),
        ("api.cube.app", 80)
    );
    assert!(!routed.request.headers().contains_key(TRAFFIC_TOKEN_HEADER));
}

#[test]
fn token_injection_never_overwrites() {
    let g = gateway(Some("https://gw.cube.internal"));
    let mut mine = request("https://49983-sbx123.cube.app/");
    mine.headers_mut()
        .insert(TRAFFIC_TOKEN_HEADER, "callers-own".parse().unwrap());
    let routed = g.route(&mine).unwrap();
    let values: Vec<_> = routed
        .request
        .headers()
        .get_all(TRAFFIC_TOKEN_HEADER)
        .iter()
        .collect();
    assert_eq!(values, ["callers-own"]);
    assert_eq!(mine.headers()[TRAFFIC_TOKEN_HEADER], "callers-own");
    // Unknown sandbox: no header invented.
    let routed = g.route(&request("https://49983-other.cube.app/")).unwrap();
    assert!(!routed.request.headers().contains_key(TRAFFIC_TOKEN_HEADER));
    // Empty tokens and IDs are ignored; lookups are case-insensitive; remove forgets.
    let t = g.tokens();
    t.put("", &Secret::new("x"));
    t.put("sbx9", &Secret::new(""));
    assert!(t.get("sbx9").is_none());
    assert_eq!(t.get("sbx123").unwrap().expose(), "tok-123");
    t.remove("SbX123");
    assert!(t.get("sbx123").is_none());
}

#[test]
fn gateway_urls_are_parsed_strictly() {
    assert_eq!(
        GatewayTarget::parse("https://gw.example").unwrap(),
        GatewayTarget {
            scheme: "https".into(),
            host: "gw.example".into(),
            port: 443
        }
    );
    assert_eq!(GatewayTarget::parse("http://gw:81").unwrap().port, 81);
    for bad in ["", "gw.example", "ftp://gw", "http://"] {
        assert!(GatewayTarget::parse(bad).is_err(), "{bad:?}");
    }
}
