//! Typed calls of envd's process and filesystem services.

use hyper_util::client::legacy::connect::Connect;
use sandbox_core::Error;
use sandbox_envd::filesystem::{self as fs, rpc as fs_rpc};
use sandbox_envd::process::{self as ps, rpc as ps_rpc};

use super::call::{CallOptions, ClientStream, EnvdClient};

/// The sandbox agent's request and answer header of `Process/Connect` that replays output
/// from a byte offset ([`EnvdClient::connect_from`]); a plain envd ignores it.
pub const REPLAY_OFFSET_HEADER: hyper::header::HeaderName =
    hyper::header::HeaderName::from_static("sandbox-replay-offset");
use super::stream::ServerStream;
use crate::transported;

impl<C> EnvdClient<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// Starts a process and streams its events: `start` (with the pid), `data`, `keepalive`s
    /// and one `end`. The call's deadline (if any) also bounds the process's life in envd.
    /// Dropping the stream detaches from the process without killing it.
    pub async fn start(
        &self,
        request: &ps::StartRequest,
        options: CallOptions,
    ) -> Result<ServerStream<ps::StartResponse>, Error> {
        self.server_stream::<ps_rpc::Start>(request, options).await
    }

    /// Attaches to a running process: `start`, then live events (no replay), then `end`.
    pub async fn connect(
        &self,
        process: ps::ProcessSelector,
        options: CallOptions,
    ) -> Result<ServerStream<ps::ConnectResponse>, Error> {
        let request = ps::ConnectRequest {
            process: Some(process),
        };
        self.server_stream::<ps_rpc::Connect>(&request, options)
            .await
    }

    /// [`connect`](Self::connect) with the sandbox agent's replay extension: from `from`
    /// (`Some`), the agent replays the process's output from that byte offset (all streams
    /// counted together) before going on live. Answers the stream and the offset the replay
    /// really starts at, from the answer's [`REPLAY_OFFSET_HEADER`]: later than asked when the
    /// agent's ring no longer holds those bytes, `None` when no replay was asked or the server
    /// does not know the extension (a plain envd). An offset past the output is `out_of_range`
    /// (`invalid_request`).
    pub async fn connect_from(
        &self,
        process: ps::ProcessSelector,
        from: Option<u64>,
        options: CallOptions,
    ) -> Result<(ServerStream<ps::ConnectResponse>, Option<u64>), Error> {
        let request = ps::ConnectRequest {
            process: Some(process),
        };
        let mut extra = hyper::HeaderMap::new();
        if let Some(offset) = from {
            extra.insert(
                REPLAY_OFFSET_HEADER,
                hyper::header::HeaderValue::from(offset),
            );
        }
        let (stream, headers) = self
            .server_stream_with_headers::<ps_rpc::Connect>(&request, options, extra)
            .await?;
        let start = match (from, headers.get(REPLAY_OFFSET_HEADER)) {
            (Some(_), Some(value)) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| {
                        self.tag(transported(Error::internal(
                            ps::method::CONNECT.operation,
                            format!(
                                "the answer's {REPLAY_OFFSET_HEADER} {value:?} is not an offset"
                            ),
                        )))
                    })?,
            ),
            _ => None,
        };
        Ok((stream, start))
    }

    /// The live processes.
    pub async fn list(&self, options: CallOptions) -> Result<Vec<ps::ProcessInfo>, Error> {
        let answer = self
            .unary::<ps_rpc::List>(&ps::ListRequest {}, options)
            .await?;
        Ok(answer.processes)
    }

    /// Writes one chunk to a process's stdin or PTY.
    pub async fn send_input(
        &self,
        process: ps::ProcessSelector,
        input: ps::ProcessInput,
        options: CallOptions,
    ) -> Result<(), Error> {
        let request = ps::SendInputRequest {
            process: Some(process),
            input: Some(input),
        };
        self.unary::<ps_rpc::SendInput>(&request, options).await?;
        Ok(())
    }

    /// Opens an input stream to a process (its first message, naming the process, is sent
    /// here).
    pub async fn stream_input(
        &self,
        process: ps::ProcessSelector,
        options: CallOptions,
    ) -> Result<InputStream, Error> {
        use ps::stream_input_request::{Event, StartEvent};
        let mut stream = self.client_stream::<ps_rpc::StreamInput>(options)?;
        stream
            .send(&ps::StreamInputRequest {
                event: Some(Event::Start(StartEvent {
                    process: Some(process),
                })),
            })
            .await?;
        Ok(InputStream { stream })
    }

    /// Closes a process's stdin (it reads end of file).
    pub async fn close_stdin(
        &self,
        process: ps::ProcessSelector,
        options: CallOptions,
    ) -> Result<(), Error> {
        let request = ps::CloseStdinRequest {
            process: Some(process),
        };
        self.unary::<ps_rpc::CloseStdin>(&request, options).await?;
        Ok(())
    }

    /// Sends SIGTERM or SIGKILL (envd refuses other signals as `unsupported`).
    pub async fn send_signal(
        &self,
        process: ps::ProcessSelector,
        signal: ps::Signal,
        options: CallOptions,
    ) -> Result<(), Error> {
        let request = ps::SendSignalRequest {
            process: Some(process),
            signal,
        };
        self.unary::<ps_rpc::SendSignal>(&request, options).await?;
        Ok(())
    }

    /// Resizes a process's pseudo-terminal.
    pub async fn resize_pty(
        &self,
        process: ps::ProcessSelector,
        cols: u32,
        rows: u32,
        options: CallOptions,
    ) -> Result<(), Error> {
        let request = ps::UpdateRequest {
            process: Some(process),
            pty: Some(ps::Pty {
                size: Some(ps::pty::Size { cols, rows }),
            }),
        };
        self.unary::<ps_rpc::Update>(&request, options).await?;
        Ok(())
    }

    /// Describes one path.
    pub async fn stat(&self, path: &str, options: CallOptions) -> Result<fs::EntryInfo, Error> {
        let request = fs::StatRequest {
            path: path.to_owned(),
        };
        let answer = self.unary::<fs_rpc::Stat>(&request, options).await?;
        self.entry(answer.entry, fs::method::STAT)
    }

    /// Creates a directory and its parents; an existing directory is `conflict`.
    pub async fn make_dir(&self, path: &str, options: CallOptions) -> Result<fs::EntryInfo, Error> {
        let request = fs::MakeDirRequest {
            path: path.to_owned(),
        };
        let answer = self.unary::<fs_rpc::MakeDir>(&request, options).await?;
        self.entry(answer.entry, fs::method::MAKE_DIR)
    }

    /// Renames `source` to `destination` (creating the destination's parent).
    pub async fn rename(
        &self,
        source: &str,
        destination: &str,
        options: CallOptions,
    ) -> Result<fs::EntryInfo, Error> {
        let request = fs::MoveRequest {
            source: source.to_owned(),
            destination: destination.to_owned(),
        };
        let answer = self.unary::<fs_rpc::Move>(&request, options).await?;
        self.entry(answer.entry, fs::method::MOVE)
    }

    /// A directory's descendants up to `depth` levels (0 counts as 1).
    pub async fn list_dir(
        &self,
        path: &str,
        depth: u32,
        options: CallOptions,
    ) -> Result<Vec<fs::EntryInfo>, Error> {
        let request = fs::ListDirRequest {
            path: path.to_owned(),
            depth,
        };
        Ok(self
            .unary::<fs_rpc::ListDir>(&request, options)
            .await?
            .entries)
    }

    /// Removes a path recursively; a missing path is not an error.
    pub async fn remove(&self, path: &str, options: CallOptions) -> Result<(), Error> {
        let request = fs::RemoveRequest {
            path: path.to_owned(),
        };
        self.unary::<fs_rpc::Remove>(&request, options).await?;
        Ok(())
    }

    /// Streams a directory's changes: `start`, then `filesystem` events and `keepalive`s.
    pub async fn watch_dir(
        &self,
        request: &fs::WatchDirRequest,
        options: CallOptions,
    ) -> Result<ServerStream<fs::WatchDirResponse>, Error> {
        self.server_stream::<fs_rpc::WatchDir>(request, options)
            .await
    }

    /// Starts a polled watcher of a directory (the alternative to [`Self::watch_dir`]
    /// (Self::watch_dir) for callers that cannot hold a stream open); returns its id.
    pub async fn create_watcher(
        &self,
        request: &fs::CreateWatcherRequest,
        options: CallOptions,
    ) -> Result<String, Error> {
        Ok(self
            .unary::<fs_rpc::CreateWatcher>(request, options)
            .await?
            .watcher_id)
    }

    /// The events a polled watcher saw since the last call (drained).
    pub async fn watcher_events(
        &self,
        watcher_id: &str,
        options: CallOptions,
    ) -> Result<Vec<fs::FilesystemEvent>, Error> {
        let request = fs::GetWatcherEventsRequest {
            watcher_id: watcher_id.to_owned(),
        };
        Ok(self
            .unary::<fs_rpc::GetWatcherEvents>(&request, options)
            .await?
            .events)
    }

    /// Stops a polled watcher.
    pub async fn remove_watcher(
        &self,
        watcher_id: &str,
        options: CallOptions,
    ) -> Result<(), Error> {
        let request = fs::RemoveWatcherRequest {
            watcher_id: watcher_id.to_owned(),
        };
        self.unary::<fs_rpc::RemoveWatcher>(&request, options)
            .await?;
        Ok(())
    }

    fn entry(
        &self,
        entry: Option<fs::EntryInfo>,
        method: sandbox_envd::Method,
    ) -> Result<fs::EntryInfo, Error> {
        entry.ok_or_else(|| {
            self.tag(transported(Error::internal(
                method.operation,
                "envd answered without the entry",
            )))
        })
    }
}

/// Input flowing into a process (see [`EnvdClient::stream_input`]).
#[derive(Debug)]
pub struct InputStream {
    stream: ClientStream<ps_rpc::StreamInput>,
}

impl InputStream {
    /// Sends one chunk of input.
    pub async fn send(&mut self, input: ps::ProcessInput) -> Result<(), Error> {
        use ps::stream_input_request::{DataEvent, Event};
        self.stream
            .send(&ps::StreamInputRequest {
                event: Some(Event::Data(DataEvent { input: Some(input) })),
            })
            .await
    }

    /// Sends a keepalive, for an input stream that stays quiet a long time behind proxies
    /// that close idle requests.
    pub async fn keepalive(&mut self) -> Result<(), Error> {
        use ps::stream_input_request::{Event, KeepAlive};
        self.stream
            .send(&ps::StreamInputRequest {
                event: Some(Event::Keepalive(KeepAlive {})),
            })
            .await
    }

    /// Ends the input stream (the process's stdin stays open; see
    /// [`EnvdClient::close_stdin`]) and waits for envd's acknowledgement.
    pub async fn finish(self) -> Result<(), Error> {
        self.stream.finish().await?;
        Ok(())
    }
}
