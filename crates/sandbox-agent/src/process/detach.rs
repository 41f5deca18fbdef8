//! Killing a process nobody is attached to (our extension, for terminals that outlive their
//! client).
//!
//! A `Start` that carries [`HEADER_DETACH_TIMEOUT`] gives its process a detach timer: once no
//! `Start` or `Connect` stream of the process has been open for that long, its session is
//! killed (SIGKILL): its process group, and every process still in the session the agent made
//! it the leader of, so an interactive shell's background jobs (each in a group of its own)
//! go with it. The timer lives here, in the agent, so it holds however the client went
//! away, the service that opened the terminal restarting included. A stream counts as open
//! until the agent notices the client is gone, which is when it next sends on it (output or a
//! keepalive): a client that wants a prompt count asks for a short `Keepalive-Ping-Interval`.
//!
//! Any positive timeout is honoured (the service clamps what its users may ask for; the agent
//! does not second-guess it, which lets tests use short ones). `0` or no header: no timer,
//! envd's behaviour.

use std::sync::Arc;
use std::time::Duration;

use hyper::HeaderMap;
use rustix::process::Signal;
use sandbox_envd::{Code, ConnectError};
use tokio::sync::watch;

use super::{Proc, kill_group};
use crate::log;

/// Request header of `Start` (our extension): kill the process's group once it has had no
/// attached `Start`/`Connect` stream for this many milliseconds.
pub const HEADER_DETACH_TIMEOUT: &str = "sandbox-detach-timeout-ms";

/// The longest timeout accepted (a larger one is refused rather than silently shortened).
const MAX_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;

/// The timeout a `Start` asks for: `None` without the header or with `0`.
pub(super) fn requested(headers: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
    let Some(value) = headers.get(HEADER_DETACH_TIMEOUT) else {
        return Ok(None);
    };
    let ms = value
        .to_str()
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .filter(|ms| *ms <= MAX_TIMEOUT_MS)
        .ok_or_else(|| {
            ConnectError::new(
                Code::InvalidArgument,
                format!(
                    "{HEADER_DETACH_TIMEOUT} {value:?}: expected milliseconds, at most {MAX_TIMEOUT_MS}"
                ),
            )
        })?;
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}

/// One process's detach timer: how many streams are attached, and whether it has exited.
#[derive(Debug)]
pub(super) struct Detach {
    timeout: Duration,
    attached: watch::Sender<usize>,
    exited: watch::Sender<bool>,
}

/// One attached stream; dropping it detaches.
#[derive(Debug)]
pub(super) struct Attached(Arc<Detach>);

impl Drop for Attached {
    fn drop(&mut self) {
        self.0.attached.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Detach {
    pub(super) fn new(timeout: Duration) -> Arc<Detach> {
        Arc::new(Detach {
            timeout,
            attached: watch::Sender::new(0),
            exited: watch::Sender::new(false),
        })
    }

    /// Counts one more attached stream until the guard is dropped.
    pub(super) fn attach(self: &Arc<Self>) -> Attached {
        self.attached.send_modify(|n| *n += 1);
        Attached(Arc::clone(self))
    }

    /// The process was reaped: the timer stops (its pid may be reused from now on).
    pub(super) fn exited(&self) {
        self.exited.send_replace(true);
    }

    /// Runs the timer of `proc` until it exits or is killed by it.
    pub(super) fn spawn(self: &Arc<Self>, proc: &Arc<Proc>, logger: log::Log) {
        let detach = Arc::clone(self);
        let proc = Arc::clone(proc);
        tokio::spawn(async move { detach.run(&proc, logger).await });
    }

    async fn run(&self, proc: &Proc, logger: log::Log) {
        let mut attached = self.attached.subscribe();
        let mut exited = self.exited.subscribe();
        loop {
            // Attached: wait for the last stream to go.
            tokio::select! {
                r = attached.wait_for(|n| *n == 0) => if r.is_err() { return },
                _ = exited.wait_for(|e| *e) => return,
            }
            let expired = tokio::select! {
                () = tokio::time::sleep(self.timeout) => true,
                r = attached.wait_for(|n| *n > 0) => if r.is_err() { return } else { false },
                _ = exited.wait_for(|e| *e) => return,
            };
            if expired && *self.attached.borrow() == 0 && !*self.exited.borrow() && proc.running() {
                log::info!(
                    logger,
                    "process {}: no client attached for {} ms, killing its session",
                    proc.pid,
                    self.timeout.as_millis()
                );
                kill_group(proc.pid, Signal::KILL);
                kill_session(proc.pid);
                return;
            }
        }
    }
}

/// SIGKILLs every process whose session is `sid` (the agent starts each process as a session
/// leader, so its session id is its pid).
fn kill_session(sid: u32) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if session_of(&stat) == Some(sid)
            && let Some(pid) = rustix::process::Pid::from_raw(pid)
        {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }
}

/// The session field of a `/proc/<pid>/stat` line (after the command, which may hold spaces
/// and parentheses: fields are counted from the last `)`): state, ppid, pgrp, session.
fn session_of(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_is_read_after_the_command() {
        assert_eq!(
            session_of("42 (a) b) c) S 1 42 40 34816 42 4194560"),
            Some(40)
        );
        assert_eq!(session_of("42 (sh) S 1"), None);
        assert_eq!(session_of("garbage"), None);
    }

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HEADER_DETACH_TIMEOUT, value.parse().unwrap());
        h
    }

    #[test]
    fn the_header_is_milliseconds_and_zero_means_none() {
        assert_eq!(requested(&HeaderMap::new()).unwrap(), None);
        assert_eq!(requested(&headers("0")).unwrap(), None);
        assert_eq!(
            requested(&headers(" 1500 ")).unwrap(),
            Some(Duration::from_millis(1500))
        );
        for bad in ["-1", "1.5", "soon", "604800001"] {
            let e = requested(&headers(bad)).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{bad}");
        }
    }

    #[tokio::test]
    async fn the_count_follows_the_guards() {
        let d = Detach::new(Duration::from_secs(1));
        let a = d.attach();
        let b = d.attach();
        assert_eq!(*d.attached.borrow(), 2);
        drop(a);
        assert_eq!(*d.attached.borrow(), 1);
        drop(b);
        assert_eq!(*d.attached.borrow(), 0);
    }
}
