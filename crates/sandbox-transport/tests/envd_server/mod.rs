//! A Connect server speaking envd's protocol on loopback, HTTP/1.1 and h2c on one listener, for
//! the envd client's tests. It is written from `docs/envd.md`, independently of the client:
//! framing with hand-built prefixes, errors as envd sends them, a real temporary directory for
//! the filesystem service and multer (axum's multipart parser) for uploads. Scripted commands
//! misbehave on purpose (cut streams, malformed envelopes, silence without keepalives).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::channel::{Channel, Sender};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sandbox_envd::files::WriteInfo;
use sandbox_envd::filesystem as fs;
use sandbox_envd::process as ps;
use sandbox_envd::{
    Code, ConnectError, DecoderConfig, EndStreamMessage, Envelope, EnvelopeDecoder, MethodKind,
    method_by_path,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};

pub(crate) const TOKEN: &str = "envd-test-token";
pub(crate) const USERS: [&str; 2] = ["user", "root"];

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What the server saw of one request.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) version: Version,
    /// The `Host` header (HTTP/1.1) or `:authority` (HTTP/2).
    pub(crate) authority: String,
    pub(crate) headers: HeaderMap,
}

enum Input {
    Stdin(Vec<u8>),
    Pty(Vec<u8>),
    Close,
    Signal(ps::Signal),
    Resize(u32, u32),
}

struct Proc {
    config: ps::ProcessConfig,
    tag: Option<String>,
    events: broadcast::Sender<ps::ProcessEvent>,
    input: mpsc::UnboundedSender<Input>,
    ended: Option<ps::process_event::EndEvent>,
}

pub(crate) struct State {
    pub(crate) root: tempfile::TempDir,
    seen: Mutex<Vec<Seen>>,
    pub(crate) connections: AtomicUsize,
    /// Streams whose client went away before the stream's end (a send failed).
    pub(crate) cancelled: AtomicUsize,
    pub(crate) cancelled_signal: tokio::sync::Notify,
    processes: Mutex<HashMap<u32, Proc>>,
    /// Polled watchers: directory, recursive, and the events seen since the last poll.
    watchers: Mutex<HashMap<String, Arc<Mutex<Vec<fs::FilesystemEvent>>>>>,
    next_pid: AtomicU32,
    watch: broadcast::Sender<(PathBuf, fs::FilesystemEvent)>,
    /// Bytes of octet-stream uploads written to disk so far, counted as each frame lands.
    pub(crate) octet_received: AtomicU64,
}

impl State {
    /// Requests seen on `path`.
    pub(crate) fn seen(&self, path: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|s| s.path == path).cloned().collect()
    }

    fn resolve(&self, path: &str) -> Result<PathBuf, ConnectError> {
        let relative = Path::new(path);
        if relative
            .components()
            .any(|c| matches!(c, Component::ParentDir))
        {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "'..' is not allowed",
            ));
        }
        let base = if relative.is_absolute() {
            self.root.path().to_path_buf()
        } else {
            self.root.path().join("home/user")
        };
        Ok(relative
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .fold(base, |p, c| p.join(c)))
    }

    fn notify(&self, host_path: &Path, kind: fs::EventType) {
        let event = fs::FilesystemEvent {
            name: String::new(),
            r#type: kind,
            entry: None,
        };
        let _ = self.watch.send((host_path.to_path_buf(), event));
    }
}

pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    pub(crate) state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub(crate) async fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("home/user")).unwrap();
        let state = Arc::new(State {
            root,
            seen: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
            cancelled_signal: tokio::sync::Notify::new(),
            processes: Mutex::new(HashMap::new()),
            watchers: Mutex::new(HashMap::new()),
            next_pid: AtomicU32::new(100),
            watch: broadcast::channel(1024).0,
            octet_received: AtomicU64::new(0),
        });
        let accept_state = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(Arc::clone(&accept_state), stream));
            }
        });
        Server { addr, state, task }
    }

    /// Serves one connection over any byte stream (as a relay into a sandbox would carry).
    pub(crate) fn serve_stream<S>(&self, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        tokio::spawn(serve(Arc::clone(&self.state), stream));
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn serve<S>(state: Arc<State>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    state.connections.fetch_add(1, Ordering::SeqCst);
    let service = hyper::service::service_fn(move |req| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(handle(state, req).await) }
    });
    // Both HTTP/1.1 and h2c (prior knowledge) on the same listener.
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()).boxed_unsync())
        .unwrap()
}

