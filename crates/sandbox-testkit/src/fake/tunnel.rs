//! The fake's ports and tunnels: what a program of its vocabulary listens on, and the byte
//! tunnels [`sandbox_core::Tunnels`] opens to them.
//!
//! What it models, and why it is honest to the contract:
//! - A port is open only while a program listens on it. The one listening program is
//!   busybox's `nc -l[l] -p PORT -e cat` (`fake::exec`): the same argv starts a real echo
//!   server on a busybox or Debian userland, so a conformance case runs alike on the fake and
//!   on a real backend. `-l` serves one connection and stops listening once it accepted it;
//!   `-ll` serves every connection until the process is killed.
//! - A connection is two bounded channels of chunks, so a writer waits for a slow reader
//!   (backpressure) instead of queueing without bound; end of file is the sender dropped.
//! - A sandbox has at most its bound of tunnels open ([`TUNNEL_CAP`] unless the builder sets
//!   another): each open holds a permit that both halves share, returned when both are dropped.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use sandbox_core::{Error, Operation, TunnelSink, TunnelSource, tunnel_errors};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// The most tunnels a sandbox has open at once by default (the E2B API's default bound too).
pub const TUNNEL_CAP: usize = 16;

/// Connections a listener queues before its program accepts them (the kernel's usual
/// `somaxconn`); a connection past it is refused.
const BACKLOG: usize = 128;

/// Chunks either direction of a connection queues before its writer waits.
const CONNECTION_CHUNKS: usize = 8;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One accepted connection, as the listening program sees it.
#[derive(Debug)]
pub(crate) struct Connection {
    /// What the client sends; `None` at its end of file.
    pub(crate) from_client: mpsc::Receiver<Vec<u8>>,
    /// What the program answers; dropping it closes the program's side.
    pub(crate) to_client: mpsc::Sender<Vec<u8>>,
}

/// A sandbox's listening ports and its tunnel bound.
#[derive(Debug)]
pub(crate) struct Ports {
    listeners: Mutex<BTreeMap<u16, (u64, mpsc::Sender<Connection>)>>,
    next: Mutex<u64>,
    tunnels: Arc<Semaphore>,
    cap: usize,
}

/// A port held by a listening program; dropping it stops listening.
#[derive(Debug)]
pub(crate) struct Listening {
    ports: Arc<Ports>,
    port: u16,
    serial: u64,
    pub(crate) accept: mpsc::Receiver<Connection>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        let mut listeners = lock(&self.ports.listeners);
        if listeners
            .get(&self.port)
            .is_some_and(|(s, _)| *s == self.serial)
        {
            listeners.remove(&self.port);
        }
    }
}

impl Ports {
    pub(crate) fn new(cap: usize) -> Ports {
        let cap = cap.clamp(1, Semaphore::MAX_PERMITS);
        Ports {
            listeners: Mutex::new(BTreeMap::new()),
            next: Mutex::new(0),
            tunnels: Arc::new(Semaphore::new(cap)),
            cap,
        }
    }

    /// Starts listening on `port`, or says why not (another program holds it).
    pub(crate) fn listen(self: &Arc<Self>, port: u16) -> Result<Listening, String> {
        let mut listeners = lock(&self.listeners);
        if listeners.contains_key(&port) {
            return Err("bind: Address already in use".to_owned());
        }
        let serial = {
            let mut next = lock(&self.next);
            *next += 1;
            *next
        };
        // The backlog: connections accepted by the "kernel" before the program takes them.
        let (tx, rx) = mpsc::channel(BACKLOG);
        listeners.insert(port, (serial, tx));
        Ok(Listening {
            ports: Arc::clone(self),
            port,
            serial,
            accept: rx,
        })
    }

    /// Opens a tunnel to `port` ([`sandbox_core::Tunnels`]'s contract).
    pub(crate) fn connect(&self, port: u16) -> Result<FakeTunnelHalves, Error> {
        let permit = Arc::clone(&self.tunnels)
            .try_acquire_owned()
            .map_err(|_| tunnel_errors::limit(self.cap))?;
        let listener = lock(&self.listeners).get(&port).map(|(_, tx)| tx.clone());
        let Some(listener) = listener else {
            return Err(tunnel_errors::port_closed(port, "connection refused"));
        };
        let (up_tx, up_rx) = mpsc::channel(CONNECTION_CHUNKS);
        let (down_tx, down_rx) = mpsc::channel(CONNECTION_CHUNKS);
        let connection = Connection {
            from_client: up_rx,
            to_client: down_tx,
        };
        // A listener that stopped between the lookup and now refuses, as a closed port does.
        listener
            .try_send(connection)
            .map_err(|_| tunnel_errors::port_closed(port, "connection refused"))?;
        let permit = Arc::new(permit);
        Ok(FakeTunnelHalves {
            sink: FakeSink {
                port,
                tx: Some(up_tx),
                _permit: Arc::clone(&permit),
            },
            source: FakeSource {
                rx: down_rx,
                _permit: permit,
            },
        })
    }
}

