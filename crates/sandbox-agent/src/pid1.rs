//! PID 1 duties: adopting orphans, reaping every child, and stopping on SIGTERM/SIGINT.
//!
//! Inside a container the agent is usually PID 1, so every process whose parent dies is
//! reparented to it; outside one, `PR_SET_CHILD_SUBREAPER` makes it the adopter of its own
//! descendants' orphans all the same. Either way those orphans become zombies unless somebody
//! waits for them, so the agent runs **one** reaper: it waits for any child (`waitpid(-1)`)
//! and hands each exit status to whoever registered that pid ([`Children`]).
//!
//! One waiter only: if anything else also waited (tokio's process driver, `Child::wait`),
//! the two would steal each other's statuses. Processes are therefore started with
//! `std::process::Command` and never waited on through it; their statuses come from here.
//!
//! The race of a child exiting before it is registered is closed by a lock: a process is
//! spawned and registered under the same lock the reaper holds while it waits, so the reaper
//! never collects a status nobody has claimed yet (and std's own wait for a child whose `exec`
//! failed, inside `spawn`, cannot be raced either).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustix::process::{Pid, WaitOptions, WaitStatus};
use sandbox_envd::ProcessStatus;
use tokio::sync::oneshot;

use crate::log;

/// The status of a terminated child, from its raw wait status.
fn status_of(status: WaitStatus) -> ProcessStatus {
    decode(status.as_raw())
}

/// Decodes a raw wait status of a terminated child (Linux's layout: the exit code in the
/// second byte when the low seven bits are zero, else the signal in those bits and the
/// core-dump flag in bit 0x80).
fn decode(raw: i32) -> ProcessStatus {
    if raw & 0x7f == 0 {
        return ProcessStatus::Exited((raw >> 8) & 0xff);
    }
    ProcessStatus::Signaled {
        signal: raw & 0x7f,
        core_dumped: raw & 0x80 != 0,
    }
}

/// The children the agent started, by pid, each waiting for its exit status.
#[derive(Debug)]
pub struct Children {
    table: Mutex<HashMap<u32, oneshot::Sender<ProcessStatus>>>,
    reap_orphans: bool,
    orphans_reaped: AtomicU64,
}

impl Children {
    /// With `reap_orphans`, the reaper waits for any child (the agent's duty as PID 1 or
    /// subreaper); without, only for the pids registered here, so adopted orphans stay
    /// zombies (a test flag), and an agent embedded in another process (the tests) never
    /// collects children that are not its own.
    pub fn new(reap_orphans: bool) -> Arc<Self> {
        Arc::new(Children {
            table: Mutex::new(HashMap::new()),
            reap_orphans,
            orphans_reaped: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u32, oneshot::Sender<ProcessStatus>>> {
        // A panic while the table was held cannot leave it inconsistent (one insert or
        // remove at a time), so a poisoned lock is taken as it is.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `spawn` (which starts one process and returns its pid) and registers the pid, both
    /// under the reaper's lock; the receiver yields the exit status.
    pub fn spawn<T>(
        &self,
        spawn: impl FnOnce() -> io::Result<(u32, T)>,
    ) -> io::Result<(u32, T, oneshot::Receiver<ProcessStatus>)> {
        let mut table = self.lock();
        let (pid, value) = spawn()?;
        let (tx, rx) = oneshot::channel();
        table.insert(pid, tx);
        Ok((pid, value, rx))
    }

    /// Collects every exited child without blocking and dispatches the statuses.
    pub fn reap(&self) {
        let mut table = self.lock();
        if self.reap_orphans {
            loop {
                match rustix::process::wait(WaitOptions::NOHANG) {
                    Ok(Some((pid, status))) => {
                        let pid = pid.as_raw_nonzero().get() as u32;
                        match table.remove(&pid) {
                            Some(tx) => {
                                let _ = tx.send(status_of(status));
                            }
                            None => {
                                self.orphans_reaped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Err(rustix::io::Errno::INTR) => continue,
                    // Nothing exited (None), or no children at all (ECHILD).
                    Ok(None) | Err(_) => break,
                }
            }
        } else {
            let pids: Vec<u32> = table.keys().copied().collect();
            for pid in pids {
                let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
                    continue;
                };
                if let Ok(Some((_, status))) =
                    rustix::process::waitpid(Some(raw), WaitOptions::NOHANG)
                    && let Some(tx) = table.remove(&pid)
                {
                    let _ = tx.send(status_of(status));
                }
            }
        }
    }

    /// Orphans reaped so far (children nobody registered).
    pub fn orphans_reaped(&self) -> u64 {
        self.orphans_reaped.load(Ordering::Relaxed)
    }
}

/// Reaps on every SIGCHLD, and once a second in case a signal was coalesced away while the
/// table was busy. Runs until the runtime stops.
pub fn start_reaper(children: Arc<Children>) -> io::Result<tokio::task::JoinHandle<()>> {
    let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
    Ok(tokio::spawn(async move {
        loop {
            children.reap();
            tokio::select! {
                _ = sigchld.recv() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }))
}

/// Makes the agent the adopter of its descendants' orphans even when it is not PID 1.
pub fn become_subreaper(log: &crate::log::Log) {
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        log::warning!(
            log,
            "PR_SET_CHILD_SUBREAPER failed: {e}; orphans go to the real init"
        );
    }
}

/// Resolves when the agent is asked to stop (SIGTERM or SIGINT), naming the signal.
pub async fn stop_requested() -> io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_registered_child_gets_its_status_and_only_its_own() {
        let children = Children::new(false);
        let (pid, (), rx) = children
            .spawn(|| {
                let child = std::process::Command::new("/bin/sh")
                    .args(["-c", "exit 7"])
                    .spawn()?;
                Ok((child.id(), ()))
            })
            .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), async {
            let mut rx = rx;
            loop {
                children.reap();
                match rx.try_recv() {
                    Ok(s) => return s,
                    Err(oneshot::error::TryRecvError::Empty) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await
        .unwrap();
        assert!(pid > 0);
        assert_eq!(status, ProcessStatus::Exited(7));
        assert_eq!(children.orphans_reaped(), 0);
    }

    #[test]
    fn signalled_statuses_keep_the_signal() {
        // Raw wait statuses: exit code in the second byte; a signal in the low seven bits.
        assert_eq!(decode(3 << 8), ProcessStatus::Exited(3));
        assert_eq!(
            decode(9),
            ProcessStatus::Signaled {
                signal: 9,
                core_dumped: false
            }
        );
        assert_eq!(
            decode(11 | 0x80),
            ProcessStatus::Signaled {
                signal: 11,
                core_dumped: true
            }
        );
    }
}