/// envd's HTTP error (`{"code": <status>, "message": ...}`).
fn http_error(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::json!({"code": status.as_u16(), "message": message}).to_string();
    full(status, "application/json; charset=utf-8", body)
}

fn unary_error(e: &ConnectError) -> Response<Body> {
    let status = StatusCode::from_u16(e.http_status()).unwrap();
    full(status, "application/json", e.to_json().unwrap())
}

fn envelope<T: Serialize>(message: &T) -> Bytes {
    Envelope::from_message(message).unwrap().to_bytes().unwrap()
}

fn end_stream(result: Result<(), ConnectError>) -> Bytes {
    let end = match result {
        Ok(()) => EndStreamMessage::ok(),
        Err(e) => EndStreamMessage::failed(e),
    };
    Envelope::from_end_stream(&end).unwrap().to_bytes().unwrap()
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    state.seen.lock().unwrap().push(Seen {
        path: path.clone(),
        query: req.uri().query().unwrap_or("").to_owned(),
        version: req.version(),
        authority: req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .or_else(|| {
                let host = req.headers().get("host")?;
                host.to_str().ok().map(str::to_owned)
            })
            .unwrap_or_default(),
        headers: req.headers().clone(),
    });
    if path == "/health" {
        // Answered without a token, as envd does.
        return full(StatusCode::NO_CONTENT, "text/plain", Bytes::new());
    }
    if req.headers().get("x-access-token").map(|v| v.as_bytes()) != Some(TOKEN.as_bytes()) {
        return http_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized access, please provide a valid access token or method signing if supported",
        );
    }
    // Plain JSON beside the protocol (what `EnvdClient::get_json` reads): a small answer, one
    // past any small limit, and one that is not JSON.
    match path.as_str() {
        "/extension/version" => {
            return full(
                StatusCode::OK,
                "application/json",
                Bytes::from_static(br#"{"agent":"1.2.3","envd":"0.5.7"}"#),
            );
        }
        "/extension/big" => {
            let body = format!("{{\"agent\":\"{}\"}}", "9".repeat(64 * 1024));
            return full(StatusCode::OK, "application/json", Bytes::from(body));
        }
        "/extension/html" => {
            return full(StatusCode::OK, "text/html", Bytes::from_static(b"<html>"));
        }
        _ => {}
    }
    if path == "/files" {
        return files(state, req).await;
    }
    let Some(method) = method_by_path(&path) else {
        return full(StatusCode::NOT_FOUND, "text/plain", "404 page not found");
    };
    let user_error = check_user(req.headers()).err();
    let keepalive = req
        .headers()
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(Duration::from_secs(90), Duration::from_secs);
    match method.kind {
        MethodKind::Unary => {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            if let Some(e) = user_error {
                return unary_error(&e);
            }
            unary(&state, method.path, &body).await
        }
        MethodKind::ServerStreaming => {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let mut decoder = EnvelopeDecoder::new(DecoderConfig::request());
            decoder.push(&body);
            let request = decoder.decode().unwrap().unwrap();
            let (tx, body) = Channel::<Bytes, Infallible>::new(16);
            let response = Response::builder()
                .header("content-type", "application/connect+json")
                .body(body.boxed_unsync())
                .unwrap();
            let mut out = Out {
                tx,
                state: Arc::clone(&state),
            };
            if let Some(e) = user_error {
                tokio::spawn(async move { out.send(end_stream(Err(e))).await });
                return response;
            }
            let path = method.path;
            tokio::spawn(async move {
                match path {
                    "/process.Process/Start" => {
                        start(&state, request.parse_message().unwrap(), keepalive, out).await
                    }
                    "/process.Process/Connect" => {
                        let r: ps::ConnectRequest = request.parse_message().unwrap();
                        attach(&state, r.process.unwrap(), keepalive, out).await
                    }
                    "/filesystem.Filesystem/WatchDir" => {
                        watch(&state, request.parse_message().unwrap(), keepalive, out).await
                    }
                    other => panic!("no streaming handler for {other}"),
                }
            });
            response
        }
        MethodKind::ClientStreaming => {
            if let Some(e) = user_error {
                let _ = req.into_body().collect().await;
                return stream_answer(Err(e));
            }
            stream_input(&state, req.into_body()).await
        }
    }
}

