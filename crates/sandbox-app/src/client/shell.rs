//! `sandbox shell`: an interactive terminal in a session's sandbox, in the user's own tty.
//!
//! A single-use ticket (`POST …/terminal/ticket`) authorises the WebSocket upgrade, so the
//! bearer token never travels in a URL. When stdin is a terminal it is put in raw mode for the
//! session (restored on every way out) and window-size changes (SIGWINCH) are sent as resize
//! messages; when stdin is a pipe, its bytes are typed into the terminal and its end is sent as
//! Ctrl-D, so scripted use ends as an interactive one would.
//!
//! The service names the terminal's pid in its first frame; it is printed on stderr, and
//! `sandbox shell <session> --pid N` reattaches to that terminal after this client went away
//! (where the backend keeps detached terminals: it then replays the recent output). The client
//! leaves with a close frame without a code, which detaches: only the shell's exit ends it.

use std::io::IsTerminal as _;
use std::os::fd::AsFd;

use futures_util::{SinkExt as _, StreamExt as _};
use hyper::Method;
use tokio::io::AsyncWriteExt as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use url::Url;

use super::{Client, ClientError, error_body};
use crate::api;

/// The largest frame or message accepted from the service (PTY output comes in small chunks).
const MAX_MESSAGE: usize = 1024 * 1024;
/// Ctrl-D: end of input for a shell reading a terminal.
const EOT: u8 = 0x04;

/// A terminal size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub cols: u16,
    pub rows: u16,
}

/// The size of the terminal on stdin or stdout, if either is one.
pub fn local_size() -> Option<Size> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    [stdin.as_fd(), stdout.as_fd()].into_iter().find_map(|fd| {
        let ws = rustix::termios::tcgetwinsize(fd).ok()?;
        (ws.ws_col > 0 && ws.ws_row > 0).then_some(Size {
            cols: ws.ws_col,
            rows: ws.ws_row,
        })
    })
}

