//! `sandbox exec --background`, `sandbox ps`, `sandbox attach`, `sandbox kill` and
//! `sandbox watch`: background processes and directory watches through the service's
//! process and watch routes.
//!
//! `attach` copies a process's output to stdout and stderr as it arrives and exits with the
//! process's status (its exit code; 128 + the signal number when a signal ended it). A
//! dropped stream is an error that names the offset to resume from (`--from`), and a gap in
//! the replay is reported on stderr with the bytes it lost.

use base64::Engine as _;
use http_body_util::BodyExt;
use hyper::Method;
use hyper::body::{Bytes, Incoming};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::{Client, ClientError, full};
use crate::api::{self, Process, ProcessList, ProcessStreamLine, WatchStreamLine};

/// The longest NDJSON line accepted (an output chunk or an event is far smaller).
const MAX_LINE: usize = 16 * 1024 * 1024;

/// Starts `request` in the background in `session`.
pub async fn start(
    client: &Client,
    session: &str,
    request: &api::ProcessStartRequest,
) -> Result<Process, ClientError> {
    let url = client.session_url(session, &["processes"], &[]);
    client.json(Method::POST, &url, Some(request)).await
}

/// The background processes of `session`.
pub async fn list(client: &Client, session: &str) -> Result<Vec<Process>, ClientError> {
    let url = client.session_url(session, &["processes"], &[]);
    let list: ProcessList = client.json::<(), _>(Method::GET, &url, None).await?;
    Ok(list.processes)
}

/// Sends `signal` to the process `process` (a pid or a tag) of `session`.
pub async fn kill(
    client: &Client,
    session: &str,
    process: &str,
    signal: &str,
) -> Result<(), ClientError> {
    let url = client.session_url(session, &["processes", process, "signal"], &[]);
    let body = api::SignalRequest {
        signal: signal.to_owned(),
    };
    let _: serde_json::Value = client.json(Method::POST, &url, Some(&body)).await?;
    Ok(())
}

/// One line per process: pid, tag, state, output bytes, argv (like `ps`).
pub fn render(processes: &[Process]) -> String {
    let mut rows = vec![[
        "PID".to_owned(),
        "TAG".to_owned(),
        "STATE".to_owned(),
        "OUTPUT".to_owned(),
        "COMMAND".to_owned(),
    ]];
    for p in processes {
        let state = match (p.state, p.exit_code, p.signal.as_deref()) {
            (api::ProcessState::Running, _, _) => "running".to_owned(),
            (api::ProcessState::Exited, Some(code), _) => format!("exited({code})"),
            (api::ProcessState::Exited, None, Some(signal)) => format!("killed({signal})"),
            (api::ProcessState::Exited, None, None) => "exited".to_owned(),
        };
        rows.push([
            p.pid.to_string(),
            p.tag.clone().unwrap_or_else(|| "-".to_owned()),
            state,
            p.output_bytes.to_string(),
            p.argv.join(" "),
        ]);
    }
    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let widths = [width(0), width(1), width(2), width(3)];
    let mut out = String::new();
    for r in &rows {
        out.push_str(&format!(
            "{:>w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {}\n",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
        ));
    }
    out
}

/// How an attach ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
}

impl Exited {
    /// The status this CLI exits with: the process's exit code (0–255), 128 + the signal's
    /// number when a signal ended it (as a shell reports it), 1 otherwise.
    pub fn status(&self) -> u8 {
        if let Some(code) = self.exit_code {
            return u8::try_from(code).unwrap_or(1);
        }
        match self
            .signal
            .as_deref()
            .and_then(|s| sandbox_core::Signal::parse(s).ok())
        {
            Some(signal) => u8::try_from(128 + signal.number()).unwrap_or(1),
            None => 1,
        }
    }
}

/// Attaches to `process` of `session` from `from` (`None`: live output only), copying its
/// output to `out` and `err` and reporting gaps on `err`.
pub async fn attach<O, E>(
    client: &Client,
    session: &str,
    process: &str,
    from: Option<u64>,
    out: &mut O,
    err: &mut E,
) -> Result<Exited, ClientError>
where
    O: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    let from_text = from.map(|f| f.to_string());
    let query: Vec<(&str, &str)> = from_text.iter().map(|f| ("from", f.as_str())).collect();
    let url = client.session_url(session, &["processes", process, "attach"], &query);
    let response = client
        .send(Method::GET, &url, None, full(Bytes::new()))
        .await?;
    let mut attach = Attach {
        next: from.unwrap_or(0),
        process: process.to_owned(),
    };
    let mut lines = LineReader::new(response.into_body());
    while let Some(line) = lines.next().await.map_err(|e| attach.broken(&e))? {
        if let Some(exited) = attach.handle(&line, out, err).await? {
            return Ok(exited);
        }
    }
    Err(attach.broken("the stream ended without the process's exit"))
}

