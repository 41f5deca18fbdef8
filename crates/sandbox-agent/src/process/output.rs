//! A process's output: a bounded ring of recent chunks that every attached stream reads at its
//! own pace, and from which a re-attaching client can replay what it missed.
//!
//! Offsets count output bytes of all streams together (stdout, stderr and pty, in the order
//! they were read), from 0 at the process's start. A client that has received `n` bytes of
//! data events asks to replay from `n` and gets the rest without gap or duplicate, as long as
//! the ring still holds it.
//!
//! Memory stays bounded: the ring keeps at most its capacity. A chunk is evicted only once
//! every attached reader has taken it, so a reader that falls behind holds the reading of the
//! process's pipe (and so the process, once the pipe fills) instead of losing output or
//! growing a queue, the same back-pressure envd applies. With no reader attached, the oldest
//! output is simply dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use sandbox_envd::process::process_event::EndEvent;
use tokio::sync::Notify;

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Stdout,
    Stderr,
    Pty,
}

#[derive(Debug)]
struct Chunk {
    offset: u64,
    kind: Kind,
    data: Bytes,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

#[derive(Debug, Default)]
struct State {
    chunks: VecDeque<Chunk>,
    retained: usize,
    /// Bytes produced so far (the offset of the next byte).
    end: u64,
    /// Attached readers: id to the offset each has taken up to.
    cursors: HashMap<u64, u64>,
    next_id: u64,
    finished: Option<EndEvent>,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Output {
    state: Mutex<State>,
    capacity: usize,
    produced: Notify,
    consumed: Notify,
}

/// What a reader gets next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    Data(Kind, Bytes),
    End(EndEvent),
    /// Nothing yet: wait for [`Output::changed`].
    Wait,
}

/// Where a new reader starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadFrom {
    /// With the next byte produced (envd's Connect: live events only).
    Live,
    /// At this offset, or at the oldest byte still held if that is later.
    Offset(u64),
}

/// A replay offset beyond what the process has produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BeyondEnd {
    pub(crate) end: u64,
}

impl Output {
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Output {
            state: Mutex::new(State::default()),
            capacity,
            produced: Notify::new(),
            consumed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent, so a poisoned lock is usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends a chunk, waiting while the ring is full of output an attached reader has not
    /// taken yet.
    pub(crate) async fn push(&self, kind: Kind, data: Bytes) {
        if data.is_empty() {
            return;
        }
        loop {
            let consumed = self.consumed.notified();
            tokio::pin!(consumed);
            consumed.as_mut().enable();
            if self.try_push(kind, &data) {
                self.produced.notify_waiters();
                return;
            }
            consumed.await;
        }
    }

    fn try_push(&self, kind: Kind, data: &Bytes) -> bool {
        let mut s = self.lock();
        let taken_by_all = s.cursors.values().min().copied().unwrap_or(u64::MAX);
        while s.retained + data.len() > self.capacity {
            match s.chunks.front() {
                Some(front) if front.end() <= taken_by_all => {
                    s.retained -= front.data.len();
                    s.chunks.pop_front();
                }
                Some(_) => return false,
                None => break,
            }
        }
        let offset = s.end;
        s.end += data.len() as u64;
        s.retained += data.len();
        s.chunks.push_back(Chunk {
            offset,
            kind,
            data: data.clone(),
        });
        true
    }

    /// Records how the process ended; readers get it after the last byte.
    pub(crate) fn finish(&self, end: EndEvent) {
        self.lock().finished = Some(end);
        self.produced.notify_waiters();
    }

    /// Bytes produced so far.
    pub(crate) fn end(&self) -> u64 {
        self.lock().end
    }

    /// The status text of the recorded end (`None` until the process's end is recorded).
    pub(crate) fn end_status(&self) -> Option<String> {
        self.lock().finished.as_ref().map(|e| e.status.clone())
    }

    /// Bytes the ring holds now.
    #[cfg(test)]
    pub(crate) fn retained(&self) -> usize {
        self.lock().retained
    }

    /// Attaches a reader.
    pub(crate) fn subscribe(self: &Arc<Self>, from: ReadFrom) -> Result<Cursor, BeyondEnd> {
        let mut s = self.lock();
        let oldest = s.chunks.front().map_or(s.end, |c| c.offset);
        let offset = match from {
            ReadFrom::Live => s.end,
            ReadFrom::Offset(n) if n > s.end => return Err(BeyondEnd { end: s.end }),
            ReadFrom::Offset(n) => n.max(oldest),
        };
        let id = s.next_id;
        s.next_id += 1;
        s.cursors.insert(id, offset);
        Ok(Cursor {
            output: Arc::clone(self),
            id,
            offset,
            start: offset,
        })
    }

    /// A future that resolves at the next change; create it (and `enable` it) before calling
    /// [`Cursor::next`] so no change is missed in between.
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.produced.notified()
    }
}

