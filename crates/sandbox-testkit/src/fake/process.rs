//! The fake's background processes: its portable argv vocabulary (`fake::exec`) run as tasks,
//! with a replay ring, stdin and signals.
//!
//! What it models and what it does not:
//! - Output goes into a ring of [`RING_BYTES`]; attaches read the ring at their own cursor, so
//!   a slow reader costs no queue and gets a `Gap` when the ring moved past it.
//! - Stdin kept open feeds a bare `cat` chunk by chunk (it echoes what it reads, as the real
//!   program does). Every other program in the vocabulary reads its stdin whole, so it sees
//!   its input once stdin is closed, and only then runs.
//! - A signal ends the process whatever the signal (the vocabulary installs no handlers, and
//!   every signal's default action the calls send is to terminate): its task is aborted and
//!   it is listed as ended by that signal.
//! - Processes die with their sandbox (the table aborts them when dropped).
//! - A sandbox runs at most its cap of processes at once ([`PROCESS_CAP`] unless the builder
//!   sets another); a start past it is `process_limit`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use sandbox_core::process::errors;
use sandbox_core::{
    Error, Operation, OutputHook, OutputStream, ProcessEvent, ProcessInfo, ProcessOutput,
    ProcessSelector, ProcessStatus, ProcessTag, Signal,
};
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;

use super::exec::{self, Output, ProcessEnv};

/// Output bytes each process keeps for replay.
pub const RING_BYTES: u64 = 64 * 1024;

/// The most background processes a sandbox runs at once by default (as Docker's agent plane
/// allows by default); a start past the cap is `process_limit`.
pub const PROCESS_CAP: usize = 64;

/// Ended processes a sandbox remembers (the oldest are forgotten first).
pub const REMEMBERED_EXITED: usize = 64;

/// Stdin chunks queued for a process that has not read them (a full queue makes `send_input`
/// wait: backpressure, not growth).
const STDIN_QUEUE: usize = 16;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
struct Chunk {
    stream: OutputStream,
    offset: u64,
    data: Vec<u8>,
}

#[derive(Debug)]
struct ProcState {
    ring: VecDeque<Chunk>,
    ring_len: u64,
    /// Offset of the first byte still in the ring.
    ring_start: u64,
    produced: u64,
    status: ProcessStatus,
    stdin: Option<mpsc::Sender<Vec<u8>>>,
    task: Option<AbortHandle>,
}

/// One background process.
#[derive(Debug)]
pub(crate) struct Proc {
    pid: u32,
    tag: Option<ProcessTag>,
    argv: Vec<String>,
    state: Mutex<ProcState>,
    /// Bumped after every change of `state`, so attaches wake without a queue.
    changed: watch::Sender<()>,
}

impl Proc {
    fn push(&self, stream: OutputStream, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        {
            let mut st = lock(&self.state);
            if !st.status.is_running() {
                return;
            }
            let offset = st.produced;
            let len = bytes.len() as u64;
            st.produced += len;
            st.ring_len += len;
            st.ring.push_back(Chunk {
                stream,
                offset,
                data: bytes.to_vec(),
            });
            while st.ring_len > RING_BYTES {
                let excess = st.ring_len - RING_BYTES;
                let Some(front) = st.ring.front_mut() else {
                    break;
                };
                let front_len = front.data.len() as u64;
                if front_len <= excess {
                    st.ring.pop_front();
                    st.ring_len -= front_len;
                } else {
                    let cut = usize::try_from(excess).unwrap_or(front.data.len());
                    front.data.drain(..cut);
                    front.offset += excess;
                    st.ring_len -= excess;
                }
            }
            st.ring_start = st.ring.front().map_or(st.produced, |c| c.offset);
        }
        self.changed.send_replace(());
    }

    /// Ends the process with `status` unless it already ended; false when it had.
    fn finish(&self, status: ProcessStatus) -> bool {
        let task = {
            let mut st = lock(&self.state);
            if !st.status.is_running() {
                return false;
            }
            st.status = status;
            st.stdin = None;
            st.task.take()
        };
        if let Some(task) = task {
            task.abort();
        }
        self.changed.send_replace(());
        true
    }

