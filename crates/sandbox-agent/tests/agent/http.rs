//! Routing, authentication and the Connect framing, seen from the wire.

use http_body_util::Full;
use hyper::{Request, StatusCode};
use sandbox_agent::server::UNAUTHORIZED_MESSAGE;
use sandbox_core::ErrorKind;
use sandbox_envd::{Code, ConnectError};
use sandbox_transport::envd::CallOptions;

use crate::{
    BOTH, TOKEN, TestAgent, body_bytes, client_with, envelope, raw_client, read_stream,
    rpc_request, start_request,
};

#[tokio::test]
async fn health_needs_no_token_and_everything_else_does() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let raw = raw_client(http);
        let health = crate::get(&raw, &agent.url(), "/health").await;
        assert_eq!(health.status(), StatusCode::NO_CONTENT);
        assert!(body_bytes(health).await.is_empty());

        // No token on an RPC: envd's middleware answer, word for word.
        let request = Request::post(format!("{}/process.Process/List", agent.url()))
            .header("content-type", "application/json")
            .body(Full::from("{}"))
            .unwrap();
        let response = raw.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let body: serde_json::Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"code": 401, "message": UNAUTHORIZED_MESSAGE})
        );
        // A wrong token, on an unknown path too.
        for path in ["/process.Process/List", "/nope", "/health"] {
            let request = Request::post(format!("{}{path}", agent.url()))
                .header("x-access-token", "wrong")
                .body(Full::default())
                .unwrap();
            let response = raw.request(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
        }
        // The envd client with the token gets through; without it, an authentication error.
        let client = agent.client(http);
        assert_eq!(client.list(CallOptions::new()).await.unwrap(), vec![]);
        let anonymous = client_with(
            sandbox_transport::envd::EnvdConfig::new(&agent.url())
                .unwrap()
                .with_http(http),
        );
        let e = anonymous.list(CallOptions::new()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
    }
}

#[tokio::test]
async fn unknown_paths_are_404_and_wrong_methods_405() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let raw = raw_client(http);
        let check = |method: &str, path: &str, status: StatusCode, allow: Option<&str>| {
            let request = Request::builder()
                .method(method)
                .uri(format!("{}{path}", agent.url()))
                .header("x-access-token", TOKEN)
                .header("content-type", "application/json")
                .body(Full::default())
                .unwrap();
            let raw = raw.clone();
            let allow = allow.map(str::to_owned);
            let path = path.to_owned();
            async move {
                let response = raw.request(request).await.unwrap();
                assert_eq!(response.status(), status, "{path}");
                assert_eq!(
                    response
                        .headers()
                        .get("allow")
                        .map(|v| v.to_str().unwrap().to_owned()),
                    allow,
                    "{path}"
                );
                let body = body_bytes(response).await;
                let error = ConnectError::from_json(&body).unwrap();
                assert_eq!(error.code, Code::Unimplemented, "{path}");
            }
        };
        check("POST", "/process.Process/Nope", StatusCode::NOT_FOUND, None).await;
        check("GET", "/nope", StatusCode::NOT_FOUND, None).await;
        check(
            "GET",
            "/process.Process/List",
            StatusCode::METHOD_NOT_ALLOWED,
            Some("POST"),
        )
        .await;
        check(
            "POST",
            "/health",
            StatusCode::METHOD_NOT_ALLOWED,
            Some("GET"),
        )
        .await;
        check(
            "PUT",
            "/files",
            StatusCode::METHOD_NOT_ALLOWED,
            Some("GET, POST"),
        )
        .await;
    }
}

#[tokio::test]
async fn users_come_from_basic_auth_and_unknown_ones_are_unauthenticated() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        // The default user ("user", the test's own account) runs the process.
        let client = agent.client(http);
        let mut stream = client
            .start(
                &start_request("/bin/sh", &["-c", "echo $USER $HOME"]),
                CallOptions::new(),
            )
            .await
            .unwrap();
        crate::pid_of(&mut stream).await;
        let out = crate::drain(&mut stream).await;
        let home = agent.accounts.home();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("user {}\n", home.display())
        );

        let ghost = client_with(agent.config(http).with_user("ghost").unwrap());
        let e = ghost.list(CallOptions::new()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
        assert!(e.message().contains("invalid username: 'ghost'"), "{e}");
        // On a stream the same error travels in the end-of-stream message.
        let e = crate::start_error(&ghost, &start_request("true", &[])).await;
        assert_eq!(e.kind(), ErrorKind::Authentication, "{e}");
    }
    // A default user that does not exist is refused as such.
    let agent = TestAgent::with(|c| c.default_user = "nobody-here".into()).await;
    let e = agent
        .client(BOTH[0])
        .list(CallOptions::new())
        .await
        .unwrap_err();
    assert!(
        e.message().contains("invalid default user: 'nobody-here'"),
        "{e}"
    );
}

#[tokio::test]
async fn services_not_built_yet_say_so() {
    let agent = TestAgent::start().await;
    let client = agent.client(BOTH[0]);
    let e = client.stat("/", CallOptions::new()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.message().contains("not built"), "{e}");
    let raw = raw_client(BOTH[0]);
    let response = crate::get(&raw, &agent.url(), "/files?path=/etc/hostname").await;
    assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
}

