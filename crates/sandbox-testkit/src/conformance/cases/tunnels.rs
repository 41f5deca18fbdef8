//! Tunnels to ports inside a sandbox. The server is busybox's echo server,
//! `nc -l[l] -p PORT -e cat`, started as a background process: the fake runs that argv in its
//! vocabulary, a busybox or Debian userland runs the real program, so the cases judge real
//! connections on a real backend.

use std::time::{Duration, Instant};

use sandbox_core::{
    ErrorCode, ErrorKind, ProcessSelector, ProcessSpec, SandboxHandle, Signal, Tunnel, Tunnels,
    narrow,
};

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq, preview, within};

const CALL_LIMIT: Duration = Duration::from_secs(60);
/// How long a just-started server may take to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(20);
/// How long a refusal of a closed port may take ("promptly"): no waiting out a timeout.
const REFUSAL_LIMIT: Duration = Duration::from_secs(10);
/// The most tunnels the cap case opens before it calls the cap missing (an adapter's test
/// config sets a small bound, so the case stays cheap).
const CAP_SEARCH: usize = 256;

fn tunnels(ctx: &Ctx) -> Result<&dyn Tunnels, Failure> {
    narrow::tunnels(ctx.provider())
        .ok_or_else(|| Failure("tunnels declared but not callable".to_owned()))
}

/// A port drawn per run, above the well-known ones and below the ephemeral range.
fn port(ctx: &Ctx) -> u16 {
    u16::try_from(ctx.int(20_000..=30_000)).unwrap_or(20_000)
}

fn expect_code<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, sandbox_core::Error>,
    kind: ErrorKind,
    code: ErrorCode,
) -> CaseResult {
    match result {
        Err(e) if e.kind() == kind && e.code() == Some(code) => Ok(()),
        Err(e) => Err(Failure(format!(
            "{what}: expected {kind} with code {code}, got {e}"
        ))),
        Ok(v) => Err(Failure(format!(
            "{what}: expected {kind} with code {code}, got success: {v:?}"
        ))),
    }
}

/// Starts the echo server on `port` (`persistent`: `-ll`, every connection; else one).
async fn serve(ctx: &Ctx, h: &SandboxHandle, port: u16, persistent: bool) -> Result<u32, Failure> {
    let p = narrow::processes(ctx.provider())
        .ok_or_else(|| Failure("processes declared but not callable".to_owned()))?;
    let listen = if persistent { "-ll" } else { "-l" };
    let spec = ProcessSpec::argv(
        "nc",
        [listen, "-p", &port.to_string(), "-e", "cat"].map(str::to_owned),
    );
    let info = within(CALL_LIMIT, "start_process", p.start_process(h, spec)).await??;
    Ok(info.pid)
}

/// Opens a tunnel to a server just started, waiting while it does not listen yet.
async fn open_when_listening(ctx: &Ctx, h: &SandboxHandle, port: u16) -> Result<Tunnel, Failure> {
    let t = tunnels(ctx)?;
    let deadline = Instant::now() + LISTEN_WAIT;
    loop {
        match within(CALL_LIMIT, "open_tunnel", t.open_tunnel(h, port)).await? {
            Ok(tunnel) => return Ok(tunnel),
            Err(e) if e.code() == Some(ErrorCode::PortClosed) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(Failure(format!("open_tunnel to port {port}: {e}"))),
        }
    }
}

/// Sends `payload` in chunks, finishes, and reads the answer to its end, both at once (an echo
/// server stops reading when nobody reads its answer).
async fn round_trip(tunnel: Tunnel, payload: &[u8]) -> Result<Vec<u8>, Failure> {
    let Tunnel {
        mut sink,
        mut source,
    } = tunnel;
    let send = async {
        for chunk in payload.chunks(7 * 1024 + 13) {
            sink.send(chunk.to_vec()).await?;
        }
        sink.finish().await?;
        // Idempotent.
        sink.finish().await?;
        Ok::<_, sandbox_core::Error>(())
    };
    let receive = async {
        let mut answer = Vec::new();
        while let Some(chunk) = source.recv().await {
            answer.extend_from_slice(&chunk?);
        }
        Ok::<_, sandbox_core::Error>(answer)
    };
    let (sent, answer) = within(CALL_LIMIT, "the tunnel's round trip", async {
        tokio::join!(send, receive)
    })
    .await?;
    sent.map_err(|e| Failure(format!("sending through the tunnel: {e}")))?;
    answer.map_err(|e| Failure(format!("reading from the tunnel: {e}")))
}