fn check_user(headers: &HeaderMap) -> Result<(), ConnectError> {
    let Some(auth) = headers.get("authorization") else {
        return Ok(());
    };
    let auth = auth.to_str().unwrap_or("");
    let encoded = auth.strip_prefix("Basic ").unwrap_or("");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap_or_default();
    let decoded = String::from_utf8(decoded).unwrap_or_default();
    let user = decoded.strip_suffix(':').unwrap_or(&decoded);
    if USERS.contains(&user) {
        Ok(())
    } else {
        Err(ConnectError::new(
            Code::Unauthenticated,
            format!("invalid username: '{user}'"),
        ))
    }
}

/// A streaming answer's body: sending fails once the client has gone.
struct Out {
    tx: Sender<Bytes, Infallible>,
    state: Arc<State>,
}

impl Out {
    /// Sends raw bytes; false (and the cancellation counted) if the client has gone.
    async fn send(&mut self, bytes: Bytes) -> bool {
        if self.tx.send_data(bytes).await.is_ok() {
            return true;
        }
        self.state.cancelled.fetch_add(1, Ordering::SeqCst);
        self.state.cancelled_signal.notify_waiters();
        false
    }

    async fn message<T: Serialize>(&mut self, message: &T) -> bool {
        self.send(envelope(message)).await
    }
}

fn event(e: ps::process_event::Event) -> ps::StartResponse {
    ps::StartResponse {
        event: Some(ps::ProcessEvent::new(e)),
    }
}

fn stdout(text: &str) -> ps::process_event::Event {
    use ps::process_event::{DataEvent, Event, data_event::Output};
    Event::Data(DataEvent {
        output: Some(Output::Stdout(text.as_bytes().to_vec())),
    })
}

fn end_event(code: i32, killed: bool) -> ps::process_event::EndEvent {
    let status = if killed {
        "signal: killed".to_owned()
    } else {
        format!("exit status {code}")
    };
    ps::process_event::EndEvent {
        exit_code: if killed { -1 } else { code },
        exited: !killed,
        error: (killed || code != 0).then(|| status.clone()),
        status,
    }
}