/// The two halves of a fake tunnel.
#[derive(Debug)]
pub(crate) struct FakeTunnelHalves {
    pub(crate) sink: FakeSink,
    pub(crate) source: FakeSource,
}

/// Bytes to the program.
#[derive(Debug)]
pub(crate) struct FakeSink {
    port: u16,
    /// `None` once finished.
    tx: Option<mpsc::Sender<Vec<u8>>>,
    _permit: Arc<OwnedSemaphorePermit>,
}

#[async_trait]
impl TunnelSink for FakeSink {
    async fn send(&mut self, data: Vec<u8>) -> Result<(), Error> {
        let op = Operation::OPEN_TUNNEL;
        let Some(tx) = &self.tx else {
            return Err(Error::invalid_request(
                op,
                "the tunnel's sending side was already finished",
            ));
        };
        if data.is_empty() {
            return Ok(());
        }
        tx.send(data).await.map_err(|_| {
            Error::unavailable(
                op,
                format!("the program on port {} closed the connection", self.port),
            )
        })
    }

    async fn finish(&mut self) -> Result<(), Error> {
        self.tx = None;
        Ok(())
    }
}

/// Bytes from the program.
#[derive(Debug)]
pub(crate) struct FakeSource {
    rx: mpsc::Receiver<Vec<u8>>,
    _permit: Arc<OwnedSemaphorePermit>,
}

#[async_trait]
impl TunnelSource for FakeSource {
    async fn recv(&mut self) -> Option<Result<Vec<u8>, Error>> {
        // `mpsc::Receiver::recv` is cancel-safe: a dropped call loses no chunk.
        self.rx.recv().await.map(Ok)
    }
}

/// `nc -l[l] -p PORT -e cat`: the argv busybox's `nc` serves an echo on, parsed strictly (the
/// fake runs no other form). `Ok((port, persistent))`.
pub(crate) fn parse_nc(args: &[String]) -> Result<(u16, bool), String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (persistent, rest) = match args.as_slice() {
        ["-l", "-l", rest @ ..] | ["-ll", rest @ ..] => (true, rest),
        ["-l", rest @ ..] => (false, rest),
        _ => return Err(usage()),
    };
    let ["-p", port, "-e", "cat"] = rest else {
        return Err(usage());
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("invalid port '{port}'"))?;
    Ok((port, persistent))
}

fn usage() -> String {
    "the fake's nc runs only: nc -l[l] -p PORT -e cat".to_owned()
}

/// Serves `cat` on one connection: every chunk back as it came, until the client's end of
/// file, then the program's side closes.
pub(crate) async fn echo(mut connection: Connection) {
    while let Some(chunk) = connection.from_client.recv().await {
        if connection.to_client.send(chunk).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn only_the_echo_server_form_parses() {
        assert_eq!(
            parse_nc(&argv(&["-l", "-p", "80", "-e", "cat"])),
            Ok((80, false))
        );
        assert_eq!(
            parse_nc(&argv(&["-ll", "-p", "80", "-e", "cat"])),
            Ok((80, true))
        );
        assert_eq!(
            parse_nc(&argv(&["-l", "-l", "-p", "9", "-e", "cat"])),
            Ok((9, true))
        );
        for bad in [
            &["-p", "80", "-e", "cat"][..],
            &["-l", "-p", "0", "-e", "cat"],
            &["-l", "-p", "x", "-e", "cat"],
            &["-l", "-p", "80"],
            &["-l", "-p", "80", "-e", "sh"],
        ] {
            assert!(parse_nc(&argv(bad)).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_listener_serves_until_dropped_and_the_cap_counts_open_tunnels() {
        let ports = Arc::new(Ports::new(2));
        let err = ports.connect(7).unwrap_err();
        assert_eq!(err.code(), Some(sandbox_core::ErrorCode::PortClosed));
        let mut listening = ports.listen(7).unwrap();
        assert!(ports.listen(7).is_err(), "a held port is in use");
        let a = ports.connect(7).unwrap();
        let b = ports.connect(7).unwrap();
        let err = ports.connect(7).unwrap_err();
        assert_eq!(err.code(), Some(sandbox_core::ErrorCode::TunnelLimit));
        drop(a);
        let _c = ports.connect(7).unwrap();
        assert!(listening.accept.recv().await.is_some());
        drop(listening);
        drop(b);
        let err = ports.connect(7).unwrap_err();
        assert_eq!(err.code(), Some(sandbox_core::ErrorCode::PortClosed));
        ports.listen(7).unwrap();
    }
}