/// Bytes reach the server and its answer comes back in order; `finish` is its end of file, and
/// the answer ends when it closes.
pub(super) async fn tunnel_carries_bytes_both_ways(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let port = port(ctx);
    serve(ctx, &h, port, false).await?;
    let tunnel = open_when_listening(ctx, &h, port).await?;
    let payload = ctx.bytes(200 * 1024 + 77);
    let answer = round_trip(tunnel, &payload).await?;
    ensure(answer == payload, || {
        format!(
            "the echo answered {} bytes ({}), want the {} sent",
            answer.len(),
            preview(&answer),
            payload.len()
        )
    })
}

/// A port nothing listens on is refused at open, promptly, as `port_closed`.
pub(super) async fn tunnel_to_a_closed_port_is_refused(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let t = tunnels(ctx)?;
    let port = port(ctx);
    let started = Instant::now();
    let result = within(CALL_LIMIT, "open_tunnel", t.open_tunnel(&h, port)).await?;
    let took = started.elapsed();
    expect_code(
        "a tunnel to a closed port",
        result,
        ErrorKind::Unavailable,
        ErrorCode::PortClosed,
    )?;
    ensure(took < REFUSAL_LIMIT, || {
        format!("the refusal took {took:?}, not promptly")
    })
}

/// Port 0 is an invalid request.
pub(super) async fn tunnel_to_port_zero_is_invalid(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let t = tunnels(ctx)?;
    let result = within(CALL_LIMIT, "open_tunnel", t.open_tunnel(&h, 0)).await?;
    match result {
        Err(e) if e.kind() == ErrorKind::InvalidRequest => Ok(()),
        Err(e) => Err(Failure(format!(
            "port 0: expected invalid_request, got {e}"
        ))),
        Ok(_) => Err(Failure("port 0: a tunnel was opened".to_owned())),
    }
}

/// Opens past the bound are refused with `tunnel_limit`, while the open ones keep working;
/// after one is closed an open succeeds again.
pub(super) async fn tunnel_cap_is_enforced(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let t = tunnels(ctx)?;
    let port = port(ctx);
    let server = serve(ctx, &h, port, true).await?;
    let mut open = vec![open_when_listening(ctx, &h, port).await?];
    let refusal = loop {
        ensure(open.len() < CAP_SEARCH, || {
            format!("{CAP_SEARCH} tunnels opened and no open was refused")
        })?;
        match within(CALL_LIMIT, "open_tunnel", t.open_tunnel(&h, port)).await? {
            Ok(tunnel) => open.push(tunnel),
            Err(e) => break e,
        }
    };
    expect_code(
        "an open past the bound",
        Err::<(), _>(refusal),
        ErrorKind::Capacity,
        ErrorCode::TunnelLimit,
    )?;
    // The refusal broke none of the open ones: the last one still echoes.
    let last = open
        .pop()
        .ok_or_else(|| Failure("no tunnel was open".to_owned()))?;
    let payload = ctx.bytes(4096);
    ensure_eq(
        "the echo through the newest tunnel",
        round_trip(last, &payload).await?,
        payload,
    )?;
    // That one is closed now (both halves dropped); closing may be asynchronous on a real
    // backend, so the next open is retried for a while.
    let deadline = Instant::now() + Duration::from_secs(30);
    let replacement = loop {
        match within(CALL_LIMIT, "open_tunnel", t.open_tunnel(&h, port)).await? {
            Ok(tunnel) => break tunnel,
            Err(e) if e.code() == Some(ErrorCode::TunnelLimit) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(Failure(format!("an open after one closed: {e}"))),
        }
    };
    let payload = ctx.bytes(1024);
    ensure_eq(
        "the echo through the replacement",
        round_trip(replacement, &payload).await?,
        payload,
    )?;
    drop(open);
    if let Some(p) = narrow::processes(ctx.provider()) {
        let _ = p
            .signal_process(&h, &ProcessSelector::Pid(server), Signal::Kill)
            .await;
    }
    Ok(())
}