/// An attach in progress: where to resume.
struct Attach {
    next: u64,
    process: String,
}

impl Attach {
    fn broken(&self, why: &str) -> ClientError {
        ClientError::Connect(format!(
            "{why}; the process may still run: resume with `sandbox attach --from {} SESSION {}`",
            self.next, self.process
        ))
    }

    async fn handle<O, E>(
        &mut self,
        line: &[u8],
        out: &mut O,
        err: &mut E,
    ) -> Result<Option<Exited>, ClientError>
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
        let Ok(line) = serde_json::from_value::<ProcessStreamLine>(value) else {
            return Ok(None);
        };
        match line {
            ProcessStreamLine::Data {
                stream,
                offset,
                data,
                data_b64,
            } => {
                let bytes = match data_b64 {
                    Some(b64) => base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .map_err(|e| {
                            ClientError::Connect(format!(
                                "the service sent malformed base64 output: {e}"
                            ))
                        })?,
                    None => data.unwrap_or_default().into_bytes(),
                };
                self.next = offset.saturating_add(bytes.len() as u64);
                let sink: &mut (dyn AsyncWrite + Unpin) = match stream {
                    api::StreamName::Stderr => err,
                    api::StreamName::Stdout => out,
                };
                write(sink, &bytes).await?;
                Ok(None)
            }
            ProcessStreamLine::Gap { from, to } => {
                self.next = to;
                let note = format!(
                    "sandbox: output bytes {from}..{to} are no longer kept; continuing from {to}\n"
                );
                write(err, note.as_bytes()).await?;
                Ok(None)
            }
            ProcessStreamLine::Exited {
                exit_code, signal, ..
            } => Ok(Some(Exited { exit_code, signal })),
            ProcessStreamLine::Error {
                offset,
                code,
                message,
            } => {
                self.next = offset;
                Err(ClientError::Api {
                    status: 200,
                    code,
                    message: format!(
                        "{message}; the process may still run: resume with `sandbox attach --from {offset} SESSION {}`",
                        self.process
                    ),
                })
            }
        }
    }
}

async fn write(sink: &mut (dyn AsyncWrite + Unpin), bytes: &[u8]) -> Result<(), ClientError> {
    sink.write_all(bytes)
        .await
        .map_err(|e| ClientError::local("cannot write the output", e))?;
    sink.flush()
        .await
        .map_err(|e| ClientError::local("cannot write the output", e))
}

