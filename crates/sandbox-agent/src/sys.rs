//! The agent's uses of `unsafe`, all here: the code a started process runs between `fork` and
//! `exec`, registering a descriptor with the runtime's reactor, and marking inherited
//! descriptors close-on-exec at start.
//!
//! Everything else goes through rustix's safe wrappers. tokio's registration of a raw
//! descriptor is `unsafe` because it cannot know the descriptor stays open; an `OwnedFd`
//! moved into the registration guarantees exactly that. std offers no safe way to run code in
//! the child before `exec`, and the agent needs exactly that: a new session (so the process
//! leads its own process group, which SendSignal and the shutdown signal as a whole), the PTY
//! as controlling terminal, and the target user's supplementary groups. std's own `uid`/`gid`
//! setters cannot be used for the last part: they drop every supplementary group, and they run
//! before `pre_exec` hooks, so the hook sets groups, gid and uid itself, in that order (groups
//! and gid need the privilege the uid change gives up).

#![expect(
    unsafe_code,
    reason = "pre_exec, reactor registration and marking inherited descriptors have no safe alternative; all are confined here"
)]

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};

use rustix::process::{Gid, Uid};
use tokio::io::unix::AsyncFd;

/// Registers `fd` with the current runtime's reactor (for readiness of reads and writes).
pub fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the `OwnedFd`, so the descriptor is open, and refers to the
    // same open file description, for as long as the registration lives; `OwnedFd::as_raw_fd`
    // always returns that one descriptor.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// Marks every descriptor above stderr close-on-exec, so none the agent inherited (a
/// supervisor's pipe, a build tool's jobserver) reaches the processes it starts. Everything
/// the agent opens itself is close-on-exec already. Call it while the process has one
/// thread, before the runtime starts.
pub fn mark_inherited_close_on_exec() -> io::Result<()> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: with a single thread nothing else opens or closes descriptors meanwhile; the
        // one listed descriptor now closed (the directory read above) makes `fcntl` fail with
        // EBADF, which is ignored. The borrow lasts only for the two calls.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        if let Ok(flags) = rustix::io::fcntl_getfd(borrowed) {
            let _ = rustix::io::fcntl_setfd(borrowed, flags | rustix::io::FdFlags::CLOEXEC);
        }
    }
    Ok(())
}

/// The identity a process is switched to before `exec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary group included, as `initgroups` sets them).
    pub groups: Vec<u32>,
}

/// Spawns `command` as the leader of a new session, optionally with its stdin (a PTY's slave
/// side) as controlling terminal, and optionally as another user.
pub fn spawn_session_leader(
    command: &mut Command,
    credentials: Option<&Credentials>,
    controlling_terminal: bool,
) -> io::Result<Child> {
    // Everything the hook needs is prepared here: after `fork` the child may not allocate.
    let ids = credentials.map(|c| {
        let groups: Vec<Gid> = c.groups.iter().map(|&g| Gid::from_raw(g)).collect();
        (Uid::from_raw(c.uid), Gid::from_raw(c.gid), groups)
    });
    let hook = move || -> io::Result<()> {
        rustix::process::setsid()?;
        if controlling_terminal {
            // SAFETY: std has already made fd 0 the PTY's slave side (stdio is set up before
            // pre_exec hooks run), and it stays open for the rest of the hook.
            let stdin = unsafe { BorrowedFd::borrow_raw(0) };
            rustix::process::ioctl_tiocsctty(stdin)?;
        }
        if let Some((uid, gid, groups)) = &ids {
            // The raw system calls change only the calling thread, which after `fork` is the
            // whole process.
            rustix::thread::set_thread_groups(groups)?;
            rustix::thread::set_thread_gid(*gid)?;
            rustix::thread::set_thread_uid(*uid)?;
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before `exec`. It calls only raw system calls
    // through rustix (setsid, ioctl, setgroups, setgid, setuid), which take no locks and do not
    // allocate, so they are async-signal-safe; its captured data was allocated before `fork`.
    // Errors become `io::Error::from_raw_os_error`, which does not allocate either.
    unsafe {
        command.pre_exec(hook);
    }
    command.spawn()
}
