//! The agent against clients on loopback: the workspace's own envd client (so client and
//! server are checked against each other) and raw HTTP for what a client library would not
//! send. In-process agents run with their reaper limited to their own children (the test
//! process has other children); the PID 1 duties are tested on the binary (`pid1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod detach;
mod gates;
mod http;
mod pid1;
mod process;
mod relay;
mod tunnel;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sandbox_agent::config::Config;
use sandbox_agent::pid1::Children;
use sandbox_agent::server::{Agent, Services};
use sandbox_agent::users::AccountFiles;
use sandbox_core::Secret;
use sandbox_envd::process as ps;
use sandbox_envd::process::process_event::Event;
use sandbox_envd::{DecoderConfig, Envelope, EnvelopeDecoder, StreamItem};
use sandbox_transport::envd::{EnvdClient, EnvdConfig, HttpVersion, ServerStream};
use sandbox_transport::{GuardedConnector, OutboundPolicy};

pub(crate) const BOTH: [HttpVersion; 2] = [HttpVersion::Http1, HttpVersion::Http2];
pub(crate) const TOKEN: &str = "agent-test-token";

/// A home directory and account files naming the test's own uid `user` (and `root`), so
/// processes run as the current user whether or not the tests run as root.
pub(crate) struct Accounts {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) files: AccountFiles,
}

impl Accounts {
    pub(crate) fn new() -> Accounts {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            format!(
                "user:x:{uid}:{gid}::{}:/bin/sh\nroot:x:0:0:root:/root:/bin/sh\n",
                home.display()
            ),
        )
        .unwrap();
        let group = dir.path().join("group");
        std::fs::write(&group, format!("user:x:{gid}:\n")).unwrap();
        Accounts {
            files: AccountFiles { passwd, group },
            dir,
        }
    }

    pub(crate) fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }
}

/// An agent served in-process on a loopback port.
pub(crate) struct TestAgent {
    pub(crate) addr: SocketAddr,
    pub(crate) agent: Arc<Agent>,
    pub(crate) accounts: Accounts,
    server: tokio::task::JoinHandle<()>,
    reaper: tokio::task::JoinHandle<()>,
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.server.abort();
        self.reaper.abort();
    }
}

impl TestAgent {
    pub(crate) async fn start() -> TestAgent {
        TestAgent::with(|_| {}).await
    }

    pub(crate) async fn with(configure: impl FnOnce(&mut Config)) -> TestAgent {
        TestAgent::launch(configure, false).await
    }

    /// An agent with everything the binary mounts (the filesystem service and `/files`).
    pub(crate) async fn with_builtin(configure: impl FnOnce(&mut Config)) -> TestAgent {
        TestAgent::launch(configure, true).await
    }