    pub(crate) fn info(&self) -> ProcessInfo {
        let st = lock(&self.state);
        ProcessInfo {
            pid: self.pid,
            tag: self.tag.clone(),
            argv: self.argv.clone(),
            status: st.status,
            output_bytes: st.produced,
            ring_bytes: RING_BYTES,
        }
    }

    fn is_running(&self) -> bool {
        lock(&self.state).status.is_running()
    }
}

/// A sandbox's background processes.
#[derive(Debug, Default)]
pub(crate) struct ProcTable {
    procs: BTreeMap<u32, Arc<Proc>>,
    next_pid: u32,
}

impl Drop for ProcTable {
    fn drop(&mut self) {
        for proc in self.procs.values() {
            proc.finish(ProcessStatus::Exited {
                exit_code: None,
                signal: Some(Signal::Kill),
            });
        }
    }
}

impl ProcTable {
    /// The process `target` names: the pid's, or the running holder of the tag, else the most
    /// recent ended one with it.
    pub(crate) fn find(&self, op: Operation, target: &ProcessSelector) -> Result<Arc<Proc>, Error> {
        let found = match target {
            ProcessSelector::Pid(pid) => self.procs.get(pid).cloned(),
            ProcessSelector::Tag(tag) => {
                let tagged = || self.procs.values().filter(|p| p.tag.as_ref() == Some(tag));
                tagged()
                    .find(|p| p.is_running())
                    .or_else(|| tagged().next_back())
                    .cloned()
            }
        };
        found.ok_or_else(|| errors::not_found(op, target))
    }

    pub(crate) fn list(&self) -> Vec<ProcessInfo> {
        self.procs.values().map(|p| p.info()).collect()
    }

    /// Starts `process` in the background (on the current runtime).
    pub(crate) fn start(
        &mut self,
        tag: Option<ProcessTag>,
        process: ProcessEnv,
        keep_stdin: bool,
        cap: usize,
    ) -> Result<ProcessInfo, Error> {
        if self.procs.values().filter(|p| p.is_running()).count() >= cap {
            return Err(errors::process_limit(cap));
        }
        if let Some(tag) = &tag
            && self
                .procs
                .values()
                .any(|p| p.tag.as_ref() == Some(tag) && p.is_running())
        {
            return Err(errors::tag_in_use(tag));
        }
        self.forget_oldest_exited();
        self.next_pid = self.next_pid.max(1000) + 1;
        let pid = self.next_pid;
        let (stdin_tx, stdin_rx) = if keep_stdin {
            let (tx, rx) = mpsc::channel::<Vec<u8>>(STDIN_QUEUE);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let proc = Arc::new(Proc {
            pid,
            tag,
            argv: process.argv.clone(),
            state: Mutex::new(ProcState {
                ring: VecDeque::new(),
                ring_len: 0,
                ring_start: 0,
                produced: 0,
                status: ProcessStatus::Running,
                stdin: stdin_tx,
                task: None,
            }),
            changed: watch::channel(()).0,
        });
        let running = proc.clone();
        let task = tokio::spawn(async move {
            let code = run(&running, process, stdin_rx).await;
            running.finish(ProcessStatus::Exited {
                exit_code: Some(code),
                signal: None,
            });
        });
        // The task may have ended already (a short program); then `finish` ran first and the
        // handle is not needed.
        {
            let mut st = lock(&proc.state);
            if st.status.is_running() {
                st.task = Some(task.abort_handle());
            }
        }
        let info = proc.info();
        self.procs.insert(pid, proc);
        Ok(info)
    }

    fn forget_oldest_exited(&mut self) {
        let exited: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| !p.is_running())
            .map(|(pid, _)| *pid)
            .collect();
        let excess = exited.len().saturating_sub(REMEMBERED_EXITED - 1);
        for pid in exited.into_iter().take(excess) {
            self.procs.remove(&pid);
        }
    }
}

