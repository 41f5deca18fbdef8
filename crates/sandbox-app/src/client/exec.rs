//! `sandbox exec`: runs a command in a session's sandbox through the streaming exec route, so
//! output appears as it is produced, and exits with the command's exit code.

use base64::Engine as _;
use http_body_util::BodyExt;
use hyper::Method;
use hyper::body::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::{Client, ClientError, full};
use crate::api::{self, ExecSpec, ExecStreamLine};

/// The longest NDJSON line accepted (a chunk of output is far smaller).
const MAX_LINE: usize = 16 * 1024 * 1024;

/// The exit status of a command killed at its timeout (as coreutils' `timeout` reports it).
pub const TIMED_OUT: u8 = 124;

/// How the remote command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// Its exit code, when it has one.
    pub exit_code: Option<i64>,
    /// Killed at its timeout.
    pub killed: bool,
    /// The service dropped output because this client read too slowly.
    pub overflow: bool,
}

impl Ended {
    /// The status this process exits with: the command's own code (0–255), 124 when it was
    /// killed at its timeout, 1 when it has no code.
    pub fn status(&self) -> u8 {
        if self.killed {
            return TIMED_OUT;
        }
        match self.exit_code.map(u8::try_from) {
            Some(Ok(code)) => code,
            _ => 1,
        }
    }
}

/// Runs `spec` in `session`, copying its stdout and stderr to `out` and `err` as they arrive.
pub async fn run<O, E>(
    client: &Client,
    session: &str,
    spec: &ExecSpec,
    out: &mut O,
    err: &mut E,
) -> Result<Ended, ClientError>
where
    O: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    let url = client.session_url(session, &["exec"], &[("stream", "true")]);
    let body = serde_json::to_vec(spec)
        .map_err(|e| ClientError::Usage(format!("cannot encode the command: {e}")))?;
    let response = client
        .send(
            Method::POST,
            &url,
            Some("application/json"),
            full(Bytes::from(body)),
        )
        .await?;
    let mut body = response.into_body();
    let mut pending: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ClientError::Connect(format!("the output stream broke off: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Some(ended) = handle_line(&line[..end], out, err).await? {
                return Ok(ended);
            }
        }
        if pending.len() > MAX_LINE {
            return Err(ClientError::Connect(
                "the service sent an over-long output line".to_owned(),
            ));
        }
    }
    Err(ClientError::Connect(
        "the output stream ended without the command's exit".to_owned(),
    ))
}

/// One NDJSON line: output is copied, the final line ends the run.
async fn handle_line<O, E>(
    line: &[u8],
    out: &mut O,
    err: &mut E,
) -> Result<Option<Ended>, ClientError>
where
    O: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_slice(line)
        .map_err(|e| ClientError::Connect(format!("the service sent a malformed line: {e}")))?;
    // A line of a kind this client does not know (a newer service): skip it.
    let Ok(line) = serde_json::from_value::<ExecStreamLine>(value) else {
        return Ok(None);
    };
    match line {
        ExecStreamLine::Output(output) => {
            write_output(output, out, err).await?;
            Ok(None)
        }
        ExecStreamLine::Error(api::ErrorResponse { error }) => Err(ClientError::Api {
            status: 200,
            code: error.code,
            message: error.message,
        }),
        ExecStreamLine::End(end) => Ok(Some(Ended {
            exit_code: Some(i64::from(end.exit_code)),
            killed: end.killed,
            overflow: end.stream_overflow,
        })),
    }
}

/// Copies one output chunk to its stream: text as `data`; bytes that are not UTF-8 as
/// `data_b64`, written out exactly.
async fn write_output<O, E>(
    output: api::ExecOutput,
    out: &mut O,
    err: &mut E,
) -> Result<(), ClientError>
where
    O: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    {
        let data = match output.data_b64 {
            Some(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| {
                    ClientError::Connect(format!("the service sent malformed base64 output: {e}"))
                })?,
            None => output.data.unwrap_or_default().into_bytes(),
        };
        let sink: &mut (dyn AsyncWrite + Unpin) = match output.stream {
            api::StreamName::Stderr => err,
            api::StreamName::Stdout => out,
        };
        sink.write_all(&data)
            .await
            .map_err(|e| ClientError::local("cannot write the output", e))?;
        sink.flush()
            .await
            .map_err(|e| ClientError::local("cannot write the output", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn binary_output_is_written_exactly() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for line in [
            r#"{"stream":"stdout","data":"caf"}"#,
            r#"{"stream":"stdout","data_b64":"w6n//g=="}"#,
        ] {
            handle_line(line.as_bytes(), &mut out, &mut err)
                .await
                .unwrap();
        }
        assert_eq!(out, b"caf\xc3\xa9\xff\xfe");
        let e = handle_line(
            br#"{"stream":"stdout","data_b64":"%%"}"#,
            &mut out,
            &mut err,
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("base64"), "{e}");
    }

    async fn feed(lines: &[&str]) -> (Vec<Option<Ended>>, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut ends = Vec::new();
        for l in lines {
            ends.push(handle_line(l.as_bytes(), &mut out, &mut err).await.unwrap());
        }
        (
            ends,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[tokio::test]
    async fn lines_route_output_and_end_the_run() {
        let (ends, out, err) = feed(&[
            r#"{"stream":"stdout","data":"a\n"}"#,
            r#"{"stream":"stderr","data":"oops"}"#,
            "",
            r#"{"future":"kind"}"#,
            r#"{"exit_code":3,"killed":false,"duration_ms":5,"truncated":false,"stream_overflow":false}"#,
        ])
        .await;
        assert_eq!((out.as_str(), err.as_str()), ("a\n", "oops"));
        assert_eq!(ends[..4], [None, None, None, None]);
        let ended = ends[4].clone().unwrap();
        assert_eq!(ended.status(), 3);
    }

    #[tokio::test]
    async fn an_error_line_is_the_services_error() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let e = handle_line(
            br#"{"error":{"code":"provider_unavailable","message":"engine gone"}}"#,
            &mut out,
            &mut err,
        )
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), "provider_unavailable (200): engine gone");
        let e = handle_line(b"{not json", &mut out, &mut err)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("malformed"), "{e}");
    }

    #[test]
    fn exit_statuses() {
        let ended = |exit_code, killed| Ended {
            exit_code,
            killed,
            overflow: false,
        };
        assert_eq!(ended(Some(0), false).status(), 0);
        assert_eq!(ended(Some(255), false).status(), 255);
        assert_eq!(ended(Some(-1), false).status(), 1);
        assert_eq!(ended(Some(300), false).status(), 1);
        assert_eq!(ended(None, false).status(), 1);
        assert_eq!(ended(Some(137), true).status(), TIMED_OUT);
    }
}