/// Watches `path` of `session`, writing one line per change to `out` (`create /workspace/a`,
/// or the service's JSON line with `json`). Returns once the watch ended by itself; a failed
/// watch (`watch_overflow` among them) is the service's error.
pub async fn watch<O>(
    client: &Client,
    session: &str,
    path: &str,
    recursive: bool,
    json: bool,
    out: &mut O,
) -> Result<(), ClientError>
where
    O: AsyncWrite + Unpin,
{
    let recursive = if recursive { "true" } else { "false" };
    let url = client.session_url(
        session,
        &["watch"],
        &[("path", path), ("recursive", recursive)],
    );
    let response = client
        .send(Method::GET, &url, None, full(Bytes::new()))
        .await?;
    let mut lines = LineReader::new(response.into_body());
    while let Some(line) = lines
        .next()
        .await
        .map_err(|e| ClientError::Connect(format!("the watch broke off: {e}")))?
    {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let value: serde_json::Value = serde_json::from_slice(&line)
            .map_err(|e| ClientError::Connect(format!("the service sent a malformed line: {e}")))?;
        let Ok(parsed) = serde_json::from_value::<WatchStreamLine>(value.clone()) else {
            continue;
        };
        match parsed {
            WatchStreamLine::Error { code, message } => {
                return Err(ClientError::Api {
                    status: 200,
                    code,
                    message,
                });
            }
            WatchStreamLine::Ended => return Ok(()),
            WatchStreamLine::Started { .. } if !json => {}
            WatchStreamLine::Event { kind, path } if !json => {
                let kind = serde_json::to_value(kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                write(out, format!("{kind} {path}\n").as_bytes()).await?;
            }
            _ => write(out, format!("{value}\n").as_bytes()).await?,
        }
    }
    Err(ClientError::Connect(
        "the watch stream ended without saying why".to_owned(),
    ))
}

/// Newline-terminated lines of a response body, each at most [`MAX_LINE`] bytes.
struct LineReader {
    body: Incoming,
    pending: Vec<u8>,
}

impl LineReader {
    fn new(body: Incoming) -> Self {
        LineReader {
            body,
            pending: Vec::new(),
        }
    }

    /// The next line without its newline; `None` at the end of the body.
    async fn next(&mut self) -> Result<Option<Vec<u8>>, String> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=end).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.pending.len() > MAX_LINE {
                return Err("the service sent an over-long line".to_owned());
            }
            match self.body.frame().await {
                None if self.pending.is_empty() => return Ok(None),
                None => return Ok(Some(std::mem::take(&mut self.pending))),
                Some(Err(e)) => return Err(format!("the stream broke off: {e}")),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.pending.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn feed(lines: &[&str]) -> (Result<Option<Exited>, ClientError>, String, Vec<u8>, u64) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut attach = Attach {
            next: 0,
            process: "job".to_owned(),
        };
        let mut last = Ok(None);
        for l in lines {
            last = attach.handle(l.as_bytes(), &mut out, &mut err).await;
            if !matches!(last, Ok(None)) {
                break;
            }
        }
        (last, String::from_utf8(out).unwrap(), err, attach.next)
    }

    #[tokio::test]
    async fn output_gaps_and_the_exit_are_handled_in_order() {
        let (end, out, err, next) = feed(&[
            r#"{"type":"gap","from":0,"to":10}"#,
            r#"{"type":"data","stream":"stdout","offset":10,"data":"ab"}"#,
            r#"{"type":"data","stream":"stderr","offset":12,"data_b64":"/w=="}"#,
            r#"{"type":"future"}"#,
            r#"{"type":"exited","offset":13,"signal":"KILL"}"#,
        ])
        .await;
        let end = end.unwrap().unwrap();
        assert_eq!(end.status(), 128 + 9);
        assert_eq!(out, "ab");
        // The gap is reported, then the stderr byte arrives exactly.
        let text = String::from_utf8_lossy(&err);
        assert!(text.contains("bytes 0..10"), "{text}");
        assert_eq!(err.last(), Some(&0xff));
        assert_eq!(next, 13);
    }

    #[tokio::test]
    async fn an_error_line_names_the_offset_to_resume_from() {
        let (end, _, _, next) = feed(&[
            r#"{"type":"data","stream":"stdout","offset":0,"data":"abc"}"#,
            r#"{"type":"error","offset":3,"code":"provider_unavailable","message":"gone"}"#,
        ])
        .await;
        let e = end.unwrap_err().to_string();
        assert!(e.contains("--from 3"), "{e}");
        assert!(e.starts_with("provider_unavailable"), "{e}");
        assert_eq!(next, 3);
    }

    #[test]
    fn exit_statuses_follow_the_shell() {
        let exited = |exit_code, signal: Option<&str>| Exited {
            exit_code,
            signal: signal.map(str::to_owned),
        };
        assert_eq!(exited(Some(0), None).status(), 0);
        assert_eq!(exited(Some(3), None).status(), 3);
        assert_eq!(exited(Some(-1), None).status(), 1);
        assert_eq!(exited(None, Some("TERM")).status(), 143);
        assert_eq!(exited(None, Some("BOGUS")).status(), 1);
        assert_eq!(exited(None, None).status(), 1);
    }

    #[test]
    fn processes_render_as_a_table() {
        let processes: Vec<Process> = serde_json::from_str(
            r#"[{"pid":1001,"tag":"build","argv":["make","-j4"],"state":"running","output_bytes":12,"ring_bytes":65536},
                {"pid":7,"argv":["sleep","1"],"state":"exited","signal":"KILL","output_bytes":0,"ring_bytes":65536},
                {"pid":8,"argv":["false"],"state":"exited","exit_code":1,"output_bytes":0,"ring_bytes":65536}]"#,
        )
        .unwrap();
        assert_eq!(
            render(&processes),
            concat!(
                " PID  TAG    STATE         OUTPUT  COMMAND\n",
                "1001  build  running           12  make -j4\n",
                "   7  -      killed(KILL)       0  sleep 1\n",
                "   8  -      exited(1)          0  false\n",
            )
        );
    }
}