async fn start(state: &Arc<State>, request: ps::StartRequest, keepalive: Duration, mut out: Out) {
    use ps::process_event::{Event, KeepAlive, StartEvent};
    let config = request.process.unwrap_or_default();
    let pid = state.next_pid.fetch_add(1, Ordering::SeqCst);
    let start = event(Event::Start(StartEvent { pid }));
    // Commands that misbehave on the wire, each after a proper start event.
    match config.cmd.as_str() {
        "truncate" => {
            out.message(&start).await;
            let mut bytes = BytesMut::new();
            bytes.put_u8(0);
            bytes.put_u32(100);
            bytes.put_slice(b"{\"event\":");
            out.send(bytes.freeze()).await;
            return; // the body ends inside the envelope
        }
        "garbage" => {
            out.message(&start).await;
            let mut bytes = BytesMut::new();
            bytes.put_u8(0);
            bytes.put_u32(12);
            bytes.put_slice(b"{\"event\": 1");
            bytes.put_u8(b'2');
            out.send(bytes.freeze()).await;
            out.send(end_stream(Ok(()))).await;
            return;
        }
        "badflags" => {
            out.message(&start).await;
            out.send(Bytes::from_static(&[0x80, 0, 0, 0, 2, b'{', b'}']))
                .await;
            return;
        }
        "oversize" => {
            out.message(&start).await;
            out.send(Bytes::from_static(&[0, 0x04, 0, 0, 0])).await; // 64 MiB declared
            return;
        }
        "noeos" => {
            out.message(&start).await;
            out.message(&event(Event::End(end_event(0, false)))).await;
            return;
        }
        "linger" | "trailing" => {
            // A complete answer, then the body stays open (or carries bytes after the end).
            out.message(&start).await;
            out.message(&event(Event::End(end_event(0, false)))).await;
            out.send(end_stream(Ok(()))).await;
            if config.cmd == "trailing" {
                out.send(envelope(&start)).await;
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
            return;
        }
        "fail" => {
            out.message(&start).await;
            let e = ConnectError::new(Code::ResourceExhausted, "too many processes");
            out.send(end_stream(Err(e))).await;
            return;
        }
        "mute" => {
            // Silent, and deaf to the keepalive interval.
            out.message(&start).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
            out.message(&event(Event::End(end_event(0, false)))).await;
            out.send(end_stream(Ok(()))).await;
            return;
        }
        "forever" => {
            // Keepalives until the client goes away.
            out.message(&start).await;
            while out.message(&event(Event::Keepalive(KeepAlive {}))).await {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            return;
        }
        _ => {}
    }
    let (events, mut rx) = broadcast::channel(1024);
    let (input_tx, input_rx) = mpsc::unbounded_channel();
    state.processes.lock().unwrap().insert(
        pid,
        Proc {
            config: config.clone(),
            tag: request.tag.clone(),
            events: events.clone(),
            input: input_tx,
            ended: None,
        },
    );
    let state2 = Arc::clone(state);
    let pty = request.pty.is_some();
    let cmd = config.cmd.clone();
    let args: Vec<String> = config.args.clone();
    tokio::spawn(async move {
        run(&state2, pid, &cmd, &args, pty, input_rx, events).await;
    });
    if !out.message(&start).await {
        return;
    }
    forward(&mut out, &mut rx, keepalive).await;
}

/// Forwards a process's events to a stream, with keepalives while idle, until its end.
async fn forward(
    out: &mut Out,
    rx: &mut broadcast::Receiver<ps::ProcessEvent>,
    keepalive: Duration,
) {
    use ps::process_event::{Event, KeepAlive};
    loop {
        let next = tokio::time::timeout(keepalive, rx.recv()).await;
        let ev = match next {
            Err(_) => ps::ProcessEvent::new(Event::Keepalive(KeepAlive {})),
            Ok(Ok(ev)) => ev,
            Ok(Err(_)) => return,
        };
        let end = matches!(ev.event, Some(Event::End(_)));
        if !out.message(&ps::StartResponse { event: Some(ev) }).await {
            return;
        }
        if end {
            out.send(end_stream(Ok(()))).await;
            return;
        }
    }
}

/// The process itself: `echo`, `sleep <ms>` (then "done"), `exit <code>`, and `cat` (echoes
/// its input until stdin closes or a signal).
async fn run(
    state: &Arc<State>,
    pid: u32,
    cmd: &str,
    args: &[String],
    pty: bool,
    mut input: mpsc::UnboundedReceiver<Input>,
    events: broadcast::Sender<ps::ProcessEvent>,
) {
    use ps::process_event::{DataEvent, Event, data_event::Output};
    let emit = |e: Event| {
        let _ = events.send(ps::ProcessEvent::new(e));
    };
    // Let the Start handler subscribe and send `start` before anything happens.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let end = match cmd {
        "echo" => {
            emit(stdout(&format!("{}\n", args.join(" "))));
            end_event(0, false)
        }
        "sleep" => {
            let ms = args.first().and_then(|a| a.parse().ok()).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            emit(stdout("done\n"));
            end_event(0, false)
        }
        "exit" => end_event(
            args.first().and_then(|a| a.parse().ok()).unwrap_or(1),
            false,
        ),
        "cat" => loop {
            match input.recv().await {
                Some(Input::Stdin(b)) if !pty => emit(Event::Data(DataEvent {
                    output: Some(Output::Stdout(b)),
                })),
                Some(Input::Pty(b)) if pty => emit(Event::Data(DataEvent {
                    output: Some(Output::Pty(b)),
                })),
                Some(Input::Stdin(_) | Input::Pty(_)) => emit(stdout("wrong input kind\n")),
                Some(Input::Resize(c, r)) => emit(Event::Data(DataEvent {
                    output: Some(Output::Pty(format!("resized {c}x{r}").into_bytes())),
                })),
                Some(Input::Signal(s)) => {
                    break end_event(0, s == ps::Signal::Sigkill || s == ps::Signal::Sigterm);
                }
                Some(Input::Close) | None => break end_event(0, false),
            }
        },
        other => {
            emit(stdout(&format!("unknown command {other}\n")));
            end_event(127, false)
        }
    };
    if let Some(p) = state.processes.lock().unwrap().get_mut(&pid) {
        p.ended = Some(end.clone());
    }
    emit(Event::End(end));
}

async fn attach(
    state: &Arc<State>,
    selector: ps::ProcessSelector,
    keepalive: Duration,
    mut out: Out,
) {
    use ps::process_event::{Event, StartEvent};
    let found = {
        let procs = state.processes.lock().unwrap();
        find(&procs, &selector).map(|(pid, p)| (pid, p.events.subscribe(), p.ended.clone()))
    };
    let Ok((pid, mut rx, ended)) = found else {
        let e = found.err().unwrap();
        out.send(end_stream(Err(e))).await;
        return;
    };
    if !out.message(&event(Event::Start(StartEvent { pid }))).await {
        return;
    }
    if let Some(end) = ended {
        out.message(&event(Event::End(end))).await;
        out.send(end_stream(Ok(()))).await;
        return;
    }
    forward(&mut out, &mut rx, keepalive).await;
}

fn find<'a>(
    procs: &'a HashMap<u32, Proc>,
    selector: &ps::ProcessSelector,
) -> Result<(u32, &'a Proc), ConnectError> {
    use ps::process_selector::Selector;
    let found = match &selector.selector {
        Some(Selector::Pid(pid)) => procs.get(pid).map(|p| (*pid, p)),
        Some(Selector::Tag(tag)) => procs
            .iter()
            .find(|(_, p)| p.tag.as_deref() == Some(tag))
            .map(|(pid, p)| (*pid, p)),
        None => None,
    };
    found.ok_or_else(|| {
        ConnectError::new(
            Code::NotFound,
            format!("process with {selector:?} not found"),
        )
    })
}