#[tokio::test]
async fn unary_and_stream_framing_errors_are_connect_errors() {
    let agent = TestAgent::with(|c| c.max_message_bytes = 1024).await;
    let url = agent.url();
    for http in BOTH {
        let raw = raw_client(http);
        // Unary: malformed JSON is invalid_argument with the code's status.
        let response = raw
            .request(rpc_request(
                &url,
                "/process.Process/List",
                "application/json",
                &[],
                "{",
            ))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let error = ConnectError::from_json(&body_bytes(response).await).unwrap();
        assert_eq!(error.code, Code::InvalidArgument);
        // An oversized unary body.
        let response = raw
            .request(rpc_request(
                &url,
                "/process.Process/List",
                "application/json",
                &[],
                vec![b' '; 4096],
            ))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        // The wrong codec.
        let response = raw
            .request(rpc_request(
                &url,
                "/process.Process/List",
                "application/proto",
                &[],
                "",
            ))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

        // Streams answer 200 and carry the error in the end-of-stream envelope.
        let stream = |body: Vec<u8>, headers: Vec<(&'static str, String)>| {
            rpc_request(
                &url,
                "/process.Process/Start",
                "application/connect+json",
                &headers,
                body,
            )
        };
        type Case = (Vec<u8>, Vec<(&'static str, String)>, Code);
        let cases: Vec<Case> = vec![
            (b"\x00\x00\x00".to_vec(), vec![], Code::InvalidArgument),
            (
                b"\x80\x00\x00\x00\x02{}".to_vec(),
                vec![],
                Code::InvalidArgument,
            ),
            (
                b"\x01\x00\x00\x00\x02{}".to_vec(),
                vec![],
                Code::InvalidArgument,
            ),
            (
                b"\x00\x00\x01\x00\x00".to_vec(),
                vec![],
                Code::ResourceExhausted,
            ),
            (Vec::new(), vec![], Code::InvalidArgument),
            (
                envelope(&start_request("true", &[])).to_vec(),
                vec![("connect-timeout-ms", "soon".to_owned())],
                Code::InvalidArgument,
            ),
            (
                envelope(&start_request("true", &[])).to_vec(),
                vec![("connect-content-encoding", "gzip".to_owned())],
                Code::Unimplemented,
            ),
            (
                envelope(&start_request("", &[])).to_vec(),
                vec![],
                Code::InvalidArgument,
            ),
        ];
        for (body, headers, code) in cases {
            let response = raw.request(stream(body.clone(), headers)).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{body:?}");
            assert_eq!(
                response.headers()["content-type"],
                "application/connect+json"
            );
            let (messages, end) = read_stream(response).await;
            assert!(messages.is_empty(), "{messages:?}");
            assert_eq!(end.error.map(|e| e.code), Some(code), "{body:?}");
        }

        // A good stream: start, data, end, then `{}`.
        let response = raw
            .request(stream(
                envelope(&start_request("/bin/echo", &["hi"])).to_vec(),
                vec![],
            ))
            .await
            .unwrap();
        let (messages, end) = read_stream(response).await;
        assert_eq!(end, sandbox_envd::EndStreamMessage::ok());
        assert!(messages[0]["event"]["start"]["pid"].as_u64().unwrap() > 0);
        assert_eq!(messages[1]["event"]["data"]["stdout"], "aGkK");
        assert_eq!(
            messages.last().unwrap()["event"]["end"],
            serde_json::json!({"exited": true, "status": "exit status 0"})
        );
        assert_eq!(messages.len(), 3, "{messages:?}");
    }
}

#[tokio::test]
async fn request_heads_are_bounded_by_the_flag() {
    let agent = TestAgent::with(|c| c.max_header_bytes = 16 * 1024).await;
    let raw = raw_client(BOTH[0]);
    let request = |size: usize| {
        Request::get(format!("{}/health", agent.url()))
            .header("x-padding", "p".repeat(size))
            .body(Full::default())
            .unwrap()
    };
    let small = raw.request(request(4 * 1024)).await.unwrap();
    assert_eq!(small.status(), StatusCode::NO_CONTENT);
    let large = raw.request(request(32 * 1024)).await.unwrap();
    assert_eq!(large.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
}

#[tokio::test]
async fn h2_streams_per_connection_are_bounded_by_the_flag() {
    let agent = TestAgent::with(|c| c.h2_max_streams = 1).await;
    // One HTTP/2 connection: while a Start stream is open, the next call waits for it.
    let client = agent.client(sandbox_transport::envd::HttpVersion::Http2);
    let mut stream = client
        .start(&crate::sh("sleep 1"), CallOptions::new())
        .await
        .unwrap();
    crate::pid_of(&mut stream).await;
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            let began = std::time::Instant::now();
            client.list(CallOptions::new()).await.unwrap();
            began.elapsed()
        })
    };
    crate::drain(&mut stream).await;
    let waited = waiting.await.unwrap();
    assert!(
        waited >= std::time::Duration::from_millis(700),
        "the second stream did not wait: {waited:?}"
    );
}
