//! `sandbox-agent relay <socket>`: the far end of the service's channel into a sandbox.
//!
//! The service runs this through one `docker exec` (stdin and stdout attached, no TTY) and
//! speaks h2c over the exec's stream; the relay joins that stream to the agent's unix socket.
//! Bytes are copied both ways through fixed buffers ([`BUFFER_BYTES`] each way), so the
//! relay's memory does not grow with what flows through it. The end of stdin (the service
//! closed its side) half-closes the socket, so the agent sees the end of the connection and
//! closes it; the end of the socket (the agent closed the connection, or stopped) ends the
//! relay with status 0. Failures are one line on stderr (which the service reads, bounded, as
//! the channel's diagnostics) and a non-zero status: stdout carries nothing but the agent's
//! bytes.

use std::io;
use std::path::Path;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

/// The copy buffer of each direction.
pub const BUFFER_BYTES: usize = 64 * 1024;

/// How a relay ended badly: what failed, for the one line on stderr.
#[derive(Debug)]
pub struct RelayError {
    pub what: String,
    pub error: io::Error,
}

impl std::fmt::Display for RelayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.error)
    }
}

impl std::error::Error for RelayError {}

/// Connects to `socket` and relays the process's stdin and stdout to it until the socket
/// closes.
pub async fn run(socket: &Path) -> Result<(), RelayError> {
    let stream = UnixStream::connect(socket).await.map_err(|error| RelayError {
        what: format!(
            "cannot connect to the agent's socket {} (is the agent running with --listen-unix?)",
            socket.display()
        ),
        error,
    })?;
    let (stdin, stdout) = stdio()?;
    relay(stdin, stdout, stream).await
}

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// The process's stdin and stdout. Pipes (what `docker exec` hands out) are read and written
/// through the reactor; anything else through tokio's blocking stdio.
fn stdio() -> Result<(Reader, Writer), RelayError> {
    use std::os::fd::AsFd as _;
    use tokio::net::unix::pipe;
    let dup = |fd: std::os::fd::BorrowedFd<'_>, name: &str| {
        fd.try_clone_to_owned().map_err(|error| RelayError {
            what: format!("duplicating {name}"),
            error,
        })
    };
    let stdin: Reader = match pipe::Receiver::from_owned_fd(dup(io::stdin().as_fd(), "stdin")?) {
        Ok(receiver) => Box::new(receiver),
        Err(_) => Box::new(tokio::io::stdin()),
    };
    let stdout: Writer = match pipe::Sender::from_owned_fd(dup(io::stdout().as_fd(), "stdout")?) {
        Ok(sender) => Box::new(sender),
        Err(_) => Box::new(tokio::io::stdout()),
    };
    Ok((stdin, stdout))
}

/// Relays `input` → `socket` and `socket` → `output` until the socket's side ends (see the
/// module docs). The end of `input` half-closes the socket and the relay goes on reading it.
pub async fn relay<R, W, S>(mut input: R, mut output: W, socket: S) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut from_agent, mut to_agent) = tokio::io::split(socket);
    let upstream = async {
        let mut buffer = vec![0u8; BUFFER_BYTES];
        loop {
            let n = input.read(&mut buffer).await.map_err(|error| RelayError {
                what: "reading stdin".into(),
                error,
            })?;
            if n == 0 {
                // The service closed its side: let the agent see the end of the connection.
                let _ = to_agent.shutdown().await;
                return Ok::<(), RelayError>(());
            }
            to_agent
                .write_all(&buffer[..n])
                .await
                .map_err(|error| RelayError {
                    what: "writing to the agent's socket".into(),
                    error,
                })?;
        }
    };
    let downstream = async {
        let mut buffer = vec![0u8; BUFFER_BYTES];
        loop {
            let n = from_agent
                .read(&mut buffer)
                .await
                .map_err(|error| RelayError {
                    what: "reading the agent's socket".into(),
                    error,
                })?;
            let written = if n == 0 {
                output.shutdown().await
            } else {
                match output.write_all(&buffer[..n]).await {
                    Ok(()) => output.flush().await,
                    Err(e) => Err(e),
                }
            };
            written.map_err(|error| RelayError {
                what: "writing stdout".into(),
                error,
            })?;
            if n == 0 {
                return Ok::<(), RelayError>(());
            }
        }
    };
    tokio::pin!(upstream, downstream);
    tokio::select! {
        // The socket's end is the relay's end, whatever stdin is doing.
        done = &mut downstream => done,
        sent = &mut upstream => {
            sent?;
            downstream.await
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tokio::io::duplex;
    use tokio::net::UnixListener;

    /// An echo server on a unix socket that upper-cases nothing: it answers each connection
    /// with what it read, then closes once its client half-closed.
    async fn echo_server(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("agent.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut all = Vec::new();
                    stream.read_to_end(&mut all).await.unwrap();
                    stream.write_all(&all).await.unwrap();
                    stream.shutdown().await.unwrap();
                });
            }
        });
        path
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_and_stdin_eof_half_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = echo_server(dir.path()).await;
        let (mut service_in, relay_in) = duplex(1024);
        let (relay_out, mut service_out) = duplex(1024);
        let socket = UnixStream::connect(&path).await.unwrap();
        let relay = tokio::spawn(relay(relay_in, relay_out, socket));
        // More than the relay's buffer and the pipes' capacity: the copy is bounded, not
        // whole-message.
        let payload: Vec<u8> = (0..(3 * BUFFER_BYTES)).map(|i| (i % 251) as u8).collect();
        let writer = {
            let payload = payload.clone();
            tokio::spawn(async move {
                service_in.write_all(&payload).await.unwrap();
                // The echo server answers only after the end of its input: the relay must
                // pass the half-close on for this to finish.
                drop(service_in);
            })
        };
        let mut got = Vec::new();
        service_out.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), payload.len());
        assert!(got == payload, "the bytes changed on the way");
        relay.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn the_relay_ends_when_the_socket_closes_even_with_stdin_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            stream.write_all(b"bye").await.unwrap();
            // Dropped: the agent closed the connection.
        });
        let (_service_in, relay_in) = duplex(64);
        let (relay_out, mut service_out) = duplex(64);
        let socket = UnixStream::connect(&path).await.unwrap();
        let ended = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            relay(relay_in, relay_out, socket),
        )
        .await
        .expect("the relay outlived its socket");
        ended.unwrap();
        server.await.unwrap();
        let mut got = Vec::new();
        service_out.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"bye");
    }

    #[tokio::test]
    async fn a_missing_socket_is_a_named_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = run(&dir.path().join("none.sock")).await.unwrap_err();
        let text = e.to_string();
        assert!(text.contains("none.sock"), "{text}");
        assert!(text.contains("--listen-unix"), "{text}");
        assert_eq!(e.error.kind(), io::ErrorKind::NotFound);
    }
}
