//! Tunnels to ports inside a container (the port's `Tunnels`, agent plane only): the agent's
//! tunnel extension (`POST /sandbox-agent/tunnel/<port>`, full duplex over the channel's h2c),
//! so a tunnel needs no network at all and works with network `none`: the agent dials
//! `127.0.0.1:<port>` in the container's own network namespace, and nothing else.
//!
//! - **Errors.** The agent dials before it answers: its 502 (nothing accepts) is `unavailable`
//!   with code `port_closed`; its 429 (its `--max-tunnels` bound) is `capacity` with code
//!   `tunnel_limit`; port 0 never gets here (the checking layer refuses it).
//! - **The bound** is the agent's: [`TUNNELS_PER_SANDBOX`], the `--max-tunnels` the container's
//!   agent is started with (`crate::agent::AGENT_FLAGS` spells the same number; a unit test
//!   keeps them together). The agent counts them, so every replica of the service shares it.
//! - **Holding the channel.** Both halves hold the channel's lease, so a channel is never
//!   closed as idle under an open tunnel; dropping both halves ends the h2 stream, which the
//!   agent sees as the end of the tunnel and closes the port's connection.

use async_trait::async_trait;
use bytes::Bytes;
use sandbox_core::{
    Error, ErrorKind, Operation, Provider, Tunnel, TunnelSink, TunnelSource, tunnel_errors,
};
use sandbox_transport::envd::{TunnelDownstream, TunnelUpstream};

use super::Lease;

/// The most tunnels one container's agent keeps open at once (its `--max-tunnels`).
pub const TUNNELS_PER_SANDBOX: usize = 32;

/// Opens a tunnel to `port` over `lease`'s channel (module docs).
pub(crate) async fn open(lease: Lease, port: u16) -> Result<Tunnel, Error> {
    let op = Operation::OPEN_TUNNEL;
    let (up, down) = lease
        .client()
        .open_tunnel(op, port)
        .await
        .map_err(|e| classify(e, port))?;
    Ok(Tunnel {
        sink: Box::new(Sink {
            up,
            _lease: lease.clone(),
        }),
        source: Box::new(Source {
            down,
            _lease: lease,
        }),
    })
}

/// The agent's refusals as the port's codes; anything else (a channel failure) as it came.
fn classify(e: Error, port: u16) -> Error {
    let mapped = match (e.kind(), e.http_status()) {
        (ErrorKind::Unavailable, Some(502)) => tunnel_errors::port_closed(port, e.message()),
        (ErrorKind::Capacity, Some(429)) => tunnel_errors::limit(TUNNELS_PER_SANDBOX),
        _ => e,
    };
    mapped.with_provider(Provider::Docker)
}

#[derive(Debug)]
struct Sink {
    up: TunnelUpstream,
    _lease: Lease,
}

#[async_trait]
impl TunnelSink for Sink {
    async fn send(&mut self, data: Vec<u8>) -> Result<(), Error> {
        self.up
            .send(Bytes::from(data))
            .await
            .map_err(|e| e.with_provider(Provider::Docker))
    }

    async fn finish(&mut self) -> Result<(), Error> {
        self.up.finish();
        Ok(())
    }
}

#[derive(Debug)]
struct Source {
    down: TunnelDownstream,
    _lease: Lease,
}

#[async_trait]
impl TunnelSource for Source {
    async fn recv(&mut self) -> Option<Result<Vec<u8>, Error>> {
        self.down.recv().await.map(|chunk| {
            chunk
                .map(|b| b.to_vec())
                .map_err(|e| e.with_provider(Provider::Docker))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_refusals_become_the_ports_codes() {
        let op = Operation::OPEN_TUNNEL;
        let closed = classify(
            Error::unavailable(op, "refused").with_http_status(502),
            8000,
        );
        assert_eq!(closed.status_and_code(), (502, "port_closed"));
        assert_eq!(closed.kind(), ErrorKind::Unavailable);
        let full = classify(
            Error::new(ErrorKind::Capacity, op, "full").with_http_status(429),
            8000,
        );
        assert_eq!(full.status_and_code(), (429, "tunnel_limit"));
        // A channel that failed (no answer at all) stays what it was.
        let cut = classify(Error::unavailable(op, "channel closed"), 8000);
        assert_eq!(cut.code(), None);
        assert_eq!(cut.provider(), Some(Provider::Docker));
    }

    #[test]
    fn the_bound_is_the_one_the_agent_is_started_with() {
        let flags = crate::agent::AGENT_FLAGS;
        let at = flags.iter().position(|f| *f == "--max-tunnels");
        assert_eq!(
            at.map(|at| flags[at + 1]),
            Some(TUNNELS_PER_SANDBOX.to_string().as_str())
        );
    }
}