fn deliver(
    state: &State,
    selector: Option<ps::ProcessSelector>,
    input: Input,
) -> Result<(), ConnectError> {
    let procs = state.processes.lock().unwrap();
    let (_, p) = find(&procs, &selector.unwrap_or_default())?;
    let _ = p.input.send(input);
    Ok(())
}

fn to_input(input: Option<ps::ProcessInput>) -> Input {
    match input.and_then(|i| i.input) {
        Some(ps::process_input::Input::Stdin(b)) => Input::Stdin(b),
        Some(ps::process_input::Input::Pty(b)) => Input::Pty(b),
        None => Input::Stdin(Vec::new()),
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(body)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("bad request: {e}")))
}

fn json<T: Serialize>(message: &T) -> Response<Body> {
    full(
        StatusCode::OK,
        "application/json",
        serde_json::to_vec(message).unwrap(),
    )
}

async fn unary(state: &Arc<State>, path: &str, body: &[u8]) -> Response<Body> {
    let answer = match path {
        "/process.Process/List" => parse::<ps::ListRequest>(body).map(|_| {
            let procs = state.processes.lock().unwrap();
            let mut processes: Vec<ps::ProcessInfo> = procs
                .iter()
                .filter(|(_, p)| p.ended.is_none())
                .map(|(pid, p)| ps::ProcessInfo {
                    config: Some(p.config.clone()),
                    pid: *pid,
                    tag: p.tag.clone(),
                })
                .collect();
            processes.sort_by_key(|p| p.pid);
            json(&ps::ListResponse { processes })
        }),
        "/process.Process/SendInput" => parse::<ps::SendInputRequest>(body)
            .and_then(|r| deliver(state, r.process, to_input(r.input)))
            .map(|()| json(&ps::SendInputResponse {})),
        "/process.Process/CloseStdin" => parse::<ps::CloseStdinRequest>(body)
            .and_then(|r| deliver(state, r.process, Input::Close))
            .map(|()| json(&ps::CloseStdinResponse {})),
        "/process.Process/SendSignal" => parse::<ps::SendSignalRequest>(body)
            .and_then(|r| match r.signal {
                ps::Signal::Sigkill | ps::Signal::Sigterm => {
                    deliver(state, r.process, Input::Signal(r.signal))
                }
                other => Err(ConnectError::new(
                    Code::Unimplemented,
                    format!("signal {other:?} is not supported"),
                )),
            })
            .map(|()| json(&ps::SendSignalResponse {})),
        "/process.Process/Update" => parse::<ps::UpdateRequest>(body)
            .and_then(|r| {
                let size = r.pty.and_then(|p| p.size).unwrap_or_default();
                deliver(state, r.process, Input::Resize(size.cols, size.rows))
            })
            .map(|()| json(&ps::UpdateResponse {})),
        "/filesystem.Filesystem/Stat" => {
            let r = parse::<fs::StatRequest>(body);
            if matches!(&r, Ok(r) if r.path == "/slow") {
                tokio::time::sleep(Duration::from_secs(20)).await;
            }
            r.and_then(|r| entry(state, &r.path))
                .map(|entry| json(&fs::StatResponse { entry: Some(entry) }))
        }
        "/filesystem.Filesystem/MakeDir" => parse::<fs::MakeDirRequest>(body)
            .and_then(|r| {
                let host = state.resolve(&r.path)?;
                if host.is_dir() {
                    return Err(ConnectError::new(
                        Code::AlreadyExists,
                        format!("directory {} already exists", r.path),
                    ));
                }
                if host.exists() {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        format!("path {} exists and is not a directory", r.path),
                    ));
                }
                std::fs::create_dir_all(&host).unwrap();
                state.notify(&host, fs::EventType::Create);
                entry(state, &r.path)
            })
            .map(|entry| json(&fs::MakeDirResponse { entry: Some(entry) })),
        "/filesystem.Filesystem/Move" => parse::<fs::MoveRequest>(body)
            .and_then(|r| {
                let from = state.resolve(&r.source)?;
                let to = state.resolve(&r.destination)?;
                if !from.exists() {
                    return Err(not_found(&r.source));
                }
                std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                std::fs::rename(&from, &to).unwrap();
                state.notify(&from, fs::EventType::Rename);
                entry(state, &r.destination)
            })
            .map(|entry| json(&fs::MoveResponse { entry: Some(entry) })),
        "/filesystem.Filesystem/ListDir" => parse::<fs::ListDirRequest>(body).and_then(|r| {
            let host = state.resolve(&r.path)?;
            if !host.exists() {
                return Err(not_found(&r.path));
            }
            if !host.is_dir() {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("path {} is not a directory", r.path),
                ));
            }
            let mut entries = Vec::new();
            list(state, &r.path, r.depth.max(1), &mut entries)?;
            Ok(json(&fs::ListDirResponse { entries }))
        }),
        "/filesystem.Filesystem/Remove" => parse::<fs::RemoveRequest>(body).and_then(|r| {
            let host = state.resolve(&r.path)?;
            if host.is_dir() {
                std::fs::remove_dir_all(&host).unwrap();
            } else if host.exists() {
                std::fs::remove_file(&host).unwrap();
            } else {
                return Ok(json(&fs::RemoveResponse {}));
            }
            state.notify(&host, fs::EventType::Remove);
            Ok(json(&fs::RemoveResponse {}))
        }),
        "/filesystem.Filesystem/CreateWatcher" => {
            match parse::<fs::CreateWatcherRequest>(body).and_then(|r| {
                let dir = state.resolve(&r.path)?;
                if !dir.is_dir() {
                    return Err(not_found(&r.path));
                }
                Ok((dir, r.recursive))
            }) {
                Ok((dir, recursive)) => {
                    let id = format!("w{}", state.next_pid.fetch_add(1, Ordering::SeqCst));
                    let events = Arc::new(Mutex::new(Vec::new()));
                    state
                        .watchers
                        .lock()
                        .unwrap()
                        .insert(id.clone(), Arc::clone(&events));
                    let mut rx = state.watch.subscribe();
                    tokio::spawn(async move {
                        while let Ok((host, mut ev)) = rx.recv().await {
                            let Ok(relative) = host.strip_prefix(&dir) else {
                                continue;
                            };
                            if recursive || relative.components().count() == 1 {
                                ev.name = relative.to_string_lossy().into_owned();
                                events.lock().unwrap().push(ev);
                            }
                        }
                    });
                    Ok(json(&fs::CreateWatcherResponse { watcher_id: id }))
                }
                Err(e) => Err(e),
            }
        }
        "/filesystem.Filesystem/GetWatcherEvents" => parse::<fs::GetWatcherEventsRequest>(body)
            .and_then(|r| {
                let watchers = state.watchers.lock().unwrap();
                let events = watchers.get(&r.watcher_id).ok_or_else(|| {
                    ConnectError::new(
                        Code::NotFound,
                        format!("watcher {} not found", r.watcher_id),
                    )
                })?;
                let events = std::mem::take(&mut *events.lock().unwrap());
                Ok(json(&fs::GetWatcherEventsResponse { events }))
            }),
        "/filesystem.Filesystem/RemoveWatcher" => {
            parse::<fs::RemoveWatcherRequest>(body).and_then(|r| {
                state
                    .watchers
                    .lock()
                    .unwrap()
                    .remove(&r.watcher_id)
                    .map(|_| json(&fs::RemoveWatcherResponse {}))
                    .ok_or_else(|| {
                        ConnectError::new(
                            Code::NotFound,
                            format!("watcher {} not found", r.watcher_id),
                        )
                    })
            })
        }
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("{other} is not implemented"),
        )),
    };
    answer.unwrap_or_else(|e| unary_error(&e))
}