/// Raw mode on stdin for as long as it lives; the previous mode is restored when dropped,
/// whichever way the session ends.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enable() -> Result<Self, ClientError> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(stdin.as_fd())
            .map_err(|e| ClientError::local("cannot read the terminal mode", e))?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw)
            .map_err(|e| ClientError::local("cannot put the terminal in raw mode", e))?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let stdin = std::io::stdin();
        let _ = rustix::termios::tcsetattr(
            stdin.as_fd(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Opens the terminal of `session`: a ticket, then the upgrade. A session without a live
/// sandbox is provisioned first (the terminal route itself never provisions).
async fn open(
    client: &Client,
    session: &str,
    size: Option<Size>,
    pid: Option<u32>,
) -> Result<Socket, ClientError> {
    if pid.is_some() {
        // A reattach names a running terminal: nothing to provision.
        return upgrade(client, session, size, pid).await;
    }
    match upgrade(client, session, size, None).await {
        Err(ClientError::Api { code, .. }) if code == "no_live_sandbox" => {
            let url = client.session_url(session, &["exec"], &[]);
            let spec = api::ExecSpec {
                command: "true".to_owned(),
                ..api::ExecSpec::default()
            };
            client
                .json::<_, api::ExecResult>(Method::POST, &url, Some(&spec))
                .await?;
            upgrade(client, session, size, None).await
        }
        other => other,
    }
}

async fn upgrade(
    client: &Client,
    session: &str,
    size: Option<Size>,
    pid: Option<u32>,
) -> Result<Socket, ClientError> {
    let url = client.session_url(session, &["terminal", "ticket"], &[]);
    let api::TerminalTicket { ticket, .. } = client.json::<(), _>(Method::POST, &url, None).await?;
    let (cols, rows) = size.map_or((String::new(), String::new()), |s| {
        (s.cols.to_string(), s.rows.to_string())
    });
    let pid = pid.map(|p| p.to_string());
    let mut query = vec![("ticket", ticket.as_str())];
    match &pid {
        Some(pid) => query.push(("pid", pid.as_str())),
        None => query.push(("resume", "true")),
    }
    if size.is_some() {
        query.extend([("cols", cols.as_str()), ("rows", rows.as_str())]);
    }
    let mut url = client.session_url(session, &["terminal"], &query);
    url.set_scheme("ws")
        .map_err(|()| ClientError::Usage("cannot form the WebSocket URL".to_owned()))?;
    let stream = connect(&url).await?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    match tokio_tungstenite::client_async_with_config(url.as_str(), stream, Some(config)).await {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let body = response.body().clone().unwrap_or_default();
            let (code, message) =
                error_body(&body).unwrap_or_else(|| (format!("http_{status}"), String::new()));
            Err(ClientError::Api {
                status,
                code,
                message,
            })
        }
        Err(e) => Err(ClientError::Connect(format!(
            "the terminal upgrade failed: {e}"
        ))),
    }
}

/// Dials the service for the upgrade. The CLI dials the server its user named (as its HTTP
/// client does), never a tenant-supplied endpoint, so the guarded connector does not apply.
#[expect(
    clippy::disallowed_methods,
    reason = "the operator's own service, not a tenant-supplied endpoint"
)]
async fn connect(url: &Url) -> Result<tokio::net::TcpStream, ClientError> {
    let host = url
        .host_str()
        .ok_or_else(|| ClientError::Usage("the server URL has no host".to_owned()))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_or_known_default().unwrap_or(80);
    let stream = tokio::time::timeout(
        super::CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    .map_err(|_| ClientError::Connect(format!("connecting to {host}:{port} timed out")))?
    .map_err(|e| ClientError::Connect(format!("cannot reach {host}:{port}: {e}")))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Runs an interactive terminal in `session` (a new one, or the running terminal `pid`) until
/// the shell exits; its exit status.
pub async fn run(client: &Client, session: &str, pid: Option<u32>) -> Result<u8, ClientError> {
    let interactive = std::io::stdin().is_terminal();
    let size = local_size();
    let socket = open(client, session, size, pid).await?;
    let _raw = if interactive {
        Some(RawMode::enable()?)
    } else {
        None
    };
    pump(socket, interactive).await
}

/// Copies keystrokes to the socket and output to stdout until the service ends the terminal.
async fn pump(socket: Socket, interactive: bool) -> Result<u8, ClientError> {
    let (mut sink, mut source) = socket.split();
    let (keys_tx, mut keys_rx) = tokio::sync::mpsc::channel::<Option<Vec<u8>>>(64);
    // stdin is read on a thread of its own with blocking reads: a read pending on a terminal
    // cannot be cancelled, and a plain thread does not hold up the runtime's shutdown when the
    // session ends (the process exits right after). `None` is its end.
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 4096];
        loop {
            match std::io::Read::read(&mut stdin, &mut buf) {
                Ok(0) | Err(_) => {
                    let _ = keys_tx.blocking_send(None);
                    return;
                }
                Ok(n) => {
                    if keys_tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut winch = if interactive {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()
    } else {
        None
    };
    let mut stdout = tokio::io::stdout();
    let mut stdin_open = true;
    let mut exit: Option<u8> = None;
    let mut failure: Option<ClientError> = None;
    loop {
        tokio::select! {
            keys = keys_rx.recv(), if stdin_open => {
                let bytes = match keys.flatten() {
                    Some(bytes) => bytes,
                    None => {
                        stdin_open = false;
                        // The end of piped input is the end of the user's input: Ctrl-D.
                        vec![EOT]
                    }
                };
                if sink.send(Message::Binary(bytes.into())).await.is_err() {
                    break;
                }
            }
            Some(()) = async {
                match winch.as_mut() {
                    Some(w) => w.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some(s) = local_size() {
                    let resize = api::TerminalClientFrame::Resize { cols: s.cols, rows: s.rows };
                    let Ok(resize) = serde_json::to_string(&resize) else { break };
                    if sink.send(Message::Text(resize.into())).await.is_err() {
                        break;
                    }
                }
            }
            message = source.next() => match message {
                None | Some(Err(_)) => break,
                Some(Ok(Message::Binary(data))) => {
                    if stdout.write_all(&data).await.is_err() || stdout.flush().await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Text(text))) => {
                    // A frame of a kind this client does not know (a newer service): ignored.
                    match serde_json::from_str::<api::TerminalServerFrame>(text.as_str()) {
                        Ok(api::TerminalServerFrame::Opened { pid }) => {
                            if let Some(pid) = pid {
                                // On stderr, so output piped from stdout stays the shell's.
                                let note = format!("sandbox: terminal pid {pid} (reattach: sandbox shell <session> --pid {pid})\r\n");
                                let mut stderr = tokio::io::stderr();
                                let _ = stderr.write_all(note.as_bytes()).await;
                                let _ = stderr.flush().await;
                            }
                        }
                        Ok(api::TerminalServerFrame::Exit { code }) => {
                            exit = Some(u8::try_from(code).unwrap_or(1));
                        }
                        Ok(api::TerminalServerFrame::Error { code, message }) => {
                            failure = Some(ClientError::Api { status: 200, code, message });
                        }
                        Err(_) => {}
                    }
                }
                Some(Ok(Message::Close(_))) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    let _ = sink.close().await;
    match (exit, failure) {
        (_, Some(e)) => Err(e),
        (Some(code), None) => Ok(code),
        (None, None) => Err(ClientError::Connect(
            "the terminal connection ended without the shell's exit".to_owned(),
        )),
    }
}