async fn run(
    proc: &Arc<Proc>,
    mut process: ProcessEnv,
    stdin: Option<mpsc::Receiver<Vec<u8>>>,
) -> i32 {
    let sink = proc.clone();
    let hook = OutputHook::new(move |stream, bytes| sink.push(stream, bytes));
    if let Some(mut stdin) = stdin {
        if process.argv == ["cat"] {
            while let Some(chunk) = stdin.recv().await {
                hook.emit(OutputStream::Stdout, &chunk);
            }
            return 0;
        }
        let mut all = Vec::new();
        while let Some(chunk) = stdin.recv().await {
            all.extend_from_slice(&chunk);
        }
        process.stdin = all;
    }
    exec::run(process, Arc::new(Mutex::new(Output::new(Some(hook))))).await
}

/// Writes `data` to the process's stdin, waiting while its queue is full.
pub(crate) async fn send_input(
    proc: &Proc,
    target: &ProcessSelector,
    data: &[u8],
) -> Result<(), Error> {
    let op = Operation::SEND_INPUT;
    let tx = {
        let st = lock(&proc.state);
        if !st.status.is_running() {
            return Err(errors::exited(op, target));
        }
        st.stdin
            .clone()
            .ok_or_else(|| errors::stdin_closed(op, target))?
    };
    if data.is_empty() {
        return Ok(());
    }
    tx.send(data.to_vec())
        .await
        .map_err(|_| errors::exited(op, target))
}

/// Closes the process's stdin (idempotent while it runs).
pub(crate) fn close_stdin(proc: &Proc, target: &ProcessSelector) -> Result<(), Error> {
    let mut st = lock(&proc.state);
    if !st.status.is_running() {
        return Err(errors::exited(Operation::CLOSE_STDIN, target));
    }
    st.stdin = None;
    Ok(())
}

/// Ends the process by `signal`.
pub(crate) fn signal(proc: &Proc, target: &ProcessSelector, signal: Signal) -> Result<(), Error> {
    let ended = proc.finish(ProcessStatus::Exited {
        exit_code: None,
        signal: Some(signal),
    });
    if ended {
        Ok(())
    } else {
        Err(errors::exited(Operation::SIGNAL_PROCESS, target))
    }
}

/// An attach: a cursor into the process's ring.
#[derive(Debug)]
pub(crate) struct Attach {
    proc: Arc<Proc>,
    cursor: u64,
    changed: watch::Receiver<()>,
    done: bool,
}

impl Attach {
    /// Attaches from `from` (`None`: from the next byte produced).
    pub(crate) fn new(proc: Arc<Proc>, from: Option<u64>) -> Result<Attach, Error> {
        let produced = lock(&proc.state).produced;
        let cursor = match from {
            None => produced,
            Some(offset) if offset > produced => {
                return Err(errors::offset_ahead(offset, produced));
            }
            Some(offset) => offset,
        };
        let changed = proc.changed.subscribe();
        Ok(Attach {
            proc,
            cursor,
            changed,
            done: false,
        })
    }
}

#[async_trait]
impl ProcessOutput for Attach {
    async fn next_event(&mut self) -> Option<ProcessEvent> {
        if self.done {
            return None;
        }
        loop {
            self.changed.borrow_and_update();
            {
                let st = lock(&self.proc.state);
                if self.cursor < st.ring_start {
                    let gap = ProcessEvent::Gap {
                        from: self.cursor,
                        to: st.ring_start,
                    };
                    self.cursor = st.ring_start;
                    return Some(gap);
                }
                if let Some(chunk) = st
                    .ring
                    .iter()
                    .find(|c| c.offset + c.data.len() as u64 > self.cursor)
                {
                    let skip = usize::try_from(self.cursor - chunk.offset).unwrap_or(0);
                    let data = chunk.data[skip..].to_vec();
                    let event = ProcessEvent::Data {
                        stream: chunk.stream,
                        offset: self.cursor,
                        data,
                    };
                    self.cursor = chunk.offset + chunk.data.len() as u64;
                    return Some(event);
                }
                if !st.status.is_running() {
                    self.done = true;
                    return Some(ProcessEvent::Exited(st.status));
                }
            }
            // The process holds the sender for as long as it is listed; a closed channel means
            // its sandbox went away.
            if self.changed.changed().await.is_err() {
                self.done = true;
                return None;
            }
        }
    }
}