fn not_found(path: &str) -> ConnectError {
    ConnectError::new(Code::NotFound, format!("file not found: {path}"))
}

fn entry(state: &State, path: &str) -> Result<fs::EntryInfo, ConnectError> {
    let host = state.resolve(path)?;
    let meta = std::fs::metadata(&host).map_err(|_| not_found(path))?;
    use std::os::unix::fs::PermissionsExt;
    Ok(fs::EntryInfo {
        name: host
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        r#type: if meta.is_dir() {
            fs::FileType::Directory
        } else {
            fs::FileType::File
        },
        path: path.to_owned(),
        size: i64::try_from(meta.len()).unwrap(),
        mode: meta.permissions().mode() & 0o777,
        ..fs::EntryInfo::default()
    })
}

fn list(
    state: &State,
    path: &str,
    depth: u32,
    out: &mut Vec<fs::EntryInfo>,
) -> Result<(), ConnectError> {
    let host = state.resolve(path)?;
    let mut names: Vec<String> = std::fs::read_dir(&host)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let child = format!("{}/{name}", path.trim_end_matches('/'));
        let e = entry(state, &child)?;
        let dir = e.r#type == fs::FileType::Directory;
        out.push(e);
        if dir && depth > 1 {
            list(state, &child, depth - 1, out)?;
        }
    }
    Ok(())
}

