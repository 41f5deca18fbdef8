//! A process's input: a bounded queue in front of its stdin pipe or PTY master.
//!
//! `SendInput` and `StreamInput` must not hang on a process that does not read its stdin, and
//! a client that floods input must not grow the agent's memory, so input is queued up to the
//! stdin buffer limit (`--stdin-buffer-bytes`) and written by one task per process; beyond
//! the limit a send is refused with `resource_exhausted` until the process reads.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::Notify;

use super::fdio::AsyncIo;

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Bytes>,
    queued: usize,
    /// CloseStdin was asked: close the pipe once the queue is written.
    close: bool,
    /// The writer stopped (closed, or the process stopped reading for good).
    stopped: Option<String>,
}

/// Why input was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    Full { capacity: usize },
    Closed(String),
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Input {
    state: Mutex<State>,
    wake: Notify,
    capacity: usize,
}

impl Input {
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Input {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            capacity,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `data` for the process.
    pub(crate) fn send(&self, data: Bytes) -> Result<(), Refused> {
        let mut s = self.lock();
        if let Some(why) = &s.stopped {
            return Err(Refused::Closed(why.clone()));
        }
        if s.close {
            return Err(Refused::Closed("stdin is closed".into()));
        }
        if s.queued + data.len() > self.capacity {
            return Err(Refused::Full {
                capacity: self.capacity,
            });
        }
        s.queued += data.len();
        s.queue.push_back(data);
        drop(s);
        self.wake.notify_one();
        Ok(())
    }

    /// Closes the input once what is queued has been written (the process then reads EOF).
    pub(crate) fn close(&self) {
        self.lock().close = true;
        self.wake.notify_one();
    }

    /// Whether input is still taken (not closed, and the writer has not stopped).
    pub(crate) fn is_open(&self) -> bool {
        let s = self.lock();
        !s.close && s.stopped.is_none()
    }

    /// Bytes queued and not yet written.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.lock().queued
    }

    /// Writes queued input to `io` until closed or the process stops reading. `io` is dropped
    /// on return, which closes a stdin pipe (a PTY master is shared with the reader, so it
    /// stays open).
    pub(crate) async fn run_writer(self: Arc<Self>, io: Arc<AsyncIo>) {
        loop {
            let wake = self.wake.notified();
            let next = {
                let mut s = self.lock();
                match s.queue.front().cloned() {
                    Some(chunk) => Some(chunk),
                    None if s.close => {
                        s.stopped = Some("stdin is closed".into());
                        return;
                    }
                    None => None,
                }
            };
            let Some(chunk) = next else {
                wake.await;
                continue;
            };
            if let Err(e) = io.write_all(&chunk).await {
                let mut s = self.lock();
                s.stopped = Some(format!("the process no longer reads its input: {e}"));
                s.queue.clear();
                s.queued = 0;
                return;
            }
            let mut s = self.lock();
            s.queue.pop_front();
            s.queued -= chunk.len();
        }
    }

    /// Marks the input as gone (the process exited).
    pub(crate) fn stop(&self, why: &str) {
        let mut s = self.lock();
        s.stopped.get_or_insert_with(|| why.to_owned());
        s.queue.clear();
        s.queued = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_bounded_and_closing_refuses_more() {
        let input = Input::new(4);
        input.send(Bytes::from_static(b"abc")).unwrap();
        assert_eq!(
            input.send(Bytes::from_static(b"de")),
            Err(Refused::Full { capacity: 4 })
        );
        input.send(Bytes::from_static(b"d")).unwrap();
        assert_eq!(input.queued(), 4);
        input.close();
        assert!(matches!(
            input.send(Bytes::from_static(b"x")),
            Err(Refused::Closed(_))
        ));
    }
}