/// One attached reader; detaches on drop.
#[derive(Debug)]
pub(crate) struct Cursor {
    output: Arc<Output>,
    id: u64,
    offset: u64,
    start: u64,
}

impl Cursor {
    /// Where this reader started (a replay may start later than asked, when the ring no
    /// longer held the bytes asked for).
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    pub(crate) fn output(&self) -> &Arc<Output> {
        &self.output
    }

    /// Takes the next chunk (or the rest of one, after a replay offset inside it).
    pub(crate) fn next(&mut self) -> Next {
        let next = {
            let mut s = self.output.lock();
            let found = s.chunks.iter().find(|c| c.end() > self.offset).map(|c| {
                let skip = self.offset.saturating_sub(c.offset) as usize;
                (c.kind, c.data.slice(skip..), c.end())
            });
            match found {
                Some((kind, data, end)) => {
                    self.offset = end;
                    s.cursors.insert(self.id, end);
                    Next::Data(kind, data)
                }
                None => match &s.finished {
                    Some(end) if self.offset >= s.end => return Next::End(end.clone()),
                    _ => return Next::Wait,
                },
            }
        };
        self.output.consumed.notify_waiters();
        next
    }
}

impl Drop for Cursor {
    fn drop(&mut self) {
        self.output.lock().cursors.remove(&self.id);
        self.output.consumed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(c: &mut Cursor) -> Option<(Kind, Vec<u8>)> {
        match c.next() {
            Next::Data(k, b) => Some((k, b.to_vec())),
            _ => None,
        }
    }

    #[tokio::test]
    async fn readers_see_every_chunk_in_order_then_the_end() {
        let out = Output::new(64 * 1024);
        let mut c = out.subscribe(ReadFrom::Offset(0)).unwrap();
        out.push(Kind::Stdout, Bytes::from_static(b"ab")).await;
        out.push(Kind::Stderr, Bytes::from_static(b"cd")).await;
        assert_eq!(data(&mut c), Some((Kind::Stdout, b"ab".to_vec())));
        assert_eq!(data(&mut c), Some((Kind::Stderr, b"cd".to_vec())));
        assert_eq!(c.next(), Next::Wait);
        out.finish(EndEvent {
            exited: true,
            ..Default::default()
        });
        assert!(matches!(c.next(), Next::End(e) if e.exited));
        // A live reader attached after the end gets the end at once; a replaying one the data.
        let mut live = out.subscribe(ReadFrom::Live).unwrap();
        assert!(matches!(live.next(), Next::End(_)));
        let mut replay = out.subscribe(ReadFrom::Offset(3)).unwrap();
        assert_eq!(replay.start(), 3);
        assert_eq!(data(&mut replay), Some((Kind::Stderr, b"d".to_vec())));
        assert_eq!(
            out.subscribe(ReadFrom::Offset(5)).unwrap_err(),
            BeyondEnd { end: 4 }
        );
    }

    #[tokio::test]
    async fn without_readers_the_ring_drops_the_oldest_and_stays_bounded() {
        let out = Output::new(10);
        for i in 0..100u8 {
            out.push(Kind::Stdout, Bytes::from(vec![i; 3])).await;
        }
        assert!(out.retained() <= 10);
        assert_eq!(out.end(), 300);
        // A replay from the start begins at the oldest byte still held.
        let mut c = out.subscribe(ReadFrom::Offset(0)).unwrap();
        assert_eq!(c.start(), 291);
        assert_eq!(data(&mut c), Some((Kind::Stdout, vec![97; 3])));
    }

    #[tokio::test]
    async fn a_slow_reader_holds_the_producer_instead_of_losing_output() {
        let out = Output::new(4);
        let mut c = out.subscribe(ReadFrom::Offset(0)).unwrap();
        out.push(Kind::Stdout, Bytes::from_static(b"1234")).await;
        let producer = {
            let out = Arc::clone(&out);
            tokio::spawn(async move { out.push(Kind::Stdout, Bytes::from_static(b"56")).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!producer.is_finished(), "the ring is full of unread output");
        assert_eq!(data(&mut c), Some((Kind::Stdout, b"1234".to_vec())));
        tokio::time::timeout(std::time::Duration::from_secs(5), producer)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(data(&mut c), Some((Kind::Stdout, b"56".to_vec())));
        // Detaching releases the producer too.
        let blocked = {
            let out = Arc::clone(&out);
            tokio::spawn(async move {
                out.push(Kind::Stdout, Bytes::from_static(b"abcd")).await;
                out.push(Kind::Stdout, Bytes::from_static(b"efgh")).await;
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(c);
        tokio::time::timeout(std::time::Duration::from_secs(5), blocked)
            .await
            .unwrap()
            .unwrap();
        assert!(out.retained() <= 4);
    }
}
