//! A recording control plane on loopback: it keeps every request it is sent (method, path,
//! query, headers, body) and answers from a script, one answer per request in order, the last
//! one repeated. A scripted answer can also hold the request past any deadline, or cut the
//! connection without answering.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) path: String,
    /// The raw query, still escaped.
    pub(crate) query: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Seen {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} {}: body is not JSON ({e}): {:?}",
                self.method, self.path, self.body
            )
        })
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The query's pairs, unescaped.
    pub(crate) fn params(&self) -> Vec<(String, String)> {
        url::form_urlencoded::parse(self.query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }
}

/// A scripted answer.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// Status, headers, JSON body.
    Json(u16, Vec<(&'static str, String)>, serde_json::Value),
    /// Status, headers, body as it is (a Connect stream, a file).
    Raw(u16, Vec<(&'static str, String)>, Bytes),
    /// No answer for this long (longer than the client's deadline).
    Hang(Duration),
    /// Close the connection without answering.
    Reset,
}

impl Reply {
    pub(crate) fn ok(status: u16, body: serde_json::Value) -> Reply {
        Reply::Json(status, Vec::new(), body)
    }
    pub(crate) fn error(status: u16, message: &str) -> Reply {
        Reply::Json(
            status,
            Vec::new(),
            serde_json::json!({"code": status, "message": message}),
        )
    }
}

type Route = Box<dyn Fn(&Seen, &[Seen]) -> Option<Reply> + Send + Sync>;

struct State {
    seen: Vec<Seen>,
    /// Answers by route, consumed in order; the last one stays.
    scripts: Vec<(Route, VecDeque<Reply>)>,
}

/// See the module docs.
#[derive(Clone)]
pub(crate) struct Recorder {
    pub(crate) addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Recorder {
    pub(crate) async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            seen: Vec::new(),
            scripts: Vec::new(),
        }));
        let recorder = Recorder { addr, state };
        let server = recorder.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let server = server.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let server = server.clone();
                        async move { server.answer(request).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        recorder
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers requests to `method path` (the path exactly) with `replies`, in order.
    pub(crate) fn on(&self, method: &'static str, path: impl Into<String>, replies: Vec<Reply>) {
        let path = path.into();
        self.on_when(
            move |seen| seen.method == method && seen.path == path,
            replies,
        );
    }

    /// Answers requests `matches` selects with `replies`, in order. Later routes win.
    pub(crate) fn on_when(
        &self,
        matches: impl Fn(&Seen) -> bool + Send + Sync + 'static,
        replies: Vec<Reply>,
    ) {
        assert!(!replies.is_empty());
        let route: Route = Box::new(move |seen, _| matches(seen).then_some(Reply::Reset));
        self.state
            .lock()
            .unwrap()
            .scripts
            .insert(0, (route, replies.into()));
    }

    /// Answers requests to `method path` with what `reply` makes of the request and of every
    /// request before it. Later routes win.
    pub(crate) fn on_fn(
        &self,
        method: &'static str,
        path: &'static str,
        reply: impl Fn(&Seen, &[Seen]) -> Reply + Send + Sync + 'static,
    ) {
        let route: Route = Box::new(move |seen, before| {
            (seen.method == method && seen.path == path).then(|| reply(seen, before))
        });
        self.state
            .lock()
            .unwrap()
            .scripts
            .insert(0, (route, VecDeque::new()));
    }

    /// Every request so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// The requests to `method path`.
    pub(crate) fn seen_at(&self, method: &str, path: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == method && s.path == path)
            .collect()
    }

    async fn answer(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let seen = Seen {
            method: parts.method.to_string(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            headers: parts.headers,
            body,
        };
        let reply = {
            let mut state = self.state.lock().unwrap();
            let State {
                seen: before,
                scripts,
            } = &mut *state;
            let mut reply = Reply::error(404, "no route scripted");
            for (route, replies) in scripts.iter_mut() {
                if let Some(made) = route(&seen, before) {
                    reply = match replies.len() {
                        0 => made,
                        1 => replies[0].clone(),
                        _ => replies.pop_front().unwrap(),
                    };
                    break;
                }
            }
            before.push(seen.clone());
            reply
        };
        match reply {
            Reply::Json(status, headers, body) => {
                let mut response =
                    Response::builder().status(StatusCode::from_u16(status).unwrap());
                response = response.header("content-type", "application/json");
                for (k, v) in headers {
                    response = response.header(k, v);
                }
                Ok(response
                    .body(Full::new(Bytes::from(body.to_string())))
                    .unwrap())
            }
            Reply::Raw(status, headers, body) => {
                let mut response =
                    Response::builder().status(StatusCode::from_u16(status).unwrap());
                for (k, v) in headers {
                    response = response.header(k, v);
                }
                Ok(response.body(Full::new(body)).unwrap())
            }
            Reply::Hang(d) => {
                tokio::time::sleep(d).await;
                Ok(Response::new(Full::new(Bytes::new())))
            }
            // An error from the service makes hyper close the connection unanswered.
            Reply::Reset => Err(std::io::Error::other("scripted reset")),
        }
    }
}