async fn watch(
    state: &Arc<State>,
    request: fs::WatchDirRequest,
    keepalive: Duration,
    mut out: Out,
) {
    use fs::watch_dir_response::{Event, KeepAlive, StartEvent};
    let dir = match state.resolve(&request.path) {
        Ok(d) if d.is_dir() => d,
        Ok(_) => {
            out.send(end_stream(Err(not_found(&request.path)))).await;
            return;
        }
        Err(e) => {
            out.send(end_stream(Err(e))).await;
            return;
        }
    };
    let mut rx = state.watch.subscribe();
    let start = fs::WatchDirResponse {
        event: Some(Event::Start(StartEvent {})),
    };
    if !out.message(&start).await {
        return;
    }
    loop {
        let message = match tokio::time::timeout(keepalive, rx.recv()).await {
            Err(_) => fs::WatchDirResponse {
                event: Some(Event::Keepalive(KeepAlive {})),
            },
            Ok(Ok((host, mut ev))) => {
                let Ok(relative) = host.strip_prefix(&dir) else {
                    continue;
                };
                if !request.recursive && relative.components().count() != 1 {
                    continue;
                }
                ev.name = relative.to_string_lossy().into_owned();
                fs::WatchDirResponse {
                    event: Some(Event::Filesystem(ev)),
                }
            }
            Ok(Err(_)) => return,
        };
        if !out.message(&message).await {
            return;
        }
    }
}

fn stream_answer(result: Result<(), ConnectError>) -> Response<Body> {
    let mut body = BytesMut::new();
    if result.is_ok() {
        body.put_slice(&envelope(&ps::StreamInputResponse {}));
    }
    body.put_slice(&end_stream(result));
    full(StatusCode::OK, "application/connect+json", body.freeze())
}

async fn stream_input(state: &Arc<State>, mut body: Incoming) -> Response<Body> {
    use ps::stream_input_request::Event;
    let mut decoder = EnvelopeDecoder::new(DecoderConfig::request());
    let mut selector = None;
    loop {
        while let Some(env) = decoder.decode().unwrap() {
            let message: ps::StreamInputRequest = env.parse_message().unwrap();
            let result = match message.event {
                Some(Event::Start(s)) => {
                    let procs = state.processes.lock().unwrap();
                    let found = find(&procs, &s.process.clone().unwrap_or_default()).map(|_| ());
                    selector = s.process;
                    found
                }
                Some(Event::Data(d)) => deliver(state, selector.clone(), to_input(d.input)),
                Some(Event::Keepalive(_)) | None => Ok(()),
            };
            if let Err(e) = result {
                return stream_answer(Err(e));
            }
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    decoder.push(data);
                }
            }
            Some(Err(_)) => return stream_answer(Err(ConnectError::new(Code::Canceled, "cut"))),
            None => break,
        }
    }
    decoder.finish().unwrap();
    stream_answer(Ok(()))
}