    async fn launch(configure: impl FnOnce(&mut Config), builtin: bool) -> TestAgent {
        // What the binary does at start (cargo hands its test processes a jobserver pipe).
        // Other test threads run, but they open descriptors close-on-exec, as Rust does.
        static MARKED: std::sync::Once = std::sync::Once::new();
        MARKED.call_once(|| sandbox_agent::sys::mark_inherited_close_on_exec().unwrap());
        let accounts = Accounts::new();
        let mut config = Config {
            default_user: "user".into(),
            access_token: Some(TOKEN.into()),
            accounts: accounts.files.clone(),
            reap_orphans: false,
            ..Config::default()
        };
        configure(&mut config);
        let children = Children::new(config.reap_orphans);
        let reaper = sandbox_agent::pid1::start_reaper(Arc::clone(&children)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let services = if builtin {
            sandbox_agent::mounted::builtin(&config)
        } else {
            Services::default()
        };
        let agent = Agent::new(config, services, children);
        let server = tokio::spawn(sandbox_agent::server::serve(Arc::clone(&agent), listener));
        TestAgent {
            addr,
            agent,
            accounts,
            server,
            reaper,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn config(&self, http: HttpVersion) -> EnvdConfig {
        EnvdConfig::new(&self.url())
            .unwrap()
            .with_http(http)
            .with_access_token(Secret::new(TOKEN))
            .with_keepalive(Duration::from_secs(1), Duration::from_secs(5))
    }

    pub(crate) fn client(&self, http: HttpVersion) -> EnvdClient<GuardedConnector> {
        client_with(self.config(http))
    }
}

pub(crate) fn client_with(config: EnvdConfig) -> EnvdClient<GuardedConnector> {
    // Loopback is private: the agent is reached only because the policy allows it.
    EnvdClient::new(
        GuardedConnector::new(OutboundPolicy::allow_private()),
        config,
    )
    .unwrap()
}

/// A plain HTTP client for requests the envd client would never send.
pub(crate) fn raw_client(http: HttpVersion) -> Client<GuardedConnector, Full<Bytes>> {
    let mut builder = Client::builder(TokioExecutor::new());
    if http == HttpVersion::Http2 {
        builder.http2_only(true);
    }
    builder.build(GuardedConnector::new(OutboundPolicy::allow_private()))
}

pub(crate) async fn body_bytes(response: Response<Incoming>) -> Bytes {
    response.into_body().collect().await.unwrap().to_bytes()
}

/// A Connect request on `path`, with `content_type` and extra headers.
pub(crate) fn rpc_request(
    url: &str,
    path: &str,
    content_type: &str,
    headers: &[(&str, String)],
    body: impl Into<Bytes>,
) -> Request<Full<Bytes>> {
    let mut builder = Request::post(format!("{url}{path}"))
        .header("content-type", content_type)
        .header("x-access-token", TOKEN);
    for (k, v) in headers {
        builder = builder.header(*k, v);
    }
    builder.body(Full::new(body.into())).unwrap()
}

pub(crate) fn envelope<T: serde::Serialize>(message: &T) -> Bytes {
    Envelope::from_message(message).unwrap().to_bytes().unwrap()
}

/// Reads a whole enveloped answer: the messages' JSON and the end-of-stream message.
pub(crate) async fn read_stream(
    response: Response<Incoming>,
) -> (Vec<serde_json::Value>, sandbox_envd::EndStreamMessage) {
    let body = body_bytes(response).await;
    let mut decoder = EnvelopeDecoder::new(DecoderConfig::response());
    decoder.push(&body);
    let mut messages = Vec::new();
    while let Some(envelope) = decoder.decode().unwrap() {
        match envelope.parse::<serde_json::Value>().unwrap() {
            StreamItem::Message(m) => messages.push(m),
            StreamItem::End(end) => {
                decoder.finish().unwrap();
                return (messages, end);
            }
        }
    }
    panic!("the stream ended without its end-of-stream envelope: {messages:?}");
}

pub(crate) fn start_request(cmd: &str, args: &[&str]) -> ps::StartRequest {
    ps::StartRequest {
        process: Some(ps::ProcessConfig {
            cmd: cmd.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn sh(script: &str) -> ps::StartRequest {
    start_request("/bin/sh", &["-c", script])
}

/// The event of the next message, failing the test on an error or the end.
pub(crate) async fn next_event<T>(stream: &mut ServerStream<T>) -> Event
where
    T: serde::de::DeserializeOwned + Send + 'static + HasEvent,
{
    let message = stream.message().await.unwrap().expect("a message");
    message.event().expect("an event")
}

/// `StartResponse` and `ConnectResponse` alike.
pub(crate) trait HasEvent {
    fn event(self) -> Option<Event>;
}

impl HasEvent for ps::StartResponse {
    fn event(self) -> Option<Event> {
        self.event.and_then(|e| e.event)
    }
}

impl HasEvent for ps::ConnectResponse {
    fn event(self) -> Option<Event> {
        self.event.and_then(|e| e.event)
    }
}

/// What a stream carried up to its `end`.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) pty: Vec<u8>,
    pub(crate) keepalives: usize,
    pub(crate) end: Option<ps::process_event::EndEvent>,
}

/// Reads events up to and including `end`, then checks the stream ends.
pub(crate) async fn drain<T>(stream: &mut ServerStream<T>) -> Collected
where
    T: serde::de::DeserializeOwned + Send + 'static + HasEvent,
{
    use ps::process_event::data_event::Output;
    let mut c = Collected::default();
    loop {
        match next_event(stream).await {
            Event::End(end) => {
                assert!(stream.message().await.unwrap().is_none(), "end of stream");
                c.end = Some(end);
                return c;
            }
            Event::Keepalive(_) => c.keepalives += 1,
            Event::Data(d) => match d.output.unwrap() {
                Output::Stdout(b) => c.stdout.extend(b),
                Output::Stderr(b) => c.stderr.extend(b),
                Output::Pty(b) => c.pty.extend(b),
            },
            Event::Start(s) => panic!("a second start: {s:?}"),
        }
    }
}

pub(crate) async fn pid_of<T>(stream: &mut ServerStream<T>) -> u32
where
    T: serde::de::DeserializeOwned + Send + 'static + HasEvent,
{
    match next_event(stream).await {
        Event::Start(s) => s.pid,
        other => panic!("expected start, got {other:?}"),
    }
}

/// Polls `check` every 20 ms until it holds, failing after `limit`.
pub(crate) async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The error a Start refused with (a stream's error travels in its end-of-stream message).
pub(crate) async fn start_error(
    client: &EnvdClient<GuardedConnector>,
    request: &ps::StartRequest,
) -> sandbox_core::Error {
    match client
        .start(request, sandbox_transport::envd::CallOptions::new())
        .await
    {
        Ok(mut s) => s.message().await.unwrap_err(),
        Err(e) => e,
    }
}

/// SIGKILLs the process group of `pid`.
pub(crate) async fn kill(client: &EnvdClient<GuardedConnector>, pid: u32) {
    client
        .send_signal(
            ps::ProcessSelector::pid(pid),
            ps::Signal::Sigkill,
            sandbox_transport::envd::CallOptions::new(),
        )
        .await
        .unwrap();
}

/// A plain `GET` of `path`.
pub(crate) async fn get(
    raw: &Client<GuardedConnector, Full<Bytes>>,
    url: &str,
    path: &str,
) -> Response<Incoming> {
    raw.request(
        Request::get(format!("{url}{path}"))
            .body(Full::default())
            .unwrap(),
    )
    .await
    .unwrap()
}