async fn files(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let query: BTreeMap<String, String> =
        url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    if let Some(user) = query.get("username")
        && !USERS.contains(&user.as_str())
    {
        return http_error(StatusCode::UNAUTHORIZED, &format!("invalid user: '{user}'"));
    }
    let path = query.get("path").cloned();
    if req.method() == hyper::Method::GET {
        let path = path.unwrap_or_default();
        if path == "/cut" {
            // Announces 1000 bytes, sends 10, and ends the connection.
            let (mut tx, body) = Channel::<Bytes, Infallible>::new(1);
            tokio::spawn(async move {
                let _ = tx.send_data(Bytes::from_static(b"0123456789")).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                drop(tx);
            });
            return Response::builder()
                .header("content-type", "application/octet-stream")
                .header("content-length", "1000")
                .body(body.boxed_unsync())
                .unwrap();
        }
        let Ok(host) = state.resolve(&path) else {
            return http_error(StatusCode::BAD_REQUEST, "bad path");
        };
        if host.is_dir() {
            return http_error(
                StatusCode::BAD_REQUEST,
                &format!("path '{path}' is a directory"),
            );
        }
        return match std::fs::read(&host) {
            Ok(data) => full(StatusCode::OK, "application/octet-stream", data),
            Err(_) => http_error(
                StatusCode::NOT_FOUND,
                &format!("path '{path}' does not exist"),
            ),
        };
    }
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if content_type == "application/octet-stream" {
        return octet_upload(&state, path, req.into_body()).await;
    }
    let Ok(boundary) = multer::parse_boundary(&content_type) else {
        return http_error(StatusCode::BAD_REQUEST, "unsupported content type");
    };
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let stream = futures_util::stream::once(async move { Ok::<_, Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut written = Vec::new();
    while let Some(field) = multipart.next_field().await.unwrap() {
        assert_eq!(field.name(), Some("file"), "every part is named file");
        let target = path
            .clone()
            .or_else(|| field.file_name().map(str::to_owned))
            .unwrap();
        let data = field.bytes().await.unwrap();
        let Ok(host) = state.resolve(&target) else {
            return http_error(StatusCode::BAD_REQUEST, "bad path");
        };
        if host.is_dir() {
            return http_error(
                StatusCode::BAD_REQUEST,
                &format!("path '{target}' is a directory"),
            );
        }
        std::fs::create_dir_all(host.parent().unwrap()).unwrap();
        let existed = host.exists();
        std::fs::write(&host, &data).unwrap();
        state.notify(
            &host,
            if existed {
                fs::EventType::Write
            } else {
                fs::EventType::Create
            },
        );
        let absolute = if target.starts_with('/') {
            target.clone()
        } else {
            format!("/home/user/{target}")
        };
        written.push(WriteInfo {
            name: host.file_name().unwrap().to_string_lossy().into_owned(),
            path: absolute,
            kind: "file".to_owned(),
            metadata: None,
        });
    }
    json(&written)
}

/// An `application/octet-stream` upload (one file at the query's `path`), written to disk frame
/// by frame as it arrives, so the server holds no more of it than the client does.
async fn octet_upload(state: &State, path: Option<String>, mut body: Incoming) -> Response<Body> {
    use std::io::Write as _;
    let Some(target) = path else {
        return http_error(StatusCode::BAD_REQUEST, "octet-stream upload needs a path");
    };
    let Ok(host) = state.resolve(&target) else {
        return http_error(StatusCode::BAD_REQUEST, "bad path");
    };
    std::fs::create_dir_all(host.parent().unwrap()).unwrap();
    let mut file = std::fs::File::create(&host).unwrap();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            // The client ended the body with an error: nothing is answered for it.
            return http_error(StatusCode::BAD_REQUEST, "the upload broke");
        };
        if let Some(data) = frame.data_ref() {
            file.write_all(data).unwrap();
            state
                .octet_received
                .fetch_add(data.len() as u64, Ordering::SeqCst);
        }
    }
    let absolute = if target.starts_with('/') {
        target.clone()
    } else {
        format!("/home/user/{target}")
    };
    json(&[WriteInfo {
        name: host.file_name().unwrap().to_string_lossy().into_owned(),
        path: absolute,
        kind: "file".to_owned(),
        metadata: None,
    }])
}
